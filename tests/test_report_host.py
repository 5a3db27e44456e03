"""What a caller's loop pays and the energy per call, shown where the rows carry them: the summary's host-time
lines, the tables, the hover, the exports and flashbench.load(); the mode each row was timed in. The numbers are
checked against the rows.jsonl of a synthetic fixture read here, not through flashbench; a run from before these
fields says so and shows none of them."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from report_helpers import H100_SPEED, needs_plotly, read_jsonl

import flashbench
from flashbench.analysis import host, runs
from flashbench.report import build, verdict
from flashbench.report.hover import hover, with_context

HOST = Path(__file__).resolve().parent / "fixtures" / "synthetic-host"
H200_DEFAULT = Path(__file__).resolve().parent / "measured" / "h200-default"


def raw() -> list[dict[str, Any]]:
    return read_jsonl(HOST)


def words(row: dict[str, Any]) -> str:
    n = row["seq_q"] if row["seq_q"] == row["seq_k"] else None
    size = f"{n // 1024}k" if n and n >= 1024 else str(n) if n else f"1×{row['seq_k'] // 1024}k"
    return f"fwd N={size} d={row['head_dim']} {'causal' if row['causal'] else 'non-causal'}"


def test_the_fixture_has_host_bound_and_not_host_bound_rows_of_each_kind() -> None:
    rows = raw()
    assert {r["host_bound"] for r in rows} == {True, False}
    assert {r["cuda_graph"] for r in rows} == {True, False}
    assert all(r["energy_j"] > 0 and len(r["loop_samples_ms"]) == 5 for r in rows)
    # the sweep's flag is the rule the summary reads: loop time above the GPU's in the loop by more than 10%
    assert all(r["host_bound"] == (r["loop_ms"] > 1.1 * r["loop_gpu_ms"]) for r in rows)
    assert all(
        r["loop_gpu_ms"] < r["median_ms"] for r in rows
    )  # held back to back, no flush: a little faster


def test_the_summary_says_who_is_host_bound_where_and_by_how_much() -> None:
    md = verdict.markdown(runs.load_run(HOST), None)
    for provider in dict.fromkeys(r["provider"] for r in raw()):
        mine = [r for r in raw() if r["provider"] == provider]
        bound = [r for r in mine if r["host_bound"]]
        worst = max(mine, key=lambda r: r["loop_ms"] / r["loop_gpu_ms"])
        sentence = (
            f"host-bound in {len(bound)} of {len(mine)} cases"
            if bound
            else f"none of {len(mine)} cases host-bound"
        )
        line = next(
            x for x in md.splitlines() if x.startswith(f"- **{provider}**") or x.startswith(f"- {provider}")
        )
        assert sentence in line, line
        assert (
            f"at {words(worst)} an eager loop pays {worst['loop_ms']:.4g} ms per call where the GPU works "
            f"{worst['loop_gpu_ms']:.4g} ms ({worst['loop_ms'] / worst['loop_gpu_ms']:.2f}×"
        ) in line, line
    assert (
        "(timed as CUDA graph + eager)" in md
    )  # sdpa-flash: eager training rows, graph-replayed decode rows
    assert "timed as eager calls (18) and CUDA graph replays (3)" in md


def test_energy_per_unit_of_work_is_compared_where_providers_are() -> None:
    run = runs.load_run(HOST)
    md = verdict.markdown(run, None)
    train = [r for r in raw() if r["seq_q"] == r["seq_k"]]
    decode = [r for r in raw() if r["seq_q"] != r["seq_k"]]

    def tflop_per_j(p: str) -> float:
        return statistics.median(r["flops"] / r["energy_j"] / 1e12 for r in train if r["provider"] == p)

    def tokens_per_j(p: str) -> float:
        return statistics.median(
            r["batch"] * r["seq_q"] / r["energy_j"] for r in decode if r["provider"] == p
        )

    assert f"TFLOP/J: sdpa-flash {tflop_per_j('sdpa-flash'):.3g}, triton {tflop_per_j('triton'):.3g}" in md
    assert (
        f"tokens/J: triton-decode {tokens_per_j('triton-decode'):.3g}, sdpa-flash {tokens_per_j('sdpa-flash'):.3g}"
        in md
    )
    best = build(HOST, fmt="md").split("### Best TFLOP/s per provider", 1)[1].split("###", 1)[0]
    assert "median TFLOP/J" in best and f"| {tflop_per_j('naive'):.3f} |" in best
    assert "median tokens/J" in build(HOST, fmt="md").split("### Best GB/s per provider", 1)[1]


def test_the_hover_gives_the_loop_the_mode_and_the_energy() -> None:
    run = runs.load_run(HOST)
    frame = with_context(run.frame)
    texts = dict(zip(zip(frame["provider"], frame["seq_q"], frame["seq_k"]), hover(frame), strict=True))
    for r in raw():
        text = texts[(r["provider"], r["seq_q"], r["seq_k"])]
        assert f"timed as {'CUDA graph' if r['cuda_graph'] else 'eager'}" in text
        ratio = r["loop_ms"] / r["loop_gpu_ms"]
        assert (
            f"eager loop {r['loop_ms']:.4g} ms per call ({ratio:.2f}× the GPU's {r['loop_gpu_ms']:.4g} ms"
            in text
        )
        assert ("host-bound" in text) == r["host_bound"]
        assert f"energy {r['energy_j']:.4g} J per call" in text


def test_exports_and_load_carry_host_time_energy_and_mode() -> None:
    rows = {(r["provider"], r["seq_q"], r["seq_k"]): r for r in raw()}
    table = list(csv.DictReader(io.StringIO(build(HOST, fmt="csv"))))
    assert len(table) == len(rows)
    for c in table:
        r = rows[(c["provider"], int(c["seq_q"]), int(c["seq_k"]))]
        assert float(c["host_ms"]) == pytest.approx(r["host_ms"], rel=1e-5)
        assert float(c["loop_ms"]) == pytest.approx(r["loop_ms"], rel=1e-5)
        assert float(c["loop_gpu_ms"]) == pytest.approx(r["loop_gpu_ms"], rel=1e-5)
        assert float(c["energy_j"]) == pytest.approx(r["energy_j"], rel=1e-5)
        assert c["host_bound"] == str(r["host_bound"])
        assert c["timed_as"] == ("CUDA graph" if r["cuda_graph"] else "eager")
        serving = r["seq_q"] != r["seq_k"]
        unit, other = ("tokens_per_j", "tflop_per_j") if serving else ("tflop_per_j", "tokens_per_j")
        work = r["batch"] * r["seq_q"] if serving else r["flops"] / 1e12
        assert float(c[unit]) == pytest.approx(work / r["energy_j"], rel=1e-5) and c[other] == ""
    doc = json.loads(build(HOST, fmt="json"))
    assert all(
        d["loop_samples_ms"] == rows[(d["provider"], d["seq_q"], d["seq_k"])]["loop_samples_ms"]
        for d in doc["rows"]
    )
    frame = flashbench.load(HOST)
    assert {"host_ms", "loop_ms", "loop_samples_ms", "loop_gpu_ms", "host_bound", "energy_j"} <= set(
        frame.columns
    )


def test_a_run_without_host_time_says_so_and_shows_no_empty_columns() -> None:
    run = runs.load_run(H200_DEFAULT)  # measured before rows carried host time
    assert host.host_lines(run.frame) == [] and host.host_table(run.frame).empty
    md = build(H200_DEFAULT, fmt="md")
    assert "**Host time**: not measured in this run" in md
    best = md.split("### Best TFLOP/s per provider", 1)[1].split("###", 1)[0]
    assert "host-bound" not in best and "TFLOP/J" not in best and "### Host time" not in md


@needs_plotly
def test_the_tflops_figure_leaves_serving_rows_out_and_says_so() -> None:
    from flashbench.report import figures

    run = runs.load_run(HOST)
    fig = figures.speed_vs_seq(run, "tflops")
    train = {r["seq_k"] for r in raw() if r["seq_q"] == r["seq_k"]}
    drawn = {x for t in fig.data if t.x is not None for x in t.x if x is not None}
    assert drawn == train  # the decode rows' 1, 4 and 16k-key caches are not TFLOP/s points
    assert "Serving rows are left out" in build(HOST, fmt="html")
    latency = figures.speed_vs_seq(run, "median_ms")
    assert {x for t in latency.data if t.x is not None for x in t.x if x is not None} == {
        r["seq_k"] for r in raw()
    }


def test_the_committed_h100_run_states_each_providers_loop_from_its_rows() -> None:
    """The H100 speed run (2026-11-26) carries host time: each provider's line names its largest loop / GPU
    ratio as the rows give it, and none of its cases is host-bound (every bundled call from N = 1024 up)."""
    run = runs.load_run(H100_SPEED)
    lines = {line.provider: line for line in host.host_lines(run.frame)}
    assert set(lines) == {"triton", "sdpa-flash", "sdpa-cudnn"}
    md = build(H100_SPEED, fmt="md")
    for row in read_jsonl(H100_SPEED):
        if row["status"] == "ok":
            assert row["loop_ms"] > 0 and row["host_ms"] > 0 and row["energy_j"] > 0
    for name, line in lines.items():
        assert line.measured == 40 and line.host_bound == 0
        assert f"{name}: none of 40 cases host-bound" in md
        assert f"an eager loop pays {line.worst_loop_ms:.4g} ms per call where the GPU works" in md

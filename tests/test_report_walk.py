"""The report's SM-fill table (flashbench/analysis/walk.py): each bundled Gluon forward row's reported config read
through the kernel's own schedule model (flash_ws.walk_load), on committed runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import H100_SPEED, ROOT, needs_plotly, read_jsonl

from flashbench.analysis import runs, walk
from flashbench.report import build

H100_VARLEN = ROOT / "results" / "examples" / "h100-varlen"  # packed batches beside one 4 x 4096 batch


def _table(path: Path, sm_count: int | None = -1):
    run = runs.load_run(path)
    return walk.walk_table(run.frame, walk.sm_count_of(run.env, run.gpu_spec) if sm_count == -1 else sm_count)


def test_the_h100_speed_runs_walks_are_read_from_their_configs() -> None:
    """Every ok forward row of the Gluon walk gets a line (the tl kernel's d = 64 causal N = 1024 row and the
    fwd+bwd rows none); N = 1024 at d = 128 without a mask is round-robin over 2048 equal tiles on the run's 132
    SMs: 15.5 rounds, filled 2048 x 9 / 132 over 16 x 9; the least filled first, in the markdown report too."""
    table = _table(H100_SPEED)
    gluon = [
        r
        for r in read_jsonl(H100_SPEED)
        if r["status"] == "ok"
        and r["mode"] == "fwd"
        and (r["kernel_config"] or {}).get("kernel") == "gluon-ws"
    ]
    assert len(table) == len(gluon) > 0 and set(table["provider"]) == {"triton"}
    assert "bf16 N=1k d=64 causal" not in set(table["case"])
    row = table.set_index("case").loc["bf16 N=1k d=128 non-causal"]
    assert (row["walk"], row["tiles"], row["programs"]) == ("round-robin", 2048, 132)
    assert row["rounds"] == pytest.approx(2048 / 132) and row["filled"] == pytest.approx(2048 * 9 / 132 / 144)
    assert list(table["filled"]) == sorted(table["filled"]) and (table["filled"] <= 1).all()
    causal = table.set_index("case")["walk"][table["case"].str.contains(" causal").to_numpy()]
    assert causal["bf16 N=2k d=128 causal"] == "list-scheduled, groups of 4 heads"
    assert causal["bf16 N=16k d=128 causal"] == "list-scheduled, one head"
    assert all(walk.startswith("list-scheduled, ") for walk in causal)
    md = build(H100_SPEED, fmt="md")
    assert "### SM fill of the bundled forward (modelled" in md
    assert "| triton | bf16 N=1k d=128 non-causal | round-robin | 2048 | 132 | 15.52 | 0.970 |" in md


def test_packed_batches_and_runs_without_an_sm_count_get_no_walk() -> None:
    """A packed batch walks its documents (varlen_ws), not this model: of the varlen run only the 4 x 4096 batch
    has a line. Without the SMs the kernels saw there is no table."""
    table = _table(H100_VARLEN)
    assert list(table["case"]) == ["bf16 N=4k d=128 causal"]
    assert _table(H100_SPEED, sm_count=None).empty


def test_a_config_the_model_cannot_read_gets_no_line_and_breaks_no_report() -> None:
    """A row that says gluon-ws but lacks the tile keys (another version's config, a user's own report) is left
    out; the other rows keep theirs."""
    run = runs.load_run(H100_SPEED)
    frame = run.frame.copy()
    gluon = (
        frame["kernel_config"].str.contains('"gluon-ws"', regex=False) & frame["mode"].eq("fwd") & frame["ok"]
    )
    first = frame.index[gluon][0]
    frame.loc[first, "kernel_config"] = '{"PERSISTENT": 1, "kernel": "gluon-ws"}'
    assert len(walk.walk_table(frame, 132)) == int(gluon.sum()) - 1


@needs_plotly
def test_the_html_report_has_the_walk_section() -> None:
    page = build(H100_SPEED, fmt="html")
    assert ">SM fill of the bundled forward (modelled)<" in page and 'id="walk"' in page and "15.52" in page

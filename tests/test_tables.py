"""benchmarks/tables.py: the markdown tables of docs/benchmarks.md, printed from a run's rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks/tables.py")
assert _spec is not None and _spec.loader is not None
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)


def test_the_varlen_table_puts_each_provider_packed_beside_uniform_and_the_bundled_over_it(tmp_path, capsys):
    """Per mode and provider (in the run's order), its packed TFLOP/s, its uniform batch's, packed / uniform, and the bundled
    kernel's packed TFLOP/s over its; the uniform batch named by its shape. The rows are the committed record's,
    their TFLOP/s set by hand."""
    record = ROOT / "results/examples/h100-varlen/rows.jsonl"
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    tflops = {("triton", "uniform"): 600.0, ("triton", "random"): 500.0}
    tflops |= {("flex", "uniform"): 400.0, ("flex", "random"): 250.0}
    kept = [r for r in rows if r["mode"] == "fwd" and (r["provider"], r["seqlens"]) in tflops]
    for r in kept:
        r["tflops"] = tflops[r["provider"], r["seqlens"]]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    tables.varlen(str(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "| mode | provider | packed TFLOP/s | uniform 4 x 4096 TFLOP/s | packed / uniform |"
    )
    assert lines[2:] == [
        "| fwd | triton | 500 | 600 | 0.83 | 1.00 |",
        "| fwd | flex | 250 | 400 | 0.62 | 2.00 |",
    ]


def _run_of(folder: Path, record: str, keep, edit) -> str:
    """A run in folder: the committed record's env.json and the rows `keep` accepts, each changed by `edit`."""
    src = ROOT / "results/examples" / record
    rows = [json.loads(line) for line in (src / "rows.jsonl").read_text().splitlines()]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.json").write_text((src / "env.json").read_text())
    kept = [edit(r) or r for r in rows if keep(r)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return str(folder)


def test_the_floor_table_puts_the_bundled_decode_contiguous_and_paged_beside_the_others(tmp_path, capsys):
    """Per cache shape, the bundled decode's us and time over the floor over a contiguous cache, over a paged one
    ("-" where the run has none) and each other provider's; the KV megabytes of the shape."""

    def edit(r):
        if r["provider"] == "triton-decode":
            r["median_ms"] = 0.028032  # twice the floor of 34 MB at the run's calibration
            r["samples_ms"] = [0.028032] * len(r["samples_ms"])

    def keep(r):
        return r["kv_heads"] == 8 and r["seq_k"] == 8192 and r["kv_layout"] != "paged"

    tables.floor(_run_of(tmp_path, "h100-decode-floor", keep, edit))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "| H / Hkv | N | batch | KV MB | triton-decode us | x floor | paged us | x floor |"
    )
    assert lines[2].startswith("| 32 / 8 | 8192 | 1 | 34 | 28.0 | 2.00 | - | - | ")


def test_the_mla_table_names_kernel_splits_layout_and_the_calibrated_rates(tmp_path, capsys):
    """The bundled MLA decode's rows: the kernel and split count from its config, the page size in the layout, and
    its TFLOP/s over the calibrated matmul rate of its dtype (the run's env.json)."""
    calibrated = json.loads((ROOT / "results/examples/h100-mla/record/env.json").read_text())
    bf16 = calibrated["calibration"]["matmul_tflops"]["bf16"]

    def edit(r):
        r["tflops"] = bf16 / 2

    def keep(r):
        return r["provider"] == "triton-mla" and r["seq_q"] == 1 and r["seq_k"] == 4096

    tables.mla(_run_of(tmp_path, "h100-mla/record", keep, edit))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| % of bf16 matmul | bound |")
    rows = [line.split(" | ") for line in lines[2:]]
    assert [(r[3], r[4], r[5]) for r in rows] == [("contiguous", "Gluon", "2"), ("paged64", "Gluon", "2")]
    assert all(r[9] == f"{bf16 / 2:.0f}" and r[10] == "50" for r in rows)


def test_the_mla_heads_table_puts_each_case_beside_the_run_before(tmp_path, capsys):
    """By head count: the schedule from the row's config (one row block: the split consumers), the median beside
    the `before` run's on the same case and their ratio ("-" where that run lacks the case), and the latent cache's
    own GB/s (batch x N x 576 x 2 bytes over the median)."""

    def keep(r):
        return (
            r["provider"] == "triton-mla"
            and r["seq_q"] == 1
            and r["seq_k"] == 4096
            and r["kv_layout"] != "paged"
        )

    def set_ms(ms):
        def edit(r):
            r["median_ms"] = ms
            r["samples_ms"] = [ms] * len(r["samples_ms"])

        return edit

    now = _run_of(tmp_path / "now", "h100-mla/heads", keep, set_ms(0.0604))
    before = _run_of(
        tmp_path / "before", "h100-mla/heads", lambda r: keep(r) and r["heads"] == 16, set_ms(0.0755)
    )
    tables.mla_heads(now, before)
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    cells = {r[0].strip("| "): (r[5], r[8], r[9], r[10], r[11]) for r in rows}
    gb_s = f"{32 * 4096 * 576 * 2 / 60.4e-6 / 1e9:.0f}"
    assert cells["16"] == ("split", "60.4", "75.5", "0.80", gb_s)
    assert cells["128"] == ("seesaw", "60.4", "-", "-", gb_s)


def test_the_fp8_table_puts_the_ratio_per_clock_beside_the_ratio(tmp_path, capsys):
    """fp8 / bf16 from the TFLOP/s, and per clock: that ratio times the rows' SM clocks, bf16's over fp8's, so a
    power cap that holds the bf16 row at a lower clock shows as a ratio the kernel does not make. The rows are the
    committed record's d = 128 causal N = 2048 pair, their TFLOP/s and clocks set by hand."""

    def keep(r):
        return r["provider"] == "triton" and (r["head_dim"], r["causal"], r["seq_q"]) == (128, True, 2048)

    def edit(r):
        fp8 = r["dtype"] == "fp8"
        r["tflops"], r["sm_clock_mhz"] = (720.0, 1980.0) if fp8 else (540.0, 1800.0)

    tables.fp8(_run_of(tmp_path / "run", "h200-fp8", keep, edit))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| d | causal | N | triton bf16 | triton fp8 | fp8 / bf16 | per clock |")
    cells = [c.strip() for c in lines[2].split("|")[1:9]]
    assert cells == ["128", "yes", "2048", "540", "720", "1.33", "1.21", "1800 / 1980"]


def test_the_speed_table_puts_x_cudnn_per_clock_beside_x_cudnn(tmp_path, capsys):
    """x cuDNN from the TFLOP/s, and per clock: that ratio times cuDNN's row's SM clock over the bundled row's (the
    bundled kernel's work per cycle over cuDNN's), so a power cap that holds the bundled kernel lower shows. The
    rows are the committed record's d = 64 causal N = 1024 forward, their TFLOP/s and clocks set by hand."""
    providers = {"triton": (330.0, 1800.0), "sdpa-cudnn": (300.0, 1980.0), "sdpa-flash": (200.0, 1980.0)}

    def keep(r):
        return (
            r["provider"] in providers
            and r["mode"] == "fwd"
            and (r["head_dim"], r["causal"], r["seq_q"])
            == (
                64,
                True,
                1024,
            )
        )

    def edit(r):
        r["tflops"], r["sm_clock_mhz"] = providers[r["provider"]]

    tables.speed([_run_of(tmp_path / "run", "h200-speed", keep, edit)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "| mode | d | causal | N | triton | sdpa-flash | sdpa-cudnn | x flash | x cuDNN | per clock |"
    )
    cells = [c.strip() for c in lines[2].split("|")[1:11]]
    assert cells == ["fwd", "64", "yes", "1024", "330", "200", "300", "1.65", "1.10", "1.21"]

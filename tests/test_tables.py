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

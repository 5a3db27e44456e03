"""Small run directories for the report tests, written through the real Row and Environment records.

Every run made here is SYNTHETIC (env.json says so): its numbers test the report's arithmetic, never a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from flashbench.results.env import Environment, write_env
from flashbench.results.rows import Row, append_row
from flashbench.spec.cases import Case

# The HTML page and its figures need plotly; markdown, CSV and JSON do not.
needs_plotly = pytest.mark.skipif(
    importlib.util.find_spec("plotly") is None, reason="plotly is not installed (the HTML report needs it)"
)

H100 = "NVIDIA H100 80GB HBM3"
H100_FACTS = {
    "name": H100,
    "memory_total_bytes": 85520809984,
    "max_sm_clock_mhz": 1980,
    "max_mem_clock_mhz": 2619,
    "bus_width_bits": 5120,
    "derived_bw_bytes_s": 3352320000000.0,
}
ROOT = Path(__file__).resolve().parents[1]
H100_SPEED = ROOT / "results" / "examples" / "h100-speed"  # a real H100 run, committed as the example
H100_DECODE = ROOT / "results" / "examples" / "h100-decode"  # a real H100 decode sweep (the decode preset)


def case_row(
    provider: str,
    ms: float | None,
    *,
    n: int = 1024,
    nk: int | None = None,
    batch: int = 1,
    heads: int = 8,
    d: int = 64,
    causal: bool = False,
    mode: str = "fwd",
    status: str = "ok",
    **kw: Any,
) -> Row:
    """One row: an ok case timed at `ms` (ten identical samples) or a case with another status."""
    case = Case(provider, batch, heads, heads, n, nk or n, d, "bf16", causal, mode)
    timing: dict[str, Any] = {}
    if status == "ok" and ms is not None:
        timing = {"samples_ms": [ms] * 10, "median_ms": ms, "p20_ms": ms, "p80_ms": ms}
    return Row.for_case(case, status, gpu=H100, **timing, **kw)


def write_run(run_dir: Path, rows: list[Row], **env: Any) -> Path:
    """A results directory holding `rows` and an H100 environment record (fields overridable)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fields = {"gpu": H100, "gpus": [H100_FACTS], "synthetic": True, **env}
    write_env(run_dir, Environment(**fields))
    for row in rows:
        append_row(run_dir, row)
    return run_dir


def slowed_copy(src: Path, dest: Path, provider: str, factor: Any) -> Path:
    """A copy of run `src` whose `provider` cases are slower: every time x factor(row) (a dict -> float)."""
    shutil.copytree(src, dest)
    lines = []
    for line in (dest / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["provider"] == provider and row["median_ms"]:
            f = factor(row)
            for key in ("median_ms", "p20_ms", "p80_ms"):
                row[key] *= f
            row["samples_ms"] = [x * f for x in row["samples_ms"]]
            row["tflops"] = row["tflops"] / f if row.get("tflops") else None
        lines.append(json.dumps(row))
    (dest / "rows.jsonl").write_text("\n".join(lines) + "\n")
    return dest


def read_jsonl(run_dir: Path) -> list[dict[str, Any]]:
    """The raw rows of a run as dicts (the last row per key, as flashbench reads them)."""
    rows: dict[str, dict[str, Any]] = {}
    for line in (run_dir / "rows.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            key = (r["provider"], r["batch"], r["heads"], r["seq_q"], r["seq_k"], r["head_dim"], r["dtype"])
            cache = [r.get("kv_layout", "contiguous"), r.get("page_size", 0), r.get("seqlens", "uniform")]
            rows[json.dumps([*key, r["causal"], r["mode"], r["kv_heads"], *cache, r.get("seed", 0)])] = r
    return list(rows.values())

"""Tidy exports: CSV and JSON with one row per measured (or refused) case and plain columns."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from flashbench.analysis.runs import speedups
from flashbench.models.roofline import BOUND_RULE
from flashbench.results.rows import FLOP_CONVENTION, SCHEMA_VERSION
from flashbench.spec.cases import CASE_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.analysis.runs import Run

# Column order of the exports: the case, the outcome, timing, speed, models, memory, GPU state, ncu.
COLUMNS = [
    "key",
    *CASE_FIELDS,
    "status",
    "reason",
    "device",
    "time_label",
    "gpu",
    "n_samples",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "compile_ms",
    "cuda_graph",
    "flops",
    "tflops",
    "speedup",
    "speedup_vs",
    "rel_err",
    "err_budget",
    "ref",
    "peak_mem_bytes",
    "predicted_mem_bytes",
    "model_mem_bytes",
    "model_bytes_compulsory",
    "model_bytes_no_l2",
    "model_bytes_provider",
    "ai_compulsory",
    "ai_no_l2",
    "ai_provider",
    "attainable_tflops",
    "attainable_floor_tflops",
    "attainable_no_l2_tflops",
    "pct_of_roofline",
    "pct_of_floor_roofline",
    "bound",
    "above_roofline",
    "throttled",
    "sm_clock_mhz_before",
    "sm_clock_mhz_after",
    "mem_clock_mhz_before",
    "mem_clock_mhz_after",
    "power_w_before",
    "power_w_after",
    "temp_c_before",
    "temp_c_after",
    "clock_event_reasons_before",
    "clock_event_reasons_after",
    "ncu_dram_read_bytes",
    "ncu_dram_write_bytes",
    "kernel_config",
    "timestamp",
]


def tidy(run: Run, baseline_provider: str | None) -> pd.DataFrame:
    """The run's measurements with the speedup over `baseline_provider` joined in, in COLUMNS order."""
    frame = run.frame.copy()
    frame["speedup"] = float("nan")
    frame["speedup_vs"] = baseline_provider or ""
    if baseline_provider:
        sp = speedups(frame, baseline_provider).set_index("key")["speedup"]
        frame["speedup"] = frame["key"].map(sp).astype(float)
    return frame[COLUMNS]


def to_csv(run: Run, baseline_provider: str | None) -> str:
    """CSV text, one row per case. Raw timing samples are in the JSON export only."""
    return tidy(run, baseline_provider).to_csv(index=False, float_format="%.6g")


def to_json(run: Run, baseline_provider: str | None) -> str:
    """JSON text: {"schema", "run", "gpu", "flop_convention", "bound_rule", "env", "rows": [one per case]}."""
    frame = tidy(run, baseline_provider)
    frame.insert(frame.columns.get_loc("median_ms"), "samples_ms", run.frame["samples_ms"].to_numpy())
    rows = [{k: _plain(v) for k, v in rec.items()} for rec in frame.to_dict("records")]
    doc = {
        "schema": SCHEMA_VERSION,
        "run": str(run.path),
        "gpu": run.gpu_name,
        "flop_convention": FLOP_CONVENTION,
        "bound_rule": BOUND_RULE,
        "env": run.env.to_dict(),
        "rows": rows,
    }
    return json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n"


def _plain(value: Any) -> Any:
    """NaN -> null and numpy scalars -> Python, so the JSON is strict."""
    if hasattr(value, "item") and not isinstance(value, list | dict | str):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value

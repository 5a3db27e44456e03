"""Tidy exports: CSV and JSON with one row per measured (or refused) case and plain columns, enough to recompute
every number the report states (the JSON adds the raw samples and the summary's leads)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from flashbench.analysis.clocks import case_clocks
from flashbench.analysis.leads import TIE_RULE, Lead, leads
from flashbench.analysis.modelled import ROOF_RULE
from flashbench.analysis.runs import CLOCK_FIELDS
from flashbench.analysis.summary import speedups
from flashbench.models.roofline import BOUND_RULE
from flashbench.results.rows import FLOP_CONVENTION, SCHEMA_VERSION
from flashbench.spec.cases import CASE_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.analysis.runs import Run

# Column order of the exports: the case, the outcome, timing (GPU, host, loop), energy, speed, the one roof per
# case (ROOF_RULE) and each provider's own, bandwidth (serving rows' headline), memory, GPU state, ncu. Every
# number the report states is one of these columns or a function of them stated on the page.
COLUMNS = [
    "key",
    *CASE_FIELDS,
    "serving",
    "variant",
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
    "timed_as",
    "host_ms",
    "loop_ms",
    "loop_gpu_ms",
    "gpu_in_loop_ms",
    "loop_over_gpu",
    "host_bound",
    "energy_j",
    "tflop_per_j",
    "tokens_per_j",
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
    "compute_dtype",
    "peak_tflops",
    "ridge_ai",
    "attainable_tflops",
    "pct_of_roofline",
    "bound",
    "own_peak_tflops",
    "attainable_own_tflops",
    "pct_of_own_roofline",
    "own_bound",
    "attainable_no_l2_tflops",
    "pct_of_family_bound",
    "above_roofline",
    "achieved_gb_s",
    "read_bw_gb_s",
    "datasheet_bw_gb_s",
    "pct_of_read_bw",
    "pct_of_datasheet_bw",
    "floor_ms",
    "time_over_floor",
    "ms_per_token",
    "throttled",
    "clock_mhz",
    "clock_source",
    "clock_reasons",
    *CLOCK_FIELDS,
    "throttle_reasons",
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
# Raw lists, in the JSON export only (a CSV cell holds one value).
RAW_LISTS = ("samples_ms", "loop_samples_ms", "clock_readings_mhz")


def tidy(run: Run, baseline_provider: str | None) -> pd.DataFrame:
    """The run's measurements with the speedup over `baseline_provider` and each case's clock (the one the page
    quotes: analysis.clocks.case_clocks) joined in, in COLUMNS order."""
    frame = run.frame.copy()
    frame["speedup"] = float("nan")
    frame["speedup_vs"] = baseline_provider or ""
    if baseline_provider:
        sp = speedups(frame, baseline_provider).set_index("key")["speedup"]
        frame["speedup"] = frame["key"].map(sp).astype(float)
    clock = case_clocks(frame)
    frame["clock_mhz"], frame["clock_source"] = clock["clock_mhz"], clock["clock_source"]
    frame["clock_reasons"] = clock["reasons"]
    frame["ms_per_token"] = (frame["median_ms"] / frame["seq_q"]).where(frame["serving"])
    frame["throttle_reasons"] = frame["throttle_reasons"].map(
        lambda names: ";".join(names) if isinstance(names, list) else ""
    )
    return frame[COLUMNS]


def to_csv(run: Run, baseline_provider: str | None) -> str:
    """CSV text, one row per case, 9 significant digits. Raw timing samples are in the JSON export only."""
    return tidy(run, baseline_provider).to_csv(
        index=False, float_format="%.9g"
    )  # enough digits to reprint every number the page rounds


def to_json(run: Run, baseline_provider: str | None) -> str:
    """JSON text: {"schema", "run", "gpu", "flop_convention", "roof_rule", "own_traffic_rule", "tie_rule",
    "leads": [the summary's leads], "env", "rows": [one per case, with its raw samples]}."""
    frame = tidy(run, baseline_provider)
    at = frame.columns.get_loc("median_ms")
    for name in reversed(RAW_LISTS):
        frame.insert(at, name, run.frame[name].to_numpy())
    rows = [{k: _plain(v) for k, v in rec.items()} for rec in frame.to_dict("records")]
    doc = {
        "schema": SCHEMA_VERSION,
        "run": str(run.path),
        "gpu": run.gpu_name,
        "flop_convention": FLOP_CONVENTION,
        "roof_rule": ROOF_RULE,
        "own_traffic_rule": BOUND_RULE,
        "tie_rule": TIE_RULE,
        "leads": [lead_record(x) for x in leads(run.frame)],
        "env": run.env.to_dict(),
        "rows": rows,
    }
    return json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n"


def lead_record(lead: Lead) -> dict[str, Any]:
    """One lead of the summary as the JSON export states it: every number the lead line prints."""
    return {
        "group": lead.group,
        "dtype": lead.dtype,
        "fastest": lead.fastest,
        "runner_up": lead.runner_up,
        "geomean": _plain(lead.geomean) if lead.ratios else None,
        "ratios": {n: r for n, r in lead.ratios},
        "noise": _plain(lead.noise),
        "fastest_clock_mhz": _plain(lead.fastest_clock),
        "runner_clock_mhz": _plain(lead.runner_clock),
        "clock_gap": lead.clock_gap,
        "tied": lead.tied,
        "best_pct": lead.best_pct,
        "best_pct_of": lead.best_pct_of,
        "best_pct_provider": lead.best_pct_provider,
        "best_pct_at": lead.best_pct_at,
        "energy": {p: e for p, e in lead.energy},
        "energy_unit": lead.energy_unit,
    }


def _plain(value: Any) -> Any:
    """NaN -> null and numpy scalars -> Python, so the JSON is strict."""
    if hasattr(value, "item") and not isinstance(value, list | dict | str):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value

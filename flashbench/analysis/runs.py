"""Rows + models -> tidy pandas frames: speeds, speedups, % of roofline, memory, recompute overhead.

Every frame here has one row per measured case (or per pair of cases) and plain columns, so the report, the
markdown summary and the CSV/JSON exports all read the same numbers. Rules that hold in every frame:
- a row whose status is not "ok" has no speed: median_ms, tflops and everything derived from them are NaN;
- CPU rows (device == "cpu") keep their times but are labelled "CPU time" (time_label), never mixed up with GPU;
- model columns (bytes, roofline; flashbench.analysis.modelled) are NaN where the model or the GPU's ceilings are not
  known.
Two runs compared case by case: flashbench.analysis.comparison.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashbench.analysis import modelled, serving
from flashbench.errors import FlashbenchError
from flashbench.models.flops import (
    BWD_BLOCK_MATMULS,
    MODE_MULTIPLIER,
    RECOMPUTE_MULTIPLIER,
    Reference,
    forward_flops,
    recompute_overhead_references,
)
from flashbench.models.traffic import one_pass_backward
from flashbench.providers import builtin
from flashbench.results.env import ENV_FILE, Environment, read_env
from flashbench.results.rows import FLOP_CONVENTION, OK, ROWS_FILE, Row, frame_of, read_rows
from flashbench.spec.cases import CASE_FIELDS, mask_label

if TYPE_CHECKING:
    import pandas as pd

CASE_COLUMNS = list(CASE_FIELDS)  # the Case fields, in their order
# The GPU's state during the timed samples, as the rows record it (None on older rows).
CLOCK_FIELDS = (
    "sm_clock_mhz",
    "sm_clock_min_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "power_w",
    "temp_c",
    "throttled_share",
)
NVML_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "clock_event_reasons")
# Baseline providers are tried in the order their declared `baseline` ranks give (providers/builtin.py) when
# --speedup-vs is not given: the paper's "standard attention" first, then PyTorch's own SDPA backends, so "> 1 =
# faster than the reference" reads as a kernel beating a baseline (a bundled or user kernel is never the default
# reference while a baseline ran).
SPEEDUP_VS_HELP = (
    "The provider speedups are taken against. Default: the first of "
    + ", ".join(builtin.baselines())
    + " that has an ok row in the run, else the first provider that has one."
)
# Recompute backward vs stored-P backward: the stored-P variant's name is the recompute provider's + this suffix.
STORED_P_SUFFIX = "-stored-p"


@dataclass
class Run:
    """One results directory: its environment record, its tidy measurements and its GPU's ceilings."""

    path: Path
    env: Environment
    rows: list[Row]  # as read from rows.jsonl (the last row per case), once: the gate's view reads them too
    frame: pd.DataFrame  # measurements() + the roofline columns: one row per case
    ceilings: list[Any] = field(default_factory=list)  # hardware.Ceiling: datasheet, nvml, measured
    gpu_spec: Any = None  # hardware.GpuSpec, or None (CPU run, unknown GPU)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def gpu_name(self) -> str:
        return gpu_name(self.env, self.frame)

    @property
    def is_cpu(self) -> bool:
        return bool(len(self.frame)) and bool((self.frame["device"] == "cpu").all())


def load_run(path: str | Path) -> Run:
    """Read a run directory (env.json + rows.jsonl) into a Run; FlashbenchError if missing or corrupt."""
    path = Path(path)
    if not path.exists():
        raise FlashbenchError(f"results directory not found: {path}")
    if path.is_file():  # a run's own file names its run; any other file is not a run
        if path.name not in (ROWS_FILE, ENV_FILE):
            raise FlashbenchError(
                f"{path} is a file, not a run directory (one holding env.json and rows.jsonl)"
            )
        path = path.parent
    env = read_env(path)
    rows = read_rows(path)
    if not rows:
        raise FlashbenchError(f"{path}: rows.jsonl has no rows (did the sweep run?)")
    frame = measurements(frame_of(rows), env)
    spec, ceilings = modelled.ceilings(env, frame, gpu_name(env, frame))
    modelled.add_roofline(frame, ceilings)
    modelled.add_bandwidth(frame, ceilings)
    return Run(path=path, env=env, rows=rows, frame=frame, ceilings=ceilings, gpu_spec=spec)


def gpu_name(env: Environment, frame: pd.DataFrame | None = None) -> str:
    """The GPU's name from the environment record, else from the rows."""
    if env.gpu_name:
        return env.gpu_name
    if frame is not None and len(frame):
        names = [g for g in frame["gpu"].dropna().unique() if g]
        if names:
            return str(names[0])
        if (frame["device"] == "cpu").all():
            return "CPU"
    return "unknown GPU"


def measurements(raw: pd.DataFrame, env: Environment | None = None) -> pd.DataFrame:
    """results.load()'s frame -> the tidy frame every output reads (see the module docstring)."""
    import numpy as np
    import pandas as pd

    df = raw.copy()
    df["shape_key"] = df["key"].str.split("|", n=1).str[1]
    df["causal"] = df["causal"].astype(bool)
    df["throttled"] = df["throttled"].fillna(False).astype(bool)
    df["device"] = df["device"].fillna("cuda").replace("", "cuda")
    df["time_label"] = np.where(df["device"] == "cpu", "CPU time", "GPU time")
    df["n_samples"] = df["samples_ms"].map(lambda s: len(s) if isinstance(s, list) else 0)
    df["ok"] = df["status"] == OK
    for col in ("median_ms", "p20_ms", "p80_ms", "compile_ms", "flops", "tflops", "rel_err", "err_budget"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    for col in ("peak_mem_bytes", "predicted_mem_bytes", "ncu_dram_read_bytes", "ncu_dram_write_bytes"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    # Rows that are not "ok" are never shown as speeds, whatever timing they carry.
    for col in ("median_ms", "p20_ms", "p80_ms", "tflops"):
        df.loc[~df["ok"], col] = np.nan
    # What a caller's loop pays and the energy per call (None on rows written before they were measured).
    for col in ("host_ms", "loop_ms", "loop_gpu_ms", "energy_j", *CLOCK_FIELDS):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    for col in ("host_ms", "loop_ms", "loop_gpu_ms", "energy_j"):
        df.loc[~df["ok"], col] = np.nan
    df["host_bound"] = [
        bool(v) if isinstance(v, bool) and ok else None
        for v, ok in zip(df["host_bound"], df["ok"], strict=True)
    ]
    df["timed_as"] = np.where(df["cuda_graph"].fillna(False).astype(bool), "CUDA graph", "eager")
    df["ncu_dram_bytes"] = df["ncu_dram_read_bytes"] + df["ncu_dram_write_bytes"]
    for when in ("before", "after"):
        col = f"nvml_{when}"
        for name in NVML_FIELDS:
            df[f"{name}_{when}"] = df[col].map(lambda d, n=name: d.get(n) if isinstance(d, dict) else None)
            df[f"{name}_{when}"] = pd.to_numeric(df[f"{name}_{when}"], errors="coerce").astype(float)
    df["kernel_config"] = df["kernel_config"].map(
        lambda c: json.dumps(c, sort_keys=True) if isinstance(c, dict) and c else ""
    )
    df["serving"] = serving.serving_mask(df)
    df["variant"] = serving.case_variants(df)
    # One figure panel per group a lead is judged within: a serving cache or a window is never a line of another.
    df["panel"] = (
        "d="
        + df["head_dim"].astype(str)
        + " · "
        + df["causal"].map(mask_label)
        + " · "
        + df["mode"]
        + np.where(df["dtype"].nunique() > 1, " · " + df["dtype"], "")
        + df["variant"].where(df["variant"] == "", " · " + df["variant"])
    )
    modelled.add_model_columns(df)  # fills flops where the row lacks them
    missing = df["tflops"].isna() & df["ok"] & (df["median_ms"] > 0)
    df.loc[missing, "tflops"] = df.loc[missing, "flops"] / (df.loc[missing, "median_ms"] * 1e-3) / 1e12
    # The GPU's work per call in the loop, as host_bound judges it: the time of calls held back to back (no host
    # gap, no L2 flush), where the row has it; else the samples' median.
    df["gpu_in_loop_ms"] = df["loop_gpu_ms"].fillna(df["median_ms"]).where(df["loop_ms"].notna())
    df["loop_over_gpu"] = df["loop_ms"] / df["gpu_in_loop_ms"]
    # Energy per unit of work: TFLOP per joule (training rows), generated tokens per joule (a serving call makes
    # seq_q new tokens for each of its batch's sequences).
    df["tflop_per_j"] = (df["flops"] / df["energy_j"] / 1e12).where(~df["serving"])
    df["tokens_per_j"] = (df["batch"] * df["seq_q"] / df["energy_j"]).where(df["serving"])
    return df.drop(columns=["nvml_before", "nvml_after"])


def providers(frame: pd.DataFrame) -> list[str]:
    """Providers in first-seen order."""
    return list(dict.fromkeys(frame["provider"]))


def pick_baseline(frame: pd.DataFrame, wanted: str | None = None) -> str | None:
    """The provider speedups are taken against: `wanted`, else SPEEDUP_VS_HELP's default rule."""
    names = providers(frame)
    if wanted:
        if wanted not in names:
            import difflib

            close = difflib.get_close_matches(wanted, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; the run has {', '.join(names)}"
            raise FlashbenchError(f"--speedup-vs: no provider {wanted!r} in this run{hint}")
        return wanted
    ok = frame.loc[frame["ok"], "provider"]
    for name in builtin.baselines():
        if (ok == name).any():
            return name
    return str(ok.iloc[0]) if len(ok) else None


RECOMPUTE_OVERHEAD = (
    "recompute overhead = median time of the recompute backward / median time of the stored-P backward - 1, "
    "per shape, from --mode bwd rows: the backward alone (each forward runs outside the timed region, so the "
    "stored-P forward's extra Q K^T does not enter). FLOPs: credited 2.5x forward (recompute) vs 2.0x (reads "
    "P); executed by the bundled kernels 3.5x (the two-pass recompute backward, 7 block matmuls) or 2.5x (the "
    "one-pass, 5: its row's kernel_config says ONE_PASS) vs 2.5x (5)."
)


def one_pass(kernel_config: object) -> bool:
    """Whether a row's kernel_config (JSON text or a dict) says its backward ran in one pass (dQ from the dK/dV
    kernel, kernels/backward_ws.py's ONE_PASS)."""
    cfg = json.loads(kernel_config) if isinstance(kernel_config, str) and kernel_config else kernel_config
    return one_pass_backward(cfg if isinstance(cfg, dict) else None)


def recompute_references() -> tuple[Reference, ...]:
    """The reference values of the recompute overhead, with their labels (models.flops)."""
    return recompute_overhead_references()


def recompute_overhead(frame: pd.DataFrame) -> pd.DataFrame:
    """RECOMPUTE_OVERHEAD per shape, with the time, the memory and the FLOPs of both backwards.

    time_overhead = recompute time / stored-P time - 1 (what recomputing P costs, or saves if negative);
    mem_saved_bytes = stored-P peak - recompute peak (the O(N^2) buffer that recomputation avoids);
    credited_flops_* / executed_flops_*: see RECOMPUTE_OVERHEAD; recompute_references() gives what the
    overhead would be if time followed either count. Pairs of fwd+bwd rows are not used: each times its own
    forward, and the stored-P forward does one more Q K^T.
    """
    import pandas as pd

    parts = []
    for stored in [p for p in providers(frame) if p.endswith(STORED_P_SUFFIX)]:
        recompute = stored[: -len(STORED_P_SUFFIX)]
        cols = ["shape_key", "median_ms", "peak_mem_bytes", "status"]
        a = frame[(frame["provider"] == recompute) & (frame["mode"] == "bwd")]
        b = frame[frame["provider"] == stored][cols]
        pair = a.merge(b, on="shape_key", suffixes=("", "_stored"))
        if pair.empty:
            continue
        pair = pair.assign(recompute_provider=recompute, stored_provider=stored)
        parts.append(pair)
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    out = out.rename(
        columns={
            "median_ms": "recompute_ms",
            "median_ms_stored": "stored_ms",
            "peak_mem_bytes": "recompute_mem_bytes",
            "peak_mem_bytes_stored": "stored_mem_bytes",
        }
    )
    out["time_overhead"] = out["recompute_ms"] / out["stored_ms"] - 1.0
    out["mem_saved_bytes"] = out["stored_mem_bytes"] - out["recompute_mem_bytes"]
    out["mem_ratio"] = out["stored_mem_bytes"] / out["recompute_mem_bytes"]
    fwd = [
        float(forward_flops(r.batch, r.heads, r.seq_q, r.seq_k, r.head_dim, r.causal))
        for r in out.itertuples(index=False)
    ]
    bwd, matmuls = MODE_MULTIPLIER["bwd"], BWD_BLOCK_MATMULS
    out["credited_flops_recompute"] = [bwd * f for f in fwd]
    out["credited_flops_stored"] = [(bwd - RECOMPUTE_MULTIPLIER) * f for f in fwd]
    kinds = ["recompute-one-pass" if one_pass(c) else "recompute" for c in out["kernel_config"]]
    out["executed_flops_recompute"] = [0.5 * matmuls[k] * f for k, f in zip(kinds, fwd, strict=True)]
    out["executed_flops_stored"] = [0.5 * matmuls["stored-p"] * f for f in fwd]
    keep = [
        "recompute_provider",
        "stored_provider",
        "shape_key",
        *CASE_COLUMNS[1:],
        "panel",
        "time_label",
        "status",
        "status_stored",
        "recompute_ms",
        "stored_ms",
        "time_overhead",
        "recompute_mem_bytes",
        "stored_mem_bytes",
        "mem_saved_bytes",
        "mem_ratio",
        "credited_flops_recompute",
        "credited_flops_stored",
        "executed_flops_recompute",
        "executed_flops_stored",
    ]
    return out[keep]


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    """Cases without a speed: any status but ok, and ok cases above the roofline (the guard's reason given)."""
    cols = [
        "provider",
        "seq_q",
        "seq_k",
        "head_dim",
        "dtype",
        "causal",
        "mode",
        "batch",
        "heads",
        "status",
        "reason",
    ]
    out = frame.loc[~frame["ok"], [*cols, "above_roofline", "roofline_error"]].reset_index(drop=True)
    flagged = out["above_roofline"]
    out.loc[flagged, "status"] = "ok, above roofline"
    out.loc[flagged, "reason"] = out.loc[flagged, "roofline_error"]
    return out[cols]


def throttled(frame: pd.DataFrame) -> pd.DataFrame:
    """Ok cases during which the GPU reported a clock-event reason other than idle: their speed is suspect."""
    cols = [
        "provider",
        "seq_q",
        "head_dim",
        "dtype",
        "causal",
        "mode",
        "median_ms",
        "sm_clock_mhz_before",
        "sm_clock_mhz_after",
        "clock_event_reasons_after",
    ]
    return frame.loc[frame["throttled"], cols].reset_index(drop=True)


def geomean(values: Any) -> float:
    vals = [float(v) for v in values if v == v and v > 0]
    return statistics.geometric_mean(vals) if vals else float("nan")


__all__ = [
    "FLOP_CONVENTION",
    "Run",
    "failures",
    "load_run",
    "measurements",
    "pick_baseline",
    "RECOMPUTE_OVERHEAD",
    "recompute_overhead",
    "recompute_references",
    "throttled",
]

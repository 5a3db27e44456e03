"""Rows + models -> tidy pandas frames: speeds, speedups, % of roofline, memory, recompute overhead, comparisons.

Every frame here has one row per measured case (or per pair of cases) and plain columns, so the report, the
markdown summary and the CSV/JSON exports all read the same numbers. Rules that hold in every frame:
- a row whose status is not "ok" has no speed: median_ms, tflops and everything derived from them are NaN;
- CPU rows (device == "cpu") keep their times but are labelled "CPU time" (time_label), never mixed up with GPU;
- model columns (bytes, roofline) are NaN where the model or the GPU's ceilings are not known.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashbench.cases import CASE_FIELDS, DTYPE_BYTES
from flashbench.errors import FlashbenchError
from flashbench.results import FLOP_CONVENTION, OK, load, read_env

if TYPE_CHECKING:
    import pandas as pd

CASE_COLUMNS = list(CASE_FIELDS)  # the Case fields, in their order
NVML_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "clock_event_reasons")
# Baseline providers tried in this order when --speedup-vs is not given (the paper's "standard attention" first).
DEFAULT_BASELINES = ("naive", "sdpa-math", "sdpa")
# Recompute backward vs stored-P backward: the stored-P variant's name is the recompute provider's + this suffix.
STORED_P_SUFFIX = "-stored-p"


@dataclass
class Run:
    """One results directory: its environment record, its tidy measurements and its GPU's ceilings."""

    path: Path
    env: dict[str, Any]
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
    if path.is_file():
        path = path.parent
    env = read_env(path)
    raw = load(path)
    if raw.empty:
        raise FlashbenchError(f"{path}: rows.jsonl has no rows (did the sweep run?)")
    frame = measurements(raw, env)
    spec, ceilings = _ceilings(env, frame)
    _add_roofline(frame, ceilings)
    return Run(path=path, env=env, frame=frame, ceilings=ceilings, gpu_spec=spec)


def gpu_name(env: dict[str, Any], frame: pd.DataFrame | None = None) -> str:
    """The GPU's name from the environment record (any of the shapes the sweep writes), else from the rows."""
    gpu = env.get("gpu")
    if isinstance(gpu, dict) and gpu.get("name"):
        return str(gpu["name"])
    if isinstance(gpu, str) and gpu:
        return gpu
    for key in ("gpus", "gpu_facts"):
        value = env.get(key)
        if isinstance(value, list) and value and isinstance(value[0], dict) and value[0].get("name"):
            return str(value[0]["name"])
    if env.get("gpu_name"):
        return str(env["gpu_name"])
    if frame is not None and len(frame):
        names = [g for g in frame["gpu"].dropna().unique() if g]
        if names:
            return str(names[0])
        if (frame["device"] == "cpu").all():
            return "CPU"
    return "unknown GPU"


def measurements(raw: pd.DataFrame, env: dict[str, Any] | None = None) -> pd.DataFrame:
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
    df["ncu_dram_bytes"] = df["ncu_dram_read_bytes"] + df["ncu_dram_write_bytes"]
    for when in ("before", "after"):
        col = f"nvml_{when}"
        for name in NVML_FIELDS:
            df[f"{name}_{when}"] = df[col].map(lambda d, n=name: d.get(n) if isinstance(d, dict) else None)
            df[f"{name}_{when}"] = pd.to_numeric(df[f"{name}_{when}"], errors="coerce").astype(float)
    df["kernel_config"] = df["kernel_config"].map(
        lambda c: json.dumps(c, sort_keys=True) if isinstance(c, dict) and c else ""
    )
    df["panel"] = (
        "d="
        + df["head_dim"].astype(str)
        + " · "
        + np.where(df["causal"], "causal", "full")
        + " · "
        + df["mode"]
        + np.where(df["dtype"].nunique() > 1, " · " + df["dtype"], "")
    )
    _add_model_columns(df)  # fills flops where the row lacks them
    missing = df["tflops"].isna() & df["ok"] & (df["median_ms"] > 0)
    df.loc[missing, "tflops"] = df.loc[missing, "flops"] / (df.loc[missing, "median_ms"] * 1e-3) / 1e12
    return df.drop(columns=["nvml_before", "nvml_after"])


def providers(frame: pd.DataFrame) -> list[str]:
    """Providers in first-seen order."""
    return list(dict.fromkeys(frame["provider"]))


def pick_baseline(frame: pd.DataFrame, wanted: str | None = None) -> str | None:
    """The provider speedups are taken against: `wanted`, else the first of DEFAULT_BASELINES with ok rows."""
    names = providers(frame)
    if wanted:
        if wanted not in names:
            import difflib

            close = difflib.get_close_matches(wanted, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; the run has {', '.join(names)}"
            raise FlashbenchError(f"--speedup-vs: no provider {wanted!r} in this run{hint}")
        return wanted
    ok = frame.loc[frame["ok"], "provider"]
    for name in DEFAULT_BASELINES:
        if (ok == name).any():
            return name
    return str(ok.iloc[0]) if len(ok) else None


def speedups(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per ok case: speedup = baseline's median time / this provider's, on the same shape key."""
    ok = frame[frame["ok"]]
    base = ok[ok["provider"] == baseline][["shape_key", "median_ms"]].rename(
        columns={"median_ms": "baseline_ms"}
    )
    out = ok.merge(base, on="shape_key", how="inner")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    out["baseline_provider"] = baseline
    return out


def recompute_overhead(frame: pd.DataFrame) -> pd.DataFrame:
    """Recompute backward vs stored-P backward (bwd and fwd+bwd modes), time and memory, per shape.

    time_overhead = recompute time / stored-P time - 1 (what recomputing P costs, or saves if negative);
    mem_saved_bytes = stored-P peak - recompute peak (the O(N^2) buffer that recomputation avoids).
    The FLOP accounting column is models.flops.recompute_share(): the recompute's credited share of the work.
    """
    import pandas as pd

    from flashbench.models.flops import recompute_share

    share = recompute_share()
    shares = {"bwd": share["of_backward_credited_2.5x"], "fwd+bwd": share["of_fwd_bwd_credited_3.5x"]}
    parts = []
    for stored in [p for p in providers(frame) if p.endswith(STORED_P_SUFFIX)]:
        recompute = stored[: -len(STORED_P_SUFFIX)]
        cols = ["shape_key", "median_ms", "peak_mem_bytes", "status"]
        a = frame[(frame["provider"] == recompute) & frame["mode"].isin(list(shares))]
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
    out["flop_share_recompute"] = out["mode"].map(shares)
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
        "flop_share_recompute",
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


def compare_runs(current: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Two runs case by case (joined on the case key): ratio = current median time / baseline median time.

    A ratio above 1 is a slowdown. Cases in only one run are left out; a case that is ok in the baseline and
    not ok now appears with change "newly failing" and no ratio.
    """
    cols = ["key", "provider", "shape_key", *CASE_COLUMNS[1:], "panel", "status", "median_ms", "tflops"]
    side = ["status", "median_ms", "tflops", "pct_of_roofline"]
    joined = current[[*cols, "pct_of_roofline"]].merge(
        baseline[["key", *side]], on="key", suffixes=("", "_baseline")
    )
    joined["ratio"] = joined["median_ms"] / joined["median_ms_baseline"]
    joined["change"] = ""
    joined.loc[(joined["status_baseline"] == OK) & (joined["status"] != OK), "change"] = "newly failing"
    joined.loc[(joined["status_baseline"] != OK) & (joined["status"] == OK), "change"] = "newly ok"
    return joined


def same_gpu(a: Run, b: Run) -> bool:
    """Whether two runs ran on the same GPU model (by name; two CPU runs count as the same)."""
    from flashbench.hardware import normalize_name

    return normalize_name(a.gpu_name) == normalize_name(b.gpu_name)


# Shown instead of the gate's verdict when the two runs come from different GPU models.
NO_GATE_ACROSS_GPUS = (
    "No gate verdict: the runs are from different GPUs, so a slower case is a slower machine, not a "
    "regression (run `flashbench gate` between runs of one GPU model)."
)


def cross_gpu_note(current: Run, baseline: Run) -> str:
    """The one line a cross-GPU comparison carries everywhere it is shown; "" for two runs of one GPU model."""
    if same_gpu(current, baseline):
        return ""
    return (
        f"different GPUs: ratios compare machines, not code (this run: {current.gpu_name}; "
        f"{baseline.name}: {baseline.gpu_name}). Each side's % of roofline is against its own GPU's roofline: a speedup with the same % of roofline on both sides is the faster GPU, not a better kernel."
    )


def side_by_side(joined: pd.DataFrame, current_label: str, baseline_label: str) -> pd.DataFrame:
    """compare_runs() as one row per case with both sides' time, TFLOP/s and % of own roofline, by label."""
    cols = {
        "provider": "provider",
        "seq_q": "seq_q",
        "head_dim": "head_dim",
        "dtype": "dtype",
        "causal": "causal",
        "mode": "mode",
        "median_ms": f"{current_label} ms",
        "tflops": f"{current_label} TFLOP/s",
        "pct_of_roofline": f"{current_label} % of roofline",
        "median_ms_baseline": f"{baseline_label} ms",
        "tflops_baseline": f"{baseline_label} TFLOP/s",
        "pct_of_roofline_baseline": f"{baseline_label} % of roofline",
        "ratio": "ratio",
    }
    return joined[list(cols)].rename(columns=cols).reset_index(drop=True)


def add_verdicts(joined: pd.DataFrame, gate_result: Any) -> pd.DataFrame:
    """compare_runs() with the gate's verdict per case (regression, improvement, ...), where the gate ran."""
    verdicts = {c.key: c.verdict for c in getattr(gate_result, "cases", [])}
    return joined.assign(verdict=joined["key"].map(verdicts).fillna(""))


def compare_summary(joined: pd.DataFrame, roofline: bool = False) -> pd.DataFrame:
    """Per provider: median ratio over the cases both runs measured, the worst ratio, and the newly failing.

    roofline: also the median % of roofline of each side (each against its own GPU), for cross-GPU comparisons.
    """
    import pandas as pd

    rows = []
    for provider, grp in joined.groupby("provider", sort=False):
        ratios = grp["ratio"].dropna()
        rows.append(
            {
                "provider": provider,
                "cases": int(len(ratios)),
                "median_ratio": float(ratios.median()) if len(ratios) else float("nan"),
                "worst_ratio": float(ratios.max()) if len(ratios) else float("nan"),
                "best_ratio": float(ratios.min()) if len(ratios) else float("nan"),
                "newly_failing": int((grp["change"] == "newly failing").sum()),
                **({"regressions": int((grp["verdict"] == "regression").sum())} if "verdict" in grp else {}),
            }
        )
        if roofline:
            both = grp[grp["ratio"].notna()]
            for col in ("pct_of_roofline", "pct_of_roofline_baseline"):
                pct = both[col].dropna() if col in both else both["ratio"].iloc[:0]
                rows[-1][f"median_{col}"] = float(pct.median()) if len(pct) else float("nan")
    return pd.DataFrame(rows)


def best_per_provider(frame: pd.DataFrame) -> pd.DataFrame:
    """Per provider, dtype and mode: the highest TFLOP/s, where it was reached, and the median % of roofline."""
    import pandas as pd

    ok = frame[frame["ok"] & frame["tflops"].notna()]
    rows = []
    for (provider, dtype, mode), grp in ok.groupby(["provider", "dtype", "mode"], sort=False):
        top = grp.loc[grp["tflops"].idxmax()]
        pct = grp["pct_of_roofline"].dropna()
        rows.append(
            {
                "provider": provider,
                "dtype": dtype,
                "mode": mode,
                "time_label": top["time_label"],
                "cases": len(grp),
                "max_tflops": float(top["tflops"]),
                "at": f"N={top['seq_q']} d={top['head_dim']} {'causal' if top['causal'] else 'full'}",
                "median_pct_of_roofline": float(pct.median()) if len(pct) else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def geomean(values: Any) -> float:
    vals = [float(v) for v in values if v == v and v > 0]
    return statistics.geometric_mean(vals) if vals else float("nan")


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 2)


# --- the models, joined per row. Imported lazily: pure modules, but report-only users should not pay for them. ---

ROOF_LABELS = {"datasheet": "datasheet", "nvml": "NVML-derived", "measured": "measured"}


def _blocks(kernel_config: str) -> Any:
    """io_model.Blocks from the frame's kernel_config column (JSON text), else None (the model's defaults)."""
    from flashbench.models.io_model import Blocks

    return Blocks.from_config(json.loads(kernel_config) if kernel_config else None)


def _add_model_columns(df: pd.DataFrame) -> None:
    """Byte-model family, compute dtype, modelled memory, HBM bytes (compulsory / family / no-L2), intensities."""
    from flashbench.models import io_model, memory
    from flashbench.models.flops import attention_flops

    nan = float("nan")
    cols: dict[str, list[Any]] = {
        k: []
        for k in ("family", "compute_dtype", "model_mem_bytes", "bytes_c", "bytes_f", "bytes_n", "flops_m")
    }
    for r in df[[*CASE_COLUMNS, "kernel_config"]].itertuples(index=False):
        family = io_model.family_for_provider(r.provider)
        shape = (r.batch, r.heads, r.kv_heads, r.seq_q, r.seq_k, r.head_dim, dtype_bytes(r.dtype))
        try:
            blocks = _blocks(r.kernel_config)
            values = [
                family,
                io_model.compute_dtype(family, r.dtype),
                memory.predicted_peak_bytes(memory.family_for_provider(r.provider), *shape, r.causal, r.mode),
                io_model.compulsory_traffic(*shape, r.mode).total,
                io_model.hbm_traffic(family, *shape, r.causal, r.mode, l2_reuse=True, blocks=blocks).total,
                io_model.hbm_traffic(family, *shape, r.causal, r.mode, l2_reuse=False, blocks=blocks).total,
                attention_flops(r.batch, r.heads, r.seq_q, r.seq_k, r.head_dim, r.causal, r.mode),
            ]
        except (
            ValueError,
            TypeError,
            ZeroDivisionError,
        ):  # a shape the models refuse (e.g. heads % kv_heads)
            values = [family, r.dtype, nan, nan, nan, nan, nan]
        for key, value in zip(cols, values, strict=True):
            cols[key].append(value)
    df["family"] = cols["family"]
    df["compute_dtype"] = cols["compute_dtype"]
    df["model_mem_bytes"] = [float(v) for v in cols["model_mem_bytes"]]
    df["predicted_mem_bytes"] = df["predicted_mem_bytes"].fillna(df["model_mem_bytes"])
    df["flops"] = df["flops"].fillna(_series([float(v) for v in cols["flops_m"]], df.index))
    for name, key in (("compulsory", "bytes_c"), ("provider", "bytes_f"), ("no_l2", "bytes_n")):
        df[f"model_bytes_{name}"] = [float(v) for v in cols[key]]
        df[f"ai_{name}"] = df["flops"] / df[f"model_bytes_{name}"]


def _series(values: list[float], index: Any) -> pd.Series:
    import pandas as pd

    return pd.Series(values, index=index, dtype=float)


def _gpu_facts(env: dict[str, Any]) -> dict[str, Any] | None:
    """NVML facts as the sweep recorded them (nvml.gpu_facts()), wherever in env.json they are."""
    for value in (env.get("gpu"), env.get("gpu_facts"), *(env.get("gpus") or [])[:1]):
        if isinstance(value, dict) and value.get("name"):
            return value
    return None


def _ceilings(env: dict[str, Any], frame: pd.DataFrame) -> tuple[Any, list[Any]]:
    """(hardware.GpuSpec or None, [hardware.Ceiling]): datasheet, NVML-derived and measured, where known.

    The measured ceiling is the calibration recorded in env.json ("calibration") when the sweep stored one,
    else this machine's `flashbench calibrate` file for the same GPU model.
    """
    if len(frame) and (frame["device"] == "cpu").all():
        return None, []  # a CPU run has no GPU roofline
    try:
        from flashbench import hardware
    except ImportError:
        return None, []
    facts = _gpu_facts(env)
    try:
        spec = hardware.match_nvml_name(gpu_name(env, frame))
        if spec is None and facts and facts.get("derived_bw_bytes_s"):
            spec = hardware.derived_spec(facts)
        if spec is None:
            return None, []
        calibration = env.get("calibration")
        if not isinstance(calibration, dict) or "error" in calibration:
            calibration = hardware.load_calibration(spec)
    except (
        FlashbenchError
    ):  # an unreadable table or calibration file: no roofline, the rest of the report stands
        return None, []
    return spec, [c for c in hardware.ceilings(spec, facts, calibration) if c.bw_bytes_s]


def _add_roofline(df: pd.DataFrame, ceilings: list[Any]) -> None:
    """models.roofline per case under the first ceiling (datasheet first), with the validity guard.

    pct_of_roofline: achieved / attainable at the compulsory intensity (what the GPU allows any kernel);
    pct_of_family_bound: the family's no-L2 minimum time / measured (above 100%: the L2 cache saved traffic);
    roofline_error: set when the measured time beats the compulsory minimum under the most permissive ceiling
    (a measurement or model error): such a case is never shown as a speed (ok is False).
    """
    import numpy as np

    nan = float("nan")
    names = [
        "peak_tflops",
        "bw_bytes_s",
        "attainable_tflops",
        "attainable_no_l2_tflops",
        "ridge_ai",
        "pct_of_roofline",
        "pct_of_family_bound",
        "bound",
        "roofline_error",
    ]
    out: dict[str, list[Any]] = {k: [] for k in names}
    if ceilings:
        from flashbench.models import roofline
    for r in df[[*CASE_COLUMNS, "device", "ok", "median_ms", "kernel_config"]].itertuples(index=False):
        values: list[Any] = [nan] * 7 + ["", ""]
        if ceilings and r.device != "cpu":
            try:
                blocks = _blocks(r.kernel_config)
                args = (
                    r.batch,
                    r.heads,
                    r.kv_heads,
                    r.seq_q,
                    r.seq_k,
                    r.head_dim,
                    r.dtype,
                    dtype_bytes(r.dtype),
                )
                preds = [
                    roofline.predict(
                        _family(r.provider), *args, r.causal, r.mode, c.flops_s, c.bw_bytes_s, blocks
                    )
                    for c in ceilings
                ]
            except (ValueError, TypeError, ZeroDivisionError):
                preds = []
            if preds:
                p = preds[0]
                values = [
                    p.peak_flops_s / 1e12 if p.peak_flops_s else nan,
                    p.bw_bytes_s,
                    p.compulsory.attainable_flops_s / 1e12,
                    p.no_l2.attainable_flops_s / 1e12,
                    p.ridge if p.ridge else nan,
                    nan,
                    nan,
                    p.no_l2.bound,
                    "",
                ]
                if r.ok and r.median_ms == r.median_ms and r.median_ms > 0:
                    guard = min(q.compulsory.min_time_s for q in preds)
                    a = roofline.assess(r.median_ms * 1e-3, p, guard_min_time_s=guard)
                    values[5], values[6], values[7], values[8] = (
                        a.pct_of_roofline,
                        a.pct_of_family_bound,
                        a.bound,
                        a.error,
                    )
        for key, value in zip(names, values, strict=True):
            out[key].append(value)
    for key in names:
        df[key] = out[key] if key in ("bound", "roofline_error") else np.array(out[key], dtype=float)
    df["above_roofline"] = df["roofline_error"] != ""
    df["ok"] = df["ok"] & ~df["above_roofline"]
    for col in ("tflops", "pct_of_roofline", "pct_of_family_bound"):
        df.loc[df["above_roofline"], col] = nan


def _family(provider: str) -> str:
    from flashbench.models.io_model import family_for_provider

    return family_for_provider(provider)


__all__ = [
    "FLOP_CONVENTION",
    "Run",
    "best_per_provider",
    "compare_runs",
    "compare_summary",
    "cross_gpu_note",
    "failures",
    "load_run",
    "measurements",
    "pick_baseline",
    "recompute_overhead",
    "same_gpu",
    "side_by_side",
    "speedups",
    "throttled",
]

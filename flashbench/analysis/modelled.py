"""The models' side of every measured row: byte-model family, modelled memory and HBM bytes, arithmetic
intensity, and the roofline (attainable TFLOP/s, % of roofline, bound) under the GPU's ceilings.

analysis.measurements() and analysis.load_run() call these on the tidy frame; they only add columns. Model columns
are NaN where the model or the GPU's ceilings are not known.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flashbench.errors import FlashbenchError
from flashbench.gpu import hardware
from flashbench.models import io_model, memory, roofline
from flashbench.models.flops import attention_flops
from flashbench.models.io_model import Blocks
from flashbench.results.env import Environment
from flashbench.spec.cases import CASE_DEFAULTS, CASE_FIELDS, DTYPE_BYTES, Case
from flashbench.spec.window import parse_window

if TYPE_CHECKING:
    import pandas as pd

CASE_COLUMNS = list(CASE_FIELDS)  # the Case fields, in their order


ROOF_LABELS = {"datasheet": "datasheet", "nvml": "NVML-derived", "measured": "measured"}


def blocks_of(kernel_config: str) -> Any:
    """io_model.Blocks from the frame's kernel_config column (JSON text), else None (the model's defaults)."""

    return Blocks.from_config(json.loads(kernel_config) if kernel_config else None)


def add_model_columns(df: pd.DataFrame) -> None:
    """Compute dtype, modelled memory, HBM bytes (compulsory / family / no-L2) and intensities, each under the
    family the row carries (its provider's declaration; None: not modelled, NaN)."""

    nan = float("nan")
    cols: dict[str, list[Any]] = {
        k: [] for k in ("compute_dtype", "model_mem_bytes", "bytes_c", "bytes_f", "bytes_n", "flops_m")
    }
    for r in df[[*CASE_COLUMNS, "family", "kernel_config", "device"]].itertuples(index=False):
        family = r.family
        shape = (r.batch, r.heads, r.kv_heads, r.seq_q, r.seq_k, r.head_dim, dtype_bytes(r.dtype))
        try:
            case = case_of(r)
            lens = case.kv_lengths() if case.ragged else None
            window = window_of(r)
            docs = case.documents()
            dv = case.head_dim_v
            kv = dict(kv_elem_bytes=case.kv_elem_bytes, head_dim_v=dv)
            kw: dict[str, Any] = dict(
                blocks=blocks_of(r.kernel_config), seqlens_k=lens, window=window, documents=docs, **kv
            )
            values = [
                io_model.compute_dtype(family, r.dtype),
                memory.predicted_peak_bytes(
                    family,
                    *shape,
                    r.causal,
                    r.mode,
                    device=r.device,
                    window=window,
                    documents=docs,
                    head_dim_v=dv,
                ),
                io_model.compulsory_traffic(*shape, r.mode, seqlens_k=lens, documents=docs, **kv).total,
                io_model.hbm_traffic(family, *shape, r.causal, r.mode, l2_reuse=True, **kw).total,
                io_model.hbm_traffic(family, *shape, r.causal, r.mode, l2_reuse=False, **kw).total,
                attention_flops(
                    *shape[:2],
                    *shape[3:6],
                    r.causal,
                    r.mode,
                    seqlens_k=lens,
                    window=window,
                    documents=docs,
                    head_dim_v=dv,
                ),
            ]
        except (
            ValueError,
            TypeError,
            ZeroDivisionError,
        ):  # a shape the models refuse (e.g. heads % kv_heads)
            values = [r.dtype, nan, nan, nan, nan, nan]
        for key, value in zip(cols, values, strict=True):
            cols[key].append(value)
    df["compute_dtype"] = cols["compute_dtype"]
    df["model_mem_bytes"] = [float(v) for v in cols["model_mem_bytes"]]
    df["predicted_mem_bytes"] = df["predicted_mem_bytes"].fillna(df["model_mem_bytes"])
    df["flops"] = df["flops"].fillna(_series([float(v) for v in cols["flops_m"]], df.index))
    for name, key in (("compulsory", "bytes_c"), ("provider", "bytes_f"), ("no_l2", "bytes_n")):
        df[f"model_bytes_{name}"] = [float(v) for v in cols[key]]
        df[f"ai_{name}"] = df["flops"] / df[f"model_bytes_{name}"]


def provider_bytes(case: Case, family: str | None, kernel_config: dict[str, Any] | None = None) -> float:
    """The DRAM bytes the case's provider `family` is modelled to move with L2 reuse: the bytes behind a serving
    row's GB/s (add_bandwidth), for callers that hold Row records rather than the tidy frame (the sweep's
    terminal table). Raises ValueError for a shape the model refuses."""
    if family is None:
        raise ValueError(f"{case.provider} declares no model family")
    lens = case.kv_lengths() if case.ragged else None
    dims = (case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim)
    traffic = io_model.hbm_traffic(
        family,
        *dims,
        dtype_bytes(case.dtype),
        case.causal,
        case.mode,
        l2_reuse=True,
        blocks=Blocks.from_config(kernel_config),
        seqlens_k=lens,
        window=case.window_size,
        documents=case.documents(),
        kv_elem_bytes=case.kv_elem_bytes,
        head_dim_v=case.head_dim_v,
    )
    return float(traffic.total)


def case_of(row: Any) -> Case:
    """The Case of a row (a namedtuple with the Case fields); a field the frame holds as NaN (a row written before
    the field existed) takes its default."""
    return Case(**{name: _or_default(name, getattr(row, name)) for name in CASE_FIELDS})


def _or_default(name: str, value: Any) -> Any:
    return (
        CASE_DEFAULTS.get(name, value) if value != value else value
    )  # NaN is the one value unequal to itself


def window_of(row: Any) -> tuple[int, int] | None:
    """A row's sliding window (left, right), or None (rows written before the field existed have none)."""
    text = getattr(row, "window", "")
    return parse_window(text) if isinstance(text, str) and text else None


def predict_case(case: Case, family: str, flops_s: dict[str, float], bw_bytes_s: float, blocks: Any) -> Any:
    """models.roofline.predict for one case under one ceiling, on its actual key lengths (the one place a case's
    fields become the model's arguments: the analysis frame and `flashbench roofline --results` both call it)."""
    lens = case.kv_lengths() if case.ragged else None
    shape = (case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim, case.dtype)
    return roofline.predict(
        family,
        *shape,
        dtype_bytes(case.dtype),
        case.causal,
        case.mode,
        flops_s,
        bw_bytes_s,
        blocks,
        lens,
        case.window_size,
        case.documents(),
        case.kv_elem_bytes,
        case.head_dim_v,
    )


def add_bandwidth(df: pd.DataFrame, ceilings: list[Any]) -> None:
    """Achieved bytes/s of every ok row and its share of the bandwidth roofs: the serving side's numbers.

    achieved_gb_s: the provider family's modelled DRAM bytes with L2 reuse (model_bytes_provider: for a decode
    row Q, K and V over the valid lengths once per KV head, O, and the split partials the kernel reported) / the
    median time. pct_of_read_bw: of the calibrated read-only bandwidth (`flashbench calibrate`'s read_bw_gb_s, the
    roof of a read-mostly decode); pct_of_datasheet_bw: of the datasheet's. NaN where unknown.
    floor_ms and time_over_floor, on serving rows: the call's floor, its compulsory bytes at the calibrated read
    bandwidth plus the calibrated empty-kernel time (the CUDA-graph replay's for rows timed as one, else the
    eager launch's), and the median time over it (models.roofline.decode_floor_s); NaN without a calibration
    that measured both.
    """
    import numpy as np

    seconds = df["median_ms"].where(df["ok"]) * 1e-3
    df["achieved_gb_s"] = df["model_bytes_provider"] / seconds / 1e9
    read = next((c.read_bw_bytes_s for c in ceilings if getattr(c, "read_bw_bytes_s", None)), None)
    sheet = next((c.bw_bytes_s for c in ceilings if c.source == "datasheet" and c.bw_bytes_s), None)
    df["read_bw_gb_s"] = read / 1e9 if read else np.nan
    df["datasheet_bw_gb_s"] = sheet / 1e9 if sheet else np.nan
    df["pct_of_read_bw"] = 100.0 * df["achieved_gb_s"] / df["read_bw_gb_s"]
    df["pct_of_datasheet_bw"] = 100.0 * df["achieved_gb_s"] / df["datasheet_bw_gb_s"]
    measured = next((c for c in ceilings if c.source == "measured"), None)
    eager = getattr(measured, "empty_kernel_s", None) or np.nan
    graphed = getattr(measured, "empty_graph_s", None) or np.nan
    graph_rows = df["cuda_graph"].fillna(False).astype(bool) if "cuda_graph" in df else False
    empty_s = np.where(graph_rows, graphed, eager)
    floor_s = roofline.decode_floor_s(df["model_bytes_compulsory"], read or np.nan, empty_s)
    serving = df["serving"] if "serving" in df else np.ones(len(df), dtype=bool)
    df["floor_ms"] = (floor_s * 1e3).where(serving)
    df["time_over_floor"] = (seconds / floor_s).where(serving)


def _series(values: list[float], index: Any) -> pd.Series:
    import pandas as pd

    return pd.Series(values, index=index, dtype=float)


def ceilings(env: Environment, frame: pd.DataFrame, gpu: str) -> tuple[Any, list[Any]]:
    """(hardware.GpuSpec or None, [hardware.Ceiling]) of the GPU named `gpu`: datasheet, NVML-derived and
    measured, where known.

    The measured ceiling is the calibration recorded in env.json ("calibration") when the sweep stored one,
    else this machine's `flashbench calibrate` file for the same GPU model.
    """
    if len(frame) and (frame["device"] == "cpu").all():
        return None, []  # a CPU run has no GPU roofline
    facts = env.gpu_facts
    try:
        spec = hardware.match_nvml_name(gpu)
        if spec is None and facts and facts.get("derived_bw_bytes_s"):
            spec = hardware.derived_spec(facts)
        if spec is None:
            return None, []
        calibration = env.calibration
        if not isinstance(calibration, dict) or "error" in calibration:
            calibration = hardware.load_calibration(spec)
    except (
        FlashbenchError
    ):  # an unreadable table or calibration file: no roofline, the rest of the report stands
        return None, []
    return spec, [c for c in hardware.ceilings(spec, facts, calibration) if c.bw_bytes_s]


# The one rule for "% of roofline" and "bound" in every table, headline, export and comparison: one roof per case.
ROOF_RULE = (
    "% of roofline: measured FLOP/s / min(peak, AI x bandwidth) at the case's compulsory intensity AI = credited "
    "FLOPs / the DRAM bytes any exact attention must move (inputs read once, outputs written once), under the "
    "first ceiling (datasheet) and the peak of the case's tensor-core dtype: one roof per case, the same for "
    "every provider, so a provider that moves extra bytes scores lower, never higher. bound: the roof that "
    "limits the case at that intensity (compute-bound if AI >= ridge = peak / bandwidth, else memory-bound). "
    "Each provider's own modelled traffic (with L2 reuse) and compute dtype give what that implementation's own "
    "traffic allows: shown in the hover and exported as pct_of_own_roofline and own_bound."
)


def case_compute_dtype(dtype: str) -> str:
    """The peak a case is held to: its input dtype on the tensor cores (fp32 inputs: tf32, as tl.dot runs them),
    whatever precision a given provider chooses to compute in."""
    return io_model.compute_dtype("flash", dtype)


def add_roofline(df: pd.DataFrame, ceilings: list[Any]) -> None:
    """ROOF_RULE per case under the first ceiling (datasheet first), each provider's own roof, and the guard.

    peak_tflops, ridge_ai, attainable_tflops, pct_of_roofline, bound: ROOF_RULE (the case's compulsory
    intensity ai_compulsory, the case's tensor-core peak); own_peak_tflops, attainable_own_tflops,
    pct_of_own_roofline, own_bound: the same arithmetic at the provider family's own intensity with L2 reuse
    (ai_provider) and its compute dtype (sdpa-math: fp32), models.roofline.BOUND_RULE: what that
    implementation's own traffic allows; pct_of_family_bound: the family's no-L2 minimum time / measured (above
    100%: the L2 cache saved traffic); roofline_error: set when the measured time beats the compulsory minimum
    under the most permissive ceiling (a measurement or model error): such a case is never shown as a speed.
    """
    import numpy as np

    nan = float("nan")
    numbers = [
        "peak_tflops",
        "bw_bytes_s",
        "ridge_ai",
        "attainable_tflops",
        "pct_of_roofline",
        "own_peak_tflops",
        "attainable_own_tflops",
        "pct_of_own_roofline",
        "attainable_no_l2_tflops",
        "pct_of_family_bound",
    ]
    words = ["bound", "own_bound", "roofline_error"]
    out: dict[str, list[Any]] = {k: [] for k in numbers + words}
    for r in df[[*CASE_COLUMNS, "family", "device", "ok", "median_ms", "kernel_config"]].itertuples(
        index=False
    ):
        row: dict[str, Any] = {k: nan for k in numbers} | {k: "" for k in words}
        preds = []
        if ceilings and r.device != "cpu":
            try:
                blocks = blocks_of(r.kernel_config)
                case = Case(**{name: getattr(r, name) for name in CASE_FIELDS})
                preds = [predict_case(case, r.family, c.flops_s, c.bw_bytes_s, blocks) for c in ceilings]
            except (ValueError, TypeError, ZeroDivisionError):
                preds = []
        if preds:
            p, roof = preds[0], ceilings[0]
            peak = roof.peak(case_compute_dtype(r.dtype)) or None
            attainable = roofline.attainable_flops_s(p.compulsory.ai, peak, p.bw_bytes_s)
            row |= {
                "peak_tflops": peak / 1e12 if peak else nan,
                "bw_bytes_s": p.bw_bytes_s,
                "ridge_ai": roofline.ridge_point(peak, p.bw_bytes_s) if peak else nan,
                "attainable_tflops": attainable / 1e12,
                "bound": roofline.bound_kind(p.compulsory.ai, peak, p.bw_bytes_s),
                "own_peak_tflops": p.peak_flops_s / 1e12 if p.peak_flops_s else nan,
                "attainable_own_tflops": p.model.attainable_flops_s / 1e12,
                "own_bound": p.bound,
                "attainable_no_l2_tflops": p.no_l2.attainable_flops_s / 1e12,
            }
            if r.ok and r.median_ms == r.median_ms and r.median_ms > 0:
                guard = min(q.compulsory.min_time_s for q in preds)
                a = roofline.assess(r.median_ms * 1e-3, p, guard_min_time_s=guard)
                row |= {
                    "pct_of_roofline": 100.0 * a.achieved_flops_s / attainable,
                    "pct_of_own_roofline": a.pct_of_roofline,
                    "pct_of_family_bound": a.pct_of_family_bound,
                    "roofline_error": a.error,
                }
        for key in out:
            out[key].append(row[key])
    for key in numbers:
        df[key] = np.array(out[key], dtype=float)
    for key in words:
        df[key] = out[key]
    df["above_roofline"] = df["roofline_error"] != ""
    df["ok"] = df["ok"] & ~df["above_roofline"]
    for col in ("tflops", "pct_of_roofline", "pct_of_own_roofline", "pct_of_family_bound"):
        df.loc[df["above_roofline"], col] = nan


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 2)

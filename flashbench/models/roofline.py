"""Roofline arithmetic: intensity, attainable FLOP/s, ridge point, bound, minimum time, and the validity guard.

Pure: takes FLOPs, bytes, a peak FLOP/s and a bandwidth; no torch, no hardware lookups.

    AI          = FLOPs / DRAM bytes                      (FLOP/byte)
    attainable  = min(peak, AI x bandwidth)               (FLOP/s)
    ridge       = peak / bandwidth                         (the AI where the two roofs meet)
    bound       = "memory" if AI < ridge else "compute"
    min time    = max(FLOPs / peak, bytes / bandwidth)

Each case gets two bounds: the compulsory one (the floor for any exact attention: inputs read once, outputs
written once) and the family's own traffic without L2 reuse (the naive path's N x N round trips, a tiled
kernel's K/V re-reads per block). A measured time between the two means the L2 cache saved traffic; a
measured time below the compulsory minimum is impossible and is flagged as an error, never a result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from flashbench.models import flops as flops_model
from flashbench.models import io_model

# A measured point may beat the datasheet roof by clock rounding; beyond this it is an error.
GUARD_TOLERANCE = 0.05


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    if nbytes <= 0:
        return float("inf")
    return flops / nbytes


def ridge_point(peak_flops_s: float, bw_bytes_s: float) -> float:
    return peak_flops_s / bw_bytes_s


def attainable_flops_s(ai: float, peak_flops_s: float | None, bw_bytes_s: float) -> float:
    """min(peak, AI x bandwidth); with no known peak, the memory roof alone."""
    memory_roof = ai * bw_bytes_s
    return memory_roof if peak_flops_s is None else min(peak_flops_s, memory_roof)


def bound_kind(ai: float, peak_flops_s: float | None, bw_bytes_s: float) -> str:
    if peak_flops_s is None:
        return "unknown"
    return "memory" if ai < ridge_point(peak_flops_s, bw_bytes_s) else "compute"


def min_time_s(flops: float, nbytes: float, peak_flops_s: float | None, bw_bytes_s: float) -> float:
    compute = flops / peak_flops_s if peak_flops_s else 0.0
    return max(compute, nbytes / bw_bytes_s)


@dataclass(frozen=True)
class Bound:
    """One roof applied to one (FLOPs, bytes) pair."""

    bytes: int
    ai: float
    attainable_flops_s: float
    bound: str
    min_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(flops: float, nbytes: int, peak_flops_s: float | None, bw_bytes_s: float) -> Bound:
    ai = arithmetic_intensity(flops, nbytes)
    return Bound(
        bytes=nbytes,
        ai=ai,
        attainable_flops_s=attainable_flops_s(ai, peak_flops_s, bw_bytes_s),
        bound=bound_kind(ai, peak_flops_s, bw_bytes_s),
        min_time_s=min_time_s(flops, nbytes, peak_flops_s, bw_bytes_s),
    )


@dataclass(frozen=True)
class Prediction:
    """What the model says about one case under one roof."""

    family: str
    mode: str
    compute_dtype: str
    flops: float
    peak_flops_s: float | None
    bw_bytes_s: float
    ridge: float | None
    compulsory: Bound  # floor for any exact attention
    model: Bound  # this family's traffic with L2 reuse (flash: = compulsory + small extras)
    no_l2: Bound  # this family's traffic with no L2 reuse

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(
    family: str,
    batch: int,
    heads: int,
    kv_heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    dtype: str,
    elem_bytes: int,
    causal: bool,
    mode: str,
    peaks_flops_s: dict[str, float],
    bw_bytes_s: float,
    blocks: io_model.Blocks | None = None,
) -> Prediction:
    """Roofline prediction for one case. peaks_flops_s maps compute dtype -> FLOP/s (missing = unknown)."""
    fl = flops_model.attention_flops(batch, heads, seq_q, seq_k, head_dim, causal, mode)
    shape = (batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes)
    floor = io_model.compulsory_traffic(*shape, mode).total
    model = io_model.hbm_traffic(family, *shape, causal, mode, l2_reuse=True, blocks=blocks).total
    no_l2 = io_model.hbm_traffic(family, *shape, causal, mode, l2_reuse=False, blocks=blocks).total
    cdt = io_model.compute_dtype(family, dtype)
    peak = peaks_flops_s.get(cdt)
    return Prediction(
        family=family,
        mode=mode,
        compute_dtype=cdt,
        flops=fl,
        peak_flops_s=peak,
        bw_bytes_s=bw_bytes_s,
        ridge=ridge_point(peak, bw_bytes_s) if peak else None,
        compulsory=evaluate(fl, floor, peak, bw_bytes_s),
        model=evaluate(fl, model, peak, bw_bytes_s),
        no_l2=evaluate(fl, no_l2, peak, bw_bytes_s),
    )


@dataclass(frozen=True)
class Assessment:
    """A measured time against a prediction."""

    measured_s: float
    achieved_flops_s: float
    pct_of_roofline: float  # achieved / attainable under the compulsory bound (what the GPU allows)
    pct_of_family_bound: float  # measured vs the family's own no-L2 minimum time (>100%: L2 saved traffic)
    bound: str  # the family's predicted bound (no-L2 traffic)
    valid: bool
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_valid(measured_s: float, floor_min_time_s: float, tolerance: float = GUARD_TOLERANCE) -> str:
    """'' if a measured time is physically possible, else why not (a measurement or model error)."""
    if measured_s <= 0:
        return "non-positive measured time"
    if measured_s * (1.0 + tolerance) < floor_min_time_s:
        ratio = floor_min_time_s / measured_s
        return (
            f"faster than the roofline allows ({measured_s * 1e3:.4g} ms < minimum {floor_min_time_s * 1e3:.4g} ms, "
            f"{ratio:.2f}x): a measurement error (timing, clocks, a fallback that skipped work) or a model error"
        )
    return ""


def assess(
    measured_s: float,
    prediction: Prediction,
    guard_min_time_s: float | None = None,
    tolerance: float = GUARD_TOLERANCE,
) -> Assessment:
    """Achieved FLOP/s and % of roofline for a measured time, with the validity guard.

    guard_min_time_s: the compulsory minimum time under the most permissive roof available (the highest
    peak and bandwidth among datasheet / NVML / measured); defaults to this prediction's.
    """
    achieved = prediction.flops / measured_s if measured_s > 0 else float("inf")
    floor = prediction.compulsory.min_time_s if guard_min_time_s is None else guard_min_time_s
    error = check_valid(measured_s, floor, tolerance)
    return Assessment(
        measured_s=measured_s,
        achieved_flops_s=achieved,
        pct_of_roofline=100.0 * achieved / prediction.compulsory.attainable_flops_s,
        pct_of_family_bound=100.0 * prediction.no_l2.min_time_s / measured_s if measured_s > 0 else 0.0,
        bound=prediction.no_l2.bound,
        valid=not error,
        error=error,
    )

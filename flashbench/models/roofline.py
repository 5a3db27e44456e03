"""Roofline arithmetic: intensity, attainable FLOP/s, ridge point, bound, minimum time, and the validity guard.

Pure: takes FLOPs, bytes, a peak FLOP/s and a bandwidth; no torch, no hardware lookups.

    AI          = FLOPs / DRAM bytes                      (FLOP/byte)
    attainable  = min(peak, AI x bandwidth)               (FLOP/s)
    ridge       = peak / bandwidth                         (the AI where the two roofs meet)
    min time    = max(FLOPs / peak, bytes / bandwidth)

The bound (BOUND_RULE, the one definition every output uses: CLI tables, JSON, analysis columns, report):
the roof that limits a case at its arithmetic intensity over the DRAM bytes its provider's family is modelled
to move WITH L2 reuse (io_model.hbm_traffic, l2_reuse=True), under the ceilings in use (the first of
datasheet / NVML-derived / measured, for the family's compute dtype): compute-bound when AI >= ridge, else
memory-bound; a measured point's % of roofline is its FLOP/s over the attainable FLOP/s at that same AI.

Why those bytes, and not the two other counts each case carries:
- the compulsory bytes (the floor: inputs read once, outputs written once) are a property of the shape, the
  same for every provider: at the floor naive attention would be "compute-bound" from N ~ 600 on an H100,
  though it moves ~28 bytes per attention-matrix element and runs against the memory roof. The floor
  answers another question, how far a case is from what any exact attention could do on this GPU:
  Assessment.pct_of_floor_roofline.
- the no-L2 bytes count every K/V re-read of a tiled kernel as DRAM traffic (32x the floor for 128-row
  query blocks at N = 8192); they called every FlashAttention row "memory-bound", even at 646 TFLOP/s, 65%
  of an H100's bf16 compute roof. The L2 serves those re-reads: Nsight Compute measured 0.127 GB of DRAM
  traffic for the bundled forward at N = 8192, d = 128, bf16, B = 1, H = 16 on an H200 against 0.135 GB
  modelled with L2 reuse and 4.36 GB without (naive: 30.09 measured, 30.20 modelled;
  tools/ncu_bytes.py). The no-L2 intensity stays a separate column, to show what the L2 saves.
The modelled bytes with L2 reuse are the best estimate of what the kernel really moves, which is the intensity
a roofline is defined on (Williams, Waterman, Patterson 2009: operations per byte of DRAM traffic).

Decode (one or a few query tokens over a KV cache): intensity is about H / Hkv FLOP per byte (4 at 32 query
heads over 8 KV heads in bf16: 4 H d L FLOPs against 4 Hkv d L bytes of K and V), two orders of magnitude below an
H100's ridge (~300 FLOP/byte in bf16), so BOUND_RULE puts every decode row on the memory-bound slope, where its
% of roofline is its bytes/s over the bandwidth.

A measured time below the compulsory minimum is impossible and is flagged as an error, never a result.

A decode call's floor (decode_floor_s): the pure read time of its compulsory bytes at the calibrated read
bandwidth plus the measured empty-kernel time (one launch that does nothing, timed as the call is: the event
floor no call can go under). A row's time_over_floor (analysis) = its median time / that floor: 1.0 is a call
that only moves its bytes; docs/decode.md states the target (at most 1.25 under --cuda-graph, batch 1, 8k-32k keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flashbench.models import flops as flops_model
from flashbench.models import io_model

# A measured point may beat the datasheet roof by clock rounding; beyond this it is an error.
GUARD_TOLERANCE = 0.05
COMPUTE_BOUND = "compute-bound"
MEMORY_BOUND = "memory-bound"
UNKNOWN_BOUND = "unknown"  # no peak FLOP/s known for the compute dtype
BOUND_RULE = (
    "bound: the roof that limits a case at its arithmetic intensity AI = credited FLOPs / the DRAM bytes its "
    "provider's family is modelled to move with L2 reuse; compute-bound if AI >= ridge (peak FLOP/s / "
    "bandwidth of the ceiling used), else memory-bound; % of roofline = measured FLOP/s / min(peak, AI x "
    "bandwidth) at that AI."
)


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
    """The roof that limits intensity `ai` (BOUND_RULE's comparison): COMPUTE_BOUND or MEMORY_BOUND."""
    if peak_flops_s is None:
        return UNKNOWN_BOUND
    return MEMORY_BOUND if ai < ridge_point(peak_flops_s, bw_bytes_s) else COMPUTE_BOUND


def min_time_s(flops: float, nbytes: float, peak_flops_s: float | None, bw_bytes_s: float) -> float:
    compute = flops / peak_flops_s if peak_flops_s else 0.0
    return max(compute, nbytes / bw_bytes_s)


@dataclass(frozen=True)
class Bound:
    """One roof applied to one (FLOPs, bytes) pair. The case's bound is Prediction.bound (BOUND_RULE)."""

    bytes: int
    ai: float
    attainable_flops_s: float
    min_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(flops: float, nbytes: int, peak_flops_s: float | None, bw_bytes_s: float) -> Bound:
    ai = arithmetic_intensity(flops, nbytes)
    return Bound(
        bytes=nbytes,
        ai=ai,
        attainable_flops_s=attainable_flops_s(ai, peak_flops_s, bw_bytes_s),
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
    model: Bound  # this family's traffic with L2 reuse (flash: = compulsory + small extras): BOUND_RULE's
    no_l2: Bound  # this family's traffic with no L2 reuse

    @property
    def bound(self) -> str:
        """The case's bound under BOUND_RULE (at the family's modelled intensity with L2 reuse)."""
        return bound_kind(self.model.ai, self.peak_flops_s, self.bw_bytes_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bound": self.bound}


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
    seqlens_k: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    documents: Sequence[int] | None = None,
    kv_elem_bytes: int = 0,
    head_dim_v: int = 0,
) -> Prediction:
    """Roofline prediction for one case. peaks_flops_s maps compute dtype -> FLOP/s (missing = unknown).
    seqlens_k: each sequence's valid keys (a ragged KV cache): FLOPs and bytes of those keys only.
    window: a sliding window (left, right): its unmasked pairs and visited blocks.
    documents: a packed batch's document lengths: placed by its useful FLOPs (each document's own pairs).
    kv_elem_bytes: bytes per K/V element of a cache in its own dtype (an FP8 KV cache: 1); 0: elem_bytes.
    head_dim_v: MLA's V dims (Case.head_dim_v): FLOPs and bytes of the absorbed form."""
    fl = flops_model.attention_flops(
        batch,
        heads,
        seq_q,
        seq_k,
        head_dim,
        causal,
        mode,
        seqlens_k=seqlens_k,
        window=window,
        documents=documents,
        head_dim_v=head_dim_v,
    )
    shape = (batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes)
    traffic: dict[str, Any] = dict(
        seqlens_k=seqlens_k, documents=documents, kv_elem_bytes=kv_elem_bytes, head_dim_v=head_dim_v
    )
    floor = io_model.compulsory_traffic(*shape, mode, **traffic).total
    kw: dict[str, Any] = dict(blocks=blocks, window=window, **traffic)
    model = io_model.hbm_traffic(family, *shape, causal, mode, l2_reuse=True, **kw).total
    no_l2 = io_model.hbm_traffic(family, *shape, causal, mode, l2_reuse=False, **kw).total
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
    ai: float  # BOUND_RULE's intensity: FLOPs / the family's modelled bytes with L2 reuse
    pct_of_roofline: float  # achieved / attainable at `ai` (BOUND_RULE)
    pct_of_floor_roofline: (
        float  # achieved / attainable at the compulsory intensity (what any kernel could do)
    )
    pct_of_family_bound: float  # measured vs the family's own no-L2 minimum time (>100%: L2 saved traffic)
    bound: str  # BOUND_RULE: compute-bound or memory-bound at `ai`
    valid: bool
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_floor_s(nbytes: Any, read_bw_bytes_s: Any, empty_s: Any) -> Any:
    """nbytes / read_bw_bytes_s + empty_s: a decode call's floor in seconds (module docstring). Plain arithmetic,
    so numbers and pandas columns alike."""
    return nbytes / read_bw_bytes_s + empty_s


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
    """Achieved FLOP/s, bound and % of roofline (BOUND_RULE) for a measured time, with the validity guard.

    guard_min_time_s: the compulsory minimum time under the most permissive roof available (the highest
    peak and bandwidth among datasheet / NVML / measured); defaults to this prediction's.
    """
    achieved = prediction.flops / measured_s if measured_s > 0 else float("inf")
    floor = prediction.compulsory.min_time_s if guard_min_time_s is None else guard_min_time_s
    error = check_valid(measured_s, floor, tolerance)
    return Assessment(
        measured_s=measured_s,
        achieved_flops_s=achieved,
        ai=prediction.model.ai,
        pct_of_roofline=100.0 * achieved / prediction.model.attainable_flops_s,
        pct_of_floor_roofline=100.0 * achieved / prediction.compulsory.attainable_flops_s,
        pct_of_family_bound=100.0 * prediction.no_l2.min_time_s / measured_s if measured_s > 0 else 0.0,
        bound=prediction.bound,
        valid=not error,
        error=error,
    )

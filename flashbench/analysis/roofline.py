"""The roofline report: a GPU's ceilings and ridge points, each family's modelled intensity, bound and minimum
time per case, and measured rows overlaid (the library call behind `flashbench roofline`). No GPU needed."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from flashbench.analysis import modelled
from flashbench.errors import FlashbenchError, warn
from flashbench.gpu import hardware
from flashbench.models import io_model
from flashbench.models import roofline as rl
from flashbench.results.rows import FLOP_CONVENTION, OK, read_rows
from flashbench.spec.cases import DTYPE_BYTES
from flashbench.spec.parse import split_choices
from flashbench.spec.window import effective, window_text

ROOF_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


def _resolve_gpu(gpu: str, results: Path | None) -> tuple[Any, dict[str, Any] | None]:

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hardware.UnknownGpuWarning)
        try:
            spec, facts = hardware.resolve(gpu)
        except FlashbenchError:
            if gpu.strip().lower() != "auto" or results is None:
                raise
            spec, facts = _gpu_from_results(results), None
    for w in caught:
        warn(str(w.message))
    return spec, facts


def _gpu_from_results(results: Path) -> Any:
    """--gpu auto on a machine without NVML: the GPU the results were measured on."""

    names = {r.gpu for r in read_rows(results) if r.gpu and r.device == "cuda"}
    for name in sorted(names):
        spec = hardware.match_nvml_name(name)
        if spec is not None:
            return spec
    raise FlashbenchError(
        f"--gpu auto: no NVML here and no known GPU in {results} ({', '.join(sorted(names)) or 'no GPU rows'}); "
        "name one with --gpu"
    )


def parse_families(text: str) -> list[str]:

    return split_choices(text, "--families", io_model.FAMILIES)


def build_roofline(
    gpu: str = "auto",
    seqs: list[int] | None = None,
    head_dims: tuple[int, ...] = (128,),
    dtypes: tuple[str, ...] = ("bf16",),
    modes: tuple[str, ...] = ("fwd",),
    families: tuple[str, ...] | None = None,
    batch: int = 1,
    heads: int = 16,
    kv_heads: int | None = None,
    causal: bool = False,
    results: Path | None = None,
    window: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The roofline report as a JSON-ready dict: GPU, ceilings, per-case predictions, measured overlay.
    window: a sliding window (left, right) for every modelled case (its unmasked pairs and visited blocks)."""
    try:
        window = effective(causal, window)
    except ValueError as exc:
        raise FlashbenchError(f"--window: {exc}") from None

    spec, facts = _resolve_gpu(gpu, results)
    roofs = [r for r in hardware.ceilings(spec, facts, hardware.load_calibration(spec)) if r.bw_bytes_s]
    if not roofs:
        raise FlashbenchError(f"no bandwidth known for {spec.name}: run flashbench calibrate on it")
    roof = roofs[0]
    bw = roof.bw_bytes_s
    assert bw is not None  # roofs without a bandwidth were dropped above
    seqs = seqs or [1024, 2048, 4096, 8192, 16384, 32768]
    families = tuple(families or io_model.FAMILIES)
    kv = kv_heads or heads
    predictions = []
    for dtype in dtypes:
        for mode in modes:
            for d in head_dims:
                for fam in families:
                    for n in seqs:
                        p = rl.predict(
                            fam,
                            batch,
                            heads,
                            kv,
                            n,
                            n,
                            d,
                            dtype,
                            DTYPE_BYTES[dtype],
                            causal,
                            mode,
                            roof.flops_s,
                            bw,
                            window=window,
                        )
                        predictions.append({"dtype": dtype, "head_dim": d, "seq": n, **p.to_dict()})
    report: dict[str, Any] = {
        "gpu": {
            "key": spec.key,
            "name": spec.name,
            "derived": spec.derived,
            "note": spec.note,
            "sm_count": spec.sm_count,
            "l2_bytes": spec.l2_bytes,
            "smem_per_sm_bytes": spec.smem_per_sm_bytes,
            "memory_bytes": spec.memory_bytes,
            "sources": spec.sources,
        },
        "nvml": facts,
        "roof_used": roof.source,
        "ceilings": [
            {**c.to_dict(), "ridge": {d: c.ridge(d) for d in ROOF_DTYPES if c.ridge(d)}} for c in roofs
        ],
        "shape": {
            "batch": batch,
            "heads": heads,
            "kv_heads": kv,
            "causal": causal,
            "window": window_text(window),
        },
        "flop_convention": FLOP_CONVENTION,
        "bound_rule": rl.BOUND_RULE,
        "predictions": predictions,
        "measured": _overlay(results, roofs) if results is not None else [],
    }
    return report


def _overlay(results: Path, roofs: list[Any]) -> list[dict[str, Any]]:
    """Measured rows against their roofline; points above it are errors, not results."""

    roof = roofs[0]
    out = []
    for r in read_rows(results):
        if r.status != OK or not r.median_ms or r.device != "cuda" or r.dtype not in DTYPE_BYTES:
            continue
        fam = r.family
        blocks = io_model.Blocks.from_config(r.kernel_config) or io_model.Blocks()
        try:
            if fam is None:
                raise ValueError(f"{r.provider} declares no model family")
            p = modelled.predict_case(r.case, fam, roof.flops_s, roof.bw_bytes_s, blocks)
            # The guard uses the most permissive roof: the highest peak and bandwidth among all sources.
            peak = max((c.peak(p.compute_dtype) or 0.0 for c in roofs), default=0.0) or None
            bw = max(c.bw_bytes_s for c in roofs)
            guard = rl.min_time_s(p.flops, p.compulsory.bytes, peak, bw)
            a = rl.assess(r.median_ms * 1e-3, p, guard_min_time_s=guard)
        except ValueError as exc:
            out.append({"key": r.key, "provider": r.provider, "valid": False, "error": f"model: {exc}"})
            continue
        entry: dict[str, Any] = {
            "key": r.key,
            "provider": r.provider,
            "family": fam,
            "seq_q": r.seq_q,
            "seq_k": r.seq_k,
            "head_dim": r.head_dim,
            "dtype": r.dtype,
            "causal": r.causal,
            "mode": r.mode,
            "median_ms": r.median_ms,
            "throttled": r.throttled,
            "bound": a.bound,
            "ai": a.ai,
            "ai_compulsory": p.compulsory.ai,
            "ai_no_l2": p.no_l2.ai,
            "valid": a.valid,
            "error": a.error,
            "achieved_tflops": a.achieved_flops_s / 1e12 if a.valid else None,
            "pct_of_roofline": a.pct_of_roofline if a.valid else None,
            "pct_of_floor_roofline": a.pct_of_floor_roofline if a.valid else None,
            "pct_of_family_no_l2_bound": a.pct_of_family_bound if a.valid else None,
            "model_bytes": p.model.bytes,
            "ncu_bytes": (r.ncu_dram_read_bytes or 0) + (r.ncu_dram_write_bytes or 0) or None,
        }
        out.append(entry)
    return out

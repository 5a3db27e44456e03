"""Config spaces of the bundled Triton kernels: what the autotuner may try, what fits a GPU, forced configs.

A config is {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} (plus "maxnreg", and a kernel's own keys such
as flash_v1's Q_SPLIT). launch.py picks one per call: a forced config, the interpreter's, the first that fits
(`default_config`, FLASHBENCH_AUTOTUNE=0), or the autotuner's among `candidates`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import KernelUnsupported

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
# Launch options of a config besides num_warps / num_stages (not kernel arguments): "maxnreg" caps the
# registers per thread, e.g. so that two 8-warp programs fit on one SM (65536 registers = 2 x 256 x 128).
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")
# An H100's opt-in shared memory per block (227 KiB): the default limit of `default_config`.
H100_SHARED_MEM = 232448

# One config under the interpreter: big enough blocks to keep the interpreter's per-block Python overhead
# low, small enough that N = 127 and 1000 still cross several blocks (online rescaling, causal diagonal).
INTERPRET_FWD = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
INTERPRET_BWD = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}

# GPU forward space (BLOCK_M, BLOCK_N, num_warps, num_stages[, maxnreg]), pruned per head dim and dtype by
# `fits`. Order matters: without autotuning (FLASHBENCH_AUTOTUNE=0) the first config that fits is used. The
# first five each won at least one of the speed preset's forward shapes (bf16, d = 64 and 128, N = 2048-16384)
# on an H100 (`flashbench sweep --config benchmarks/studies/forward_tiles.toml`, which times every tile of this
# space beside a few outside it); the smaller tiles are there for D = 256 and for GPUs with less shared memory.
FWD_SPACE: tuple[tuple[int, ...], ...] = (
    (128, 64, 4, 2),
    (128, 128, 8, 3),
    (128, 64, 8, 3),
    (64, 128, 4, 2),
    (128, 128, 8, 2),
    (128, 64, 4, 3),
    (64, 64, 4, 3),
    (64, 32, 4, 2),
)
# No register cap (a fifth entry, maxnreg): it never lifted a tile past the best uncapped one (docs/kernels.md,
# measured and not adopted). config={"maxnreg": 128, ...} forces one.
# The stored-P and FA1-order forwards are measuring devices, not speed targets: a smaller space keeps their
# autotune (and a sweep's compile time) short.
VARIANT_FWD_SPACE: tuple[tuple[int, ...], ...] = (
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 3),
    (128, 32, 8, 2),
    (64, 64, 4, 3),
    (64, 32, 4, 2),
)
# The FP8 forward's space (flash_fp8.py): FA3's 128-row query tiles, 64- or 128-key blocks, 4 or 8 warps, 2-4
# stages (e4m3 tiles are half the bytes of bf16 ones, so deeper pipelines fit), and 64-row tiles; the 4-warp
# tiles led (docs/kernels.md, the FP8 forward; `flashbench sweep --config benchmarks/studies/fp8_forward.toml`).
FP8_FWD_SPACE: tuple[tuple[int, ...], ...] = (
    (128, 128, 8, 3),
    (128, 64, 4, 3),
    (64, 128, 4, 3),
    (128, 128, 8, 4),
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 4, 4),
    (128, 64, 4, 2),
    (64, 64, 4, 3),
)
# GPU backward spaces. dK/dV: BLOCK_N keys resident, BLOCK_M query rows streamed; dQ: the reverse. Each tile
# side by side: `flashbench sweep --config benchmarks/studies/backward.toml`.
BWD_DKDV_SPACE: tuple[tuple[int, int, int, int], ...] = (
    (32, 128, 4, 4),
    (64, 128, 8, 3),
    (32, 128, 4, 3),
    (32, 128, 4, 5),
    (64, 128, 8, 2),
    (32, 64, 4, 3),
    (64, 64, 4, 3),
    (32, 32, 4, 2),
)
BWD_DQ_SPACE: tuple[tuple[int, int, int, int], ...] = (
    (128, 64, 8, 3),
    (128, 64, 8, 2),
    (128, 32, 4, 3),
    (64, 64, 4, 3),
    (64, 32, 4, 3),
    (32, 32, 4, 2),
)


def estimate(kind: str, config: dict[str, int], head_dim: int, elem: int) -> tuple[int, float]:
    """(shared-memory bytes, fp32 accumulator registers per thread) a config needs; a rough upper estimate.

    fwd:  Q tile resident, K and V tiles pipelined over `stages`; acc [BM, D] and S [BM, BN] in registers.
    dkdv: K, V resident, Q and dO pipelined, P^T / dS^T tiles; dK and dV accumulators [BN, D].
    dq:   Q, dO resident, K and V pipelined, P / dS tiles; dQ accumulator [BM, D].
    `elem` is the input's element size in bytes.
    """
    bm, bn, d = config["BLOCK_M"], config["BLOCK_N"], head_dim
    stages, threads = max(config["num_stages"], 1), 32 * config["num_warps"]
    if kind == "fwd":
        smem = elem * (bm * d + stages * 2 * bn * d)  # P stays in registers (dot operand A)
        regs = (bm * d + bm * bn) / threads
    elif kind == "dkdv":
        smem = elem * (2 * bn * d + stages * 2 * bm * d + 2 * bn * bm)
        regs = (2 * bn * d + 2 * bn * bm) / threads
    else:
        smem = elem * (2 * bm * d + stages * 2 * bn * d + 2 * bm * bn)
        regs = (bm * d + 2 * bm * bn) / threads
    return smem, regs


def config_dict(entry: Sequence[int]) -> dict[str, int]:
    """A space entry (BLOCK_M, BLOCK_N, num_warps, num_stages[, maxnreg]) as a config dict."""
    out = dict(zip(CONFIG_KEYS, entry[:4], strict=True))
    return {**out, "maxnreg": entry[4]} if len(entry) > 4 else out


def register_budget(elem: int) -> int:
    """fp32 accumulator registers per thread (estimate) a config may need, of the 255 a thread can have.

    16-bit inputs get 192: the forward's fastest d = 128 tile, (128, 64, 4, 2), and the dK/dV pass's 128-key
    tiles need it, and both beat the best tile a budget of 160 lets through (docs/kernels.md, configs). fp32
    inputs (FMA dots, no tensor cores) keep 160.
    """
    return 192 if elem <= 2 else 160


def fits(kind: str, config: dict[str, int], head_dim: int, elem: int, smem_limit: int) -> bool:
    smem, regs = estimate(kind, config, head_dim, elem)
    return smem <= smem_limit and regs <= register_budget(elem)


def candidates(
    kind: str, space: Sequence[tuple[int, ...]], head_dim: int, elem: int, smem_limit: int
) -> list[dict[str, int]]:
    """The configs of `space` the autotuner tries: those whose estimate fits; if none does, the smallest tile
    (the compiler decides)."""
    kept = [config_dict(c) for c in space if fits(kind, config_dict(c), head_dim, elem, smem_limit)]
    return kept or [config_dict(min(space, key=lambda c: (c[0] * c[1], c[3])))]


def default_config(
    kind: str, space: Sequence[tuple[int, ...]], head_dim: int, elem: int, smem_limit: int = H100_SHARED_MEM
) -> dict[str, Any]:
    """The first config of `space` (listed in order of preference) that fits; the smallest if none does."""
    return candidates(kind, space, head_dim, elem, smem_limit)[0]


def normalize_config(name: str, config: Any, extra_keys: dict[str, int] | None = None) -> dict[str, Any]:
    """Validate a forced forward config; fill num_warps / num_stages (and `extra_keys`) defaults.

    Raises KernelUnsupported.
    """
    extra_keys = extra_keys or {}
    if not isinstance(config, dict):
        raise KernelUnsupported(
            f"{name}: config must be a dict like {{'BLOCK_M': 64, 'BLOCK_N': 64}}, got {config!r}"
        )
    allowed = set(CONFIG_KEYS) | {"maxnreg"} | set(extra_keys)
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise KernelUnsupported(f"{name}: unknown config keys {unknown} (allowed: {sorted(allowed)})")
    cfg = {"num_warps": 4, "num_stages": 2, **extra_keys, **config}
    for key in ("BLOCK_M", "BLOCK_N"):
        if key not in cfg:
            raise KernelUnsupported(f"{name}: config needs {key}")
        val = cfg[key]
        if not isinstance(val, int) or val < 16 or val > 256 or val & (val - 1):
            raise KernelUnsupported(f"{name}: config {key}={val!r} must be a power of two in 16..256")
    w = cfg["num_warps"]
    if not isinstance(w, int) or w < 1 or w > 16 or w & (w - 1):
        raise KernelUnsupported(f"{name}: config num_warps={w!r} must be 1, 2, 4, 8 or 16")
    if not isinstance(cfg["num_stages"], int) or not 1 <= cfg["num_stages"] <= 8:
        raise KernelUnsupported(f"{name}: config num_stages={cfg['num_stages']!r} must be an int in 1..8")
    if "maxnreg" in cfg and (not isinstance(cfg["maxnreg"], int) or not 24 <= cfg["maxnreg"] <= 255):
        raise KernelUnsupported(f"{name}: config maxnreg={cfg['maxnreg']!r} must be an int in 24..255")
    for key in extra_keys:
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise KernelUnsupported(f"{name}: config {key}={cfg[key]!r} must be a positive int")
    return cfg

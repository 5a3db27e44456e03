"""Shared pieces of the bundled attention kernels: input checks, the config space, launch plumbing.

Nothing here launches work by itself. The kernel files (flash_v2.py, stored_p.py, flash_v1.py,
backward.py) call `check_inputs` before any launch and `launch` to run a kernel with a forced config,
the interpreter's single config, or the autotuner.

Config selection, decided at call time (never at import):
  - `config=` given      -> that forward config, validated, no autotuning;
  - TRITON_INTERPRET=1   -> one fixed config (timing the interpreter would pick nothing useful);
  - FLASHBENCH_AUTOTUNE=0 -> the first config of the space that fits (`default_config`), no autotuning;
  - otherwise (CUDA)     -> autotune.tune over a small space, keyed on the sequence-length bucket, the
                            compile-time arguments (head dim, causal, TMA, ...), Q's dtype and the
                            GPU, with configs pruned when their shared-memory or register estimate cannot fit;
                            candidates timed as sweep cases in rotation, the pick cached on disk
                            (kernels/autotune.py).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime import errors as triton_errors
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from . import autotune

SUPPORTED_HEAD_DIMS: tuple[int, ...] = (32, 64, 128, 256)
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
# exp(x) == exp2(x * log2(e)): the kernels fold log2(e) into the softmax scale and use exp2.
LOG2E = 1.4426950408889634
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
# Launch options of a config besides num_warps / num_stages (not kernel arguments): "maxnreg" caps the
# registers per thread, e.g. so that two 8-warp programs fit on one SM (65536 registers = 2 x 256 x 128).
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")


class KernelUnsupported(ValueError):
    """A bundled kernel refuses these inputs; the message names what is unsupported."""


# The forward config used by the most recent forward launch (any of the three kernels).
_LAST_CONFIG: dict[str, Any] | None = None


def last_config() -> dict[str, Any] | None:
    """The forward config (BLOCK_M, BLOCK_N, num_warps, num_stages, ...) of the most recent forward launch.

    The dict can be passed back as `config=` to force the same config.
    """
    return None if _LAST_CONFIG is None else dict(_LAST_CONFIG)


def _set_last_config(cfg: dict[str, Any]) -> None:
    global _LAST_CONFIG
    _LAST_CONFIG = dict(cfg)


def autotune_enabled() -> bool:
    """False when FLASHBENCH_AUTOTUNE=0: CUDA launches then use `default_config` (no autotuning, one compile
    per shape class; the GPU test suite uses this to keep its compile time down)."""
    return os.environ.get("FLASHBENCH_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def interpreting() -> bool:
    """True when Triton's interpreter is on (read from the environment at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


# ----------------------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------------------


def check_inputs(
    name: str, q: Any, k: Any, v: Any, causal: Any, sm_scale: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Validate q [B, H, Nq, D], k/v [B, Hkv, Nk, D]; return unit-stride views and the softmax scale.

    Raises KernelUnsupported naming the first unsupported property. A negative sm_scale comes back positive
    with q negated (the same attention). Arbitrary strides are passed to the
    kernels; only a tensor whose last dimension is not unit-stride is copied (`.contiguous()`), so that
    every row load stays a vectorised read.
    """
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise KernelUnsupported(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise KernelUnsupported(
                f"{name}: {label} must be 4-D [batch, heads, seq, head_dim], got shape {tuple(t.shape)}"
            )
    if not isinstance(causal, bool):
        raise KernelUnsupported(f"{name}: causal must be a bool, got {causal!r}")
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelUnsupported(f"{name}: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.dtype not in SUPPORTED_DTYPES:
        raise KernelUnsupported(f"{name}: dtype {q.dtype} unsupported (fp16, bf16, fp32 are)")
    if not (q.device == k.device == v.device):
        raise KernelUnsupported(
            f"{name}: q, k, v are on different devices ({q.device}, {k.device}, {v.device})"
        )
    if q.device.type == "cuda":
        if interpreting():
            raise KernelUnsupported(
                f"{name}: CUDA tensors while TRITON_INTERPRET=1 (the interpreter runs on CPU)"
            )
    elif q.device.type == "cpu":
        if not interpreting():
            raise KernelUnsupported(
                f"{name}: device cpu needs Triton's interpreter (set TRITON_INTERPRET=1 before importing triton)"
            )
        if q.dtype == torch.bfloat16:
            # Triton's interpreter computes bf16 tl.dot wrongly without any error (relative error ~1e9 seen
            # with triton 3.9): refuse rather than return wrong numbers.
            raise KernelUnsupported(
                f"{name}: bf16 under the Triton interpreter (its bf16 tl.dot is wrong); use CUDA"
            )
    else:
        raise KernelUnsupported(
            f"{name}: device {q.device.type} unsupported (cuda, or cpu under the interpreter)"
        )
    B, H, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if tuple(k.shape) != tuple(v.shape):
        raise KernelUnsupported(f"{name}: k and v shapes differ ({tuple(k.shape)} vs {tuple(v.shape)})")
    if Bk != B:
        raise KernelUnsupported(f"{name}: batch differs between q ({B}) and k/v ({Bk})")
    if Dk != D:
        raise KernelUnsupported(f"{name}: head_dim differs between q ({D}) and k/v ({Dk})")
    if D not in SUPPORTED_HEAD_DIMS:
        raise KernelUnsupported(f"{name}: head_dim {D} unsupported (supported: {SUPPORTED_HEAD_DIMS})")
    if min(B, H, Hkv, Nq, Nk) < 1:
        raise KernelUnsupported(f"{name}: empty tensor (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if H % Hkv != 0:
        raise KernelUnsupported(f"{name}: kv_heads {Hkv} does not divide heads {H} (grouped-query attention)")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    try:
        sm_scale = float(sm_scale)
    except (TypeError, ValueError):
        raise KernelUnsupported(f"{name}: sm_scale must be a number, got {sm_scale!r}") from None
    if not math.isfinite(sm_scale):
        raise KernelUnsupported(f"{name}: sm_scale must be finite, got {sm_scale}")
    if sm_scale < 0:
        # The kernels take the row max before scaling (one FMA per score), which needs scale >= 0:
        # (q k) * s == ((-q) k) * (-s), and autograd carries the negation into dq.
        q, sm_scale = -q, -sm_scale
    return unit_stride(q), unit_stride(k), unit_stride(v), sm_scale


def use_tma(*tensors: torch.Tensor) -> bool:
    """Whether the kernels may stream these tensors through tensor descriptors (TMA on sm90+).

    Yes when FLASHBENCH_TMA is not 0, the GPU is Hopper or newer (or Triton's interpreter runs, which
    emulates descriptors, so the CPU tests cover this path), every sequence length is at least 16, and every
    base address and every stride but the last is a multiple of 16 bytes (TMA's alignment rule; a view sliced
    at an odd offset takes the pointer path).
    """
    if os.environ.get("FLASHBENCH_TMA", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    first = tensors[0]
    for t in tensors:
        if t.shape[-2] < 16:
            # Triton turns an int argument equal to 1 into a constant; a descriptor over a length-1 sequence made
            # ptxas crash (SIGSEGV, triton 3.6, H200). Short sequences gain nothing from TMA: pointer path.
            return False
    interpret = interpreting()
    if not interpret and (first.device.type != "cuda" or _capability_major(first.device.index) < 9):
        return False
    for t in tensors:
        if t.data_ptr() % 16:
            return False
        elem = t.element_size()
        for s in t.stride()[:-1]:
            if s * elem % 16:
                return False
    return True


# Host descriptor argument names -> (the block dimension that sizes their tiles' rows, its divisor): KD2 / VD2
# are the FA2 forward's half-width diagonal blocks.
_DESCRIPTOR_ROWS = {
    "QD": ("BLOCK_M", 1),
    "OD": ("BLOCK_M", 1),
    "DOD": ("BLOCK_M", 1),
    "KD": ("BLOCK_N", 1),
    "VD": ("BLOCK_N", 1),
    "KD2": ("BLOCK_N", 2),
    "VD2": ("BLOCK_N", 2),
}


# (shape, strides, dtype) -> the attributes of a descriptor of that layout, made and validated once; its base is
# replaced per call (host_descriptor).
_DESCRIPTOR_LAYOUTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def host_descriptor(t: torch.Tensor) -> TensorDescriptor:
    """A 4-D [B, H, N, D] tensor descriptor of `t` (checked by `use_tma`). Its block is [1, 1, rows, D], rows
    set per config by `size_descriptors`; loads past N are zero-filled within each head, stores are clipped.

    Per call this copies a descriptor made (and validated by Triton) once per shape, strides and dtype, with `t`
    as its base: Triton's checks hold for every tensor of that layout, or `use_tma` has made them (alignment).
    About 2 us on the CPU machine against 3-4 us for a new TensorDescriptor (timeit).
    """
    key = (tuple(t.shape), t.stride(), t.dtype)
    layout = _DESCRIPTOR_LAYOUTS.get(key)
    if layout is None:
        if len(_DESCRIPTOR_LAYOUTS) >= 256:  # a sweep has tens of layouts; a long-lived caller may have more
            _DESCRIPTOR_LAYOUTS.pop(next(iter(_DESCRIPTOR_LAYOUTS)))
        layout = dict(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, t.shape[-1]]).__dict__)
        del layout["base"]  # kept per layout, not per tensor: the cache holds no tensor alive
        _DESCRIPTOR_LAYOUTS[key] = layout
    return _descriptor_from(layout, base=t, block_shape=[1, 1, 16, t.shape[-1]])


def twin_descriptor(d: TensorDescriptor) -> TensorDescriptor:
    """A second host descriptor of d's tensor, with a block shape of its own (set by `size_descriptors`): a
    shallow copy, cheaper than `host_descriptor` again (no layout lookup)."""
    return _descriptor_from(d.__dict__)


def _descriptor_from(attrs: dict[str, Any], **changes: Any) -> TensorDescriptor:
    """A TensorDescriptor with these attributes, not validated again (its __init__ is not run)."""
    d = object.__new__(TensorDescriptor)
    d.__dict__.update(attrs, **changes)
    return d


def size_descriptors(
    kernel: Any, args: Sequence[Any], constexprs: dict[str, Any], meta: dict[str, Any]
) -> None:
    """Give a launch's host descriptors (positional arguments named in _DESCRIPTOR_ROWS) the tile of the config
    about to run; `_run_config` calls it before every launch, the autotuner's included."""
    for i, rows, div in _descriptor_args(kernel):
        if i < len(args) and isinstance(args[i], TensorDescriptor):
            args[i].block_shape = [1, 1, meta[rows] // div, constexprs["HEAD_DIM"]]


@functools.cache
def _descriptor_args(kernel: Any) -> tuple[tuple[int, str, int], ...]:
    """(position, rows key, divisor) of each of `kernel`'s parameters named in _DESCRIPTOR_ROWS."""
    return tuple((i, *_DESCRIPTOR_ROWS[n]) for i, n in enumerate(kernel.arg_names) if n in _DESCRIPTOR_ROWS)


@functools.cache
def _capability_major(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its last dimension is unit-stride (any other strides are fine), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def attend(
    function: type[torch.autograd.Function],
    forward: Callable[..., tuple[Any, ...]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None,
    *extra: Any,
) -> torch.Tensor:
    """The attention output of checked inputs: through the autograd Function `function` (`function.apply(q, k, v,
    causal, sm_scale, config, *extra)`) when a gradient may be asked for, else the forward launcher alone
    (`forward(q, k, v, causal, sm_scale, config)[0]`): with nothing to differentiate the autograd node is only
    host time, on every eager call (benchmarks/host_path.py)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return function.apply(q, k, v, causal, sm_scale, config, *extra)
    return forward(q, k, v, causal, sm_scale, config)[0]


# ----------------------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------------------

# One config under the interpreter: big enough blocks to keep the interpreter's per-block Python overhead
# low, small enough that N = 127 and 1000 still cross several blocks (online rescaling, causal diagonal).
INTERPRET_FWD = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
INTERPRET_BWD = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}

# GPU forward space (BLOCK_M, BLOCK_N, num_warps, num_stages[, maxnreg]), pruned per head dim / dtype by `_fits`.
# Order matters: without autotuning (FLASHBENCH_AUTOTUNE=0) the first config that fits is used.
# The first five won at least one of issue 7's shapes on an H100 (benchmarks/kernel_configs.py, BENCHMARKS.md);
# the smaller tiles are there for D = 256 and for GPUs with less shared memory.
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
# A register cap (a fifth entry, maxnreg) fits two 8-warp programs on an SM: measured on an H100, it lifts
# (128, 64, 8, 2) at d=128 by 4-24% and (128, 128, 8, 2) at d=64 by 24-50%, but never past the best
# uncapped tile, and (64, 128, 4, 2) capped at d=128 spills (8x slower); so the space has none
# (BENCHMARKS.md). config={"maxnreg": 128, ...} forces one.
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
# GPU backward spaces. dK/dV: BLOCK_N keys resident, BLOCK_M query rows streamed; dQ: the reverse.
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


def _max_shared_mem() -> int:
    """The current GPU's opt-in shared memory per block, in bytes (called only on the CUDA path)."""
    return _shared_mem_of(torch.cuda.current_device())


@functools.cache
def _shared_mem_of(device: int) -> int:
    return int(triton.runtime.driver.active.utils.get_device_properties(device)["max_shared_mem"])


def estimate(kind: str, bm: int, bn: int, warps: int, stages: int, d: int, elem: int) -> tuple[int, float]:
    """(shared-memory bytes, fp32 accumulator registers per thread) a config needs; a rough upper estimate.

    fwd:  Q tile resident, K and V tiles pipelined over `stages`; acc [BM, D] and S [BM, BN] in registers.
    dkdv: K, V resident, Q and dO pipelined, P^T / dS^T tiles; dK and dV accumulators [BN, D].
    dq:   Q, dO resident, K and V pipelined, P / dS tiles; dQ accumulator [BM, D].
    """
    threads = 32 * warps
    if kind == "fwd":
        smem = elem * (bm * d + max(stages, 1) * 2 * bn * d)  # P stays in registers (dot operand A)
        regs = (bm * d + bm * bn) / threads
    elif kind == "dkdv":
        smem = elem * (2 * bn * d + max(stages, 1) * 2 * bm * d + 2 * bn * bm)
        regs = (2 * bn * d + 2 * bn * bm) / threads
    else:
        smem = elem * (2 * bm * d + max(stages, 1) * 2 * bn * d + 2 * bm * bn)
        regs = (bm * d + 2 * bm * bn) / threads
    return smem, regs


def _config_dict(c: Sequence[int]) -> dict[str, int]:
    """A space entry (BLOCK_M, BLOCK_N, num_warps, num_stages[, maxnreg]) as a config dict."""
    out = dict(zip(CONFIG_KEYS, c[:4], strict=True))
    return {**out, "maxnreg": c[4]} if len(c) > 4 else out


# fp32 accumulator registers per thread (estimate) a config may need, of the 255 a thread can have. 160 keeps
# the backward's tiles from spilling. The 16-bit forward's (128, 64, 4, 2) at d = 128 needs 192 and is the
# fastest d = 128 forward on an H100 (ptxas: 255 registers, 20-26 bytes spilled; two 4-warp programs per SM);
# the old limit of 160 kept it out of the autotuner's reach (benchmarks/h100-2026-11-22-s4/configs8_wg.json,
# BENCHMARKS.md). fp32 inputs (FMA dots, no tensor cores) keep 160.
def register_budget(kind: str, elem: int) -> int:
    return 192 if kind == "fwd" and elem <= 2 else 160


def _fits(kind: str, bm: int, bn: int, warps: int, stages: int, d: int, elem: int, smem_limit: int) -> bool:
    smem, regs = estimate(kind, bm, bn, warps, stages, d, elem)
    return smem <= smem_limit and regs <= register_budget(kind, elem)


def _candidates(
    kind: str, space: Sequence[tuple[int, ...]], d: int, elem: int, smem_limit: int
) -> list[dict[str, int]]:
    """The configs of `space` the autotuner tries: those whose estimate fits; if none does, the smallest tile
    (the compiler decides)."""
    kept = [_config_dict(c) for c in space if _fits(kind, *c[:4], d, elem, smem_limit)]
    return kept or [_config_dict(min(space, key=lambda c: (c[0] * c[1], c[3])))]


def default_config(
    kind: str, space: Sequence[tuple[int, ...]], d: int, elem: int, smem_limit: int = 232448
) -> dict[str, Any]:
    """The first config of `space` (listed in order of preference) that fits; the smallest if none does.

    The default shared-memory limit is an H100's opt-in 227 KiB per block.
    """
    return _candidates(kind, space, d, elem, smem_limit)[0]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a host grid: triton.cdiv is a constexpr function, whose argument unwrapping costs a few us
    per call on the host."""
    return -(-a // b)


def seq_bucket(n: int) -> int:
    """Autotune key for a sequence length: the next power of two (at least 64)."""
    return max(64, 1 << (max(n, 1) - 1).bit_length())


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


# ----------------------------------------------------------------------------------------------------------
# Launching
# ----------------------------------------------------------------------------------------------------------

# A config that does not fit the GPU fails to compile with one of these.
_UNFIT: tuple[type[BaseException], ...] = tuple(
    e for e in (OutOfResources, getattr(triton_errors, "PTXASError", None)) if isinstance(e, type)
)


def launch(
    name: str,
    kind: str,
    kernel: Any,
    grid: Callable[[dict[str, Any]], tuple[int, ...]],
    args: Sequence[Any],
    constexprs: dict[str, Any],
    *,
    space: Sequence[tuple[int, ...]],
    forced: dict[str, Any] | None = None,
    interpret_config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Launch `kernel` (a @triton.jit function) and return the config it ran with.

    `args` are positional (the autotune key `N_BUCKET` and the `Q` tensor must be among the kernel's
    positional parameters); `constexprs` are the non-tuned compile-time arguments; `extra` are tuned-space
    constants that are not block sizes (e.g. Q_SPLIT). `name` keys the autotune cache (one per kernel);
    `kind` selects the prune estimate ("fwd", "dkdv", "dq"). Before every launch, host tensor descriptors among
    `args` take the block shape of the config about to run (`size_descriptors`).
    Autotuning: kernels/autotune.py (candidates timed as sweep cases in rotation, the pick cached on disk).
    """
    extra = dict(extra or {})
    candidates: list[dict[str, Any]] = []  # configs to try in order; the first that compiles runs
    user_forced = forced is not None
    if forced is not None:
        if not interpreting():
            # Refuse a config far past the shared-memory limit before compiling it: ptxas can take minutes
            # on such a config (seen on an H200 with 256x256 fp32 tiles) only to report out-of-resources.
            d, elem, limit = constexprs["HEAD_DIM"], args[0].element_size(), _max_shared_mem()
            smem, _ = estimate(kind, forced["BLOCK_M"], forced["BLOCK_N"], 1, forced["num_stages"], d, elem)
            if smem > 2 * limit:
                raise KernelUnsupported(
                    f"config {forced} does not fit this GPU: needs about {smem // 1024} KB of shared memory "
                    f"(estimate), the limit is {limit // 1024} KB"
                )
        candidates = [forced]
    elif interpreting():
        candidates = [{**(interpret_config or INTERPRET_FWD), **extra}]
    elif not autotune_enabled():
        # The preferred config first, then the rest of the space: the shared-memory estimate is rough
        # (seen on an H200: FA1-order at D = 256 needed 295 KB where the estimate allowed 227 KB).
        first = default_config(kind, space, constexprs["HEAD_DIM"], args[0].element_size(), _max_shared_mem())
        rest = [_config_dict(c) for c in sorted(space, key=lambda c: -c[0] * c[1] * c[3])]
        candidates = [{**c, **extra} for c in [first, *[c for c in rest if c != first]]]
    for config in candidates:
        try:
            _run_config(kernel, grid, args, constexprs, config)
        except _UNFIT as exc:
            if user_forced or config is candidates[-1]:
                raise KernelUnsupported(f"config {config} does not fit this GPU: {exc}") from None
            continue
        return dict(config)
    # The key: what selects a compiled kernel and its best tile (Q's dtype fixes the other tensors' dtypes).
    first = args[0]
    key = (
        name,
        args[_arg_index(kernel, "N_BUCKET")],
        tuple(constexprs.items()),
        first.dtype,
        first.device.index,
    )
    config = autotune.lookup(key)
    if config is None:  # first call of this key in this process: the disk cache, else tune (not per call)
        d, elem = constexprs["HEAD_DIM"], first.element_size()
        pool = [{**c, **extra} for c in _candidates(kind, space, d, elem, _max_shared_mem())]
        device = _device_name(first.device.index or 0)
        identity = (
            name,
            kind,
            _source_key(kernel),
            triton.__version__,
            device,
            json.dumps(pool, sort_keys=True),
        )
        try:
            config = autotune.tune(
                key,
                pool,
                lambda c: _run_config(kernel, grid, args, constexprs, c),
                unfit=_UNFIT,
                path=autotune.cache_file(name, identity),
            )
        except _UNFIT as exc:  # every candidate failed to compile on this GPU
            raise KernelUnsupported(f"no config of {name} fits this GPU for head_dim {d}: {exc}") from None
    _run_config(kernel, grid, args, constexprs, config)
    return config


@functools.cache
def _arg_index(kernel: Any, arg: str) -> int:
    return list(kernel.arg_names).index(arg)


def _run_config(
    kernel: Any,
    grid: Callable[[dict[str, Any]], tuple[int, ...]],
    args: Sequence[Any],
    constexprs: dict[str, Any],
    config: dict[str, Any],
) -> None:
    """Launch `kernel` once with `config` (block sizes and flags as kernel arguments, the rest as options)."""
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    size_descriptors(kernel, args, constexprs, meta)
    kernel[grid(meta)](*args, **constexprs, **meta, **options)


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _source_key(kernel: Any) -> str:
    """Triton's hash of a @triton.jit function's source and the jit functions it calls (under the interpreter,
    a hash of the function's own source)."""
    key = getattr(kernel, "cache_key", None)
    if key is None:
        key = hashlib.sha256(inspect.getsource(getattr(kernel, "fn", kernel)).encode()).hexdigest()
    return str(key)


# ----------------------------------------------------------------------------------------------------------
# Shared jit helpers
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def dot(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b. IEEE: fp32 inputs multiply in true fp32 (tl.dot's default on CUDA would be TF32)."""
    if IEEE:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out

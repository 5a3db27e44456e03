"""Shared pieces of the bundled attention kernels: constants, the input checks, small helpers.

The kernel files (flash_v2.py, stored_p.py, flash_v1.py, backward.py) call `check_inputs` before any launch;
configs.py holds the config spaces, descriptors.py the TMA descriptors, launch.py the launch and the autograd
glue.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import triton
import triton.language as tl

SUPPORTED_HEAD_DIMS: tuple[int, ...] = (32, 64, 128, 256)
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
# exp(x) == exp2(x * log2(e)): the kernels fold log2(e) into the softmax scale and use exp2.
LOG2E = 1.4426950408889634


class KernelUnsupported(ValueError):
    """A bundled kernel refuses these inputs; the message names what is unsupported."""


# The forward config used by the most recent forward launch (any of the three kernels), and the backward's
# configs ({"dkdv": ..., "dq": ...}) of the backward that followed it (empty until one does).
_LAST_CONFIG: dict[str, Any] | None = None
_LAST_BWD_CONFIG: dict[str, Any] = {}


def last_config() -> dict[str, Any] | None:
    """The forward config (BLOCK_M, BLOCK_N, num_warps, num_stages, ...) of the most recent forward launch.

    The dict can be passed back as `config=` to force the same config.
    """
    return None if _LAST_CONFIG is None else dict(_LAST_CONFIG)


def _set_last_config(cfg: dict[str, Any]) -> None:
    """Keep `cfg` (a plan's own config, never changed after the plan's first launch) for last_config(), which
    copies it: the setters run on every call, the getters rarely."""
    global _LAST_CONFIG
    _LAST_CONFIG = cfg
    if _LAST_BWD_CONFIG:
        _LAST_BWD_CONFIG.clear()  # a new forward: no backward of it yet


def last_bwd_config() -> dict[str, Any]:
    """{"dkdv": config, "dq": config} of the backward after the most recent forward launch (empty before one)."""
    return {k: dict(v) for k, v in _LAST_BWD_CONFIG.items()}


def _set_last_bwd_config(dkdv: dict[str, Any], dq: dict[str, Any]) -> None:
    """Keep the passes' configs (the plans' own, as _set_last_config) for last_bwd_config(), which copies them."""
    _LAST_BWD_CONFIG["dkdv"] = dkdv
    _LAST_BWD_CONFIG["dq"] = dq


def interpreting() -> bool:
    """True when Triton's interpreter is on (read from the environment at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def check_inputs(
    name: str,
    q: Any,
    k: Any,
    v: Any,
    causal: Any,
    sm_scale: Any,
    dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES,
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
    if q.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise KernelUnsupported(f"{name}: dtype {q.dtype} unsupported ({names} are)")
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


def check_window(name: str, window: Any, causal: bool) -> tuple[int, int] | None:
    """A sliding window (left, right) in flash-attn's `window_size` convention, checked: query i sits at key
    position p = i + Nk - Nq and sees keys j with p - left <= j <= p + right; -1 = no limit on that side.

    Returns the window the kernels take, None when it masks nothing beyond `causal` ((-1, -1), or causal with
    (-1, -1) or (-1, 0)). causal=True means right = 0: it accepts right -1 or 0 and refuses a larger right
    (the two would contradict). Raises KernelUnsupported naming what is wrong.
    """
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise KernelUnsupported(f"{name}: window must be a pair (left, right), got {window!r}") from None
    for side, size in (("left", left), ("right", right)):
        if isinstance(size, bool) or not isinstance(size, int) or size < -1:
            raise KernelUnsupported(
                f"{name}: window {side} must be an int >= -1 (-1: no limit), got {size!r}"
            )
    if causal:
        if right > 0:
            raise KernelUnsupported(
                f"{name}: causal=True means window right = 0; got window {tuple(window)} (use -1 or 0)"
            )
        right = 0
    if left == -1 and right == -1 or causal and left == -1:
        return None
    return left, right


def window_flags(causal: bool, window: tuple[int, int] | None) -> tuple[bool, bool, int, int]:
    """The kernels' mask arguments for a checked window: (CAUSAL: a right limit, WINDOW: a left limit,
    WIN_LEFT, WIN_RIGHT). A causal mask is a right limit of 0."""
    left, right = window if window is not None else (-1, 0 if causal else -1)
    return right >= 0, left >= 0, max(left, 0), max(right, 0)


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its last dimension is unit-stride (any other strides are fine), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def row_strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The batch, head and row strides of each [B, H, N, D] tensor, in order: the kernels take every last
    dimension as unit-stride (`check_inputs` and `unit_stride` make it so, outputs are allocated so)."""
    return tuple(s for t in tensors for s in t.stride()[:3])


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a host grid: triton.cdiv is a constexpr function, whose argument unwrapping costs a few us
    per call on the host."""
    return -(-a // b)


def seq_bucket(n: int) -> int:
    """Autotune key for a sequence length: the next power of two (at least 64)."""
    return max(64, 1 << (max(n, 1) - 1).bit_length())


@triton.jit
def dot(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b. IEEE: fp32 inputs multiply in true fp32 (tl.dot's default on CUDA would be TF32)."""
    if IEEE:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


# The compile-time arguments of a launch of flash_v2._attn_fwd, backward_dkdv._bwd_dkdv or backward_dq._bwd_dq
# on a [B, H, N, D] batch; flash_attn_varlen (varlen.py) passes the documents instead.
NOT_VARLEN: dict[str, Any] = {"CU_Q": None, "CU_K": None, "NUM_DOCS": None, "VARLEN": False}


def document_walk(total: int, docs: int, block: int) -> int:
    """Programs (per head) of document_block's walk: they cover every block of `docs` documents of `total` rows
    and the rows past them, sum over documents of cdiv(length, block) <= (total + (docs + 1) (block - 1)) //
    block; the walk positions past the last block get length 0."""
    return max(1, (total + (docs + 1) * (block - 1)) // block)


@triton.jit
def document_block(
    CU,  # int32 [NUM_DOCS + 1]: prefix sums of the documents' lengths on the walked side (queries or keys)
    CU_OTHER,  # the same on the other side
    NUM_DOCS,
    TOTAL,  # rows of the walked side's packed tensor
    TOTAL_OTHER,  # rows of the other side's
    pid,  # the program's place in the walk
    BLOCK: tl.constexpr,  # rows per block on the walked side
    REVERSE: tl.constexpr,  # walk each document's blocks from its last
    CHUNK: tl.constexpr = 64,  # documents read per step
):
    """The block of a packed batch that program `pid` owns (called positionally, in this order, by the VARLEN
    kernels: flash_v2._attn_fwd, backward_dq._bwd_dq walk the queries, backward_dkdv._bwd_dkdv the keys), as (block index within its document, the document's
    first row and length on the walked side, its first row and length on the other side).

    The walk visits each document's cdiv(length, BLOCK) blocks in document order, so no program holds rows of
    two documents and no block is empty; the document is found on the device by a prefix sum of the block
    counts, CHUNK documents at a time (the scheme of flash-attn 3's varlen tile scheduler), so a launch needs
    no host sync. Rows past CU[NUM_DOCS] form one more document, empty on the other side: their outputs and
    gradients are written (zeros). A pid past the last block gets length 0 (its program stores nothing).
    Offsets are clamped into [0, TOTAL]: bad prefix sums give wrong numbers, never an access past a tensor.
    """
    base = tl.zeros([], dtype=tl.int32)  # blocks of the documents before this chunk
    doc = tl.zeros([], dtype=tl.int32)
    row0 = tl.zeros([], dtype=tl.int32)
    length = tl.zeros([], dtype=tl.int32)
    block = tl.zeros([], dtype=tl.int32)
    for c in range(0, NUM_DOCS + 1, CHUNK):
        idx = c + tl.arange(0, CHUNK)
        start = tl.load(CU + idx, mask=idx <= NUM_DOCS, other=0)
        end = tl.load(CU + idx + 1, mask=idx < NUM_DOCS, other=TOTAL)  # the last document ends at TOTAL
        start = tl.minimum(tl.maximum(start, 0), TOTAL)
        size = tl.maximum(tl.minimum(tl.maximum(end, 0), TOTAL) - start, 0)
        blocks = tl.where(idx <= NUM_DOCS, (size + BLOCK - 1) // BLOCK, 0)
        first = base + tl.cumsum(blocks, 0) - blocks  # the walk's index of each document's first block
        hit = (first <= pid) & (pid < first + blocks)  # at most one document holds pid
        doc += tl.sum(tl.where(hit, idx, 0), 0)
        row0 += tl.sum(tl.where(hit, start, 0), 0)
        length += tl.sum(tl.where(hit, size, 0), 0)
        if REVERSE:
            block += tl.sum(tl.where(hit, first + blocks - 1 - pid, 0), 0)
        else:
            block += tl.sum(tl.where(hit, pid - first, 0), 0)
        base += tl.sum(blocks, 0)
    other0 = tl.minimum(tl.maximum(tl.load(CU_OTHER + doc), 0), TOTAL_OTHER)
    other_end = tl.minimum(tl.maximum(tl.load(CU_OTHER + tl.minimum(doc + 1, NUM_DOCS)), 0), TOTAL_OTHER)
    other_len = tl.where((doc < NUM_DOCS) & (length > 0), tl.maximum(other_end - other0, 0), 0)
    return block, row0, length, other0, other_len

"""Flash-Decoding: attention of a few new query tokens against a KV cache, split over the keys.

Origin: Flash-Decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference", 2023), as in
flash-attn's split-KV forward (flash_fwd_splitkv_kernel, then a combine kernel; num_splits_heuristic) and
FlashInfer's decode kernels (the query heads of one KV head served by one pass over its K/V; pages through a
page table). Written here for Triton's block language.

    q                 [B, Hq, Nq, D]       the last Nq tokens of each sequence (Hq a multiple of Hkv)
    contiguous cache  k, v [B, Hkv, Nmax, D], cache_seqlens [B] int32 (default: all Nmax)
    paged cache       k, v [pages, Hkv, PAGE, D] (a pool), block_table [B, max_pages] int32: page p of
                      sequence b holds its tokens [p * PAGE, (p + 1) * PAGE)

Loop order (two passes):
  1. _decode_split: one program per (key split s, query-row block, sequence b x KV head h). Its Q tile holds
     the G * Nq query rows of that KV head (G = Hq / Hkv; row r = g * Nq + i is query head h * G + g, query
     i), padded to a power of two >= 16 rows for tl.dot, so K/V are read once per KV head. It walks its share
     of the sequence's keys in BLOCK_N blocks with the online softmax (exp2, log2(e) folded into the scale),
     and writes its normalised partial output (fp32) and log2-sum-exp per row; with one split it writes the
     output directly and pass 2 is skipped.
  2. _decode_combine: one program per (query row, sequence x KV head): reads the splits' log2-sum-exps,
     weights the partial outputs by exp2(lse_s - max) and writes their normalised sum.

Splits: each sequence cuts its own length L_b into `num_splits` runs of whole key blocks, so a short sequence
of a ragged batch gets short runs; a run past its end writes lse = -inf and weighs nothing in the combine.
`num_splits` is chosen on the host from the cache capacity (Nmax, or max_pages * PAGE), never from
cache_seqlens, which would need a device sync (`choose_num_splits`).

Cautions:
  - validate=True (the default) reads cache_seqlens and block_table on the host, one device sync, to check that
    every length fits the cache and every page a sequence uses lies in the pool; table entries past a
    sequence's length are never read and may hold anything (-1, say). In a timed loop check once, then pass
    validate=False: the kernel still clamps lengths to the capacity, but a page id outside the pool then reads
    out of bounds.
  - Causal masks are aligned bottom-right: query i sees key j iff j <= L_b - Nq + i. A row that sees no key
    (Nq > L_b) writes 0, never NaN (its l stays 0; m starts at a finite -1e30, so no exp2(-inf + inf)).
  - P is cast to the input dtype before P @ V (as flash-attn does); acc, m, l, the partials stay fp32; fp32
    inputs use IEEE dots (no TF32).
  - Sequence, page and head bases are int64: a cache of B * Hkv * Nmax * D elements can pass 2^31.
  - Keys are gathered row by row through the page table (one int32 per key, from L1/L2), so any page size
    works with any BLOCK_N; rows are D contiguous elements, loaded as 16-byte vectors.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl

from .common import LOG2E, KernelUnsupported, cdiv, interpreting

DECODE_HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128, 256)
DECODE_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
# The split kernel's tile per head dim on CUDA: BLOCK_N keys per step, num_warps, num_stages.
GPU_CONFIGS: dict[int, dict[str, int]] = {
    16: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    32: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    64: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    128: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    256: {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3},
}
# Under the interpreter: small key blocks, so small test shapes cross many blocks and split boundaries.
INTERPRET_CONFIG: dict[str, int] = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
MAX_ROWS = 64  # query rows per tile (G * Nq beyond this takes more row blocks, each reading K/V again)
MAX_SPLITS = 128
# The split heuristic: aim for PROGRAMS_PER_SM programs per SM, each with at least MIN_SPLIT_KEYS keys.
PROGRAMS_PER_SM = 2
MIN_SPLIT_KEYS = 256
INTERPRET_SMS = 8  # the SM count assumed under the interpreter
COMBINE_CHUNK = 32  # splits the combine reads per step


@triton.jit
def _decode_split(
    Q,  # [B, Hq, Nq, D] queries
    K,  # contiguous [B, Hkv, Nmax, D], or paged [pages, Hkv, PAGE, D]
    V,  # same layout as K
    Seqlens,  # [B] int32 keys per sequence (read when HAS_SEQLENS)
    Table,  # [B, max_pages] int32 page table (read when PAGED)
    Out,  # [B, Hq, Nq, D] output, written when DIRECT (one split)
    OPart,  # [B, Hkv, splits, ROWS, D] fp32 normalised partial outputs, written when not DIRECT
    LsePart,  # [B, Hkv, splits, ROWS] fp32 partial log2-sum-exps (-inf: the split saw no key)
    qk_scale,  # sm_scale * log2(e)
    capacity,  # keys the cache holds per sequence: Nmax, or max_pages * PAGE
    splits,  # key splits per sequence
    Hkv,  # KV heads
    Nq,  # queries per sequence
    ROWS,  # G * Nq query rows per KV head
    stride_qb,  # q strides: sequence, head, query (the last is 1)
    stride_qh,
    stride_qn,
    stride_kb,  # K strides: sequence (contiguous) or page (paged), head, token
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_tb,  # page-table row stride
    stride_ob,  # output strides: sequence, head, query
    stride_oh,
    stride_on,
    GROUP: tl.constexpr,  # G = Hq / Hkv query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per tile, a power of two >= 16
    BLOCK_N: tl.constexpr,  # keys per step
    PAGE: tl.constexpr,  # tokens per page (PAGED)
    PAGED: tl.constexpr,
    HAS_SEQLENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: normalise and write Out, no partials
    IEEE: tl.constexpr,  # fp32 inputs: IEEE dots, not TF32
):
    pid_s = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // Hkv
    h = pid_bh % Hkv
    L = capacity
    if HAS_SEQLENS:
        L = tl.minimum(tl.load(Seqlens + b), capacity)
    # This split's keys [lo, hi): whole blocks of this sequence's own length.
    per = tl.cdiv(tl.cdiv(L, BLOCK_N), splits) * BLOCK_N
    lo = pid_s * per
    hi = tl.minimum(lo + per, L)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = g * Nq + i
    row_ok = rows < ROWS
    g = rows // Nq
    i = rows % Nq
    offs_d = tl.arange(0, HEAD_DIM)
    head = (h * GROUP + g).to(tl.int64)  # query head of each row
    q_rows = Q + b.to(tl.int64) * stride_qb + head * stride_qh + i * stride_qn
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    # Last key each row sees within this split (bottom-right causal alignment).
    if CAUSAL:
        last = tl.minimum(L - Nq + i, hi - 1)
    else:
        last = tl.zeros([BLOCK_M], dtype=tl.int32) + (hi - 1)

    if PAGED:
        k_head = K + h.to(tl.int64) * stride_kh
        v_head = V + h.to(tl.int64) * stride_vh
        pages = Table + b.to(tl.int64) * stride_tb
    else:
        k_head = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        v_head = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        key_ok = offs_n < hi
        if PAGED:
            page = tl.load(pages + offs_n // PAGE, mask=key_ok, other=0).to(tl.int64)
            slot = offs_n % PAGE
            k_rows = k_head + page * stride_kb + slot * stride_kn
            v_rows = v_head + page * stride_vb + slot * stride_vn
        else:
            k_rows = k_head + offs_n * stride_kn
            v_rows = v_head + offs_n * stride_vn
        k = tl.load(k_rows[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_rows[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(offs_n[None, :] <= last[:, None], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    if DIRECT:
        o_rows = Out + b.to(tl.int64) * stride_ob + head * stride_oh + i * stride_on
        tl.store(o_rows[:, None] + offs_d[None, :], o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (pid_bh.to(tl.int64) * splits + pid_s) * ROWS + rows  # [B, Hkv, splits, ROWS] index
        tl.store(OPart + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(LsePart + part, lse, mask=row_ok)


@triton.jit
def _decode_combine(
    OPart,  # [B, Hkv, splits, ROWS, D] fp32 normalised partial outputs
    LsePart,  # [B, Hkv, splits, ROWS] fp32 partial log2-sum-exps
    Out,  # [B, Hq, Nq, D] output
    splits,
    Hkv,
    Nq,
    ROWS,  # G * Nq query rows per KV head
    stride_ob,  # output strides: sequence, head, query
    stride_oh,
    stride_on,
    GROUP: tl.constexpr,  # G = Hq / Hkv
    HEAD_DIM: tl.constexpr,
    SPLITS_POW2: tl.constexpr,  # splits rounded up to a power of two
    CHUNK: tl.constexpr,  # splits read per step
):
    row = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hkv
    h = pid_bh % Hkv
    first = pid_bh.to(tl.int64) * splits * ROWS + row  # (b, h, split 0, row)
    offs_s = tl.arange(0, SPLITS_POW2)
    lse = tl.load(LsePart + first + offs_s * ROWS, mask=offs_s < splits, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no split saw a key: all weights 0, output 0
    total = tl.sum(tl.exp2(lse - top), 0)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for c in range(0, splits, CHUNK):
        offs_c = c + tl.arange(0, CHUNK)
        w = tl.exp2(tl.load(LsePart + first + offs_c * ROWS, mask=offs_c < splits, other=float("-inf")) - top)
        idx = first + offs_c * ROWS
        o = tl.load(OPart + idx[:, None] * HEAD_DIM + offs_d[None, :], mask=(w > 0.0)[:, None], other=0.0)
        acc += tl.sum(w[:, None] * o, 0)
    out = acc / tl.where(total > 0.0, total, 1.0)
    head = (h * GROUP + row // Nq).to(tl.int64)
    o_row = Out + b.to(tl.int64) * stride_ob + head * stride_oh + (row % Nq) * stride_on
    tl.store(o_row + offs_d, out.to(Out.dtype.element_ty))


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def choose_num_splits(programs: int, capacity: int, num_sms: int) -> int:
    """Key splits per sequence when the caller gives none (flash-attn's idea, simplified).

    `programs`: split-kernel programs without splitting (sequences x KV heads x query-row blocks). Enough
    programs already fill the GPU: 1 split. Otherwise split until there are about PROGRAMS_PER_SM programs per
    SM (several resident programs keep enough loads in flight to stream HBM), but give each split at least
    MIN_SPLIT_KEYS keys of the capacity (a split's fixed cost: its Q load, partial write and combine read) and
    never more than MAX_SPLITS. The capacity, not cache_seqlens, sizes the splits: reading the lengths would
    sync the device.
    """
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    by_length = max(1, capacity // MIN_SPLIT_KEYS)
    return max(1, min(cdiv(target, programs), by_length, MAX_SPLITS))


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise KernelUnsupported(f"flash_decode: {message}")


def _check_tensors(q: Any, k: Any, v: Any, lens: Any, table: Any) -> torch.Tensor:
    """Shapes, dtypes, devices, layouts (no device data read). Returns q with a unit last stride."""
    for label, t in (("q", q), ("k_cache", k), ("v_cache", v)):
        _need(isinstance(t, torch.Tensor), f"{label} must be a torch.Tensor, got {type(t).__name__}")
        _need(t.dim() == 4, f"{label} must be 4-D, got shape {tuple(t.shape)}")
    for label, t in (("cache_seqlens", lens), ("block_table", table)):
        _need(t is None or isinstance(t, torch.Tensor), f"{label} must be a torch.Tensor or None")
        _need(t is None or t.dtype == torch.int32, f"{label} must be int32, got {getattr(t, 'dtype', '')}")
    _need(
        q.dtype == k.dtype == v.dtype, f"q, k_cache, v_cache dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})"
    )
    _need(q.dtype in DECODE_DTYPES, f"dtype {q.dtype} unsupported (fp16, bf16, fp32 are)")
    devices = sorted({str(t.device) for t in (q, k, v, lens, table) if t is not None})
    _need(len(devices) == 1, f"inputs are on different devices ({', '.join(devices)})")
    if q.device.type == "cuda":
        _need(not interpreting(), "CUDA tensors while TRITON_INTERPRET=1 (the interpreter runs on CPU)")
    else:
        _need(
            q.device.type == "cpu", f"device {q.device.type} unsupported (cuda, or cpu under the interpreter)"
        )
        _need(
            interpreting(),
            "device cpu needs Triton's interpreter (TRITON_INTERPRET=1 before importing triton)",
        )
        # The interpreter's bf16 tl.dot is silently wrong (relative error ~1e9 seen with triton 3.9).
        _need(q.dtype != torch.bfloat16, "bf16 under the Triton interpreter (its bf16 tl.dot is wrong)")
    B, Hq, Nq, D = q.shape
    _need(k.shape == v.shape, f"k_cache and v_cache shapes differ ({tuple(k.shape)} vs {tuple(v.shape)})")
    _need(k.shape[3] == D, f"head_dim differs between q ({D}) and the cache ({k.shape[3]})")
    _need(D in DECODE_HEAD_DIMS, f"head_dim {D} unsupported (supported: {DECODE_HEAD_DIMS})")
    _need(min(*q.shape, *k.shape) >= 1, f"empty input (q {tuple(q.shape)}, cache {tuple(k.shape)})")
    _need(Hq % k.shape[1] == 0, f"KV heads {k.shape[1]} do not divide query heads {Hq}")
    _need(k.stride(3) == 1 and v.stride(3) == 1, "k_cache and v_cache need a unit stride in head_dim")
    if lens is not None:
        _need(tuple(lens.shape) == (B,), f"cache_seqlens must be [batch={B}], got {tuple(lens.shape)}")
    if table is None:
        _need(k.shape[0] == B, f"batch differs between q ({B}) and the contiguous cache ({k.shape[0]})")
    else:
        _need(
            table.dim() == 2 and table.shape[0] == B,
            f"block_table must be [{B}, blocks], got {tuple(table.shape)}",
        )
        page = k.shape[2]
        _need(
            page >= 16 and page & (page - 1) == 0,
            f"page size {page} (k_cache.shape[2]) must be a power of two >= 16",
        )
    return q if q.stride(3) == 1 else q.contiguous()


def _check_data(
    lens: torch.Tensor | None, table: torch.Tensor | None, capacity: int, pool: int, page: int
) -> None:
    """Every length within the capacity, every page a sequence uses inside the pool: one device sync."""
    used = None
    if table is not None:  # table entries past a sequence's length are never read
        n = lens.clamp(0, capacity) if lens is not None else torch.full_like(table[:, 0], capacity)
        used = torch.arange(table.shape[1], device=table.device)[None, :] < (n[:, None] + page - 1) // page
    stats = [t for t in (lens, None if used is None else torch.where(used, table, 0)) if t is not None]
    if not stats:
        return
    values = torch.stack([x for t in stats for x in (t.min(), t.max())]).tolist()  # the sync
    if lens is not None:
        low, high, *values = values
        _need(low >= 0, f"cache_seqlens holds a negative length ({low})")
        _need(high <= capacity, f"cache_seqlens holds {high}, past the cache capacity {capacity}")
    if table is not None:
        low, high = values
        _need(
            low >= 0 and high < pool,
            f"block_table holds page {low if low < 0 else high}, outside the pool of {pool}",
        )


def flash_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    causal: bool = True,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    *,
    validate: bool = True,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """Attention of q [B, Hq, Nq, D] (the last Nq tokens of each sequence) over a KV cache; [B, Hq, Nq, D].

    k_cache, v_cache: [B, Hkv, Nmax, D], or with block_table [B, max_blocks] int32 a page pool
    [num_blocks, Hkv, block_size, D]. cache_seqlens: int32 [B] valid keys per sequence (default: the capacity).
    causal: query i sees keys j <= L_b - Nq + i (else all L_b keys). num_splits: key splits per sequence
    (None: `choose_num_splits`; 1: one pass, no combine). validate: check cache_seqlens and block_table
    against the cache on the host (one device sync; see the module docstring). config: force the split
    kernel's {"BLOCK_N", "num_warps", "num_stages"} (default: GPU_CONFIGS per head dim).
    Raises KernelUnsupported (a ValueError) naming what it refuses.
    """
    q, k, v = _check_tensors(q, k_cache, v_cache, cache_seqlens, block_table), k_cache, v_cache
    _need(isinstance(causal, bool), f"causal must be a bool, got {causal!r}")
    B, Hq, Nq, D = q.shape
    Hkv, paged = k.shape[1], block_table is not None
    page = k.shape[2] if paged else 1
    capacity = block_table.shape[1] * page if paged else k.shape[2]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    _need(
        isinstance(scale, int | float) and math.isfinite(scale),
        f"sm_scale must be a finite number, got {scale!r}",
    )
    if validate:
        _check_data(cache_seqlens, block_table, capacity, k.shape[0], page)
    cfg = dict(INTERPRET_CONFIG if interpreting() else GPU_CONFIGS[D])
    if config is not None:
        _need(
            isinstance(config, dict) and set(config) <= set(cfg), f"config keys must be among {sorted(cfg)}"
        )
        cfg.update(config)
        bn = cfg["BLOCK_N"]
        _need(bn in (16, 32, 64, 128, 256), f"config BLOCK_N={bn!r} must be a power of two in 16..256")
    rows = (Hq // Hkv) * Nq
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(rows)))
    row_blocks = cdiv(rows, block_m)
    if num_splits is None:
        sms = INTERPRET_SMS if interpreting() else _sm_count(q.device.index or 0)
        num_splits = choose_num_splits(B * Hkv * row_blocks, capacity, sms)
    ok = isinstance(num_splits, int) and not isinstance(num_splits, bool) and 1 <= num_splits <= MAX_SPLITS
    _need(ok, f"num_splits must be an int in 1..{MAX_SPLITS}, got {num_splits!r}")

    out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    direct = num_splits == 1
    if direct:  # no partials: Out stands in for the unused pointers
        o_part = lse_part = out
    else:
        o_part = torch.empty((B, Hkv, num_splits, rows, D), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((B, Hkv, num_splits, rows), dtype=torch.float32, device=q.device)
    seqlens = cache_seqlens if cache_seqlens is not None else out
    table = block_table if paged else out
    _decode_split[(num_splits, row_blocks, B * Hkv)](
        Q=q, K=k, V=v, Seqlens=seqlens, Table=table, Out=out, OPart=o_part, LsePart=lse_part,
        qk_scale=float(scale) * LOG2E, capacity=capacity, splits=num_splits, Hkv=Hkv, Nq=Nq, ROWS=rows,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qn=q.stride(2),
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_kn=k.stride(2),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vn=v.stride(2),
        stride_tb=block_table.stride(0) if paged else 0,
        stride_ob=out.stride(0), stride_oh=out.stride(1), stride_on=out.stride(2),
        GROUP=Hq // Hkv, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], PAGE=page, PAGED=paged,
        HAS_SEQLENS=cache_seqlens is not None, CAUSAL=causal, DIRECT=direct, IEEE=q.dtype == torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    if not direct:
        chunk = min(COMBINE_CHUNK, triton.next_power_of_2(num_splits))
        _decode_combine[(rows, B * Hkv)](
            OPart=o_part, LsePart=lse_part, Out=out, splits=num_splits, Hkv=Hkv, Nq=Nq, ROWS=rows,
            stride_ob=out.stride(0), stride_oh=out.stride(1), stride_on=out.stride(2),
            GROUP=Hq // Hkv, HEAD_DIM=D, SPLITS_POW2=triton.next_power_of_2(num_splits), CHUNK=chunk,
            num_warps=4 if chunk * D <= 4096 else 8,
        )  # fmt: skip
    return out

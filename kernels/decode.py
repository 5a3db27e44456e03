"""Flash-Decoding: attention of a few new query tokens against a KV cache, split over the keys.

Origin: Flash-Decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference", 2023), as in
flash-attn's split-KV forward (flash_fwd_splitkv_kernel, then a combine kernel; num_splits_heuristic) and
FlashInfer's decode kernels (the query heads of one KV head served by one pass over its K/V; pages through a
page table). Written here for Triton's block language.

    q                 [B, Hq, Nq, D]       the last Nq tokens of each sequence (Hq a multiple of Hkv)
    contiguous cache  k, v [B, Hkv, Nmax, D], cache_seqlens [B] int32 (default: all Nmax)
    paged cache       k, v [pages, Hkv, PAGE, D] (a pool), block_table [B, max_pages] int32: page p of
                      sequence b holds its tokens [p * PAGE, (p + 1) * PAGE)

Loop order: one kernel, _decode, one program per (key split s, query-row block, sequence b x KV head h). Its Q
tile holds the G * Nq query rows of that KV head (G = Hq / Hkv; row r = g * Nq + i is query head h * G + g,
query i), padded to a power of two >= 16 rows for tl.dot, so K/V are read once per KV head. It walks its
share of the sequence's keys in BLOCK_N blocks with the online softmax (exp2, log2(e) folded into the scale).
With one split it writes the output. Otherwise it writes its normalised partial output (fp32) and
log2-sum-exp per row, and bumps its group's counter; the program that bumps it last combines the group's
partials (weights exp2(lse_s - max)) into the output and zeroes the counter (_combine; flash-attn runs a second
kernel for this, but a launch costs host time that short decodes pay in full).

FP8 cache: k_cache and v_cache in torch.float8_e4m3fn under q in fp16 or bf16 (vLLM's and FlashInfer's
"fp8_e4m3" KV cache), with float32 k_scale and v_scale broadcastable to [B, Hkv] (None: 1; per tensor, per
sequence, per KV head or per (sequence, KV head)): a stored value times its scale is the real value. Each
K/V tile is loaded as e4m3 (half the bytes) and converted to fp16, exactly (e4m3's 3 mantissa bits and exponent
range fit in fp16's), and both dots run in fp16 whatever q's dtype, accumulating in fp32: q enters as fp16 at a
power-of-two scale per row (_to_f16_rows: exact for fp16 q, and for bf16 q down to 2^-30 of the row's largest
|q|; no bf16 value overflows), undone on S with the softmax scale, and P is rounded to fp16 times 2^15
(P_SHIFT: 3 more bits than bf16's, normal down to 2^-29 of the row max). fp16, because e4m3 -> fp16 is one
instruction per two values where bf16 needs two more steps. V is converted where its tile is read from shared
memory and staged as fp16 for the transposing ldmatrix (_e4m3_to_f16); the row sums are kept per key slot and
summed once after the loop. At d = 128 with 16 query rows a tile each warp streams its own keys of every block
(STREAMS, fp8_streams: no reduction across warps in the loop; the streams merge after it); elsewhere the warps
share each block's keys (one reduction across them per block, the max, not two). The scales are constant
over a program's (sequence, KV head), so they leave the loop: S = q (k8 ks)^T = (q k8^T) ks, and k_scale joins
the softmax scale once per program; O = P (v8 vs) = (P v8) vs, and v_scale multiplies the normalised output (or
each split's partial: the combine is linear in them). The e4m3 path is a constexpr (KV_FP8), so the
fp16/bf16/fp32 caches' code is unchanged.

Cautions:
  - validate=True (the default) reads cache_seqlens and block_table on the host, one device sync, to check that
    every length fits the cache and every page a sequence uses lies in the pool (and an e4m3 cache's scales,
    that each is finite and > 0); table entries past a
    sequence's length are never read and may hold anything (-1, say). In a timed loop check once, then pass
    validate=False: the kernel still clamps lengths to the capacity, but a page id outside the pool then reads
    out of bounds.
  - Causal masks are aligned bottom-right: query i sees key j iff j <= L_b - Nq + i. A row that sees no key
    (Nq > L_b) writes 0, never NaN (its l stays 0; m starts at a finite -1e30, so no exp2(-inf + inf)).
  - P is cast to the input dtype (fp16 over an e4m3 cache) before P @ V; acc, m, l, the partials stay fp32; fp32
    uses IEEE dots.
  - Sequence, page and head bases are int64 (a cache can pass 2^31 elements).
  - The counters (one int32 per group, per device and stream with the partials workspace, zero between launches;
    CUDA-graph captures keep the capture stream's) order the combine after the other programs' partial stores:
    a CTA barrier, then an acq_rel atomic at GPU scope; the combine reads the partials through L2 (.cg).
  - Paged keys are gathered row by row: one table entry per key row (clamped to the split's last page), an int32
    slot offset inside the page (PAGE * stride_kn < 2^31) and an int64 page base, so any page size takes any
    BLOCK_N (docs/kernels.md, the paged address path).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .common import LOG2E, KernelUnsupported, interpreting

DECODE_HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128, 256)
DECODE_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
# An FP8 cache: k_cache and v_cache in e4m3 under q in fp16 or bf16 (module docstring, FP8 cache).
KV_FP8_DTYPE = torch.float8_e4m3fn
KV_FP8_Q_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
# The kernel's tile per head dim on CUDA: BLOCK_N keys per step, num_warps, num_stages; the best or within 3% of
# the best tile at every contiguous shape tried (docs/kernels.md, the decode kernel). (128, 4, 3) does not fit
# at d = 256 (274 KB of shared memory).
GPU_CONFIGS: dict[int, dict[str, int]] = {
    16: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    32: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    64: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    128: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    256: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
}
# A paged cache's tile: two more stages. The page-table load is a pipeline stage of its own, so the K/V loads
# behind it get one shared-memory buffer at num_stages 3-4 and two (as contiguous at 3) at 5 (Triton 3.6 TTGIR);
# 6-18% faster than the best of stages 2-4 (docs/kernels.md, the decode kernel).
PAGED_CONFIGS: dict[int, dict[str, int]] = {
    d: {**cfg, "num_stages": cfg["num_stages"] + 2} if d <= 128 else cfg for d, cfg in GPU_CONFIGS.items()
}
# An e4m3 cache at d = 128: its loop is bound by the latency of its steps, not by bytes (docs/kernels.md, the FP8
# cache), so a few programs per SM do not stream the SM's share of the read bandwidth. Its warps stream keys on
# their own (_decode's STREAMS, where a tile's 16 rows allow it: fp8_streams), and the call is split until each SM
# runs FP8_FILL programs (4) of FP8_TILES[paged], 2 warps: contiguous 32 keys and 4 stages, paged 64 keys and 5
# stages (the page table's dependent load wants more in flight), small enough for 4 per SM, while every split
# keeps FP8_FILL_SPLIT_KEYS keys; past the fill (MHA at batch 16: 512 programs) the same tile, one split. Timed on
# an H200 (4.3 TB/s) over the decode-fp8 preset's 12 shapes; not on an H100, where the plan before the fill
# streamed at its read bandwidth. Calls that cannot reach the fill with such splits (GQA 32/8 at batch 1-2, at 4
# below 32k keys) keep the plan timed on an H100: split until each SM runs FP8_DEEP_FILL (2) programs of a deeper
# tile (FP8_DEEP_TILES; the paged one holds 8 stages; the contiguous one is the fill's since the H200's grid),
# each split at least FP8_MIN_SPLIT_KEYS keys. docs/kernels.md (the FP8 cache) has the grids. Other head dims take
# the bf16 tiles and split rule.
# FULL_BLOCKS (the paged tiles): a split's whole blocks run in a loop of their own without the key mask, then the
# rest masked: 503 instructions per paged pass instead of 598, 0.98-1.00x the time at the plan's splits on an H200
# (0.95x at batch 1, 32k keys). The contiguous tile (326 instead of 362) took 1.00-1.03x; docs/kernels.md.
FP8_FILL = 4  # programs per SM
FP8_TILES: dict[bool, dict[str, int]] = {  # paged -> tile
    False: {"BLOCK_N": 32, "num_warps": 2, "num_stages": 4, "FULL_BLOCKS": 0},
    True: {"BLOCK_N": 64, "num_warps": 2, "num_stages": 5, "FULL_BLOCKS": 1},
}
FP8_FILL_SPLIT_KEYS = 2048
FP8_DEEP_FILL = 2  # programs per SM
FP8_DEEP_TILES: dict[bool, dict[str, int]] = {  # paged -> tile
    False: FP8_TILES[False],
    True: {"BLOCK_N": 64, "num_warps": 2, "num_stages": 8, "FULL_BLOCKS": 1},
}
FP8_TILE_DIMS: tuple[int, ...] = (128,)
# Keys per split at least under the deep plan: 8 of its paged tile's 64-key blocks. A split of 4 never fills a deep
# paged pipeline, and each split adds a partial the combine reads serially: GQA 32/8 at batch 1, 8k keys, paged, took
# 22.8 us at 32 splits of 4 blocks against 18.3 at 16 of 8 ((64, 4, 6) tiles; docs/kernels.md, the FP8 cache).
FP8_MIN_SPLIT_KEYS = 512
# Under the interpreter: small key blocks, so small test shapes cross many blocks and split boundaries.
INTERPRET_CONFIG: dict[str, int] = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
MAX_ROWS = 64  # query rows per tile (G * Nq beyond this takes more row blocks, each reading K/V again)
MAX_SPLITS = 128
MIN_SPLIT_KEYS = 256  # the split heuristic gives every split at least this many keys of the capacity
INTERPRET_SMS = 8  # the SM count assumed under the interpreter
COMBINE_ELEMENTS = 8192  # fp32 partial-output elements the combine holds per step (64 registers per thread)

# Per (device, stream): split counters (int32, one per sequence x KV head x row block, zero between launches: the
# last split program of a group combines and resets its counter) and the fp32 partials workspace. Each launch
# consumes its workspace before the next launch on its stream starts; streams never share one.
_SCRATCH: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
# Compiled kernels by everything Triton specializes them on (and more: exact integer values), so that a repeated
# call skips Triton's JIT dispatch: 25 -> 4 us of host time per launch (Triton 3.6, launch stubbed, on the CPU
# machine), which a short decode pays in full.
_COMPILED: dict[tuple, Any] = {}
# What the most recent launch ran with: (num_splits, tile config, BLOCK_M, row blocks, key streams);
# last_decode_config().
_LAST_LAUNCH: list[Any] = [None]
# A float32 1 per device: the scale an e4m3 cache's missing k_scale or v_scale stands for.
_ONE: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _combine(
    Out,  # [B, Hq, Nq, D] output
    Part,  # fp32 workspace: normalised partial outputs [B, Hkv, splits, ROWS, D], then their log2-sum-exps
    Lse,  # [B, Hkv, splits, ROWS] part of Part
    first_part,  # index of (this sequence, KV head, split 0, row 0) in [B, Hkv, splits, ROWS]
    first_row,  # this tile's first row
    out_base,  # int64 offset of Out[b, h * G, 0, 0]
    splits,
    ROWS: tl.constexpr,  # G * Nq rows per KV head (unused rows are masked)
    HEAD_DIM: tl.constexpr,
    ROWS_P2: tl.constexpr,  # rows this tile combines, a power of two
    S_CHUNK: tl.constexpr,  # splits per step
):
    """Out rows = sum_s exp2(lse_s - max) * O_s / sum_s exp2(lse_s - max), over the splits of this tile.

    The tiles are [rows, splits, D], the splits in the middle: Triton's layout then puts D on a warp's lanes and
    the rows on its warps, so a row's splits sit in one thread's registers and the max and the sums over them
    take no shuffle or shared memory (splits first, the warps fell on the splits: 19 barriers at batch 1, GQA
    32/8, and 2.6 us where this takes 1.0; docs/kernels.md)."""
    rows = (first_row + tl.arange(0, ROWS_P2))[:, None]  # [ROWS_P2, 1]
    row_ok = rows < ROWS
    offs_s = tl.arange(0, S_CHUNK)[None, :]  # [1, S_CHUNK]
    offs_d = tl.arange(0, HEAD_DIM)[None, None, :]  # [1, 1, HEAD_DIM]
    # Every per-row value keeps its axes ([ROWS_P2, 1], [ROWS_P2, 1, HEAD_DIM]), so the loads and the reductions over
    # the splits share one layout (the row sums, `total`, take another, converted once after the loop).
    top = tl.zeros([ROWS_P2, 1], dtype=tl.float32) - float("inf")  # running max lse per row
    acc = tl.zeros([ROWS_P2, 1, HEAD_DIM], dtype=tl.float32)
    total = tl.zeros([ROWS_P2, 1], dtype=tl.float32)
    # One pass, lse and partials loaded together (one round trip when splits <= S_CHUNK); every split wrote
    # its rows (0 and -inf when it saw no key).
    for c in range(0, splits, S_CHUNK):
        idx = first_part + (c + offs_s) * ROWS + rows  # [ROWS_P2, S_CHUNK]
        ok = row_ok & ((c + offs_s) < splits)
        lse = tl.load(Lse + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(
            Part + idx[:, :, None] * HEAD_DIM + offs_d, mask=ok[:, :, None], other=0.0, cache_modifier=".cg"
        )
        new = tl.maximum(top, tl.max(lse, 1, keep_dims=True))
        safe = tl.where(new == float("-inf"), 0.0, new)  # no split saw a key yet: weights 0, not NaN
        w = tl.exp2(lse - safe)
        rescale = tl.exp2(top - safe)
        acc = acc * rescale[:, :, None] + tl.sum(w[:, :, None] * o, 1, keep_dims=True)
        total = total * rescale + tl.sum(w, 1, keep_dims=True)
        top = new
    out = acc / tl.where(total > 0.0, total, 1.0)[:, :, None]
    o_ptrs = Out + out_base + rows[:, :, None] * HEAD_DIM + offs_d  # row r = g * Nq + i: contiguous
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, :, None])


@triton.jit
def _store_partial(
    Part,  # fp32 workspace: partial outputs [groups, splits, ROWS, D], then their log2-sum-exps [groups, splits, ROWS]
    o,  # [BLOCK_M, D] this split's normalised output
    m_i,
    l_i,
    seen,  # l_i > 0: the row saw a key in this split
    group,  # this program's (sequence, KV head) group: grid axis 2, of tl.num_programs(2)
    pid_s,
    rows,
    row_ok,
    offs_d,
    splits,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Store a split's partial output and log2-sum-exp (-inf for a row that saw no key), then a barrier: every
    thread's stores come before the caller's counter moves (release). Returns (Lse, first_part) for _combine."""
    Lse = Part + tl.num_programs(2).to(tl.int64) * splits * ROWS * HEAD_DIM
    first_part = group.to(tl.int64) * splits * ROWS
    part = first_part + pid_s * ROWS + rows
    tl.store(Part + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(Lse + part, lse, mask=row_ok)
    tl.debug_barrier()
    return Lse, first_part


@triton.jit
def _to_f16_rows(q):
    """q [BLOCK_M, D] (fp16 or bf16) as fp16 times 2^e per row, and 2^-e per row.

    e puts the row's largest |q| in [2^15, 2^16): the largest fp16 and bf16 values below 2^16 (65504, 65280) are
    fp16 values, so no row overflows, and a power of two changes no significand. fp16 q is only ever scaled up
    (by 1 where its largest |q| is already >= 2^15), so it stays exact; bf16 q is exact down to 2^-30 of its row's
    largest |q| (fp16's normal range). A zero row stays zero; an Inf or NaN stays one.
    """
    amax = tl.max(tl.abs(q.to(tl.float32)), 1)
    e = tl.minimum(tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) & 255, 16), 254)  # its biased exponent
    up = ((269 - e) << 23).to(tl.float32, bitcast=True)  # 2^(142 - e)
    down = ((e - 15) << 23).to(tl.float32, bitcast=True)  # 2^(e - 142)
    return (q.to(tl.float32) * up[:, None]).to(tl.float16), down


@triton.jit
def _e4m3_to_f16(x, INTERPRET: tl.constexpr):
    """e4m3 x as fp16 (exact), in x's own layout: PTX cvt.rn.f16x2.e4m3x2, four values per asm call.

    Marked not pure so that Triton cannot move the dot-operand layout change above the convert: after a plain
    .to(fp16) it loads V's 8-bit operand layout byte by byte from shared memory (one LDS.U8 per value) and
    converts there; here V's tile is read with 16-byte loads, converted, and staged as fp16 for ldmatrix.trans.
    The interpreter runs no inline asm: .to(fp16) there.
    """
    if INTERPRET:
        return x.to(tl.float16)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r",
        [x.to(tl.int8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


@triton.jit
def _page_offset(page, stride, ALIGN: tl.constexpr, INTERPRET: tl.constexpr):
    """int32 page ids times an int32 page stride, as int64: PTX mul.wide.s32, which ptxas fuses with the pointer
    add after it into one IMAD.WIDE per row. Written as page.to(int64) * stride, LLVM hoists the stride's sign
    extension out of the loop and the multiply stays 64 x 64 bits: four IMAD and a sign SHF per row. The asm hides
    the stride's divisibility from Triton, so the caller states it (ALIGN) and the K/V loads keep 16-byte copies.
    An int64 stride (>= 2^31) takes the plain multiply.
    """
    if INTERPRET or stride.dtype == tl.int64:
        return page.to(tl.int64) * stride
    offset = tl.inline_asm_elementwise(
        "mul.wide.s32 $0, $1, $2;", "=l,r,r", [page, stride], dtype=tl.int64, is_pure=True, pack=1
    )
    if len(offset.shape) == 2:
        offset = tl.multiple_of(offset, (ALIGN, ALIGN))
    else:
        offset = tl.multiple_of(offset, ALIGN)
    return offset


@triton.jit
def _kv_block(
    start, offs, hi, k_head, v_head, pages, last_page, stride_kb, stride_kn, stride_vb, stride_vn,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, PAGE_ALIGN: tl.constexpr,
    INTERPRET: tl.constexpr,
):  # fmt: skip
    """(the keys' offsets, which of them are below hi, pointers to their K rows, to their V rows) for the keys
    start + offs of the block at `start` (offs: any shape, in [0, BLOCK_N)).

    k_head and v_head point at this head's first row (contiguous: of its sequence). Paged: PAGE and BLOCK_N are
    powers of two and every block starts at a multiple of BLOCK_N, so key start + r is token start % PAGE + r %
    PAGE of page start // PAGE + r // PAGE (where PAGE >= BLOCK_N, one page; below, BLOCK_N / PAGE whole pages);
    a key's slot offset is int32 and fixed across blocks. The table load is unmasked: a key past the split reads
    the split's last page's entry (its K/V loads are masked); a masked table load costs a predicate per row,
    carried through the pipeline stages.
    """
    offs_n = start + offs
    key_ok = offs_n < hi
    if PAGED:
        page = tl.load(pages + tl.minimum(start // PAGE + offs // PAGE, last_page))
        k_rows = k_head + (offs % PAGE) * stride_kn + _page_offset(page, stride_kb, PAGE_ALIGN, INTERPRET)
        v_rows = v_head + (offs % PAGE) * stride_vn + _page_offset(page, stride_vb, PAGE_ALIGN, INTERPRET)
        if PAGE > BLOCK_N:
            k_rows += (start % PAGE) * stride_kn
            v_rows += (start % PAGE) * stride_vn
    else:  # int64: a token stride times a long context can pass 2^31
        k_rows = k_head + offs_n.to(tl.int64) * stride_kn
        v_rows = v_head + offs_n.to(tl.int64) * stride_vn
    return offs_n, key_ok, k_rows, v_rows


@triton.jit
def _stream_block(
    start, offs_w, hi, last, qw, scale, m_w, l_w, acc_w, offs_d, cache, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
    PAGED: tl.constexpr, PAGE_ALIGN: tl.constexpr, INTERPRET: tl.constexpr, P_SHIFT: tl.constexpr,
    MASKED: tl.constexpr,
):  # fmt: skip
    """One block of _decode's STREAMS loop over an e4m3 cache: (m, l, acc) of every stream after it. `cache`: the
    head's (k_head, v_head, pages, last_page, stride_kb, stride_kn, stride_vb, stride_vn), as _kv_block takes them.
    MASKED: keys at or past hi read 0 and every key past a row's `last` gets no weight; else the block is whole for
    every row."""
    k_head, v_head, pages, last_page, stride_kb, stride_kn, stride_vb, stride_vn = cache
    offs_n, key_ok, k_rows, v_rows = _kv_block(
        start, offs_w, hi, k_head, v_head, pages, last_page, stride_kb, stride_kn, stride_vb, stride_vn,
        BLOCK_N, PAGE, PAGED, PAGE_ALIGN, INTERPRET,
    )  # fmt: skip
    if MASKED:
        k = tl.load(k_rows[:, :, None] + offs_d[None, None, :], mask=key_ok[:, :, None], other=0.0)
        v = tl.load(v_rows[:, :, None] + offs_d[None, None, :], mask=key_ok[:, :, None], other=0.0)
    else:
        k = tl.load(k_rows[:, :, None] + offs_d[None, None, :])
        v = tl.load(v_rows[:, :, None] + offs_d[None, None, :])
    s = tl.dot(qw, tl.permute(k.to(tl.float16), 0, 2, 1))
    if MASKED:
        s = tl.where(offs_n[:, None, :] <= last[None, :, None], s * scale[None, :, :], float("-inf"))
    else:
        s = s * scale[None, :, :]
    m_new = tl.maximum(m_w, tl.max(s, 2))
    alpha = tl.exp2(m_w - m_new)
    p = tl.exp2(s - (m_new - P_SHIFT)[:, :, None])
    l_w = l_w * alpha[:, :, None] + p
    acc_w = tl.dot(p.to(tl.float16), _e4m3_to_f16(v, INTERPRET), acc_w * alpha[:, :, None])
    return m_new, l_w, acc_w


@triton.jit
def _decode(
    Q,  # [B, Hq, Nq, D] queries, contiguous
    K,  # contiguous [B, Hkv, Nmax, D], or paged [pages, Hkv, PAGE, D]
    V,  # same layout as K
    Seqlens,  # [B] int32 keys per sequence (read when HAS_SEQLENS)
    Table,  # [B, capacity / PAGE] int32 page table, contiguous (read when PAGED)
    Out,  # [B, Hq, Nq, D] output, contiguous
    Part,  # fp32 workspace (not DIRECT): partial outputs [B, Hkv, splits, ROWS, D], then lse [B, Hkv, splits, ROWS]
    Counter,  # [B * Hkv * row blocks] int32 split counters, zero on entry and on exit (not DIRECT)
    KScale,  # fp32 k_scale, element (b, h) at b * stride_ksb + h * stride_ksh (read when KV_FP8)
    VScale,  # fp32 v_scale, the same way (read when KV_FP8)
    qk_scale,  # sm_scale * log2(e)
    capacity,  # keys the cache holds per sequence: Nmax, or max_pages * PAGE
    splits,  # key splits per sequence
    Hkv,  # KV heads
    Nq,  # queries per sequence
    stride_kb,  # K strides: sequence (contiguous) or page (paged), head, token
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ksb,  # k_scale strides over sequences and KV heads (0 where it broadcasts)
    stride_ksh,
    stride_vsb,  # v_scale strides
    stride_vsh,
    GROUP: tl.constexpr,  # G = Hq / Hkv query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per tile, a power of two >= 16
    BLOCK_N: tl.constexpr,  # keys per step
    PAGE: tl.constexpr,  # tokens per page (PAGED)
    PAGED: tl.constexpr,
    PAGE_ALIGN: tl.constexpr,  # the largest power of two <= 16 dividing stride_kb and stride_vb (_page_offset)
    HAS_SEQLENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: normalise and write Out, no partials, no combine
    IEEE: tl.constexpr,  # fp32 inputs: IEEE dots, not TF32
    KV_FP8: tl.constexpr,  # e4m3 K/V: both dots in fp16 (bf16 q scaled per row), k_scale and v_scale folded in
    INTERPRET: tl.constexpr,  # under Triton's interpreter (no inline asm)
    ROWS_P2: tl.constexpr,  # the combine's rows per tile (a power of two)
    S_CHUNK: tl.constexpr,  # the combine's splits per step
    STREAMS: tl.constexpr,  # key streams: 1, or (an e4m3 cache, fp8_streams) one per warp
    FULL_BLOCKS: tl.constexpr,  # STREAMS: whole blocks in a loop of their own, without the key mask (FP8_TILES)
):
    # An e4m3 cache's P (fp16) times 2^P_SHIFT, at most 2^15 (fp16's max is 65504): normal down to 2^-29 of the
    # row max, nonzero to 2^-39 (unshifted: 2^-14, 2^-24). l and acc carry the factor, so o = acc / l drops it, and
    # every split's lse carries the same log2 of it, which the combine's weights drop.
    P_SHIFT: tl.constexpr = 15.0
    pid_s = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // Hkv
    h = pid_bh % Hkv
    ROWS = GROUP * Nq
    L = capacity
    if KV_FP8:  # S = q (k8 * k_scale)^T = (q k8^T) * k_scale: the scale joins the softmax scale
        qk_scale = qk_scale * tl.load(KScale + b * stride_ksb + h * stride_ksh)
        # Loaded here, not where it is used after the loop: there its latency would join the tail's chain.
        v_scale = tl.load(VScale + b * stride_vsb + h * stride_vsh)
    if HAS_SEQLENS:
        L = tl.minimum(tl.load(Seqlens + b), capacity)
    # This split's keys [lo, hi): whole blocks of this sequence's own length.
    per = tl.cdiv(tl.cdiv(L, BLOCK_N), splits) * BLOCK_N
    lo = pid_s * per
    hi = tl.minimum(lo + per, L)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = g * Nq + i: query head h * G + g, query i
    row_ok = rows < ROWS
    offs_d = tl.arange(0, HEAD_DIM)
    # Q and Out are contiguous: the rows of one KV head's group are consecutive [G * Nq, D] rows.
    q_base = pid_bh.to(tl.int64) * ROWS * HEAD_DIM
    q = tl.load(Q + q_base + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    scale = qk_scale
    if KV_FP8:  # fp16 dots: q at a power-of-two scale per row, undone on S with the softmax scale
        q, down = _to_f16_rows(q)
        scale = qk_scale * down[:, None]
    # Last key each row sees within this split (bottom-right causal alignment).
    if CAUSAL:
        last = tl.minimum(L - Nq + rows % Nq, hi - 1)
    else:
        last = tl.zeros([BLOCK_M], dtype=tl.int32) + (hi - 1)

    if PAGED:
        k_head = K + h.to(tl.int64) * stride_kh
        v_head = V + h.to(tl.int64) * stride_vh
        pages = Table + b.to(tl.int64) * (capacity // PAGE)
        last_page = (hi - 1) // PAGE  # this split's last page: _kv_block reads no entry past it
    else:
        k_head = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        v_head = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
        pages = Table  # unused
        last_page = 0

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if STREAMS > 1:
        # Warp w streams keys [w * KW, (w + 1) * KW) of each block on its own: the tiles' leading axis is the
        # warps' (Triton puts a batched dot's warps on its batch axis), so each warp keeps its own m, l and
        # [BLOCK_M, D] accumulator over its keys, S's row max needs no other warp, P stays in registers as the
        # second dot's operand, and q in registers across the loop. The streams merge once after it.
        KW: tl.constexpr = BLOCK_N // STREAMS
        offs_w = tl.arange(0, STREAMS)[:, None] * KW + tl.arange(0, KW)[None, :]  # [W, KW]
        qw = tl.broadcast_to(q[None, :, :], [STREAMS, BLOCK_M, HEAD_DIM])
        m_w = tl.zeros([STREAMS, BLOCK_M], dtype=tl.float32) - 1.0e30
        l_w = tl.zeros([STREAMS, BLOCK_M, KW], dtype=tl.float32)  # per key slot, as l_2d below
        acc_w = tl.zeros([STREAMS, BLOCK_M, HEAD_DIM], dtype=tl.float32)
        cache = (k_head, v_head, pages, last_page, stride_kb, stride_kn, stride_vb, stride_vn)
        full = lo  # FULL_BLOCKS: keys [lo, full) are whole blocks below hi and every row's last key, run unmasked
        if FULL_BLOCKS:
            if CAUSAL:
                edge = tl.min(last, 0) + 1
            else:
                edge = hi
            full = lo + tl.maximum(edge - lo, 0) // BLOCK_N * BLOCK_N
            for start in range(lo, full, BLOCK_N):
                m_w, l_w, acc_w = _stream_block(
                    start, offs_w, hi, last, qw, scale, m_w, l_w, acc_w, offs_d, cache,
                    BLOCK_N, PAGE, PAGED, PAGE_ALIGN, INTERPRET, P_SHIFT, False,
                )  # fmt: skip
        # After whole blocks at most a block or two, in one stage (pipelined, a paged tile's two loops spill).
        TAIL_STAGES: tl.constexpr = 1 if FULL_BLOCKS else None
        for start in tl.range(full, hi, BLOCK_N, num_stages=TAIL_STAGES):
            m_w, l_w, acc_w = _stream_block(
                start, offs_w, hi, last, qw, scale, m_w, l_w, acc_w, offs_d, cache,
                BLOCK_N, PAGE, PAGED, PAGE_ALIGN, INTERPRET, P_SHIFT, True,
            )  # fmt: skip
        # A stream that saw no key keeps m = -1e30 and l = 0: weight 0 beside any that did.
        m_i = tl.max(m_w, 0)
        weight = tl.exp2(m_w - m_i[None, :])
        l_2d = tl.sum(l_w * weight[:, :, None], 0)
        acc = tl.sum(acc_w * weight[:, :, None], 0)
    else:
        if KV_FP8:  # l kept per key slot, summed once after the loop: no sum across the warps in each step
            l_2d = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        offs_r = tl.arange(0, BLOCK_N)
        for start in range(lo, hi, BLOCK_N):
            offs_n, key_ok, k_rows, v_rows = _kv_block(
                start, offs_r, hi, k_head, v_head, pages, last_page, stride_kb, stride_kn, stride_vb, stride_vn,
                BLOCK_N, PAGE, PAGED, PAGE_ALIGN, INTERPRET,
            )  # fmt: skip
            k = tl.load(k_rows[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            v = tl.load(v_rows[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            if KV_FP8:  # every e4m3 value is exact in fp16; P V then runs in fp16 too (P_SHIFT)
                k = k.to(tl.float16)
                v = _e4m3_to_f16(v, INTERPRET)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(offs_n[None, :] <= last[:, None], s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            if KV_FP8:
                p = tl.exp2(s - (m_new - P_SHIFT)[:, None])
            else:
                p = tl.exp2(s - m_new[:, None])
            if KV_FP8:
                l_2d = l_2d * alpha[:, None] + p
            else:
                l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new

    if KV_FP8:
        l_i = tl.sum(l_2d, 1)
    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    if KV_FP8:  # P (v8 * v_scale) = (P v8) * v_scale; the combine is linear in the partials
        o = o * v_scale
    if DIRECT:
        o_ptrs = Out + q_base + rows[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        # The partials are stored before the counter moves (release); the program that moves it last combines
        # (acquire) and puts it back to 0 for the next launch.
        Lse, first_part = _store_partial(
            Part, o, m_i, l_i, seen, pid_bh, pid_s, rows, row_ok, offs_d, splits, ROWS, HEAD_DIM
        )
        counter = Counter + pid_bh * tl.num_programs(1) + pid_m
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
            _combine(Out=Out, Part=Part, Lse=Lse, first_part=first_part, first_row=pid_m * BLOCK_M,
                     out_base=q_base, splits=splits, ROWS=ROWS, HEAD_DIM=HEAD_DIM, ROWS_P2=ROWS_P2,
                     S_CHUNK=S_CHUNK)  # fmt: skip
            tl.store(counter, 0)  # every other split has counted: a plain store, no round trip


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@functools.lru_cache(maxsize=1024)
def choose_num_splits(programs: int, capacity: int, block_n: int, slots: int) -> int:
    """Key splits per sequence when the caller gives none: flash-attn's num_splits_heuristic, in short.

    `programs`: kernel programs without splitting (sequences x KV heads x query-row blocks); `slots`: programs
    that keep HBM busy: one per SM. One program per SM already streams HBM at full speed, and more splits only
    add work (docs/kernels.md, the decode kernel); a paged cache's tile (PAGED_CONFIGS) keeps as many loads in
    flight.
    So: if the programs nearly fill the slots (80%), one split. Otherwise s splits cost waves(s) x blocks per
    split (the critical path: waves of programs over the slots, each streaming whole blocks of `block_n` keys
    of the `capacity`), and the pick is the fewest splits within 10% of the cheapest, then the cheapest count
    that runs in as many waves (8 programs on 132 SMs: 16 splits of 32 blocks, not 15 of 35; docs/kernels.md,
    the decode kernel). Every split keeps at least MIN_SPLIT_KEYS keys (each split costs its Q load, partial
    write and combine read), at most MAX_SPLITS. The capacity, not cache_seqlens, sizes the splits: reading the
    lengths would sync the device.
    """
    if programs >= 0.8 * slots:
        return 1
    blocks = -(-capacity // block_n)
    top = max(1, min(MAX_SPLITS, capacity // MIN_SPLIT_KEYS, blocks))
    cost = [-(-programs * s // slots) * -(-blocks // s) for s in range(1, top + 1)]
    best = min(cost)
    pick = next(s for s, c in enumerate(cost, start=1) if c * 0.9 <= best)
    return fill_waves(pick, programs, blocks, slots, top)


def fill_waves(pick: int, programs: int, blocks: int, slots: int, top: int) -> int:
    """From `pick` splits of `programs` programs over `slots`, the count up to `top` that runs in as many waves
    with the fewest key blocks per split (the fewest splits on a tie): splits that fit in the waves' unused slots
    shorten the critical path for the price of their partials."""
    waves, best = -(-programs * pick // slots), pick
    for s in range(pick + 1, top + 1):
        if -(-programs * s // slots) != waves:
            break
        if -(-blocks // s) < -(-blocks // best):
            best = s
    return best


@functools.lru_cache(maxsize=1024)
def fp8_plan(programs: int, capacity: int, paged: bool, sms: int) -> tuple[dict[str, int], int]:
    """An e4m3 cache's tile and split count at d = 128: FP8_TILES[paged] split until the programs reach 90% of
    FP8_FILL per SM, then the count in as many waves of that fill with the fewest key blocks per split
    (fill_waves), while each split keeps FP8_FILL_SPLIT_KEYS keys of the capacity; one split where the unsplit
    `programs` pass the fill. Where the fill needs shorter splits, the same rule at FP8_DEEP_FILL per SM with
    FP8_DEEP_TILES[paged], each split at least FP8_MIN_SPLIT_KEYS keys. At most MAX_SPLITS either way."""
    programs = max(1, programs)
    tile = FP8_TILES[paged]
    blocks = -(-capacity // tile["BLOCK_N"])
    want = FP8_FILL * sms
    if programs > want:
        return tile, 1
    top = max(1, min(MAX_SPLITS, capacity // FP8_FILL_SPLIT_KEYS))
    pick = -(-9 * want // (10 * programs))
    if pick <= top:
        return tile, fill_waves(pick, programs, blocks, want, top)
    want = FP8_DEEP_FILL * sms
    top = max(1, min(MAX_SPLITS, capacity // FP8_MIN_SPLIT_KEYS))
    pick = min(top, -(-9 * want // (10 * programs)))
    return FP8_DEEP_TILES[paged], fill_waves(pick, programs, blocks, want, top)


def fp8_streams(cfg: dict[str, int], block_m: int, head_dim: int) -> int:
    """_decode's STREAMS over an e4m3 cache: the tile's warps, each streaming its own keys, at d in FP8_TILE_DIMS
    where the tile has 16 rows (a warp's [16, D] fp32 accumulator; at 32 rows the loop spills) and each warp gets
    at least 16 keys of a block (the dots' smallest tile); else 1 (the warps share each block's keys)."""
    warps = cfg["num_warps"]
    if head_dim in FP8_TILE_DIMS and block_m == 16 and cfg["BLOCK_N"] // warps >= 16:
        return warps
    return 1


def _pow2(n: int) -> int:
    """The next power of two >= n (triton.next_power_of_2 costs ~5 us per call on the host in Triton 3.6)."""
    return 1 << (n - 1).bit_length()


def combine_chunk(splits: int, rows: int, head_dim: int) -> int:
    """_combine's S_CHUNK: the splits it reads per step for `rows` rows (a power of two) of `head_dim` partial
    outputs, COMBINE_ELEMENTS at a time, at most the next power of two of the splits."""
    return max(1, min(_pow2(splits), COMBINE_ELEMENTS // (rows * head_dim)))


def _refuse(message: str, name: str = "flash_decode") -> None:
    raise KernelUnsupported(f"{name}: {message}")


# The checks flash_decode and flash_mla_decode (kernels/mla.py) share, each refusing in its caller's name.
def _check_index_tensors(lens: Any, table: Any, name: str) -> None:
    """cache_seqlens and block_table: int32 tensors or None."""
    for label, t in (("cache_seqlens", lens), ("block_table", table)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.int32):
            _refuse(
                f"{label} must be an int32 torch.Tensor or None, got {getattr(t, 'dtype', type(t).__name__)}",
                name,
            )


def _check_device(q: torch.Tensor, name: str) -> None:
    """CUDA outside the interpreter, the CPU inside it, and no bf16 there (its bf16 tl.dot is wrong)."""
    dev = q.device
    if dev.type == "cuda":
        if interpreting():
            _refuse("CUDA tensors while TRITON_INTERPRET=1 (the interpreter runs on CPU)", name)
    elif dev.type != "cpu":
        _refuse(f"device {dev.type} unsupported (cuda, or cpu under the interpreter)", name)
    elif not interpreting():
        _refuse("device cpu needs Triton's interpreter (TRITON_INTERPRET=1 before importing triton)", name)
    elif q.dtype == torch.bfloat16:  # the interpreter's bf16 tl.dot is silently wrong (rel. error ~1e9, 3.9)
        _refuse("bf16 under the Triton interpreter (its bf16 tl.dot is wrong)", name)


def _check_cache_layout(B: int, cache: torch.Tensor, lens: Any, table: Any, label: str, name: str) -> None:
    """cache_seqlens [B]; a contiguous cache of B sequences, or a block table [B, blocks] over pages of a power of
    two >= 16 tokens (cache.shape[2])."""
    if lens is not None and lens.shape != (B,):
        _refuse(f"cache_seqlens must be [batch={B}], got {tuple(lens.shape)}", name)
    if table is None:
        if cache.shape[0] != B:
            _refuse(f"batch differs between q ({B}) and the contiguous cache ({cache.shape[0]})", name)
        return
    if table.dim() != 2 or table.shape[0] != B:
        _refuse(f"block_table must be [{B}, blocks], got {tuple(table.shape)}", name)
    page = cache.shape[2]
    if page < 16 or page & (page - 1):
        _refuse(f"page size {page} ({label}.shape[2]) must be a power of two >= 16", name)


def _check_scale(scale: Any, name: str) -> float:
    if not isinstance(scale, int | float) or not math.isfinite(scale):
        _refuse(f"sm_scale must be a finite number, got {scale!r}", name)
    return float(scale)


def _forced_config(
    cfg: dict[str, int], config: Any, block_ns: tuple[int, ...], name: str, options: tuple[str, ...] = ()
) -> dict[str, int]:
    """The default tile `cfg` with a forced `config`'s keys over it: cfg's keys, and `options`, keys the default tile
    may lack (the kernel then reads them as 0)."""
    if config is None:
        return cfg
    keys = sorted({*cfg, *options})
    if not isinstance(config, dict) or not set(config) <= set(keys):
        _refuse(f"config keys must be among {keys}, got {config!r}", name)
    cfg = {**cfg, **config}
    if cfg["BLOCK_N"] not in block_ns:
        _refuse(
            f"config BLOCK_N={cfg['BLOCK_N']!r} must be a power of two in {block_ns[0]}..{block_ns[-1]}", name
        )
    return cfg


def _splits(
    num_splits: Any, programs: int, capacity: int, block_n: int, device: torch.device, name: str
) -> int:
    """A given split count checked, or choose_num_splits' for `programs` programs on this device."""
    if num_splits is None:
        sms = INTERPRET_SMS if interpreting() else _sm_count(device.index or 0)
        return choose_num_splits(programs, capacity, block_n, sms)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_SPLITS:
        _refuse(f"num_splits must be an int in 1..{MAX_SPLITS}, got {num_splits!r}", name)
    return num_splits


def last_launch(slot: list[Any]) -> dict[str, Any] | None:
    """What a launcher's most recent launch recorded in `slot` (its _LAST_LAUNCH: num_splits, the tile config,
    BLOCK_M, row blocks and, from flash_decode, its key streams), as a config dict."""
    if slot[0] is None:
        return None
    splits, cfg, block_m, row_blocks, *streams = slot[0]
    launch = {"num_splits": splits, **cfg, "BLOCK_M": block_m, "row_blocks": row_blocks}
    return {**launch, "streams": streams[0]} if streams else launch


# The checks below build their messages only on failure: the host path is part of every timed call (a call's
# launch path longer than its GPU time is measured as host time).
def _check_tensors(q: Any, k: Any, v: Any, lens: Any, table: Any) -> None:
    """Shapes, dtypes, devices, layouts: no device data read."""
    for label, t in (("q", q), ("k_cache", k), ("v_cache", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _refuse(f"{label} must be a 4-D torch.Tensor, got {getattr(t, 'shape', type(t).__name__)}")
    _check_index_tensors(lens, table, "flash_decode")
    if k.dtype == KV_FP8_DTYPE:
        if v.dtype != KV_FP8_DTYPE or q.dtype not in KV_FP8_Q_DTYPES:
            _refuse(
                f"an e4m3 cache needs e4m3 k_cache and v_cache under fp16 or bf16 q, got {q.dtype}, {k.dtype}, "
                f"{v.dtype}"
            )
    elif not q.dtype == k.dtype == v.dtype:
        _refuse(f"q, k_cache, v_cache dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.dtype not in DECODE_DTYPES:
        _refuse(f"dtype {q.dtype} unsupported (fp16, bf16, fp32 are)")
    dev = q.device
    if not (k.device == dev and v.device == dev and (lens is None or lens.device == dev)) or (
        table is not None and table.device != dev
    ):
        devices = sorted({str(t.device) for t in (q, k, v, lens, table) if t is not None})
        _refuse(f"inputs are on different devices ({', '.join(devices)})")
    _check_device(q, "flash_decode")
    B, Hq, Nq, D = q.shape
    if k.shape != v.shape:
        _refuse(f"k_cache and v_cache shapes differ ({tuple(k.shape)} vs {tuple(v.shape)})")
    if k.shape[3] != D:
        _refuse(f"head_dim differs between q ({D}) and the cache ({k.shape[3]})")
    if D not in DECODE_HEAD_DIMS:
        _refuse(f"head_dim {D} unsupported (supported: {DECODE_HEAD_DIMS})")
    if min(*q.shape, *k.shape) < 1:
        _refuse(f"empty input (q {tuple(q.shape)}, cache {tuple(k.shape)})")
    if Hq % k.shape[1]:
        _refuse(f"KV heads {k.shape[1]} do not divide query heads {Hq}")
    if k.stride(3) != 1 or v.stride(3) != 1:
        _refuse("k_cache and v_cache need a unit stride in head_dim")
    _check_cache_layout(B, k, lens, table, "k_cache", "flash_decode")


def _check_scales(k_scale: Any, v_scale: Any, q: torch.Tensor, k: torch.Tensor) -> tuple[Any, Any] | None:
    """The scales as [B, Hkv] float32 views (broadcast: stride 0), or None for a cache that is not e4m3."""
    fp8 = k.dtype == KV_FP8_DTYPE
    if not fp8:
        if k_scale is not None or v_scale is not None:
            _refuse(f"k_scale and v_scale are for a float8_e4m3fn cache, not {k.dtype}")
        return None
    B, Hkv = q.shape[0], k.shape[1]
    views = []
    for label, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            t = _ONE.get(q.device)
            if t is None:
                t = _ONE[q.device] = torch.ones((), device=q.device)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device != q.device:
            _refuse(
                f"{label} must be a float32 torch.Tensor on {q.device} or None, got "
                f"{getattr(t, 'dtype', type(t).__name__)} on {getattr(t, 'device', '-')}"
            )
        shape = (1,) * (2 - t.dim()) + tuple(t.shape)
        if t.dim() > 2 or shape[0] not in (1, B) or shape[1] not in (1, Hkv):
            _refuse(f"{label} of shape {tuple(t.shape)} does not broadcast to [batch={B}, kv_heads={Hkv}]")
        views.append(t.expand(B, Hkv))
    return views[0], views[1]


def _check_data(
    lens: torch.Tensor | None,
    table: torch.Tensor | None,
    capacity: int,
    pool: int,
    page: int,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    name: str = "flash_decode",
) -> None:
    """Every length within the capacity, every page a sequence uses inside the pool, every scale finite and
    positive: one device sync. `name`: the call refusing."""
    used = None
    if table is not None:  # table entries past a sequence's length are never read
        n = lens.clamp(0, capacity) if lens is not None else torch.full_like(table[:, 0], capacity)
        used = torch.arange(table.shape[1], device=table.device)[None, :] < (n[:, None] + page - 1) // page
    in_use = None if used is None or table is None else torch.where(used, table, 0)
    stats = [t for t in (lens, in_use) if t is not None]
    if scales is not None:  # one value per scale: 1 when every element is finite and > 0, else 0
        stats += [(torch.isfinite(s) & (s > 0)).all().to(torch.int32) for s in scales]
    if not stats:
        return
    values = torch.stack([x for t in stats for x in (t.min(), t.max())]).tolist()  # the sync
    if scales is not None:
        *values, k_ok, _, v_ok, _ = values
        if not (k_ok and v_ok):
            _refuse(f"{'k_scale' if not k_ok else 'v_scale'} holds a value that is not finite and > 0", name)
    if lens is not None:
        low, high, *values = values
        if low < 0:
            _refuse(f"cache_seqlens holds a negative length ({low})", name)
        if high > capacity:
            _refuse(f"cache_seqlens holds {high}, past the cache capacity {capacity}", name)
    if table is not None and (values[0] < 0 or values[1] >= pool):
        _refuse(
            f"block_table holds page {values[0] if values[0] < 0 else values[1]}, outside the pool of {pool}",
            name,
        )


def _scratch(device: torch.device, counters: int, partials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed counters and a partials workspace (fp32 elements) for `device`'s current stream, grown on demand."""
    if device.type == "cuda" and device.index is None:  # torch.device("cuda"): the current one
        device = torch.device("cuda", torch.cuda.current_device())
    key = (
        str(device),
        triton.runtime.driver.active.get_current_stream(device.index) if device.type == "cuda" else 0,
    )
    have = _SCRATCH.get(key)
    if have is None or have[0].numel() < counters or have[1].numel() < partials:
        have = _SCRATCH[key] = (
            torch.zeros(max(counters, 1024), dtype=torch.int32, device=device),
            torch.empty(max(partials, 1 << 16), dtype=torch.float32, device=device),
        )
    return have


def _launch(
    grid: tuple[int, int, int], args: tuple, pointers: int, warps: int, stages: int, kernel: Any = _decode
) -> None:
    """kernel[grid](*args): through Triton's JIT the first time per key, then straight to the compiled kernel.

    The key holds the kernel, the device, every argument but the float scale (exact integers, constexprs, the
    dtype) and the 16-byte alignment of each of the `pointers` leading tensor arguments: at least what Triton
    specializes on. kernels/mla.py launches its kernel through it too.
    """
    if interpreting():
        kernel[grid](*args, num_warps=warps, num_stages=stages)
        return
    ptrs = args[:pointers]
    key = (
        kernel,
        ptrs[0].dtype,
        ptrs[1].dtype,  # the cache's: fp8 or q's
        ptrs[0].device.index,
        warps,
        stages,
        *(t.data_ptr() % 16 for t in ptrs),
        *args[pointers + 1 :],
    )
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, num_warps=warps, num_stages=stages)
        if len(_COMPILED) >= 4096:
            _COMPILED.clear()
        _COMPILED[key] = compiled
    else:
        compiled[grid](*args)


def last_decode_config() -> dict[str, Any] | None:
    """The split count and tile of the most recent flash_decode launch in this process, or None before any."""
    return last_launch(_LAST_LAUNCH)


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
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    validate: bool = True,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """Attention of q [B, Hq, Nq, D] (the last Nq tokens of each sequence) over a KV cache; [B, Hq, Nq, D].

    k_cache, v_cache: [B, Hkv, Nmax, D], or with block_table [B, max_blocks] int32 a page pool
    [num_blocks, Hkv, block_size, D]. cache_seqlens: int32 [B] valid keys per sequence (default: the capacity).
    causal: query i sees keys j <= L_b - Nq + i (else all L_b keys). num_splits: key splits per sequence
    (None: `choose_num_splits`; 1: one pass, no combine). validate: check cache_seqlens and block_table
    against the cache on the host (one device sync; see the module docstring). config: force the kernel's
    {"BLOCK_N", "num_warps", "num_stages"}, over an e4m3 cache also "FULL_BLOCKS" (default per head dim: GPU_CONFIGS,
    PAGED_CONFIGS with a block table; over an e4m3 cache at d = 128 fp8_plan's, which also picks the split count when
    num_splits is None).
    An e4m3 cache (torch.float8_e4m3fn k_cache and v_cache, q fp16 or bf16): k_scale, v_scale float32
    broadcastable to [B, Hkv] (None: 1), a stored value times its scale being the real value; the output has
    q's dtype. validate=True also checks that every scale is finite and > 0.
    Raises KernelUnsupported (a ValueError) naming what it refuses.
    """
    if torch.compiler.is_compiling():  # one custom op for torch.compile's graph (kernels/ops.py)
        if config is not None:
            _refuse("config= is not taken under torch.compile (call it eagerly)")
        return torch.ops.flashbench.decode(
            q,
            k_cache,
            v_cache,
            cache_seqlens,
            block_table,
            causal,
            sm_scale,
            num_splits,
            validate,
            k_scale,
            v_scale,
        )
    _check_tensors(q, k_cache, v_cache, cache_seqlens, block_table)
    scales = (
        None
        if k_scale is None and v_scale is None and k_cache.dtype != KV_FP8_DTYPE
        else (_check_scales(k_scale, v_scale, q, k_cache))
    )
    k, v, paged = k_cache, v_cache, block_table is not None
    if not isinstance(causal, bool):
        _refuse(f"causal must be a bool, got {causal!r}")
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    page = k.shape[2] if paged else 1
    capacity = block_table.shape[1] * page if block_table is not None else k.shape[2]
    scale = _check_scale(1.0 / math.sqrt(D) if sm_scale is None else sm_scale, "flash_decode")
    if validate:
        _check_data(cache_seqlens, block_table, capacity, k.shape[0], page, scales)
    interpret = interpreting()
    rows = (Hq // Hkv) * Nq
    block_m = min(MAX_ROWS, max(16, _pow2(rows)))
    row_blocks = -(-rows // block_m)
    programs = B * Hkv * row_blocks
    if interpret:
        cfg = INTERPRET_CONFIG
    elif scales is not None and D in FP8_TILE_DIMS:
        sms = _sm_count(q.device.index or 0)
        cfg, splits = fp8_plan(programs, capacity, paged, sms)
        num_splits = splits if num_splits is None else num_splits
    else:
        cfg = (PAGED_CONFIGS if paged else GPU_CONFIGS)[D]
    options = ("FULL_BLOCKS",) if scales is not None else ()  # FULL_BLOCKS: an e4m3 tile's (FP8_TILES)
    cfg = _forced_config(cfg, config, (16, 32, 64, 128, 256), "flash_decode", options)
    num_splits = _splits(num_splits, programs, capacity, cfg["BLOCK_N"], q.device, "flash_decode")

    q = q if q.is_contiguous() else q.contiguous()
    out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    direct = num_splits == 1
    if direct:  # no partials: Out stands in for the unused pointers
        counters = part = out
    else:  # partial outputs [B, Hkv, splits, rows, D], then their lse [B, Hkv, splits, rows]
        counters, part = _scratch(q.device, B * Hkv * row_blocks, B * Hkv * num_splits * rows * (D + 1))
    rows_p2 = min(block_m, _pow2(rows))
    s_chunk = combine_chunk(num_splits, rows_p2, D)
    table = out if block_table is None else block_table.contiguous()
    ks, vs = (out, out) if scales is None else scales
    ks_strides = (0, 0) if scales is None else ks.stride()
    vs_strides = (0, 0) if scales is None else vs.stride()
    page_align = math.gcd(16, k.stride(0), v.stride(0)) if paged else 1
    streams = 1 if scales is None else fp8_streams(cfg, block_m, D)
    args = (  # _decode's arguments in order: 10 tensors, the float scale, then integers and constexprs
        q, k, v, out if cache_seqlens is None else cache_seqlens, table,
        out, part, counters, ks, vs,
        float(scale) * LOG2E,
        capacity, num_splits, Hkv, Nq, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        *ks_strides, *vs_strides,
        Hq // Hkv, D, block_m, cfg["BLOCK_N"], page, paged, page_align, cache_seqlens is not None, causal, direct,
        q.dtype == torch.float32, scales is not None, interpret, rows_p2, s_chunk, streams, cfg.get("FULL_BLOCKS", 0),
    )  # fmt: skip
    # a tuple: no dict built on the host path
    _LAST_LAUNCH[0] = (num_splits, cfg, block_m, row_blocks, streams)
    try:
        _launch((num_splits, row_blocks, B * Hkv), args, 10, cfg["num_warps"], cfg["num_stages"])
    except OutOfResources as exc:  # a forced config too large for this GPU (the defaults fit an H100)
        _refuse(f"config {cfg} does not fit this GPU at head_dim {D}: {exc}")
    return out

"""The Gluon MLA kernel's second schedule (mla_ws.py), for grids of one row block: both consumers on every block.

Where a sequence's query rows fit one 64-row block (H x Nq <= 64: DeepSeek-V3 under tensor parallelism, 16-64 heads
at Nq = 1), no other program shares a program's cache tiles, and the seesaw of mla_ws_kernel.py leaves the stream
waiting: each pair's loads go into the two stages the pair before still uses, so loading and computing take turns
(docs/kernels.md, "Where the loop waits"). Here both consumer warpgroups (the same 64 rows; consumer 0 is the
default partition) work on one 64-key block at a time while the producer warp loads the next into the other stage:
  - S [64, 64] is computed once: consumer w takes keys [32w, 32w + 32) (Q and K from shared memory);
  - the running max is shared: each consumer writes its 64 row maxima to mx, both wait on `max_bar`, and both
    take max(m, mx_0, mx_1), so m and the rescale alpha are the same in both;
  - P_w = exp2(S_w - m) goes to p_smem[w], both wait on `p_bar`;
  - consumer w owns O's columns [256w, 256w + 256): O_w += P_0 V_0w + P_1 V_1w (V: the block's rows, columns
    [256w, +256));
  - each consumer's row sums cover its own keys; the two are added through mx after the loop (mla_ws_kernel's
    _store_out).
A block's P V is waited for at the top of the next block, before its S is issued, and its stage goes back there
(`empty`, one arrival per consumer): with two stages of 72 KB the producer keeps one block ahead, so the sooner a
stage goes back, the sooner the next load starts (1.13-1.17x at Nq = 1 against releasing it after the next S).

The producer loads Q once, then each block as its latent halves [0, 256) and [256, 512) and its rotary columns
(mla_ws_kernel's descriptors) onto one barrier. It asks L2 for nothing ahead: the seesaw's prefetch of the next
block, one or two blocks ahead of its load, took 1.02-1.04x / 1.09-1.12x the time here (docs/kernels.md). Keys
past the split's end, paged caches, splits with no keys, the split combine's early start (PDL) and the partials
are as in mla_ws_kernel.py's docstring.

Shared memory at 576 dims in bf16: Q 72 KB, two cache stages 144 KB, P 8 KB: 224 KB of an H100's 227.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .flash_ws_parts import launch_dependents
from .mla_ws_kernel import _last_keys, _page_row, _split_keys, _store_out, _zero_rows


@gluon.jit
def _producer(
    descs,
    smem,
    bars,
    Seqlens,
    Table,
    capacity,
    splits,
    ROWS,
    pool_pages,
    HAS_SEQLENS: gl.constexpr,
    PAGED: gl.constexpr,
    PAGE: gl.constexpr,
    PDL: gl.constexpr,
):
    """One warp: Q once, then the split's blocks into the two stages, each once both consumers gave its stage
    back. PDL: first, let the combine launched behind this kernel start."""
    qd, qrd, kd, krd = descs
    q_smem, qr_smem, k_smem, kr_smem, _, _ = smem
    q_bar, full, empty, _, _ = bars
    if PDL:
        launch_dependents()
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HALF: gl.constexpr = kd.block_type.shape[1]
    b = gl.program_id(2)
    L, lo, hi = _split_keys(Seqlens, b, capacity, splits, BLOCK_N, HAS_SEQLENS)
    n = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)
    if n > 0:
        q_row = b * ROWS
        mbarrier.expect(q_bar, qd.block_type.nbytes + qrd.block_type.nbytes)
        tma.async_copy_global_to_shared(qd, [q_row, 0], q_bar, q_smem)
        tma.async_copy_global_to_shared(qrd, [q_row, 0], q_bar, qr_smem)
        if PAGED:
            pages = Table + b.to(gl.int64) * (capacity // PAGE)
        else:
            row0 = b * capacity + lo
        for j in range(n):
            s = j % 2
            if PAGED:  # read before the wait below, which hides the load's latency
                row = _page_row(pages, lo + j * BLOCK_N, pool_pages, PAGE)
            else:
                row = row0 + j * BLOCK_N
            # a fresh barrier passes a wait on parity 1: the first pass over the stages is free
            mbarrier.wait(empty.index(s), ((j // 2) & 1) ^ 1)
            mbarrier.expect(full.index(s), 2 * kd.block_type.nbytes + krd.block_type.nbytes)
            tile = k_smem.index(s)
            tma.async_copy_global_to_shared(kd, [row, 0], full.index(s), tile.slice(0, HALF, dim=1))
            tma.async_copy_global_to_shared(kd, [row, HALF], full.index(s), tile.slice(HALF, HALF, dim=1))
            tma.async_copy_global_to_shared(krd, [row, 0], full.index(s), kr_smem.index(s))


@gluon.jit
def _consumer(
    smem,
    bars,
    Seqlens,
    Out,
    Part,
    Lse,
    qk_scale,
    capacity,
    splits,
    ROWS,
    Nq,
    WG: gl.constexpr,
    D_V: gl.constexpr,
    HAS_SEQLENS: gl.constexpr,
    CAUSAL: gl.constexpr,
    DIRECT: gl.constexpr,
):
    """Consumer warpgroup WG: S for keys [32 WG, 32 WG + 32) of each block, O's columns [WG D_V/2, +D_V/2)."""
    q_smem, qr_smem, k_smem, kr_smem, p_smem, mx = smem
    q_bar, full, empty, max_bar, p_bar = bars
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HALF_N: gl.constexpr = BLOCK_N // 2
    D_HALF: gl.constexpr = D_V // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D_HALF, 16]
    )
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    b = gl.program_id(2)
    L, lo, hi = _split_keys(Seqlens, b, capacity, splits, BLOCK_N, HAS_SEQLENS)
    n = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)
    last = _last_keys(0, L, hi, Nq, CAUSAL, row_s)  # the one row block's
    cols = WG * HALF_N + gl.arange(0, HALF_N, gl.SliceLayout(0, s_layout))
    m_i = gl.full([64], -1.0e30, gl.float32, row_s)  # finite: a row that sees no key gets no exp2(-inf + inf)
    l_i = gl.zeros([64], gl.float32, row_s)
    acc = gl.zeros([64, D_HALF], gl.float32, o_layout)
    if n > 0:
        mbarrier.wait(q_bar, 0)
    for j in range(n):
        st = j % 2
        start = lo + j * BLOCK_N
        tile = k_smem.index(st)
        mbarrier.wait(full.index(st), (j // 2) & 1)
        keys = tile.slice(WG * HALF_N, HALF_N, dim=0).permute((1, 0))
        s = warpgroup_mma(
            q_smem, keys, gl.zeros([64, HALF_N], gl.float32, s_layout), use_acc=False, is_async=True
        )
        rope = kr_smem.index(st).slice(WG * HALF_N, HALF_N, dim=0).permute((1, 0))
        s = warpgroup_mma(qr_smem, rope, s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        s = gl.where(start + cols[None, :] <= last[:, None], s * qk_scale, float("-inf"))
        m_own = gl.max(s, 1)
        mx[WG].store(m_own)
        gl.thread_barrier()
        mbarrier.arrive(max_bar)
        mbarrier.wait(max_bar, j & 1)
        m_new = gl.maximum(m_i, gl.maximum(m_own, mx[1 - WG].load(row_s)))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_smem.index(WG).store(p.to(p_smem.dtype))
        if hi - start < BLOCK_N:  # a partial last block: its unused rows of V may hold anything
            _zero_rows(tile, hi - start, WG, D_HALF)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p_bar)
        mbarrier.wait(p_bar, j & 1)
        v = tile.slice(WG * D_HALF, D_HALF, dim=1)
        acc = warpgroup_mma(p_smem.index(0), v.slice(0, HALF_N, dim=0), acc, is_async=True)
        acc = warpgroup_mma(p_smem.index(1), v.slice(HALF_N, HALF_N, dim=0), acc, is_async=True)
        # P V done, the stage goes back before the next block's S (no wgmma stays in flight across the loop's back
        # edge: ptxas serializes every wgmma of the kernel otherwise)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(st))
    # both have read the last block's maxima (p_bar is past), so mx takes the row sums; max_bar's phase n is next
    _store_out(acc, m_i, l_i, mx, max_bar, n & 1, Out, Part, Lse, splits, ROWS, WG, D_V, DIRECT)


@gluon.jit
def _mla_decode_split(
    qd,  # as mla_ws_kernel._mla_decode_ws's arguments
    qrd,
    kd,
    krd,
    Seqlens,
    Out,
    Part,
    Lse,
    qk_scale,
    capacity,
    splits,
    ROWS,  # H * Nq <= 64: one row block
    Nq,
    Table,
    pool_pages,
    Cache,  # unused: the seesaw's L2 prefetches read it
    D_V: gl.constexpr,
    PAGED: gl.constexpr,
    PAGE: gl.constexpr,
    HAS_SEQLENS: gl.constexpr,
    CAUSAL: gl.constexpr,
    DIRECT: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    PDL: gl.constexpr,
):
    """One program per (key split, sequence): grid (1, splits, B)."""
    D_ROPE: gl.constexpr = qrd.block_type.shape[1]
    BLOCK_N: gl.constexpr = krd.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(qd.dtype, [64, D_V], qd.layout)
    qr_smem = gl.allocate_shared_memory(qd.dtype, [64, D_ROPE], qrd.layout)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], kd.dtype)
    k_smem = gl.allocate_shared_memory(kd.dtype, [2, BLOCK_N, D_V], k_layout)
    kr_smem = gl.allocate_shared_memory(kd.dtype, [2, BLOCK_N, D_ROPE], krd.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BLOCK_N // 2], qd.dtype)
    p_smem = gl.allocate_shared_memory(qd.dtype, [2, 64, BLOCK_N // 2], p_layout)
    row_smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    mx = (  # each consumer's 64 row maxima (then row sums)
        gl.allocate_shared_memory(gl.float32, [64], row_smem),
        gl.allocate_shared_memory(gl.float32, [64], row_smem),
    )
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    max_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumers give a stage back
    mbarrier.init(max_bar, count=2)
    mbarrier.init(p_bar, count=2)
    fence_async_shared()

    descs = (qd, qrd, kd, krd)
    smem = (q_smem, qr_smem, k_smem, kr_smem, p_smem, mx)
    bars = (q_bar, full, empty, max_bar, p_bar)
    gl.warp_specialize(
        [
            (_consumer, (smem, bars, Seqlens, Out, Part, Lse, qk_scale, capacity, splits, ROWS, Nq, 0, D_V,
                         HAS_SEQLENS, CAUSAL, DIRECT)),
            (_consumer, (smem, bars, Seqlens, Out, Part, Lse, qk_scale, capacity, splits, ROWS, Nq, 1, D_V,
                         HAS_SEQLENS, CAUSAL, DIRECT)),
            (_producer, (descs, smem, bars, Seqlens, Table, capacity, splits, ROWS, pool_pages,
                         HAS_SEQLENS, PAGED, PAGE, PDL)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip

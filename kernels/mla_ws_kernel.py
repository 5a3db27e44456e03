"""The Gluon kernel of mla_ws.py (MLA decode on Hopper): FlashMLA's schedule, its partitions and their hand-offs.

gl.warp_specialize runs two consumer warpgroups on the same 64 query rows (consumer 0 is the default partition)
beside one producer warp. The split's 64-key cache blocks go in pairs: consumer 0 owns block 2t, consumer 1 block
2t + 1, and consumer w owns O's columns [256w, 256w + 256) ([64, 256] fp32, 128 registers). Per pair (FlashMLA's
"seesaw", deepseek-ai/FlashMLA csrc/sm90/decode/dense):
  - each consumer computes the whole S [64, 64] of its own block (36 wgmmas of 64x64x16: Q read from shared memory
    once a tile; the last 4, over the rotary columns, take Q's from registers);
  - consumer 0: m_a = max(m, rowmax S_a), P_a = exp2(S_a - m_a); m_a out to consumer 1 (MA_FULL); O_0 += P_a V_a
    with P_a from registers; then, given m_b, P_a rescaled to m_b into p_smem (P0_FULL) and O_0 += P_b V_b with
    consumer 1's P_b from qr_smem;
  - consumer 1: m_b = max(m_a, rowmax S_b), P_b = exp2(S_b - m_b); m_b out (MB_FULL); P_b into qr_smem
    (P1_FULL); O_1 += P_b V_b from registers, then O_1 += P_a V_a from p_smem;
  - so one consumer's S runs while the other's softmax does, and each S reads Q once for 64 keys (the split
    consumers before read it twice, in 32-key wgmmas bound by shared memory; docs/kernels.md);
  - each consumer's row sums cover its own blocks' P; the two are added through mx after the loop (m is the
    same in both then).
qr_smem holds Q's rotary columns until both consumers have them in registers (P1_FREE's first phase), then
consumer 1's P: two P buffers beside Q (72 KB) and two 72 KB stages, 224 KB of an H100's 227 (FlashMLA's layout).
No wgmma is issued under a branch taken at run time, and none is left in flight across the loop's back edge
(ptxas serializes every wgmma otherwise).

The producer warp loads Q once and the cache tiles by TMA, each tile as two halves that go back on their own (the
`empty` barriers, one consumer each): the left latent columns [0, 256) are read by the owner's S and by consumer
0's P V, the right ones [256, 512) with the rotary columns by the owner's S and consumer 1's P V. So block 2t's
left half goes back once consumer 0's own P V is done, before the pair's other P Vs, and the producer loads the
halves in the order they come back. A split whose block count is odd gets a last block 2t + 1 that is never
loaded: its S reads a stale stage, every key masked, so its P is 0 and its V rows are zeroed. A split with no
keys gets one fully masked block (the cache's first).

Keys past the split's end in its last block are masked in S; where that block is partial, each consumer zeroes its
V columns of those rows before its P V (P is 0 there, but 0 times a NaN left in an unused cache row is NaN).

A paged cache (PAGED): the descriptors view the whole pool as [pool_pages * PAGE, 576], PAGE a multiple of BLOCK_N,
so a tile never crosses a page. Per tile the producer reads the tile's page from the table (one scalar load,
Table[b, key // PAGE]) and loads the boxes at row page * PAGE + key % PAGE. The page id is clamped into [0,
pool_pages): TMA zero-fills a box's rows outside the tensor (the PTX ISA's bounding-box rule, negative coordinates
included), but a garbage id times PAGE can wrap int32 into the pool, and the clamp makes every coordinate a real
page without relying on either. Only a tile's first key picks its page, and it is below the sequence's length, so
the entry is one in use (but for a sequence of no keys, whose one fully masked block reads entry 0: the clamp keeps
that in the pool); the tile's keys past the length are masked and their V rows zeroed as above. The consumers do
not know the layout. The L2 prefetch asks for a block's keys below the split's end only, so it never leaves the
cache.
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


@gluon.jit
def _split_keys(Seqlens, b, capacity, splits, BLOCK_N: gl.constexpr, HAS_SEQLENS: gl.constexpr):
    """(L, lo, hi): the sequence's keys and this split's [lo, hi), whole blocks of its own length (as the tl
    kernel's split)."""
    L = capacity
    if HAS_SEQLENS:
        L = gl.minimum(gl.load(Seqlens + b), capacity)
    per = gl.cdiv(gl.cdiv(L, BLOCK_N), splits) * BLOCK_N
    lo = gl.program_id(1) * per
    hi = gl.minimum(lo + per, L)
    return L, lo, hi


@gluon.jit
def _page_row(pages, key, pool_pages, PAGE: gl.constexpr):
    """The pool row of a tile's first key: its page's first row (the page id clamped into the pool: the module
    docstring says why) plus the key's offset in the page."""
    page = gl.load(pages + key // PAGE)
    page = gl.minimum(gl.maximum(page, 0), pool_pages - 1)
    return page * PAGE + key % PAGE


# The consumers' hand-off barriers (`hand`), each completed once a pair of blocks.
MA_FULL: gl.constexpr = gl.constexpr(0)  # consumer 0 has put out m_a, the running max after block 2t
MB_FULL: gl.constexpr = gl.constexpr(1)  # consumer 1 has put out m_b, the running max after block 2t + 1
P0_FULL: gl.constexpr = gl.constexpr(2)  # P of block 2t (to m_b) is in p_smem
P0_FREE: gl.constexpr = gl.constexpr(3)  # consumer 1's P V of block 2t is done with p_smem
P1_FULL: gl.constexpr = gl.constexpr(4)  # P of block 2t + 1 is in qr_smem
P1_FREE: gl.constexpr = gl.constexpr(5)  # consumer 0's P V of block 2t + 1 is done with qr_smem
HANDS: gl.constexpr = gl.constexpr(6)


@gluon.jit
def _prefetch_l2(ptr, nbytes):
    """Lane 0 of the warp asks L2 for `nbytes` bytes from `ptr` (cp.async.bulk.prefetch.L2: no shared memory, no
    barrier), so that a later TMA load of them finds them there."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 lane; mov.u32 lane, %laneid; setp.eq.u32 p, lane, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptr, nbytes],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _producer(
    descs,
    smem,
    bars,
    Seqlens,
    Table,
    Cache,
    capacity,
    splits,
    ROWS,
    pool_pages,
    HAS_SEQLENS: gl.constexpr,
    PAGED: gl.constexpr,
    PAGE: gl.constexpr,
    PDL: gl.constexpr,
):
    """One warp: Q once, then the split's tiles in pairs, block 2t into stage 0 and 2t + 1 into stage 1, each tile
    as two halves that go back on their own: the left latent columns [0, D_V/2) (consumer 0's V) and the right
    ones with the rotary columns. The halves are loaded in the order the consumers release them. PDL: first, let
    the combine launched behind this kernel start (griddepcontrol.launch_dependents; it waits for this grid's end
    before it reads a partial)."""
    qd, qrd, kd, krd = descs
    q_smem, qr_smem, k_smem, kr_smem, _, _, _ = smem
    q_bar, full, empty, _, _ = bars
    if PDL:
        launch_dependents()
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HALF: gl.constexpr = kd.block_type.shape[1]
    b = gl.program_id(2)
    L, lo, hi = _split_keys(Seqlens, b, capacity, splits, BLOCK_N, HAS_SEQLENS)
    n = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)
    lo = gl.where(n > 0, lo, 0)  # a split with no keys still gets one block (fully masked; the cache's first)
    pairs = gl.cdiv(gl.maximum(n, 1), 2)
    q_row = b * ROWS + gl.program_id(0) * 64
    mbarrier.expect(q_bar, qd.block_type.nbytes + qrd.block_type.nbytes)
    tma.async_copy_global_to_shared(qd, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(qrd, [q_row, 0], q_bar, qr_smem)
    if PAGED:
        pages = Table + b.to(gl.int64) * (capacity // PAGE)
    else:
        row0 = b * capacity + lo
    D: gl.constexpr = 2 * HALF + krd.block_type.shape[1]
    for t in range(pairs):
        key = lo + 2 * t * BLOCK_N
        real_b = 2 * t + 1 < n  # block 2t + 1 is in the split (else the consumers mask all of it)
        if PAGED:
            row_a = _page_row(pages, key, pool_pages, PAGE)
            row_b = _page_row(pages, gl.where(real_b, key + BLOCK_N, key), pool_pages, PAGE)
        else:
            row_a = row0 + 2 * t * BLOCK_N
            row_b = row_a + BLOCK_N
        ph = (t & 1) ^ 1  # a fresh barrier passes a wait on parity 1: the first pair is free
        mbarrier.wait(empty.index(0), ph)
        mbarrier.expect(full.index(0), kd.block_type.nbytes)
        tma.async_copy_global_to_shared(kd, [row_a, 0], full.index(0), k_smem.index(0).slice(0, HALF, dim=1))
        if real_b:
            mbarrier.wait(empty.index(3), ph)
            mbarrier.expect(full.index(3), kd.block_type.nbytes + krd.block_type.nbytes)
            tma.async_copy_global_to_shared(
                kd, [row_b, HALF], full.index(3), k_smem.index(1).slice(HALF, HALF, dim=1)
            )
            tma.async_copy_global_to_shared(krd, [row_b, 0], full.index(3), kr_smem.index(1))
        mbarrier.wait(empty.index(1), ph)
        mbarrier.expect(full.index(1), kd.block_type.nbytes + krd.block_type.nbytes)
        tma.async_copy_global_to_shared(
            kd, [row_a, HALF], full.index(1), k_smem.index(0).slice(HALF, HALF, dim=1)
        )
        tma.async_copy_global_to_shared(krd, [row_a, 0], full.index(1), kr_smem.index(0))
        if real_b:
            mbarrier.wait(empty.index(2), ph)
            mbarrier.expect(full.index(2), kd.block_type.nbytes)
            tma.async_copy_global_to_shared(
                kd, [row_b, 0], full.index(2), k_smem.index(1).slice(0, HALF, dim=1)
            )
        # The next pair's blocks into L2, once this pair's loads are out (one row block asks for them): their loads
        # then find them there, as those of the other row blocks that share the tiles do (1.06-1.10x at Nq = 1,
        # 1.06-1.09x at Nq = 2 on an H100; two pairs ahead, at the top of this pair's loads, 0.94-1.00x at Nq = 1).
        if gl.program_id(0) == 0:
            for i in gl.static_range(2):
                nxt = 2 * t + 2 + i
                if nxt < n:
                    if PAGED:
                        row = _page_row(pages, key + (2 + i) * BLOCK_N, pool_pages, PAGE)
                    else:
                        row = row0 + nxt * BLOCK_N
                    # only the block's keys below the split's end: a contiguous cache's last block may end
                    # past the tensor (TMA loads are bounds-checked, a bulk prefetch is not documented so)
                    keys = gl.minimum(hi - (lo + nxt * BLOCK_N), BLOCK_N)
                    _prefetch_l2(Cache + row.to(gl.int64) * D, keys * D * 2)


@gluon.jit
def _zero_rows(tile, valid, WG: gl.constexpr, D_HALF: gl.constexpr):
    """Rows >= valid of this consumer's V columns [WG * D_HALF, +D_HALF) of a cache tile set to 0, 64 columns at
    a time (16 values a thread), then fenced for the wgmma that reads them."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, tile.shape[0], gl.SliceLayout(1, layout))
    for c in gl.static_range(D_HALF // 64):
        part = tile.slice(WG * D_HALF + c * 64, 64, dim=1)
        x = part.load(layout)
        part.store(gl.where(rows[:, None] < valid, x, gl.zeros_like(x)))
    fence_async_shared()


@gluon.jit
def _setup(
    Seqlens, capacity, splits, Nq, BLOCK_N: gl.constexpr, HAS_SEQLENS: gl.constexpr, CAUSAL: gl.constexpr
):
    """What both consumers start from: (lo, hi, pairs, n_eff, the last key each row sees): the split's keys
    [lo, hi), its blocks n_eff (at least 1: a split with no keys gets one fully masked) in pairs."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    b = gl.program_id(2)
    L, lo, hi = _split_keys(Seqlens, b, capacity, splits, BLOCK_N, HAS_SEQLENS)
    n_eff = gl.maximum(gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N), 1)
    last = _last_keys(gl.program_id(0) * 64, L, hi, Nq, CAUSAL, row_s)
    return lo, hi, gl.cdiv(n_eff, 2), n_eff, last


@gluon.jit
def _last_keys(first_row, L, hi, Nq, CAUSAL: gl.constexpr, row_layout: gl.constexpr):
    """The last key each of the 64 rows from `first_row` sees in a split ending at `hi` of a sequence of L keys
    (bottom-right causal alignment; row r = h * Nq + i: query head h, query i), in `row_layout`."""
    if CAUSAL:
        rows = first_row + gl.arange(0, 64, row_layout)
        return gl.minimum(L - Nq + rows % Nq, hi - 1)
    return gl.zeros([64], gl.int32, row_layout) + (hi - 1)


@gluon.jit
def _consumer0(
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
    D_V: gl.constexpr,
    HAS_SEQLENS: gl.constexpr,
    CAUSAL: gl.constexpr,
    DIRECT: gl.constexpr,
):
    """Consumer 0: S of the even blocks 2t (64 x 64, Q read once a tile), its softmax against the running max,
    P V of O's columns [0, D_V/2) with P from registers; then P to consumer 1's max m_b into p_smem, and P of
    block 2t + 1 (consumer 1's, from qr_smem) times V on the same columns."""
    q_smem, qr_smem, k_smem, kr_smem, p_smem, mx, m_smem = smem
    q_bar, full, empty, max_bar, hand = bars
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    D_HALF: gl.constexpr = D_V // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D_HALF, 16]
    )
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    lo, hi, pairs, n_eff, last = _setup(Seqlens, capacity, splits, Nq, BLOCK_N, HAS_SEQLENS, CAUSAL)
    m_i = gl.full([64], -1.0e30, gl.float32, row_s)  # finite: a row that sees no key gets no exp2(-inf + inf)
    l_i = gl.zeros([64], gl.float32, row_s)
    acc = gl.zeros([64, D_HALF], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)
    q_rope = qr_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    gl.thread_barrier()
    mbarrier.arrive(hand.index(P1_FREE))  # qr_smem may take consumer 1's P now
    for t in range(pairs):
        ph = t & 1
        # stage 0 and 1, written so that the compiler cannot hoist the descriptors of every wgmma out of the loop
        # (loop-invariant, they spill: 63 registers)
        st0 = (t >> 30) & 1
        st1 = st0 + 1
        q = q_smem.index(st0)
        start = lo + 2 * t * BLOCK_N
        mbarrier.wait(full.index(0), ph)
        s = warpgroup_mma(
            q.slice(0, D_HALF, dim=1),
            k_smem.index(st0).slice(0, D_HALF, dim=1).permute((1, 0)),
            gl.zeros([64, BLOCK_N], gl.float32, s_layout),  # made here: held across the loop, 32 registers
            use_acc=False,
            is_async=True,
        )
        # the P V of the pair before's block 2t - 1 (waited for at its end, so this waits for nothing): qr_smem and
        # that tile's left half go back
        acc = warpgroup_mma_wait(1, deps=[acc])
        if t > 0:
            mbarrier.arrive(hand.index(P1_FREE))
            mbarrier.arrive(empty.index(2))
        mbarrier.wait(full.index(1), ph)
        s = warpgroup_mma(
            q.slice(D_HALF, D_HALF, dim=1),
            k_smem.index(st0).slice(D_HALF, D_HALF, dim=1).permute((1, 0)),
            s,
            is_async=True,
        )
        s = warpgroup_mma(q_rope, kr_smem.index(st0).permute((1, 0)), s, is_async=True)
        s, q_rope = warpgroup_mma_wait(0, deps=[s, q_rope])
        cols = start + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= last[:, None], s * qk_scale, float("-inf"))
        m_a = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_a)
        p = gl.exp2(s - m_a[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_smem[0].store(m_a)
        gl.thread_barrier()
        mbarrier.arrive(hand.index(MA_FULL))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        if hi - start < BLOCK_N:  # a partial last block: its unused rows of V may hold anything
            _zero_rows(k_smem.index(st0), hi - start, 0, D_HALF)
            gl.thread_barrier()
        p_op = gl.convert_layout(
            p.to(q_smem.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        )
        acc = warpgroup_mma(p_op, k_smem.index(st0).slice(0, D_HALF, dim=1), acc, is_async=True)
        mbarrier.wait(hand.index(MB_FULL), ph)
        m_b = m_smem[1].load(row_s)
        beta = gl.exp2(m_a - m_b)
        mbarrier.wait(hand.index(P0_FREE), ph ^ 1)
        p_smem.store((p * beta[:, None]).to(p_smem.dtype))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(hand.index(P0_FULL))
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        mbarrier.arrive(empty.index(0))  # block 2t's left half: its S and this P V are done with it
        acc = acc * gl.convert_layout(beta, row_o)[:, None]
        l_i = l_i * beta
        m_i = m_b
        mbarrier.wait(hand.index(P1_FULL), ph)
        # block 2t + 1's TMA writes seen by this warpgroup too (unless it is past the last: never loaded)
        if 2 * t + 1 < n_eff:
            mbarrier.wait(full.index(2), ph)
        if hi - start - BLOCK_N < BLOCK_N:
            _zero_rows(k_smem.index(st1), hi - start - BLOCK_N, 0, D_HALF)
            gl.thread_barrier()
        acc = warpgroup_mma(qr_smem, k_smem.index(st1).slice(0, D_HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
    acc = warpgroup_mma_wait(0, deps=[acc])
    _store_out(acc, m_i, l_i, mx, max_bar, 0, Out, Part, Lse, splits, ROWS, 0, D_V, DIRECT)


@gluon.jit
def _consumer1(
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
    D_V: gl.constexpr,
    HAS_SEQLENS: gl.constexpr,
    CAUSAL: gl.constexpr,
    DIRECT: gl.constexpr,
):
    """Consumer 1: S of the odd blocks 2t + 1, its softmax against consumer 0's m_a, P V of O's columns
    [D_V/2, D_V) with P from registers, P into qr_smem for consumer 0; then block 2t's P (p_smem) times V on the
    same columns."""
    q_smem, qr_smem, k_smem, kr_smem, p_smem, mx, m_smem = smem
    q_bar, full, empty, max_bar, hand = bars
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    D_HALF: gl.constexpr = D_V // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D_HALF, 16]
    )
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    lo, hi, pairs, n_eff, last = _setup(Seqlens, capacity, splits, Nq, BLOCK_N, HAS_SEQLENS, CAUSAL)
    m_i = gl.full([64], -1.0e30, gl.float32, row_s)
    l_i = gl.zeros([64], gl.float32, row_s)
    acc = gl.zeros([64, D_HALF], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)
    q_rope = qr_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    gl.thread_barrier()  # all of this warpgroup's rotary Q read before its P overwrites qr_smem
    for t in range(pairs):
        ph = t & 1
        # stage 0 and 1, written so that the compiler cannot hoist the descriptors of every wgmma out of the loop
        # (loop-invariant, they spill: 63 registers)
        st0 = (t >> 30) & 1
        st1 = st0 + 1
        q = q_smem.index(st0)
        start = lo + (2 * t + 1) * BLOCK_N
        # else a block past the last: never loaded, S reads a stale stage, all masked
        real = 2 * t + 1 < n_eff
        # the P V of the pair before's block 2t - 2 done: p_smem and that tile's right half go back
        acc = warpgroup_mma_wait(0, deps=[acc])
        if t > 0:
            mbarrier.arrive(hand.index(P0_FREE))
            mbarrier.arrive(empty.index(1))
        if real:
            mbarrier.wait(full.index(2), ph)
        s = warpgroup_mma(
            q.slice(0, D_HALF, dim=1),
            k_smem.index(st1).slice(0, D_HALF, dim=1).permute((1, 0)),
            gl.zeros([64, BLOCK_N], gl.float32, s_layout),  # made here: held across the loop, 32 registers
            use_acc=False,
            is_async=True,
        )
        if real:
            mbarrier.wait(full.index(3), ph)
        s = warpgroup_mma(
            q.slice(D_HALF, D_HALF, dim=1),
            k_smem.index(st1).slice(D_HALF, D_HALF, dim=1).permute((1, 0)),
            s,
            is_async=True,
        )
        s = warpgroup_mma(q_rope, kr_smem.index(st1).permute((1, 0)), s, is_async=True)
        mbarrier.wait(hand.index(MA_FULL), ph)
        m_a = m_smem[0].load(row_s)
        s, q_rope = warpgroup_mma_wait(0, deps=[s, q_rope])
        cols = start + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= last[:, None], s * qk_scale, float("-inf"))
        m_b = gl.maximum(m_a, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_b)
        p = gl.exp2(s - m_b[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_b
        m_smem[1].store(m_b)
        gl.thread_barrier()
        mbarrier.arrive(hand.index(MB_FULL))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p16 = p.to(qr_smem.dtype)
        mbarrier.wait(hand.index(P1_FREE), ph)
        qr_smem.store(p16)
        if hi - start < BLOCK_N:  # a partial last block (or one past it): rows of V that may hold anything
            _zero_rows(k_smem.index(st1), hi - start, 1, D_HALF)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(hand.index(P1_FULL))
        p_op = gl.convert_layout(p16, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        acc = warpgroup_mma(p_op, k_smem.index(st1).slice(D_HALF, D_HALF, dim=1), acc, is_async=True)
        mbarrier.wait(hand.index(P0_FULL), ph)
        mbarrier.wait(full.index(1), ph)  # block 2t's TMA writes seen by this warpgroup too
        if hi - start + BLOCK_N < BLOCK_N:  # block 2t is a partial last block
            _zero_rows(k_smem.index(st0), hi - start + BLOCK_N, 1, D_HALF)
            gl.thread_barrier()
        acc = warpgroup_mma(p_smem, k_smem.index(st0).slice(D_HALF, D_HALF, dim=1), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        mbarrier.arrive(empty.index(3))  # block 2t + 1's right half: its S and this P V are done with it
    acc = warpgroup_mma_wait(0, deps=[acc])
    _store_out(acc, m_i, l_i, mx, max_bar, 0, Out, Part, Lse, splits, ROWS, 1, D_V, DIRECT)


@gluon.jit
def _store_out(acc, m_i, l_i, mx, max_bar, phase, Out, Part, Lse, splits, ROWS, WG: gl.constexpr,
               D_V: gl.constexpr, DIRECT: gl.constexpr):  # fmt: skip
    """Both consumers' row sums added through mx (m is the same in both; `phase`: max_bar's next one), then this
    consumer's O columns [WG D_V/2, +D_V/2) normalised: Out (DIRECT), or decode.py's partials and, from consumer 0,
    their lse."""
    D_HALF: gl.constexpr = D_V // 2
    o_layout: gl.constexpr = acc.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    mx[WG].store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(max_bar)
    mbarrier.wait(max_bar, phase)
    l_i = l_i + mx[1 - WG].load(l_i.type.layout)
    b = gl.program_id(2)
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    seen = l_i > 0.0
    o = acc / gl.convert_layout(gl.where(seen, l_i, 1.0), row_o)[:, None]
    r = pid_m * 64 + gl.arange(0, 64, row_o)
    c = WG * D_HALF + gl.arange(0, D_HALF, gl.SliceLayout(0, o_layout))
    keep = (r < ROWS)[:, None]
    if DIRECT:
        ptrs = Out + (b.to(gl.int64) * ROWS + r)[:, None] * D_V + c[None, :]
        gl.store(ptrs, o.to(Out.dtype.element_ty), mask=keep)
    else:
        part = (b.to(gl.int64) * splits + pid_s) * ROWS + r
        gl.store(Part + part[:, None] * D_V + c[None, :], o, mask=keep)
        if WG == 0:
            rows = pid_m * 64 + gl.arange(0, 64, m_i.type.layout)
            lse = gl.where(seen, m_i + gl.log2(gl.where(seen, l_i, 1.0)), float("-inf"))
            part_s = (b.to(gl.int64) * splits + pid_s) * ROWS + rows
            gl.store(Lse + part_s, lse, mask=rows < ROWS)


@gluon.jit
def _mla_decode_ws(
    qd,  # descriptor of q's latent columns, q viewed as [B * H * Nq, D], block [64, D_V]
    qrd,  # ... of its rotary columns [.., D_V:], block [64, D - D_V]
    kd,  # descriptor of the cache's latent columns, block [BLOCK_N, D_V / 2] (a tile goes in two halves): the
    #      contiguous cache viewed as [B * capacity, D], or the page pool as [pool_pages * PAGE, D]
    krd,  # ... of its rotary columns, block [BLOCK_N, D - D_V]
    Seqlens,  # [B] int32 keys per sequence (read when HAS_SEQLENS)
    Out,  # [B, H, Nq, D_V] output, contiguous
    Part,  # fp32 partial outputs [B, splits, ROWS, D_V] (not DIRECT)
    Lse,  # fp32 their log2-sum-exps [B, splits, ROWS] (not DIRECT)
    qk_scale,  # sm_scale * log2(e)
    capacity,  # keys the cache holds per sequence
    splits,  # key splits per sequence (grid axis 1)
    ROWS,  # H * Nq query rows per sequence
    Nq,
    Table,  # [B, capacity / PAGE] int32 page table, contiguous (read when PAGED)
    pool_pages,  # pages in the pool (PAGED)
    Cache,  # the cache (or pool) itself, for the producer's L2 prefetches
    D_V: gl.constexpr,  # latent dims: V and the output
    PAGED: gl.constexpr,  # a page pool and Table, not a contiguous cache
    PAGE: gl.constexpr,  # tokens per page (PAGED): a multiple of BLOCK_N
    HAS_SEQLENS: gl.constexpr,
    CAUSAL: gl.constexpr,
    DIRECT: gl.constexpr,  # one split: normalise and write Out
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    PDL: gl.constexpr,  # the combine behind it is a programmatic dependent launch (mla_ws.PDL): let it start
):
    """One program per (64-row block, key split, sequence): grid (row blocks, splits, B). Shared memory: Q [64,
    D_V] and its rotary columns (then consumer 1's P), two cache stages [64, D_V] + [64, rotary], consumer 0's P
    [64, 64]; a full and an empty barrier per half tile."""
    D_ROPE: gl.constexpr = qrd.block_type.shape[1]
    BLOCK_N: gl.constexpr = krd.block_type.shape[0]
    gl.static_assert(D_ROPE == BLOCK_N, "consumer 1's P [64, BLOCK_N] takes the place of Q's rotary columns")
    # [1, 64, D_V]: the consumers index it in the loop, so that the descriptors of S's wgmmas are not hoisted
    q_smem = gl.allocate_shared_memory(qd.dtype, [1, 64, D_V], qd.layout)
    qr_smem = gl.allocate_shared_memory(qd.dtype, [64, D_ROPE], qrd.layout)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], kd.dtype)
    k_smem = gl.allocate_shared_memory(kd.dtype, [2, BLOCK_N, D_V], k_layout)
    kr_smem = gl.allocate_shared_memory(kd.dtype, [2, BLOCK_N, D_ROPE], krd.layout)
    p_smem = gl.allocate_shared_memory(qd.dtype, [64, BLOCK_N], qrd.layout)
    row_smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    mx = (
        gl.allocate_shared_memory(gl.float32, [64], row_smem),
        gl.allocate_shared_memory(gl.float32, [64], row_smem),
    )
    m_smem = (  # m_a, then m_b: the running max after each block of a pair
        gl.allocate_shared_memory(gl.float32, [64], row_smem),
        gl.allocate_shared_memory(gl.float32, [64], row_smem),
    )
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # 2 x stage + half
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    max_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    hand = gl.allocate_shared_memory(gl.int64, [HANDS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(4):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)  # each half goes back from one consumer
    for i in gl.static_range(HANDS):
        mbarrier.init(hand.index(i), count=1)
    mbarrier.init(max_bar, count=2)
    fence_async_shared()

    descs = (qd, qrd, kd, krd)
    smem = (q_smem, qr_smem, k_smem, kr_smem, p_smem, mx, m_smem)
    bars = (q_bar, full, empty, max_bar, hand)
    gl.warp_specialize(
        [
            (_consumer0, (smem, bars, Seqlens, Out, Part, Lse, qk_scale, capacity, splits, ROWS, Nq, D_V,
                        HAS_SEQLENS, CAUSAL, DIRECT)),
            (_consumer1, (smem, bars, Seqlens, Out, Part, Lse, qk_scale, capacity, splits, ROWS, Nq, D_V,
                        HAS_SEQLENS, CAUSAL, DIRECT)),
            (_producer, (descs, smem, bars, Seqlens, Table, Cache, capacity, splits, ROWS, pool_pages,
                         HAS_SEQLENS, PAGED, PAGE, PDL)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip

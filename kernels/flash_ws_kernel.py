"""The Gluon kernel of flash_ws.py (FlashAttention-3's forward for Hopper): its partitions and their schedule.

gl.warp_specialize runs the consumers (two or three warpgroups, 64 query rows each; consumer 0 is the default
partition) beside one producer warp (flash_ws_parts.load_partition). They share three tuples (VARLEN: four), built
once per program:
  smem  = (q_smem, o_smem, k_smem, v_smem): the query slices [NUM_WG, 64, D]; the output slices (q_smem itself
          unless SEP_O; [NUM_WG, 64, D / 2] where od's box is half as wide: flash_ws.o_cols); the K and V ring
          [STAGES, BLOCK_N, D];
  bars  = (q_bar, q_empty, k_bars, v_bars, empty_bars, turns): the query slices have landed; every consumer is
          done with them; K / V of ring stage s has landed; every consumer has released K (empty_bars[s]) or
          V (empty_bars[STAGES + s]) of stage s; consumer w may issue its matmuls (turns[w]);
  sched = (num_m, BH, H, GROUP, N_Q, N_K, WIN_LEFT, TILES, ROUNDS): what tile() (flash_ws_parts.py) needs to
          place a tile and bound its keys, and the persistent programs' schedule table (ROUNDS = 0: none).
and, VARLEN (varlen_ws.py), docs = (CU_Q, CU_K, NUM_DOCS, O, COUNTER, slot): the documents' prefix sums, O for
the masked store of a tile that starts in the previous document, and the persistent walk's counter and the
shared-memory slot through which its producer hands the consumers their tiles.
The tile sizes (NUM_WG, ROWS, HEAD_DIM, STAGES, BLOCK_N) are read from the buffers' shapes, and FP8 mode from
their dtype: e4m3 Q, K and V^T (flash_ws_parts.py's docstring), descales, bf16 O in its own buffers.
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

from .flash_ws_parts import (
    WALK,
    _unhalves,
    document_tile,
    live_tiles,
    load_partition,
    mma_layout,
    p_layout_of,
    p_operand,
    pv_wait,
    round_tile,
    rounds,
    softmax,
    take_tile,
    tile,
    tile_scales,
    v_operand,
)


@gluon.jit
def _consumer_step(
    g,  # the key block's number over the program's tiles (not the tile's first)
    start_n,  # its first key in the tile's head
    acc,  # [64, HEAD_DIM] fp32 accumulator, owing the previous block's P V
    p,  # the previous block's P: dot operand A (FP8: fp32 scores' layout, p_operand)
    m_i,
    l_i,
    q,  # this warpgroup's query slice in shared memory
    smem,
    bars,
    my_turn,
    next_turn,
    s_zero,  # [64, BLOCK_N] fp32 zeros in the score layout
    rows,  # [64] query rows
    causal_off,
    left_off,
    qk_scale,
    MASK: gl.constexpr,
    FLIP: gl.constexpr,  # 1 for consumer 0 (its first turn is free)
    WINDOW: gl.constexpr,
    P_SHIFT: gl.constexpr,
    VARLEN: gl.constexpr = False,
    KEY_END: gl.constexpr = False,
    key_end=0,
    FAST_MASK: gl.constexpr = False,
    EXP_POLY: gl.constexpr = False,
    SUM_MMA: gl.constexpr = False,
    LOOP_FIRST: gl.constexpr = False,
    g_first=0,
):
    """Key block g: issue S_g and P_{g-1} V_{g-1}, softmax S_g while the second matmul runs (ptxas (CUDA 12.8)
    moves the wait for P_{g-1} V_{g-1} up above the softmax: the ping-pong between warpgroups is the overlap).
    FP8's wide key tiles (flash_ws.FP8_WIDE_N: BLOCK_N + HEAD_DIM = 384) carry P in fp32 (BLOCK_N / 2 registers a
    thread): beside S_g's scores in flight (BLOCK_N / 2) and O (HEAD_DIM / 2) it overflows a consumer's 240
    registers (304-466 spill stores, every wgmma serialized). At d = 256 (128 keys) P is converted to e4m3
    (BLOCK_N / 8) before S_g's issue, and S_g still overlaps P_{g-1} V_{g-1} (P_EARLY: 208 registers; no spill
    without a mask, 8 stores causal); at d = 128 (256 keys) that is 224, which spilled 62 stores, so P_{g-1} V_{g-1}
    is issued first and S_g behind it in two halves of its keys, the second once P V is done (PV_FIRST,
    _pv_then_s_halves: no spill). SUM_MMA: P's row sums come from a matmul beside
    P V (_pv_done), not from the softmax. LOOP_FIRST: the tile's first block g_first runs this step too,
    its P V one of zeros (p) on V_g itself, which it waits for and leaves held for block g's own P V next step."""
    _, _, k_smem, v_smem, ones = smem
    _, _, k_bars, v_bars, empty_bars, _ = bars
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    s_idx = g % STAGES
    prev = (g - 1) % STAGES
    WIDE: gl.constexpr = q.dtype.is_fp8() and BLOCK_N + acc.shape[1] >= 384
    PV_FIRST: gl.constexpr = WIDE and BLOCK_N > acc.shape[1]
    P_EARLY: gl.constexpr = WIDE and not PV_FIRST
    if PV_FIRST:
        pa = p_operand(p, gl.constexpr(acc.type.layout), gl.constexpr(q.dtype))
        mbarrier.wait(my_turn, (g & 1) ^ FLIP)
        pv_g = g - 1
        release = True
        if LOOP_FIRST:  # the tile's first block: P (zeros) times its own V, left held
            first_g = (g == g_first).to(gl.int32)
            pv_g = g - 1 + first_g
            release = first_g == 0
        acc, l_i, s = _pv_then_s_halves(
            acc, l_i, pa, q, smem, bars, next_turn, pv_g, g, s_zero, SUM_MMA, release
        )
    else:
        if P_EARLY:
            pa = p_operand(p, gl.constexpr(acc.type.layout), gl.constexpr(q.dtype))
        mbarrier.wait(my_turn, (g & 1) ^ FLIP)
        mbarrier.wait(k_bars.index(s_idx), (g // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        pv_g = g - 1
        if LOOP_FIRST:  # the tile's first block: P (zeros) times its own V
            pv_g = g - 1 + (g == g_first).to(gl.int32)
            prev = pv_g % STAGES
        mbarrier.wait(v_bars.index(prev), (pv_g // STAGES) & 1)
        if not P_EARLY:
            pa = p_operand(p, gl.constexpr(acc.type.layout), gl.constexpr(q.dtype))
        acc = warpgroup_mma(pa, v_operand(v_smem, prev), acc, is_async=True)
        sums = _issue_sums(pa, ones) if SUM_MMA else acc
        mbarrier.arrive(next_turn)
        # in-order completion: S_g is done, P_{g-1} V_{g-1} (and its sums) may not be
        s = warpgroup_mma_wait(2 if SUM_MMA else 1, deps=[s])
    mbarrier.arrive(empty_bars.index(s_idx))  # K_g is no longer read
    p_new, alpha, l_i, m_i = softmax(
        s=s,
        m_i=m_i,
        l_i=l_i,
        rows=rows,
        start_n=start_n,
        causal_off=causal_off,
        left_off=left_off,
        qk_scale=qk_scale,
        MASK=MASK,
        BLOCK_N=BLOCK_N,
        WINDOW=WINDOW,
        P_SHIFT=P_SHIFT,
        VARLEN=VARLEN,
        KEY_END=KEY_END,
        key_end=key_end,
        FAST_MASK=FAST_MASK,
        EXP_POLY=EXP_POLY,
        SUM_MMA=SUM_MMA,
    )
    if not PV_FIRST:  # P_{g-1}'s sums (SUM_MMA), at block g-1's max: rescaled as O is
        acc, l_i = _pv_wait(acc, pa, sums, l_i, alpha, SUM_MMA)
        # V_{g-1} is no longer read (LOOP_FIRST: the tile's first block's own V stays held)
        mbarrier.arrive(empty_bars.index(STAGES + prev), pred=g != g_first if LOOP_FIRST else True)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    if q.dtype.is_fp8():
        p = p_new
    else:
        p = gl.convert_layout(p_new.to(q.dtype), p.type.layout)
    return acc, p, m_i, l_i


@gluon.jit
def _pv_then_s_halves(
    acc, l_i, pa, q, smem, bars, next_turn, pv_g, g, s_zero, SUM_MMA: gl.constexpr, release
):
    """PV_FIRST's matmuls: P_{pv_g} V_{pv_g} (and its sums under SUM_MMA) issued, S_g's second half of keys behind
    it (64 registers beside O's 64 and P's 32), and once P V is done, its P's registers free, the first half. The
    tensor pipe runs the three back to back, where a whole S_g issued after P V's wait left it idle through the
    wait and the issue (0.98-0.99x the time: docs/kernels.md, the FP8 forward). The second half goes first so that
    ptxas keeps the halves in the registers of the whole tile's order (the first half first: 168 spill stores).
    Returns (acc, l_i, S_g), S_g done, the turn passed on and V_{pv_g} released where `release` holds."""
    _, _, k_smem, v_smem, ones = smem
    _, _, k_bars, v_bars, empty_bars, _ = bars
    STAGES: gl.constexpr = k_smem.shape[0]
    HALF: gl.constexpr = k_smem.shape[1] // 2
    acc, sums = _issue_pv(acc, pa, v_smem, ones, v_bars, pv_g, SUM_MMA)
    k = k_smem.index(g % STAGES)
    half_zero = gl.zeros([s_zero.shape[0], HALF], gl.float32, mma_layout(HALF, 8))
    mbarrier.wait(k_bars.index(g % STAGES), (g // STAGES) & 1)
    s_b = warpgroup_mma(q, k.slice(HALF, HALF).permute((1, 0)), half_zero, use_acc=False, is_async=True)
    # in-order completion: P V and its sums are done, S_g's second half may not be
    acc, l_i = _pv_wait(acc, pa, sums, l_i, 1.0, SUM_MMA, 1)
    mbarrier.arrive(empty_bars.index(STAGES + pv_g % STAGES), pred=release)
    s_a = warpgroup_mma(q, k.slice(0, HALF).permute((1, 0)), half_zero, use_acc=False, is_async=True)
    mbarrier.arrive(next_turn)
    s_a, s_b = warpgroup_mma_wait(0, deps=[s_a, s_b])
    return acc, l_i, gl.convert_layout(_unhalves(s_a, s_b), s_zero.type.layout, assert_trivial=True)


@gluon.jit
def _pv_done(acc, l_i, pa, v_smem, ones, v_bars, empty_bars, g, SUM_MMA: gl.constexpr, release=True):
    """P V of the program's key block g (pa: P as P V's A operand) issued once V_g has landed and waited for, V_g's
    stage then released (where release holds); returns (acc, l_i), with P's row sums added to l_i under SUM_MMA."""
    STAGES: gl.constexpr = v_bars.shape[0]
    acc, sums = _issue_pv(acc, pa, v_smem, ones, v_bars, g, SUM_MMA)
    acc, l_i = _pv_wait(acc, pa, sums, l_i, 1.0, SUM_MMA)
    mbarrier.arrive(empty_bars.index(STAGES + g % STAGES), pred=release)
    return acc, l_i


@gluon.jit
def _issue_pv(acc, pa, v_smem, ones, v_bars, g, SUM_MMA: gl.constexpr):
    """P V of the program's key block g issued once V_g has landed, and under SUM_MMA its row sums behind it;
    returns (acc, sums) in flight (sums is acc without SUM_MMA)."""
    STAGES: gl.constexpr = v_bars.shape[0]
    mbarrier.wait(v_bars.index(g % STAGES), (g // STAGES) & 1)
    acc = warpgroup_mma(pa, v_operand(v_smem, g % STAGES), acc, is_async=True)
    sums = _issue_sums(pa, ones) if SUM_MMA else acc
    return acc, sums


@gluon.jit
def _pv_wait(acc, pa, sums, l_i, scale, SUM_MMA: gl.constexpr, PENDING: gl.constexpr = 0):
    """Waits for P V in flight (acc), all but the last PENDING matmuls issued after it, and returns (acc, l_i);
    under SUM_MMA for its row sums too (sums, in flight behind it: _issue_sums), added to l_i times scale (the
    softmax's alpha when a newer block's max has moved). Without SUM_MMA, sums is unused."""
    if SUM_MMA:
        acc, sums = warpgroup_mma_wait(PENDING, deps=[acc, sums])
        l_i = l_i + _row_sums(sums, l_i) * scale
    else:
        acc = pv_wait(acc, pa, PENDING)
    return acc, l_i


@gluon.jit
def _e4m3_ones(ROWS: gl.constexpr, COLS: gl.constexpr):
    """A tile of e4m3 1.0, written as its bits (0x38): Triton 3.6 converts a constant fp32 1.0 tile with one
    F2FP...PACK_AB_MERGE_C per register, which fills two of its four bytes and takes the other two from a register
    never set."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    return gl.full([ROWS, COLS], 0x38, gl.int8, layout).to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _issue_sums(pa, ones):
    """P @ ones issued (SUM_MMA), into a fresh [64, 8] fp32 accumulator (wgmma's narrowest N) for the e4m3 P
    operand pa: every column of it is P's row sums (_row_sums)."""
    zero = gl.zeros([pa.shape[0], 8], gl.float32, mma_layout(8, 8))
    return warpgroup_mma(pa, ones.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _row_sums(sums, like):
    """The row sums of P from P @ ones (every column holds them), in the layout of the row vector `like`."""
    return gl.convert_layout(gl.max(sums, axis=1), like.type.layout)


@gluon.jit
def _steps(
    lo,
    hi,
    g0,  # the program's key block of the tile's block 0 (block j is g0 + j)
    state,  # (acc, p, m_i, l_i) before block lo
    ops,  # the tile's loop-invariant operands: (q, smem, bars, my_turn, next_turn, s_zero, rows, qk_scale)
    FLIP: gl.constexpr,
    P_SHIFT: gl.constexpr,
    EXP_POLY: gl.constexpr,
    MASK: gl.constexpr = False,
    causal_off=0,
    left_off=0,
    WINDOW: gl.constexpr = False,
    VARLEN: gl.constexpr = False,
    KEY_END: gl.constexpr = False,
    key_end=0,
    FAST_MASK: gl.constexpr = False,
    SUM_MMA: gl.constexpr = False,
    LOOP_FIRST: gl.constexpr = False,
    g_first=0,
):
    """The tile's key blocks [lo, hi): _consumer_step on each, unmasked (the blocks every row sees whole) or
    masked (MASK: the causal diagonal, a window's left edge, a document's key end: _consumer_step's masks);
    returns (acc, p, m_i, l_i) after block hi - 1. LOOP_FIRST: the program's key block g_first is the tile's
    first (_consumer_step)."""
    acc, p, m_i, l_i = state
    q, smem, bars, my_turn, next_turn, s_zero, rows, qk_scale = ops
    BLOCK_N: gl.constexpr = s_zero.shape[1]
    for j in range(lo, hi):
        acc, p, m_i, l_i = _consumer_step(
            g=g0 + j,
            start_n=j * BLOCK_N,
            acc=acc,
            p=p,
            m_i=m_i,
            l_i=l_i,
            q=q,
            smem=smem,
            bars=bars,
            my_turn=my_turn,
            next_turn=next_turn,
            s_zero=s_zero,
            rows=rows,
            causal_off=causal_off,
            left_off=left_off,
            qk_scale=qk_scale,
            MASK=MASK,
            FLIP=FLIP,
            WINDOW=WINDOW,
            P_SHIFT=P_SHIFT,
            VARLEN=VARLEN,
            KEY_END=KEY_END,
            key_end=key_end,
            FAST_MASK=FAST_MASK,
            EXP_POLY=EXP_POLY,
            SUM_MMA=SUM_MMA,
            LOOP_FIRST=LOOP_FIRST,
            g_first=g_first,
        )
    return acc, p, m_i, l_i


@gluon.jit
def _pass_block(g, bars, my_turn, next_turn, FLIP: gl.constexpr):
    """Key block g without its matmuls (every score of it masked for this warpgroup): its turn passed on, its K
    and V released once they have landed (released earlier, the arrival would count toward the stage's last
    phase)."""
    _, _, k_bars, v_bars, empty_bars, _ = bars
    STAGES: gl.constexpr = k_bars.shape[0]
    mbarrier.wait(my_turn, (g & 1) ^ FLIP)
    mbarrier.arrive(next_turn)
    mbarrier.wait(k_bars.index(g % STAGES), (g // STAGES) & 1)
    mbarrier.arrive(empty_bars.index(g % STAGES))
    mbarrier.wait(v_bars.index(g % STAGES), (g // STAGES) & 1)
    mbarrier.arrive(empty_bars.index(STAGES + g % STAGES))


@gluon.jit
def _issue_s(q, k_smem, k_bars, my_turn, next_turn, g, s_zero, FLIP: gl.constexpr, kg=-1):
    """Key block g's S = Q K^T issued on this warpgroup's turn, once K has landed; returns S in flight (the turn
    passed on). kg >= 0: the program's key block kg's K instead (_lead_tile's stand-in S on block g's turn)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    if kg < 0:
        kg = g
    mbarrier.wait(my_turn, (g & 1) ^ FLIP)
    mbarrier.wait(k_bars.index(kg % STAGES), (kg // STAGES) & 1)
    s = warpgroup_mma(q, k_smem.index(kg % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.arrive(next_turn)
    return s


@gluon.jit
def _first_softmax(
    s,  # the tile's first S in flight (_issue_s), key block g of the program
    g,
    empty_bars,
    m_i,
    l_i,
    rows,
    start_n,
    causal_off,
    left_off,
    qk_scale,
    dtype: gl.constexpr,  # Q's
    p_layout: gl.constexpr,  # P V's A operand layout (16-bit inputs)
    MASK: gl.constexpr,
    WINDOW: gl.constexpr,
    P_SHIFT: gl.constexpr,
    VARLEN: gl.constexpr,
    KEY_END: gl.constexpr,
    key_end,
    FAST_MASK: gl.constexpr,
    EXP_POLY: gl.constexpr,
    SUM_MMA: gl.constexpr = False,
):
    """A tile's first block once its S has landed: K released, the softmax; returns (P, m, l). Its P V is
    issued in the next step (_consumer_step) or as the tile's last."""
    STAGES: gl.constexpr = empty_bars.shape[0] // 2
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(empty_bars.index(g % STAGES))
    p_new, alpha, l_i, m_i = softmax(
        s=s,
        m_i=m_i,
        l_i=l_i,
        rows=rows,
        start_n=start_n,
        causal_off=causal_off,
        left_off=left_off,
        qk_scale=qk_scale,
        MASK=MASK,
        BLOCK_N=s.shape[1],
        WINDOW=WINDOW,
        P_SHIFT=P_SHIFT,
        VARLEN=VARLEN,
        KEY_END=KEY_END,
        key_end=key_end,
        FAST_MASK=FAST_MASK,
        EXP_POLY=EXP_POLY,
        SUM_MMA=SUM_MMA,
    )
    if dtype.is_fp8():  # FP8 carries P in fp32 (p_operand converts it)
        p = p_new
    else:
        p = gl.convert_layout(p_new.to(dtype), p_layout)
    return p, m_i, l_i


@gluon.jit
def _consumer(
    parts,  # the kernel's (smem, bars, od, LSE, sched, scales, docs), below
    WG: gl.constexpr,  # this consumer's warpgroup
    modes,  # the kernel's (CAUSAL, SCHED_HEADS, SEP_O, WINDOW, VARLEN, EXP_POLY, SUM_MMA, Q2, LOOP_FIRST,
    # FAST_MASK), constexprs
):
    """Consumer warpgroup WG: rows [WG * 64, WG * 64 + 64) of each of the program's query tiles."""
    # od: the descriptor of O ([B * H * N_Q, D], block [64, D], or [64, D / 2]: _store_tile); LSE: [B, H, N_Q] fp32;
    # scales: (sm_scale * log2(e), and FP8's q, k, v descale pointers: fp32 [B, H_KV]); docs: VARLEN's (CU_Q, CU_K,
    # NUM_DOCS, O, COUNTER, slot), else unused
    smem, bars, od, LSE, sched, scales, docs = parts
    # WINDOW: a sliding window's left limit (sched's WIN_LEFT); VARLEN: packed documents
    # (flash_ws_parts.document_tile), 2: the persistent walk; the other modes: _consumer_work
    CAUSAL: gl.constexpr = modes[0]
    SCHED_HEADS: gl.constexpr = modes[1]
    WINDOW: gl.constexpr = modes[3]
    VARLEN: gl.constexpr = modes[4]
    q_smem, _, k_smem, _, _ = smem
    num_m, BH, _, _, N_Q, N_K, _, _, _ = sched
    NUM_WG: gl.constexpr = q_smem.shape[0] // 2 if modes[7] else q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    ROWS: gl.constexpr = od.block_type.shape[0]
    BM: gl.constexpr = NUM_WG * ROWS
    it = 0
    n_tiles = num_m * BH
    if VARLEN == WALK:  # the persistent walk: tiles as the producer takes them
        tc = 0
        t = take_tile(bars[0], docs[5], tc)
        while t < n_tiles:
            _, q_pos, q_row, _, n_blocks, full_blocks, where = document_tile(
                t, sched, docs, BM, BLOCK_N, CAUSAL
            )
            _consumer_work(
                parts,
                WG,
                modes,
                idle=q_pos + WG * ROWS + ROWS <= 0,
                q_row=q_row,
                q_pos=q_pos,
                kv_bh=0,
                first=0,
                n_blocks=n_blocks,
                left_full=0,
                full_blocks=full_blocks,
                n_q=where[3],
                n_k=where[4],
                where=where,
                it=it,
                tc=tc,
            )
            it += n_blocks
            tc += 1
            t = take_tile(bars[0], docs[5], tc)
    else:
        for tc in range(rounds(sched)):
            t = round_tile(tc, sched)
            if VARLEN:
                live, q_pos, q_row, _, n_blocks, full_blocks, where = document_tile(
                    t, sched, docs, BM, BLOCK_N, CAUSAL
                )
                first = 0
                left_full = 0
                n_q = where[3]
                n_k = where[4]
                kv_bh = 0
                idle = q_pos + WG * ROWS + ROWS <= 0  # rows of a tile need not fill whole warpgroups
            else:
                live = t < n_tiles
            if live:
                if not VARLEN:
                    q_pos, q_row, kv_bh, first, n_blocks, left_full, full_blocks = tile(
                        t=t,
                        sched=sched,
                        BM=BM,
                        BLOCK_N=BLOCK_N,
                        CAUSAL=CAUSAL,
                        SCHED_HEADS=SCHED_HEADS,
                        WINDOW=WINDOW,
                    )
                    n_q = N_Q
                    n_k = N_K
                    where = 0
                    idle = q_pos + WG * ROWS < 0
                _consumer_work(
                    parts,
                    WG,
                    modes,
                    idle=idle,
                    q_row=q_row,
                    q_pos=q_pos,
                    kv_bh=kv_bh,
                    first=first,
                    n_blocks=n_blocks,
                    left_full=left_full,
                    full_blocks=full_blocks,
                    n_q=n_q,
                    n_k=n_k,
                    where=where,
                    it=it,
                    tc=tc,
                )
                it += n_blocks - first
    tma.store_wait(0)


@gluon.jit
def _consumer_lead(parts, WG: gl.constexpr, modes):
    """Consumer warpgroup WG of a persistent walk (round-robin or list-scheduled, causal or not; no window, no
    packed documents) with LEAD_S: as _consumer's round loop, but each tile's last P V is followed on the tensor
    cores by the next tile's first S = Q K^T, issued before this tile's epilogue (the division by the row sums,
    the stores), which then runs under it. The next tile's Q is in the other of two Q buffers (load_partition's
    LEAD_S), loaded
    while this tile ran. Every program has a tile (flash_ws.walk_programs), so each S is issued unconditionally:
    an S in flight across a branch's merge makes ptxas serialize every wgmma; the last tile's is a stand-in
    (_lead_tile), waited for here."""
    smem, bars, od, LSE, sched, scales, docs = parts
    SEP_O: gl.constexpr = modes[2]
    gl.static_assert(SEP_O, "LEAD_S needs the output's own buffers")
    gl.static_assert(not (modes[3] or modes[4]), "LEAD_S walks no window and no packed documents")
    q_all, _, k_smem, _, _ = smem
    gl.static_assert(not k_smem.dtype.is_fp8(), "LEAD_S takes 16-bit inputs (flash_ws.lead_s_refusal)")
    q_bars = bars[0]
    k_bars = bars[2]
    turns = bars[5]
    NUM_WG: gl.constexpr = q_all.shape[0] // 2
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    ROWS: gl.constexpr = od.block_type.shape[0]
    BITS: gl.constexpr = k_smem.dtype.primitive_bitwidth
    s_layout: gl.constexpr = mma_layout(BLOCK_N, BITS)
    my_turn = turns.index(WG)
    next_turn = turns.index((WG + 1) % NUM_WG)
    FLIP: gl.constexpr = 1 if WG == 0 else 0
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    n_live = live_tiles(sched)
    mbarrier.wait(q_bars.index(0), 0)
    s = _issue_s(q_all.index(WG), k_smem, k_bars, my_turn, next_turn, 0, s_zero, FLIP)
    it = 0
    for tc in range(n_live):
        s, it = _lead_tile(s, tc, it, tc == n_live - 1, parts, WG, modes, s_zero, my_turn, next_turn, FLIP)
    warpgroup_mma_wait(0, deps=[s])
    tma.store_wait(0)


@gluon.jit
def _lead_tile(
    s,  # the tile's first S, in flight
    tc,
    it,
    last_tile,  # the program's last tile: no next tile
    parts,
    WG: gl.constexpr,
    modes,
    s_zero,
    my_turn,
    next_turn,
    FLIP: gl.constexpr,
):
    """_consumer_lead's tile tc (round_tile's; its Q in buffer tc % 2) of two warpgroups' whole rows (no idle
    warpgroup: flash_ws.lead_s_refusal), whose key blocks are the program's it, it + 1, ...; returns the next
    tile's first S in flight and the next tile's first key block. On the program's last tile that S is a stand-in,
    the same code on other operands (this tile's Q and its last K, landed and not loaded over), its result dropped:
    a second copy of the tile's code for the last tile, the S left out, doubled the build (6,696 SASS instructions
    against 3,840; docs/kernels.md has both builds' times), and a branch around the S makes ptxas serialize every
    wgmma."""
    smem, bars, od, LSE, sched, scales, docs = parts
    CAUSAL: gl.constexpr = modes[0]
    SCHED_HEADS: gl.constexpr = modes[1]
    SEP_O: gl.constexpr = modes[2]
    EXP_POLY: gl.constexpr = modes[5]
    FAST_MASK: gl.constexpr = modes[9]
    gl.static_assert(not modes[6], "LEAD_S takes 16-bit inputs: no SUM_MMA")
    q_all, o_smem, k_smem, v_smem, _ = smem
    q_bars, q_empties, k_bars, v_bars, empty_bars, _ = bars
    NUM_WG: gl.constexpr = q_all.shape[0] // 2
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    ROWS: gl.constexpr = od.block_type.shape[0]
    P_SHIFT: gl.constexpr = 0.0  # 16-bit inputs only (_consumer_lead): P unshifted, no descales
    BITS: gl.constexpr = k_smem.dtype.primitive_bitwidth
    o_layout: gl.constexpr = mma_layout(HEAD_DIM, BITS)
    p_layout: gl.constexpr = p_layout_of(o_layout, BITS)
    row_s: gl.constexpr = gl.SliceLayout(1, s_zero.type.layout)
    causal_off = sched[5] - sched[4]  # N_K - N_Q
    q = q_all.index((tc % 2) * NUM_WG + WG)
    q_pos, q_row, kv_bh, _, n_blocks, _, full_blocks = tile(
        t=round_tile(tc, sched),
        sched=sched,
        BM=NUM_WG * ROWS,
        BLOCK_N=BLOCK_N,
        CAUSAL=CAUSAL,
        SCHED_HEADS=SCHED_HEADS,
        WINDOW=False,
    )
    qk_scale, v_scale = tile_scales(scales, kv_bh, False)
    rows = q_pos + WG * ROWS + gl.arange(0, ROWS, row_s)
    p, m_i, l_i = _first_softmax(
        s=s,
        g=it,
        empty_bars=empty_bars,
        m_i=gl.full([ROWS], float("-inf"), gl.float32, row_s),
        l_i=gl.full([ROWS], 0.0, gl.float32, row_s),
        rows=rows,
        start_n=0,
        causal_off=causal_off,
        left_off=0,
        qk_scale=qk_scale,
        dtype=gl.constexpr(q.dtype),
        p_layout=p_layout,
        MASK=CAUSAL,
        WINDOW=False,
        P_SHIFT=P_SHIFT,
        VARLEN=False,
        KEY_END=False,
        key_end=0,
        FAST_MASK=FAST_MASK,
        EXP_POLY=EXP_POLY,
    )
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    ops = (q, smem, bars, my_turn, next_turn, s_zero, rows, qk_scale)
    # the blocks every row sees whole, then (causal) the diagonal's, masked
    acc, p, m_i, l_i = _steps(
        lo=1,
        hi=full_blocks,
        g0=it,
        state=(acc, p, m_i, l_i),
        ops=ops,
        FLIP=FLIP,
        P_SHIFT=P_SHIFT,
        EXP_POLY=EXP_POLY,
    )
    if CAUSAL:
        acc, p, m_i, l_i = _steps(
            lo=gl.maximum(full_blocks, 1),
            hi=n_blocks,
            g0=it,
            state=(acc, p, m_i, l_i),
            ops=ops,
            FLIP=FLIP,
            P_SHIFT=P_SHIFT,
            EXP_POLY=EXP_POLY,
            MASK=True,
            causal_off=causal_off,
            FAST_MASK=FAST_MASK,
        )
    mbarrier.arrive(q_empties.index(tc % 2))  # every S of this tile is done: its Q buffer takes tile tc + 2's
    last = it + n_blocks - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    pa = p_operand(p, o_layout, gl.constexpr(q.dtype))
    pv = warpgroup_mma(pa, v_operand(v_smem, last % STAGES), acc, is_async=True)
    nxt = it + n_blocks
    # the next tile's first S behind this P V, ahead of the epilogue, on key block nxt's turn
    qt = gl.where(last_tile, tc, tc + 1)  # the tile whose Q it reads
    mbarrier.wait(q_bars.index(qt % 2), (qt // 2) & 1)
    s = _issue_s(
        q_all.index((qt % 2) * NUM_WG + WG),
        k_smem,
        k_bars,
        my_turn,
        next_turn,
        nxt,
        s_zero,
        FLIP,
        gl.where(last_tile, nxt - 1, nxt),  # the key block whose K it reads
    )
    acc = pv_wait(pv, pa, 1)  # in-order completion: the P V is done, the next S may not be
    mbarrier.arrive(empty_bars.index(STAGES + last % STAGES))  # V of the last block is no longer read
    out = _normalized(acc, l_i, v_scale, False)
    _store_lse(m_i, l_i, LSE, q_row, WG, P_SHIFT)
    _store_tile(out, o_smem, od, q_row, 0, q_empties, WG, SEP_O)
    return s, nxt


@gluon.jit
def _consumer_work(
    parts,  # _consumer's
    WG: gl.constexpr,
    modes,
    idle,  # the warpgroup owns no row of the tile
    q_row,
    q_pos,
    kv_bh,
    first,
    n_blocks,
    left_full,
    full_blocks,
    n_q,  # the tile's sequence lengths (VARLEN: its document's)
    n_k,
    where,
    it,
    tc,
):
    """One tile of the warpgroup (_consumer_tile's arguments): its rows, or where it owns none, its turns and
    releases only."""
    smem, bars, od, LSE, sched, scales, docs = parts
    # SEP_O: the output has its own buffers (flash_ws.own_o: persistent, O_HALVES, FP8); EXP_POLY: an eighth of
    # each step's exp2s on the FMA pipe (flash_ws_parts._exp2_eighth); SUM_MMA: P's row sums by a matmul beside
    # P V (_pv_done); the others: _consumer
    CAUSAL: gl.constexpr = modes[0]
    SEP_O: gl.constexpr = modes[2]
    WINDOW: gl.constexpr = modes[3]
    VARLEN: gl.constexpr = modes[4]
    EXP_POLY: gl.constexpr = modes[5]
    SUM_MMA: gl.constexpr = modes[6]
    Q2: gl.constexpr = modes[7]
    NUM_WG: gl.constexpr = smem[0].shape[0] // 2 if Q2 else smem[0].shape[0]
    WIN_LEFT = sched[6]
    q_bar, q_empty, turns = bars[0], bars[1], bars[5]
    q_slot = WG
    phase = tc
    if Q2:  # tile tc's Q in buffer tc % 2 (load_partition's TWO_Q), its barriers beside it
        gl.static_assert(SEP_O and not VARLEN, "Q2 needs the output's own buffers and no packed documents")
        q_bar = bars[0].index(tc % 2)
        q_empty = bars[1].index(tc % 2)
        bars = (q_bar, q_empty, bars[2], bars[3], bars[4], bars[5])
        q_slot = (tc % 2) * NUM_WG + WG
        phase = tc // 2
    my_turn = turns.index(WG)
    next_turn = turns.index((WG + 1) % NUM_WG)
    # Turns: consumer 0's k-th matmul issue waits for the last consumer's (k-1)-th (the first is free: a
    # fresh barrier passes a wait on parity 1), consumer w's k-th waits for consumer w-1's k-th. Every
    # consumer takes one turn per key block, so k is the program's key-block count `it`.
    FLIP: gl.constexpr = 1 if WG == 0 else 0
    FP8: gl.constexpr = smem[2].dtype.is_fp8()
    if idle:  # owns no row of this tile: turns and releases only
        # This tile's Q has landed, so the last tile's Q buffers were released by every warpgroup: without the
        # wait, an idle warpgroup racing through a one-block tile could release them again for this tile while
        # another still reads the last one's (its arrival would complete the last tile's phase of q_empty).
        mbarrier.wait(q_bar, phase & 1)
        for j in range(n_blocks - first):
            _pass_block(it + j, bars, my_turn, next_turn, FLIP)
        mbarrier.arrive(q_empty)
    else:
        qk_scale, v_scale = tile_scales(scales, kv_bh, FP8)
        _consumer_tile(
            smem=smem,
            bars=bars,
            my_turn=my_turn,
            next_turn=next_turn,
            od=od,
            LSE=LSE,
            q_row=q_row,
            q_pos=q_pos,
            first=first,
            n_blocks=n_blocks,
            left_full=left_full,
            full_blocks=full_blocks,
            causal_off=n_k - n_q,
            left_off=n_k - n_q - WIN_LEFT,
            qk_scale=qk_scale,
            v_scale=v_scale,
            it=it,
            tc=phase,
            docs=docs,
            where=where,
            WG=WG,
            FLIP=FLIP,
            q_slot=q_slot,
            NUM_WG=NUM_WG,
            LOOP_FIRST=modes[8],
            FAST_MASK=modes[9],
            CAUSAL=CAUSAL,
            SEP_O=SEP_O,
            WINDOW=WINDOW,
            VARLEN=VARLEN,
            EXP_POLY=EXP_POLY,
            SUM_MMA=SUM_MMA,
        )


@gluon.jit
def _consumer_tile(
    smem,
    bars,
    my_turn,
    next_turn,
    od,
    LSE,
    q_row,  # the tile's first row in the flattened [B * H * N_Q, D] view
    q_pos,  # the tile's first row in its head (negative for a first partial tile)
    first,  # the first key block the tile sees (WINDOW; else 0)
    n_blocks,  # one past the last key block the tile sees
    left_full,  # blocks [first, left_full) cut the window's left edge (masked)
    full_blocks,  # blocks [left_full, full_blocks) need no mask; the rest cut the causal diagonal
    causal_off,  # N_K - N_Q
    left_off,  # N_K - N_Q - WIN_LEFT
    qk_scale,
    v_scale,  # FP8: the output's factor (its v descale)
    it,  # the program's key blocks before this tile
    tc,  # the phase of the tile's Q barriers: the program's tiles before this one (Q2: that use its Q buffer)
    docs,  # VARLEN: (CU_Q, CU_K, NUM_DOCS, O, COUNTER, slot)
    where,  # VARLEN: flash_ws_parts.document_tile's (h, kv_h, lse_row, n_q, n_k, H)
    WG: gl.constexpr,
    FLIP: gl.constexpr,
    CAUSAL: gl.constexpr,
    SEP_O: gl.constexpr,
    WINDOW: gl.constexpr,
    VARLEN: gl.constexpr,
    EXP_POLY: gl.constexpr,
    SUM_MMA: gl.constexpr,
    q_slot,  # this warpgroup's slice of the tile's Q in smem[0]: WG, or with Q2 in the tile's buffer
    NUM_WG: gl.constexpr,
    LOOP_FIRST: gl.constexpr = False,
    FAST_MASK: gl.constexpr = False,  # the causal diagonal by flash_ws_parts._diagonal_mask (flash_ws.fast_mask)
):
    """One tile's rows of this warpgroup; its key blocks first, first + 1, ... are the program's it, it + 1, ..."""
    q_smem, o_smem, k_smem, v_smem, ones = smem
    q_bar, q_empty, k_bars, v_bars, empty_bars, _ = bars
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    ROWS: gl.constexpr = od.block_type.shape[0]
    FP8: gl.constexpr = k_smem.dtype.is_fp8()
    P_SHIFT: gl.constexpr = 8.0 if FP8 else 0.0  # flash_fp8.py: p * 2^8 fills e4m3's range, at no cost
    BITS: gl.constexpr = k_smem.dtype.primitive_bitwidth  # wgmma's K step is 32 bytes; P holds 32 bits a pair
    s_layout: gl.constexpr = mma_layout(BLOCK_N, BITS)
    o_layout: gl.constexpr = mma_layout(HEAD_DIM, BITS)
    p_layout: gl.constexpr = p_layout_of(o_layout, BITS)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    # VARLEN: a document's last key block may hold the next document's keys: masked by key position (the
    # causal diagonal does it under CAUSAL), and a row may see no key (keys past the end, fewer than its queries).
    KEY_END: gl.constexpr = VARLEN and not CAUSAL
    key_end = 0
    if VARLEN:
        key_end = where[4]
    q = q_smem.index(q_slot)
    rows = q_pos + WG * ROWS + gl.arange(0, ROWS, row_s)
    # Under a causal mask a warpgroup whose last row's diagonal ends a key block before the tile's last stops
    # there: every score past it is masked (p = 0, alpha = 1 exactly, so the output bits are the same), and it
    # passes the remaining blocks' turns and stages on (_pass_block). With three consumers (192 rows over 128-key
    # blocks, d = 64), where it was measured faster; with 128 rows over 128 keys every warpgroup's diagonal lies
    # in the tile's last block, and over d = 256's 64-key blocks it did not pay (docs/kernels.md).
    SKIP_DIAG: gl.constexpr = CAUSAL and NUM_WG == 3
    n_own = n_blocks
    if SKIP_DIAG:
        own_last = gl.maximum(q_pos + WG * ROWS + ROWS - 1 + causal_off, 0) // BLOCK_N
        n_own = gl.maximum(gl.minimum(n_blocks, own_last + 1), first + 1)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    l_i = gl.full([ROWS], 0.0, gl.float32, row_s)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_bar, tc & 1)

    if LOOP_FIRST:  # the first block through the loops below, behind a P V of zeros (_consumer_step): no
        # softmax copy of its own (d = 64 causal: 5,672 SASS instructions against 7,224)
        gl.static_assert(not (WINDOW or VARLEN), "LOOP_FIRST: no window, no packed documents")
        if FP8:  # FP8 carries P in fp32 (p_operand converts it)
            p = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        else:
            p = gl.zeros([ROWS, BLOCK_N], q.dtype, p_layout)
        mid = first
    else:
        # The first block: S and its softmax; its P V is issued in the next step.
        s = _issue_s(q, k_smem, k_bars, my_turn, next_turn, it, s_zero, FLIP)
        p, m_i, l_i = _first_softmax(
            s=s,
            g=it,
            empty_bars=empty_bars,
            m_i=m_i,
            l_i=l_i,
            rows=rows,
            start_n=first * BLOCK_N,
            causal_off=causal_off,
            left_off=left_off,
            qk_scale=qk_scale,
            dtype=gl.constexpr(q.dtype),
            p_layout=p_layout,
            MASK=CAUSAL or WINDOW or VARLEN,
            WINDOW=WINDOW,
            P_SHIFT=P_SHIFT,
            VARLEN=VARLEN,
            KEY_END=KEY_END,
            key_end=key_end,
            FAST_MASK=FAST_MASK,
            EXP_POLY=EXP_POLY,
            SUM_MMA=SUM_MMA,
        )
        mid = gl.maximum(left_full, first + 1)

    # The window's left edge (masked), the blocks every row sees whole, the causal diagonal (masked). SKIP_DIAG
    # bounds the first and the last loop by n_own; the middle one needs no bound: full_blocks, the blocks the
    # tile's first row sees whole, never passes any warpgroup's n_own.
    ops = (q, smem, bars, my_turn, next_turn, s_zero, rows, qk_scale)
    acc, p, m_i, l_i = _steps(
        lo=first + 1,
        hi=gl.minimum(left_full, n_own),
        g0=it - first,
        state=(acc, p, m_i, l_i),
        ops=ops,
        FLIP=FLIP,
        P_SHIFT=P_SHIFT,
        EXP_POLY=EXP_POLY,
        SUM_MMA=SUM_MMA,
        MASK=True,
        causal_off=causal_off,
        left_off=left_off,
        WINDOW=WINDOW,
        FAST_MASK=FAST_MASK,
    )
    acc, p, m_i, l_i = _steps(
        lo=mid,
        hi=full_blocks,
        g0=it - first,
        state=(acc, p, m_i, l_i),
        ops=ops,
        FLIP=FLIP,
        P_SHIFT=P_SHIFT,
        EXP_POLY=EXP_POLY,
        SUM_MMA=SUM_MMA,
        LOOP_FIRST=LOOP_FIRST,
        g_first=it,
    )
    acc, p, m_i, l_i = _steps(
        lo=gl.maximum(full_blocks, mid),
        hi=n_own,
        g0=it - first,
        state=(acc, p, m_i, l_i),
        ops=ops,
        FLIP=FLIP,
        P_SHIFT=P_SHIFT,
        EXP_POLY=EXP_POLY,
        SUM_MMA=SUM_MMA,
        MASK=CAUSAL or VARLEN,
        causal_off=causal_off,
        left_off=left_off,
        WINDOW=WINDOW,
        VARLEN=VARLEN,
        KEY_END=KEY_END,
        key_end=key_end,
        FAST_MASK=FAST_MASK,
        LOOP_FIRST=LOOP_FIRST,
        g_first=it,
    )
    if SEP_O:
        mbarrier.arrive(q_empty)  # every S of this tile is done: the producer may load the next tile's Q

    last = it + n_own - first - 1
    pa = p_operand(p, o_layout, gl.constexpr(q.dtype))
    acc, l_i = _pv_done(acc, l_i, pa, v_smem, ones, v_bars, empty_bars, last, SUM_MMA)
    if SKIP_DIAG:
        for j in range(n_own, n_blocks):
            _pass_block(it + j - first, bars, my_turn, next_turn, FLIP)

    if VARLEN:  # rows that see no key output 0 with LSE2 = +inf (flash_v2's contract); rows before the
        # document (a first partial tile) are not stored
        empty = l_i == 0.0
        l_i = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("inf"), m_i + gl.log2(l_i))
        gl.store(LSE + where[2] + WG * ROWS + gl.arange(0, ROWS, row_s), lse, mask=rows >= 0)
    else:
        # Every row saw at least one key (Nk >= Nq for causal; a window holds the row's own key), so l > 0.
        _store_lse(m_i, l_i, LSE, q_row, WG, P_SHIFT)
    out = _normalized(acc, l_i, v_scale, FP8)
    if VARLEN:
        o_col = where[0] * HEAD_DIM
        if q_pos + WG * ROWS >= 0:
            _store_tile(out, o_smem, od, q_row, o_col, q_empty, WG, SEP_O)
        else:  # the warpgroup's rows start in the previous document: a masked store of its own rows
            store_rows(out.to(od.dtype), docs[3], q_row + WG * ROWS, o_col, rows >= 0, where[5] * HEAD_DIM)
            if not SEP_O:
                mbarrier.arrive(q_empty)
    else:
        _store_tile(out, o_smem, od, q_row, 0, q_empty, WG, SEP_O)


@gluon.jit
def _store_lse(m_i, l_i, LSE, q_row, WG: gl.constexpr, P_SHIFT: gl.constexpr):
    """Warpgroup WG's rows' log2-sum-exp2 (l > 0: every row saw a key) into the LSE rows of the tile at q_row
    (FP8: less P's shift)."""
    ROWS: gl.constexpr = m_i.shape[0]
    lse = m_i + gl.log2(l_i)
    if P_SHIFT != 0.0:
        lse = lse - P_SHIFT
    gl.store(LSE + q_row + WG * ROWS + gl.arange(0, ROWS, m_i.type.layout), lse)


@gluon.jit
def _normalized(acc, l_i, v_scale, FP8: gl.constexpr):
    """The output rows: acc over the row sums (FP8: times the v descale)."""
    row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    if FP8:
        out = acc * gl.convert_layout(v_scale / l_i, row_o)[:, None]
    else:
        out = acc / gl.convert_layout(l_i, row_o)[:, None]
    return out


@gluon.jit
def _stage_out(part, o_buf, od, row, col):
    """part into O at [row, col] through o_buf and TMA, once the buffer's last store has read it."""
    tma.store_wait(0)
    o_buf.store(part)
    fence_async_shared()
    tma.async_copy_shared_to_global(od, [row, col], o_buf)


@gluon.jit
def _store_tile(out, o_smem, od, q_row, col, q_empty, WG: gl.constexpr, SEP_O: gl.constexpr):
    """Warpgroup WG's out (fp32) into O at [q_row + its first row, col] through its output buffer (without SEP_O,
    its Q buffer, no longer read) and TMA; without SEP_O, the buffer is released to the next tile's Q once the
    store is done. A buffer half as wide as out (flash_ws.o_cols) takes out's column halves one after the other,
    the second once the first's store has read the buffer."""
    o_buf = o_smem.index(WG)
    if o_buf.shape[1] == out.shape[1]:
        _stage_out(out.to(od.dtype), o_buf, od, q_row + WG * o_buf.shape[0], col)
    else:
        # [64, D] -> [64, 2, D / 2] -> [64, D / 2, 2] -> two [64, D / 2]: column c of half i is out's column
        # i * D / 2 + c. The accumulator's layout holds a row's columns c and c + D / 2 in one thread's registers,
        # so the split moves no data between threads.
        HALF: gl.constexpr = o_buf.shape[1]
        lo, hi = gl.split(gl.permute(gl.reshape(out.to(od.dtype), [out.shape[0], 2, HALF]), (0, 2, 1)))
        row = q_row + WG * o_buf.shape[0]
        _stage_out(lo, o_buf, od, row, col)
        _stage_out(hi, o_buf, od, row, col + HALF)
    if not SEP_O:
        tma.store_wait(0)
        mbarrier.arrive(q_empty)


@gluon.jit
def store_rows(out, O, row, col, keep, width):
    """VARLEN: out [64, D] (the accumulator's layout) into rows row, row + 1, ... of O [total_q, width] at column
    col, the rows where `keep` holds (the tile's rows inside its document). A TMA store cannot stop at a
    document's start, and only a document's first tile crosses one (tiles end at the document's end)."""
    layout: gl.constexpr = out.type.layout
    HEAD_DIM: gl.constexpr = out.shape[1]
    r = gl.arange(0, out.shape[0], gl.SliceLayout(1, layout))
    c = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    ptrs = O + (row + r).to(gl.int64)[:, None] * width + col + c[None, :]
    gl.store(ptrs, out, mask=gl.convert_layout(keep, gl.SliceLayout(1, layout))[:, None])


@gluon.jit
def _attn_fwd_ws(
    qd,  # descriptor of Q viewed as [B * H * N_Q, D], block [64, D]
    kd,  # descriptor of K viewed as [B * H_KV * N_K, D], block [BLOCK_N, D]
    vd,  # the same for V
    od,  # as qd, for O (block [64, D / 2] with half-width output buffers: flash_ws.o_cols)
    LSE,  # [B, H, N_Q] fp32 out: log2-sum-exp2 per row
    H,  # query heads
    GROUP,  # H // H_KV
    N_Q,
    N_K,
    num_m,  # query tiles per head
    BH,  # B * H
    qk_scale,  # sm_scale * log2(e)
    WIN_LEFT,  # WINDOW: row r sees keys from r + N_K - N_Q - WIN_LEFT on
    Q_DESCALE,  # FP8: fp32 [B, H_KV] descales of q, k, v (else any pointer, unused)
    K_DESCALE,
    V_DESCALE,
    TILES,  # int32 [programs, ROUNDS]: each persistent program's tiles in order (flash_ws.lpt_table)
    ROUNDS,  # 0: no table, round-robin
    CU_Q,  # VARLEN: int32 [NUM_DOCS + 1] prefix sums of the documents' query lengths; else None
    CU_K,  # VARLEN: the same for the keys; else None
    NUM_DOCS,  # VARLEN: documents; else None
    OUT,  # VARLEN: O [total_q, H, D] (the masked store of a tile that starts before its document); else None
    COUNTER,  # VARLEN == WALK: int32 [2], zero: the walk's next tile, the programs done; else unused (or None)
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,  # K/V ring stages
    CAUSAL: gl.constexpr,
    NUM_WG: gl.constexpr,  # consumer warpgroups: BLOCK_M = 64 * NUM_WG
    SCHED_HEADS: gl.constexpr,
    SEP_O: gl.constexpr,  # the output has its own buffers (flash_ws.own_o: persistent, O_HALVES, FP8)
    WINDOW: gl.constexpr,  # a sliding window's left limit (with CAUSAL: flash-attn's window (WIN_LEFT, 0))
    CONSUMER_REGS: gl.constexpr,  # registers per thread (setmaxnreg) of the consumers and of the producer
    PRODUCER_REGS: gl.constexpr,
    # Packed documents: Q, K, V, O [total, H * D], one document per tile (B = 1, N = total); 1: a program per tile,
    # WALK (2): persistent programs take the tiles through COUNTER (flash_ws_parts._load_walk)
    VARLEN: gl.constexpr,
    EXP_POLY: gl.constexpr,  # FP8: an eighth of each step's exp2s on the FMA pipe (flash_ws_parts._exp2_eighth)
    # FP8: P's row sums by P @ ones [BLOCK_N, 8] beside each P V (_pv_done), where the softmax summed them
    SUM_MMA: gl.constexpr,
    # a persistent walk (no window, no packed documents): each tile's epilogue runs under the next tile's first S
    # (_consumer_lead; flash_ws.lead_s_refusal says where it cannot)
    LEAD_S: gl.constexpr = False,
    # a persistent walk (no window, no packed documents) with two Q buffers but no early S: the producer loads the
    # next tile's Q (and then its first K/V) while this tile runs (flash_ws.q2_refusal says where it cannot)
    Q2: gl.constexpr = False,
    # the tile's first key block through the step loops behind a P V of zeros (no first-block softmax copy)
    LOOP_FIRST: gl.constexpr = False,
    # the causal diagonal by flash_ws_parts._diagonal_mask (flash_ws.fast_mask), not by a key computed per score
    FAST_MASK: gl.constexpr = False,
):
    """One program per SM-sized share of the tiles (persistent) or per tile: the loops are the same."""
    ROWS: gl.constexpr = qd.block_type.shape[0]
    O_COLS: gl.constexpr = od.block_type.shape[1]  # HEAD_DIM, or half of it (_store_tile)
    gl.static_assert(SEP_O or qd.dtype == od.dtype, "an output of another dtype than Q needs its own buffers")
    gl.static_assert(SEP_O or O_COLS == HEAD_DIM, "half-width output buffers are buffers of its own")
    TWO_Q: gl.constexpr = LEAD_S or Q2  # the next tile's Q loads into a second buffer while this tile runs
    if TWO_Q:  # tile tc's Q in buffer tc % 2 (load_partition)
        q_smem = gl.allocate_shared_memory(qd.dtype, [2 * NUM_WG, ROWS, HEAD_DIM], qd.layout)
    else:
        q_smem = gl.allocate_shared_memory(qd.dtype, [NUM_WG, ROWS, HEAD_DIM], qd.layout)
    if SEP_O:  # the output gets its own buffers, so the next tile's Q can load during this tile's epilogue
        o_smem = gl.allocate_shared_memory(od.dtype, [NUM_WG, ROWS, O_COLS], od.layout)
    else:
        o_smem = q_smem
    if kd.dtype.is_fp8():  # kd loads 5-D boxes (flash_ws._descriptors) that land as [BLOCK_N, D] tiles
        k_layout: gl.constexpr = gl.NVMMASharedLayout(
            kd.layout.swizzle_byte_width, element_bitwidth=8, rank=2
        )
    else:  # mypy reads the second `gl.constexpr` annotation (what makes k_layout a Gluon constexpr) as a redefinition
        k_layout: gl.constexpr = kd.layout  # type: ignore[no-redef]
    k_smem = gl.allocate_shared_memory(kd.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_layout)
    V_TILE: gl.constexpr = vd.block_type.shape  # [BLOCK_N, D]; FP8: V^T's [D, BLOCK_N]
    v_smem = gl.allocate_shared_memory(vd.dtype, [STAGES, V_TILE[0], V_TILE[1]], vd.layout)
    if TWO_Q:  # a pair per Q buffer
        q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    else:
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    if TWO_Q:
        for i in gl.static_range(2):
            mbarrier.init(q_bar.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=NUM_WG)
    else:
        mbarrier.init(q_bar, count=1)
        mbarrier.init(q_empty, count=NUM_WG)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=NUM_WG)  # K of stage i: every consumer releases it
        mbarrier.init(empty_bars.index(STAGES + i), count=NUM_WG)  # V of stage i
    for i in gl.static_range(NUM_WG):
        mbarrier.init(turns.index(i), count=1)
    if SUM_MMA:  # the ones of P @ ones, as V^T's [8, BLOCK_N] rows
        gl.static_assert(vd.dtype.is_fp8(), "SUM_MMA sums e4m3 P")
        ones = gl.allocate_shared_memory(vd.dtype, [8, V_TILE[1]], vd.layout, _e4m3_ones(8, V_TILE[1]))
    else:  # unused
        ones = v_smem
    fence_async_shared()

    descs = (qd, kd, vd)
    smem = (q_smem, o_smem, k_smem, v_smem, ones)
    bars = (q_bar, q_empty, k_bars, v_bars, empty_bars, turns)
    sched = (num_m, BH, H, GROUP, N_Q, N_K, WIN_LEFT, TILES, ROUNDS)
    scales = (qk_scale, Q_DESCALE, K_DESCALE, V_DESCALE)
    if VARLEN == WALK:  # slot: the tile the producer took for its consumers (flash_ws_parts._load_walk)
        slot = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        docs = (CU_Q, CU_K, NUM_DOCS, OUT, COUNTER, slot)
    else:  # no walk: COUNTER (None, or VARLEN's prefix sums again) stands in for the slot, unused
        docs = (CU_Q, CU_K, NUM_DOCS, OUT, COUNTER, COUNTER)
    parts = (smem, bars, od, LSE, sched, scales, docs)
    # The consumers' modes, one constexpr: a plain tuple held in a variable would make its constexprs tensors.
    MODES: gl.constexpr = gl.constexpr(
        (CAUSAL, SCHED_HEADS, SEP_O, WINDOW, VARLEN, EXP_POLY, SUM_MMA, Q2, LOOP_FIRST, FAST_MASK)
    )
    if NUM_WG == 3:
        gl.warp_specialize(
            [
                (_consumer, (parts, 0, MODES)),
                (_consumer, (parts, 1, MODES)),
                (_consumer, (parts, 2, MODES)),
                (
                    load_partition,
                    (descs, smem, bars, sched, docs, CAUSAL, SCHED_HEADS, WINDOW, VARLEN, TWO_Q),
                ),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )
    elif LEAD_S:  # each tile's epilogue under the next tile's first S (_consumer_lead)
        gl.static_assert(not (WINDOW or VARLEN), "LEAD_S walks no window and no packed documents")
        gl.warp_specialize(
            [
                (_consumer_lead, (parts, 0, MODES)),
                (_consumer_lead, (parts, 1, MODES)),
                (
                    load_partition,
                    (descs, smem, bars, sched, docs, CAUSAL, SCHED_HEADS, WINDOW, VARLEN, TWO_Q),
                ),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (parts, 0, MODES)),
                (_consumer, (parts, 1, MODES)),
                (
                    load_partition,
                    (descs, smem, bars, sched, docs, CAUSAL, SCHED_HEADS, WINDOW, VARLEN, TWO_Q),
                ),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )

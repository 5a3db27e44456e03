"""The schedule, the producer and the softmax step of flash_ws_kernel.py's Gluon forward: which tile a program
runs, which key blocks a tile visits (bounded by the causal diagonal and a sliding window's left edge), the
producer warp that streams them, and the online-softmax step on one score tile with its masks.

VARLEN (packed documents, varlen_ws.py): document_tile places a tile in its document on the device; a persistent
program's producer takes its tiles from an atomic counter and hands them to its consumers (_load_walk,
take_tile).

FP8 (e4m3, the kernel's mode when its descriptors hold e4m3): the V ring holds V^T tiles [D, BLOCK_N] read from
V^T [B * H_KV * D, N_K] (keys contiguous: the K-major B operand e4m3 wgmma needs for P V); K tiles arrive with
their rows in key_order, so that P reaches P V without crossing threads (p_operand); P is shifted by 2^8 before
its e4m3 cast, and each tile's scores are scaled by its K/V head's q and k descales (flash_fp8.py's numerics).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma_wait

# The kernel's VARLEN mode of a persistent walk over packed documents (_load_walk; 1: a program per tile)
WALK: gl.constexpr = gl.constexpr(2)
# 2^f on [-0.5, 0.5] by a cubic, minimax in relative error (8.3e-5 in fp32): _exp2_poly's coefficients
EXP2_C0: gl.constexpr = gl.constexpr(0.999919593334198)
EXP2_C1: gl.constexpr = gl.constexpr(0.6932621598243713)
EXP2_C2: gl.constexpr = gl.constexpr(0.24271413683891296)
EXP2_C3: gl.constexpr = gl.constexpr(0.055212993174791336)
# 1.5 * 2^23: x + ROUNDER rounds x to an integer held in the sum's low mantissa bits
ROUNDER: gl.constexpr = gl.constexpr(12582912.0)


@gluon.jit
def launch_dependents():
    """Let the grid launched behind this one as a programmatic dependent launch (PDL) start
    (griddepcontrol.launch_dependents): once every program of this grid has run it, the next grid's programs may
    take the SMs this one's have left. What that grid reads of this one's writes it waits for itself
    (griddepcontrol.wait for this grid's end, or a count this grid's programs release)."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [], gl.int32, False, 1
    )


@gluon.jit
def tile(
    t,
    sched,
    BM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SCHED_HEADS: gl.constexpr,
    WINDOW: gl.constexpr,
):
    """Tile t of the schedule: (q_pos, q_row, kv_bh, first, n_blocks, left_full, full_blocks): key blocks
    [first, n_blocks) are visited; [first, left_full) cut the window's left edge (WINDOW), [full_blocks, n_blocks)
    the causal diagonal, both masked.

    Tiles go by groups of SCHED_HEADS heads (whose K/V stay in L2 together), and within a group by query
    block (the last, which sees the most keys under a causal mask, first), then head.
    Query tiles end at N_Q: the first may start before row 0."""
    num_m, BH, H, GROUP, N_Q, N_K, WIN_LEFT, _, _ = sched
    per_group = num_m * SCHED_HEADS
    grp = t // per_group
    base = grp * SCHED_HEADS
    heads = gl.minimum(BH - base, SCHED_HEADS)
    r = t - grp * per_group
    m = r // heads
    if CAUSAL:
        m = num_m - 1 - m
    bh = base + r % heads
    kv_bh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    q_pos = N_Q - (num_m - m) * BM
    causal_off = N_K - N_Q
    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(N_K, q_pos + BM + causal_off), BLOCK_N)
        full_blocks = gl.minimum(gl.maximum(q_pos + causal_off + 1, 0) // BLOCK_N, n_blocks)
    else:
        n_blocks = N_K // BLOCK_N
        full_blocks = n_blocks
    if WINDOW:  # keys before q_pos + causal_off - WIN_LEFT are seen by no row of the tile: never loaded
        first = gl.maximum(q_pos + causal_off - WIN_LEFT, 0) // BLOCK_N
        left_full = gl.minimum(
            gl.cdiv(gl.maximum(q_pos + BM - 1 + causal_off - WIN_LEFT, 0), BLOCK_N), n_blocks
        )
    else:
        first = 0
        left_full = 0
    return q_pos, bh * N_Q + q_pos, kv_bh, first, n_blocks, left_full, full_blocks


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def document_block(
    CU, NUM_DOCS, TOTAL, pid, BLOCK: gl.constexpr, REVERSE: gl.constexpr, CU_OTHER, TOTAL_OTHER
):
    """The block of a packed batch at place `pid` of common.document_block's walk (each document's cdiv(length,
    BLOCK) blocks in document order, rows past CU[NUM_DOCS] one more document, offsets clamped into [0, TOTAL]),
    as (the document's first row, its length, the block's index in it (REVERSE: counted from its last block),
    the document's first row and length on the other side: CU_OTHER's prefix sums, clamped into [0,
    TOTAL_OTHER], none for the rows past CU[NUM_DOCS]). A pid past the last block gets lengths 0. Found on the
    device: no host read. Both sides' prefix sums are read in the same pass: read at the document once found,
    the other side's cost a second round trip to memory ahead of each program's first loads (docs/kernels.md,
    packed documents)."""
    # 32 documents a step, one per lane, every warp holding the whole chunk: the sums and the scan stay within
    # a warp (64 a step spread them over two warps: shared memory and barriers, values kept in local memory)
    CHUNK: gl.constexpr = 32
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    base = 0  # blocks of the documents before this chunk
    row0 = 0
    length = 0
    block = 0
    other0 = 0
    other_len = 0
    for c in range(0, NUM_DOCS + 1, CHUNK):
        idx = c + gl.arange(0, CHUNK, layout)
        start = gl.load(CU + idx, mask=idx <= NUM_DOCS, other=0)
        end = gl.load(CU + idx + 1, mask=idx < NUM_DOCS, other=TOTAL)  # the last document ends at TOTAL
        o_start = gl.load(CU_OTHER + idx, mask=idx <= NUM_DOCS, other=0)
        o_end = gl.load(CU_OTHER + idx + 1, mask=idx < NUM_DOCS, other=0)  # past CU[NUM_DOCS]: length 0
        start = gl.minimum(gl.maximum(start, 0), TOTAL)
        size = gl.maximum(gl.minimum(gl.maximum(end, 0), TOTAL) - start, 0)
        blocks = gl.where(idx <= NUM_DOCS, (size + BLOCK - 1) // BLOCK, 0)
        first = base + gl.associative_scan(blocks, 0, _add) - blocks  # the walk's index of each first block
        hit = (first <= pid) & (pid < first + blocks)  # at most one document holds pid
        row0 += gl.sum(gl.where(hit, start, 0), 0)
        length += gl.sum(gl.where(hit, size, 0), 0)
        if REVERSE:
            block += gl.sum(gl.where(hit, first + blocks - 1 - pid, 0), 0)
        else:
            block += gl.sum(gl.where(hit, pid - first, 0), 0)
        o_start = gl.minimum(gl.maximum(o_start, 0), TOTAL_OTHER)
        o_size = gl.maximum(gl.minimum(gl.maximum(o_end, 0), TOTAL_OTHER) - o_start, 0)
        other0 += gl.sum(gl.where(hit, o_start, 0), 0)
        other_len += gl.sum(gl.where(hit, o_size, 0), 0)
        base += gl.sum(blocks, 0)
    return row0, length, block, other0, other_len


@gluon.jit
def document_tile(t, sched, docs, BM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """VARLEN: tile t of a packed batch, (live, q_pos, q_row, kv_row, n_blocks, full_blocks, where) with where =
    (h, kv_h, lse_row, n_q, n_k, H): tile t is walk position t // BH of head t % BH (every head's tile of a walk
    position before the next position's, so the long tiles of the last documents do not go out last and the
    programs that take tiles as they come free end together: docs/kernels.md, packed documents), and the walk
    visits each document's cdiv(n_q, BM) query tiles (the last, which sees the most keys under a causal mask,
    first), so a tile holds rows of one document (common.document_block's walk and clamps, found on the device:
    no host read). Rows past cu_seqlens_q[-1] are one more document with no keys; a walk position past the last
    tile is not live. Tiles end at the document's last row (the first may start in the previous document), K/V
    blocks start at its first key, so the last block may run into the next document (masked by key position);
    a tile whose rows see no key still visits one block (every score masked: output 0). Q, K, V and O are read
    as [total, heads * D]: head h is the column block h * D (K/V: kv_h), q_row and kv_row are rows of the packed
    tensors; the LSE of the tile's first row is at lse_row of [H, total_q]."""
    num_m, BH, H, GROUP, N_Q, N_K, _, _, _ = sched
    CU_Q, CU_K, NUM_DOCS, _ = docs
    h = t % BH
    row0, n_q, block, k0, n_k = document_block(CU_Q, NUM_DOCS, N_Q, t // BH, BM, CAUSAL, CU_K, N_K)
    live = n_q > 0
    q_pos = n_q - (gl.cdiv(n_q, BM) - block) * BM
    causal_off = n_k - n_q
    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(n_k, q_pos + BM + causal_off), BLOCK_N)
        full_blocks = gl.minimum(gl.maximum(q_pos + causal_off + 1, 0) // BLOCK_N, n_blocks)
    else:
        n_blocks = gl.cdiv(n_k, BLOCK_N)
        full_blocks = n_k // BLOCK_N
    n_blocks = gl.maximum(n_blocks, 1)
    where = (h, h // GROUP, h * N_Q + row0 + q_pos, n_q, n_k, H)
    return live, q_pos, row0 + q_pos, k0, n_blocks, full_blocks, where


@gluon.jit
def live_tiles(sched):
    """The tiles this program walks: round-robin's share (tile tc * programs + pid for tc below it), or the tiles
    of its schedule table row before the padding (flash_ws.lpt_table pads only the end of a row); at least one,
    since a walk has at most one program per tile (flash_ws.walk_programs)."""
    num_m, BH, _, _, _, _, _, TILES, ROUNDS = sched
    n_tiles = num_m * BH
    pid = gl.program_id(0)
    n = gl.cdiv(n_tiles - pid, gl.num_programs(0))
    if ROUNDS > 0:  # 32 of the row's entries a load, all in flight together
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        n = 0
        for c in range(0, ROUNDS, 32):
            idx = c + gl.arange(0, 32, layout)
            row = gl.load(TILES + pid * ROUNDS + idx, mask=idx < ROUNDS, other=n_tiles)
            n += gl.sum((row < n_tiles).to(gl.int32), 0)
    return n


@gluon.constexpr_function
def mma_layout(cols, bits):
    """One warpgroup's wgmma accumulator layout for [64, cols] fp32 over `bits`-bit operands: the scores' (cols =
    BLOCK_N) and the output's (cols = HEAD_DIM)."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, 256 // bits]
    )


@gluon.constexpr_function
def p_layout_of(o_layout, bits):
    """P V's A operand layout in registers (16-bit P) under the output's accumulator layout o_layout."""
    return gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=32 // bits)


@gluon.jit
def rounds(sched):
    """How many tiles this program walks (the last may be past the end): the schedule table's width when sched
    has one (ROUNDS > 0), else round-robin's share."""
    num_m, BH, _, _, _, _, _, _, ROUNDS = sched
    r = gl.cdiv(num_m * BH, gl.num_programs(0))
    if ROUNDS > 0:
        r = ROUNDS
    return r


@gluon.jit
def round_tile(tc, sched):
    """The tile of this program's round tc: row pid of the schedule table TILES ([programs, ROUNDS] int32, padded
    with num_m * BH; flash_ws.lpt_table) when there is one, else round-robin over the programs (t = tc *
    programs + pid); may be past the last tile."""
    _, _, _, _, _, _, _, TILES, ROUNDS = sched
    pid = gl.program_id(0)
    t = tc * gl.num_programs(0) + pid
    if ROUNDS > 0:
        t = gl.load(TILES + pid * ROUNDS + tc)
    return t


@gluon.jit
def load_partition(
    descs,
    smem,
    bars,
    sched,
    docs,  # VARLEN: (CU_Q, CU_K, NUM_DOCS, O, COUNTER, slot); else unused
    CAUSAL: gl.constexpr,
    SCHED_HEADS: gl.constexpr,
    WINDOW: gl.constexpr,
    VARLEN: gl.constexpr,
    TWO_Q: gl.constexpr = False,
):
    """Producer (one warp), per tile: the query slices once every consumer has released the last tile's
    (q_empty), then K_j and V_j into ring stage (it + j) % STAGES, each as soon as every consumer has released
    that stage's K (empty_bars[s]) or V (empty_bars[STAGES + s]) buffer. `it` counts key blocks over all
    the program's tiles, so the ring and its barrier phases run on from one tile into the next. TWO_Q (LEAD_S or
    Q2: flash_ws_kernel._attn_fwd_ws; no window, no packed documents): two Q buffers, tile tc's query slices in
    buffer b = tc % 2 (slots b * NUM_WG.. of smem[0] [2 * NUM_WG, 64, D], its barriers bars[0][b] and
    bars[1][b]), so the next tile's Q loads as soon as the tile before this one is done with it; a schedule
    table's padding comes last in its row, so tc counts the live tiles."""
    qd, _, _ = descs
    q_smem, _, k_smem, _, _ = smem
    num_m, BH, _, _, _, N_K, _, _, _ = sched
    NUM_WG: gl.constexpr = q_smem.shape[0] // 2 if TWO_Q else q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    ROWS: gl.constexpr = qd.block_type.shape[0]
    BM: gl.constexpr = NUM_WG * ROWS
    if VARLEN == WALK:
        _load_walk(descs, smem, bars, sched, docs, CAUSAL)
    else:
        it = 0
        n_tiles = num_m * BH
        for tc in range(rounds(sched)):
            t = round_tile(tc, sched)
            if VARLEN:
                live, _, q_row, kv_row, n_blocks, _, where = document_tile(
                    t, sched, docs, BM, BLOCK_N, CAUSAL
                )
                first = 0
                kv_bh = 0
                q_col = where[0] * HEAD_DIM
                kv_col = where[1] * HEAD_DIM
            else:
                live = t < n_tiles
            if live:
                if not VARLEN:
                    _, q_row, kv_bh, first, n_blocks, _, _ = tile(
                        t=t,
                        sched=sched,
                        BM=BM,
                        BLOCK_N=BLOCK_N,
                        CAUSAL=CAUSAL,
                        SCHED_HEADS=SCHED_HEADS,
                        WINDOW=WINDOW,
                    )
                    kv_row = kv_bh * N_K
                    q_col = 0
                    kv_col = 0
                tile_bars = bars
                phase = tc
                q_first = 0
                if TWO_Q:  # the Q buffer tc % 2, its barriers and its phase
                    b = tc % 2
                    tile_bars = (bars[0].index(b), bars[1].index(b), bars[2], bars[3], bars[4], bars[5])
                    phase = tc // 2
                    q_first = b * NUM_WG
                _load_tile(
                    descs=descs,
                    smem=smem,
                    bars=tile_bars,
                    tc=phase,
                    it=it,
                    q_row=q_row,
                    q_col=q_col,
                    kv_row=kv_row,
                    kv_col=kv_col,
                    kv_bh=kv_bh,
                    first=first,
                    n_blocks=n_blocks,
                    q_first=q_first,
                    WGS=NUM_WG,
                )
                it += n_blocks - first


@gluon.jit
def _load_tile(
    descs,
    smem,
    bars,
    tc,
    it,
    q_row,
    q_col,
    kv_row,
    kv_col,
    kv_bh,
    first,
    n_blocks,
    q_first=0,
    WGS: gl.constexpr = 0,
):
    """The producer's tile tc: its query slices (rows q_row.., columns q_col..) into Q slots q_first, q_first + 1,
    ... (WGS of them; 0: every slot), then its key blocks [first, n_blocks) (rows kv_row + j * BLOCK_N.., columns
    kv_col..; FP8: V^T's rows of K/V head kv_bh), the program's key blocks it, it + 1, ..."""
    qd, kd, vd = descs
    q_smem, _, k_smem, v_smem, _ = smem
    q_bar, q_empty, k_bars, v_bars, empty_bars, _ = bars
    NUM_WG: gl.constexpr = WGS if WGS else q_smem.shape[0]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    ROWS: gl.constexpr = qd.block_type.shape[0]
    # A fresh barrier counts as having completed the phase before phase 0: the first waits are free.
    mbarrier.wait(q_empty, (tc & 1) ^ 1)
    mbarrier.expect(q_bar, NUM_WG * qd.block_type.nbytes)
    # Rows before row 0 (a first partial tile) arrive as zeros or another head's (VARLEN: document's) rows, and
    # go unused.
    for i in gl.static_range(NUM_WG):
        tma.async_copy_global_to_shared(qd, [q_row + i * ROWS, q_col], q_bar, q_smem.index(q_first + i))
    for j in range(first, n_blocks):
        s = (it + j - first) % STAGES
        free_phase = (((it + j - first) // STAGES) & 1) ^ 1
        mbarrier.wait(empty_bars.index(s), free_phase)
        mbarrier.expect(k_bars.index(s), kd.block_type.nbytes)
        if kd.dtype.is_fp8():  # the K tile's rows in key_order's order (key_order's docstring)
            k_at = [(kv_row + j * BLOCK_N) // 16, 0, 0, 0, 0]
            k_dst = k_smem.index(s)._reinterpret(kd.dtype, kd.block_type.shape, kd.layout)
        else:
            k_at = [kv_row + j * BLOCK_N, kv_col]
            k_dst = k_smem.index(s)
        tma.async_copy_global_to_shared(kd, k_at, k_bars.index(s), k_dst)
        mbarrier.wait(empty_bars.index(STAGES + s), free_phase)
        mbarrier.expect(v_bars.index(s), vd.block_type.nbytes)
        if vd.dtype.is_fp8():  # V^T: the tile [D, BLOCK_N] of keys j * BLOCK_N, ...
            v_at = [kv_bh * HEAD_DIM, j * BLOCK_N]
        else:
            v_at = [kv_row + j * BLOCK_N, kv_col]
        tma.async_copy_global_to_shared(vd, v_at, v_bars.index(s), v_smem.index(s))


@gluon.jit
def _load_walk(descs, smem, bars, sched, docs, CAUSAL: gl.constexpr):
    """VARLEN, persistent: the producer takes the walk's next tile from COUNTER (an atomic add: the programs
    take tiles as they free up, in the walk's order, the way the hardware hands out the blocks of a grid) and
    tells its consumers through `slot` (written before q_bar's arrival, read after its wait); walk positions past
    a head's last tile it skips, and the end of the walk it tells with a tile past the last and a bare arrival on
    q_bar. The last program out resets
    COUNTER for the next launch."""
    q_smem, _, k_smem, _, _ = smem
    q_bar, q_empty, _, _, _, _ = bars
    num_m, BH, _, _, _, _, _, _, _ = sched
    COUNTER = docs[4]
    slot = docs[5]
    BM: gl.constexpr = q_smem.shape[0] * descs[0].block_type.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    n_tiles = num_m * BH
    it = 0
    tc = 0
    t = gl.atomic_add(COUNTER, 1, sem="relaxed")  # only the count is shared: no ordering
    while t < n_tiles:
        live, _, q_row, kv_row, n_blocks, _, where = document_tile(t, sched, docs, BM, BLOCK_N, CAUSAL)
        if live:
            mbarrier.wait(q_empty, (tc & 1) ^ 1)
            put_tile(slot, t)
            _load_tile(
                descs,
                smem,
                bars,
                tc,
                it,
                q_row,
                where[0] * HEAD_DIM,
                kv_row,
                where[1] * HEAD_DIM,
                0,
                0,
                n_blocks,
            )
            it += n_blocks
            tc += 1
        t = gl.atomic_add(COUNTER, 1, sem="relaxed")
    mbarrier.wait(q_empty, (tc & 1) ^ 1)
    put_tile(slot, n_tiles)
    mbarrier.arrive(q_bar)
    if gl.atomic_add(COUNTER + 1, 1) == gl.num_programs(0) - 1:
        gl.atomic_xchg(COUNTER, 0)
        gl.atomic_xchg(COUNTER + 1, 0)


@gluon.jit
def put_tile(slot, t):
    """t into the one-int32 shared-memory slot (every lane writes the same value)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    slot.store(gl.full([1], t, gl.int32, layout))


@gluon.jit
def take_tile(q_bar, slot, tc):
    """VARLEN, persistent: a consumer's tile tc of the walk, from the producer's slot once q_bar's phase tc has
    completed; every warp has read it before any goes on (the producer rewrites it once every consumer has
    released the tile)."""
    mbarrier.wait(q_bar, tc & 1)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    t = gl.max(slot.load(layout), 0)
    gl.thread_barrier()
    return t


@gluon.jit
def key_order(c):
    """The key (within its block) of score column c in FP8 mode. The producer loads each K tile with its rows
    permuted within groups of 16: row 16R + 8g + 2t + e holds key 16R + 4t + 2g + e (t < 4; g, e < 2), so
    thread t of a quad receives the scores of keys 4t .. 4t + 3 (and 16 + 4t ..) in its accumulator registers,
    exactly the bytes e4m3 wgmma's A fragment wants it to hold for P V (p_operand). Without it P would cross
    threads (SHFL) and be repacked byte by byte, as many instructions again as the softmax."""
    return (c & ~15) | (c & 1) | ((c >> 2) & 2) | ((c << 1) & 12)


@gluon.constexpr_function
def _e4m3_a_layout(rows, cols):
    """e4m3 wgmma's A fragment on a [rows = 64, cols] tile of one warpgroup, as a linear layout (PTX ISA, wgmma
    .m64nNk32 A register fragment): register bits k + 1 and k + 2 (the four bytes of one register), row + 8,
    k + 16, then k + 32, k + 64, ...; lane bits k + 4, k + 8, row + 1, 2, 4; warp bits row + 16, 32."""
    regs = [[0, 1], [0, 2], [8, 0], [0, 16]]
    col = 32
    while col < cols:
        regs.append([0, col])
        col *= 2
    return gl.DistributedLinearLayout(
        reg_bases=regs,
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[rows, cols],
    )


@gluon.jit
def p_operand(p, acc_layout: gl.constexpr, dtype: gl.constexpr):
    """P V's A operand from P (the carried P of _consumer_step): fp16/bf16 P is already the operand; FP8 carries
    P in fp32 in the score layout (its columns in key_order) and converts it here, right before the matmul (over
    d = 256's wide tiles before the step's S: _consumer_step's P_EARLY).
    Relabelling the columns into key order is register-only (asserted), and the conversion packs four scores
    into one register with two cvt.rn.satfinite.e4m3x2.f32 (P * 2^8 <= 256 stays under e4m3's 448). Converted
    in the step that carried it, P is never unpacked into bytes: carried as e4m3, Triton 3.6 kept one byte per
    register across the loop and repacked them (PRMT, LOP3) before every P V."""
    if dtype.is_fp8():
        M: gl.constexpr = p.shape[0]
        N: gl.constexpr = p.shape[1]
        p = gl.reshape(p, [M, N // 32, 2, 2, 4, 2])  # columns 32Q + 16h + 8g + 2t + e
        p = gl.permute(p, [0, 1, 2, 4, 3, 5])  # -> 32Q + 16h + 4t + 2g + e: the key (key_order)
        p = gl.reshape(p, [M, N])
        p = gl.convert_layout(p, _e4m3_a_layout(M, N), assert_trivial=True)
        p = gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
            "=r,r,r,r,r",
            [p],
            dtype=gl.float8e4nv,
            is_pure=True,
            pack=4,
        )
        p = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4), True)
    return p


@gluon.jit
def v_operand(v_smem, stage):
    """V of ring stage `stage` as P V's B operand [BLOCK_N, D] (FP8: a view of the V^T tile, keys contiguous)."""
    if v_smem.dtype.is_fp8():
        v = v_smem.index(stage).permute((1, 0))
    else:
        v = v_smem.index(stage)
    return v


@gluon.jit
def pv_wait(acc, p, PENDING: gl.constexpr = 0):
    """Wait for the matmuls in flight but the last PENDING (issued after this P V); returns acc. P (the A
    operand, in registers) is threaded through the wait so that its registers outlive the matmul; Triton 3.6
    lowers no 8-bit operands of a wait ("Unexpected bitwidth in WGMMAWaitGroupOp: 8"), so an e4m3 P is left to
    ptxas, which holds a wgmma's source registers until its wait_group (a hazard there would show as a serialized
    HGMMA in the SASS)."""
    if p.dtype.is_fp8():
        acc = warpgroup_mma_wait(PENDING, deps=[acc])
    else:
        acc, p = warpgroup_mma_wait(PENDING, deps=[acc, p])
    return acc


@gluon.jit
def tile_scales(scales, kv_bh, FP8: gl.constexpr):
    """(score scale, V scale) of a tile: FP8 multiplies sm_scale * log2(e) by its K/V head's q and k descales
    (fp32 [B, H_KV], flat index kv_bh) and reads its v descale; else (sm_scale * log2(e), 1)."""
    qk_scale, Q_DESCALE, K_DESCALE, V_DESCALE = scales
    v_scale = 1.0
    if FP8:
        qk_scale = qk_scale * gl.load(Q_DESCALE + kv_bh) * gl.load(K_DESCALE + kv_bh)
        v_scale = gl.load(V_DESCALE + kv_bh)
    return qk_scale, v_scale


@gluon.jit
def _row_max(s, TREE: gl.constexpr):
    """The row max of a [64, N] score tile. TREE (the FP8 mode): a tree, halving the columns while both halves lie
    in one thread's registers (the accumulator's top column bit is a register bit down to 8 columns), then the
    quad's shuffles; gl.max's in-thread reduction is a chain of N / 4 - 1 dependent FMNMX per row, on the path
    to every exp2 of the step. The max is the same either way."""
    x = s
    if TREE:
        LEVELS: gl.constexpr = _halvings_to_8(s.shape[1])
        for _ in gl.static_range(LEVELS):
            a, b = _halves(x)
            x = gl.maximum(a, b)
    return gl.convert_layout(gl.max(x, axis=1), gl.SliceLayout(1, s.type.layout), assert_trivial=True)


@gluon.jit
def _halves(x):
    """x[:, :N/2] and x[:, N/2:] of a [M, N] tile whose column N/2 is a register bit (no data movement)."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, [M, 2, N // 2]), [0, 2, 1]))


@gluon.constexpr_function
def _halvings_to_8(n):
    return max(int(n).bit_length() - 4, 0)


@gluon.jit
def _unhalves(a, b):
    """The [M, 2N] tile whose column halves are a and b (_halves' inverse)."""
    M: gl.constexpr = a.shape[0]
    N: gl.constexpr = a.shape[1]
    b = gl.convert_layout(b, a.type.layout, assert_trivial=True)
    return gl.reshape(gl.permute(gl.join(a, b), [0, 2, 1]), [M, 2 * N])


@gluon.jit
def _exp2_poly(x):
    """2^x on the FMA and integer pipes, not the MUFU (FlashAttention-4's emulation): x = j + f with j an integer
    and f in [-0.5, 0.5], rounded by one add (ROUNDER); 2^f by a cubic (EXP2_C*), and j added to its exponent
    bits. x is clamped at -126, so that 2^j stays a normal float's exponent (-127 carries into the sign bit):
    a masked score (-inf) gives at most 2^-126, not 0, which e4m3's cast of P flushes to 0 and which the row sum
    does not see beside its largest term, 2^8."""
    x = gl.maximum(x, -126.0)
    r = x + ROUNDER
    f = x - (r - ROUNDER)
    p = ((EXP2_C3 * f + EXP2_C2) * f + EXP2_C1) * f + EXP2_C0
    bits = p.to(gl.int32, bitcast=True) + (r.to(gl.int32, bitcast=True) << 23)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _exp2_eighth(x):
    """exp2 of a [64, N] score tile with an eighth of each thread's scores (the tile's last N / 8 columns, three
    register bits) on _exp2_poly, the rest on the MUFU."""
    a, b = _halves(x)
    b0, b1 = _halves(b)
    c0, c1 = _halves(b1)
    out = _unhalves(gl.exp2(a), _unhalves(gl.exp2(b0), _unhalves(gl.exp2(c0), _exp2_poly(c1))))
    return gl.convert_layout(out, x.type.layout, assert_trivial=True)


@gluon.constexpr_function
def _axis_layout(layout, dim, rank):
    """The 1-D layout of dimension dim of a rank-dimensional layout: every other dimension sliced off, the highest
    first."""
    for other in reversed(range(rank)):
        if other != dim:
            layout = gl.SliceLayout(other, layout)
    return layout


@gluon.jit
def _diagonal_mask(s, lim):
    """s with -inf where a score's key (within its block) exceeds its row's lim. The accumulator holds column (the
    key) 8k + 2t + e of a row in register (k, e) of lane t of a quad: split into a register part, a constant per
    register, and a lane part folded into each row's limit once, every score is one compare with an immediate and
    one select, where computing each score's key (and adding the block's start) cost twice that. FP8's key_order:
    _key_order_mask."""
    M: gl.constexpr = s.shape[0]
    N: gl.constexpr = s.shape[1]
    s4 = gl.reshape(s, [M, N // 8, 4, 2])
    L4: gl.constexpr = s4.type.layout
    reg = (
        8 * gl.arange(0, N // 8, _axis_layout(L4, 1, 4))[None, :, None, None]
        + gl.arange(0, 2, _axis_layout(L4, 3, 4))[None, None, None, :]
    )
    lane = 2 * gl.arange(0, 4, _axis_layout(L4, 2, 4))[None, None, :, None]
    lim4 = gl.convert_layout(lim, _axis_layout(L4, 0, 4), assert_trivial=True)
    s4 = gl.where(reg <= lim4[:, None, None, None] - lane, s4, float("-inf"))
    return gl.convert_layout(gl.reshape(s4, [M, N]), s.type.layout, assert_trivial=True)


@gluon.jit
def _key_order_mask(s, lim):
    """_diagonal_mask over FP8's key_order: the score tile as [M, N / 16, 2, 4, 2] (column 16R + 8g + 2t + e, the
    register k = 2R + g), whose key is 16R + 4t + 2g + e: register part 16R + 2g + e, lane part 4t."""
    M: gl.constexpr = s.shape[0]
    N: gl.constexpr = s.shape[1]
    s5 = gl.reshape(s, [M, N // 16, 2, 4, 2])
    L5: gl.constexpr = s5.type.layout
    reg = (
        16 * gl.arange(0, N // 16, _axis_layout(L5, 1, 5))[None, :, None, None, None]
        + 2 * gl.arange(0, 2, _axis_layout(L5, 2, 5))[None, None, :, None, None]
        + gl.arange(0, 2, _axis_layout(L5, 4, 5))[None, None, None, None, :]
    )
    lane = 4 * gl.arange(0, 4, _axis_layout(L5, 3, 5))[None, None, None, :, None]
    lim5 = gl.convert_layout(lim, _axis_layout(L5, 0, 5), assert_trivial=True)
    s5 = gl.where(reg <= lim5[:, None, None, None, None] - lane, s5, float("-inf"))
    return gl.convert_layout(gl.reshape(s5, [M, N]), s.type.layout, assert_trivial=True)


@gluon.jit
def softmax(
    s,
    m_i,
    l_i,
    rows,
    start_n,
    causal_off,
    left_off,  # WINDOW: row r sees keys from r + left_off on
    qk_scale,
    MASK: gl.constexpr,
    BLOCK_N: gl.constexpr,
    WINDOW: gl.constexpr,
    P_SHIFT: gl.constexpr = 0.0,  # p and l are times 2^P_SHIFT (FP8: 8, flash_fp8.py's shift into e4m3's range)
    VARLEN: gl.constexpr = False,  # a document of a packed batch: a masked row may have seen no key yet
    KEY_END: gl.constexpr = False,  # the mask is the key end (VARLEN without CAUSAL), not the diagonal
    key_end=0,  # KEY_END: the document's keys
    FAST_MASK: gl.constexpr = False,  # the causal diagonal by _diagonal_mask (where it was measured faster)
    EXP_POLY: gl.constexpr = False,  # an eighth of the exp2s by _exp2_poly (_exp2_eighth)
    SUM_MMA: gl.constexpr = False,  # the caller adds P's row sums (a matmul beside P V): l is only rescaled
):
    """Online-softmax step on a fp32 score tile: (p, alpha, l, m); the scale is applied after the row max."""
    if MASK and FAST_MASK and not KEY_END and not WINDOW:
        if P_SHIFT != 0.0:  # FP8: the columns hold the keys in key_order
            s = _key_order_mask(s, rows + causal_off - start_n)
        else:
            s = _diagonal_mask(s, rows + causal_off - start_n)
    elif MASK:
        cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s.type.layout))
        if P_SHIFT != 0.0:  # FP8: the columns hold the keys in key_order
            cols = key_order(cols)
        cols = start_n + cols
        if KEY_END:
            s = gl.where(cols[None, :] < key_end, s, float("-inf"))
        else:
            s = gl.where(cols[None, :] <= rows[:, None] + causal_off, s, float("-inf"))
        if WINDOW:
            s = gl.where(cols[None, :] >= rows[:, None] + left_off, s, float("-inf"))
    m_new = gl.maximum(m_i, _row_max(s, P_SHIFT != 0.0) * qk_scale)
    m_use = m_new
    if WINDOW or (VARLEN and MASK):
        # a row whose window starts past this block (or that sees no key of its document) has seen no key yet:
        # m = -inf, subtract 0 (not NaN)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    m_p = m_use
    if P_SHIFT != 0.0:
        m_p = m_use - P_SHIFT
    if EXP_POLY:
        p = _exp2_eighth(s * qk_scale - m_p[:, None])
    else:
        p = gl.exp2(s * qk_scale - m_p[:, None])
    alpha = gl.exp2(m_i - m_use)
    if SUM_MMA:
        l_i = l_i * alpha
    else:
        l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, l_i, m_new

"""The schedule and the softmax step of flash_ws_kernel.py's Gluon forward: which tile a program runs, which key
blocks a tile visits (bounded by the causal diagonal and a sliding window's left edge), and the online-softmax
step on one score tile with its masks.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


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
    """Tile t of the schedule: (q_pos, q_row, kv_row, first, n_blocks, left_full, full_blocks): key blocks
    [first, n_blocks) are visited; [first, left_full) cut the window's left edge (WINDOW), [full_blocks, n_blocks)
    the causal diagonal, both masked.

    Tiles go by groups of SCHED_HEADS heads (whose K/V stay in L2 together), and within a group by query
    block (the last, which sees the most keys under a causal mask, first), then head.
    Query tiles end at N_Q: the first may start before row 0."""
    num_m, BH, H, GROUP, N_Q, N_K, WIN_LEFT = sched
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
    return q_pos, bh * N_Q + q_pos, kv_bh * N_K, first, n_blocks, left_full, full_blocks


@gluon.jit
def round_tile(tc):
    """The tile of this program's round tc: tiles go round-robin over the programs (t = tc * programs + pid);
    may be past the last tile in the last round."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    return tc * programs + pid


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
):
    """Online-softmax step on a fp32 score tile: (p, alpha, l, m); the scale is applied after the row max."""
    if MASK:
        cols = start_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s.type.layout))
        s = gl.where(cols[None, :] <= rows[:, None] + causal_off, s, float("-inf"))
        if WINDOW:
            s = gl.where(cols[None, :] >= rows[:, None] + left_off, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = m_new
    if (
        WINDOW
    ):  # a row whose window starts past this block has seen no key yet: m = -inf, subtract 0 (not NaN)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, l_i, m_new

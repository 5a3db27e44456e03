"""The per-key-block steps of the FlashAttention-2 forward (flash_v2.py's `_attn_fwd` calls them): load a K block
and score it, one online-softmax step with the masks, P V into the accumulator.

Masks, applied only in the blocks the caller marks MASK (the others are entirely visible and inside N_K):
  - keys past N_K;
  - CAUSAL (a right limit): query i sees key j only if j <= i + CAUSAL_OFF, where CAUSAL_OFF = N_K - N_Q + right
    (right = 0 for a causal mask, the window's right size for a sliding window);
  - WINDOW (a left limit): query i sees key j only if j >= i + LEFT_OFF, where LEFT_OFF = N_K - N_Q - left.
A row that has seen no visible key so far keeps m = -inf and l = 0 (the epilogue writes 0 for it).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import dot


@triton.jit
def scores(
    q,  # [BLOCK_M, HEAD_DIM] query tile, input dtype
    k_src,  # TMA: host descriptor of K ([B, H_KV, N_K, HEAD_DIM]); else pointer to K[b, hkv, 0, 0]
    stride_kn,
    kv_b,  # batch and K/V head: the first coordinates of the descriptor
    kv_h,
    start_n,  # first key of this block
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,  # keys past N_K may be in this block
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
):
    """S = Q K^T for one key block, fp32, unscaled."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        kt = tl.trans(k_src.load([kv_b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))  # past N_K: zeros
    elif MASK:
        kt_ptrs = k_src + offs_n[None, :] * stride_kn + offs_d[:, None]  # K^T tile [D, BN]
        kt = tl.load(kt_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
    else:
        kt = tl.load(k_src + offs_n[None, :] * stride_kn + offs_d[:, None])
    return dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE)


@triton.jit
def add_pv(
    acc,  # [BLOCK_M, HEAD_DIM] fp32
    p,  # [BLOCK_M, BLOCK_N] probabilities of one key block, input dtype
    v_src,  # as k_src in scores, for V
    stride_vn,
    kv_b,
    kv_h,
    start_n,
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
):
    """acc + P V for one key block."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        v = v_src.load([kv_b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    elif MASK:
        v = tl.load(
            v_src + offs_n[:, None] * stride_vn + offs_d[None, :],
            mask=offs_n[:, None] < N_K,
            other=0.0,
        )
    else:
        v = tl.load(v_src + offs_n[:, None] * stride_vn + offs_d[None, :])
    return dot(p, v, acc, IEEE)


@triton.jit
def online_softmax(
    qk,  # [BLOCK_M, BLOCK_N] fp32 scores of one key block, unscaled
    l_i,  # [BLOCK_M] fp32 running sum of exp2
    m_i,  # [BLOCK_M] fp32 running max (base-2 units)
    start_n,
    offs_m,  # [BLOCK_M] query row indices
    N_K,
    CAUSAL_OFF,  # query i sees key j only if j <= i + CAUSAL_OFF (CAUSAL)
    LEFT_OFF,  # query i sees key j only if j >= i + LEFT_OFF (WINDOW)
    qk_scale,  # sm_scale * log2(e), >= 0
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    MASK: tl.constexpr,  # this block needs the tail / causal / window mask
):
    """One online-softmax step. Returns (p fp32, alpha = the rescale of the old accumulator, l, m)."""
    if MASK:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid = offs_n[None, :] < N_K
        if CAUSAL:
            valid = valid & (offs_m[:, None] + CAUSAL_OFF >= offs_n[None, :])
        if WINDOW:
            valid = valid & (offs_n[None, :] >= offs_m[:, None] + LEFT_OFF)
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row with every key masked so far keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_use[:, None])
    else:
        # Scale after the row max (qk_scale >= 0), then one FMA per element: exp2(s * scale - m).
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def fwd_block(
    acc,  # [BLOCK_M, HEAD_DIM] fp32 accumulator
    l_i,  # [BLOCK_M] fp32 running sum
    m_i,  # [BLOCK_M] fp32 running max
    q,  # [BLOCK_M, HEAD_DIM] query tile
    k_src,  # as in scores
    v_src,  # as in add_pv
    stride_kn,
    stride_vn,
    kv_b,
    kv_h,
    start_n,  # first key of this block
    offs_m,  # [BLOCK_M] query rows
    N_K,
    CAUSAL_OFF,
    LEFT_OFF,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    MASK: tl.constexpr,  # the tail / causal / window mask is needed in this block
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
):
    """One key block in FA2 order: S = Q K^T, softmax, rescale, acc += P V (the tensor cores wait for the
    softmax)."""
    qk = scores(
        q=q,
        k_src=k_src,
        stride_kn=stride_kn,
        kv_b=kv_b,
        kv_h=kv_h,
        start_n=start_n,
        N_K=N_K,
        HEAD_DIM=HEAD_DIM,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        MASK=MASK,
        IEEE=IEEE,
        TMA=TMA,
    )
    p, alpha, l_i, m_new = online_softmax(
        qk=qk,
        l_i=l_i,
        m_i=m_i,
        start_n=start_n,
        offs_m=offs_m,
        N_K=N_K,
        CAUSAL_OFF=CAUSAL_OFF,
        LEFT_OFF=LEFT_OFF,
        qk_scale=qk_scale,
        BLOCK_N=BLOCK_N,
        CAUSAL=CAUSAL,
        WINDOW=WINDOW,
        MASK=MASK,
    )
    acc = acc * alpha[:, None]
    acc = add_pv(
        acc=acc,
        p=p.to(q.dtype),
        v_src=v_src,
        stride_vn=stride_vn,
        kv_b=kv_b,
        kv_h=kv_h,
        start_n=start_n,
        N_K=N_K,
        HEAD_DIM=HEAD_DIM,
        BLOCK_N=BLOCK_N,
        MASK=MASK,
        IEEE=IEEE,
        TMA=TMA,
    )
    return acc, l_i, m_new


@triton.jit
def key_ranges(
    m0,  # first query row of the block
    N_Q,
    N_K,
    WIN_LEFT,  # keys before the row's position it still sees (WINDOW)
    WIN_RIGHT,  # keys after the row's position it still sees (CAUSAL; 0 for a causal mask)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """The key ranges of query rows [m0, m0 + BLOCK_M), as (lo, mid_lo, mid_hi, hi): keys [lo, mid_lo) are the
    window's left edge (masked), [mid_lo, mid_hi) are seen by every row (no mask), [mid_hi, hi) the causal
    diagonal and the tail (masked); keys outside [lo, hi) are seen by no row and skipped. lo, mid_lo and mid_hi
    are multiples of BLOCK_N (mid_lo may be hi when no block is entirely visible)."""
    off = N_K - N_Q  # bottom-right alignment: query i sits at key position i + off
    if CAUSAL:
        hi = tl.minimum(N_K, tl.maximum(0, m0 + BLOCK_M + off + WIN_RIGHT))  # past the last key any row sees
        full_hi = tl.minimum(N_K, tl.maximum(0, m0 + off + WIN_RIGHT + 1))  # past the last key every row sees
    else:
        hi = N_K
        full_hi = N_K
    if WINDOW:
        lo = (tl.maximum(0, m0 + off - WIN_LEFT) // BLOCK_N) * BLOCK_N  # the first key any row sees
        full_lo = tl.maximum(0, m0 + BLOCK_M - 1 + off - WIN_LEFT)  # the first key every row sees
        mid_lo = tl.minimum(((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, hi)
    else:
        lo = 0
        mid_lo = 0
    mid_hi = tl.maximum((full_hi // BLOCK_N) * BLOCK_N, mid_lo)
    return lo, mid_lo, mid_hi, hi

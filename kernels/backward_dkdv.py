"""The dK/dV pass of the attention backward (backward.py launches it): one program per (key block, batch *
K/V head).

Origin: Dao, "FlashAttention-2" (2023), Algorithm 2, in the shape of Triton's fused-attention tutorial.
Loop order: the program's K and V blocks stay resident and dK, dV accumulate in fp32 while it streams the
query blocks of every query head of its GQA group (so GQA needs no atomics either). Per query block:
P^T = exp2(K Q^T * qk_scale - LSE2) (or P^T loaded, STORED_P), dV += P^T dO, dP^T = V dO^T,
dS^T = P^T * (dP^T - D), dK += dS^T Q; at the end dK *= sm_scale.

Cautions: query rows past N_Q load Q = dO = 0 and LSE2 = +inf (P = 0); key rows past N_K are computed but
never stored. Causal and sliding windows: query blocks that see none of the program's keys are skipped, those
that see all of them run without the mask (`query_ranges`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import document_block, dot


@triton.jit
def query_ranges(
    n0,  # first key of the program's block
    N_Q,
    N_K,
    WIN_LEFT,
    WIN_RIGHT,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """The query-row ranges that see keys [n0, n0 + BLOCK_N), as (lo, mid_lo, mid_hi, hi): rows [lo, mid_lo) are
    the causal diagonal (masked), [mid_lo, mid_hi) see every key of the block (no mask), [mid_hi, hi) the window's
    left edge (masked); rows outside [lo, hi) see none of the keys and are skipped. forward_blocks.key_ranges
    transposed: row i sees key j iff j - off - WIN_RIGHT <= i <= j - off + WIN_LEFT."""
    off = N_K - N_Q
    if CAUSAL:
        lo = (tl.maximum(0, n0 - off - WIN_RIGHT) // BLOCK_M) * BLOCK_M  # the first row that sees key n0
        full_lo = tl.maximum(0, n0 + BLOCK_N - 1 - off - WIN_RIGHT)  # the first row that sees every key
    else:
        lo = 0
        full_lo = 0
    if WINDOW:
        # past the last row that sees a key of the block; past the last row that sees them all
        hi = tl.minimum(N_Q, tl.maximum(0, n0 + BLOCK_N - off + WIN_LEFT))
        full_hi = tl.minimum(N_Q, tl.maximum(0, n0 - off + WIN_LEFT + 1))
    else:
        hi = N_Q
        full_hi = N_Q
    mid_lo = tl.minimum(((full_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, hi)
    if WINDOW:
        mid_hi = tl.maximum((full_hi // BLOCK_M) * BLOCK_M, mid_lo)
    else:
        mid_hi = hi  # through the last partial block: its rows past N_Q have LSE2 = +inf, so P = 0
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _dkdv_block(
    dk,  # [BLOCK_N, HEAD_DIM] fp32 accumulator
    dv,  # [BLOCK_N, HEAD_DIM] fp32 accumulator
    k,  # [BLOCK_N, HEAD_DIM] key tile
    v,  # [BLOCK_N, HEAD_DIM] value tile
    q_src,  # TMA: host descriptor of Q ([B, H, N_Q, D]); else pointer to Q[b, h, 0, 0]
    do_src,  # the same for dO
    desc_b,  # batch and head: the first coordinates of a host descriptor
    desc_h,
    lse_base,  # pointer to LSE2[b, h, 0]
    delta_base,  # pointer to DELTA[b, h, 0]
    p_base,  # pointer to P[b, h, 0, 0] (STORED_P only)
    stride_qm,
    stride_dom,
    stride_pm,
    stride_pn,
    start_m,  # first query row of this block
    offs_n,  # [BLOCK_N] key indices of the resident block
    N_Q,
    N_K,
    CAUSAL_OFF,  # query i sees key j only if j <= i + CAUSAL_OFF (CAUSAL)
    LEFT_OFF,  # query i sees key j only if j >= i + LEFT_OFF (WINDOW)
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    MASK: tl.constexpr,  # apply the causal / window mask in this block
    STORED_P: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    if TMA:  # rows past N_Q arrive as zeros
        q = q_src.load([desc_b, desc_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        do = do_src.load([desc_b, desc_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    else:
        q = tl.load(q_src + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(
            do_src + offs_m[:, None] * stride_dom + offs_d[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
    delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    if MASK:  # [BN, BM]: key j of the block, query i of the tile
        seen = offs_n[:, None] == offs_n[:, None]  # all true, narrowed by the masks below
        if CAUSAL:
            seen = seen & (offs_m[None, :] + CAUSAL_OFF >= offs_n[:, None])
        if WINDOW:
            seen = seen & (offs_n[:, None] >= offs_m[None, :] + LEFT_OFF)
    if STORED_P:
        valid = row_ok[None, :] & (offs_n[:, None] < N_K)
        if MASK:
            valid = valid & seen
        pt_ptrs = p_base + offs_m[None, :] * stride_pm + offs_n[:, None] * stride_pn  # P^T tile [BN, BM]
        pt = tl.load(pt_ptrs, mask=valid, other=0.0).to(tl.float32)
    else:
        lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
        qkt = dot(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), IEEE) * qk_scale
        pt = tl.math.exp2(qkt - lse[None, :])
        if MASK:
            pt = tl.where(seen, pt, 0.0)
    dv = dot(pt.to(do.dtype), do, dv, IEEE)
    dpt = dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), IEEE)
    dst = pt * (dpt - delta[None, :])
    dk = dot(dst.to(q.dtype), q, dk, IEEE)
    return dk, dv


@triton.jit
def _bwd_dkdv(
    Q,  # [B, H, N_Q, D]
    K,  # [B, H_KV, N_K, D]
    V,  # [B, H_KV, N_K, D]
    DO,  # [B, H, N_Q, D] gradient of the output
    LSE,  # [B, H, N_Q] fp32 contiguous, log2-sum-exp2 from the forward
    DELTA,  # [B, H, N_Q] fp32 contiguous, rowsum(dO * O)
    P,  # [B, H, N_Q, N_K] stored probabilities (STORED_P) or any placeholder
    DK,  # [B, H_KV, N_K, D] out
    DV,  # [B, H_KV, N_K, D] out
    QD,  # TMA: host descriptor of Q ([B, H, N_Q, D], block [1, 1, BLOCK_M, D]); else Q again (unused)
    DOD,  # the same for dO
    stride_qz,
    stride_qh,
    stride_qm,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_pz,
    stride_ph,
    stride_pm,
    stride_pn,
    stride_dkz,
    stride_dkh,
    stride_dkn,
    stride_dvz,
    stride_dvh,
    stride_dvn,
    H,  # query heads
    H_KV,  # key/value heads
    GROUP,  # H // H_KV
    N_Q,  # query length (VARLEN: rows of the packed queries, B = 1)
    N_K,  # key length (VARLEN: rows of the packed keys)
    qk_scale,  # sm_scale * log2(e)
    sm_scale,  # softmax scale (dK = sm_scale * dS^T Q)
    WIN_LEFT,  # as in flash_v2._attn_fwd
    WIN_RIGHT,
    N_BUCKET,  # autotune key only
    CU_Q,  # VARLEN: int32 [NUM_DOCS + 1] prefix sums of the documents' query lengths; else None
    CU_K,  # VARLEN: the same for the keys; else None
    NUM_DOCS,  # VARLEN: documents; else None
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,  # a right limit (causal: WIN_RIGHT = 0)
    WINDOW: tl.constexpr,  # a left limit
    STORED_P: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,  # stream Q and dO through the host descriptors QD, DOD
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,  # packed documents: a program is a key block of one document (common.document_block)
):
    pid_n = tl.program_id(0)
    rows_q = N_Q  # LSE and DELTA rows per head
    if VARLEN:
        pid_n, k_row0, N_K, q_row0, N_Q = document_block(
            CU_K, CU_Q, NUM_DOCS, N_K, N_Q, pid_n, BLOCK_N, False
        )
        K += k_row0.to(tl.int64) * stride_kn
        V += k_row0.to(tl.int64) * stride_vn
        DK += k_row0.to(tl.int64) * stride_dkn
        DV += k_row0.to(tl.int64) * stride_dvn
        Q += q_row0.to(tl.int64) * stride_qm
        DO += q_row0.to(tl.int64) * stride_dom
        LSE += q_row0
        DELTA += q_row0
    pid_bkv = tl.program_id(1)
    b = (pid_bkv // H_KV).to(tl.int64)
    hkv = (pid_bkv % H_KV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n[:, None] < N_K
    k = tl.load(
        K + b * stride_kz + hkv * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
        mask=key_ok,
        other=0.0,
    )
    v = tl.load(
        V + b * stride_vz + hkv * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
        mask=key_ok,
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    causal_off = N_K - N_Q + WIN_RIGHT
    left_off = N_K - N_Q - WIN_LEFT
    lo, mid_lo, mid_hi, hi = query_ranges(
        n0=start_n,
        N_Q=N_Q,
        N_K=N_K,
        WIN_LEFT=WIN_LEFT,
        WIN_RIGHT=WIN_RIGHT,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        CAUSAL=CAUSAL,
        WINDOW=WINDOW,
    )
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        bh = b * H + h
        q_src = Q + b * stride_qz + h * stride_qh
        do_src = DO + b * stride_doz + h * stride_doh
        if TMA:
            q_src = QD
            do_src = DOD
        p_base = P + b * stride_pz + h * stride_ph
        for start_m in range(lo, mid_lo, BLOCK_M):
            dk, dv = _dkdv_block(
                dk=dk,
                dv=dv,
                k=k,
                v=v,
                q_src=q_src,
                do_src=do_src,
                desc_b=b.to(tl.int32),
                desc_h=h.to(tl.int32),
                lse_base=LSE + bh * rows_q,
                delta_base=DELTA + bh * rows_q,
                p_base=p_base,
                stride_qm=stride_qm,
                stride_dom=stride_dom,
                stride_pm=stride_pm,
                stride_pn=stride_pn,
                start_m=start_m,
                offs_n=offs_n,
                N_Q=N_Q,
                N_K=N_K,
                CAUSAL_OFF=causal_off,
                LEFT_OFF=left_off,
                qk_scale=qk_scale,
                HEAD_DIM=HEAD_DIM,
                BLOCK_M=BLOCK_M,
                BLOCK_N=BLOCK_N,
                CAUSAL=CAUSAL,
                WINDOW=WINDOW,
                MASK=True,
                STORED_P=STORED_P,
                IEEE=IEEE,
                TMA=TMA,
            )
        for start_m in range(mid_lo, mid_hi, BLOCK_M):
            dk, dv = _dkdv_block(
                dk=dk,
                dv=dv,
                k=k,
                v=v,
                q_src=q_src,
                do_src=do_src,
                desc_b=b.to(tl.int32),
                desc_h=h.to(tl.int32),
                lse_base=LSE + bh * rows_q,
                delta_base=DELTA + bh * rows_q,
                p_base=p_base,
                stride_qm=stride_qm,
                stride_dom=stride_dom,
                stride_pm=stride_pm,
                stride_pn=stride_pn,
                start_m=start_m,
                offs_n=offs_n,
                N_Q=N_Q,
                N_K=N_K,
                CAUSAL_OFF=causal_off,
                LEFT_OFF=left_off,
                qk_scale=qk_scale,
                HEAD_DIM=HEAD_DIM,
                BLOCK_M=BLOCK_M,
                BLOCK_N=BLOCK_N,
                CAUSAL=CAUSAL,
                WINDOW=WINDOW,
                MASK=False,
                STORED_P=STORED_P,
                IEEE=IEEE,
                TMA=TMA,
            )
        for start_m in range(mid_hi, hi, BLOCK_M):
            dk, dv = _dkdv_block(
                dk=dk,
                dv=dv,
                k=k,
                v=v,
                q_src=q_src,
                do_src=do_src,
                desc_b=b.to(tl.int32),
                desc_h=h.to(tl.int32),
                lse_base=LSE + bh * rows_q,
                delta_base=DELTA + bh * rows_q,
                p_base=p_base,
                stride_qm=stride_qm,
                stride_dom=stride_dom,
                stride_pm=stride_pm,
                stride_pn=stride_pn,
                start_m=start_m,
                offs_n=offs_n,
                N_Q=N_Q,
                N_K=N_K,
                CAUSAL_OFF=causal_off,
                LEFT_OFF=left_off,
                qk_scale=qk_scale,
                HEAD_DIM=HEAD_DIM,
                BLOCK_M=BLOCK_M,
                BLOCK_N=BLOCK_N,
                CAUSAL=CAUSAL,
                WINDOW=WINDOW,
                MASK=True,
                STORED_P=STORED_P,
                IEEE=IEEE,
                TMA=TMA,
            )
    dk = dk * sm_scale
    tl.store(
        DK + b * stride_dkz + hkv * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=key_ok,
    )
    tl.store(
        DV + b * stride_dvz + hkv * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=key_ok,
    )

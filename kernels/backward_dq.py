"""The dQ pass of the attention backward (backward.py launches it): one program per (query block, batch *
head).

Origin: Dao, "FlashAttention-2" (2023), Algorithm 2, in the shape of Triton's fused-attention tutorial.
Loop order: Q, dO, LSE2 and D of the program's query block stay resident; K and V are streamed as in the
forward, over the same key ranges (a window's left edge, mask-free blocks, then the causal diagonal and the tail;
forward_blocks.key_ranges): dP = dO V^T,
dS = P * (dP - D), dQ += dS K; at the end dQ *= sm_scale. P is recomputed (exp2(Q K^T * qk_scale - LSE2)) or
loaded (STORED_P).

Caution: key columns past N_K are masked, since they would otherwise get P = exp2(0 - LSE2) != 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import document_block, dot
from .forward_blocks import key_ranges


@triton.jit
def _dq_block(
    dq,  # [BLOCK_M, HEAD_DIM] fp32 accumulator
    q,  # [BLOCK_M, HEAD_DIM] query tile
    do,  # [BLOCK_M, HEAD_DIM] dO tile
    lse,  # [BLOCK_M] fp32 LSE2 (+inf past N_Q)
    delta,  # [BLOCK_M] fp32 rowsum(dO * O)
    k_src,  # TMA: host descriptor of K ([B, H_KV, N_K, D]); else pointer to K[b, hkv, 0, 0]
    v_src,  # the same for V
    desc_b,  # batch and K/V head: the first coordinates of a host descriptor
    desc_h,
    p_base,  # pointer to P[b, h, 0, 0] (STORED_P only)
    stride_kn,
    stride_vn,
    stride_pm,
    stride_pn,
    start_n,  # first key of this block
    offs_m,  # [BLOCK_M] query rows
    N_Q,
    N_K,
    CAUSAL_OFF,  # query i sees key j only if j <= i + CAUSAL_OFF (CAUSAL)
    LEFT_OFF,  # query i sees key j only if j >= i + LEFT_OFF (WINDOW)
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    MASK: tl.constexpr,  # tail / causal / window mask needed in this block
    STORED_P: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    valid = offs_n[None, :] < N_K
    if CAUSAL:
        valid = valid & (offs_m[:, None] + CAUSAL_OFF >= offs_n[None, :])
    if WINDOW:
        valid = valid & (offs_n[None, :] >= offs_m[:, None] + LEFT_OFF)
    if TMA:  # rows past N_K arrive as zeros
        k = k_src.load([desc_b, desc_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_src.load([desc_b, desc_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        k_ptrs = k_src + offs_n[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_src + offs_n[:, None] * stride_vn + offs_d[None, :]
        if MASK:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < N_K, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < N_K, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    if STORED_P:
        p_ptrs = p_base + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
        if MASK:
            p = tl.load(p_ptrs, mask=(offs_m[:, None] < N_Q) & valid, other=0.0).to(tl.float32)
        else:
            p = tl.load(p_ptrs, mask=offs_m[:, None] < N_Q, other=0.0).to(tl.float32)
    else:
        qk = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE) * qk_scale
        p = tl.math.exp2(qk - lse[:, None])
        if MASK:
            p = tl.where(valid, p, 0.0)
    dp = dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE)
    ds = p * (dp - delta[:, None])
    dq = dot(ds.to(k.dtype), k, dq, IEEE)
    return dq


@triton.jit
def _bwd_dq(
    Q,  # [B, H, N_Q, D]
    K,  # [B, H_KV, N_K, D]
    V,  # [B, H_KV, N_K, D]
    DO,  # [B, H, N_Q, D]
    LSE,  # [B, H, N_Q] fp32 contiguous
    DELTA,  # [B, H, N_Q] fp32 contiguous
    P,  # [B, H, N_Q, N_K] stored probabilities (STORED_P) or any placeholder
    DQ,  # [B, H, N_Q, D] out
    KD,  # TMA: host descriptor of K ([B, H_KV, N_K, D], block [1, 1, BLOCK_N, D]); else K again (unused)
    VD,  # the same for V
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
    stride_dqz,
    stride_dqh,
    stride_dqm,
    H,  # query heads
    GROUP,  # H // H_KV
    N_Q,  # query length (VARLEN: rows of the packed queries, B = 1)
    N_K,  # key length (VARLEN: rows of the packed keys)
    qk_scale,
    sm_scale,
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
    TMA: tl.constexpr,  # stream K and V through the host descriptors KD, VD
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,  # packed documents: a program is a query block of one document (common.document_block)
):
    pid_m = tl.program_id(0)
    rows_q = N_Q  # LSE and DELTA rows per head
    if VARLEN:
        pid_m, q_row0, N_Q, k_row0, N_K = document_block(
            CU_Q, CU_K, NUM_DOCS, N_Q, N_K, pid_m, BLOCK_M, False
        )
        Q += q_row0.to(tl.int64) * stride_qm
        DO += q_row0.to(tl.int64) * stride_dom
        DQ += q_row0.to(tl.int64) * stride_dqm
        LSE += q_row0
        DELTA += q_row0
        K += k_row0.to(tl.int64) * stride_kn
        V += k_row0.to(tl.int64) * stride_vn
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hkv = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(
        Q + b * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + b * stride_doz + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    lse = tl.load(LSE + pid_bh.to(tl.int64) * rows_q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * rows_q + offs_m, mask=row_ok, other=0.0)
    k_src = K + b * stride_kz + hkv * stride_kh
    v_src = V + b * stride_vz + hkv * stride_vh
    if TMA:
        k_src = KD
        v_src = VD
    p_base = P + b * stride_pz + h * stride_ph
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    causal_off = N_K - N_Q + WIN_RIGHT
    left_off = N_K - N_Q - WIN_LEFT
    lo, mid_lo, mid_hi, hi = key_ranges(
        m0=pid_m * BLOCK_M,
        N_Q=N_Q,
        N_K=N_K,
        WIN_LEFT=WIN_LEFT,
        WIN_RIGHT=WIN_RIGHT,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        CAUSAL=CAUSAL,
        WINDOW=WINDOW,
    )
    for start_n in range(lo, mid_lo, BLOCK_N):
        dq = _dq_block(
            dq=dq,
            q=q,
            do=do,
            lse=lse,
            delta=delta,
            k_src=k_src,
            v_src=v_src,
            desc_b=b.to(tl.int32),
            desc_h=hkv.to(tl.int32),
            p_base=p_base,
            stride_kn=stride_kn,
            stride_vn=stride_vn,
            stride_pm=stride_pm,
            stride_pn=stride_pn,
            start_n=start_n,
            offs_m=offs_m,
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
    for start_n in range(mid_lo, mid_hi, BLOCK_N):
        dq = _dq_block(
            dq=dq,
            q=q,
            do=do,
            lse=lse,
            delta=delta,
            k_src=k_src,
            v_src=v_src,
            desc_b=b.to(tl.int32),
            desc_h=hkv.to(tl.int32),
            p_base=p_base,
            stride_kn=stride_kn,
            stride_vn=stride_vn,
            stride_pm=stride_pm,
            stride_pn=stride_pn,
            start_n=start_n,
            offs_m=offs_m,
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
    for start_n in range(mid_hi, hi, BLOCK_N):
        dq = _dq_block(
            dq=dq,
            q=q,
            do=do,
            lse=lse,
            delta=delta,
            k_src=k_src,
            v_src=v_src,
            desc_b=b.to(tl.int32),
            desc_h=hkv.to(tl.int32),
            p_base=p_base,
            stride_kn=stride_kn,
            stride_vn=stride_vn,
            stride_pm=stride_pm,
            stride_pn=stride_pn,
            start_n=start_n,
            offs_m=offs_m,
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
    dq = dq * sm_scale
    tl.store(
        DQ + b * stride_dqz + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )

"""Attention backward shared by the three kernels: recompute P (FlashAttention-2) or read the stored P.

Origin: Dao, "FlashAttention-2" (2023), Algorithm 2, in the shape of Triton's fused-attention tutorial.
Used by flash_v2.py (recompute), flash_v1.py (the same recompute backward: the v1/v2 difference is the
forward loop order only) and stored_p.py (STORED_P=True: P is read from the N x N tensor the forward wrote).

Three launches:
  1. preprocess, grid (query blocks, B*H):  D = rowsum(dO * O) in fp32.
  2. dK/dV, grid (key blocks, B*H_KV): K and V blocks resident, dK and dV accumulated in fp32 while streaming
     query blocks of every query head of the GQA group (so no atomics are needed for GQA either).
     Per query block: P^T = exp2(K Q^T * qk_scale - LSE2) (or loaded), dV += P^T dO, dP^T = V dO^T,
     dS^T = P^T * (dP^T - D), dK += dS^T Q; at the end dK *= sm_scale.
  3. dQ, grid (query blocks, B*H): Q, dO resident, K/V streamed as in the forward:
     dQ += dS K; at the end dQ *= sm_scale.

dQ strategy, a separate pass rather than fp32 atomics: every output element has one writer, so the result
is deterministic (run-to-run identical, which a benchmark's correctness check wants), there is no fp32 dQ
buffer to zero and convert, and the kernels can be autotuned (the autotuner re-runs a kernel; atomics would
accumulate across its runs). The cost is recomputing Q K^T, exp2 and dO V^T in the dQ pass: 7 block matmuls
per (query block, key block) instead of 5. The stored-P variant skips Q K^T and exp2 in both passes.

Streamed tiles (Q and dO in the dK/dV pass, K and V in the dQ pass) come through 4-D [B, H, N, D] tensor
descriptors built on the host (TMA on Hopper and newer) when `use_tma` allows, else through pointers; the
resident tiles are loaded once.

Cautions:
  - Rows that see no key have LSE2 = +inf: exp2(s - LSE2) = 0, so their P, dS and contributions are 0.
  - Query rows past N_Q load Q = dO = 0 and LSE2 = +inf (P = 0); key rows past N_K in dK/dV are computed but
    never stored; key columns past N_K in dQ are masked (they would otherwise get P = exp2(0 - LSE2) != 0).
  - Gradients are returned contiguous in the input dtype; dO may have any strides (unit last stride).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .common import LOG2E, cdiv, dot, seq_bucket, unit_stride
from .configs import BWD_DKDV_SPACE, BWD_DQ_SPACE, INTERPRET_BWD
from .descriptors import host_descriptor, use_tma
from .launch import launch

# Backward configs of the most recent backward launch (dkdv, dq), for whoever wants to record them.
_LAST_BWD_CONFIG: dict[str, Any] = {}


def last_bwd_config() -> dict[str, Any]:
    """{"dkdv": config, "dq": config} of the most recent backward launch (empty before any)."""
    return {k: dict(v) for k, v in _LAST_BWD_CONFIG.items()}


@triton.jit
def _bwd_preprocess(
    O,  # [B, H, N_Q, D] forward output
    DO,  # [B, H, N_Q, D] gradient of the output
    DELTA,  # [B, H, N_Q] fp32 contiguous, out: rowsum(dO * O)
    stride_oz,
    stride_oh,
    stride_om,
    stride_od,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    H,  # query heads
    N_Q,  # query length
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < N_Q
    o = tl.load(
        O + b * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        mask=row_ok,
        other=0.0,
    )
    do = tl.load(
        DO + b * stride_doz + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        mask=row_ok,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


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
    stride_qd,
    stride_dom,
    stride_dod,
    stride_pm,
    stride_pn,
    start_m,  # first query row of this block
    offs_n,  # [BLOCK_N] key indices of the resident block
    N_Q,
    N_K,
    CAUSAL_OFF,  # seq_k - seq_q
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,  # apply the causal mask in this block
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
        q = tl.load(
            q_src + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0
        )
        do = tl.load(
            do_src + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
            mask=row_ok[:, None],
            other=0.0,
        )
    delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    if STORED_P:
        valid = row_ok[None, :] & (offs_n[:, None] < N_K)
        if MASK:
            valid = valid & (offs_m[None, :] + CAUSAL_OFF >= offs_n[:, None])
        pt_ptrs = p_base + offs_m[None, :] * stride_pm + offs_n[:, None] * stride_pn  # P^T tile [BN, BM]
        pt = tl.load(pt_ptrs, mask=valid, other=0.0).to(tl.float32)
    else:
        lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
        qkt = dot(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), IEEE) * qk_scale
        pt = tl.math.exp2(qkt - lse[None, :])
        if MASK:
            pt = tl.where(offs_m[None, :] + CAUSAL_OFF >= offs_n[:, None], pt, 0.0)
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
    stride_qd,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_pz,
    stride_ph,
    stride_pm,
    stride_pn,
    stride_dkz,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    stride_dvz,
    stride_dvh,
    stride_dvn,
    stride_dvd,
    H,  # query heads
    H_KV,  # key/value heads
    GROUP,  # H // H_KV
    N_Q,
    N_K,
    qk_scale,  # sm_scale * log2(e)
    sm_scale,  # softmax scale (dK = sm_scale * dS^T Q)
    N_BUCKET,  # autotune key only
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    STORED_P: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,  # stream Q and dO through the host descriptors QD, DOD
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    b = (pid_bkv // H_KV).to(tl.int64)
    hkv = (pid_bkv % H_KV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n[:, None] < N_K
    k = tl.load(
        K + b * stride_kz + hkv * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
        mask=key_ok,
        other=0.0,
    )
    v = tl.load(
        V + b * stride_vz + hkv * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
        mask=key_ok,
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    causal_off = N_K - N_Q
    if CAUSAL:
        # Query rows < lo see no key of this block; rows >= full_start see all of them.
        lo = (tl.maximum(0, start_n - causal_off) // BLOCK_M) * BLOCK_M
        full_start = ((tl.maximum(0, start_n + BLOCK_N - 1 - causal_off) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        masked_end = tl.minimum(full_start, N_Q)
    else:
        lo = 0
        full_start = 0
        masked_end = 0
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        bh = b * H + h
        q_src = Q + b * stride_qz + h * stride_qh
        do_src = DO + b * stride_doz + h * stride_doh
        if TMA:
            q_src = QD
            do_src = DOD
        p_base = P + b * stride_pz + h * stride_ph
        for start_m in range(lo, masked_end, BLOCK_M):
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_src, do_src, b.to(tl.int32), h.to(tl.int32), LSE + bh * N_Q, DELTA + bh * N_Q,
                p_base, stride_qm, stride_qd, stride_dom, stride_dod, stride_pm, stride_pn, start_m, offs_n, N_Q,
                N_K, causal_off, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True, STORED_P, IEEE, TMA,
            )  # fmt: skip
        for start_m in range(full_start, N_Q, BLOCK_M):
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_src, do_src, b.to(tl.int32), h.to(tl.int32), LSE + bh * N_Q, DELTA + bh * N_Q,
                p_base, stride_qm, stride_qd, stride_dom, stride_dod, stride_pm, stride_pn, start_m, offs_n, N_Q,
                N_K, causal_off, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, STORED_P, IEEE, TMA,
            )  # fmt: skip
    dk = dk * sm_scale
    tl.store(
        DK + b * stride_dkz + hkv * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
        dk.to(DK.dtype.element_ty),
        mask=key_ok,
    )
    tl.store(
        DV + b * stride_dvz + hkv * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
        dv.to(DV.dtype.element_ty),
        mask=key_ok,
    )


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
    stride_kd,
    stride_vn,
    stride_vd,
    stride_pm,
    stride_pn,
    start_n,  # first key of this block
    offs_m,  # [BLOCK_M] query rows
    N_Q,
    N_K,
    CAUSAL_OFF,  # seq_k - seq_q
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK: tl.constexpr,  # tail / causal mask needed in this block
    STORED_P: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    valid = offs_n[None, :] < N_K
    if CAUSAL:
        valid = valid & (offs_m[:, None] + CAUSAL_OFF >= offs_n[None, :])
    if TMA:  # rows past N_K arrive as zeros
        k = k_src.load([desc_b, desc_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_src.load([desc_b, desc_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        k_ptrs = k_src + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = v_src + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
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
    stride_qd,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_pz,
    stride_ph,
    stride_pm,
    stride_pn,
    stride_dqz,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    H,  # query heads
    GROUP,  # H // H_KV
    N_Q,
    N_K,
    qk_scale,
    sm_scale,
    N_BUCKET,  # autotune key only
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    STORED_P: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,  # stream K and V through the host descriptors KD, VD
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hkv = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(
        Q + b * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + b * stride_doz + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        mask=row_ok[:, None],
        other=0.0,
    )
    lse = tl.load(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    k_src = K + b * stride_kz + hkv * stride_kh
    v_src = V + b * stride_vz + hkv * stride_vh
    if TMA:
        k_src = KD
        v_src = VD
    p_base = P + b * stride_pz + h * stride_ph
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    causal_off = N_K - N_Q
    if CAUSAL:  # the same key ranges as the forward
        hi = tl.minimum(N_K, tl.maximum(0, (pid_m + 1) * BLOCK_M + causal_off))
        full_end = tl.minimum(N_K, tl.maximum(0, pid_m * BLOCK_M + causal_off + 1))
    else:
        hi = N_K
        full_end = N_K
    full_end = (full_end // BLOCK_N) * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        dq = _dq_block(
            dq, q, do, lse, delta, k_src, v_src, b.to(tl.int32), hkv.to(tl.int32), p_base, stride_kn, stride_kd,
            stride_vn, stride_vd, stride_pm, stride_pn, start_n, offs_m, N_Q, N_K, causal_off, qk_scale,
            HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, STORED_P, IEEE, TMA,
        )  # fmt: skip
    for start_n in range(full_end, hi, BLOCK_N):
        dq = _dq_block(
            dq, q, do, lse, delta, k_src, v_src, b.to(tl.int32), hkv.to(tl.int32), p_base, stride_kn, stride_kd,
            stride_vn, stride_vd, stride_pm, stride_pn, start_n, offs_m, N_Q, N_K, causal_off, qk_scale,
            HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, STORED_P, IEEE, TMA,
        )  # fmt: skip
    dq = dq * sm_scale
    tl.store(
        DQ + b * stride_dqz + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    p: torch.Tensor | None,
    causal: bool,
    sm_scale: float,
    dkdv_config: dict[str, Any] | None = None,
    dq_config: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv for attention whose forward saved o and lse2; p is the stored P (stored-P variant) or None.

    dkdv_config / dq_config force a pass's config ({"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}, as
    `last_bwd_config()` reports it; benchmarks/kernel_configs.py uses this); otherwise they are autotuned.
    """
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    do = unit_stride(do)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    pre_m = 64
    _bwd_preprocess[(cdiv(Nq, pre_m), B * H)](
        o, do, delta, *o.stride(), *do.stride(), H, Nq, HEAD_DIM=D, BLOCK_M=pre_m
    )
    stored = p is not None
    p_arg = p if stored else lse  # placeholder, never read when STORED_P is False
    p_strides = p.stride() if stored else (0, 0, 0, 0)
    qk_scale = sm_scale * LOG2E
    bucket = seq_bucket(max(Nq, Nk))
    tma = use_tma(q, k, v, do)
    streamed = (q, do, k, v)  # what each pass streams (dK/dV: Q, dO; dQ: K, V), as descriptors or not
    if tma:
        streamed = tuple(host_descriptor(t) for t in streamed)
    constexprs = {
        "HEAD_DIM": D,
        "CAUSAL": causal,
        "STORED_P": stored,
        "IEEE": q.dtype == torch.float32,
        "TMA": tma,
    }
    name = "stored_p" if stored else "recompute"
    dkdv_args = (
        q, k, v, do, lse, delta, p_arg, dk, dv, *streamed[:2], *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *p_strides, *dk.stride(), *dv.stride(), H, Hkv, H // Hkv, Nq, Nk, qk_scale, sm_scale, bucket,
    )  # fmt: skip
    cfg_kv = launch(
        name=f"dkdv_{name}",
        kind="dkdv",
        kernel=_bwd_dkdv,
        grid=lambda meta: (cdiv(Nk, meta["BLOCK_N"]), B * Hkv),
        args=dkdv_args,
        constexprs=constexprs,
        space=BWD_DKDV_SPACE,
        forced=dkdv_config,
        interpret_config=INTERPRET_BWD,
    )
    dq_args = (
        q, k, v, do, lse, delta, p_arg, dq, *streamed[2:], *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *p_strides, *dq.stride(), H, H // Hkv, Nq, Nk, qk_scale, sm_scale, bucket,
    )  # fmt: skip
    cfg_q = launch(
        name=f"dq_{name}",
        kind="dq",
        kernel=_bwd_dq,
        grid=lambda meta: (cdiv(Nq, meta["BLOCK_M"]), B * H),
        args=dq_args,
        constexprs=constexprs,
        space=BWD_DQ_SPACE,
        forced=dq_config,
        interpret_config=INTERPRET_BWD,
    )
    _LAST_BWD_CONFIG.clear()
    _LAST_BWD_CONFIG.update({"dkdv": cfg_kv, "dq": cfg_q})
    return dq, dk, dv

"""Stored-P attention: the forward also writes P (N_Q x N_K) to memory, the backward reads it back.

Origin: flashbench's measuring device for FlashAttention's recompute trade (Dao et al. 2022, section 3.1:
recompute S and P in the backward instead of storing them). Same tiling, masks, GQA mapping and backward
kernels as flash_v2.py; only where P comes from differs, so (this backward - flash_v2's backward) is the
measured cost of recomputation and (this peak memory - flash_v2's) the memory it saves (B*H*N_Q*N_K*elem).

Loop order (forward): one program per (query block, batch*head), two sweeps over the visible K blocks:
  1. statistics only: running max m and running sum l (online softmax, no P V product);
  2. P = exp2(S * qk_scale - LSE2), already normalised, stored to P in the input dtype, and acc += P V.
The second sweep recomputes Q K^T, so this forward costs one more Q K^T than flash_v2's: its forward time
is not the comparison, the backward is. Writing normalised P needs the final row statistics, which a one-sweep
online softmax only has at the end; two sweeps also make O exactly P V for the very P that is stored.

Backward: backward.py with STORED_P=True: dK/dV and dQ passes load P blocks instead of recomputing
Q K^T and exp2 (dO V^T is still computed: dP is not stored).

Cautions:
  - P is [B, H, N_Q, N_K], contiguous, input dtype: at N = 16384 that is 512 MiB per head in fp16.
    seq_q * seq_k must stay below 2^31 (in-tile offsets into P are 32-bit): N = 32768 is the largest square.
  - Entries of P in key blocks that no query of a block can see (above the causal diagonal) are never
    written (torch.empty); the backward never reads them. Masked entries of visited blocks are written as 0.
  - Everything in flash_v2.py's cautions applies (LSE2 units, bottom-right causal, empty rows, fp32 IEEE).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .backward import attention_backward
from .common import (
    LOG2E,
    KernelUnsupported,
    _set_last_config,
    cdiv,
    check_inputs,
    dot,
    row_strides,
    seq_bucket,
)
from .configs import INTERPRET_FWD, VARIANT_FWD_SPACE, normalize_config
from .launch import attend, launch


@triton.jit
def _qk_block(
    q,  # [BLOCK_M, HEAD_DIM] query tile
    k_base,  # pointer to K[b, hkv, 0, 0]
    stride_kn,
    start_n,  # first key of the block
    offs_m,  # [BLOCK_M] query rows
    N_K,
    CAUSAL_OFF,  # seq_k - seq_q
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK: tl.constexpr,
    IEEE: tl.constexpr,
):
    """S * qk_scale for one key block, -inf where masked: [BLOCK_M, BLOCK_N] fp32."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]
    if MASK:
        kt = tl.load(kt_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
    else:
        kt = tl.load(kt_ptrs)
    qk = dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE) * qk_scale
    if MASK:
        valid = offs_n[None, :] < N_K
        if CAUSAL:
            valid = valid & (offs_m[:, None] + CAUSAL_OFF >= offs_n[None, :])
        qk = tl.where(valid, qk, float("-inf"))
    return qk


@triton.jit
def _attn_fwd_stored_p(
    Q,  # [B, H, N_Q, D] queries
    K,  # [B, H_KV, N_K, D] keys
    V,  # [B, H_KV, N_K, D] values
    O,  # [B, H, N_Q, D] output
    LSE,  # [B, H, N_Q] fp32 contiguous, log2-sum-exp2 (+inf for rows that see no key)
    P,  # [B, H, N_Q, N_K] out: softmax probabilities, input dtype
    stride_qz,
    stride_qh,
    stride_qm,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_oz,
    stride_oh,
    stride_om,
    stride_pz,
    stride_ph,
    stride_pm,
    stride_pn,
    H,  # query heads
    GROUP,  # H // H_KV
    N_Q,
    N_K,
    qk_scale,  # sm_scale * log2(e)
    N_BUCKET,  # autotune key only
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hkv = h // GROUP
    k_base = K + b * stride_kz + hkv * stride_kh
    v_base = V + b * stride_vz + hkv * stride_vh
    p_base = P + b * stride_pz + h * stride_ph
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(
        Q + b * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )

    causal_off = N_K - N_Q
    if CAUSAL:
        hi = tl.minimum(N_K, tl.maximum(0, (pid_m + 1) * BLOCK_M + causal_off))
        full_end = tl.minimum(N_K, tl.maximum(0, pid_m * BLOCK_M + causal_off + 1))
    else:
        hi = N_K
        full_end = N_K
    full_end = (full_end // BLOCK_N) * BLOCK_N

    # Sweep 1: row statistics.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, full_end, BLOCK_N):
        qk = _qk_block(
            q=q,
            k_base=k_base,
            stride_kn=stride_kn,
            start_n=start_n,
            offs_m=offs_m,
            N_K=N_K,
            CAUSAL_OFF=causal_off,
            qk_scale=qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            CAUSAL=CAUSAL,
            MASK=False,
            IEEE=IEEE,
        )
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(qk - m_new[:, None]), 1)
        m_i = m_new
    for start_n in range(full_end, hi, BLOCK_N):
        qk = _qk_block(
            q=q,
            k_base=k_base,
            stride_kn=stride_kn,
            start_n=start_n,
            offs_m=offs_m,
            N_K=N_K,
            CAUSAL_OFF=causal_off,
            qk_scale=qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            CAUSAL=CAUSAL,
            MASK=True,
            IEEE=IEEE,
        )
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2(-inf) = 0, not NaN
        l_i = l_i * tl.math.exp2(m_i - m_use) + tl.sum(tl.math.exp2(qk - m_use[:, None]), 1)
        m_i = m_new
    empty = l_i == 0.0
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))

    # Sweep 2: normalised P, stored, and O = P V.
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        qk = _qk_block(
            q=q,
            k_base=k_base,
            stride_kn=stride_kn,
            start_n=start_n,
            offs_m=offs_m,
            N_K=N_K,
            CAUSAL_OFF=causal_off,
            qk_scale=qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            CAUSAL=CAUSAL,
            MASK=True,
            IEEE=IEEE,
        )
        offs_n = start_n + tl.arange(0, BLOCK_N)
        p = tl.math.exp2(qk - lse[:, None]).to(P.dtype.element_ty)
        tl.store(
            p_base + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn,
            p,
            mask=row_ok[:, None] & (offs_n[None, :] < N_K),
        )
        v = tl.load(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :],
            mask=offs_n[:, None] < N_K,
            other=0.0,
        )
        acc = dot(p.to(v.dtype), v, acc, IEEE)

    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)
    tl.store(
        O + b * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
        acc.to(O.dtype.element_ty),
        mask=row_ok[:, None],
    )


def attention_forward_stored_p(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Launch the stored-P forward on checked inputs. Returns (o, lse2, p [B,H,Nq,Nk], config used)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    p = torch.empty((B, H, Nq, Nk), dtype=q.dtype, device=q.device)
    tensors = (q, k, v, o, lse, p)
    strides = (*row_strides(q, k, v, o), *p.stride())
    sizes = (H, H // Hkv, Nq, Nk, sm_scale * LOG2E, seq_bucket(max(Nq, Nk)))
    constexprs = {"HEAD_DIM": D, "CAUSAL": causal, "IEEE": q.dtype == torch.float32}
    cfg = launch(
        name="fwd_stored_p",
        kind="fwd",
        kernel=_attn_fwd_stored_p,
        grid=lambda meta: (cdiv(Nq, meta["BLOCK_M"]), B * H),
        args=(*tensors, *strides, *sizes),
        constexprs=constexprs,
        space=VARIANT_FWD_SPACE,
        forced=config,
        interpret_config=INTERPRET_FWD,
    )
    _set_last_config(cfg)
    return o, lse, p, cfg


class _FlashAttnStoredP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, causal, sm_scale, config):  # type: ignore[override]
        o, lse, p, _ = attention_forward_stored_p(q, k, v, causal, sm_scale, config)
        ctx.save_for_backward(q, k, v, o, lse, p)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx: Any, do):  # type: ignore[override]
        q, k, v, o, lse, p = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, p, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None, None


def flash_attn_stored_p(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention whose forward stores P (N_Q x N_K) and whose backward reads it. Same signature, inputs and
    errors as flash_attn; memory grows as B*H*N_Q*N_K (the point of the variant)."""
    q, k, v, sm_scale = check_inputs("flash_attn_stored_p", q, k, v, causal, sm_scale)
    if q.shape[2] * k.shape[2] >= 2**31:
        # In-tile offsets into P are 32-bit (row * N_K + col); the per-(b, h) base is 64-bit.
        raise KernelUnsupported(
            f"flash_attn_stored_p: seq_q * seq_k = {q.shape[2] * k.shape[2]} >= 2^31 (P per head too large)"
        )
    if config is not None:
        config = normalize_config("flash_attn_stored_p", config)
    return attend(_FlashAttnStoredP, attention_forward_stored_p, q, k, v, causal, sm_scale, config)

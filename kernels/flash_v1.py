"""FlashAttention-1 loop order: outer loop over K/V blocks, O, m and l read from and written to HBM each step.

Origin: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness" (2022),
Algorithm 1, which parallelises over batch * heads only. Here one program per (batch*head, Q_SPLIT slice):
  - prologue: O_acc = 0, m = -inf, l = 0 in HBM (Algorithm 1, line 2);
  - for each K/V block j (outer; K_j, V_j loaded once):
      for each query block i of this program's slice that can see block j (inner):
        load Q_i, O_acc_i, m_i, l_i from HBM; online-softmax update with S_ij; store O_acc_i, m_i, l_i;
  - epilogue: O = O_acc / l in the input dtype, LSE2 = m + log2(l) (fp32), as flash_v2.py saves them.
So per K/V step the kernel moves Q_i, O_acc_i (fp32), m_i and l_i through HBM where flash_v2 keeps them in
registers: the v1/v2 IO difference shows up in measured bytes and time. The running O is kept
unnormalised in fp32 (as FA1's CUDA kernel's fp32 o_tmp buffer does) and normalised once, in the epilogue.

Backward: identical to flash_v2's (backward.py, recompute): the loop-order difference is the forward only,
and this forward saves the same O and LSE2.

Cautions:
  - Parallelism: B*H*Q_SPLIT programs. Q_SPLIT = 1 (default) is Algorithm 1 as published; its low
    occupancy when B*H is small is part of what FA2 fixed, so compare v1 and v2 at B*H >= the SM count, or
    raise Q_SPLIT (config key) to separate the IO effect from the occupancy effect. Q_SPLIT slices query
    blocks round-robin; each slice re-reads all of K/V.
  - Every (query block, K/V block) step applies the tail/causal mask (no mask-free fast path): the variant
    exists to measure HBM traffic, which the mask does not change.
  - Within a program, the O_acc/m/l written in one outer step are read back in the next, possibly by other
    threads of the block: tl.debug_barrier() (bar.sync) separates the steps.
  - Workspace: O_acc fp32 [B, H, N_Q, D] and m, l fp32 [B, H, N_Q], allocated per call.
  - LSE2 units, bottom-right causal, empty rows, fp32 IEEE: as in flash_v2.py.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .common import LOG2E, _set_last_config, check_inputs, dot, row_strides, seq_bucket
from .configs import INTERPRET_FWD, VARIANT_FWD_SPACE, normalize_config
from .flash_v2 import RecomputeAttention
from .launch import attend, launch


@triton.jit
def _attn_fwd_v1(
    Q,  # [B, H, N_Q, D] queries
    K,  # [B, H_KV, N_K, D] keys
    V,  # [B, H_KV, N_K, D] values
    O,  # [B, H, N_Q, D] output (written in the epilogue)
    LSE,  # [B, H, N_Q] fp32 contiguous out: log2-sum-exp2 (+inf for rows that see no key)
    ACC,  # [B, H, N_Q, D] fp32 contiguous workspace: unnormalised running O
    M,  # [B, H, N_Q] fp32 contiguous workspace: running max (base-2 units)
    L,  # [B, H, N_Q] fp32 contiguous workspace: running sum
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
    Q_SPLIT: tl.constexpr,  # programs per batch*head; program s owns query blocks s, s + Q_SPLIT, ...
):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hkv = h // GROUP
    bh = pid_bh.to(tl.int64)
    q_base = Q + b * stride_qz + h * stride_qh
    k_base = K + b * stride_kz + hkv * stride_kh
    v_base = V + b * stride_vz + hkv * stride_vh
    acc_base = ACC + bh * N_Q * HEAD_DIM
    m_base = M + bh * N_Q
    l_base = L + bh * N_Q
    offs_d = tl.arange(0, HEAD_DIM)
    num_qb = tl.cdiv(N_Q, BLOCK_M)
    causal_off = N_K - N_Q

    # Prologue: O_acc = 0, m = -inf, l = 0 in HBM.
    for qb in range(pid_s, num_qb, Q_SPLIT):
        offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_Q
        tl.store(
            acc_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
            tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32),
            mask=row_ok[:, None],
        )
        tl.store(m_base + offs_m, tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), mask=row_ok)
        tl.store(l_base + offs_m, tl.zeros([BLOCK_M], dtype=tl.float32), mask=row_ok)
    tl.debug_barrier()

    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < N_K
        kt = tl.load(
            k_base + offs_n[None, :] * stride_kn + offs_d[:, None],
            mask=key_ok[None, :],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :],
            mask=key_ok[:, None],
            other=0.0,
        )
        if CAUSAL:
            # First query block with a row that sees key start_n (row i sees key j iff j <= i + causal_off).
            qb_lo = tl.maximum(0, start_n - causal_off) // BLOCK_M
        else:
            qb_lo = 0
        # First block >= qb_lo that belongs to this program's slice.
        qb_first = qb_lo + (pid_s - qb_lo % Q_SPLIT + Q_SPLIT) % Q_SPLIT
        for qb in range(qb_first, num_qb, Q_SPLIT):
            offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = offs_m < N_Q
            q = tl.load(
                q_base + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None],
                other=0.0,
            )
            acc_ptrs = acc_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            acc = tl.load(acc_ptrs, mask=row_ok[:, None], other=0.0)
            m_i = tl.load(m_base + offs_m, mask=row_ok, other=float("-inf"))
            l_i = tl.load(l_base + offs_m, mask=row_ok, other=0.0)
            qk = dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE) * qk_scale
            valid = key_ok[None, :]
            if CAUSAL:
                valid = valid & (offs_m[:, None] + causal_off >= offs_n[None, :])
            qk = tl.where(valid, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2 -> 0, not NaN
            p = tl.math.exp2(qk - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
            tl.store(acc_ptrs, acc, mask=row_ok[:, None])
            tl.store(m_base + offs_m, m_new, mask=row_ok)
            tl.store(l_base + offs_m, l_i, mask=row_ok)
        tl.debug_barrier()

    # Epilogue: normalise and write O and LSE2.
    for qb in range(pid_s, num_qb, Q_SPLIT):
        offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_Q
        acc = tl.load(
            acc_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0
        )
        m_i = tl.load(m_base + offs_m, mask=row_ok, other=0.0)
        l_i = tl.load(l_base + offs_m, mask=row_ok, other=0.0)
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
        tl.store(LSE + bh * N_Q + offs_m, lse, mask=row_ok)
        tl.store(
            O + b * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
            (acc / l_safe[:, None]).to(O.dtype.element_ty),
            mask=row_ok[:, None],
        )


def attention_forward_v1(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Launch the FA1-order forward on checked inputs. Returns (o, lse2, config used)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    acc = torch.empty((B, H, Nq, D), dtype=torch.float32, device=q.device)
    m = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    l = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    q_split = 1 if config is None else config["Q_SPLIT"]
    tensors = (q, k, v, o, lse, acc, m, l)
    sizes = (H, H // Hkv, Nq, Nk, sm_scale * LOG2E, seq_bucket(max(Nq, Nk)))
    constexprs = {"HEAD_DIM": D, "CAUSAL": causal, "IEEE": q.dtype == torch.float32}
    cfg = launch(
        name="fwd_v1",
        kind="fwd",
        kernel=_attn_fwd_v1,
        grid=lambda meta: (B * H, meta["Q_SPLIT"]),
        args=(*tensors, *row_strides(q, k, v, o), *sizes),
        constexprs=constexprs,
        space=VARIANT_FWD_SPACE,
        forced=config,
        interpret_config=INTERPRET_FWD,
        extra={"Q_SPLIT": q_split},
    )
    _set_last_config(cfg)
    return o, lse, cfg


def flash_attn_v1(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention with FlashAttention-1's loop order (K/V outer, O/m/l through HBM each step); backward as
    flash_attn's. Same signature, inputs and errors as flash_attn; config may also set Q_SPLIT (default 1)."""
    q, k, v, sm_scale = check_inputs("flash_attn_v1", q, k, v, causal, sm_scale)
    if config is not None:
        config = normalize_config("flash_attn_v1", config, extra_keys={"Q_SPLIT": 1})
    return attend(
        RecomputeAttention, attention_forward_v1, q, k, v, causal, sm_scale, config, attention_forward_v1
    )

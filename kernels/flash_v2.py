"""FlashAttention-2 forward (online softmax) with the recompute backward, and its autograd glue.

Origin: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (2023),
Algorithm 1, in the shape of Triton's fused-attention tutorial (06-fused-attention.py): one program per
(query block, batch*head); Q block resident; K/V streamed block by block.

Loop order: outer (grid) over query blocks, inner over key/value blocks. Per K/V block: S = Q K^T * scale,
running max m and running sum l updated, the fp32 accumulator rescaled by exp2(m_old - m_new), acc += P V.
O is written once at the end (acc / l) and the per-row log-sum-exp is saved in fp32 for the backward.

Cautions:
  - exp2 everywhere: log2(e) is folded into the scale (qk_scale = sm_scale * log2(e)), so the saved LSE is
    in base-2 units, LSE2 = log2(sum_j exp2(s_ij * qk_scale)); it is an internal tensor.
  - Causal masks are aligned bottom-right when seq_q != seq_k (flash-attn's convention): query i sees key j
    iff j <= i + (seq_k - seq_q). Rows that see no key (seq_q > seq_k) output 0 and get LSE2 = +inf, so the
    backward's exp2(s - LSE2) is 0 there; their gradients are 0.
  - Sliding windows (flash-attn's window_size): a right limit is the causal mask shifted by `right` keys
    (CAUSAL with WIN_RIGHT), a left limit masks keys before i + (seq_k - seq_q) - left (WINDOW). Rows that
    see no key are handled as above.
  - Key blocks are split into a mask-free range (blocks entirely visible and inside seq_k) and masked ranges
    (a window's left edge; the causal diagonal and the tail block), so any sequence length works and full
    blocks pay no masking cost; blocks no row of the tile sees are not visited (forward_blocks.key_ranges), so
    the work of a windowed tile scales with the window, not with seq_k.
  - P is cast to the input dtype before P @ V (as flash-attn does); acc, m, l and LSE stay fp32.
  - fp32 inputs use IEEE fp32 dots (no TF32) so that fp32 is a precise reference path, not a fast one.
  - GQA: query head h reads K/V head h // (heads // kv_heads).
  - Offsets of batch/head bases are int64 (B*H*N*D can pass 2^31 elements).
  - Hopper and newer (`use_tma`): Q, K, V and O move through 4-D [B, H, N, D] tensor descriptors built on the
    host (loads past N zero-filled within the head, stores clipped; faster than per-head descriptors built by
    every program); elsewhere through pointers.
  - Causal grids run their query blocks from the last, heaviest one, so the light ones fill the grid's tail
    (+5.4% at d = 128 N = 16384; the dQ pass gained nothing).
  - Causal, BLOCK_N > BLOCK_M: the masked key range (the diagonal) runs in blocks of BLOCK_N // 2: with 64-row
    query tiles and 128-key blocks every other tile's diagonal block lies half past the diagonal (+4.5% at
    d = 64 causal N = 2048).
  - Measured and left out: P V issued after the next block's Q K^T, Triton's warp_specialize on the key loop.
The numbers and their commands: docs/kernels.md.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl

from . import flash_ws
from .backward import attention_backward
from .common import (
    LOG2E,
    NOT_VARLEN,
    KernelUnsupported,
    _set_last_config,
    cdiv,
    check_inputs,
    check_window,
    document_block,
    seq_bucket,
    window_flags,
)
from .configs import FWD_SPACE, INTERPRET_FWD, normalize_config
from .descriptors import host_descriptor, twin_descriptor, use_tma
from .forward_blocks import fwd_block, key_ranges
from .launch import PlanCache, TunedCall, attend, config_key, env_key, tensor_key


@triton.jit
def _attn_fwd(
    Q,  # [B, H, N_Q, D] queries (any strides, unit last stride)
    K,  # [B, H_KV, N_K, D] keys
    V,  # [B, H_KV, N_K, D] values
    O,  # [B, H, N_Q, D] output, written once
    LSE,  # [B, H, N_Q] fp32 contiguous: log2-sum-exp2 per row, +inf for rows that see no key
    KD,  # TMA: host descriptor of K ([B, H_KV, N_K, D], block [1, 1, BLOCK_N, D]); else K again (unused)
    VD,  # the same for V
    KD2,  # causal with TMA: host descriptors of K and V with half-height blocks ([1, 1, BLOCK_N // 2, D]);
    VD2,  # else K, V again (unused)
    QD,  # TMA: host descriptor of Q ([B, H, N_Q, D], block [1, 1, BLOCK_M, D]); else Q again (unused)
    OD,  # the same for O
    stride_qz,  # strides of B, H and N (row_strides); the last dimension is unit-stride
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
    GROUP,  # H // H_KV: query heads per K/V head
    N_Q,  # query length (VARLEN: rows of the packed queries, B = 1)
    N_K,  # key length (VARLEN: rows of the packed keys)
    qk_scale,  # sm_scale * log2(e)
    WIN_LEFT,  # WINDOW: query i sees keys from position i + N_K - N_Q - WIN_LEFT on
    WIN_RIGHT,  # CAUSAL: query i sees keys up to position i + N_K - N_Q + WIN_RIGHT (0: a causal mask)
    N_BUCKET,  # autotune key only: next power of two of max(N_Q, N_K)
    CU_Q,  # VARLEN: int32 [NUM_DOCS + 1] prefix sums of the documents' query lengths; else None
    CU_K,  # VARLEN: the same for the keys; else None
    NUM_DOCS,  # VARLEN: documents; else None
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,  # keys right of the row's window are masked (causal, or a window's right limit)
    WINDOW: tl.constexpr,  # keys left of the row's window are masked (a sliding window's left limit)
    IEEE: tl.constexpr,  # fp32 inputs: IEEE dots
    TMA: tl.constexpr,  # Q, K, V, O through the host descriptors QD, KD, VD, OD (TMA, sm90+)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,  # packed documents: a program is a query block of one document (common.document_block)
):
    pid_m = tl.program_id(0)
    rows_q = N_Q  # LSE rows per head
    if VARLEN:  # each document is a sequence of its own, aligned bottom-right by its own lengths
        pid_m, q_row0, N_Q, k_row0, N_K = document_block(
            CU_Q, CU_K, NUM_DOCS, N_Q, N_K, pid_m, BLOCK_M, CAUSAL
        )
        Q += q_row0.to(tl.int64) * stride_qm
        O += q_row0.to(tl.int64) * stride_om
        LSE += q_row0
        K += k_row0.to(tl.int64) * stride_kn
        V += k_row0.to(tl.int64) * stride_vn
    elif CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # the last query blocks see the most keys: run them first
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hkv = h // GROUP
    kv_b = (pid_bh // H).to(tl.int32)  # descriptor coordinates are 32-bit
    q_h = (pid_bh % H).to(tl.int32)
    kv_h = q_h // GROUP
    q_base = Q + b * stride_qz + h * stride_qh
    k_base = K + b * stride_kz + hkv * stride_kh
    v_base = V + b * stride_vz + hkv * stride_vh
    o_base = O + b * stride_oz + h * stride_oh
    # The masked key range (the causal diagonal, a ragged tail) in blocks of MASK_N keys, streamed by k_mask and
    # v_mask: half-width where keys are wider than the query tile (see the module docstring), else BLOCK_N.
    HALVE: tl.constexpr = CAUSAL and BLOCK_N > BLOCK_M
    MASK_N: tl.constexpr = BLOCK_N // 2 if HALVE else BLOCK_N
    if TMA:
        # The host's 4-D descriptors: loads past N_K are zero-filled per head, never another head's rows.
        k_src = KD
        v_src = VD
        if HALVE:
            k_mask = KD2
            v_mask = VD2
        else:
            k_mask = KD
            v_mask = VD
    else:
        k_src = k_base
        v_src = v_base
        k_mask = k_base
        v_mask = v_base

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        # Q straight into shared memory (rows past N_Q arrive as zeros); O leaves the same way below.
        q = QD.load([kv_b, q_h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    else:
        q = tl.load(
            q_base + offs_m[:, None] * stride_qm + offs_d[None, :],
            mask=offs_m[:, None] < N_Q,
            other=0.0,
        )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

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
    # Three loops over the key blocks: the window's left edge (masked), every row sees all keys (no mask), the
    # causal diagonal and the tail (masked, in MASK_N-key blocks). Blocks outside [lo, hi) are never visited.
    for start_n in tl.range(lo, mid_lo, BLOCK_N):
        acc, l_i, m_i = fwd_block(
            acc=acc,
            l_i=l_i,
            m_i=m_i,
            q=q,
            k_src=k_src,
            v_src=v_src,
            stride_kn=stride_kn,
            stride_vn=stride_vn,
            kv_b=kv_b,
            kv_h=kv_h,
            start_n=start_n,
            offs_m=offs_m,
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
            IEEE=IEEE,
            TMA=TMA,
        )
    for start_n in tl.range(mid_lo, mid_hi, BLOCK_N):
        acc, l_i, m_i = fwd_block(
            acc=acc,
            l_i=l_i,
            m_i=m_i,
            q=q,
            k_src=k_src,
            v_src=v_src,
            stride_kn=stride_kn,
            stride_vn=stride_vn,
            kv_b=kv_b,
            kv_h=kv_h,
            start_n=start_n,
            offs_m=offs_m,
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
            IEEE=IEEE,
            TMA=TMA,
        )
    for start_n in tl.range(mid_hi, hi, MASK_N):
        acc, l_i, m_i = fwd_block(
            acc=acc,
            l_i=l_i,
            m_i=m_i,
            q=q,
            k_src=k_mask,
            v_src=v_mask,
            stride_kn=stride_kn,
            stride_vn=stride_vn,
            kv_b=kv_b,
            kv_h=kv_h,
            start_n=start_n,
            offs_m=offs_m,
            N_K=N_K,
            CAUSAL_OFF=causal_off,
            LEFT_OFF=left_off,
            qk_scale=qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_M=BLOCK_M,
            BLOCK_N=MASK_N,
            CAUSAL=CAUSAL,
            WINDOW=WINDOW,
            MASK=True,
            IEEE=IEEE,
            TMA=TMA,
        )

    empty = l_i == 0.0  # rows that see no key (causal, seq_q > seq_k)
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    row_ok = offs_m < N_Q
    tl.store(LSE + pid_bh.to(tl.int64) * rows_q + offs_m, lse, mask=row_ok)
    if TMA:  # rows past N_Q are clipped by the descriptor's bounds
        OD.store([kv_b, q_h, pid_m * BLOCK_M, 0], out.to(O.dtype.element_ty).reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        tl.store(
            o_base + offs_m[:, None] * stride_om + offs_d[None, :],
            out.to(O.dtype.element_ty),
            mask=row_ok[:, None],
        )


class _TlForward:
    """The tl forward's launch plan for one input signature: mask flags, TMA or pointers, strides, the grid;
    its config is picked on the first call (launch.TunedCall) and launched directly after."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        config: dict[str, Any] | None,
        window: tuple[int, int] | None,
    ) -> None:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        self.o_shape, self.lse_shape = (B, H, Nq, D), (B, H, Nq)
        right_limit, left_limit, win_left, win_right = window_flags(causal, window)
        self.tma = use_tma(q, k, v)
        self.twin = self.tma and right_limit  # the half-width diagonal blocks' descriptors
        o_strides = (H * Nq * D, Nq * D, D)
        self.strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o_strides)
        self.sizes = (H, H // Hkv, Nq, Nk)
        self.tail = (win_left, win_right, seq_bucket(max(Nq, Nk)))
        self.call = TunedCall(
            name="fwd_v2",
            kind="fwd",
            kernel=_attn_fwd,
            grid=lambda meta: (cdiv(Nq, meta["BLOCK_M"]), B * H),
            constexprs={
                "HEAD_DIM": D,
                "CAUSAL": right_limit,
                "WINDOW": left_limit,
                "IEEE": q.dtype == torch.float32,
                "TMA": self.tma,
                **NOT_VARLEN,
            },
            space=FWD_SPACE,
            forced=config,
            interpret_config=INTERPRET_FWD,
        )

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        o = torch.empty(size=self.o_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(size=self.lse_shape, dtype=torch.float32, device=q.device)
        run_args = (*self.strides, *self.sizes, sm_scale * LOG2E, *self.tail)
        if not self.tma or self.call.direct:
            # pointers, or the compiled kernel's descriptors' tensors (KD2, VD2: twins, or pointers without twins)
            descs: tuple[Any, ...] = (k, v, k, v, q, o)
        else:  # the JIT's calls: real descriptors, sized per config by the TunedCall
            kd, vd, qd, od = (host_descriptor(t) for t in (k, v, q, o))
            kd2, vd2 = (twin_descriptor(kd), twin_descriptor(vd)) if self.twin else (k, v)
            descs = (kd, vd, kd2, vd2, qd, od)
        cfg = self.call((q, k, v, o, lse, *descs, *run_args))
        return o, lse, cfg


def _forward_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: dict[str, Any] | None,
    window: tuple[int, int] | None,
) -> Any:
    """The Gluon forward's plan where it takes these inputs (flash_ws.ForwardPlan), else the tl kernel's."""
    if config.get("kernel") == "gluon-ws" if config else flash_ws.preferred(q, k, v, causal, window):
        try:
            return flash_ws.ForwardPlan(q, k, v, causal, config, window)
        except ValueError as exc:
            raise KernelUnsupported(f"flash_attn: {exc}") from None
    return _TlForward(q, k, v, causal, config, window)


_PLANS = PlanCache(_forward_plan)


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None = None,
    window: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Launch the FA2 forward on checked inputs (window: as `check_window` returns it). Returns (o [B,H,Nq,D],
    lse2 [B,H,Nq] fp32, config used).

    On Hopper, fp16/bf16 at the head dims and lengths of flash_ws.GLUON_MIN_SEQ (and shapes it supports), the
    forward is flash_ws's warp-specialized Gluon kernel unless a Triton config is forced or FLASHBENCH_GLUON=0;
    a config with "kernel": "gluon-ws" forces it. Both write the same O and base-2 LSE. The choice, the config
    and the launch geometry are made once per input signature (launch.PlanCache).
    """
    key = (
        tensor_key(q),
        tensor_key(k),
        tensor_key(v),
        q.device,
        causal,
        window,
        config_key(config),
        env_key(),
    )
    return _run_plan(_PLANS.get(key, q, k, v, causal, config, window), q, k, v, causal, sm_scale)


def _run_plan(
    plan: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float, *_: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """A forward plan's launch, in attention_forward's signature once `plan` is bound (`causal` and a config
    are the plan's)."""
    o, lse, cfg = plan.run(q, k, v, sm_scale)
    _set_last_config(cfg)
    return o, lse, cfg


# A call signature seen before, with everything its checks and plan lookup concluded: (the forward launcher bound
# to its plan, the softmax scale, the checked window, the backward plans of its calls (backward.attention_backward's
# `plans`)). Only signatures whose checks return the inputs themselves (unit-stride, scale >= 0) are kept, so a hit
# is exactly what the checks would have done.
_CHECKED = PlanCache(lambda: None)  # filled by flash_attn's put(), never made by get()


def _signature(q: Any, k: Any, v: Any, causal: Any, sm_scale: Any, window: Any) -> tuple[Any, ...] | None:
    """The key of `_CHECKED` for a call, or None where it has none (under torch.compile, arguments that are not
    tensors): the tensors' plan keys, the device, the arguments with their types (causal=1 is
    refused where True is not) and the environment switches. An unhashable one raises TypeError where it is
    looked up."""
    if torch.compiler.is_compiling() or type(causal) is not bool:
        return None
    try:
        win = window if window is None else tuple((type(x), x) for x in window)
        key = (tensor_key(q), tensor_key(k), tensor_key(v), q.device, causal, type(sm_scale), sm_scale, win)
    except (AttributeError, TypeError):
        return None
    return (*key, env_key())


class RecomputeAttention(torch.autograd.Function):
    """Autograd glue shared by every forward whose backward recomputes P from the saved log-sum-exp
    (this file's FA2 order and flash_v1's FA1 order): `forward_fn` is the forward launcher."""

    @staticmethod
    def forward(ctx: Any, q, k, v, causal, sm_scale, config, forward_fn=None, window=None, plans=None):  # type: ignore[override]
        o, lse, _ = (forward_fn or attention_forward)(q, k, v, causal, sm_scale, config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        ctx.window = window
        ctx.plans = plans  # the backward plans of flash_attn's call signature (_CHECKED), or None
        return o

    @staticmethod
    def backward(ctx: Any, do):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(
            q, k, v, o, lse, do, None, ctx.causal, ctx.sm_scale, window=ctx.window, plans=ctx.plans
        )
        return dq, dk, dv, None, None, None, None, None, None


def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: dict[str, Any] | None = None,
    window: tuple[int, int] | None = None,
) -> torch.Tensor:
    """FlashAttention-2 attention, a drop-in for scaled_dot_product_attention on [B, H, N, D] tensors.

    q: [B, H, Nq, D]; k, v: [B, Hkv, Nk, D] with Hkv dividing H (GQA). D in 32/64/128/256; fp16, bf16 or fp32
    (fp32 and the CPU interpreter are for testing). causal is aligned bottom-right when Nq != Nk. sm_scale
    defaults to 1/sqrt(D). config forces the forward config ({"BLOCK_M", "BLOCK_N", "num_warps",
    "num_stages"}, optionally "maxnreg"; {"kernel": "gluon-ws", ...} forces flash_ws's Gluon forward);
    otherwise it is autotuned on CUDA (one fixed config under TRITON_INTERPRET=1). On Hopper and newer, Q, K,
    V and O move through tensor descriptors (TMA) when the inputs are 16-byte aligned; FLASHBENCH_TMA=0 turns
    that off.
    window=(left, right): a sliding window, flash-attn's `window_size` convention aligned bottom-right: query i
    sits at key position p = i + Nk - Nq and sees keys p - left <= j <= p + right; -1 = no limit on that side;
    with causal=True, right must be -1 or 0 (both mean 0). Key blocks outside every row's window are skipped,
    in the forward and in both backward passes; a row that sees no key outputs 0 and gets no gradient.
    Differentiable: the backward recomputes P from Q, K and the saved log-sum-exp.
    Raises KernelUnsupported naming what is unsupported.
    """
    signature = _signature(q, k, v, causal, sm_scale, window) if config is None else None
    try:
        hit = _CHECKED.plans.get(signature) if signature is not None else None
    except TypeError:  # an unhashable argument (a list as sm_scale, say): the checks say what is wrong
        signature, hit = None, None
    if hit is not None:
        forward, scale, checked, plans = hit
        return attend(RecomputeAttention, forward, q, k, v, causal, scale, None, forward, checked, plans)
    q0, k0, v0 = q, k, v
    q, k, v, sm_scale = check_inputs("flash_attn", q, k, v, causal, sm_scale)
    window = check_window("flash_attn", window, causal)
    if torch.compiler.is_compiling():  # one custom op for torch.compile's graph (kernels/ops.py)
        if config is not None:
            raise KernelUnsupported("flash_attn: config= is not taken under torch.compile (call it eagerly)")
        left, right = window if window is not None else (-1, -1)
        return torch.ops.flashbench.attn_fwd(q, k, v, causal, sm_scale, left, right)[0]
    if config is not None and not (isinstance(config, dict) and config.get("kernel") == "gluon-ws"):
        config = normalize_config("flash_attn", config)
    if signature is not None and config is None and q is q0 and k is k0 and v is v0:
        key = (*signature[:4], causal, window, None, signature[-1])  # attention_forward's plan key
        plan = _PLANS.get(key, q, k, v, causal, None, window)
        _CHECKED.put(signature, (functools.partial(_run_plan, plan), sm_scale, window, {}))
    if window is None:
        return attend(RecomputeAttention, attention_forward, q, k, v, causal, sm_scale, config)
    forward = functools.partial(attention_forward, window=window)
    return attend(RecomputeAttention, forward, q, k, v, causal, sm_scale, config, forward, window)

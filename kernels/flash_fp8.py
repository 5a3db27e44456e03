"""FP8 (e4m3) attention forward with FlashAttention-3's numerics, in Triton; forward only.

Origin: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision" (2024),
section 3.3, and its hopper/ kernels' FP8 contract: q, k, v in float8_e4m3fn with float32 descale factors of
shape [B, Hkv] (one per batch element and K/V head; a query head uses its K/V head's q_descale), output bf16.
The loop is flash_v2's (FlashAttention-2 order: one program per query block and head, K/V streamed). On Hopper
at d = 128 and 256 (from the lengths of flash_ws.GLUON_FP8_MIN_SEQ), `attention_forward_fp8` runs the same
numerics in flash_ws.py's warp-specialized Gluon kernel instead (FA3's schedule).

Numerics, per K/V block:
  - S = Q K^T from the e4m3 dot with fp32 accumulation; q_descale * k_descale * sm_scale * log2(e) is one
    scale (qk_scale), folded into the exp2 as in flash_v2: exp2(s * qk_scale - m).
  - Online softmax in fp32 (running max m, running sum l).
  - P is quantized to e4m3 for the P V dot, unnormalised and times 2^8: p = exp2(s * qk_scale - (m - 8)) lies
    in [0, 256] (e4m3's largest power of two below its maximum 448), and l sums the same fp32 values, so
    acc / l is unchanged and the shift costs nothing (it is folded into the row max). With P in [0, 1] (what
    FA3 does) every p < 2^-6 falls in e4m3's subnormals and p < 2^-10 flushes to 0; on random bf16 inputs
    (d 64/128, N 1024-4096) that made the output's error 1-2% larger (2.47% against 2.43% of float64 at d=64
    N=4096: docs/kernels.md's FP8 table, `python3 benchmarks/fp8_error.py`), so the shift is kept for rows
    with many small probabilities, at no cost. A per-tile scale buys nothing more: the running max already
    makes each row's largest p 2^8 in the block that holds it.
  - The accumulator is scaled by v_descale / l at the end, written as bf16; the base-2 LSE of the scaled
    scores (log2 sum exp2(s * qk_scale)) is saved per row as flash_v2 does (+inf for rows that see no key).

V layout: Hopper's FP8 wgmma reads its B operand K-major, i.e. for P V the values with the sequence axis
contiguous. The kernel takes V as a [B, Hkv, D, N] tensor with unit last stride (`vt`); `flash_attn_fp8`
accepts V either as a [B, Hkv, N, D] view of such storage (`value_layout(v)` makes one; Triton's fused-attention
tutorial prepares its FP8 V the same way) or in the ordinary layout, which it then transposes once per call:
one extra read and write of V (2 * B * Hkv * N * D bytes), done outside the kernel. FA3 transposes V tile by
tile inside its kernel instead.

Cautions:
  - Triton's interpreter (3.9) converts fp32 to e4m3 wrongly where rounding carries into the exponent (0.49 ->
    0.25, 1.999 -> 1.0) and truncates fp32 to bf16 (its fp8 dot is exact): under the interpreter P is first
    rounded to the e4m3 grid in fp32 (round half up) and O's bits to bf16's (round to nearest even), which the
    conversions then keep exactly. On the GPU the hardware conversions (round to nearest even) run.
  - Descales must be >= 0 (amax / 448 is); a negative sm_scale is folded into q_descale (never checked on the
    device: that would cost a sync).
  - Causal masks are aligned bottom-right; rows that see no key output 0. GQA: query head h uses K/V head
    h // (H // Hkv) and that head's descales.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import flash_ws
from .common import (
    LOG2E,
    KernelUnsupported,
    _set_last_config,
    cdiv,
    check_inputs,
    interpreting,
    seq_bucket,
)
from .configs import FP8_FWD_SPACE, INTERPRET_FWD, normalize_config
from .descriptors import host_descriptor, use_tma
from .launch import PlanCache, TunedCall, config_key, env_key, tensor_key

NAME = "flash_attn (fp8)"
FP8_DTYPES = (torch.float8_e4m3fn,)


@triton.jit
def _to_e4m3(p, INTERPRET: tl.constexpr):
    """p (fp32, >= 0) as e4m3 (see the module docstring for the interpreter's rounding)."""
    if INTERPRET:
        e = tl.maximum(
            tl.floor(tl.log2(tl.maximum(p, 1e-30))), -6.0
        )  # e4m3: 3 mantissa bits, min exponent -6
        step = tl.exp2(e - 3.0)
        p = tl.minimum(tl.floor(p / step + 0.5) * step, 448.0)  # the GPU's conversion saturates (satfinite)
    return p.to(tl.float8e4nv)


@triton.jit
def _to_bf16(x, INTERPRET: tl.constexpr):
    """x (fp32) as bf16, rounded to nearest even (see the module docstring for the interpreter)."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _fp8_block(
    acc,  # [BLOCK_M, HEAD_DIM] fp32 accumulator
    l_i,  # [BLOCK_M] fp32 running sum of the shifted exp2 (times 2^P_SHIFT)
    m_i,  # [BLOCK_M] fp32 running max of the scaled scores (base-2 units)
    q,  # [BLOCK_M, HEAD_DIM] e4m3 query tile
    k_src,  # TMA: host descriptor of K [B, H_KV, N_K, D]; else pointer to K[b, hkv, 0, 0]
    v_src,  # TMA: host descriptor of V^T [B, H_KV, D, N_K]; else pointer to V^T[b, hkv, 0, 0]
    stride_kn,
    stride_vd,
    kv_b,
    kv_h,
    start_n,  # first key of this block
    offs_m,  # [BLOCK_M] query rows
    N_K,
    CAUSAL_OFF,  # seq_k - seq_q: query i sees key j iff j <= i + CAUSAL_OFF
    qk_scale,  # sm_scale * log2(e) * q_descale * k_descale, >= 0
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK: tl.constexpr,  # keys past N_K or the causal diagonal may be in this block
    TMA: tl.constexpr,
    INTERPRET: tl.constexpr,
    P_SHIFT: tl.constexpr,
    NEG_SCALE: tl.constexpr,  # qk_scale < 0 (a negative sm_scale folded into q_descale)
):
    """One key block: S = Q K^T (e4m3 dot, fp32), online softmax, acc += e4m3(P) V."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        kt = tl.trans(k_src.load([kv_b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))  # past N_K: zeros
    else:
        kt = tl.load(
            k_src + offs_n[None, :] * stride_kn + offs_d[:, None], mask=offs_n[None, :] < N_K, other=0.0
        )
    qk = tl.dot(q, kt)
    if MASK:
        if CAUSAL:  # implies key < N_K for every row < N_Q (rows past N_Q are never stored)
            valid = offs_m[:, None] + CAUSAL_OFF >= offs_n[None, :]
        else:
            valid = offs_n[None, :] < N_K
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with every key masked so far: p = 0
        p = tl.math.exp2(qk - (m_use - P_SHIFT)[:, None])
    else:
        if NEG_SCALE:  # the row max of the scaled scores is the row min of the unscaled ones
            m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - (m_use - P_SHIFT)[:, None])  # one FMA per score
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if TMA:  # V^T tile [D, BLOCK_N] (keys contiguous), used as [BLOCK_N, D]: the K-major B operand
        v = tl.trans(v_src.load([kv_b, kv_h, 0, start_n]).reshape(HEAD_DIM, BLOCK_N))
    else:
        v = tl.load(
            v_src + offs_d[None, :] * stride_vd + offs_n[:, None], mask=offs_n[:, None] < N_K, other=0.0
        )
    acc = tl.dot(_to_e4m3(p, INTERPRET), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_fp8(
    Q,  # [B, H, N_Q, D] e4m3 queries (unit last stride)
    K,  # [B, H_KV, N_K, D] e4m3 keys
    VT,  # [B, H_KV, D, N_K] e4m3 values, transposed (unit last stride: the sequence axis)
    O,  # [B, H, N_Q, D] bf16 output
    LSE,  # [B, H, N_Q] fp32 contiguous: log2-sum-exp2 of the scaled scores, +inf for rows that see no key
    QD,  # TMA: host descriptors of Q, K, V^T and O (blocks [1, 1, BLOCK_M, D], [1, 1, BLOCK_N, D],
    KD,  # [1, 1, D, BLOCK_N], [1, 1, BLOCK_M, D]); else the tensors again (unused)
    VTD,
    OD,
    Q_DESCALE,  # [B, H_KV] fp32 contiguous descale factors
    K_DESCALE,
    V_DESCALE,
    stride_qz,  # strides of B, H and N (V^T: B, H and D); the last dimension is unit-stride
    stride_qh,
    stride_qm,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_vz,
    stride_vh,
    stride_vd,
    stride_oz,
    stride_oh,
    stride_om,
    H,  # query heads
    H_KV,  # K/V heads
    N_Q,
    N_K,
    sm_scale_log2,  # sm_scale * log2(e), >= 0
    N_BUCKET,  # autotune key only: next power of two of max(N_Q, N_K)
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    INTERPRET: tl.constexpr,
    NEG_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    P_SHIFT: tl.constexpr = 8.0
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # the last query blocks see the most keys: run them first
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hkv = h // (H // H_KV)
    kv_b = (pid_bh // H).to(tl.int32)  # descriptor coordinates are 32-bit
    q_h = (pid_bh % H).to(tl.int32)
    kv_h = q_h // (H // H_KV)
    scale_at = kv_b * H_KV + kv_h
    qk_scale = sm_scale_log2 * tl.load(Q_DESCALE + scale_at) * tl.load(K_DESCALE + scale_at)
    v_scale = tl.load(V_DESCALE + scale_at)
    if TMA:
        k_src = KD
        v_src = VTD
    else:
        k_src = K + b * stride_kz + hkv * stride_kh
        v_src = VT + b * stride_vz + hkv * stride_vh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        q = QD.load([kv_b, q_h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    else:
        q_ptrs = Q + b * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
        q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    causal_off = N_K - N_Q
    if CAUSAL:  # keys [0, hi) are seen by some row of this block; keys [0, full_end) by every row
        hi = tl.minimum(N_K, tl.maximum(0, (pid_m + 1) * BLOCK_M + causal_off))
        full_end = tl.minimum(N_K, tl.maximum(0, pid_m * BLOCK_M + causal_off + 1))
    else:
        hi = N_K
        full_end = N_K
    full_end = (full_end // BLOCK_N) * BLOCK_N
    for start_n in tl.range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _fp8_block(
            acc=acc,
            l_i=l_i,
            m_i=m_i,
            q=q,
            k_src=k_src,
            v_src=v_src,
            stride_kn=stride_kn,
            stride_vd=stride_vd,
            kv_b=kv_b,
            kv_h=kv_h,
            start_n=start_n,
            offs_m=offs_m,
            N_K=N_K,
            CAUSAL_OFF=causal_off,
            qk_scale=qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_N=BLOCK_N,
            CAUSAL=CAUSAL,
            MASK=False,
            TMA=TMA,
            INTERPRET=INTERPRET,
            P_SHIFT=P_SHIFT,
            NEG_SCALE=NEG_SCALE,
        )
    for start_n in tl.range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _fp8_block(
            acc=acc,
            l_i=l_i,
            m_i=m_i,
            q=q,
            k_src=k_src,
            v_src=v_src,
            stride_kn=stride_kn,
            stride_vd=stride_vd,
            kv_b=kv_b,
            kv_h=kv_h,
            start_n=start_n,
            offs_m=offs_m,
            N_K=N_K,
            CAUSAL_OFF=causal_off,
            qk_scale=qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_N=BLOCK_N,
            CAUSAL=CAUSAL,
            MASK=True,
            TMA=TMA,
            INTERPRET=INTERPRET,
            P_SHIFT=P_SHIFT,
            NEG_SCALE=NEG_SCALE,
        )

    empty = l_i == 0.0  # rows that see no key (causal, seq_q > seq_k)
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc * (v_scale / l_safe)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe) - P_SHIFT)
    row_ok = offs_m < N_Q
    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)
    if TMA:  # rows past N_Q are clipped by the descriptor's bounds
        OD.store([kv_b, q_h, pid_m * BLOCK_M, 0], _to_bf16(out, INTERPRET).reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_ptrs = O + b * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
        tl.store(o_ptrs, _to_bf16(out, INTERPRET), mask=row_ok[:, None])


def value_layout(v: torch.Tensor) -> torch.Tensor:
    """V [B, Hkv, N, D] as the FP8 kernel reads it: the same values in a [B, Hkv, N, D] view whose sequence axis
    is contiguous (storage [B, Hkv, D, N'], N' = N rounded up to 16 so that every stride is 16-byte aligned for
    TMA). Returns `v` itself when its sequence axis is already contiguous."""
    if v.stride(-2) == 1:
        return v
    b, hkv, n, d = v.shape
    storage = torch.empty((b, hkv, d, cdiv(n, 16) * 16), dtype=v.dtype, device=v.device)
    storage[..., :n].copy_(v.transpose(-1, -2))
    return storage[..., :n].transpose(-1, -2)


def _descale(t: Any, label: str, b: int, hkv: int, device: torch.device) -> torch.Tensor:
    """A descale factor as the kernel reads it: fp32 [B, Hkv] contiguous (None: 1; a broadcastable tensor, e.g.
    one per-tensor scale, is expanded)."""
    if t is None:
        return torch.ones((b, hkv), dtype=torch.float32, device=device)
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device != device:
        raise KernelUnsupported(
            f"{NAME}: {label} must be a float32 tensor on {device} (shape [batch, kv_heads] = [{b}, {hkv}])"
        )
    try:
        return t.expand(b, hkv).contiguous()
    except RuntimeError:
        raise KernelUnsupported(
            f"{NAME}: {label} has shape {tuple(t.shape)}; expected [batch, kv_heads] = [{b}, {hkv}]"
        ) from None


class _TlForwardFp8:
    """The tl FP8 forward's launch plan for one input signature (v as value_layout gives it): TMA or pointers,
    strides, the grid; its config picked on the first call (launch.TunedCall), launched directly after."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        config: dict[str, Any] | None,
        neg_scale: bool,
    ) -> None:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        vt = v.transpose(-1, -2)  # [B, Hkv, D, Nk], unit last stride
        self.o_shape, self.lse_shape = (B, H, Nq, D), (B, H, Nq)
        o_strides = (H * Nq * D, Nq * D, D)
        # O (bf16, contiguous, fresh) meets TMA's rules wherever q does: use_tma(q, k, o) == use_tma(q, k)
        self.tma = use_tma(q, k) and Nk >= 16 and use_tma(vt)
        self.strides = (*q.stride()[:3], *k.stride()[:3], *vt.stride()[:3], *o_strides)
        self.sizes = (H, Hkv, Nq, Nk)
        self.bucket = seq_bucket(max(Nq, Nk))
        self.call = TunedCall(
            name="fwd_fp8",
            kind="fwd",
            kernel=_attn_fwd_fp8,
            grid=lambda meta: (cdiv(Nq, meta["BLOCK_M"]), B * H),
            constexprs={
                "HEAD_DIM": D,
                "CAUSAL": causal,
                "TMA": self.tma,
                "INTERPRET": interpreting(),
                "NEG_SCALE": neg_scale,
            },
            space=FP8_FWD_SPACE,
            forced=config,
            interpret_config=INTERPRET_FWD,
        )

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sm_scale: float,
        descales: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        vt = v.transpose(-1, -2)
        o = torch.empty(size=self.o_shape, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(size=self.lse_shape, dtype=torch.float32, device=q.device)
        # pointers, or once the kernel is compiled (and through TMA) the descriptors' tensors
        descs: tuple[Any, ...] = (q, k, vt, o)
        if self.tma and not self.call.direct:
            D = q.shape[-1]
            qd, kd, od = (host_descriptor(t) for t in (q, k, o))
            vtd = TensorDescriptor(vt, list(vt.shape), list(vt.stride()), [1, 1, D, 16])  # sized per config
            descs = (qd, kd, vtd, od)
        args = (
            q,
            k,
            vt,
            o,
            lse,
            *descs,
            *descales,
            *self.strides,
            *self.sizes,
            sm_scale * LOG2E,
            self.bucket,
        )
        cfg = self.call(args)
        return o, lse, cfg


def _fp8_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: dict[str, Any] | None,
    neg_scale: bool,
) -> Any:
    """flash_ws's Gluon plan in its FP8 mode where it takes these inputs, else the tl FP8 kernel's."""
    forced = config is not None and config.get("kernel") == "gluon-ws"
    if forced or not config and not neg_scale and flash_ws.preferred(q, k, v, causal):
        if neg_scale:
            raise KernelUnsupported(f"{NAME}: the Gluon FP8 forward takes no negative sm_scale")
        try:
            return flash_ws.ForwardPlan(q, k, v, causal, config)
        except ValueError as exc:
            raise KernelUnsupported(f"{NAME}: {exc}") from None
    return _TlForwardFp8(q, k, v, causal, config, neg_scale)


_PLANS = PlanCache(_fp8_plan)


def attention_forward_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None,
    descales: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    neg_scale: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Launch the FP8 forward on checked inputs (descales fp32 [B, Hkv] contiguous; neg_scale: q_descale holds
    a negative sm_scale's sign). Returns (o bf16 [B, H, Nq, D], lse2 fp32 [B, H, Nq], config used).

    On Hopper, d = 128 or 256 (from the lengths of flash_ws.GLUON_FP8_MIN_SEQ) and shapes flash_ws supports,
    the forward is flash_ws's warp-specialized Gluon kernel in its FP8 mode (these numerics, FA3's schedule)
    unless a Triton config is forced, FLASHBENCH_GLUON=0 or sm_scale is negative; a config with "kernel":
    "gluon-ws" forces it.
    The choice and launch geometry are made once per input signature (launch.PlanCache)."""
    v = value_layout(v)
    key = (
        tensor_key(q),
        tensor_key(k),
        tensor_key(v),
        q.device,
        causal,
        config_key(config),
        neg_scale,
        env_key(),
    )
    plan = _PLANS.get(key, q, k, v, causal, config, neg_scale)
    if isinstance(plan, flash_ws.ForwardPlan):
        try:
            o, lse, cfg = plan.run(q, k, v, sm_scale, descales)
        except ValueError as exc:
            raise KernelUnsupported(f"{NAME}: {exc}") from None
    else:
        o, lse, cfg = plan.run(q, k, v, sm_scale, descales)
    _set_last_config(cfg)
    return o, lse, cfg


class Fp8Attention(torch.autograd.Function):
    """The FP8 forward as an autograd node whose backward refuses: there is no FP8 backward."""

    @staticmethod
    def forward(ctx: Any, q, k, v, causal, sm_scale, config, descales, neg_scale):  # type: ignore[override]
        return attention_forward_fp8(q, k, v, causal, sm_scale, config, descales, neg_scale)[0]

    @staticmethod
    def backward(ctx: Any, do):  # type: ignore[override]
        raise KernelUnsupported(f"{NAME}: FP8 (e4m3) attention is forward only: it has no backward")


def flash_attn_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: dict[str, Any] | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 (e4m3) attention forward, FlashAttention-3's contract (module docstring); flash_attn routes here.

    q: [B, H, Nq, D], k, v: [B, Hkv, Nk, D], all torch.float8_e4m3fn; v in any layout (`value_layout(v)` is the
    one read without a copy). q_descale, k_descale, v_descale: float32 [B, Hkv] (None: 1), the factors that
    turn the stored values back into the real ones (amax / 448 for a per-head amax scaling). Returns bf16
    [B, H, Nq, D]. config forces the forward config as for flash_attn ({"kernel": "gluon-ws", ...}: flash_ws's
    Gluon FP8 forward). Raises KernelUnsupported.
    """
    flip = isinstance(sm_scale, (int, float)) and sm_scale < 0  # folded into q_descale (module docstring)
    # v is checked against k here and not by check_inputs, which would copy a transposed V (value_layout) back
    # to the ordinary layout.
    if not isinstance(v, torch.Tensor) or not isinstance(k, torch.Tensor):
        raise KernelUnsupported(f"{NAME}: q, k, v must be torch.Tensors")
    if (v.dtype, v.device, tuple(v.shape)) != (k.dtype, k.device, tuple(k.shape)):
        raise KernelUnsupported(
            f"{NAME}: v ({v.dtype}, {v.device}, {tuple(v.shape)}) must match k "
            f"({k.dtype}, {k.device}, {tuple(k.shape)})"
        )
    q, k, _, sm_scale = check_inputs(
        NAME, q, k, k, causal, -sm_scale if flip and sm_scale is not None else sm_scale, dtypes=FP8_DTYPES
    )
    b, hkv = k.shape[0], k.shape[1]
    qd, kd, vd = (
        _descale(t, label, b, hkv, q.device)
        for t, label in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale"))
    )
    descales = (-qd if flip else qd, kd, vd)
    if config is not None and not (isinstance(config, dict) and config.get("kernel") == "gluon-ws"):
        config = normalize_config(NAME, config)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return Fp8Attention.apply(q, k, v, causal, sm_scale, config, descales, flip)
    return attention_forward_fp8(q, k, v, causal, sm_scale, config, descales, flip)[0]  # no autograd node

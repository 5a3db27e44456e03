"""flash_attn_varlen: attention over packed documents of different lengths (flash-attn's flash_attn_varlen_func).

    q     [total_q, H, D]     the documents' queries, one after another
    k, v  [total_k, Hkv, D]   their keys and values
    cu_seqlens_q, cu_seqlens_k   int32 [B + 1] prefix sums: document b holds rows [cu[b], cu[b + 1])

Each document attends only to itself: a packed training batch with a document mask (block-diagonal, causal within
each document) is one call. The kernels are flash_v2's forward and backward_dkdv / backward_dq's passes (on
Hopper the Gluon forward and backward where taken, see the cautions) with VARLEN set: the tensors are read as
one [1, H, total, D] batch, and every program finds its document and block on the device
(common.document_block), so no program straddles two documents, blocks outside the documents are
never visited and a launch reads no value on the host (it can run under a CUDA graph). Inside a document the
kernels are the uniform ones: the same key ranges, masks and recompute backward.

Cautions:
  - Windows and causal masks align bottom-right within each document (flash-attn's convention): query i of a
    document with Lq queries and Lk keys sits at key position i + Lk - Lq. A row that sees no key outputs 0 and
    gets no gradient.
  - validate=False (the default) reads nothing on the host. The kernels clamp every offset into the tensors, so
    bad cu_seqlens give wrong numbers, never an access out of bounds; validate=True checks them (one sync).
  - Rows past cu_seqlens[-1] belong to no document: their outputs and gradients are 0.
  - max_seqlen_q / max_seqlen_k only pick the kernel (below) and the autotuned config (its length bucket); the
    grid is sized from the tensors: sum over documents of cdiv(length, BLOCK) <= (total + (B + 1) (BLOCK - 1)) // BLOCK programs.
  - The forward on Hopper (fp16/bf16, contiguous, no window, head dims and longest documents of
    varlen_ws.MIN_SEQ) is flash_ws's Gluon kernel in its VARLEN mode (varlen_ws.py);
    config={"kernel": "gluon-ws", ...} forces it. The backward on Hopper (the same, d = 64/128, where
    varlen_ws.BWD_MIN_SEQ takes it) is backward_ws's one pass in its VARLEN mode;
    bwd_config={"kernel": "gluon-ws", ...} forces it. Elsewhere the tl kernels through pointers (no TMA: a
    descriptor's zero fill stops at the tensor's end, not at a document's).
"""

from __future__ import annotations

from typing import Any

import torch

from . import backward_ws, varlen_ws
from .backward import _bwd_preprocess
from .backward_dkdv import _bwd_dkdv
from .backward_dq import _bwd_dq
from .common import (
    LOG2E,
    KernelUnsupported,
    _set_last_bwd_config,
    _set_last_config,
    cdiv,
    check_inputs,
    check_window,
    document_walk,
    seq_bucket,
    unit_stride,
    window_flags,
)
from .configs import BWD_DKDV_SPACE, BWD_DQ_SPACE, FWD_SPACE, INTERPRET_BWD, INTERPRET_FWD, normalize_config
from .flash_v2 import _attn_fwd
from .launch import KernelCall, PlanCache, TunedCall, config_key, env_key, record, tensor_key

_NAME = "flash_attn_varlen"


def _refuse(message: str) -> None:
    raise KernelUnsupported(f"{_NAME}: {message}")


def _packed(t: torch.Tensor) -> torch.Tensor:
    """A [total, H, D] tensor as the kernels' [1, H, total, D] batch (a view)."""
    return t.permute(1, 0, 2).unsqueeze(0)


def _unpacked(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(0).permute(1, 0, 2)


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """The batch, head and row strides of a [total, H, D] tensor as the kernels read it (one batch: b = 0)."""
    return (0, t.stride(1), t.stride(0))


class _Plan:
    """What the forward and the backward of one input signature share: sizes, the mask arguments, the
    compile-time arguments. Outputs and gradients are [total, H, D] contiguous; LSE2 and D = rowsum(dO * O) are
    [1, H, total_q] fp32."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        docs: int,
        causal: bool,
        window: tuple[int, int] | None,
        bucket: int,
    ) -> None:
        Tq, H, D = q.shape
        Tk, Hkv = k.shape[:2]
        right_limit, left_limit, win_left, win_right = window_flags(causal, window)
        self.constexprs = {
            "HEAD_DIM": D,
            "CAUSAL": right_limit,
            "WINDOW": left_limit,
            "IEEE": q.dtype == torch.float32,
            "TMA": False,
            "VARLEN": True,
        }
        self.docs, self.sizes = docs, (Tq, Tk)
        self.tail = (win_left, win_right, bucket)
        self.heads = (H, Hkv, H // Hkv)
        self.o_shape, self.lse_shape = (Tq, H, D), (1, H, Tq)


def _gluon_plan(make: Any) -> Any:
    """make() (a varlen_ws plan), its ValueError as this function's one-line refusal."""
    try:
        return make()
    except ValueError as exc:
        raise KernelUnsupported(f"{_NAME}: {exc}") from None


class _Forward(_Plan):
    """The forward's launch: the Gluon kernel's plan (varlen_ws) where `gluon`, else the tl kernel's (its config
    picked on the first call)."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        config: dict[str, Any] | None,
        gluon: bool,
        docs: int,
        causal: bool,
        window: tuple[int, int] | None,
        bucket: int,
    ) -> None:
        super().__init__(q, k, docs, causal, window, bucket)
        self.gluon: varlen_ws.VarlenPlan | None = None
        if gluon:
            self.gluon = _gluon_plan(lambda: varlen_ws.VarlenPlan(q, k, v, docs, causal, config, window))
            return
        Tq, H = q.shape[0], self.heads[0]
        self.call = TunedCall(
            name="fwd_varlen",
            kind="fwd",
            kernel=_attn_fwd,
            grid=lambda meta: (document_walk(Tq, docs, meta["BLOCK_M"]), H),
            constexprs=self.constexprs,
            space=FWD_SPACE,
            forced=config,
            interpret_config=INTERPRET_FWD,
        )

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.gluon is not None:
            o, lse, cfg = self.gluon.run(q, k, v, cu_q, cu_k, scale)
            _set_last_config(cfg)
            return o, lse
        o = torch.empty(size=self.o_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(size=self.lse_shape, dtype=torch.float32, device=q.device)
        q4, k4, v4, o4 = (_packed(t) for t in (q, k, v, o))
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(o))
        h, _, group = self.heads
        args = (*self.sizes, scale * LOG2E, *self.tail, cu_q, cu_k, self.docs)
        # KD, VD, KD2, VD2, QD, OD: the descriptors of the TMA path, unused
        cfg = self.call((q4, k4, v4, o4, lse, k4, v4, k4, v4, q4, o4, *strides, h, group, *args))
        _set_last_config(cfg)
        return o, lse


class _Backward(_Plan):
    """The backward's launches: the Gluon one pass's plan (varlen_ws.BackwardPlan) where `gluon`, else the
    preprocess (D), the dK/dV pass and the dQ pass (configs picked on the first call). Its signature holds dO's,
    which the first launches specialize on."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        do: torch.Tensor,
        config: dict[str, Any] | None,
        gluon: bool,
        docs: int,
        causal: bool,
        window: tuple[int, int] | None,
        bucket: int,
    ) -> None:
        super().__init__(q, k, docs, causal, window, bucket)
        self.gluon: varlen_ws.BackwardPlan | None = None
        if gluon:
            self.gluon = _gluon_plan(
                lambda: varlen_ws.BackwardPlan(q, k, v, do, docs, causal, config, window, bucket)
            )
            return
        (Tq, Tk), (H, Hkv, _) = self.sizes, self.heads
        D = q.shape[2]
        pre_m = 64
        self.pre = KernelCall(
            _bwd_preprocess, (cdiv(Tq, pre_m), H), {"HEAD_DIM": D, "BLOCK_M": pre_m, "ZERO_DQ": False}, {}
        )
        bwd = {**self.constexprs, "STORED_P": False}
        self.dkdv = TunedCall(
            name="dkdv_varlen",
            kind="dkdv",
            kernel=_bwd_dkdv,
            grid=lambda meta: (document_walk(Tk, docs, meta["BLOCK_N"]), Hkv),
            constexprs=bwd,
            space=BWD_DKDV_SPACE,
            interpret_config=INTERPRET_BWD,
        )
        self.dq = TunedCall(
            name="dq_varlen",
            kind="dq",
            kernel=_bwd_dq,
            grid=lambda meta: (document_walk(Tq, docs, meta["BLOCK_M"]), H),
            constexprs=bwd,
            space=BWD_DQ_SPACE,
            interpret_config=INTERPRET_BWD,
        )

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        do: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        sm_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.gluon is not None:
            dq, dk, dv, cfg = self.gluon.run(q, k, v, o, lse, do, cu_q, cu_k, sm_scale)
            _set_last_bwd_config(cfg, backward_ws.DQ_IN_ONE_PASS)
            return dq, dk, dv
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        delta = torch.empty(size=self.lse_shape, dtype=torch.float32, device=q.device)
        q4, k4, v4, o4, do4 = (_packed(t) for t in (q, k, v, o, do))
        self.pre(
            (
                o4,
                do4,
                delta,
                delta,
                delta,
                *_strides(o),
                *_strides(do),
                self.heads[0],
                self.sizes[0],
                *(0, 0, 0, 1, 0),  # the accumulator's strides, GROUP, ZERO_UNITS: unused without ZERO_DQ
            )
        )
        inputs = (q4, k4, v4, do4, lse, delta, lse)  # P: never read without STORED_P
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do), 0, 0, 0, 0)
        sizes = (*self.sizes, sm_scale * LOG2E, sm_scale, *self.tail, cu_q, cu_k, self.docs)
        dk4, dv4, dq4 = (_packed(t) for t in (dk, dv, dq))
        cfg_kv = self.dkdv(
            (*inputs, dk4, dv4, q4, do4, *strides, *_strides(dk), *_strides(dv), *self.heads, *sizes)
        )
        h, _, group = self.heads
        cfg_q = self.dq((*inputs, dq4, k4, v4, *strides, *_strides(dq), h, group, *sizes))
        _set_last_bwd_config(cfg_kv, cfg_q)
        return dq, dk, dv


_FORWARDS = PlanCache(_Forward)
_BACKWARDS = PlanCache(_Backward)


class _VarlenAttention(torch.autograd.Function):
    """Autograd glue: the backward recomputes P from Q, K and the saved LSE2 (as flash_v2.RecomputeAttention).
    `key` is the forward plan's signature, `plan` its arguments (the backward's plan is made from them), `bwd`
    the backward's forced config and the longest document (which pick its kernel)."""

    @staticmethod
    def forward(ctx: Any, q, k, v, cu_q, cu_k, sm_scale, forward, key, plan, bwd):  # type: ignore[override]
        o, lse = forward.run(q, k, v, cu_q, cu_k, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.sm_scale, ctx.key, ctx.plan, ctx.bwd = sm_scale, key, plan, bwd
        return o

    @staticmethod
    def backward(ctx: Any, do):  # type: ignore[override]
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        do = unit_stride(do)
        (config, longest), (_, causal, window, _) = ctx.bwd, ctx.plan
        gluon = config is not None or varlen_ws.backward_preferred(q, k, v, do, causal, window, longest)
        key = (
            *ctx.key,
            tensor_key(do),
            config_key(config),
            gluon,
            torch.are_deterministic_algorithms_enabled(),
        )
        backward = _BACKWARDS.get(key, q, k, v, do, config, gluon, *ctx.plan)
        dq, dk, dv = backward.run(q, k, v, o, lse, do, cu_q, cu_k, ctx.sm_scale)
        return dq, dk, dv, None, None, None, None, None, None, None


def _check_lengths(cu_q: Any, cu_k: Any, max_q: Any, max_k: Any, device: torch.device) -> int:
    """The prefix sums' types, shapes and device, and the max lengths' types: no device data read. Returns B."""
    for label, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32:
            _refuse(f"{label} must be an int32 torch.Tensor, got {getattr(cu, 'dtype', type(cu).__name__)}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            _refuse(f"{label} must be 1-D [batch + 1] with at least 2 entries, got shape {tuple(cu.shape)}")
        if cu.device != device:
            _refuse(f"{label} is on {cu.device}, q on {device}")
    if cu_q.shape != cu_k.shape:
        _refuse(f"cu_seqlens_q and cu_seqlens_k lengths differ ({cu_q.shape[0]} vs {cu_k.shape[0]})")
    for label, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            _refuse(f"{label} must be an int >= 0, got {n!r}")
    return int(cu_q.shape[0]) - 1


def _check_values(
    cu_q: torch.Tensor, cu_k: torch.Tensor, totals: tuple[int, int], maxes: tuple[int, int]
) -> None:
    """Each prefix sum starts at 0, never decreases, ends inside its tensor, and no document is longer than its
    max_seqlen: one device sync."""
    stats = []
    for cu in (cu_q, cu_k):
        lengths = cu[1:] - cu[:-1]
        stats += [cu[0], lengths.min(), cu[-1], lengths.max()]
    values = torch.stack(stats).tolist()  # the sync
    for side, (first, shortest, last, longest), total, most in zip(
        "qk", (values[:4], values[4:]), totals, maxes, strict=True
    ):
        label = f"cu_seqlens_{side}"
        if first != 0:
            _refuse(f"{label} must start at 0, starts at {first}")
        if shortest < 0:
            _refuse(f"{label} decreases (a document of length {shortest})")
        if last > total:
            _refuse(f"{label} ends at {last}, past the {total} rows of {'q' if side == 'q' else 'k and v'}")
        if longest > most:
            _refuse(
                f"a document has {longest} {'queries' if side == 'q' else 'keys'}, max_seqlen_{side} is {most}"
            )


def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    sm_scale: float | None = None,
    window: tuple[int, int] | None = None,
    validate: bool = False,
    config: dict[str, Any] | None = None,
    bwd_config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention within each document of a packed batch; returns [total_q, H, D] contiguous, differentiable.

    q: [total_q, H, D]; k, v: [total_k, Hkv, D] with Hkv dividing H (GQA); unit stride in D, any other strides.
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1] on q's device, prefix sums of the documents' lengths (a document
    may be empty). max_seqlen_q / max_seqlen_k: the longest document's lengths (they pick the autotuned
    config). causal and window=(left, right): as flash_attn's, aligned bottom-right within each document.
    D in 32/64/128/256; fp16, bf16 or fp32 (fp32 and the CPU interpreter are for testing). validate: check the
    prefix sums' values on the host (one device sync; see the module docstring). config: force the forward's
    config (as flash_attn's: a tl tile, or {"kernel": "gluon-ws", ...}). bwd_config: force the backward's,
    {"kernel": "gluon-ws", ...} (backward_ws's keys: the Gluon one pass on Hopper); without it the tl passes run
    where varlen_ws.BWD_MIN_SEQ does not take the Gluon one. Raises KernelUnsupported naming what is unsupported.
    """
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            _refuse(
                f"{label} must be a 3-D torch.Tensor [total, heads, head_dim], got {getattr(t, 'shape', t)!r}"
            )
    if k.shape != v.shape:
        _refuse(f"k and v shapes differ ({tuple(k.shape)} vs {tuple(v.shape)})")
    if q.shape[0] < 1 or k.shape[0] < 1:
        _refuse(f"no rows (q {tuple(q.shape)}, k {tuple(k.shape)})")
    docs = _check_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.device)
    q4, k4, v4, scale = check_inputs(_NAME, _packed(q), _packed(k), _packed(v), causal, sm_scale)
    window = check_window(_NAME, window, causal)
    forced_gluon = isinstance(config, dict) and config.get("kernel") == "gluon-ws"
    if config is not None and not forced_gluon:
        config = normalize_config(_NAME, config)
    if bwd_config is not None:
        if not isinstance(bwd_config, dict) or bwd_config.get("kernel") != "gluon-ws":
            _refuse(
                f'bwd_config must be {{"kernel": "gluon-ws", ...}} (the Gluon backward), got {bwd_config!r}'
            )
        try:
            backward_ws.config_for(q.shape[-1], bwd_config)
        except ValueError as exc:
            _refuse(str(exc))
    if torch.compiler.is_compiling():
        _refuse("not supported under torch.compile yet (call it eagerly)")
    if validate:
        _check_values(cu_seqlens_q, cu_seqlens_k, (q.shape[0], k.shape[0]), (max_seqlen_q, max_seqlen_k))
    q, k, v = (_unpacked(t) for t in (q4, k4, v4))
    bucket = seq_bucket(max(max_seqlen_q, max_seqlen_k))
    key = (
        *(tensor_key(t) for t in (q, k, v, cu_seqlens_q, cu_seqlens_k)),
        q.device,
        causal,
        window,
        bucket,
        env_key(),
    )
    plan = (docs, causal, window, bucket)
    longest = max(max_seqlen_q, max_seqlen_k)
    gluon = forced_gluon if config is not None else varlen_ws.preferred(q, k, v, causal, window, longest)
    forward = _FORWARDS.get((*key, config_key(config), gluon), q, k, v, config, gluon, *plan)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        bwd = (bwd_config, longest)
        tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k)
        return record(_VarlenAttention, tensors, scale, forward, key, plan, bwd)
    return forward.run(q, k, v, cu_seqlens_q, cu_seqlens_k, scale)[0]


__all__ = ["flash_attn_varlen"]

"""Attention backward shared by the three kernels: recompute P (FlashAttention-2) or read the stored P.

Origin: Dao, "FlashAttention-2" (2023), Algorithm 2, in the shape of Triton's fused-attention tutorial.
Used by flash_v2.py (recompute), flash_v1.py (the same recompute backward: the v1/v2 difference is the
forward loop order only) and stored_p.py (STORED_P=True: P is read from the N x N tensor the forward wrote).

Three launches:
  1. preprocess (here), grid (query blocks, B*H):  D = rowsum(dO * O) in fp32 (and the one-pass backward's
     zeroed fp32 dQ, one launch fewer than a memset).
  2. dK/dV (backward_dkdv.py), grid (key blocks, B*H_KV): K and V blocks resident, dK and dV accumulated in
     fp32 while streaming query blocks of every query head of the GQA group (so no atomics are needed for GQA
     either). Per query block: P^T = exp2(K Q^T * qk_scale - LSE2) (or loaded), dV += P^T dO, dP^T = V dO^T,
     dS^T = P^T * (dP^T - D), dK += dS^T Q; at the end dK *= sm_scale.
  3. dQ (backward_dq.py), grid (query blocks, B*H): Q, dO resident, K/V streamed as in the forward:
     dQ += dS K; at the end dQ *= sm_scale.

dQ strategy, a separate pass rather than fp32 atomics: every output element has one writer, so the result
is deterministic (run-to-run identical), there is no fp32 dQ buffer to zero and convert, and the kernels can be
autotuned (the autotuner re-runs a kernel; atomics would accumulate across its runs). The cost is recomputing
Q K^T, exp2 and dO V^T in the dQ pass: 7 block matmuls per (query block, key block) instead of 5. The stored-P
variant skips Q K^T and exp2 in both passes.

On Hopper (backward_ws.default_config: fp16/bf16, d = 64 / 128, long enough) one Gluon kernel replaces steps 2
and 3: dK, dV as above, and dQ added into a zeroed fp32 buffer by TMA reduce-adds from the same program (5 block
matmuls; dQ not bitwise repeatable), converted behind it: DqConvert, a dependent launch whose programs take the SMs
the pass's last programs leave and convert each unit of the buffer once that unit's programs have ended. Where
torch asks for deterministic algorithms it runs the two passes (the Gluon dK/dV pass at d = 128).

Streamed tiles (Q and dO in the dK/dV pass, K and V in the dQ pass) come through 4-D [B, H, N, D] tensor
descriptors built on the host (TMA on Hopper and newer) when `use_tma` allows, else through pointers; the
resident tiles are loaded once.

Sliding windows: both passes visit only the blocks some row's window reaches (the dQ pass the forward's key
ranges, forward_blocks.key_ranges; the dK/dV pass the query rows that see the program's keys) and mask the
window's edges only in the blocks they cut.

Cautions:
  - Rows that see no key have LSE2 = +inf: exp2(s - LSE2) = 0, so their P, dS and contributions are 0.
  - Query rows past N_Q load Q = dO = 0 and LSE2 = +inf (P = 0); key rows past N_K in dK/dV are computed but
    never stored; key columns past N_K in dQ are masked (they would otherwise get P = exp2(0 - LSE2) != 0).
  - Gradients are returned contiguous in the input dtype; dO may have any strides (a non-unit last one is
    copied: the kernels take every last dimension as unit-stride).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import backward_ws
from .backward_dkdv import _bwd_dkdv
from .backward_dq import _bwd_dq
from .common import (
    LOG2E,
    NOT_VARLEN,
    KernelUnsupported,
    _set_last_bwd_config,
    cdiv,
    interpreting,
    last_bwd_config,
    row_strides,
    seq_bucket,
    unit_stride,
    window_flags,
)
from .configs import BWD_DKDV_SPACE, BWD_DQ_SPACE, INTERPRET_BWD
from .descriptors import host_descriptor, use_tma
from .launch import KernelCall, PlanCache, TunedCall, config_key, env_key, tensor_key

__all__ = ["attention_backward", "last_bwd_config"]


@triton.jit
def _bwd_preprocess(
    O,  # [B, H, N_Q, D] forward output
    DO,  # [B, H, N_Q, D] gradient of the output
    DELTA,  # [B, H, N_Q] fp32 contiguous, out: rowsum(dO * O)
    DQ_ACC,  # [B, H, N_Q, D] fp32 at the strides below, unit stride in D; out with ZERO_DQ: zeros (the one-pass
    # backward adds dQ into it) in the rows of the query heads of units (b * H + h) // GROUP < ZERO_UNITS, the rest
    # its dK/dV kernel zeroes (backward_ws._zero_issue)
    ZQ,  # with ZERO_DQ: int32 [units + 1, 2], out: zeros (the dK/dV kernel's counts per unit: backward_ws.
    # _zero_count's, _dq_count's; in the last row, its persistent walk's tile counter, backward_ws._claim)
    stride_oz,
    stride_oh,
    stride_om,
    stride_doz,
    stride_doh,
    stride_dom,
    H,  # query heads
    N_Q,  # query length
    stride_ab,
    stride_ah,
    stride_am,
    GROUP,  # query heads per K/V head
    ZERO_UNITS,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ZERO_DQ: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < N_Q
    o = tl.load(
        O + b * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
        mask=row_ok,
        other=0.0,
    )
    do = tl.load(
        DO + b * stride_doz + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
        mask=row_ok,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)
    if ZERO_DQ and pid_m == 0:
        # each unit's counts, by its heads' first programs
        tl.store(ZQ + 2 * (pid_bh // GROUP) + tl.arange(0, 2), tl.zeros([2], dtype=tl.int32))
        if pid_bh == 0:  # and the persistent walk's tile counter, after the units' counts
            units = tl.num_programs(1) // GROUP
            tl.store(ZQ + 2 * units + tl.arange(0, 2), tl.zeros([2], dtype=tl.int32))
    if ZERO_DQ and pid_bh // GROUP < ZERO_UNITS:  # the rows this program owns: one launch fewer than a memset
        acc = (
            DQ_ACC
            + b * stride_ab
            + h * stride_ah
            + offs_m[:, None].to(tl.int64) * stride_am
            + offs_d[None, :]
        )
        tl.store(acc, tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), mask=row_ok)


class DqScratch:
    """The one pass's fp32 scratch for one shape: D (delta_shape's rows), then dQ's accumulator (acc_shape,
    contiguous; zeroed by the preprocess and the dK/dV programs, backward_ws._zero_issue), then two int32 counts
    per unit of the dK/dV kernel (set to 0 by the preprocess: its programs that zeroed the unit, and those whose
    reduce-adds into it have landed) and a row for its persistent walk's tile counter, in one allocation: one
    torch.empty where there would be two (8.9 us of host time each on an H100 host, `python3 benchmarks/host_time.py
    --breakdown`). The kernels read D through its pointer alone, so the scratch itself stands for D, and one view
    (1.2 us on the CPU machine) makes the accumulator; its offset and strides are worked out once, here. Every call
    has its own counts: two calls of one shape may run on two streams at once."""

    def __init__(self, acc_shape: tuple[int, ...], delta_shape: tuple[int, ...], units: int = 0) -> None:
        self.acc_shape, self.acc_strides = acc_shape, _contiguous(acc_shape)
        rows = delta_shape[0] * _contiguous(delta_shape)[0]
        self.offset = -(-rows // 32) * 32  # the accumulator 128-byte aligned (its TMA descriptor needs 16)
        self.counts_at = self.offset + acc_shape[0] * self.acc_strides[0]
        self.units = units
        self.size = self.counts_at + 2 * (units + 1)

    def make(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dQ's accumulator, the scratch: D in its first elements, the int32 counts [units + 1, 2]), uninitialised,
        on `device`."""
        scratch = torch.empty(self.size, dtype=torch.float32, device=device)
        acc = scratch.as_strided(self.acc_shape, self.acc_strides, self.offset)
        counts = scratch.as_strided((self.units + 1, 2), (2, 1), self.counts_at).view(torch.int32)
        return acc, scratch, counts


@triton.jit
def _dq_convert(
    ACC,  # dQ's fp32 accumulator; unit u's region: ROWS rows of COLS elements from ACC + u * UNIT, stride_r apart
    DQ,  # out: dQ, at the same offsets
    COUNTS,  # int32 [units, 2]: in column 1, the dK/dV programs of each unit whose reduce-adds have landed
    parts,  # the dK/dV programs per unit
    ROWS,
    COLS,
    stride_r,
    UNIT,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,  # a divisor of COLS
):
    """dQ = its accumulator in dQ's dtype, a [BLOCK_R, BLOCK_C] tile per program, each unit's once the count of its
    dK/dV programs is whole (backward_ws._dq_count; acquire). Launched behind the one pass as a programmatic
    dependent launch, its programs take the SMs the pass's last programs leave and convert the units already done
    while those run; a program whose unit is not yet done waits for it (the programs it waits for have started)."""
    unit = tl.program_id(1)
    per_row = COLS // BLOCK_C
    r = tl.program_id(0) // per_row
    c = tl.program_id(0) % per_row
    seen = tl.atomic_add(COUNTS + 2 * unit + 1, 0, sem="acquire", scope="gpu")
    while seen < parts:
        seen = tl.atomic_add(COUNTS + 2 * unit + 1, 0, sem="acquire", scope="gpu")
    rows = r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs = unit.to(tl.int64) * UNIT + rows[:, None].to(tl.int64) * stride_r + cols[None, :]
    inside = rows[:, None] < ROWS
    acc = tl.load(ACC + offs, mask=inside)
    tl.store(DQ + offs, acc.to(DQ.dtype.element_ty), mask=inside)


class DqConvert:
    """_dq_convert's launch over `units` regions of `rows` x `cols` (a multiple of `head_dim`), `stride_r` apart by
    row and `unit` elements apart, behind a one pass of `parts` programs per unit: a programmatic dependent launch
    on the GPU (the pass's programs let it start: backward_ws.launch_dependents), not under the interpreter."""

    BLOCK_R = 64

    def __init__(
        self, rows: int, cols: int, stride_r: int, unit: int, units: int, head_dim: int, parts: int
    ) -> None:
        grid = (cdiv(rows, self.BLOCK_R) * (cols // head_dim), units)
        options: dict[str, Any] = {"num_warps": 4}
        if not interpreting():
            options["launch_pdl"] = True
        self.call = KernelCall(_dq_convert, grid, {"BLOCK_R": self.BLOCK_R, "BLOCK_C": head_dim}, options)
        self.args = (parts, rows, cols, stride_r, unit)

    def __call__(self, acc: torch.Tensor, dq: torch.Tensor, counts: torch.Tensor) -> None:
        """dq (contiguous, acc's shape) = acc converted, unit by unit as `counts` says each is done."""
        self.call((acc, dq, counts, *self.args))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1]
    for n in reversed(shape[1:]):
        strides.insert(0, strides[0] * n)
    return tuple(strides)


class _BackwardPlan:
    """The backward's launch plan for one input signature: which dK/dV pass (Gluon, one pass or not, or tl),
    the dQ pass, TMA or pointers, strides and grids, made once (launch.PlanCache); run() allocates the
    gradients and launches (each kernel through Triton's JIT the first time, then its compiled binary)."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        do: torch.Tensor,
        p: torch.Tensor | None,
        causal: bool,
        dkdv_config: dict[str, Any] | None,
        dq_config: dict[str, Any] | None,
        window: tuple[int, int] | None,
    ) -> None:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        self.delta_shape = (B, H, Nq)
        self.stored = p is not None
        self.p_strides = p.stride() if p is not None else (0, 0, 0, 0)
        ws_cfg = _gluon_dkdv_config(q, k, v, do, causal, window, self.stored, dkdv_config)
        self.ws = backward_ws.DkdvPlan(q, k, causal, ws_cfg) if ws_cfg is not None else None
        self.one_pass = self.ws is not None and self.ws.one_pass
        # the one pass's D, dQ accumulator and its two counts per unit (a batch and K/V head): zeroed, added
        self.scratch = DqScratch((B, H, Nq, D), self.delta_shape, B * Hkv)
        # dQ converted behind the one pass, a unit (B * H_KV of them) per GQA group's rows of [B * H * Nq, D]
        self.convert = None
        if self.ws is not None and self.ws.call.constexprs["BEHIND"]:
            G = H // Hkv
            self.convert = DqConvert(G * Nq, D, D, G * Nq * D, B * Hkv, D, self.ws.tiles[0])
        pre_m = 64
        ahead = self.ws.ahead if self.one_pass and self.ws is not None else 0
        # dQ's accumulator [B, H, Nq, D]; the preprocess zeroes the units below the dK/dV kernel's distance
        self.pre_args = (*row_strides(o, do), H, Nq, H * Nq * D, Nq * D, D, H // Hkv, ahead)
        pre_constexprs = {"HEAD_DIM": D, "BLOCK_M": pre_m, "ZERO_DQ": self.one_pass}
        self.pre = KernelCall(_bwd_preprocess, (cdiv(Nq, pre_m), B * H), pre_constexprs, {})
        self.tma = use_tma(q, k, v, do)
        # what each pass streams (dK/dV: Q, dO; dQ: K, V) through descriptors: not Q, dO where the Gluon pass runs
        self.streamed_tma = tuple(self.tma and not (self.ws is not None and i < 2) for i in range(4))
        right_limit, left_limit, win_left, win_right = window_flags(causal, window)
        constexprs = {
            "HEAD_DIM": D,
            "CAUSAL": right_limit,
            "WINDOW": left_limit,
            "STORED_P": self.stored,
            "IEEE": q.dtype == torch.float32,
            "TMA": self.tma,
            **NOT_VARLEN,
        }
        name = "stored_p" if self.stored else "recompute"
        g_strides = (H * Nq * D, Nq * D, D)  # dq; dk, dv: (Hkv * Nk * D, Nk * D, D)
        kv_strides = (Hkv * Nk * D, Nk * D, D)
        self.strides = (*row_strides(q, k, v, do), *self.p_strides)
        self.dkdv_strides, self.dq_strides = (*kv_strides, *kv_strides), g_strides
        self.heads = (H, Hkv, H // Hkv)
        self.sizes_a = (Nq, Nk)
        self.sizes_b = (win_left, win_right, seq_bucket(max(Nq, Nk)))
        self.dkdv = self.dq = None
        if self.ws is None:
            self.dkdv = TunedCall(
                name=f"dkdv_{name}",
                kind="dkdv",
                kernel=_bwd_dkdv,
                grid=lambda meta: (cdiv(Nk, meta["BLOCK_N"]), B * Hkv),
                constexprs=constexprs,
                space=BWD_DKDV_SPACE,
                forced=dkdv_config,
                interpret_config=INTERPRET_BWD,
            )
        if not self.one_pass:
            self.dq = TunedCall(
                name=f"dq_{name}",
                kind="dq",
                kernel=_bwd_dq,
                grid=lambda meta: (cdiv(Nq, meta["BLOCK_M"]), B * H),
                constexprs=constexprs,
                space=BWD_DQ_SPACE,
                forced=dq_config,
                interpret_config=INTERPRET_BWD,
            )

    def _streamed(self, call: TunedCall | None, tensors: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        """q, do, k, v as the passes stream them: descriptors where TMA until `call` launches directly (then, as
        elsewhere, the tensors: launch.KernelCall)."""
        if call is None or call.direct:
            return tensors
        return tuple(
            host_descriptor(t) if tma else t for t, tma in zip(tensors, self.streamed_tma, strict=True)
        )

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        do: torch.Tensor,
        p: torch.Tensor | None,
        sm_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        qk_scale = sm_scale * LOG2E
        if self.one_pass:
            assert self.ws is not None
            # dQ's accumulator (zeroed by the preprocess) and D in one allocation (DqScratch); dQ is the
            # accumulator converted behind the pass (DqConvert), else by .to()
            dq_acc, delta, counts = self.scratch.make(q.device)
            # dQ allocated before the pass: the conversion starts while it runs, so dQ's memory must not be any
            # the pass reads or writes (a tensor freed after the launch would be)
            dq = torch.empty_like(q, memory_format=torch.contiguous_format) if self.convert else None
            self.pre((o, do, delta, dq_acc, counts, *self.pre_args))
            cfg_kv = self.ws.run((q, do, k, v, dk, dv), dq_acc, lse, delta, qk_scale, sm_scale, counts)
            _set_last_bwd_config(cfg_kv, backward_ws.DQ_IN_ONE_PASS)
            if self.convert is not None and dq is not None:
                self.convert(dq_acc, dq, counts)
                return dq, dk, dv
            return dq_acc.to(dtype=q.dtype), dk, dv  # dtype= by keyword: 1.7 against 2.3 us (the CPU machine)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        delta = torch.empty(size=self.delta_shape, dtype=torch.float32, device=q.device)
        self.pre((o, do, delta, delta, delta, *self.pre_args))  # DQ_ACC, ZQ unused
        inputs = (q, k, v, do, lse, delta, p if p is not None else lse)  # lse: never read without STORED_P
        sizes = (*self.sizes_a, qk_scale, sm_scale, *self.sizes_b)
        if self.ws is not None:
            cfg_kv = self.ws.run((q, do, k, v, dk, dv), None, lse, delta, qk_scale, sm_scale)
        else:
            assert self.dkdv is not None
            sq, sdo = self._streamed(self.dkdv, (q, do, k, v))[:2]
            cfg_kv = self.dkdv(
                (*inputs, dk, dv, sq, sdo, *self.strides, *self.dkdv_strides, *self.heads, *sizes)
            )
        assert self.dq is not None
        sk, sv = self._streamed(self.dq, (q, do, k, v))[2:]
        h, _, group = self.heads
        cfg_q = self.dq((*inputs, dq, sk, sv, *self.strides, *self.dq_strides, h, group, *sizes))
        _set_last_bwd_config(cfg_kv, cfg_q)
        return dq, dk, dv


_PLANS = PlanCache(_BackwardPlan)


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
    window: tuple[int, int] | None = None,
    plans: dict[Any, _BackwardPlan] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv for attention whose forward saved o and lse2; p is the stored P (stored-P variant) or None;
    window: the sliding window the forward ran with (common.check_window's form), or None.

    dkdv_config / dq_config force a pass's config ({"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}, as
    `last_bwd_config()` reports it; benchmarks/studies/backward.py uses this); otherwise they are autotuned.
    The passes, their configs and launch geometry are chosen once per input signature (_BackwardPlan).

    plans: where flash_attn's forward had a signature of its own (flash_v2._CHECKED: the shapes, strides, dtypes and
    alignment of q, k and v, the device, the mask, no config), the backward plans of its calls, filled here and
    keyed by what the backward adds to it: dO's layout, torch's deterministic flag, the environment switches now,
    and the alignment of o and lse (fresh contiguous tensors of the forward plan's shapes): 1.3 us against 3.6 for
    the whole key on the CPU machine (tools/host_path.py --sm90-stub).
    """
    do = unit_stride(do)
    short = plan = None
    if plans is not None:
        short = (
            tensor_key(do),
            torch.are_deterministic_algorithms_enabled(),
            env_key(),
            o.data_ptr() % 16 == 0,
            lse.data_ptr() % 16 == 0,
        )
        plan = plans.get(short)
    if plan is None:
        key = (
            *(tensor_key(t) for t in (q, k, v, o, lse, do)),
            tensor_key(p) if p is not None else None,
            q.device,
            causal,
            window,
            config_key(dkdv_config),
            config_key(dq_config),
            torch.are_deterministic_algorithms_enabled(),
            env_key(),
        )
        plan = _PLANS.get(key, q, k, v, o, do, p, causal, dkdv_config, dq_config, window)
        if plans is not None:
            if len(plans) >= 8:
                plans.clear()
            plans[short] = plan
    return plan.run(q, k, v, o, lse, do, p, sm_scale)


def _gluon_dkdv_config(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    window: tuple[int, int] | None,
    stored: bool,
    forced: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The Gluon dK/dV pass's config when it runs these inputs, else None (the tl pass runs): forced by
    {"kernel": "gluon-ws", ...} (KernelUnsupported where it cannot run), else taken by default where
    `backward_ws.default_config` says so."""
    if forced is not None and forced.get("kernel") == "gluon-ws":
        cfg = backward_ws.config_for(q.shape[-1], forced)
        why = "the stored-P backward runs on the tl kernel" if stored else None
        why = why or backward_ws.supported(q, k, v, do, causal, window, cfg)
        if why:
            raise KernelUnsupported(f"gluon-ws backward: {why}")
        return cfg
    default = None if forced is not None or stored else backward_ws.default_config(q, causal)
    if default is None or backward_ws.supported(q, k, v, do, causal, window, default) is not None:
        return None
    return default

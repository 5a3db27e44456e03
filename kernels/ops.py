"""The bundled kernels as torch.library custom ops, so that torch.compile(fullgraph=True) takes them whole.

    flashbench::attn_fwd(q, k, v, causal, sm_scale, window_left, window_right) -> (o, lse2)
    flashbench::attn_bwd(do, q, k, v, o, lse2, causal, sm_scale, window_left, window_right) -> (dq, dk, dv)
    flashbench::decode(q, k_cache, v_cache, cache_seqlens, block_table, causal, sm_scale, num_splits, validate,
                       k_scale, v_scale) -> out

attn_fwd's autograd formula is attn_bwd (register_autograd), so a compiled training step differentiates through
it; each op has a fake (meta) implementation that gives the outputs' shapes, dtypes and strides without
running a kernel. flash_attn and flash_decode call these ops only while torch.compile traces
(torch.compiler.is_compiling()): in eager mode the dispatcher's Python round trip would be host time on every
call, and the ops run the same launchers. A window of (-1, -1) stands for none (common.check_window never
returns it for a real window).
"""

from __future__ import annotations

import torch

from .backward import attention_backward
from .decode import flash_decode as _flash_decode
from .flash_v2 import attention_forward

NO_WINDOW = (-1, -1)


def _window(left: int, right: int) -> tuple[int, int] | None:
    return None if (left, right) == NO_WINDOW else (left, right)


@torch.library.custom_op("flashbench::attn_fwd", mutates_args=())
def attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse, _ = attention_forward(q, k, v, causal, sm_scale, None, _window(window_left, window_right))
    return o, lse


@attn_fwd.register_fake
def _(q, k, v, causal, sm_scale, window_left, window_right):  # type: ignore[no-untyped-def]
    b, h, n, d = q.shape
    return q.new_empty((b, h, n, d)), q.new_empty((b, h, n), dtype=torch.float32)


@torch.library.custom_op("flashbench::attn_bwd", mutates_args=())
def attn_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    sm_scale: float,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    window = _window(window_left, window_right)
    return attention_backward(q, k, v, o, lse, do, None, causal, sm_scale, window=window)


@attn_bwd.register_fake
def _(do, q, k, v, o, lse, causal, sm_scale, window_left, window_right):  # type: ignore[no-untyped-def]
    contiguous = torch.contiguous_format
    return tuple(torch.empty_like(t, memory_format=contiguous) for t in (q, k, v))


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    q, k, v, causal, sm_scale, window_left, window_right = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, sm_scale, window_left, window_right)


def _backward(ctx, do, _dlse):  # type: ignore[no-untyped-def]
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attn_bwd(do.contiguous() if do.stride(-1) != 1 else do, q, k, v, o, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None


attn_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("flashbench::decode", mutates_args=())
def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    causal: bool,
    sm_scale: float | None,
    num_splits: int | None,
    validate: bool,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    return _flash_decode(
        q, k_cache, v_cache, cache_seqlens, block_table, causal, sm_scale, num_splits,
        k_scale=k_scale, v_scale=v_scale, validate=validate,
    )  # fmt: skip


@decode.register_fake
def _(q, *_cache_and_options):  # type: ignore[no-untyped-def]
    return q.new_empty(q.shape)

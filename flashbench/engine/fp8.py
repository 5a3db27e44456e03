"""FP8 (e4m3) inputs: per-(batch, KV head) amax scaling with FlashAttention-3's descale convention.

    q8, q_descale = quantize(q, kv_heads)      # q [B, H, N, D] -> e4m3 q8 and fp32 q_descale [B, Hkv]
    q_real = dequantize(q8, q_descale)         # fp32 [B, H, N, D]: q8 * q_descale, per K/V head group

A query head's scale is its K/V head's (FA3 indexes q_descale by the K/V head of each query head), so the amax
of q is taken over every query head of a group. The sweep quantizes its bf16 inputs with this outside the timing;
the kernel tests and benchmarks/fp8_error.py use it too.
"""

from __future__ import annotations

from typing import Any

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def quantize(x: Any, kv_heads: int) -> tuple[Any, Any]:
    """(x / scale in float8_e4m3fn, scale fp32 [B, kv_heads]) with scale = amax / 448 over each (batch, K/V head
    group) of x [B, H, N, D]; an all-zero group gets scale 1. The result keeps x's memory layout."""
    import torch

    b, h = x.shape[0], x.shape[1]
    if h % kv_heads:
        raise ValueError(f"kv_heads {kv_heads} does not divide heads {h}")
    x32 = x.detach().float()
    amax = x32.abs().amax(dim=(2, 3)).view(b, kv_heads, h // kv_heads).amax(-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (x32 / _per_head(scale, h)).to(torch.float8_e4m3fn), scale.contiguous()


def dequantize(x8: Any, descale: Any) -> Any:
    """The fp32 values x8 stands for: x8 * descale, descale [B, Hkv] broadcast over each K/V head's group."""
    return x8.float() * _per_head(descale, x8.shape[1])


def _per_head(scale: Any, heads: int) -> Any:
    """[B, Hkv] -> [B, heads, 1, 1]: each query head takes its K/V head's value (h // (heads // Hkv))."""
    return scale.repeat_interleave(heads // scale.shape[1], dim=1)[:, :, None, None]

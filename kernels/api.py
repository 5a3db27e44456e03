"""The public `flash_attn`: FP8 (e4m3) inputs go to flash_fp8's forward, every other dtype to flash_v2's.

One entry point for every dtype, as flash-attn 3's flash_attn_func takes its FP8 descales beside the usual
arguments. Keyword options of flash_v2.flash_attn beyond these pass through unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from . import flash_v2
from .common import KernelUnsupported
from .flash_fp8 import FP8_DTYPES, flash_attn_fp8


def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: dict[str, Any] | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """FlashAttention-2 attention on [B, H, N, D] tensors (flash_v2.flash_attn: fp16, bf16, fp32, differentiable),
    or with torch.float8_e4m3fn q, k, v and float32 descales of shape [B, Hkv] the FP8 forward
    (flash_fp8.flash_attn_fp8: FlashAttention-3's contract, bf16 output, no backward).
    Raises KernelUnsupported naming what is unsupported.
    """
    descales = (q_descale, k_descale, v_descale)
    if getattr(q, "dtype", None) in FP8_DTYPES or any(d is not None for d in descales):
        if options:
            raise KernelUnsupported(f"flash_attn: {', '.join(sorted(options))} not supported with FP8 inputs")
        return flash_attn_fp8(q, k, v, causal, sm_scale, config, *descales)
    return flash_v2.flash_attn(q, k, v, causal, sm_scale, config, **options)

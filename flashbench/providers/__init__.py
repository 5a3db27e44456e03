"""Attention providers: a typed registry of implementations flashbench can time.

User kernel files (``flashbench sweep --kernel my_attn.py``) register through the same decorator the
bundled kernels use::

    from flashbench.providers import register

    @register("my-attn", dtypes=("fp16", "bf16"), head_dims=(64, 128))
    def my_attn(q, k, v, causal=False, sm_scale=None): ...
"""

from __future__ import annotations

from flashbench.providers.registry import (
    MEMORY_FAMILIES,
    Provider,
    ProviderInfo,
    Unsupported,
    register,
)

__all__ = ["MEMORY_FAMILIES", "Provider", "ProviderInfo", "Unsupported", "register"]

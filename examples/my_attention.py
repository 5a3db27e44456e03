"""Benchmark your own attention against the bundled kernels and the baselines:

flashbench sweep --kernel examples/my_attention.py --providers my-attention,sdpa-flash,triton
"""

import torch

from flashbench.providers import register


@register("my-attention", dtypes=("fp16", "bf16", "fp32"), causal=True, backward=True, gqa=False)
def my_attention(q, k, v, causal=False, sm_scale=None):
    """Plain PyTorch attention. q: [B, H, Nq, D], k/v: [B, H, Nk, D] -> [B, H, Nq, D]."""
    s = (q @ k.transpose(-2, -1)).float() * sm_scale  # S: [B, H, Nq, Nk], fp32
    if causal:  # bottom-right aligned, as flash-attn: query i sees keys j <= i + (Nk - Nq)
        n_q, n_k = s.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(dim=-1).to(q.dtype) @ v

"""Test provider: returns NaN: the row must be `wrong`, never a speed."""

import torch

from flashbench.providers import register


@register("test-nan", devices=("cuda", "cpu"))
def nan(q, k, v, causal=False, sm_scale=None):
    return torch.full_like(q, float("nan"))

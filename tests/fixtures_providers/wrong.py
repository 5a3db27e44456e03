"""Test provider: finite but wrong (the softmax scale is off by 2x): the error budget must catch it."""

import torch

from flashbench.providers import register


@register("test-wrong", devices=("cuda", "cpu"))
def wrong(q, k, v, causal=False, sm_scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=2 * sm_scale)

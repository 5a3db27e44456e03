"""Test provider: runs out of memory from N = 32 on (smaller N work): an `oom` row, then larger N skipped."""

import torch

from flashbench.providers import register


@register("test-oom", devices=("cuda", "cpu"))
def oom(q, k, v, causal=False, sm_scale=None):
    if q.shape[2] >= 32:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (test provider)")
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)

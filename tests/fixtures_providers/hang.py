"""Test provider: never returns (a deadlocked kernel, in effect); the runner must time it out."""

import time

from flashbench.providers import register


@register("test-hang", devices=("cuda", "cpu"))
def hang(q, k, v, causal=False, sm_scale=None):
    time.sleep(3600)

"""Test provider: the worker process dies of SIGSEGV on the first call (a kernel's illegal access, in effect)."""

import os
import signal

from flashbench.providers import register


@register("test-segfault", devices=("cuda", "cpu"))
def segfault(q, k, v, causal=False, sm_scale=None):
    os.kill(os.getpid(), signal.SIGSEGV)

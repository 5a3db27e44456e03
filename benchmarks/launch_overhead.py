"""Host time per call of the bundled FA2 kernel on a GPU (forced config, autotuned; TMA off or on, i.e. host
tensor descriptors; forward and forward+backward) beside SDPA.

A kernel whose Python launch path takes longer than its GPU work is measured as host time, not kernel time
(the GPU waits for the next launch). This prints microseconds of host time per call (200 calls, no sync
between them), the do_bench median for the same call, and a cProfile of the slowest path's calls.

    python3 benchmarks/launch_overhead.py
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time

import torch
import triton
from flashbench.kernels import flash_attn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

FORCED = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


def host_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main() -> None:
    b, h, n, d = 8, 32, 2048, 64
    q, k, v = (torch.randn((b, h, n, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v)

    def flash_fwd_bwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.autograd.grad(sdpa(*leaves), leaves, do)

    calls = {
        "sdpa-flash fwd": flash,
        "triton forced fwd": lambda: flash_attn(q, k, v, config=FORCED),
        "triton autotuned fwd": lambda: flash_attn(q, k, v),
        "sdpa-flash fwd+bwd": flash_fwd_bwd,
        "triton fwd+bwd": lambda: torch.autograd.grad(flash_attn(*leaves), leaves, do),
    }
    worst, worst_us = None, 0.0
    for mode, tma in (("TMA off", "0"), ("host descriptors", "1")):
        os.environ["FLASHBENCH_TMA"] = tma
        for name, fn in calls.items():
            if name.startswith("sdpa") and mode != "TMA off":
                continue
            us = host_us(fn)
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(f"{mode:24} {name:22} host {us:9.1f} us/call   do_bench {ms:.3f} ms", flush=True)
            if us > worst_us and "fwd+bwd" not in name:
                worst, worst_us = (tma, name, fn), us
    assert worst is not None
    os.environ["FLASHBENCH_TMA"] = worst[0]
    print(f"cProfile of 100 calls: FLASHBENCH_TMA={worst[0]} {worst[1]}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        worst[2]()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()

"""Host time of the bundled forward's Python path, with the kernel launch itself stubbed out.

flashbench's timer does not sync between samples, so a call whose host path is longer than its GPU work is
measured as host time (BENCHMARKS.md, "Host time per call"). This isolates the part flashbench owns: input
checks, the autograd glue, the Gluon/tl dispatch, output allocation, the TMA checks and host descriptors, the
config lookup and the block-shape hook; everything up to `kernel[grid](...)`, which is replaced by a no-op.
Triton's own launch path (argument binding, descriptor encoding, cuLaunchKernel) is not included: for the whole
path on a GPU use benchmarks/launch_overhead.py.

Runs on the CPU machine (Triton's interpreter, fp16 CPU tensors, the one interpreter config) or on CUDA (the
autotuned pick, which it tunes first). Prints the median of `--repeats` timings of `--calls` calls each, per case.

    python3 benchmarks/host_path.py                 # CPU: sets TRITON_INTERPRET=1 itself
    python3 benchmarks/host_path.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from flashbench.kernels import flash_v2

    # Small tensors: the host path does not depend on their size, and CPU allocations of large ones would be
    # timed instead (torch.empty of 64 MB costs ~15 us on the CPU machine, a cached CUDA block ~2 us).
    b, h, n, d = 1, 2, 2048, 64
    dtype = torch.float16 if args.device == "cpu" else torch.bfloat16
    q, k, v = (torch.randn((b, h, n, d), dtype=dtype, device=args.device) for _ in range(3))
    grads = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    real = flash_v2._attn_fwd
    for causal in (False, True):  # compile / tune with the real kernel first (CUDA), then stub the launch
        flash_v2.flash_attn(q, k, v, causal=causal)

    class NoLaunch:
        arg_names = real.arg_names
        cache_key = getattr(real, "cache_key", None)
        fn = getattr(real, "fn", real)

        def __getitem__(self, grid):
            return lambda *a, **kw: None

    flash_v2._attn_fwd = NoLaunch()
    cases = {
        "fwd, causal": lambda: flash_v2.flash_attn(q, k, v, causal=True),
        "fwd, not causal": lambda: flash_v2.flash_attn(q, k, v, causal=False),
        "fwd, causal, inputs require grad": lambda: flash_v2.flash_attn(*grads, causal=True),
    }
    try:
        for name, call in cases.items():
            for _ in range(200):
                call()
            runs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call()
                runs.append((time.perf_counter() - t0) / args.calls * 1e6)
            print(
                f"{name:34} {statistics.median(runs):7.1f} us/call (min {min(runs):.1f}, max {max(runs):.1f})"
            )
    finally:
        flash_v2._attn_fwd = real


if __name__ == "__main__":
    main()

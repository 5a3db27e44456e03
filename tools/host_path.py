"""Host time of the bundled forward's Python path, measured on a machine without a GPU.

flashbench's timer does not sync between samples, so a call whose host path is longer than its GPU work is
measured as host time (docs/benchmarks.md). Two views, both timed as the median of `--repeats`
runs of `--calls` calls:

  default      flash_attn end to end under Triton's interpreter (fp16 CPU tensors, the one interpreter config),
               with `kernel[grid](...)` replaced by a no-op: the part flashbench owns (input checks, autograd
               glue, Gluon/tl dispatch, allocation, TMA checks, host descriptors, config lookup, descriptor
               sizing).
  --sm90-stub  flash_v2.attention_forward (after the input checks and autograd glue) through Triton's own
               launch path for a kernel compiled for sm_90a (tools/sm90_compile.py's stub driver): argument
               binding and specialization, the kernel cache, the launcher's descriptor handling. Only the C
               launcher (cuLaunchKernel) and the TMA descriptor encoding are stubbed. Needs the GPU machine's
               Triton (3.6) in a side environment (see sm90_compile.py); the pick is (64, 128, 4, 2), causal.

For the whole path on a GPU use benchmarks/host_time.py.

    python3 tools/host_path.py
    /tmp/t36/bin/python tools/host_path.py --sm90-stub
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def _timed(name: str, call, calls: int, repeats: int) -> None:
    for _ in range(200):
        call()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    print(f"{name:40} {statistics.median(runs):7.1f} us/call (min {min(runs):.1f}, max {max(runs):.1f})")


def interpreter(calls: int, repeats: int) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from flashbench.kernels import flash_v2

    # Small tensors: the host path does not depend on their size, and CPU allocations of large ones would be
    # timed instead (torch.empty of 64 MB costs ~15 us on the CPU machine, a cached CUDA block ~2 us).
    q, k, v = (torch.randn((1, 2, 2048, 64), dtype=torch.float16) for _ in range(3))
    grads = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    real = flash_v2._attn_fwd

    class NoLaunch:
        arg_names = real.arg_names

        def __getitem__(self, grid):
            return lambda *a, **kw: None

    flash_v2._attn_fwd = NoLaunch()
    try:
        _timed("flash_attn fwd, causal", lambda: flash_v2.flash_attn(q, k, v, causal=True), calls, repeats)
        _timed("flash_attn fwd, not causal", lambda: flash_v2.flash_attn(q, k, v), calls, repeats)
        grad_call = lambda: flash_v2.flash_attn(*grads, causal=True)
        _timed("flash_attn fwd, causal, inputs need grad", grad_call, calls, repeats)
    finally:
        flash_v2._attn_fwd = real


def sm90_stub(calls: int, repeats: int) -> None:
    import sm90_compile
    import torch
    import triton
    from triton.backends.nvidia import driver as nvidia

    class Utils:
        def fill_tma_descriptor(self, *args):
            return object()

        def load_binary(self, name, kernel, shared, device):
            return 0, 0, 128, 0, 1024  # module, function, registers, spills, max threads

        def get_device_properties(self, device):
            return {"max_shared_mem": 232448, "multiprocessor_count": 132}

    class Launcher:  # CudaLauncher's Python side over a no-op C launch
        def __init__(self, src, metadata):
            meta = getattr(metadata, "tensordesc_meta", None)
            self.launch = nvidia.wrap_handle_tensordesc(lambda *a: None, dict(src.signature.items()), meta)

        def __call__(self, gx, gy, gz, stream, function, *args):
            self.launch(gx, gy, gz, stream, function, False, False, None, None, *args)

    drv = sm90_compile._Sm90Driver()
    drv.utils, drv.launcher_cls = Utils(), Launcher
    triton.runtime.driver.set_active(drv)
    from flashbench.kernels import autotune, flash_v2, launch

    flash_v2.use_tma = lambda *t: True
    launch._max_shared_mem = lambda: 232448
    pick = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}
    autotune.lookup = lambda key: dict(pick)  # the per-call path of an autotuned key: an in-memory pick
    q, k, v = (torch.randn((1, 2, 2048, 64), dtype=torch.bfloat16) for _ in range(3))
    call = lambda: flash_v2.attention_forward(q, k, v, True, 0.125)
    _timed("attention_forward, causal (sm_90a)", call, calls, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sm90-stub", action="store_true")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    (sm90_stub if args.sm90_stub else interpreter)(args.calls, args.repeats)


if __name__ == "__main__":
    main()

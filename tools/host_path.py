"""Host time of the bundled kernels' Python path, measured on a machine without a GPU.

flashbench's timer does not sync between samples, so a call whose host path is longer than its GPU work is
measured as host time (docs/benchmarks.md). Two views, each line this process's CPU time per call (other
processes on a shared machine do not count), the median and range of `--repeats` runs of `--calls` calls:

  default      flash_attn's forward end to end under Triton's interpreter (fp16 CPU tensors, the one interpreter
               config), with `kernel[grid](...)` replaced by a no-op: the part flashbench owns (input checks,
               autograd glue, Gluon/tl dispatch, allocation, TMA checks, host descriptors, config lookup,
               descriptor sizing). The interpreter compiles nothing, so every call takes the JIT's path.
  --sm90-stub  the kernels an H100 runs, compiled for sm_90a (tools/sm90_compile.py's stub driver) and launched
               through Triton's own launch path: after the first call the plans' direct launches
               (launch.KernelCall, launch.RawLaunch). Only the C launcher (cuLaunchKernel), loading a binary and
               the TMA descriptor encoding are stubbed. Lines: attention_forward (checked inputs),
               flash_attn's forward with inputs that need grad (the autograd node recorded), attention_backward
               (saved tensors), and a fwd+bwd step (flash_attn, then torch.autograd.grad); causal, bf16, one
               head of 128 queries at --dim (128: the Gluon forward; 64: the tl forward, its pick (64, 128, 4,
               2)) and the one-pass Gluon backward. --profile adds a cProfile of the step. Needs the GPU
               machine's Triton (3.6) in a side environment (see sm90_compile.py).
  --sm90-stub --mla
               flash_mla_decode on the same stub: DeepSeek-V3's shape (128 heads, 576 / 512 dims, bf16, Nq 1) at the
               sweep's host-bound row (batch 4, 32768 keys: key splits and the combine; also num_splits=1: no
               combine), over a contiguous cache and over 64-token pages, through the Gluon kernel (its default
               here) and the tl kernel (FLASHBENCH_GLUON=0). Its input checks run, less the device's: CPU tensors
               stand for CUDA ones (mla._check_device, mla_ws.on_hopper answered for an H100). --profile adds a
               cProfile of the Gluon kernel's paged call.
  --sm90-stub --decode
               flash_decode on the same stub, validate=False as the sweep's timed calls: bf16 q, d = 128, GQA 32/8
               at batch 16 and 8192 keys (the decode-fp8 preset's first shape), over a bf16 and an e4m3 cache
               (one scale per sequence and KV head), contiguous and over 16-token pages, at the default split
               count; the device's check answered for a GPU (decode._check_device), 132 SMs.

What the CPU cannot show: a CUDA allocation's host cost (torch.empty: ~1.5 us here, 8.9 us on an H100 host) and
the autograd engine's hand-over to its device thread. For the whole path on a GPU use benchmarks/host_time.py.

    python3 tools/host_path.py
    /tmp/t36/bin/python tools/host_path.py --sm90-stub [--dim 64] [--profile]
    /tmp/t36/bin/python tools/host_path.py --sm90-stub --mla [--profile]
    /tmp/t36/bin/python tools/host_path.py --sm90-stub --decode
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def _timed(name: str, call, calls: int, repeats: int) -> None:
    """This process's CPU time per call (time.process_time: on a shared machine, time spent descheduled while
    other processes run is not counted)."""
    for _ in range(200):
        call()
    runs = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            call()
        runs.append((time.process_time() - t0) / calls * 1e6)
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


def _sm90_driver() -> None:
    """Triton's CUDA launch path for kernels compiled for sm_90a, without a GPU: tools/sm90_compile.py's driver,
    whose launcher is CudaLauncher's Python side (wrap_handle_tensordesc, the fields launch.RawLaunch reads) over
    a no-op C launch; loading a binary and encoding a TMA descriptor are stubbed."""
    import sm90_compile
    import triton
    from triton.backends.nvidia import driver as nvidia

    class Utils:
        def fill_tma_descriptor(self, *args):
            return object()

        def load_binary(self, name, kernel, shared, device):
            return 0, 0, 128, 0, 1024  # module, function, registers, spills, max threads

        def get_device_properties(self, device):
            return {"max_shared_mem": sm90_compile.SMEM, "multiprocessor_count": 132}

    class CLaunch:  # the compiled C launcher: a callable without Python code
        def __call__(self, *args):
            return None

    class Launcher:
        def __init__(self, src, metadata):
            meta = getattr(metadata, "tensordesc_meta", None)
            self.launch = nvidia.wrap_handle_tensordesc(CLaunch(), dict(src.signature.items()), meta)
            self.global_scratch_size = metadata.global_scratch_size
            self.profile_scratch_size = metadata.profile_scratch_size
            self.launch_cooperative_grid = metadata.launch_cooperative_grid
            self.launch_pdl = metadata.launch_pdl

        def __call__(self, gx, gy, gz, stream, function, *args):
            self.launch(
                gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None, *args
            )

    drv = sm90_compile._Sm90Driver()
    drv.utils, drv.launcher_cls = Utils(), Launcher
    triton.runtime.driver.set_active(drv)
    sm90_compile._stub_gpu(tma=True)


def sm90_stub(calls: int, repeats: int, dim: int, profile: bool) -> None:
    import torch

    _sm90_driver()
    from flashbench.kernels import autotune, backward_ws, flash_v2, flash_ws
    from flashbench.kernels.backward import attention_backward

    # flash_attn's checks refuse CPU tensors outside the interpreter; they run on a signature's first call only
    # (flash_v2._CHECKED), so the probe's inputs (contiguous, bf16) pass unchecked
    flash_v2.check_inputs = lambda name, q, k, v, causal, scale: (q, k, v, scale or q.shape[-1] ** -0.5)
    pick = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}
    autotune.lookup = lambda key: dict(pick)  # the per-call path of an autotuned key: an in-memory pick
    # The kernels the H100 runs at N >= 1024 (the one-pass Gluon backward; at d = 128 the Gluon forward), taken at
    # N = 128: the host path does not depend on N, and the CPU's own work does (its dQ conversion, 40 us at N = 1024)
    backward_ws.MIN_SEQ = dict.fromkeys(backward_ws.MIN_SEQ, 0)
    flash_ws.GLUON_MIN_SEQ = {**flash_ws.GLUON_MIN_SEQ, (128, True): 0}
    q, k, v = (torch.randn((1, 1, 128, dim), dtype=torch.bfloat16) for _ in range(3))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)
    scale = dim**-0.5
    o, lse, _ = flash_v2.attention_forward(q, k, v, True, scale)
    step = lambda: torch.autograd.grad(flash_v2.flash_attn(*leaves, causal=True), leaves, do)
    views = {
        "attention_forward, causal (sm_90a)": lambda: flash_v2.attention_forward(q, k, v, True, scale),
        "flash_attn fwd, causal, grad recorded": lambda: flash_v2.flash_attn(*leaves, causal=True),
        "attention_backward, causal (sm_90a)": lambda: attention_backward(
            q, k, v, o, lse, do, None, True, scale
        ),
        "flash_attn fwd+bwd step, causal": step,
    }
    for name, call in views.items():
        _timed(name, call, calls, repeats)
    if profile:
        _profile(step, calls)


def mla_stub(calls: int, repeats: int, profile: bool) -> None:
    import torch
    from flashbench.kernels import mla, mla_ws

    # _sm90_driver's stubs skip the MLA checks (they refuse CPU tensors outside the interpreter): here they run,
    # with only the device's answered for an H100
    checks, refusal = mla._check_tensors, mla_ws.refusal
    _sm90_driver()
    mla._check_tensors, mla_ws.refusal = checks, refusal
    mla._check_device = lambda q, name: None
    mla_ws.on_hopper = lambda device: True
    batch, keys, page = 4, 32768, 64
    q = torch.randn(batch, 128, 1, mla.MLA_HEAD_DIM, dtype=torch.bfloat16)
    kv = torch.empty(batch, 1, keys, mla.MLA_HEAD_DIM, dtype=torch.bfloat16)
    pool = kv.view(-1, 1, page, mla.MLA_HEAD_DIM)
    table = torch.arange(pool.shape[0], dtype=torch.int32).view(batch, -1)
    lens = torch.full((batch,), keys, dtype=torch.int32)
    caches = {"contiguous": (kv, None), "paged 64": (pool, table)}
    step, switch = None, os.environ.get("FLASHBENCH_GLUON")
    for kernel, gluon in (("gluon", "1"), ("tl", "0")):
        os.environ["FLASHBENCH_GLUON"] = gluon
        for layout, (cache, blocks) in caches.items():
            for splits in (None, 1):
                call = functools.partial(mla.flash_mla_decode, q, cache, lens, blocks, True,
                                         num_splits=splits, validate=False)  # fmt: skip
                call()
                ran = mla.last_mla_config()
                assert (ran.get("kernel") == mla_ws.KERNEL) == (gluon == "1"), ran
                name = f"mla {kernel} {layout}, {ran['num_splits']} split{'s' * (ran['num_splits'] > 1)}"
                _timed(name, call, calls, repeats)
                if gluon == "1" and blocks is not None and splits is None:
                    step = call
    if switch is None:
        del os.environ["FLASHBENCH_GLUON"]
    else:
        os.environ["FLASHBENCH_GLUON"] = switch
    if profile and step is not None:
        _profile(step, calls)


def decode_stub(calls: int, repeats: int) -> None:
    import torch
    from flashbench.kernels import decode

    _sm90_driver()
    decode._check_device = lambda q, name="flash_decode": None
    decode._sm_count = lambda index: 132
    batch, heads, kv_heads, keys, page = 16, 32, 8, 8192, 16
    q = torch.randn(batch, heads, 1, 128, dtype=torch.bfloat16)
    lens = torch.full((batch,), keys, dtype=torch.int32)
    table = torch.arange(batch * keys // page, dtype=torch.int32).view(batch, -1)
    for name, dtype, scales in (
        ("bf16", torch.bfloat16, {}),
        ("e4m3", torch.float8_e4m3fn, dict.fromkeys(("k_scale", "v_scale"), torch.ones(batch, kv_heads))),
    ):
        cache = torch.empty(batch, kv_heads, keys, 128, dtype=dtype)
        pool = cache.view(-1, kv_heads, page, 128)
        for layout, (k, blocks) in {"contiguous": (cache, None), "paged 16": (pool, table)}.items():
            call = functools.partial(
                decode.flash_decode, q, k, k, lens, blocks, True, validate=False, **scales
            )
            call()
            ran = decode.last_decode_config()
            assert ran is not None
            _timed(f"decode {name} {layout}, {ran['num_splits']} splits", call, calls, repeats)


def _profile(call, calls: int) -> None:
    """cProfile of `calls` calls: the functions by their own time, then by cumulative time."""
    import cProfile
    import pstats

    for _ in range(50):
        call()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(35)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sm90-stub", action="store_true")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dim", type=int, default=128, help="head dim of --sm90-stub's inputs")
    ap.add_argument("--mla", action="store_true", help="--sm90-stub: flash_mla_decode (Gluon and tl kernels)")
    ap.add_argument("--decode", action="store_true", help="--sm90-stub: flash_decode (bf16 and e4m3 caches)")
    ap.add_argument("--profile", action="store_true", help="--sm90-stub: also cProfile the fwd+bwd step")
    args = ap.parse_args()
    if args.sm90_stub and args.mla:
        mla_stub(args.calls, args.repeats, args.profile)
    elif args.sm90_stub and args.decode:
        decode_stub(args.calls, args.repeats)
    elif args.sm90_stub:
        sm90_stub(args.calls, args.repeats, args.dim, args.profile)
    else:
        interpreter(args.calls, args.repeats)


if __name__ == "__main__":
    main()

"""Where a provider's call spends its GPU time, kernel by kernel: every CUDA kernel the call launches and its mean
time per call under torch.profiler. A probe: timing the whole call is `flashbench sweep`'s work.

    python tools/kernel_times.py --providers triton,sdpa-cudnn --mode bwd --head-dim 128 --seq 16384
    python tools/kernel_times.py --kernel benchmarks/studies/backward.py --providers bwd-gluon,bwd-tl --mode bwd
    python tools/kernel_times.py --providers triton --mode bwd --seq 2048 --causal --packed 2048   # 8 documents
    python tools/kernel_times.py --providers triton-mla --heads 128 --kv-heads 1 --head-dim 576 --head-dim-v 512 \
        --seq-q 1 --seq 32768 --batch 4 --causal        # MLA decode: its split kernel and its combine

The case is made as a sweep makes it (flashbench.engine.measure.prepare: the provider's build, its inputs); the
shapes are the speed preset's (16k tokens per batch, hidden 2048: heads = 2048 / d) unless --batch / --heads are
given; --kv-heads, --seq-q and --head-dim-v make a decode or MLA case (a contiguous cache of --seq keys, as the
sweep's `--kv-heads`, `--seq-q` and `--head-dim-v` do). --packed MIN makes the case a packed batch as `--seqlens
random --min-seq MIN` does in a sweep: batch x N tokens cut into documents of MIN..N tokens (MIN = N: equal
documents, beside the uniform batch of the same shapes). In `bwd` mode the forward runs once, outside the profiled
calls, and each call is the backward of it, as the sweep's `bwd` mode times it. TFLOP/s beside a backward
kernel counts its block matmuls over every unmasked (query, key) pair (dK/dV: 4, dQ: 3; a packed batch's own
pairs). A kernel launched as a programmatic dependent launch (the Gluon MLA kernel's combine) may start before the
kernel it depends on has ended and waits for it on the GPU: its time here includes that wait.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys

# block matmuls per unmasked (query, key) pair of each backward kernel, by its name's start
MATMULS = {"_bwd_dkdv": 4, "_bwd_dq": 3}


def short_name(kernel: str) -> str:
    """A kernel's name as the table prints it: a Triton kernel's as it is; a demangled C++ one (`void
    at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(...)::{lambda...}, ...>(...)`)
    as its own name and the first function named among its template arguments
    (`vectorized_elementwise_kernel<bfloat16_copy_kernel_cuda>`), which tells torch's elementwise kernels apart."""
    name = kernel.removeprefix("void ").replace("(anonymous namespace)::", "")
    cut = min((i for i in (name.find("<"), name.find("(")) if i >= 0), default=-1)
    if cut < 0:
        return kernel
    base = name[:cut].split("::")[-1]
    inner = re.search(r"(\w+)\(", name[cut + 1 :]) if name[cut] == "<" else None
    return f"{base}<{inner.group(1)}>" if inner else base


def kernel_times(call, calls: int) -> dict[str, float]:
    """Mean GPU time (us) per call of each CUDA kernel `call` launches, over `calls` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", required=True, help="comma list of providers")
    ap.add_argument("--kernel", action="append", default=[], help="a provider file (repeatable)")
    ap.add_argument("--mode", choices=("fwd", "bwd", "fwd+bwd"), default="fwd")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, help="default: 16384 // seq (at least 1)")
    ap.add_argument("--heads", type=int, help="default: 2048 // head dim")
    ap.add_argument("--kv-heads", type=int, help="K/V heads (default: --heads)")
    ap.add_argument("--seq-q", type=int, help="query tokens per sequence (default: --seq)")
    ap.add_argument("--head-dim-v", type=int, default=0, help="MLA: V's (and the output's) head dim")
    ap.add_argument("--dtype", default="bf16", choices=("fp16", "bf16", "fp32", "fp8"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument(
        "--packed", type=int, default=0, metavar="MIN", help="packed documents of MIN..--seq tokens"
    )
    ap.add_argument("--calls", type=int, default=10, help="profiled calls per provider")
    args = ap.parse_args(argv)

    import torch

    import flashbench.providers.builtin  # noqa: F401  (registers the built-in providers)
    from flashbench.engine.measure import prepare
    from flashbench.models.flops import forward_flops
    from flashbench.providers.registry import load_kernel_file
    from flashbench.spec.cases import Case

    if not torch.cuda.is_available():
        print("kernel_times: needs a CUDA GPU", file=sys.stderr)
        return 2
    for path in args.kernel:
        load_kernel_file(path)
    d, n = args.head_dim, args.seq
    batch, heads = args.batch or max(1, 16384 // n), args.heads or 2048 // d
    packed = {"seqlens": "random", "min_seq": args.packed} if args.packed else {}
    kv_heads, seq_q = args.kv_heads or heads, args.seq_q or n
    case = Case("", batch, heads, kv_heads, seq_q, n, d, args.dtype, args.causal, args.mode, **packed,
                head_dim_v=args.head_dim_v)  # fmt: skip
    docs = case.documents()
    # one block matmul over every unmasked (query, key) pair of every head: half the forward's two
    matmul_flops = forward_flops(batch, heads, seq_q, n, d, args.causal, documents=docs) / 2
    print(
        f"{torch.cuda.get_device_name()}: B={batch} H={heads} Hkv={kv_heads} Nq={seq_q} N={n} d={d}"
        + (f"/{args.head_dim_v}" if args.head_dim_v else "")
        + f" {args.dtype} causal={args.causal}"
        + (f" documents={list(docs)}" if docs else "")
    )
    for name in args.providers.split(","):
        with contextlib.ExitStack() as stack:
            # bwd: the backward of one forward, retained
            call = prepare(dataclasses.replace(case, provider=name), "cuda", stack).looped()
            cells = []
            for kernel, us in kernel_times(call, args.calls).items():
                mm = next((m for start, m in MATMULS.items() if kernel.startswith(start)), 0)
                flops = f" ({mm * matmul_flops / us / 1e6:.0f} TF/s)" if mm else ""
                cells.append(f"{short_name(kernel)} {us:.0f} us{flops}")
        print(f"{name}: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

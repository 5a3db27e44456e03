"""Side by side on one GPU: the bundled backward's kernels against each other and against cuDNN's backward.

    python3 benchmarks/backward_ab.py [--dims 128,64] [--seqs 2048,8192] [--rounds 3] [--passes] [--energy]
        [--variants '{"tl": null, "ws": {"kernel": "gluon-ws"}, "ws-s3": {"kernel": "gluon-ws", "STAGES": 3}}']

Each variant is `flashbench.kernels.backward.attention_backward` with that dK/dV config (null: the tl dK/dV pass,
autotuned, as with FLASHBENCH_GLUON_BWD=0) and the tl dQ pass; "cudnn" is SDPA's cuDNN backward (torch.autograd.grad of its output). Shapes: the speed preset's
(bf16, hidden 2048, 16k tokens per batch), causal and not. Every variant's dQ, dK, dV is checked against the tl
backward first (max |difference| / max |tl|, printed). Timing: as the autotuner times
(flashbench.engine.timing.time_cuda: L2 flushed, 50 ms of warm-up, 100 ms of samples), the variants in rotating order for --rounds rounds, the median of the round medians; TFLOP/s counts the
backward as 2.5 forwards (causal: half the pairs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from flashbench.kernels.backward import attention_backward, last_bwd_config  # noqa: E402
from flashbench.kernels.flash_v2 import attention_forward  # noqa: E402

from flashbench.engine.timing import L2Flusher, time_cuda  # noqa: E402

DEFAULT_VARIANTS = '{"tl": null, "ws": {"kernel": "gluon-ws"}}'


def measure(
    d: int,
    n: int,
    causal: bool,
    variants: dict[str, Any],
    rounds: int,
    passes: bool = False,
    energy: bool = False,
) -> str:
    """One shape: every variant checked against the tl backward, then timed in rotating rounds."""
    h, b = 2048 // d, max(1, 16384 // n)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = d**-0.5
    o, lse, _ = attention_forward(q, k, v, causal, scale)
    os.environ["FLASHBENCH_GLUON_BWD"] = "0"  # the reference: the tl passes, autotuned
    ref = attention_backward(q, k, v, o, lse, do, None, causal, scale)
    tl_cfg = last_bwd_config()
    del os.environ["FLASHBENCH_GLUON_BWD"]
    calls, notes = {}, {}
    for name, cfg in variants.items():
        dkdv = tl_cfg["dkdv"] if cfg is None else cfg
        got = attention_backward(q, k, v, o, lse, do, None, causal, scale, dkdv, tl_cfg["dq"])
        err = max(
            ((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
            for g, r in zip(got, ref, strict=True)
        )
        notes[name] = f"err {err:.1e} {last_bwd_config()['dkdv'].get('kernel', 'tl')}"
        calls[name] = functools.partial(
            attention_backward, q, k, v, o, lse, do, None, causal, scale, dkdv, tl_cfg["dq"]
        )
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
    calls["cudnn"] = functools.partial(torch.autograd.grad, out, (qr, kr, vr), do, retain_graph=True)
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    flush = L2Flusher("cuda")
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(statistics.median(time_cuda(calls[name], flush=flush)))
    flops = 4 * b * h * n * n * d * 2.5 * (0.5 if causal else 1.0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    cells = [
        f"{name} {med[name] * 1e3:.0f} us {flops / med[name] / 1e9:.0f} TF/s x{med['cudnn'] / med[name]:.2f} cudnn "
        f"{notes.get(name, '')}"
        for name in names
    ]
    line = f"d={d} N={n} causal={int(causal)} | " + " | ".join(cells)
    if energy:
        line += "\n    energy: " + ", ".join(f"{name} {joules_per_call(calls[name])}" for name in names)
    if passes:
        pair_flops = 2 * b * h * n * n * d * (0.5 if causal else 1.0)  # one block matmul over every pair
        for name in names:
            line += f"\n    {name}: " + ", ".join(
                f"{kernel} {us:.0f} us"
                + (
                    f" ({mm * pair_flops / us / 1e6:.0f} TF/s)"
                    if (mm := _MATMULS.get(kernel.split("_ws")[0]))
                    else ""
                )
                for kernel, us in kernel_times(calls[name]).items()
            )
    return line


# block matmuls per (query, key) pair of each backward kernel
_MATMULS = {"_bwd_dkdv": 4, "_bwd_dq": 3}


def kernel_times(call: Any) -> dict[str, float]:
    """Mean GPU time (us) per call of each CUDA kernel `call` launches, over 10 calls under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / 10 for e in prof.key_averages() if e.device_time_total > 0}


def joules_per_call(call: Any, seconds: float = 2.0) -> str:
    """GPU energy per call (NVML's total energy counter, mJ resolution) over back-to-back calls for ~`seconds`,
    with the mean power and SM clock: under the power cap, the kernel that spends fewer joules per call runs at
    higher clocks."""
    import pynvml

    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < seconds / 4:  # warm to the power cap, and size the batch
        call()
        calls += 1
    torch.cuda.synchronize()
    batch = max(1, calls * 4)
    clocks = []
    e0, t0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(dev), time.perf_counter()
    for i in range(batch):
        call()
        if i % max(1, batch // 8) == 0:
            clocks.append(pynvml.nvmlDeviceGetClockInfo(dev, pynvml.NVML_CLOCK_SM))
    torch.cuda.synchronize()
    e1, t1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(dev), time.perf_counter()
    joules = (e1 - e0) / 1e3
    return f"{joules / batch * 1e3:.1f} mJ/call ({joules / (t1 - t0):.0f} W, SM {statistics.median(clocks):.0f} MHz)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--seqs", default="2048,8192")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument(
        "--passes", action="store_true", help="also each variant's and cuDNN's kernel times (torch.profiler)"
    )
    ap.add_argument(
        "--energy",
        action="store_true",
        help="also joules per call of each variant and cuDNN (NVML, ~2 s each)",
    )
    a = ap.parse_args()
    variants = json.loads(a.variants)
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for d in (int(x) for x in a.dims.split(",")):
        for n in (int(x) for x in a.seqs.split(",")):
            for causal in (bool(int(x)) for x in a.causal.split(",")):
                print(measure(d, n, causal, variants, a.rounds, a.passes, a.energy), flush=True)


if __name__ == "__main__":
    main()

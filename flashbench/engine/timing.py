"""Timing: CUDA events with the L2 flushed before every sample, warm-up by time, raw samples kept.

The method is triton.testing.do_bench's (so the two agree, see benchmarks/fidelity.py), with the raw samples
kept and a minimum sample count:
    1. the first call is timed alone by wall clock (synchronized): JIT compile + autotune + one run -> compile_ms
    2. five calls estimate the per-call time (flush included, so it errs long)
    3. warm-up: enough calls to fill `warmup_ms`
    4. samples: max(min_samples, rep_ms / estimate) calls (capped at max_samples), each one
       setup() [untimed: e.g. the forward of a bwd-only case], flush L2, event, call(), event
    5. median / p20 / p80 from the raw samples
On the CPU (``--device cpu``) the same loop runs with time.perf_counter and no cache flush: such times are
labelled device="cpu" and say nothing about a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Call = Callable[[], Any]


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty list."""
    data = sorted(values)
    pos = q * (len(data) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> dict[str, float]:
    return {
        "median_ms": quantile(samples_ms, 0.5),
        "p20_ms": quantile(samples_ms, 0.2),
        "p80_ms": quantile(samples_ms, 0.8),
    }


def sample_count(estimate_ms: float, rep_ms: float, min_samples: int, max_samples: int) -> int:
    n = int(rep_ms / max(estimate_ms, 1e-6))
    return max(min_samples, min(max_samples, n))


class L2Flusher:
    """Writes a buffer of at least twice the L2 size (and >= 64 MiB), evicting the inputs from L2.

    do_bench writes 256 MB; on an H100 (50 MB L2) ours is 100 MB: either evicts everything.
    """

    def __init__(self, device: Any) -> None:
        import torch

        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
        self.bytes = max(2 * l2, 64 * 2**20)
        self.buffer = torch.empty(self.bytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def first_call_ms(call: Call, device: str) -> float:
    """Wall time of one synchronized call: for a first call, compile + autotune + one execution."""
    sync = _sync(device)
    sync()
    start = time.perf_counter()
    call()
    sync()
    return (time.perf_counter() - start) * 1e3


def _sync(device: str) -> Call:
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def capture_cuda_graph(call: Call, warmup: int = 3) -> Any:
    """Capture `call` into a CUDA graph (after warm-up on a side stream, as torch.cuda.graph requires)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    torch.cuda.synchronize()
    return graph


def time_cuda(
    call: Call,
    *,
    flush: Call,
    setup: Call | None = None,
    warmup_ms: float = 50.0,
    rep_ms: float = 100.0,
    min_samples: int = 10,
    max_samples: int = 1000,
) -> list[float]:
    """Samples (ms) of `call` between CUDA events, L2 flushed (and setup() run) before each, untimed."""
    import torch

    def one() -> None:
        if setup is not None:
            setup()
        flush()
        call()

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        one()
    end.record()
    torch.cuda.synchronize()
    estimate = start.elapsed_time(end) / 5
    for _ in range(max(1, int(warmup_ms / max(estimate, 1e-6)))):
        one()
    n = sample_count(estimate, rep_ms, min_samples, max_samples)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if setup is not None:
            setup()
        flush()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def time_cpu(
    call: Call,
    *,
    setup: Call | None = None,
    warmup_ms: float = 50.0,
    rep_ms: float = 100.0,
    min_samples: int = 10,
    max_samples: int = 1000,
) -> list[float]:
    """Samples (ms) of `call` by time.perf_counter (CPU device: no caches flushed)."""

    def timed() -> float:
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        call()
        return (time.perf_counter() - t0) * 1e3

    estimate = timed()
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        estimate = min(estimate, timed())
    n = sample_count(estimate, rep_ms, min_samples, max_samples)
    return [timed() for _ in range(n)]

"""Timing: CUDA events with the L2 flushed before every sample, in one stated clock regime, raw samples kept.

The regime (measure_cuda; every GPU preset shares it, its knobs are SweepSpec's measurement fields):
    1. the first call is timed alone by wall clock (synchronized): JIT compile + autotune + one run -> compile_ms
       (measure.py, before the correctness check and the untimed memory run)
    2. three samples estimate the per-sample GPU time (flush included, so it errs long)
    3. steady warm-up: samples run back to back (the host at most one ~20 ms batch ahead) while an NVML thread
       reads the SM clock every 10 ms; it ends once it has run warmup_ms and the median clock of the last
       settle_window_ms is within settle_pct of the window before's (settled), or at warmup_max_ms (not
       settled). Without NVML it runs warmup_ms. Defaults: 0.5 s minimum, 250 ms windows, 1%, 3 s bound.
       On an H100 at its software power cap the SM clock falls from ~1965 to ~1710 MHz within the first few
       hundred ms of sustained attention work: a case timed before that (a short warm-up) reads ~11% faster
       than the same case timed after a long one (692 vs 624 TFLOP/s, bundled d=128 N=8192 fwd).
    4. samples, in chunks of max(min_samples, rep_ms / estimate), each sample
       [hold] setup() [untimed: e.g. the forward of a bwd-only case], flush L2, event, call(), event [release]
       until the SM clock read during them stayed within settle_pct of its median (clock_steady), or
       rep_max_ms of samples, or max_samples. Under a power cap the controller steps the clock by 5-15%
       every few tens of ms (H100, d=128 N=8192 forward: 1320-1680 MHz within 200 ms): 200 ms of samples
       caught one phase of that, and the same case's median moved by 10% from run to run; sampled up to
       2 s, it moved by 1.2% over four runs of two presets (`python benchmarks/preset_agreement.py`, H100).
       With a LaunchBlocker (engine/blocking.py, NVBench's blocking kernel), a spin kernel holds the stream
       while the host enqueues the sample and is released after, so the GPU runs each sample without host
       launch gaps inside the events. The NVML thread keeps reading through the samples: the row stores the
       SM clock (median, min, max, raw readings), memory clock, power and clock-event reasons of that window.
    5. median / p20 / p80 from the raw samples
    6. what a caller's loop pays (measure_host; NVBench's "CPU time" and "batch GPU" columns are the model),
       `host_loops` rounds of: a held batch of HELD_CALLS calls enqueued behind the spin kernel (host_ms: the
       median time the host took to enqueue one call, the GPU never waited on; loop_gpu_ms: their GPU time per
       call, back to back with no gap and no L2 flush), then a loop of back-to-back calls about `host_loop_ms`
       long with no spin kernel and one synchronize (loop_ms: the median per-call time of a loop, from before
       its first enqueue to after its synchronize: what an eager training loop pays per step). A call whose
       loop_ms exceeds loop_gpu_ms by more than `host_bound_pct` is host-bound: the GPU idles between its
       launches. The loop's reference is the held batch's GPU time, not the samples': the samples interleave an
       L2 flush and run at another duty cycle, so the power cap leaves them another clock (cuDNN's d = 128
       forward at N = 1024 on an H100 looped 12% over its samples' median with no host gap). NVML's energy
       counter over a back-to-back run gives the watts, and joules per call = watts x loop_ms.
On the CPU (``--device cpu``) the same loop runs with time.perf_counter, a warm-up by time and no cache flush:
such times are labelled device="cpu" and say nothing about a GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flashbench.spec.config import SweepSpec

Call = Callable[[], Any]
# Warm-up: the host enqueues about this much GPU work, then waits for the batch before it (clock check).
BATCH_MS = 20.0


@dataclass(frozen=True)
class Regime:
    """How a GPU case is measured (the defaults are SweepSpec's: one regime for every preset)."""

    warmup_ms: float = SweepSpec.warmup_ms  # the steady warm-up's minimum
    warmup_max_ms: float = SweepSpec.warmup_max_ms  # its bound
    settle_window_ms: float = SweepSpec.settle_window_ms
    settle_pct: float = SweepSpec.settle_pct
    rep_ms: float = SweepSpec.rep_ms
    rep_max_ms: float = SweepSpec.rep_max_ms
    min_samples: int = SweepSpec.min_samples
    max_samples: int = SweepSpec.max_samples
    block_launches: bool = SweepSpec.block_launches
    l2_flush: str = SweepSpec.l2_flush
    host_loops: int = SweepSpec.host_loops  # 0: no host / loop timing
    host_loop_ms: float = SweepSpec.host_loop_ms
    host_bound_pct: float = SweepSpec.host_bound_pct


@dataclass
class Timing:
    """What measure_cuda took: the samples and the regime they were taken in."""

    samples_ms: list[float]
    warmup_s: float | None = None  # how long the steady warm-up ran
    warmup_settled: bool | None = None  # the SM clock settled (False: the bound stopped it; None: no clock)
    window: list[dict[str, Any]] = field(default_factory=list)  # NVML readings taken during the samples
    host_time_included: bool = True  # False: each sample ran behind a released spin kernel
    note: str = ""  # why samples may include host time although blocking was asked for


@dataclass
class HostTiming:
    """What measure_host took: host enqueue time per call, the per-call time of each back-to-back loop, the GPU
    time per call of held batches (the loop's own conditions without its host gaps), joules per call."""

    host_ms: float
    loop_samples_ms: list[float]
    loop_gpu_ms: float | None = None
    energy_j: float | None = None
    calls_per_loop: int = 0

    @property
    def loop_ms(self) -> float:
        return quantile(self.loop_samples_ms, 0.5)

    def host_bound(self, gpu_ms: float, margin_pct: float) -> bool:
        """The loop pays more than the GPU works by over margin_pct: launch gaps leave the GPU idle. The GPU time
        is the held batches' where they were timed (same clock and duty cycle as the loop, no L2 flush), else
        `gpu_ms` (the samples')."""
        reference = self.loop_gpu_ms if self.loop_gpu_ms is not None else gpu_ms
        return self.loop_ms > reference * (1.0 + margin_pct / 100.0)


# Calls enqueued behind one held spin kernel (a held batch): few enough that their launches cannot fill the launch
# queue (about a thousand launches; a naive fwd+bwd call makes ~30), so no enqueue waits for the GPU while the
# spin holds it.
HELD_CALLS = 16
# The energy phase: at least two updates of NVML's energy counter, which moves about every 100 ms on an H100
# (a probe there: 10 updates in 1 s of matmuls, 99.5 ms apart); power = its rise between the first and the last
# update seen, each seen within 1 ms.
ENERGY_MS = 300.0

# held(call, count) -> (GPU ms per call of `count` calls enqueued behind a held spin kernel and run back to
# back, or None where the hold failed; each call's enqueue time in seconds)
Held = Callable[[Call, int], tuple[float | None, list[float]]]
# power(call, ms) -> watts drawn while `call` runs back to back for about `ms`, or None
Power = Callable[[Call, float], float | None]


def measure_host(
    call: Call,
    *,
    sync: Call,
    gpu_ms: float,
    held: Held | None = None,
    power: Power | None = None,
    loops: int = SweepSpec.host_loops,
    loop_ms: float = SweepSpec.host_loop_ms,
    clock: Callable[[], float] = time.perf_counter,
) -> HostTiming:
    """What a caller's loop pays for `call` (module docstring, step 6), in ms.

    Each of `loops` rounds runs a held batch (`held`: the host's enqueue time per call with the GPU never
    waited on, and the GPU time per call with no host gap) and then an unheld loop of max(3, loop_ms /
    max(gpu_ms, a probe's host time)) calls (at most 1000) with one synchronize, timed by `clock`: long
    enough that the synchronize and the first launch's latency are a small share. Without `held` the host time
    is that of each loop's first calls. `power` (NVML) gives the watts of a back-to-back run after the loops;
    energy per call = watts x loop time.
    """
    sync()
    t0 = clock()
    for _ in range(3):
        call()
    probe = (clock() - t0) / 3 * 1e3
    sync()
    calls = max(3, min(1000, int(loop_ms / max(gpu_ms, probe, 1e-3))))
    batch = min(HELD_CALLS, calls)
    enqueue: list[float] = []
    batch_ms: list[float] = []
    per_call: list[float] = []
    for _ in range(loops):
        if held is not None:
            gpu, times = held(call, batch)
            if gpu is not None:
                batch_ms.append(gpu)
                enqueue += times
        sync()
        start = clock()
        for i in range(calls):
            if held is None and i < batch:  # a loop's first calls: the launch queue is still short
                t = clock()
                call()
                enqueue.append(clock() - t)
            else:
                call()
        sync()
        per_call.append((clock() - start) / calls * 1e3)
    loop = quantile(per_call, 0.5)
    watts = power(call, ENERGY_MS) if power is not None else None
    return HostTiming(
        host_ms=quantile(enqueue, 0.5) * 1e3 if enqueue else probe,
        loop_samples_ms=per_call,
        loop_gpu_ms=quantile(batch_ms, 0.5) if batch_ms else None,
        energy_j=watts * loop / 1e3 if watts is not None else None,
        calls_per_loop=calls,
    )


def held_batch(blocker: Any, clock: Callable[[], float] = time.perf_counter) -> Held:
    """A `Held` on the current CUDA stream: hold it with the spin kernel (engine/blocking.py), enqueue the calls
    (each timed), record events around them, release, wait. None as the GPU time when a spin ran out."""
    import torch

    def held(call: Call, count: int) -> tuple[float | None, list[float]]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times: list[float] = []
        blocker.reset()
        blocker.hold()
        try:
            start.record()
            for _ in range(count):
                t = clock()
                call()
                times.append(clock() - t)
            end.record()
        finally:
            blocker.release()
        end.synchronize()
        if blocker.missed():
            return None, []
        return start.elapsed_time(end) / count, times

    return held


def counter_power(
    energy_mj: Callable[[], int | None], sync: Call, clock: Callable[[], float] = time.perf_counter
) -> Power:
    """A `Power` from an energy counter (mJ) that updates in steps: its rise between the first and the last
    update seen while the call runs back to back, over the time between them; the counter is read at most once a
    millisecond, so the reads add little host time to the run."""

    def power(call: Call, ms: float) -> float | None:
        last = energy_mj()
        if last is None:
            return None
        ticks: list[tuple[float, int]] = []
        now = clock()
        end, poll = now + ms / 1e3, now
        while now < end:
            call()
            now = clock()
            if now - poll >= 1e-3:
                poll = now
                value = energy_mj()
                if value is not None and value != last:
                    ticks.append((now, value))
                    last = value
        sync()
        if len(ticks) < 2:
            return None
        (t0, e0), (t1, e1) = ticks[0], ticks[-1]
        return (e1 - e0) / 1e3 / (t1 - t0)

    return power


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


def settled(readings: Sequence[tuple[float, float]], window_s: float, tol_pct: float) -> bool:
    """True when the median SM clock of the last `window_s` of `readings` ((seconds, MHz), in time order) is
    within `tol_pct` percent of the median of the window before it (each window holding two readings or more).

    A drift rule, not a range rule: a clock that dithers by a step or two under a power cap settles, one that
    still falls by more than tol_pct per window does not.
    """
    if len(readings) < 4:
        return False
    end = readings[-1][0]
    if end - readings[0][0] < 2 * window_s:
        return False
    last = [mhz for t, mhz in readings if t > end - window_s]
    before = [mhz for t, mhz in readings if end - 2 * window_s < t <= end - window_s]
    if len(last) < 2 or len(before) < 2:
        return False
    a, b = statistics.median(last), statistics.median(before)
    return abs(a - b) <= tol_pct / 100.0 * b


def clock_steady(mhz: Sequence[float], tol_pct: float) -> bool:
    """True when the SM clock readings span at most tol_pct of their median (and there are any)."""
    if not mhz:
        return False
    return max(mhz) - min(mhz) <= tol_pct / 100.0 * statistics.median(mhz)


def steady_warmup(
    step: Call,
    clocks: Callable[[], Sequence[tuple[float, float]]] | None,
    regime: Regime,
    now: Callable[[], float] = time.monotonic,
) -> tuple[float, bool | None]:
    """Call step() (one batch of warm-up work) until the clock settles, or the bound: (seconds, settled).

    settled is True when the rule held after at least warmup_ms, False when warmup_max_ms ended it, None when
    `clocks` is None or gave no reading by warmup_ms (no NVML): then the warm-up is warmup_ms by time.
    """
    t0 = now()
    while True:
        step()
        elapsed = now() - t0
        if elapsed * 1e3 < regime.warmup_ms:
            continue
        readings = clocks() if clocks is not None else None
        if not readings:
            return elapsed, None
        if settled(readings, regime.settle_window_ms / 1e3, regime.settle_pct):
            return elapsed, True
        if elapsed * 1e3 >= regime.warmup_max_ms:
            return elapsed, False


class L2Flusher:
    """Evicts the inputs from L2 before a sample: a pass over a buffer of at least twice the L2 (>= 64 MiB).

    mode "read" (the regime's default) sums the buffer; "write" zeroes it (do_bench's way: it writes 256 MB).
    A write leaves the whole L2 dirty, and the timed call that follows pays for writing those lines back to HBM
    as it evicts them; a read leaves clean lines, dropped for free. On an H100 (50 MB L2) the write flush added
    9-10 us to every memory-bound call (decode over 134 MB of KV: 61.8 vs 52.8 us; torch.sum over 134 MB: 76.8
    vs 67.9 us, both at 1980 MHz); compute-bound forwards of 0.2-1.8 ms moved only with the SM clock the power
    cap left them; reading 4x the L2 instead of 2x changed nothing (`python3 benchmarks/l2_flush.py`).
    """

    MODES = ("write", "read")

    def __init__(self, device: Any, mode: str = "write", scale: int = 2) -> None:
        import torch

        if mode not in self.MODES:
            raise ValueError(f"L2 flush mode must be one of {', '.join(self.MODES)}, got {mode!r}")
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
        self.mode = mode
        self.bytes = max(scale * l2, 64 * 2**20)
        self.buffer = torch.zeros(self.bytes // 4, dtype=torch.int32, device=device)
        self.sink = torch.zeros((), dtype=torch.int64, device=device)
        self._sum, self._int64 = torch.sum, torch.int64  # bound once: the flush runs before every sample

    def __call__(self) -> None:
        if self.mode == "write":
            self.buffer.zero_()
        else:
            self._sum(self.buffer, dim=0, dtype=self._int64, out=self.sink)


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


def measure_cuda(
    call: Call,
    *,
    flush: Call,
    setup: Call | None = None,
    regime: Regime = Regime(),
    sampler: Any = None,
    blocker: Any = None,
) -> Timing:
    """Samples (ms) of `call` in the steady regime (module docstring, steps 2-5).

    `sampler`: an nvml.ClockSampler (None: no clock readings; the warm-up is then warmup_ms by time).
    `blocker`: an engine.blocking.LaunchBlocker (None: samples may include host launch gaps).
    """
    import torch

    blocker = blocker if regime.block_launches else None
    note = ""

    def one(start: Any = None, end: Any = None) -> None:
        """One sample's launches, behind a held spin when blocking; events around call() when given."""
        held = blocker  # read when called: blocking may be switched off after the estimate
        if held is not None:
            held.hold()
        try:
            if setup is not None:
                setup()
            flush()
            if start is not None:
                start.record()
            call()
            if end is not None:
                end.record()
        finally:
            if held is not None:
                held.release()  # also after an exception: a held stream would stall the next synchronize

    one()  # first launches in this flow (the spin kernel's, lazily loaded modules) stall the host once
    torch.cuda.synchronize()
    if blocker is not None:
        blocker.reset()
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    for _ in range(3):
        one()
    last.record()
    last.synchronize()
    if blocker is not None and blocker.missed():
        # the call waited for the GPU while being enqueued (a synchronize, a host copy): the spin ran out
        # instead of being released, so holding the stream cannot work for this call
        note = "launch blocking off: the call waits for the GPU while enqueued; samples include host time"
        blocker = None
    estimate = first.elapsed_time(last) / 3
    per_batch = max(1, int(BATCH_MS / max(estimate, 1e-3)))
    pending: list[Any] = []

    def step() -> None:
        for _ in range(per_batch):
            one()
        event = torch.cuda.Event()
        event.record()
        pending.append(event)
        if len(pending) > 1:
            pending.pop(0).synchronize()

    n = sample_count(estimate, regime.rep_ms, regime.min_samples, regime.max_samples)
    events: list[tuple[Any, Any]] = []
    if sampler is not None:
        sampler.start()
    try:
        warm_s, warm_settled = steady_warmup(step, sampler.sm_clocks if sampler else None, regime)
        if blocker is not None:
            blocker.reset()
        if sampler is not None:
            sampler.mark()
        began = time.monotonic()
        while True:
            chunk = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)
            ]
            for start, end in chunk:
                one(start, end)
            events += chunk
            torch.cuda.synchronize()
            if sampler is None or len(events) >= regime.max_samples:
                break
            if (time.monotonic() - began) * 1e3 >= regime.rep_max_ms:
                break
            if clock_steady(
                [r["sm_clock_mhz"] for r in sampler.window() if r.get("sm_clock_mhz")], regime.settle_pct
            ):
                break
            n = min(n, regime.max_samples - len(events))
    finally:
        window = sampler.stop() if sampler is not None else []
    missed = blocker.missed() if blocker is not None else 0
    if missed:
        note = f"launch blocking: {missed} of {len(events)} spins ran out before release; host time included"
    return Timing(
        samples_ms=[start.elapsed_time(end) for start, end in events],
        warmup_s=warm_s,
        warmup_settled=warm_settled,
        window=window,
        host_time_included=blocker is None or missed > 0,
        note=note,
    )

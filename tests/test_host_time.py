"""What a caller's loop pays (engine/timing.measure_host): host enqueue time, back-to-back loop time, host-bound
rows and joules per call, against a simulated device whose queue runs behind the host."""

from __future__ import annotations

import pytest

from flashbench.engine import timing


class Device:
    """A host clock and a GPU queue: each call costs the host `host_ms` to enqueue, then `gpu_ms` of GPU work
    that starts when both the call is enqueued and the previous work is done; sync waits for the queue."""

    def __init__(self, host_ms: float, gpu_ms: float, watts: float = 500.0) -> None:
        self.host_s, self.gpu_s, self.watts = host_ms / 1e3, gpu_ms / 1e3, watts
        self.now = 0.0
        self.gpu_free = 0.0
        self.busy_s = 0.0

    def clock(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += self.host_s
        self.gpu_free = max(self.gpu_free, self.now) + self.gpu_s
        self.busy_s += self.gpu_s

    def sync(self) -> None:
        self.now = max(self.now, self.gpu_free)

    def energy_mj(self) -> int:
        return int(self.busy_s * self.watts * 1e3)


def measure(dev: Device, gpu_ms: float) -> timing.HostTiming:
    return timing.measure_host(
        dev.call,
        sync=dev.sync,
        gpu_ms=gpu_ms,
        loops=5,
        loop_ms=50.0,
        energy_mj=dev.energy_mj,
        clock=dev.clock,
    )


def test_a_host_bound_call_pays_its_host_time_per_call_in_the_loop() -> None:
    dev = Device(host_ms=1.3, gpu_ms=0.7)  # the bundled fwd+bwd at N = 1024 before its host path was cut
    took = measure(dev, gpu_ms=0.7)
    assert took.host_ms == pytest.approx(1.3)
    # the GPU idles between launches: the loop's per-call time is the host's, plus the last call's GPU tail
    assert took.loop_ms == pytest.approx(1.3 + 0.7 / took.calls_per_loop)
    assert took.host_bound(0.7, 10.0)
    assert len(took.loop_samples_ms) == 5


def test_a_gpu_bound_call_pays_its_gpu_time_and_is_not_host_bound() -> None:
    dev = Device(host_ms=0.05, gpu_ms=0.9)
    took = measure(dev, gpu_ms=0.9)
    assert took.host_ms == pytest.approx(0.05)  # enqueue time, not the GPU's: the host never waited
    assert took.loop_ms == pytest.approx(0.9 + 0.05 / took.calls_per_loop)
    assert not took.host_bound(0.9, 10.0)
    # loops sized to the budget: 50 ms of 0.9 ms calls
    assert took.calls_per_loop == int(50.0 / 0.9)


def test_the_host_bound_margin_is_a_margin_over_the_gpu_time() -> None:
    dev = Device(host_ms=0.75, gpu_ms=0.7)  # the loop pays ~7% over the GPU time
    took = measure(dev, gpu_ms=0.7)
    assert not took.host_bound(0.7, 10.0)
    assert took.host_bound(0.7, 5.0)


def test_energy_is_joules_per_call_over_the_loops() -> None:
    dev = Device(host_ms=0.05, gpu_ms=2.0, watts=600.0)
    took = measure(dev, gpu_ms=2.0)
    assert took.energy_j == pytest.approx(600.0 * 2e-3, rel=1e-3)  # 600 W for 2 ms of work per call


def test_no_energy_counter_gives_no_joules() -> None:
    dev = Device(host_ms=0.05, gpu_ms=2.0)
    took = timing.measure_host(dev.call, sync=dev.sync, gpu_ms=2.0, loops=2, loop_ms=10.0, clock=dev.clock)
    assert took.energy_j is None

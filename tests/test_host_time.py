"""What a caller's loop pays (engine/timing.measure_host): host enqueue time, back-to-back loop time, the GPU time
of held batches, host-bound rows and joules per call, against a simulated device whose queue runs behind the
host, and an energy counter that moves in steps."""

from __future__ import annotations

import pytest

from flashbench.engine import timing


class Device:
    """A host clock and a GPU queue: each call costs the host `host_ms` to enqueue, then `gpu_ms` of GPU work that
    starts when both the call is enqueued and the previous work is done; sync waits for the queue. A held batch
    enqueues its calls while the GPU waits, then runs them back to back. The board draws `watts` while busy."""

    def __init__(self, host_ms: float, gpu_ms: float, watts: float = 500.0) -> None:
        self.host_s, self.gpu_s, self.watts = host_ms / 1e3, gpu_ms / 1e3, watts
        self.now = 0.0
        self.gpu_free = 0.0

    def clock(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += self.host_s
        self.gpu_free = max(self.gpu_free, self.now) + self.gpu_s

    def sync(self) -> None:
        self.now = max(self.now, self.gpu_free)

    def held(self, call: timing.Call, count: int) -> tuple[float | None, list[float]]:
        times = []
        for _ in range(count):
            self.now += self.host_s
            times.append(self.host_s)
        self.gpu_free = max(self.gpu_free, self.now) + count * self.gpu_s  # released: back to back
        self.sync()
        return self.gpu_s * 1e3, times

    def power(self, call: timing.Call, ms: float) -> float:
        return self.watts


def measure(dev: Device, gpu_ms: float, held: bool = True) -> timing.HostTiming:
    return timing.measure_host(
        dev.call,
        sync=dev.sync,
        gpu_ms=gpu_ms,
        held=dev.held if held else None,
        power=dev.power,
        loops=5,
        loop_ms=50.0,
        clock=dev.clock,
    )


def test_a_host_bound_call_pays_its_host_time_per_call_in_the_loop() -> None:
    dev = Device(host_ms=1.3, gpu_ms=0.7)  # the bundled fwd+bwd at N = 1024 before its host path was cut
    took = measure(dev, gpu_ms=0.7)
    assert took.host_ms == pytest.approx(1.3)
    assert took.loop_gpu_ms == pytest.approx(0.7)
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
    assert took.calls_per_loop == int(50.0 / 0.9)  # loops sized to their budget


def test_the_loop_is_judged_against_the_held_batches_not_the_samples() -> None:
    # the samples ran at a higher clock than the loop (their L2 flush lowers the duty cycle): 0.23 vs 0.26 ms
    dev = Device(host_ms=0.03, gpu_ms=0.26)
    took = measure(dev, gpu_ms=0.23)
    assert took.loop_ms > 0.23 * 1.10  # against the samples it would look host-bound
    assert not took.host_bound(0.23, 10.0)
    # without held batches the samples are the only reference
    unheld = measure(Device(host_ms=0.03, gpu_ms=0.26), gpu_ms=0.23, held=False)
    assert unheld.loop_gpu_ms is None and unheld.host_bound(0.23, 10.0)
    assert unheld.host_ms == pytest.approx(0.03)  # each loop's first calls


def test_the_host_bound_margin_is_a_margin_over_the_gpu_time() -> None:
    dev = Device(host_ms=0.75, gpu_ms=0.7)  # the loop pays ~7% over the GPU time
    took = measure(dev, gpu_ms=0.7)
    assert not took.host_bound(0.7, 10.0)
    assert took.host_bound(0.7, 5.0)


def test_energy_per_call_is_the_power_times_the_loop_time() -> None:
    dev = Device(host_ms=0.05, gpu_ms=2.0, watts=600.0)
    took = measure(dev, gpu_ms=2.0)
    assert took.energy_j == pytest.approx(600.0 * took.loop_ms / 1e3)


def test_counter_power_reads_the_rise_between_the_counter_updates() -> None:
    """A counter that moves every 100 ms by what a 450 W board drew: the watts come back, whatever part of an
    update interval the run starts in."""
    now = [0.037]  # the run starts 37 ms into an update interval

    def clock() -> float:
        return now[0]

    def call() -> None:
        now[0] += 0.0004  # each call takes 0.4 ms of host time

    def energy_mj() -> int:
        return int(now[0] // 0.1) * 45_000  # 45 J per 100 ms tick

    watts = timing.counter_power(energy_mj, lambda: None, clock=clock)(call, 300.0)
    assert watts == pytest.approx(450.0, rel=0.01)


def test_counter_power_without_two_updates_gives_none() -> None:
    now = [0.0]

    def call() -> None:
        now[0] += 0.001

    still = timing.counter_power(lambda: 7, lambda: None, clock=lambda: now[0])
    assert still(call, 300.0) is None
    assert timing.counter_power(lambda: None, lambda: None, clock=lambda: now[0])(call, 300.0) is None

"""The measurement regime: the steady warm-up's settle rule (on fake clocks), the NVML window summary and
sampler, the launch-blocking spin kernel, and one regime shared by every GPU preset."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from flashbench.engine import blocking, runner, timing
from flashbench.engine.measure import Options
from flashbench.errors import FlashbenchError
from flashbench.gpu import nvml
from flashbench.spec.config import SweepSpec, load_spec

PRESETS = Path(__file__).resolve().parent.parent / "configs" / "sweeps"
REGIME = timing.Regime(warmup_ms=500, warmup_max_ms=3000, settle_window_ms=250, settle_pct=1.0)


class FakeGpu:
    """A GPU whose SM clock follows `clock(t)`; each warm-up step takes 20 ms and reads the clock once."""

    def __init__(self, clock):
        self.clock, self.t, self.readings = clock, 0.0, []

    def step(self) -> None:
        self.t += 0.02
        self.readings.append((self.t, self.clock(self.t)))

    def warm(self, regime=REGIME, clocks=True):
        return timing.steady_warmup(
            self.step, (lambda: self.readings) if clocks else None, regime, now=lambda: self.t
        )


def power_capped(t: float) -> float:
    """1965 MHz, then the power cap pulls it to 1710 between 0.3 and 0.6 s, where it dithers by one step."""
    if t < 0.3:
        return 1965.0
    if t < 0.6:
        return 1965.0 - (t - 0.3) / 0.3 * 255.0
    return 1710.0 + (15.0 if int(t / 0.02) % 2 else 0.0)


def test_warmup_waits_until_the_power_capped_clock_has_stopped_falling():
    gpu = FakeGpu(power_capped)
    seconds, settled = gpu.warm()
    assert settled is True
    assert 0.85 <= seconds <= 1.15  # after the fall (0.6 s) plus a window at the new clock, not before
    assert gpu.clock(seconds) <= 1725.0


def test_a_clock_dithering_by_a_step_settles_at_the_minimum_warmup():
    seconds, settled = FakeGpu(lambda t: 1710.0 + (15.0 if int(t / 0.02) % 2 else 0.0)).warm()
    assert settled is True and seconds == pytest.approx(0.5, abs=0.021)


def test_a_clock_that_keeps_falling_is_cut_off_at_the_bound_and_says_so():
    seconds, settled = FakeGpu(lambda t: 1980.0 - 100.0 * t).warm()  # 25 MHz (1.3-1.5%) per 250 ms window
    assert settled is False and seconds == pytest.approx(3.0, abs=0.021)


def test_without_a_clock_the_warmup_is_its_minimum_by_time():
    seconds, settled = FakeGpu(power_capped).warm(clocks=False)
    assert settled is None and seconds == pytest.approx(0.5, abs=0.021)


def test_settle_rule_needs_two_full_windows():
    flat = [(0.01 * i, 1700.0) for i in range(40)]  # 0.39 s of readings: less than 2 x 250 ms
    assert not timing.settled(flat, 0.25, 1.0)
    assert timing.settled([*flat, *[(0.4 + 0.01 * i, 1700.0) for i in range(12)]], 0.25, 1.0)
    step = [(0.01 * i, 1965.0 if i < 30 else 1710.0) for i in range(60)]
    assert not timing.settled(step, 0.25, 1.0)


def test_samples_continue_while_the_clock_moves():
    assert timing.clock_steady([1695, 1710, 1710, 1695], 1.0)  # one 15 MHz step: steady
    assert not timing.clock_steady([1605, 1605, 1440, 1425], 1.0)  # a power-cap swing: sample on
    assert not timing.clock_steady([], 1.0)


def test_window_summary_gives_the_clock_the_samples_ran_at():
    readings = [
        {
            "sm_clock_mhz": 1710,
            "mem_clock_mhz": 2619,
            "power_w": 690.0,
            "temp_c": 60,
            "clock_event_reasons": 0x4,
        },
        {
            "sm_clock_mhz": 1695,
            "mem_clock_mhz": 2619,
            "power_w": 700.0,
            "temp_c": 61,
            "clock_event_reasons": 0x5,
        },
        {
            "sm_clock_mhz": 1740,
            "mem_clock_mhz": 2619,
            "power_w": 680.0,
            "temp_c": 61,
            "clock_event_reasons": 0x1,
        },
    ]
    summary = nvml.window_summary(readings)
    assert summary["sm_clock_mhz"] == 1710 and summary["sm_clock_min_mhz"] == 1695
    assert summary["sm_clock_max_mhz"] == 1740 and summary["power_w"] == 690.0
    assert summary["clock_readings_mhz"] == [1710, 1695, 1740]
    assert summary["throttle_reasons"] == ["sw_power_cap"]  # idle is not throttling
    assert summary["throttled_share"] == pytest.approx(2 / 3, abs=1e-3)
    many = nvml.window_summary([{"sm_clock_mhz": 1000 + i} for i in range(1000)])
    assert len(many["clock_readings_mhz"]) == 200 and many["clock_readings_mhz"][0] == 1000
    assert nvml.window_summary([]) == {}


def test_a_gpu_gets_a_clock_sampler_only_where_nvml_reads_it(monkeypatch):
    monkeypatch.setattr(nvml, "sample", lambda index: None)
    assert nvml.clock_sampler(3) is None
    asked = []
    monkeypatch.setattr(nvml, "sample", lambda index: asked.append(index) or {"sm_clock_mhz": 1980})
    sampler = nvml.clock_sampler(3)
    assert isinstance(sampler, nvml.ClockSampler) and asked == [3]
    sampler.start()
    assert sampler.stop()[-1]["sm_clock_mhz"] == 1980 and set(asked) == {3}


def test_clock_sampler_reads_in_a_thread_and_returns_the_timed_window():
    count = iter(range(10**6))
    sampler = nvml.ClockSampler(lambda: {"sm_clock_mhz": 1000 + next(count)}, interval_s=0.002)
    sampler.start()
    time.sleep(0.05)
    warmup = sampler.sm_clocks()
    sampler.mark()
    time.sleep(0.05)
    window = sampler.stop()
    assert len(warmup) >= 2 and [c for _, c in warmup] == sorted(c for _, c in warmup)
    assert len(window) >= 2 and window[0]["sm_clock_mhz"] > warmup[-1][1]
    assert all(r["t"] >= window[0]["t"] for r in window)


def test_spin_kernel_waits_for_the_flag_and_counts_a_spin_that_runs_out(device):
    flag = torch.full((1,), 3, dtype=torch.int32, pin_memory=device == "cuda")
    missed = torch.zeros(1, dtype=torch.int32, device=device)
    blocking.spin(flag, missed, 3, max_reads=50)  # released already: returns at once
    assert int(missed.item()) == 0
    blocking.spin(flag, missed, 4, max_reads=50)  # never released: gives up after 50 reads
    assert int(missed.item()) == 1


@pytest.mark.gpu
def test_launch_blocker_holds_the_stream_until_the_host_releases_it():
    blocker, why = blocking.make_blocker()
    assert blocker is not None, why
    blocker.reset()
    blocker.hold()
    behind = torch.cuda.Event()
    behind.record()
    time.sleep(0.02)
    assert not behind.query()  # the spin holds everything enqueued after it
    blocker.release()
    behind.synchronize()
    assert blocker.missed() == 0


@pytest.mark.gpu
def test_measure_cuda_records_the_regime_and_the_clocks_of_its_window():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    blocker, _ = blocking.make_blocker()
    sampler = nvml.clock_sampler(0)
    took = timing.measure_cuda(
        lambda: a @ a, flush=lambda: None, regime=timing.Regime(rep_ms=50), sampler=sampler, blocker=blocker
    )
    assert len(took.samples_ms) >= 20 and min(took.samples_ms) > 0
    assert took.host_time_included is (blocker is None) and took.warmup_s >= 0.5
    if sampler is not None:
        assert took.warmup_settled is not None and nvml.window_summary(took.window)["sm_clock_mhz"] > 0


def test_every_gpu_preset_measures_in_the_one_regime():
    regime = {f: getattr(SweepSpec, f) for f in timing.Regime.__dataclass_fields__}
    seen = 0
    for path in sorted(PRESETS.glob("*.toml")):
        spec = load_spec(config=path)
        if spec.device != "cuda":
            continue
        seen += 1
        assert {f: getattr(spec, f) for f in regime} == regime, path.name
        sent = Options.from_dict(runner.options(spec))  # what a worker is told
        assert {f: getattr(sent, f) for f in regime} == regime, path.name
    assert seen >= 5
    assert regime["warmup_max_ms"] <= 3000 and regime["block_launches"] is True
    assert regime["l2_flush"] == "read"


def test_the_l2_flush_is_part_of_the_regime_sent_to_workers_and_refuses_an_unknown_kind():
    spec = load_spec(preset="quick", overrides={"l2_flush": "Write"})
    assert Options.from_dict(runner.options(spec)).l2_flush == "write"
    with pytest.raises(FlashbenchError, match="unknown l2_flush 'sweep'"):
        load_spec(preset="quick", overrides={"l2_flush": "sweep"})

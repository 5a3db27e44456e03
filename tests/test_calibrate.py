"""`flashbench calibrate`: measured in the steady regime, with the clock each figure ran at and a throttle
verdict in words; a read-only bandwidth beside the copy bandwidth."""

from __future__ import annotations

import pytest

from flashbench.engine import calibrate
from flashbench.gpu import hardware


def test_throttle_verdict_names_the_reason_the_measurement_and_the_clock():
    measured = {
        "copy": {"sm_clock_mhz": 1980.0, "throttle_reasons": []},
        "bf16 matmul": {"sm_clock_mhz": 1260.0, "throttle_reasons": ["sw_power_cap"], "throttled_share": 1.0},
        "fp16 matmul": {
            "sm_clock_mhz": 1710.0,
            "throttle_reasons": ["sw_power_cap", "sw_thermal_slowdown"],
            "throttled_share": 0.25,
        },
    }
    verdict = calibrate.throttle_verdict(measured, 1980)
    assert verdict == (
        "bf16 matmul: sw power cap (in 100% of its clock readings) at 1260 MHz (64% of its 1980 MHz maximum); "
        "fp16 matmul: sw power cap, sw thermal slowdown (in 25% of its clock readings) at 1710 MHz "
        "(86% of its 1980 MHz maximum)"
    )
    assert calibrate.throttle_verdict({"copy": measured["copy"]}, 1980) == ""


@pytest.mark.gpu
def test_calibration_stores_read_bandwidth_and_the_clock_it_ran_at():
    record = calibrate.calibrate(dtypes=("bf16", "fp16"), copy_bytes=512 << 20, seconds=0.1, save=False)
    assert 0 < record["read_bw_gb_s"] and 0 < record["copy_bw_gb_s"]
    assert record["sm_clock_mhz"] > 0 and record["throttled"] == bool(record["throttle_reason"])
    for result in (record["details"]["read"], *record["details"]["matmul"].values()):
        assert result["warmup_settled"] is not None and result["sm_clock_min_mhz"] <= result["sm_clock_mhz"]
    # the empty kernel: behind the launch blocker, microseconds (an H100: a few), and stored for the floor
    empty = record["details"]["empty"]
    assert empty["note"] == "" and not empty["details"]["eager"]["host_time_included"]
    assert 0 < record["empty_kernel_us"]["cuda_graph"] < 50 and 0 < record["empty_kernel_us"]["eager"] < 50
    assert hardware.measured_ceiling(record).empty_graph_s == record["empty_kernel_us"]["cuda_graph"] * 1e-6

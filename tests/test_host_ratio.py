"""benchmarks/host_time.py's comparison of two providers' enqueue times: the median ratio with the gate's bootstrap
interval, and what the interval allows one to say."""

from __future__ import annotations

import numpy as np
from scripts_helpers import load_script


def host_time():
    return load_script("benchmarks/host_time.py")


def enqueues(center: float, seed: int, n: int = 56) -> list[float]:
    """n enqueue times (us) around `center`, 5% apart, with a few slow outliers as a busy host gives."""
    rng = np.random.default_rng(seed)
    x = center * (1.0 + 0.05 * rng.standard_normal(n))
    x[:3] *= 3.0
    return [float(v) for v in x]


def test_the_interval_says_at_most_above_or_cannot_tell():
    ratio = host_time().host_ratio
    faster = ratio(enqueues(40.0, 1), enqueues(80.0, 2), "fwd|a")
    assert faster["host_verdict"] == "at most" and 0.45 < faster["host_ratio"] < 0.55
    low, high = faster["host_ratio_ci"]
    assert low <= faster["host_ratio"] <= high < 1.0
    slower = ratio(enqueues(450.0, 3), enqueues(400.0, 4), "step|a")
    assert slower["host_verdict"] == "above" and slower["host_ratio_ci"][0] > 1.0
    alike = ratio(enqueues(400.0, 5), enqueues(400.0, 5), "step|b")  # the same enqueues on both sides
    assert alike["host_verdict"] == "cannot tell" and alike["host_ratio"] == 1.0
    assert alike["host_ratio_ci"][0] <= 1.0 <= alike["host_ratio_ci"][1]
    # seeded per case: the same samples give the same interval whatever else was compared
    assert ratio(enqueues(400.0, 5), enqueues(400.0, 5), "step|b") == alike

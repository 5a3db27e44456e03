"""The gate's statistics on simulated GPU timings: A/A never fails, a 10% slowdown almost always does.

The noise model follows what same-code runs on one GPU show: lognormal per-sample noise, a per-run offset (clocks,
temperature, neighbours: medians move by up to ~2% run to run), a within-run drift (samples are correlated, not
independent) and rare outliers (a preempted or throttled repetition).
"""

from __future__ import annotations

import numpy as np
import pytest

from flashbench.errors import FlashbenchError
from flashbench.gate import (
    IMPROVEMENT,
    NOISY,
    REGRESSION,
    UNCHANGED,
    GateConfig,
    classify,
    compare_samples,
    load_config,
    median_ratio_ci,
)

CFG = GateConfig()  # the defaults: threshold 5%, 95% interval, 2000 resamples


def simulated_run(rng: np.random.Generator, n: int, slowdown: float = 1.0, sigma: float = 0.02) -> np.ndarray:
    offset = rng.uniform(-0.02, 0.02)  # per-run drift: the whole run is up to 2% off
    drift = np.linspace(0.0, rng.uniform(-0.01, 0.01), n)  # clocks wander within the run
    x = slowdown * np.exp(offset + drift + rng.normal(0.0, sigma, n))
    outliers = rng.random(n) < 0.03
    x[outliers] *= rng.uniform(1.1, 1.5, outliers.sum())
    return x


def verdicts(slowdown: float, pairs: int = 200, sigma: float = 0.02, n_range=(10, 50), cfg=CFG) -> list[str]:
    rng = np.random.default_rng(12345)
    out = []
    for i in range(pairs):
        n = int(rng.integers(n_range[0], n_range[1] + 1))
        base, cur = simulated_run(rng, n, sigma=sigma), simulated_run(rng, n, slowdown, sigma=sigma)
        out.append(compare_samples([cur], [base], cfg.threshold, cfg, key=f"sim{i}").verdict)
    return out


def test_aa_false_positive_rate_is_zero_over_200_simulated_pairs():
    assert verdicts(1.0).count(REGRESSION) == 0


def test_ten_percent_slowdown_is_detected_at_least_95_percent_of_the_time():
    found = verdicts(1.10).count(REGRESSION)
    assert found / 200 >= 0.95, found


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value, normal approximation (no tie correction: continuous data)."""
    from math import erfc, sqrt

    ranks = np.argsort(np.argsort(np.concatenate([a, b]))) + 1
    u = ranks[len(a) :].sum() - len(b) * (len(b) + 1) / 2
    mu, sd = len(a) * len(b) / 2, sqrt(len(a) * len(b) * (len(a) + len(b) + 1) / 12)
    return erfc(abs(u - mu) / sd / sqrt(2))


def test_a_rank_test_alone_would_fail_many_aa_pairs():
    """Why the threshold carries the decision: per-run drift is 'significant' to a test that assumes
    independent samples from one distribution, so p < 0.05 would fail most same-code builds."""
    rng = np.random.default_rng(7)
    significant = sum(
        mann_whitney_p(simulated_run(rng, 30), simulated_run(rng, 30)) < 0.05 for _ in range(200)
    )
    assert significant > 60  # about half of the A/A pairs


def test_interval_vetoes_noise_level_differences_that_cross_the_threshold():
    """On a noisy case (10% sample noise, 10-15 samples) the median alone crosses 5% often by chance;
    the interval turns most of those into 'slower-within-noise' instead of a failed build."""
    got = verdicts(1.0, sigma=0.10, n_range=(10, 15))
    crossed = got.count(REGRESSION) + got.count(NOISY)
    assert crossed >= 20  # the threshold alone would fail these builds
    assert got.count(REGRESSION) <= crossed // 4


def test_rule_needs_both_threshold_and_interval():
    assert classify(1.08, 1.03, 1.12, 0.05) == REGRESSION
    assert classify(1.08, 0.99, 1.15, 0.05) == NOISY  # slower than the threshold, but within noise
    assert classify(1.04, 1.03, 1.05, 0.05) == UNCHANGED  # "significant" 4%: below the threshold
    assert classify(1.08, None, None, 0.05) == REGRESSION  # too few samples: the threshold alone
    assert classify(0.90, 0.88, 0.92, 0.05) == IMPROVEMENT
    assert classify(0.90, 0.80, 1.01, 0.05) == UNCHANGED


def test_bootstrap_is_seeded_by_key_not_by_order():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 0.02, 30), rng.normal(1.1, 0.02, 30)
    kw = dict(confidence=0.95, resamples=2000, seed=0)
    first = median_ratio_ci([b], [a], key="triton|x", **kw)
    median_ratio_ci([a], [b], key="other", **kw)
    assert median_ratio_ci([b], [a], key="triton|x", **kw) == first
    assert first[1] < first[0] < first[2]
    assert first[0] == pytest.approx(np.median(b) / np.median(a))


def test_in_run_ratio_cancels_a_slower_machine():
    rng = np.random.default_rng(3)
    kernel, ref = rng.normal(1.1, 0.01, 30), rng.normal(1.0, 0.01, 30)
    kernel2, ref2 = rng.normal(1.1, 0.01, 30) * 1.08, rng.normal(1.0, 0.01, 30) * 1.08  # everything 8% slower
    assert compare_samples([kernel2], [kernel], 0.05, CFG, "abs").verdict == REGRESSION
    assert compare_samples([kernel2, ref], [ref2, kernel], 0.05, CFG, "ratio").verdict == UNCHANGED


def test_threshold_precedence(tmp_path):
    toml = tmp_path / "gate.toml"
    toml.write_text(
        "[gate]\nthreshold = 0.05\n[provider]\nsdpa-cudnn = 0.07\ntriton = 0.06\n"
        "[preset.ci]\nthreshold = 0.04\n[preset.ci.provider]\ntriton = 0.03\n"
    )
    cfg = load_config(toml, preset="ci")
    assert (
        cfg.threshold_for("sdpa-flash"),
        cfg.threshold_for("sdpa-cudnn"),
        cfg.threshold_for("triton"),
    ) == (
        0.04,
        0.07,
        0.03,
    )
    assert load_config(toml, preset="").threshold_for("triton") == 0.06
    assert load_config(toml, preset="ci", threshold=0.1).threshold_for("triton") == 0.1  # the CLI flag wins


def test_bad_threshold_is_a_one_line_error(tmp_path):
    toml = tmp_path / "gate.toml"
    toml.write_text("[gate]\nthreshold = 5\n")
    with pytest.raises(FlashbenchError, match="fraction"):
        load_config(toml)

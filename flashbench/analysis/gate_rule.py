"""The gate's rule for one comparison (a case's GPU time, its eager-loop time, or an in-run ratio): pure numbers.

The user asks the gate to catch a slowdown of `change` (the threshold, default 5%, configs/gate.toml). Each
comparison has its own noise band, the largest of:

    spread    SPREAD_SHARE (1/2) of the p20-p80 spread of the noisier sample set, relative to its median
    interval  half the width of the 95% bootstrap interval of the median ratio (few or scattered samples)
    history   the learned band: how far the medians of same-code runs fell apart (`gate --learn`)
    clock     how far the SM clock moved between the sides, where both recorded it

and then

    threshold  = max(change / 2, band)
    judgeable  = band <= change / 2
    regression <=> ratio > 1 + threshold  AND  the interval lies above 1  AND  the p10 ratio > 1 + threshold

A comparison that is not judgeable is reported "cannot judge at <change>" instead of "unchanged": its noise is
too large for the gate to promise that a slowdown of that size fails. It still fails beyond its own band.

Why half the change: the margin for noise is then the same on both sides. A same-code run must drift by more
than change/2 to fail, and a run slower by `change` must drift back by more than change/2 to pass. A limit of
change - band (the laxest that still catches `change` when the band is right) loses that symmetry where the band is
underestimated, and the within-run band underestimates run-to-run drift: over 20 ordered pairs of 5 same-code H100
speed runs (their sdpa providers, 2026-11-24/25; docs/gate.md), 49 of the 496 comparisons whose spread and interval
were both under 0.5% moved by more than 1%. A 3% slowdown injected into the judgeable cases fails on 97.3% of them
with change/2 (`python benchmarks/gate_check.py RUNS --bundled sdpa --threshold 0.03`) and on 73.0% of the same
comparisons with change - band.

Why SPREAD_SHARE = 1/2: a case whose middle 60% of samples spans 6% has medians that wander by about that much
between runs (the same-code pairs: cases with a p20-p80 spread of 8-20% moved by up to 4.4% on the H100 and 20%
on an H200, tests/fixtures/aa-run1/aa-run2), so it can promise a 6% verdict, not a 3% one.

Why the interval and p10 are kept as conditions: samples within one run are correlated (clocks drift) and whole
runs shift by 1-3% on the same code, so with 10-50 samples a Mann-Whitney test calls a 1% drift "significant"
(tests/test_gate_stats.py); the threshold carries the decision and the statistics veto differences the samples
cannot tell from noise. The interval is a percentile bootstrap of the median ratio (2000 resamples, seeded from the
case key, so the same inputs give the same verdict on every machine). The p10 condition: a slower kernel moves
the whole distribution of its samples, its fast end included, while interference (a clock dip, a power-cap event,
another process) only ever adds time, to part of the samples. Seen on an H200 in an A/A pair of the ci preset
(tests/fixtures/aa-run1, aa-run2): one case's median moved +20% with the same fastest samples (p10 0.889 vs
0.894 ms) and a stretch of its samples at up to 2x; the bootstrap interval, which sees only that run's samples,
called it significant. p20 was tried first and is not enough there (the slow stretch covered over 20% of the
samples: p20 moved +6.6%). Requiring p10 to move as well keeps such a case "slower-within-noise" while a real
10% slowdown or a worse kernel config (aa-worse) still fails.

The SM clock: where both sides recorded the clock their samples ran at, a case regresses only if it is slower
in time and in cycles (time x clock), and improves only if it is faster in both. A difference the clock explains
is the machine's state: cuDNN's d = 64 N = 4096 forward ran 3.5% slower in one H100 speed run than in another of
the same code, at 1845 against 1905 MHz (78 against 61 C), +0.1% in cycles. The cost: a kernel whose time does not
follow the clock (memory-bound) and regressed while the clock fell is under-counted. So the clock's move is also a
term of the band: such a case says "cannot judge" rather than "unchanged". Without that term, 8 of the 1056
cases judged at 5% on the runs above let an injected 10% slowdown pass: each ran at a 5-9% lower clock, and came
out under 2.5% in cycles.

Fewer than `min_samples` samples on a side: no spread, interval or p10 to speak of; the comparison fails beyond
the full change (or its learned band, if wider) and says so.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Verdicts. REGRESSION and NEWLY_FAILING fail the gate.
REGRESSION = "regression"
NEWLY_FAILING = "newly-failing"
NOISY = (
    "slower-within-noise"  # over its threshold, but the interval reaches 1 or p10 did not move: not failed
)
IMPROVEMENT = "improvement"
FIXED = "now-ok"
UNCHANGED = "unchanged"
CANNOT_JUDGE = (
    "cannot-judge"  # noise band wider than half the change asked for: shown as "cannot judge at X%"
)
NOT_MEASURED = "not-ok-both"
MISSING = "missing"  # in the baseline, absent from the current run: fails unless allow_missing
CURRENT_ONLY = "current-only"
FAILING = (REGRESSION, NEWLY_FAILING)

SPREAD_SHARE = 0.5  # of the p20-p80 spread (module docstring: why one half)
LOW_QUANTILE = 0.1  # the p10 condition


def pct(fraction: float) -> str:
    """A fraction as a short percentage, to 0.1: 0.03 -> '3%', 0.025 -> '2.5%', 0.01391 -> '1.4%'."""
    return f"{fraction * 100:.1f}".rstrip("0").rstrip(".") + "%"


def cannot_judge_label(change: float) -> str:
    return f"cannot judge at {pct(change)}"


# ---------------------------------------------------------------------------------------------- statistics
def median_ratio_ci(
    num: Sequence[Sequence[float]],
    den: Sequence[Sequence[float]],
    *,
    confidence: float,
    resamples: int,
    seed: int,
    key: str,
    sizes: Sequence[int] | None = None,
) -> tuple[float, float, float]:
    """prod(median(num_i)) / prod(median(den_j)) and its percentile-bootstrap interval.

    One sample set per factor, each resampled independently, `sizes[i]` draws for set i (default its length; more
    where a baseline stored quantiles of a longer run). The generator is seeded from (seed, crc32(key)) so a case's
    interval does not depend on which other cases were compared or in what order.
    """
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    sizes = list(sizes) if sizes is not None else [len(s) for s in (*num, *den)]
    point, boot, i = 1.0, np.ones(resamples), 0
    for sign, groups in ((1, num), (-1, den)):
        for samples in groups:
            x, draws = np.sort(np.asarray(samples, dtype=float)), max(sizes[i], len(samples))
            i += 1
            # Median of each resample: x is sorted, so the middle order statistic of the drawn indices picks it;
            # partitioning int32 indices and gathering two columns is 2x faster than np.median over the values.
            idx = rng.integers(0, x.size, size=(resamples, draws), dtype=np.int32)
            middle = [draws // 2 - 1, draws // 2] if draws % 2 == 0 else [draws // 2]
            medians = x[np.partition(idx, middle, axis=1)[:, middle]].mean(axis=1)
            point *= float(np.median(x)) ** sign
            boot *= medians**sign
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return point, float(low), float(high)


def quantile_ratio(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]], q: float) -> float:
    top = np.prod([np.quantile(np.asarray(s, dtype=float), q) for s in num])
    bottom = np.prod([np.quantile(np.asarray(s, dtype=float), q) for s in den])
    return float(top / bottom)


def relative_spread(samples: Sequence[float]) -> float:
    """(p80 - p20) / median of one sample set."""
    p20, p50, p80 = np.percentile(np.asarray(samples, dtype=float), [20, 50, 80])
    return float((p80 - p20) / p50) if p50 > 0 else float("inf")


# ---------------------------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class Noise:
    """A comparison's noise, as fractions of its ratio; `band` is what the rule uses."""

    spread: float = 0.0  # SPREAD_SHARE x the p20-p80 spread of the noisier sample set
    interval: float = 0.0  # half the width of the bootstrap interval of the ratio
    history: float | None = None  # the learned band, None without a learned baseline
    clock: float = 0.0  # how far the SM clock moved between the sides, |current / baseline - 1|

    @property
    def band(self) -> float:
        return max(self.spread, self.interval, self.history or 0.0, self.clock)

    @property
    def source(self) -> str:
        """Which term sets the band: 'spread', 'interval', 'history' or 'clock'."""
        terms = {"history": self.history or 0.0, "clock": self.clock, "spread": self.spread}
        terms["interval"] = self.interval
        return max(terms, key=lambda name: terms[name])


def case_threshold(change: float, band: float | None) -> float:
    """The slowdown above which a comparison fails: half the change to catch, or its noise band where that is
    wider. Without a noise measure (band None: too few samples, nothing learned) the full change."""
    return change if band is None else max(change / 2.0, band)


def can_judge(change: float, band: float | None) -> bool:
    """Whether a slowdown of `change` is sure to fail: the band is at most half of it (module docstring)."""
    return band is None or band <= change / 2.0


def decide(
    ratio: float,
    threshold: float,
    *,
    judgeable: bool = True,
    low: float | None = None,
    high: float | None = None,
    low_q: float | None = None,
    clock: float = 1.0,
) -> str:
    """The verdict of one comparison. ratio, low, high, low_q: current / baseline of the median, the interval's
    ends and p10 (None: too few samples); clock: the current side's SM clock / the baseline's (1.0: unknown).

    Slower counts where time and cycles (time x clock) are both slower; faster where both are faster.
    """
    slow, fast = min(1.0, clock), max(1.0, clock)
    if ratio * slow > 1.0 + threshold:
        evident = (low is None or low * slow > 1.0) and (low_q is None or low_q * slow > 1.0 + threshold)
        return REGRESSION if evident else NOISY
    if ratio * fast < 1.0 / (1.0 + threshold):
        evident = (high is None or high * fast < 1.0) and (
            low_q is None or low_q * fast < 1.0 / (1.0 + threshold)
        )
        if evident:
            return IMPROVEMENT
    return UNCHANGED if judgeable else CANNOT_JUDGE


@dataclass(frozen=True)
class Comparison:
    ratio: float  # current / baseline, medians (a product of them for an in-run ratio)
    ci_low: float | None
    ci_high: float | None
    verdict: str
    low_q_ratio: float | None = None  # the same ratio at LOW_QUANTILE of each sample set
    noise: Noise | None = None  # None: too few samples to measure it (and nothing learned)
    threshold: float = 0.0  # the slowdown above which it fails (case_threshold)
    judgeable: bool = True

    @property
    def band(self) -> float | None:
        return None if self.noise is None else self.noise.band


def compare_samples(
    num: Sequence[Sequence[float]],
    den: Sequence[Sequence[float]],
    change: float,
    *,
    key: str,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    min_samples: int = 5,
    sizes: Sequence[int] | None = None,
    history: float | None = None,
    clock: float = 1.0,
) -> Comparison:
    """Apply the rule to one ratio: num = [current] and den = [baseline] for a case's own timing,
    num = [bundled now, reference before], den = [reference now, bundled before] for an in-run ratio."""
    moved = abs(clock - 1.0)
    if min(len(s) for s in (*num, *den)) < min_samples:
        medians = [float(np.median(s)) for s in (*num, *den)]
        ratio = float(np.prod(medians[: len(num)]) / np.prod(medians[len(num) :]))
        noise = None if history is None and not moved else Noise(history=history, clock=moved)
        band = None if noise is None else noise.band
        thr, judgeable = max(change, band or 0.0), can_judge(change, band)
        verdict = decide(ratio, thr, judgeable=judgeable, clock=clock)
        return Comparison(ratio, None, None, verdict, None, noise, thr, judgeable)
    ratio, low, high = median_ratio_ci(
        num, den, confidence=confidence, resamples=resamples, seed=seed, key=key, sizes=sizes
    )
    spread = SPREAD_SHARE * max(relative_spread(s) for s in (*num, *den))
    noise = Noise(spread=spread, interval=(high - low) / 2.0, history=history, clock=moved)
    thr, judgeable = case_threshold(change, noise.band), can_judge(change, noise.band)
    low_q = quantile_ratio(num, den, LOW_QUANTILE)
    verdict = decide(ratio, thr, judgeable=judgeable, low=low, high=high, low_q=low_q, clock=clock)
    return Comparison(ratio, low, high, verdict, low_q, noise, thr, judgeable)

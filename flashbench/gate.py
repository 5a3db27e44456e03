"""The performance-regression gate: compare a current run with a baseline and decide pass (0) or fail (1).

The rule, per case matched by key (both sides "ok"):
    ratio = median(current samples) / median(baseline samples)
    regression  <=>  ratio > 1 + threshold  AND  the bootstrap interval of the ratio lies above 1
                                            AND  the p10 ratio is above 1 + threshold too
The threshold (default 5%, configs/gate.toml) carries the decision; the statistics only veto differences that the
samples themselves cannot tell from noise. Why not a rank test alone: samples within one run are correlated (clocks
drift) and whole runs shift by 1-3% on the same code, so with 10-50 samples a Mann-Whitney test calls a 1% drift
"significant" (tested: tests/test_gate_stats.py). Why not "interval above 1 + threshold": the interval only sees
within-run noise, so that rule halves the detection of a real 10% slowdown in a noisy case while buying nothing
against run-to-run drift, which only the threshold covers. The interval is a percentile bootstrap of the median
ratio (2000 resamples, seeded from the case key, so the same inputs give the same verdict on every machine).

The p10 condition: a slower kernel moves the whole distribution of its samples, its fast end included, while
interference (a clock dip, a power-cap event, another process) only ever adds time, to part of the samples. Seen
on an H200 in an A/A pair of the ci preset (tests/fixtures/aa-run1, aa-run2): one case's median moved +20% with
the same fastest samples (p10 0.889 vs 0.894 ms) and a stretch of its samples at up to 2x; the bootstrap interval,
which sees only that run's samples, called it significant. p20 was tried first and is not enough there (the slow
stretch covered over 20% of the samples: p20 moved +6.6%). Requiring p10 to move as well keeps such a case
"slower-within-noise" while a real 10% slowdown or a worse kernel config (aa-worse) still fails.

A baseline case absent from the current run fails the gate too (a crashed or truncated sweep, a row torn by a
kill -9): a gate that compares only what is left would pass a run that lost most of its cases. `allow_missing`
(`--allow-missing`) is for the deliberate case (a shard, a narrower sweep); the cases are still listed.

The in-run ratio gate applies the same rule to (bundled / reference) in the current run over the same ratio in the
baseline, e.g. triton over sdpa-flash for one shape: a slower machine slows both and leaves the ratio alone.
A case that was ok and now is not (wrong, oom, crash, timeout, unsupported, ...) fails the gate.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flashbench.configfiles import config_path, read_toml
from flashbench.errors import EXIT_OK, EXIT_REGRESSION, FlashbenchError, plural
from flashbench.results.baseline import ENV_FIELDS, CaseResult, Side, load_side
from flashbench.results.rows import OK

# Verdicts. The first two fail the gate.
REGRESSION = "regression"
NEWLY_FAILING = "newly-failing"
NOISY = "slower-within-noise"  # above the threshold, but the interval reaches 1: reported, not failed
IMPROVEMENT = "improvement"
FIXED = "now-ok"
UNCHANGED = "unchanged"
NOT_MEASURED = "not-ok-both"
MISSING = "missing"  # in the baseline, absent from the current run: fails unless allow_missing
CURRENT_ONLY = "current-only"
FAILING = (REGRESSION, NEWLY_FAILING)
SHOW_MISSING = 3  # missing keys named in the headline
# The env facts that must match: another GPU model (or CPU vs CUDA) makes every ratio meaningless.
MUST_MATCH = ("gpu", "device")


@dataclass(frozen=True)
class GateConfig:
    threshold: float = 0.05  # default slowdown threshold, a fraction
    provider_thresholds: Mapping[str, float] = field(default_factory=dict)  # already resolved for the preset
    confidence: float = 0.95  # two-sided bootstrap interval
    resamples: int = 2000
    seed: int = 0
    min_samples: int = 5  # fewer raw samples on a side: the threshold alone decides (noted)
    absolute: bool = True  # gate each case's own median
    ratios: bool = True  # gate in-run ratios bundled / reference
    ratio_pairs: tuple[tuple[str, str], ...] = (("triton", "sdpa-flash"),)

    def threshold_for(self, provider: str) -> float:
        return float(self.provider_thresholds.get(provider, self.threshold))


def load_config(
    path: str | Path | None = None, preset: str = "", threshold: float | None = None
) -> GateConfig:
    """configs/gate.toml (or PATH) resolved for a preset. Precedence, most specific first: an explicit
    `threshold` (the CLI flag) > [preset.NAME.provider] > [provider] > [preset.NAME] threshold > [gate] threshold."""
    data = read_toml(path if path is not None else config_path("gate.toml"))
    gate = data.get("gate", {})
    preset_table = data.get("preset", {}).get(preset, {}) if preset else {}
    default = preset_table.get("threshold", gate.get("threshold", 0.05))
    per_provider = {**data.get("provider", {}), **preset_table.get("provider", {})}
    if threshold is not None:
        default, per_provider = threshold, {}
    pairs = tuple(tuple(p) for p in gate.get("ratio_pairs", [["triton", "sdpa-flash"]]))
    try:
        cfg = GateConfig(
            threshold=float(default),
            provider_thresholds={str(k): float(v) for k, v in per_provider.items()},
            confidence=float(gate.get("confidence", 0.95)),
            resamples=int(gate.get("resamples", 2000)),
            seed=int(gate.get("seed", 0)),
            min_samples=int(gate.get("min_samples", 5)),
            absolute=bool(gate.get("absolute", True)),
            ratios=bool(gate.get("ratios", True)),
            ratio_pairs=pairs,  # type: ignore[arg-type]
        )
    except (TypeError, ValueError) as exc:
        raise FlashbenchError(f"gate config: {exc}") from None
    if threshold is not None and not 0.0 < cfg.threshold < 1.0:
        raise FlashbenchError(
            f"--threshold {threshold:g}: a slowdown threshold is a fraction in (0, 1), 0.05 = 5%"
        )
    for name, value in [("threshold", cfg.threshold), *cfg.provider_thresholds.items()]:
        if not 0.0 < value < 1.0:
            what = "the threshold" if name == "threshold" else f"the threshold of provider {name}"
            raise FlashbenchError(f"gate config: {what} must be a fraction in (0, 1), got {value}")
    if not 0.5 < cfg.confidence < 1.0 or cfg.resamples < 100 or any(len(p) != 2 for p in pairs):
        raise FlashbenchError(
            "gate config: need 0.5 < confidence < 1, resamples >= 100, pairs of two providers"
        )
    return cfg


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


def classify(ratio: float, low: float | None, high: float | None, threshold: float) -> str:
    """The rule: slower than the threshold AND the interval above 1 (None = too few samples: threshold only)."""
    if ratio > 1.0 + threshold:
        return REGRESSION if low is None or low > 1.0 else NOISY
    if ratio < 1.0 / (1.0 + threshold) and (high is None or high < 1.0):
        return IMPROVEMENT
    return UNCHANGED


@dataclass(frozen=True)
class Comparison:
    ratio: float
    ci_low: float | None
    ci_high: float | None
    verdict: str
    low_q_ratio: float | None = None  # the same ratio at LOW_QUANTILE of each sample set


LOW_QUANTILE = 0.1


def quantile_ratio(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]], q: float) -> float:
    top = np.prod([np.quantile(np.asarray(s, dtype=float), q) for s in num])
    bottom = np.prod([np.quantile(np.asarray(s, dtype=float), q) for s in den])
    return float(top / bottom)


def compare_samples(
    num: Sequence[Sequence[float]],
    den: Sequence[Sequence[float]],
    threshold: float,
    cfg: GateConfig,
    key: str,
    sizes: Sequence[int] | None = None,
) -> Comparison:
    """Apply the rule to one ratio: num = [current] and den = [baseline] for a case's own timing."""
    if min(len(s) for s in (*num, *den)) < cfg.min_samples:
        medians = [float(np.median(s)) for s in (*num, *den)]
        ratio = float(np.prod(medians[: len(num)]) / np.prod(medians[len(num) :]))
        return Comparison(ratio, None, None, classify(ratio, None, None, threshold))
    ratio, low, high = median_ratio_ci(
        num, den, confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed, key=key, sizes=sizes
    )
    verdict = classify(ratio, low, high, threshold)
    low_q = quantile_ratio(num, den, LOW_QUANTILE)
    if verdict == REGRESSION and low_q <= 1.0 + threshold:
        verdict = NOISY  # only part of the distribution moved: a transient, not a slower kernel
    elif verdict == IMPROVEMENT and low_q >= 1.0 / (1.0 + threshold):
        verdict = UNCHANGED  # the mirror image: the baseline had the transient
    return Comparison(ratio, low, high, verdict, low_q)


# ---------------------------------------------------------------------------------------------- the gate
@dataclass(frozen=True)
class EnvLine:
    name: str
    baseline: str
    current: str

    @property
    def differs(self) -> bool:
        return self.baseline != self.current


@dataclass(frozen=True)
class CaseVerdict:
    key: str
    verdict: str
    baseline_status: str = ""
    current_status: str = ""
    baseline_ms: float | None = None
    current_ms: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None
    throttled: str = ""  # "", "baseline", "current" or "both"
    note: str = ""


@dataclass(frozen=True)
class RatioVerdict:
    shape: str
    bundled: str
    reference: str
    baseline_ratio: float
    current_ratio: float
    change: float
    ci_low: float | None
    ci_high: float | None
    threshold: float
    verdict: str


@dataclass
class GateResult:
    baseline: str
    current: str
    env: list[EnvLine]
    config: GateConfig
    cases: list[CaseVerdict]
    ratios: list[RatioVerdict]
    notes: list[str]
    allow_missing: bool = False

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cases)

    @property
    def missing(self) -> list[str]:
        """Keys of the baseline cases the current run lacks (sorted)."""
        return [c.key for c in self.cases if c.verdict == MISSING]

    @property
    def ratio_regressions(self) -> list[RatioVerdict]:
        return [r for r in self.ratios if r.verdict == REGRESSION]

    @property
    def passed(self) -> bool:
        failing = any(c.verdict in FAILING for c in self.cases) or self.ratio_regressions
        return not failing and (self.allow_missing or not self.missing)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_REGRESSION

    def headline(self) -> str:
        parts = [
            f"{n} {label}"
            for n, label in [
                (self.count(REGRESSION), "regressed"),
                (self.count(NEWLY_FAILING), "newly failing"),
                (
                    len(self.missing),
                    ("baseline case" if len(self.missing) == 1 else "baseline cases")
                    + " missing from the current run"
                    + self._first_missing(),
                ),
                (len(self.ratio_regressions), "in-run ratio regressed"),
                (self.count(IMPROVEMENT), "improved"),
                (self.count(FIXED), "now ok"),
                (self.count(NOISY), "slower within noise"),
            ]
            if n
        ]
        compared = sum(c.verdict not in (MISSING, CURRENT_ONLY) for c in self.cases)
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict}: {plural(compared, 'case')} compared" + (f"; {', '.join(parts)}" if parts else "")

    def _first_missing(self) -> str:
        keys = self.missing
        if self.allow_missing or not keys:
            return " (allowed by --allow-missing)" if keys else ""
        more = f", +{len(keys) - SHOW_MISSING} more" if len(keys) > SHOW_MISSING else ""
        return f" ({', '.join(k.replace('|', ' ') for k in keys[:SHOW_MISSING])}{more})"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["config"]["provider_thresholds"] = dict(self.config.provider_thresholds)
        out["env"] = [{**asdict(e), "differs": e.differs} for e in self.env]
        out.update(
            passed=self.passed, exit_code=self.exit_code, headline=self.headline(), missing=self.missing
        )
        return out


def run_gate(
    baseline: str | Path,
    current: str | Path,
    *,
    threshold: float | None = None,
    allow_mismatch: bool = False,
    allow_missing: bool = False,
    config: str | Path | None = None,
    preset: str | None = None,
) -> GateResult:
    """Load both sides, refuse another GPU model unless allowed, and decide. Raises FlashbenchError (exit 2).

    Baseline cases absent from the current run fail the gate unless `allow_missing` (see the module docstring).
    """
    base, cur = load_side(baseline), load_side(current)
    env = [EnvLine(name, base.env.get(name, ""), cur.env.get(name, "")) for name in ENV_FIELDS]
    notes: list[str] = []
    mismatched = [e for e in env if e.name in MUST_MATCH and e.differs and e.baseline and e.current]
    if mismatched:
        what = "; ".join(f"{e.name}: baseline {e.baseline!r}, current {e.current!r}" for e in mismatched)
        if not allow_mismatch:
            raise FlashbenchError(f"environment mismatch ({what}); use --allow-mismatch to compare anyway")
        notes.append(f"Environment mismatch allowed by --allow-mismatch ({what}).")
    if not base.env.get("gpu") or not cur.env.get("gpu"):
        notes.append("GPU model unknown on one side: not checked.")
    flushes = base.env.get("l2_flush", ""), cur.env.get("l2_flush", "")
    if all(flushes) and flushes[0] != flushes[1]:
        notes.append(
            f"The L2 flush differs (baseline {flushes[0]}, current {flushes[1]}): a write flush leaves the L2 dirty "
            "and adds its write-back to each sample (~10 us per memory-bound call on an H100; docs/measuring.md)."
        )
    common = base.cases.keys() & cur.cases.keys()
    if not common:
        raise FlashbenchError(f"{base.label} and {cur.label} have no case in common")
    cfg = load_config(config, preset if preset is not None else cur.env.get("preset", ""), threshold)
    ratios = _ratio_verdicts(base, cur, cfg) if cfg.ratios else []
    cases = _case_verdicts(base, cur, cfg, ratios)
    if cfg.absolute is False:
        notes.append("Absolute per-case gate disabled in the config: only in-run ratios and failures gate.")
    missing = sum(c.verdict == MISSING for c in cases)
    if missing and not allow_missing:
        notes.append(
            f"{missing} of the baseline's {len(base.cases)} cases are missing from the current run (a crashed or "
            "truncated sweep?): finish it with `flashbench sweep --resume --out DIR`, or pass --allow-missing "
            "if they were left out on purpose."
        )
    return GateResult(base.label, cur.label, env, cfg, cases, ratios, notes, allow_missing)


def _case_verdicts(base: Side, cur: Side, cfg: GateConfig, ratios: list[RatioVerdict]) -> list[CaseVerdict]:
    drifted_shapes = set()  # shapes whose reference provider slowed too: the machine, not the code?
    refs = {ref for _, ref in cfg.ratio_pairs}
    out: list[CaseVerdict] = []
    for key in sorted(base.cases.keys() | cur.cases.keys()):
        b, c = base.cases.get(key), cur.cases.get(key)
        verdict = _one_case(key, b, c, cfg)
        if verdict.verdict == REGRESSION and verdict.key.split("|", 1)[0] in refs:
            drifted_shapes.add(key.split("|", 1)[1])
        out.append(verdict)
    steady = {(r.shape, r.bundled) for r in ratios if r.verdict != REGRESSION}
    for i, v in enumerate(out):
        provider, shape = v.key.split("|", 1)
        if v.verdict == REGRESSION and shape in drifted_shapes and (shape, provider) in steady:
            note = "; ".join(
                filter(None, [v.note, "reference slowed too and the in-run ratio held: machine drift?"])
            )
            out[i] = CaseVerdict(**{**asdict(v), "note": note})
    return out


def _one_case(key: str, b: CaseResult | None, c: CaseResult | None, cfg: GateConfig) -> CaseVerdict:
    if b is None or c is None:
        only = c if b is None else b
        assert only is not None
        verdict = CURRENT_ONLY if b is None else MISSING
        side = {"current_status": only.status} if b is None else {"baseline_status": only.status}
        return CaseVerdict(key, verdict, **side)
    throttled = {(True, True): "both", (True, False): "baseline", (False, True): "current"}.get(
        (b.throttled, c.throttled), ""
    )
    common = dict(
        baseline_status=b.status, current_status=c.status, baseline_ms=b.median_ms, throttled=throttled
    )
    common["current_ms"] = c.median_ms
    if b.status == OK and c.status != OK:
        return CaseVerdict(key, NEWLY_FAILING, **common, note=c.reason)
    if b.status != OK:
        return CaseVerdict(key, FIXED if c.status == OK else NOT_MEASURED, **common)
    if not b.median_ms or not c.median_ms or b.median_ms <= 0 or c.median_ms <= 0:
        return CaseVerdict(key, NOT_MEASURED, **common, note="ok row without timing")
    thr = cfg.threshold_for(b.provider)
    num, den = [c.samples_ms or (c.median_ms,)], [b.samples_ms or (b.median_ms,)]
    comp = compare_samples(num, den, thr, cfg, key, sizes=[c.n, b.n])
    note = "" if comp.ci_low is not None else f"fewer than {cfg.min_samples} samples: threshold only"
    if comp.verdict == NOISY and comp.low_q_ratio is not None and comp.low_q_ratio <= 1.0 + thr:
        note = f"p10 moved {comp.low_q_ratio - 1.0:+.1%}: a transient, not the whole distribution"
    verdict = comp.verdict
    if verdict in (REGRESSION, NOISY, IMPROVEMENT):
        note = "; ".join(filter(None, [note, clock_note(b.sm_clock_mhz, c.sm_clock_mhz, comp.ratio)]))
    if not cfg.absolute and verdict in (REGRESSION, NOISY):
        verdict, note = UNCHANGED, "; ".join(filter(None, [note, f"{comp.verdict} (absolute gate off)"]))
    return CaseVerdict(
        key,
        verdict,
        **common,
        ratio=comp.ratio,
        ci_low=comp.ci_low,
        ci_high=comp.ci_high,
        threshold=thr,
        note=note,
    )


def clock_note(base_mhz: float | None, cur_mhz: float | None, ratio: float) -> str:
    """Where the SM clock the samples ran at moved by more than 2%: both clocks and the time ratio per MHz (cycles),
    so a slowdown that is the power cap's lower clock reads as such. Said, not judged: the user's GPU runs at the
    clock it runs at."""
    if not base_mhz or not cur_mhz or abs(cur_mhz / base_mhz - 1.0) <= 0.02:
        return ""
    cycles = ratio * cur_mhz / base_mhz
    return f"SM clock {base_mhz:.0f} -> {cur_mhz:.0f} MHz ({cur_mhz / base_mhz - 1.0:+.1%}): {cycles - 1.0:+.1%} in cycles"


def _ratio_verdicts(base: Side, cur: Side, cfg: GateConfig) -> list[RatioVerdict]:
    out: list[RatioVerdict] = []
    for bundled, ref in cfg.ratio_pairs:
        shapes = sorted({c.shape_key for c in base.cases.values() if c.provider == bundled})
        for shape in shapes:
            quad = [side.cases.get(f"{p}|{shape}") for side in (base, cur) for p in (bundled, ref)]
            if any(q is None or q.status != OK or not q.median_ms for q in quad):
                continue
            bb, br, cb, cr = (q.samples_ms or (q.median_ms,) for q in quad)  # type: ignore[union-attr]
            nbb, nbr, ncb, ncr = (q.n for q in quad)  # type: ignore[union-attr]
            thr = cfg.threshold_for(bundled)
            key = f"ratio|{bundled}|{ref}|{shape}"
            comp = compare_samples([cb, br], [cr, bb], thr, cfg, key, sizes=[ncb, nbr, ncr, nbb])
            base_ratio = float(np.median(bb) / np.median(br))
            cur_ratio = float(np.median(cb) / np.median(cr))
            out.append(
                RatioVerdict(
                    shape,
                    bundled,
                    ref,
                    base_ratio,
                    cur_ratio,
                    comp.ratio,
                    comp.ci_low,
                    comp.ci_high,
                    thr,
                    comp.verdict,
                )
            )
    return out


def to_json(result: GateResult) -> str:
    return json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"

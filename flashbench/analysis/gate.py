"""The performance-regression gate: compare a current run with a baseline and decide pass (0) or fail (1).

Per case matched by key (both sides "ok"), the rule of flashbench/analysis/gate_rule.py (its docstring is the design
record: the per-case noise band, why half the threshold, the bootstrap interval, the p10 condition, the clock)
judges three things:
    - the GPU time: median of the samples, current / baseline, with the SM clock of each side;
    - the eager-loop time (Row.loop_samples_ms, what a caller's loop pays), where both sides measured it: a
      kernel whose launch path got slower fails here while its GPU time stands still;
    - the in-run ratio (bundled / reference in the same run, e.g. triton over sdpa-flash for one shape) against
      the same ratio in the baseline: a slower machine slows both and leaves the ratio alone.
The threshold (default 5%, configs/gate.toml) is the slowdown the gate must catch. A case whose noise band is
wider than half of it is reported "cannot judge at X%" rather than "unchanged".

The noise band of a case comes from both sides' samples, and from a learned baseline where there is one:
`flashbench gate --learn RUN RUN... --baseline FILE` stores, per case, how far apart the medians of those
same-code runs fell (results/baseline.learn_baseline), as NVBench's compare script and Bencher's thresholds take
their noise from repeated runs of one build. Within-run samples cannot see run-to-run drift (a warmer GPU, another
cuDNN plan); only repeated runs can.

A case that was ok and now is not (wrong, oom, crash, timeout, unsupported, ...) fails the gate. A baseline case
absent from the current run fails it too (a crashed or truncated sweep, a row torn by a kill -9): a gate that
compares only what is left would pass a run that lost most of its cases. `allow_missing` (`--allow-missing`) is
for the deliberate case (a shard, a narrower sweep); the cases are still listed. A case only in the current run
is listed and never fails.

Both sides' code fingerprints (env.json, gpu/environment.py) are in the environment table, and a note says
whether they are equal: same code with a slower case means the machine's state moved, not the kernel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flashbench.analysis.gate_rule import (
    CANNOT_JUDGE,
    CURRENT_ONLY,
    FAILING,
    FIXED,
    IMPROVEMENT,
    MISSING,
    NEWLY_FAILING,
    NOISY,
    NOT_MEASURED,
    REGRESSION,
    UNCHANGED,
    Comparison,
    cannot_judge_label,
    compare_samples,
    pct,
)
from flashbench.configfiles import config_path, read_toml
from flashbench.errors import EXIT_OK, EXIT_REGRESSION, FlashbenchError, plural
from flashbench.providers import builtin
from flashbench.results.baseline import ENV_FIELDS, CaseResult, Side, load_side
from flashbench.results.env import same_code
from flashbench.results.rows import OK

__all__ = [
    "CANNOT_JUDGE", "CURRENT_ONLY", "FIXED", "IMPROVEMENT", "MISSING", "NEWLY_FAILING", "NOISY",
    "NOT_MEASURED", "REGRESSION", "UNCHANGED", "GateConfig", "GateResult", "load_config", "run_gate", "to_json",
]  # fmt: skip

SHOW_MISSING = 3  # missing keys named in the headline
# The env facts that must match: another GPU model (or CPU vs CUDA) makes every ratio meaningless.
MUST_MATCH = ("gpu", "device")
# SM clocks step by 15 MHz (0.8% at 1.9 GHz): every step between the sides is named, with the change in cycles.
CLOCK_NOTE_MIN = 0.005


@dataclass(frozen=True)
class GateConfig:
    threshold: float = (
        0.05  # the slowdown to catch, a fraction (gate_rule: each case fails beyond max(half, noise))
    )
    provider_thresholds: Mapping[str, float] = field(default_factory=dict)  # already resolved for the preset
    confidence: float = 0.95  # two-sided bootstrap interval
    resamples: int = 2000
    seed: int = 0
    min_samples: int = 5  # fewer raw samples on a side: no noise measure, the full threshold decides (noted)
    absolute: bool = True  # gate each case's own median
    ratios: bool = True  # gate in-run ratios bundled / reference
    # (provider, reference) pairs of the in-run ratio: what the providers declare (ratio_vs), unless gate.toml names them
    ratio_pairs: tuple[tuple[str, str], ...] = field(default_factory=builtin.ratio_pairs)

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
    pairs = tuple(tuple(p) for p in gate.get("ratio_pairs", builtin.ratio_pairs()))
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


# ---------------------------------------------------------------------------------------------- the gate
@dataclass(frozen=True)
class EnvLine:
    name: str
    baseline: str
    current: str

    @property
    def differs(self) -> bool:
        return self.baseline != self.current


def _label(verdict: str, target: float | None) -> str:
    return cannot_judge_label(target) if verdict == CANNOT_JUDGE and target else verdict


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
    threshold: float | None = None  # the slowdown above which this case fails: max(change / 2, noise band)
    throttled: str = ""  # "", "baseline", "current" or "both"
    note: str = ""
    target: float | None = None  # the slowdown to catch: the configured threshold for its provider
    noise: float | None = None  # the case's noise band (None: too few samples and nothing learned)
    noise_source: str = ""  # "spread", "interval" or "history"
    cycles_ratio: float | None = None  # ratio x current clock / baseline clock, where both clocks are known
    loop_verdict: str = ""  # the eager-loop time's verdict, "" where a side did not measure it
    loop_baseline_ms: float | None = None
    loop_current_ms: float | None = None
    loop_ratio: float | None = None
    loop_threshold: float | None = None

    @property
    def label(self) -> str:
        """The verdict as shown: 'cannot judge at 3%' for CANNOT_JUDGE."""
        return _label(self.verdict, self.target)


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
    noise: float | None = None
    target: float | None = None  # the slowdown to catch: the bundled provider's threshold

    @property
    def label(self) -> str:
        return _label(self.verdict, self.target)


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
    def loop_regressions(self) -> list[CaseVerdict]:
        return [c for c in self.cases if c.loop_verdict == REGRESSION]

    @property
    def passed(self) -> bool:
        failing = any(c.verdict in FAILING for c in self.cases) or self.ratio_regressions
        return not failing and not self.loop_regressions and (self.allow_missing or not self.missing)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_REGRESSION

    def cannot_judge(self) -> dict[str, int]:
        """'cannot judge at 3%' -> how many cases (one entry per threshold in use)."""
        out: dict[str, int] = {}
        for c in self.cases:
            if c.verdict == CANNOT_JUDGE:
                out[c.label] = out.get(c.label, 0) + 1
        return out

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
                (len(self.loop_regressions), "loop time regressed"),
                (self.count(IMPROVEMENT), "improved"),
                (self.count(FIXED), "now ok"),
                (self.count(NOISY), "slower within noise"),
                *((n, label) for label, n in self.cannot_judge().items()),
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
        for item, case in zip(out["cases"], self.cases, strict=True):
            item["label"] = case.label
        for item, ratio in zip(out["ratios"], self.ratios, strict=True):
            item["label"] = ratio.label
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
    """Load both sides (run directories or baseline files) and judge them. Raises FlashbenchError (exit 2)."""
    return judge(
        load_side(baseline),
        load_side(current),
        threshold=threshold,
        allow_mismatch=allow_mismatch,
        allow_missing=allow_missing,
        config=config,
        preset=preset,
    )


def judge(
    base: Side,
    cur: Side,
    *,
    threshold: float | None = None,
    allow_mismatch: bool = False,
    allow_missing: bool = False,
    config: str | Path | None = None,
    preset: str | None = None,
) -> GateResult:
    """Refuse another GPU model unless allowed, and decide. Raises FlashbenchError (exit 2).

    Baseline cases absent from the current run fail the gate unless `allow_missing` (see the module docstring).
    """
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
    notes.append(same_code(base.env.get("code", ""), cur.env.get("code", "")))
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
    learned = sum(c.band is not None for c in base.cases.values())
    if learned:
        runs = max(c.band_runs for c in base.cases.values())
        notes.append(f"Noise bands learned from {runs} same-code runs for {learned} of the baseline's cases.")
    missing = sum(c.verdict == MISSING for c in cases)
    if missing and not allow_missing:
        notes.append(
            f"{missing} of the baseline's {len(base.cases)} cases are missing from the current run (a crashed or "
            "truncated sweep?): finish it with `flashbench sweep --resume --out DIR`, or pass --allow-missing "
            "if they were left out on purpose."
        )
    return GateResult(base.label, cur.label, env, cfg, cases, ratios, notes, allow_missing)


def _compare(
    num: list[tuple[float, ...]],
    den: list[tuple[float, ...]],
    change: float,
    cfg: GateConfig,
    key: str,
    **kw: Any,
) -> Comparison:
    return compare_samples(
        num,
        den,
        change,
        key=key,
        confidence=cfg.confidence,
        resamples=cfg.resamples,
        seed=cfg.seed,
        min_samples=cfg.min_samples,
        **kw,
    )


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
            note = _join(v.note, "reference slowed too and the in-run ratio held: machine drift?")
            out[i] = CaseVerdict(**{**asdict(v), "note": note})
    return out


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _one_case(key: str, b: CaseResult | None, c: CaseResult | None, cfg: GateConfig) -> CaseVerdict:
    if b is None or c is None:
        only = c if b is None else b
        assert only is not None
        verdict = CURRENT_ONLY if b is None else MISSING
        side: dict[str, Any] = (
            {"current_status": only.status} if b is None else {"baseline_status": only.status}
        )
        return CaseVerdict(key, verdict, **side)
    throttled = {(True, True): "both", (True, False): "baseline", (False, True): "current"}.get(
        (b.throttled, c.throttled), ""
    )
    common: dict[str, Any] = dict(
        baseline_status=b.status, current_status=c.status, baseline_ms=b.median_ms, throttled=throttled
    )
    common["current_ms"] = c.median_ms
    if b.status == OK and c.status != OK:
        return CaseVerdict(key, NEWLY_FAILING, **common, note=c.reason)
    if b.status != OK:
        return CaseVerdict(key, FIXED if c.status == OK else NOT_MEASURED, **common)
    if not b.median_ms or not c.median_ms or b.median_ms <= 0 or c.median_ms <= 0:
        return CaseVerdict(key, NOT_MEASURED, **common, note="ok row without timing")
    change = cfg.threshold_for(b.provider)
    clock = c.sm_clock_mhz / b.sm_clock_mhz if b.sm_clock_mhz and c.sm_clock_mhz else 1.0
    num, den = [_samples(c)], [_samples(b)]
    comp = _compare(num, den, change, cfg, key, sizes=[c.n, b.n], history=b.band, clock=clock)
    notes = [
        f"fewer than {cfg.min_samples} samples: judged against the full {pct(comp.threshold)}"
        if comp.ci_low is None
        else "",
        clock_note(b.sm_clock_mhz, c.sm_clock_mhz, comp.ratio),
    ]
    if (
        comp.verdict == NOISY
        and comp.low_q_ratio is not None
        and comp.low_q_ratio * min(1.0, clock) <= 1.0 + comp.threshold
    ):
        notes.append(f"p10 moved {comp.low_q_ratio - 1.0:+.1%}: a transient, not the whole distribution")
    if comp.verdict == CANNOT_JUDGE and comp.noise is not None:
        notes.append(f"noise ±{pct(comp.noise.band)} ({comp.noise.source}) > half of {pct(change)}")
    verdict = comp.verdict
    if not cfg.absolute and verdict in (REGRESSION, NOISY):
        verdict, notes = UNCHANGED, [*notes, f"{comp.verdict} (absolute gate off)"]
    loop = _loop(key, b, c, change, cfg, clock)
    if loop.get("loop_verdict") == REGRESSION:
        notes.append(
            f"loop time {loop['loop_ratio'] - 1.0:+.1%} (fails beyond {pct(loop['loop_threshold'])})"
        )
    return CaseVerdict(
        key,
        verdict,
        **common,
        ratio=comp.ratio,
        ci_low=comp.ci_low,
        ci_high=comp.ci_high,
        threshold=comp.threshold,
        note=_join(*notes),
        target=change,
        noise=comp.band,
        noise_source=comp.noise.source if comp.noise is not None else "",
        cycles_ratio=comp.ratio * clock if b.sm_clock_mhz and c.sm_clock_mhz else None,
        **loop,
    )


def _loop(
    key: str, b: CaseResult, c: CaseResult, change: float, cfg: GateConfig, clock: float
) -> dict[str, Any]:
    """The eager-loop time under the same rule, clock included, where both sides measured it (runs before it have
    none): a loop that pays GPU time slows with the SM clock as the GPU time does, so a power-capped run must not
    read as a slower launch path."""
    if not b.loop_ms or not c.loop_ms:
        return {}
    num, den = [c.loop_samples_ms or (c.loop_ms,)], [b.loop_samples_ms or (b.loop_ms,)]
    comp = _compare(num, den, change, cfg, f"{key}|loop", history=b.loop_band, clock=clock)
    return dict(
        loop_verdict=comp.verdict,
        loop_baseline_ms=b.loop_ms,
        loop_current_ms=c.loop_ms,
        loop_ratio=comp.ratio,
        loop_threshold=comp.threshold,
    )


def clock_note(base_mhz: float | None, cur_mhz: float | None, ratio: float) -> str:
    """Where the SM clock the samples ran at differs between the sides (by a 15 MHz step or more): both clocks and
    the change in cycles (time x clock), so a slowdown that is the power cap's lower clock reads as such."""
    if not base_mhz or not cur_mhz or abs(cur_mhz / base_mhz - 1.0) < CLOCK_NOTE_MIN:
        return ""
    cycles = ratio * cur_mhz / base_mhz
    return f"SM clock {base_mhz:.0f} -> {cur_mhz:.0f} MHz ({cur_mhz / base_mhz - 1.0:+.1%}): {cycles - 1.0:+.1%} in cycles"


def _samples(case: CaseResult) -> tuple[float, ...]:
    """A timed case's samples; a row written before samples were kept has its median alone."""
    return case.samples_ms or ((case.median_ms,) if case.median_ms is not None else ())


def _ratio_verdicts(base: Side, cur: Side, cfg: GateConfig) -> list[RatioVerdict]:
    out: list[RatioVerdict] = []
    for bundled, ref in cfg.ratio_pairs:
        shapes = sorted({c.shape_key for c in base.cases.values() if c.provider == bundled})
        for shape in shapes:
            quad = [side.cases.get(f"{p}|{shape}") for side in (base, cur) for p in (bundled, ref)]
            timed = [q for q in quad if q is not None and q.status == OK and q.median_ms]
            if len(timed) < len(quad):
                continue
            bb, br, cb, cr = (_samples(q) for q in timed)
            nbb, nbr, ncb, ncr = (q.n for q in timed)
            change = cfg.threshold_for(bundled)
            key = f"ratio|{bundled}|{ref}|{shape}"
            clocks = [q.sm_clock_mhz or 0.0 for q in timed]
            # the ratio in cycles: the bundled kernel's clock move over the reference's (each provider's clock is
            # the power cap's answer to its own kernel), so the rule's "slower in time and in cycles" holds here
            # too: an H100 ci pair of the same code moved triton / sdpa-flash +1.6% in time, +0.8% in cycles
            # (triton 1800 -> 1785 MHz, sdpa-flash 1980 both times)
            clock = (clocks[2] / clocks[0]) / (clocks[3] / clocks[1]) if all(clocks) else 1.0
            comp = _compare([cb, br], [cr, bb], change, cfg, key, sizes=[ncb, nbr, ncr, nbb], clock=clock)
            out.append(
                RatioVerdict(
                    shape,
                    bundled,
                    ref,
                    float(np.median(bb) / np.median(br)),
                    float(np.median(cb) / np.median(cr)),
                    comp.ratio,
                    comp.ci_low,
                    comp.ci_high,
                    comp.threshold,
                    comp.verdict,
                    comp.band,
                    change,
                )
            )
    return out


def to_json(result: GateResult) -> str:
    return json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"

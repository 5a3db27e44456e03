"""Does the gate hold its targets on these runs? False alarms between same-code runs, and injected slowdowns.

    python benchmarks/gate_check.py RUN RUN [RUN...] [--threshold 0.03] [--bundled triton] [--learn]
    python benchmarks/gate_check.py RUN                     # one run: slowdowns injected into a copy of itself

The runs must be of the same code on one GPU model (a sweep of one preset repeated; env.json's fingerprint says
so where recorded). For every ordered pair (baseline A, current B) of distinct runs:
  - A/A: `flashbench gate` of A against B must fail nothing: no case, in-run ratio or loop time regressed;
  - injection: B's bundled rows (provider names starting with --bundled) made slower by the threshold and by
    10% (their GPU and loop samples multiplied), gated against A. The slowdown of the threshold's size must fail
    on at least 90% of the bundled cases whose noise allows it (band <= threshold / 2, gate_rule.py), the 10%
    slowdown on all of them.
With one run, the injection is into a copy of that run, gated against the run itself (no A/A pair to check).
With --learn (three runs or more): each run in turn is left out, the others are learned into a baseline
(`flashbench gate --learn`), and the left-out run is the current side, so every band is tested on a run it
did not see.

Exit status: 0 when every target holds, 1 when one does not, 2 on bad input. The numbers it prints are what
docs/gate.md reports (with the command that produced them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path

from flashbench.analysis.gate import CANNOT_JUDGE, REGRESSION, GateResult, run_gate
from flashbench.errors import FlashbenchError
from flashbench.results.baseline import learn_baseline
from flashbench.results.env import ENV_FILE
from flashbench.results.rows import OK, Row, append_row, read_rows

DETECT_SHARE = 0.9  # the threshold-sized slowdown fails on at least this share of the judgeable cases
BIG = 0.10  # ... and a slowdown of this size on all of them
SHOW_MISSED = 10  # misses of the threshold-sized slowdown listed


@dataclass
class Tally:
    """One kind of comparison summed over pairs: how many judgeable cases, how many failed."""

    judgeable: int = 0
    caught: int = 0
    bundled: int = 0  # bundled cases compared, judgeable or not
    caught_any: int = 0  # failed among all bundled cases
    missed: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.caught / self.judgeable if self.judgeable else 1.0


@dataclass
class Check:
    change: float
    pairs: int = 0
    compared: int = 0  # cases compared over the A/A pairs
    cannot_judge: int = 0  # ... of which not judgeable at `change`
    false_alarms: list[str] = field(default_factory=list)
    small: Tally = field(default_factory=Tally)  # slowdown of `change`
    big: Tally = field(default_factory=Tally)  # slowdown of BIG

    @property
    def passed(self) -> bool:
        return not self.false_alarms and self.small.share >= DETECT_SHARE and self.big.share == 1.0

    def lines(self) -> list[str]:
        pct = f"{self.change:.0%}" if self.change * 100 == round(self.change * 100) else f"{self.change:.1%}"
        return [
            f"threshold {pct}: {self.pairs} gate comparisons",
            f"  same-code pairs: {len(self.false_alarms)} false alarms over {self.compared} cases compared "
            f"({self.cannot_judge} of them 'cannot judge at {pct}')",
            *(f"    false alarm: {f}" for f in self.false_alarms),
            f"  {pct} slower: failed on {self.small.caught} of {self.small.judgeable} judgeable bundled cases "
            f"({self.small.share:.1%}; target >= {DETECT_SHARE:.0%}); on {self.small.caught_any} of all "
            f"{self.small.bundled}",
            f"  {BIG:.0%} slower: failed on {self.big.caught} of {self.big.judgeable} judgeable bundled cases "
            f"({self.big.share:.1%}; target 100%); on {self.big.caught_any} of all {self.big.bundled}",
            *(f"    missed at {pct}: {m}" for m in self.small.missed[:SHOW_MISSED]),
            *(f"    missed at {BIG:.0%}: {m}" for m in self.big.missed),
            "  targets " + ("met" if self.passed else "NOT met"),
        ]


def slowed(src: Path, dst: Path, factor: float, bundled: str) -> Path:
    """A copy of run `src` whose ok rows of providers starting with `bundled` take `factor` times as long."""
    dst.mkdir(parents=True)
    (dst / ENV_FILE).write_bytes((src / ENV_FILE).read_bytes())
    for row in read_rows(src):
        if row.status == OK and row.provider.startswith(bundled):
            data = row.to_dict()
            for name in ("samples_ms", "loop_samples_ms"):
                data[name] = [s * factor for s in data[name] or []]
            for name in ("median_ms", "p20_ms", "p80_ms", "loop_ms", "host_ms"):
                if data[name] is not None:
                    data[name] *= factor
            row = Row.from_dict(data)
        append_row(dst, row)
    return dst


def tally_injection(result: GateResult, bundled: str, tally: Tally, label: str) -> None:
    """Count the bundled cases of one injected comparison; judgeable = the gate's own noise band of the case is
    at most half the threshold (the cases it reports "cannot judge at X%" when they did not fail are not)."""
    for c in result.cases:
        if not c.key.startswith(bundled) or c.ratio is None:
            continue
        failed = c.verdict == REGRESSION
        tally.bundled += 1
        tally.caught_any += failed
        if c.noise is not None and c.target is not None and c.noise <= c.target / 2.0:
            tally.judgeable += 1
            tally.caught += failed
            if not failed:
                tally.missed.append(f"{label}: {c.key} {c.ratio - 1:+.1%} ({c.label}; {c.note or 'no note'})")


def check(
    runs: list[Path], change: float, bundled: str = "triton", learn: bool = False, work: Path | None = None
) -> Check:
    """The whole check (module docstring); `work` holds the derived runs (a temporary folder by default)."""
    if learn and len(runs) < 3:
        raise FlashbenchError("--learn needs three runs or more: two to learn from and one left out")
    out = Check(change)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmp_dir = Path(tmp)
        if learn:
            pairs = []
            for i, left_out in enumerate(runs):
                others = [r for r in runs if r != left_out]
                baseline, _ = learn_baseline(others, tmp_dir / f"learned-{i}.json")
                pairs.append((baseline, left_out))
        elif len(runs) == 1:
            pairs = [(runs[0], runs[0])]
        else:
            pairs = list(permutations(runs, 2))
        for n, (base, cur) in enumerate(pairs):
            out.pairs += 1
            aa = run_gate(base, cur, threshold=change)
            if base != cur:
                for c in aa.cases:
                    if c.ratio is not None:
                        out.compared += 1
                        out.cannot_judge += c.verdict == CANNOT_JUDGE
                alarms = [f"{c.key} {c.ratio - 1:+.1%}" for c in aa.cases if c.verdict == REGRESSION]
                alarms += [f"{c.key} loop {c.loop_ratio - 1:+.1%}" for c in aa.loop_regressions]
                alarms += [f"in-run ratio {r.shape} {r.change - 1:+.1%}" for r in aa.ratio_regressions]
                out.false_alarms += [f"{Path(base).name} -> {Path(cur).name}: {a}" for a in alarms]
            for factor, tally in ((1.0 + change, out.small), (1.0 + BIG, out.big)):
                slow = slowed(Path(cur), tmp_dir / f"slow-{n}-{factor}", factor, bundled)
                result = run_gate(base, slow, threshold=change)
                tally_injection(result, bundled, tally, f"{Path(base).name} -> {Path(cur).name}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of the same code")
    parser.add_argument("--threshold", type=float, default=0.03, help="the slowdown to catch (default 0.03)")
    parser.add_argument("--bundled", default="triton", help="provider prefix the slowdown goes into")
    parser.add_argument("--learn", action="store_true", help="learn bands from all runs but the current one")
    args = parser.parse_args(argv)
    try:
        result = check(args.runs, args.threshold, args.bundled, args.learn)
    except FlashbenchError as exc:
        print(f"gate_check: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"runs: {', '.join(str(r) for r in args.runs)}"
        + (" (bands learned, one run left out)" if args.learn else "")
    )
    print("\n".join(result.lines()))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

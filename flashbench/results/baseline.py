"""The two sides the gate compares: a run directory or a saved baseline file, reduced to what the gate needs.

A baseline (``flashbench baseline save RUN --name h100`` -> ``results/baselines/h100.json``) keeps, per case key,
the status, the raw timing samples and their median, the eager-loop samples, the SM clock and whether the GPU
throttled; plus a summary of the environment (GPU model, driver, CUDA, torch, triton, flashbench, the code's
fingerprint, preset). Nothing else: it is committed to git, so it stays small and diffs readably (sorted keys,
samples rounded to the nanosecond).

A learned baseline (``flashbench gate --learn RUN RUN... --baseline FILE``, learn_baseline below) holds the
same, from its first run, plus each case's noise band: how far apart the same code's medians fell across the runs
(learned_band), for the GPU time and the eager-loop time. The gate widens a case's limit to it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flashbench.errors import FlashbenchError
from flashbench.results.env import Environment, read_env
from flashbench.results.paths import make_dir
from flashbench.results.rows import OK, ROWS_FILE, SCHEMA_VERSION, STATUSES, Row, read_rows

BASELINE_FORMAT = "flashbench-baseline"
BASELINES_DIR = Path("results") / "baselines"
# The environment facts the gate compares, in display order. "gpu" and "device" must match (or --allow-mismatch).
ENV_FIELDS: tuple[str, ...] = (
    "gpu", "device", "driver", "cuda", "cudnn", "torch", "triton", "flashbench", "commit", "code", "preset",
    "l2_flush",
)  # fmt: skip
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A baseline keeps at most this many values per case: a longer sample list is stored as that many evenly spaced
# quantiles (the median exactly among them) plus the original count n, and the gate's bootstrap draws n values
# from them. A 100 ms timing budget gives ~1000 samples of a 0.1 ms kernel; 201 keep the file small.
MAX_STORED_SAMPLES = 201


@dataclass(frozen=True)
class CaseResult:
    """One case as the gate sees it."""

    key: str
    status: str
    median_ms: float | None = None
    samples_ms: tuple[float, ...] = ()
    throttled: bool = False
    reason: str = ""
    n_samples: int = 0  # samples measured; more than len(samples_ms) where a baseline stored quantiles
    sm_clock_mhz: float | None = None  # the median SM clock during the samples (None: not recorded)
    loop_samples_ms: tuple[float, ...] = ()  # per-call time of each back-to-back loop (Row.loop_samples_ms)
    loop_ms: float | None = None  # their median (Row.loop_ms where no samples were kept)
    band: float | None = None  # learned: the same code's medians differed by up to this fraction across runs
    loop_band: float | None = None  # the same for the loop time
    band_runs: int = 0  # how many runs the learned bands came from

    @property
    def n(self) -> int:
        return max(self.n_samples, len(self.samples_ms))

    @property
    def provider(self) -> str:
        return self.key.split("|", 1)[0]

    @property
    def shape_key(self) -> str:
        return self.key.split("|", 1)[-1]


@dataclass
class Side:
    """A baseline or a current run: where it came from, its environment summary, its cases by key."""

    label: str
    env: dict[str, str]
    cases: dict[str, CaseResult] = field(default_factory=dict)


def load_side(path: str | Path) -> Side:
    """A run directory (or its rows.jsonl) or a baseline .json file; anything else is a one-line error."""
    path = Path(path)
    if path.is_file() and path.name == ROWS_FILE:
        path = path.parent
    if path.is_dir():
        return _side_from_run(path)
    if path.is_file():
        return _side_from_file(path)
    raise FlashbenchError(f"not found: {path} (expected a run directory or a baseline .json)")


def _side_from_run(run_dir: Path) -> Side:
    return side_of(run_dir.name, read_env(run_dir), read_rows(run_dir))


def side_of(label: str, env: Environment, rows: list[Row]) -> Side:
    """A run already read (its environment record and rows) as the gate sees it."""
    cases = {row.key: _case_from_row(row) for row in rows}
    return Side(label=label, env=summarize_env(env, rows), cases=cases)


def _case_from_row(row: Row) -> CaseResult:
    samples = tuple(float(s) for s in row.samples_ms or ())
    median = _median(samples) if samples else row.median_ms  # the statistic the gate tests: from the samples
    reason = "" if row.status == OK else (row.reason or "")[:200]
    clock = float(row.sm_clock_mhz) if row.sm_clock_mhz else None
    loops = tuple(float(s) for s in row.loop_samples_ms or ())
    loop_ms = _median(loops) if loops else row.loop_ms
    return CaseResult(
        row.key,
        row.status,
        median,
        samples,
        bool(row.throttled),
        reason,
        sm_clock_mhz=clock,
        loop_samples_ms=loops,
        loop_ms=float(loop_ms) if loop_ms else None,
    )


def _median(samples: tuple[float, ...]) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _quantiles(samples: tuple[float, ...], count: int) -> tuple[float, ...]:
    """`count` evenly spaced quantiles (linear interpolation; the middle one is the median)."""
    ordered = sorted(samples)
    out = []
    for i in range(count):
        pos = i * (len(ordered) - 1) / (count - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return tuple(out)


def l2_flush(env: Environment) -> str:
    """How the run emptied the L2 before each sample: its spec's l2_flush; a GPU run whose spec predates the
    field wrote (engine/timing.py L2Flusher); a CPU run flushes nothing."""
    if env.device == "cpu":
        return "none"
    if env.spec is None:
        return ""
    return str(env.spec.get("l2_flush") or "write")


def summarize_env(env: Environment, rows: list[Row]) -> dict[str, str]:
    """The compared environment facts as strings ("" where unknown). GPU and device fall back to the rows'."""
    facts = {
        "gpu": env.gpu_name,
        "device": env.device,
        "driver": env.driver,
        "cuda": env.cuda,
        "cudnn": env.cudnn,
        "torch": env.torch,
        "triton": env.triton,
        "flashbench": env.flashbench,
        "commit": env.git_sha[:12] + ("+dirty" if env.git_sha and env.git_dirty else ""),
        "code": env.fingerprint,
        "preset": env.preset,
        "l2_flush": l2_flush(env),
    }
    out = {name: _stringify(facts[name]) for name in ENV_FIELDS}
    # The GPU the rows ran on beats env.json's first GPU: on a multi-GPU host they can differ.
    measured = [r for r in rows if r.status == OK] or rows
    gpus = Counter(r.gpu for r in measured if r.gpu)
    if gpus:
        out["gpu"] = gpus.most_common(1)[0][0]
    devices = Counter(r.device for r in measured if r.device)
    if devices and not out["device"]:
        out["device"] = devices.most_common(1)[0][0]
    return out


def _stringify(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _side_from_file(path: Path) -> Side:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlashbenchError(f"{path} is corrupt: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise FlashbenchError(
            f"{path} is not a flashbench baseline (save one with `flashbench baseline save`)"
        )
    if data.get("schema") != SCHEMA_VERSION:
        raise FlashbenchError(
            f"{path} has baseline schema {data.get('schema')!r}; this flashbench reads schema {SCHEMA_VERSION}"
        )
    env, raw_cases = data.get("env"), data.get("cases")
    if not isinstance(env, dict) or not isinstance(raw_cases, dict):
        raise FlashbenchError(f"{path} is corrupt: 'env' and 'cases' must be JSON objects")
    cases = {}
    for key, entry in raw_cases.items():
        try:
            cases[key] = _case_from_entry(key, entry)
        except (TypeError, ValueError, AttributeError) as exc:
            raise FlashbenchError(f"{path} is corrupt: case {key!r}: {exc}") from None
    summary = {name: _stringify(env.get(name)) for name in ENV_FIELDS}
    return Side(label=path.name, env=summary, cases=cases)


def _case_from_entry(key: str, entry: dict[str, Any]) -> CaseResult:
    status = entry["status"]
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    samples = tuple(float(s) for s in entry.get("samples_ms") or ())
    median = _median(samples) if samples else entry.get("median_ms")
    median = None if median is None else float(median)
    n = int(entry.get("n", len(samples)))
    clock = entry.get("sm_clock_mhz")
    loops = tuple(float(s) for s in entry.get("loop_samples_ms") or ())
    loop_ms = _median(loops) if loops else entry.get("loop_ms")
    return CaseResult(
        key,
        status,
        median,
        samples,
        bool(entry.get("throttled", False)),
        str(entry.get("reason", "")),
        n,
        float(clock) if isinstance(clock, (int, float)) and clock > 0 else None,
        loops,
        None if loop_ms is None else float(loop_ms),
        _fraction(entry.get("band")),
        _fraction(entry.get("loop_band")),
        int(entry.get("band_runs", 0)),
    )


def _fraction(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not 0.0 <= value < 10.0:
        raise ValueError(f"a noise band must be a fraction >= 0, got {value!r}")
    return float(value)


def _stored(samples: tuple[float, ...]) -> tuple[float, ...]:
    return _quantiles(samples, MAX_STORED_SAMPLES) if len(samples) > MAX_STORED_SAMPLES else samples


def baseline_dict(side: Side, name: str, source: str) -> dict[str, Any]:
    """The JSON document of a baseline: sorted, samples rounded to 1 ns, no timestamps."""
    cases: dict[str, Any] = {}
    for key in sorted(side.cases):
        case = side.cases[key]
        entry: dict[str, Any] = {"status": case.status}
        if case.median_ms is not None:
            entry["median_ms"] = round(case.median_ms, 6)
        if case.samples_ms:
            stored = case.samples_ms
            if len(stored) > MAX_STORED_SAMPLES:
                stored = _quantiles(stored, MAX_STORED_SAMPLES)
                entry["n"] = case.n
            entry["samples_ms"] = [round(s, 6) for s in stored]
        if case.throttled:
            entry["throttled"] = True
        if case.reason:
            entry["reason"] = case.reason
        if case.sm_clock_mhz:
            entry["sm_clock_mhz"] = case.sm_clock_mhz
        if case.loop_samples_ms:
            entry["loop_samples_ms"] = [round(s, 6) for s in _stored(case.loop_samples_ms)]
        elif case.loop_ms:
            entry["loop_ms"] = round(case.loop_ms, 6)
        for band in ("band", "loop_band"):
            if getattr(case, band) is not None:
                entry[band] = round(getattr(case, band), 6)
        if case.band_runs:
            entry["band_runs"] = case.band_runs
        cases[key] = entry
    return {
        "format": BASELINE_FORMAT,
        "schema": SCHEMA_VERSION,
        "name": name,
        "source": source,
        "env": {k: side.env.get(k, "") for k in ENV_FIELDS},
        "cases": cases,
    }


def save_baseline(
    run: str | Path, name: str, out_dir: str | Path = BASELINES_DIR, force: bool = False
) -> Path:
    """Promote a run directory to ``<out_dir>/<name>.json``; returns the path written."""
    if not _NAME_RE.match(name):
        raise FlashbenchError(f"baseline name {name!r}: use letters, digits, '.', '_' or '-' (e.g. h100)")
    run = Path(run)
    if not run.is_dir() and not (run.is_file() and run.name == ROWS_FILE):
        raise FlashbenchError(f"not a run directory: {run}")
    side = load_side(run)
    if not any(c.status == OK for c in side.cases.values()):
        raise FlashbenchError(f"{run}: no case finished ok; nothing to use as a baseline")
    target = Path(out_dir) / f"{name}.json"
    if target.exists() and not force:
        raise FlashbenchError(f"{target} exists (pass --force to replace it)")
    make_dir(target.parent, "--out-dir")
    try:
        target.write_text(dumps_baseline(baseline_dict(side, name, source=side.label)), encoding="utf-8")
    except OSError as exc:
        raise FlashbenchError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def learned_band(medians: Sequence[float]) -> float:
    """A case's noise band from the medians of k same-code runs: their range (max / min - 1) x (k + 1) / (k - 1).

    The range of k runs understates how far the next run can fall: k draws from a bounded drift span on average
    (k - 1) / (k + 1) of its width, so the range is scaled up to the width (x3 for 2 runs, x2 for 3, x1.5 for 5).
    Without it, in tests/test_gate_stats.py's simulation of runs offset by up to +-2.5%, bands learned from 3 runs
    let 8 of 200 same-code pairs fail a 5% gate (20 without a learned band); with it, none.
    """
    k = len(medians)
    return (max(medians) / min(medians) - 1.0) * (k + 1) / (k - 1)


def learn_baseline(runs: Sequence[str | Path], out: str | Path, force: bool = False) -> tuple[Path, Side]:
    """Write `out`: the first run as a baseline, plus per case the noise band of the same code across all runs.

    The runs must be of one GPU model and, where they recorded it, one code fingerprint: a band learned across a
    code change would hide the change it was made to catch. A case gets a band where at least two runs measured
    it ok. Returns the path written and the learned side.
    """
    if len(runs) < 2:
        raise FlashbenchError(f"--learn needs at least two runs of the same code, got {len(runs)}")
    out = Path(out)
    if out.suffix != ".json" or out.is_dir():
        raise FlashbenchError(f"--learn writes a baseline .json file, not {out} (pass --baseline NAME.json)")
    if out.exists() and not force:
        raise FlashbenchError(f"{out} exists (pass --force to replace it)")
    sides = [load_side(run) for run in runs]
    first = sides[0]
    for side in sides[1:]:
        for name in ("gpu", "device", "code"):
            ours, theirs = first.env.get(name, ""), side.env.get(name, "")
            if ours and theirs and ours != theirs:
                what = "ran other code" if name == "code" else f"has another {name}"
                raise FlashbenchError(
                    f"--learn: {side.label} {what} than {first.label} ({theirs} vs {ours}); "
                    "noise bands come from runs of the same code on one GPU model"
                )
    cases = {}
    for key, case in first.cases.items():
        found = [s.cases[key] for s in sides if key in s.cases and s.cases[key].status == OK]
        medians = [c.median_ms for c in found if c.median_ms]
        loops = [c.loop_ms for c in found if c.loop_ms]
        cases[key] = replace(
            case,
            band=learned_band(medians) if len(medians) >= 2 else None,
            loop_band=learned_band(loops) if len(loops) >= 2 else None,
            band_runs=len(medians) if len(medians) >= 2 else 0,
        )
    learned = Side(label=out.name, env=first.env, cases=cases)
    doc = baseline_dict(learned, out.stem, source=first.label)
    doc["learned_from"] = [s.label for s in sides]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(dumps_baseline(doc), encoding="utf-8")
    except OSError as exc:
        raise FlashbenchError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out, learned


def dumps_baseline(doc: dict[str, Any]) -> str:
    """JSON with one line per case, so a baseline update reads as a per-case diff."""
    head = [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in doc.items() if k != "cases"]
    cases = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc["cases"].items()]
    return "{\n" + ",\n".join(head) + ',\n "cases": {\n' + ",\n".join(cases) + "\n }\n}\n"

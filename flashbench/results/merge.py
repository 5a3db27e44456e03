"""`flashbench merge RUN... --out DIR`: the shards of one sweep (`sweep --shard i/n`) as one run directory.

Rules:
    refused (exit 2)  runs of different sweeps (sweep_id differs: another spec, provider list or version),
                      runs of different flashbench versions, runs without a sweep_id, shards of different
                      counts (1/2 with 1/3), the same shard twice, an --out that is one of the inputs
    warned            a shard of the sweep is missing: the merged env.json lists the present and missing ones
rows.jsonl is every run's rows (last row per case key), in shard order; env.json is the first shard's record
with `shards` (each shard's environment summary), `gpus` (the union), the wall time of the slowest shard
(`wall_s`, the sweep's elapsed time when the shards ran at once) and their sum (`wall_s_sum`).
"""

from __future__ import annotations

import datetime as _dt
import json
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flashbench.errors import FlashbenchError
from flashbench.results.env import ENV_FILE, Environment, format_shard, parse_shard, read_env, write_env
from flashbench.results.paths import check_writable_dir, make_dir
from flashbench.results.rows import ROWS_FILE, Row, read_rows, write_rows

# Per-shard facts kept in the merged env.json's `shards` list.
_SUMMARY_KEYS = (
    "hostname",
    "gpu",
    "driver",
    "cuda",
    "torch",
    "triton",
    "git_sha",
    "git_dirty",
    "fingerprint",
    "started",
    "finished",
    "wall_s",
    "wall_s_total",
    "planned_cases",
    "status_counts",
    "devices_used",
    "interrupted",
)


@dataclass
class MergeResult:
    run_dir: Path
    rows: list[Row]
    env: Environment
    missing: list[int] = field(default_factory=list)  # 1-based shard indices not among the inputs


def merge(runs: list[str | Path], out: str | Path, force: bool = False) -> MergeResult:
    """Combine shard run directories into `out` (see the module docstring). Raises FlashbenchError (exit 2)."""
    if not runs:
        raise FlashbenchError("merge: name at least one run directory")
    out = Path(out)
    paths = [Path(r) for r in runs]
    if any(p.resolve() == out.resolve() for p in paths):
        raise FlashbenchError(f"merge: --out {out} is one of the runs being merged")
    check_writable_dir(out, "--out")  # before reading every shard
    envs = [read_env(p) for p in paths]
    _check_same(paths, envs, "flashbench", "flashbench versions")
    for path, env in zip(paths, envs, strict=True):
        if not env.sweep_id:
            raise FlashbenchError(
                f"merge: {path} has no sweep_id (a run from before --shard): cannot merge it"
            )
    _check_same(paths, envs, "sweep_id", "sweeps (sweep_id)")
    parsed = [parse_shard(env.shard) or (1, 1) for env in envs]
    counts = {n for _, n in parsed}
    if len(counts) > 1:
        what = ", ".join(f"{p} is {format_shard(s)}" for p, s in zip(paths, parsed, strict=True))
        raise FlashbenchError(f"merge: shards of different counts ({what})")
    count = counts.pop()
    seen: dict[int, Path] = {}
    for path, (index, _) in zip(paths, parsed, strict=True):
        if index in seen:
            raise FlashbenchError(f"merge: shard {index}/{count} given twice ({seen[index]} and {path})")
        seen[index] = path
    missing = [i for i in range(1, count + 1) if i not in seen]
    if missing:
        warnings.warn(
            f"merge: shard{'s' if len(missing) > 1 else ''} "
            f"{', '.join(f'{i}/{count}' for i in missing)} missing; the merged run lacks their cases",
            stacklevel=2,
        )
    order = sorted(range(len(paths)), key=lambda j: parsed[j][0])
    latest: dict[str, Row] = {}
    for j in order:
        for row in read_rows(paths[j]):
            latest.pop(row.key, None)  # the last answer per case key, as read_rows does within a run
            latest[row.key] = row
    rows = list(latest.values())
    env = _merged_env([paths[j] for j in order], [envs[j] for j in order], rows, count, missing)
    env.run_dir = str(out)
    _prepare_out(out, force)
    write_rows(out, rows)
    write_env(out, env)
    return MergeResult(out, rows, env, missing)


def _check_same(paths: list[Path], envs: list[Environment], key: str, what: str) -> None:
    values = {str(getattr(env, key)) for env in envs}
    if len(values) > 1:
        listed = ", ".join(f"{getattr(env, key)} ({path})" for path, env in zip(paths, envs, strict=True))
        raise FlashbenchError(f"merge: runs of different {what}: {listed}")


def _merged_env(
    paths: list[Path], envs: list[Environment], rows: list[Row], count: int, missing: list[int]
) -> Environment:
    summaries = []
    for path, shard_env in zip(paths, envs, strict=True):
        summary = {key: getattr(shard_env, key) for key in _SUMMARY_KEYS}
        summary.update(
            shard=shard_env.shard or "1/1", run_dir=str(path), gpus=shard_env.gpus
        )
        summaries.append(summary)
    gpus: list[Any] = []
    for shard_env in envs:
        for gpu in shard_env.gpus:
            if json.dumps(gpu, sort_keys=True, default=str) not in {
                json.dumps(g, sort_keys=True, default=str) for g in gpus
            }:
                gpus.append(gpu)
    names = list(dict.fromkeys(e.gpu for e in envs if e.gpu))
    walls = [float(e.wall_s_total or e.wall_s or 0.0) for e in envs]
    starts = [e.started for e in envs if e.started]
    ends = [e.finished for e in envs if e.finished]
    return replace(
        envs[0],
        previous_runs=[],
        argv=[],
        run_dir=None,
        shard=None,
        shard_count=count,
        shards_present=sorted(parse_shard(s["shard"])[0] for s in summaries),
        shards_missing=missing,
        shards=summaries,
        merged=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        gpus=gpus,
        gpu=" + ".join(names),
        # shards of different code (a rebuilt checkout between shards): every fingerprint, so none passes as "same"
        fingerprint=" + ".join(dict.fromkeys(e.fingerprint for e in envs if e.fingerprint)),
        hostname=", ".join(dict.fromkeys(e.hostname for e in envs)),
        started=min(starts) if starts else None,
        finished=max(ends) if ends else None,
        wall_s=round(max(walls), 3),
        wall_s_total=round(max(walls), 3),
        wall_s_sum=round(sum(walls), 3),
        planned_cases=sum(e.planned_cases or 0 for e in envs),
        status_counts=dict(Counter(r.status for r in rows)),
        compile_s_total=round(sum(e.compile_s_total or 0.0 for e in envs), 3),
        interrupted=any(bool(e.interrupted) for e in envs),
    )


def _prepare_out(out: Path, force: bool) -> None:
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise FlashbenchError(f"merge: {out} is not empty: add --force to replace its results")
        for name in (ROWS_FILE, ENV_FILE):
            (out / name).unlink(missing_ok=True)
    make_dir(out, "--out")

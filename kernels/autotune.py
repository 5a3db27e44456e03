"""Config autotuning for the bundled kernels: the candidates timed in rotation, the pick cached on disk.

Why not `triton.autotune`: it times the candidates one after another, once each, so a GPU that heats up and
lowers its clocks while it tunes favours whichever configs come first (on an H100 the pick for one shape
changed from one run to the next, BENCHMARKS.md); and it silently skips its on-disk cache when a config has a
pre-hook, which the host tensor descriptors need (triton/runtime/autotuner.py, `check_disk_cache`).

Per key (kernel name, sequence-length bucket, compile-time arguments, argument dtypes, GPU):
  1. every candidate is compiled and run once; one that does not fit the GPU (out of shared memory or
     registers, a ptxas failure) is dropped;
  2. ROUNDS rounds time every remaining candidate with triton.testing.do_bench (median of its samples, L2
     flushed before each), the order reversed every other round, so each candidate is sampled across the
     whole tuning window rather than in one slice of it;
  3. the candidate with the lowest median of its round medians wins (ties: the earlier in the space).
The pick and every candidate's round times are kept in memory and in a JSON file per kernel under
$FLASHBENCH_HOME/autotune (else ${XDG_CACHE_HOME:-~/.cache}/flashbench/autotune), named by a hash of the
kernel's source (Triton's cache key), the Triton version, the GPU name and the candidate list, so an edited
kernel, another Triton or another GPU tunes afresh. FLASHBENCH_AUTOTUNE_CACHE=0 keeps picks in memory only.
A corrupt or unreadable cache file is ignored (tuned again and rewritten); writes are atomic (os.replace), so
processes tuning side by side can lose each other's entries but never corrupt the file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROUNDS = 3
WARMUP_MS = 10  # per candidate and round, do_bench's warmup and measuring windows
REP_MS = 40

# key -> the tuned config; one process-wide table for every kernel (the key starts with the kernel's name)
_MEMORY: dict[tuple, dict[str, Any]] = {}
# key -> {"config": ..., "rounds_ms": [[...] per candidate]} of the most recent tuning in this process
_REPORTS: dict[tuple, dict[str, Any]] = {}


def disk_cache_enabled() -> bool:
    return os.environ.get("FLASHBENCH_AUTOTUNE_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    home = os.environ.get("FLASHBENCH_HOME")
    if home:
        return Path(home) / "autotune"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashbench" / "autotune"


def cache_file(kernel_name: str, identity: Sequence[str]) -> Path:
    """The JSON file of one kernel build: `identity` names the kernel source, Triton, GPU and candidates."""
    digest = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:16]
    return cache_dir() / f"{kernel_name}-{digest}.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Merge one entry into the file; atomic replace. A cache that cannot be written is not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path)
        data[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


def _valid(config: Any, candidates: Sequence[dict[str, Any]]) -> bool:
    return isinstance(config, dict) and config in candidates


def _bench_ms(fn: Callable[[], None]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))


def lookup(key: tuple) -> dict[str, Any] | None:
    """The pick for `key` made or read earlier in this process (no disk access: the per-call fast path)."""
    config = _MEMORY.get(key)
    return None if config is None else dict(config)


def tune(
    key: tuple,
    candidates: Sequence[dict[str, Any]],
    run: Callable[[dict[str, Any]], None],
    *,
    unfit: tuple[type[BaseException], ...],
    path: Path | None,
    bench: Callable[[Callable[[], None]], float] | None = None,
) -> dict[str, Any]:
    """The best of `candidates` for `key`; `run(config)` launches the kernel once with a config.

    `unfit` are the exceptions that mean "this config does not fit the GPU" (the candidate is dropped);
    `path` is the kernel's cache file (None: memory only). Raises the last `unfit` exception when no
    candidate runs. `bench(fn)` replaces the do_bench timing (tests): fn is functools.partial(run, config),
    the result milliseconds.
    """
    if key in _MEMORY:
        return dict(_MEMORY[key])
    skey = json.dumps([str(part) for part in key])
    if path is not None:
        hit = _read(path).get(skey)
        if isinstance(hit, dict) and _valid(hit.get("config"), candidates):
            _MEMORY[key] = dict(hit["config"])
            return dict(hit["config"])
    bench = bench or _bench_ms
    alive: list[int] = []
    failure: BaseException | None = None
    for i, config in enumerate(candidates):  # compile and run each once
        try:
            run(config)
        except unfit as exc:
            failure = exc
            continue
        alive.append(i)
    if not alive:
        assert failure is not None
        raise failure
    rounds: dict[int, list[float]] = {i: [] for i in alive}
    for r in range(ROUNDS):
        for i in alive if r % 2 == 0 else reversed(alive):
            rounds[i].append(bench(functools.partial(run, candidates[i])))
    best = min(alive, key=lambda i: (statistics.median(rounds[i]), i))
    config = dict(candidates[best])
    _MEMORY[key] = config
    report = {
        "config": config,
        "candidates": [candidates[i] for i in alive],
        "rounds_ms": [rounds[i] for i in alive],
    }
    _REPORTS[key] = report
    if path is not None and disk_cache_enabled():
        _write(path, skey, report)
    return dict(config)


def last_report(name: str) -> dict[str, Any] | None:
    """The most recent tuning of kernel `name` in this process (its pick, candidates and round times)."""
    hits = [v for k, v in _REPORTS.items() if k and k[0] == name]
    return hits[-1] if hits else None


def forget() -> None:
    """Drop the in-memory picks (the disk cache stays): the next call of each key reads the disk or tunes."""
    _MEMORY.clear()
    _REPORTS.clear()

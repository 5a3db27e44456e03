"""Config autotuning for the bundled kernels: candidates timed as the sweep times a case, in rotation; the
pick cached on disk.

Why not `triton.autotune`: it times the candidates one after another with short do_bench windows, and it
silently skips its on-disk cache when a config has a pre-hook, which the host tensor descriptors need
(triton/runtime/autotuner.py, `check_disk_cache`). What an H100 showed (docs/benchmarks.md): near its power
limit it lowers its clocks by 10-15% within about 0.1 s of sustained attention work, and tiles differ in
how much they lose; 50 ms windows (do_bench's) and samples interleaved across candidates both ranked tiles
by their boost-clock speed and picked ones that the sweep then measured 2-12% slower than another candidate.

Per key (kernel name, sequence-length bucket, compile-time arguments, Q's dtype, GPU):
  1. every candidate is compiled and run once; one that does not fit the GPU (out of shared memory or
     registers, a ptxas failure) is dropped;
  2. ROUNDS rounds, the order reversed every other round, each timing every candidate exactly as the sweep
     times a case (flashbench.engine.timing.time_cuda: WARMUP_MS of warm-up, then REP_MS of samples, L2 flushed
     before each, CUDA events), so each candidate is judged at the clocks it sustains;
  3. the candidate with the lowest median of its round medians wins (ties: the earlier in the space): one
     round disturbed by a clock change does not decide (seen on an H100 with two rounds: one candidate's
     rounds 2.42 / 2.72 ms).
The pick and every candidate's round medians are kept in memory and in a JSON file per kernel under
$FLASHBENCH_HOME/autotune (else ${XDG_CACHE_HOME:-~/.cache}/flashbench/autotune), named by a hash of the
kernel's source (Triton's cache key), the Triton version, the GPU name and the candidate list, so an edited
kernel, another Triton or another GPU tunes afresh. FLASHBENCH_AUTOTUNE_CACHE=0 neither reads nor writes the
files (picks stay in memory).
A corrupt or unreadable cache file is ignored (tuned again and rewritten); writes are atomic (os.replace).
Processes that share the cache directory (the workers of `--gpus`, or sweeps side by side on one host) tune a key
once: the first takes a lock file beside the cache file for that key (an advisory flock, released when it ends or
dies) and tunes; the others wait on the lock, then read its pick, so no two compile and time the same candidates.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROUNDS = 3
WARMUP_MS = 50.0  # per candidate and round: the sweep's defaults (flashbench.engine.timing.time_cuda)
REP_MS = 100.0

# key -> the tuned config; one process-wide table for every kernel (the key starts with the kernel's name)
_MEMORY: dict[tuple, dict[str, Any]] = {}
# key -> {"config": ..., "median_ms": [...], "rounds_ms": [...]} of the most recent tuning in this process
_REPORTS: dict[tuple, dict[str, Any]] = {}


def disk_cache_enabled() -> bool:
    return os.environ.get("FLASHBENCH_AUTOTUNE_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    from flashbench.gpu.hardware import state_dir  # on a tuning miss only: keeps `import kernels` light

    return state_dir("autotune")


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


def _rotated_ms(fns: Sequence[Callable[[], None]]) -> list[list[float]]:
    """Per zero-argument CUDA callable, its median sample (ms) in each of ROUNDS rounds (see the module doc)."""
    import torch

    from flashbench.engine.timing import L2Flusher, time_cuda

    flush = L2Flusher(torch.cuda.current_device())
    out: list[list[float]] = [[] for _ in fns]
    for r in range(ROUNDS):
        for i in range(len(fns)) if r % 2 == 0 else range(len(fns) - 1, -1, -1):
            samples = time_cuda(fns[i], flush=flush, warmup_ms=WARMUP_MS, rep_ms=REP_MS, min_samples=5)
            out[i].append(statistics.median(samples))
    return out


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
    bench: Callable[[Sequence[Callable[[], None]]], list[list[float]]] | None = None,
) -> dict[str, Any]:
    """The best of `candidates` for `key`; `run(config)` launches the kernel once with a config.

    `unfit` are the exceptions that mean "this config does not fit the GPU" (the candidate is dropped);
    `path` is the kernel's cache file (None: memory only). Raises the last `unfit` exception when no
    candidate runs. `bench(fns)` replaces the timing (tests): fns are functools.partial(run, config) of the
    candidates that run, the result a list of round times (milliseconds) per fn.
    """
    if key in _MEMORY:
        return dict(_MEMORY[key])
    skey = json.dumps([str(part) for part in key])
    if path is not None and not disk_cache_enabled():
        path = None
    if path is not None:
        picked = _cached(path, skey, candidates)
        if picked is not None:
            _MEMORY[key] = picked
            return dict(picked)
    with _tuning(path, skey):
        if path is not None:  # another process may have tuned it while this one waited for the lock
            picked = _cached(path, skey, candidates)
            if picked is not None:
                _MEMORY[key] = picked
                return dict(picked)
        return _tune(key, skey, candidates, run, unfit=unfit, path=path, bench=bench)


def cached_pick(key: tuple, candidates: Sequence[dict[str, Any]], path: Path | None) -> dict[str, Any] | None:
    """The pick for `key` this process or the disk cache already holds, without tuning (None: it would tune)."""
    if key in _MEMORY:
        return dict(_MEMORY[key])
    if path is None or not disk_cache_enabled():
        return None
    return _cached(path, json.dumps([str(part) for part in key]), candidates)


def _cached(path: Path, skey: str, candidates: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    hit = _read(path).get(skey)
    if isinstance(hit, dict) and _valid(hit.get("config"), candidates):
        return dict(hit["config"])
    return None


@contextlib.contextmanager
def _tuning(path: Path | None, skey: str) -> Iterator[None]:
    """Hold the lock of one key of a cache file while tuning it (nothing without a file, or where flock is
    missing or the directory cannot be written: each process then tunes on its own, as before)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None  # type: ignore[assignment]
    if path is None or fcntl is None:
        yield
        return
    lock = path.with_name(f"{path.name}.{hashlib.sha256(skey.encode()).hexdigest()[:12]}.lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock, "a")  # noqa: SIM115  (held open for the lock's life)
    except OSError:
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tune(
    key: tuple,
    skey: str,
    candidates: Sequence[dict[str, Any]],
    run: Callable[[dict[str, Any]], None],
    *,
    unfit: tuple[type[BaseException], ...],
    path: Path | None,
    bench: Callable[[Sequence[Callable[[], None]]], list[list[float]]] | None,
) -> dict[str, Any]:
    bench = bench or _rotated_ms
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
    rounds = bench([functools.partial(run, candidates[i]) for i in alive])
    medians = [statistics.median(t) for t in rounds]
    best = min(range(len(alive)), key=lambda j: (medians[j], j))
    config = dict(candidates[alive[best]])
    _MEMORY[key] = config
    report = {
        "config": config,
        "candidates": [candidates[i] for i in alive],
        "median_ms": medians,
        "rounds_ms": rounds,
    }
    _REPORTS[key] = report
    if path is not None:
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

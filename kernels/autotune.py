"""Config autotuning for the bundled kernels: the candidates timed interleaved, the pick cached on disk.

Why not `triton.autotune`: it times the candidates one after another (do_bench, ~100 ms each), so when the GPU
changes its clocks while it tunes (an H100 near its power limit does, by 10-20% within a second) each
candidate is measured under different clocks; on an H100 the pick for one shape changed from run to run, and
a rotation of whole do_bench rounds still picked tiles 5-8% slower than the best (BENCHMARKS.md). It also
silently skips its on-disk cache when a config has a pre-hook, which the host tensor descriptors need
(triton/runtime/autotuner.py, `check_disk_cache`).

Per key (kernel name, sequence-length bucket, compile-time arguments, Q's dtype, GPU):
  1. every candidate is compiled and run once; one that does not fit the GPU (out of shared memory or
     registers, a ptxas failure) is dropped;
  2. the remaining candidates are timed interleaved, one sample each per cycle (L2 flushed before every
     sample, CUDA events around the call), the order reversed every other cycle, for as many cycles as fit
     in about BUDGET_S seconds of GPU time (at least MIN_SAMPLES, at most MAX_SAMPLES): neighbouring samples
     of different candidates run under the same clocks;
  3. the candidate with the lowest median sample wins (ties: the earlier in the space).
The pick and every candidate's sample summary are kept in memory and in a JSON file per kernel under
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

BUDGET_S = 1.0  # GPU time per key spent on timing samples (besides the compile-and-run pass)
MIN_SAMPLES = 5
MAX_SAMPLES = 100
FLUSH_BYTES = 256 * 1024 * 1024  # written before each sample: more than any GPU's L2

# key -> the tuned config; one process-wide table for every kernel (the key starts with the kernel's name)
_MEMORY: dict[tuple, dict[str, Any]] = {}
# key -> {"config": ..., "median_ms": [...], ...} of the most recent tuning in this process
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


def _interleaved_ms(fns: Sequence[Callable[[], None]]) -> list[list[float]]:
    """Milliseconds per sample of each zero-argument CUDA callable, sampled interleaved (see the module doc)."""
    import torch

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def cycles(count: int, first: int = 0) -> list[list[float]]:
        marks = []
        for c in range(first, first + count):
            order = range(len(fns)) if c % 2 == 0 else range(len(fns) - 1, -1, -1)
            for i in order:
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                marks.append((i, start, end))
        torch.cuda.synchronize()
        out: list[list[float]] = [[] for _ in fns]
        for i, start, end in marks:
            out[i].append(start.elapsed_time(end))
        return out

    probe = cycles(1)  # one cycle sizes the rest
    per_cycle_s = sum(t[0] for t in probe) / 1e3 + len(fns) * FLUSH_BYTES / 2e12
    count = int(min(MAX_SAMPLES, max(MIN_SAMPLES, BUDGET_S / max(per_cycle_s, 1e-6)))) - 1
    rest = cycles(count, first=1)
    return [p + r for p, r in zip(probe, rest, strict=True)]


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
    candidates that run, the result a list of samples (milliseconds) per fn.
    """
    if key in _MEMORY:
        return dict(_MEMORY[key])
    skey = json.dumps([str(part) for part in key])
    if path is not None:
        hit = _read(path).get(skey)
        if isinstance(hit, dict) and _valid(hit.get("config"), candidates):
            _MEMORY[key] = dict(hit["config"])
            return dict(hit["config"])
    bench = bench or _interleaved_ms
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
    samples = bench([functools.partial(run, candidates[i]) for i in alive])
    medians = [statistics.median(t) for t in samples]
    best = min(range(len(alive)), key=lambda j: (medians[j], j))
    config = dict(candidates[alive[best]])
    _MEMORY[key] = config
    report = {
        "config": config,
        "candidates": [candidates[i] for i in alive],
        "median_ms": medians,
        "p20_p80_ms": [_quantiles(t) for t in samples],
        "samples": len(samples[0]),
    }
    _REPORTS[key] = report
    if path is not None and disk_cache_enabled():
        _write(path, skey, report)
    return dict(config)


def _quantiles(samples: list[float]) -> list[float]:
    ordered = sorted(samples)
    return [ordered[int(0.2 * (len(ordered) - 1))], ordered[int(0.8 * (len(ordered) - 1))]]


def last_report(name: str) -> dict[str, Any] | None:
    """The most recent tuning of kernel `name` in this process (its pick, candidates and sample summary)."""
    hits = [v for k, v in _REPORTS.items() if k and k[0] == name]
    return hits[-1] if hits else None


def forget() -> None:
    """Drop the in-memory picks (the disk cache stays): the next call of each key reads the disk or tunes."""
    _MEMORY.clear()
    _REPORTS.clear()

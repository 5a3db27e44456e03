"""One compile per kernel build on a host: a file lock per build, taken by whichever process compiles it.

A build is a kernel (module, qualname) with Triton's specialization data (signature, constants, attributes,
options, target: what keys Triton's compile), the identity the compile-once step records (engine/precompile.py).
Its lock is a file under Triton's cache dir (`<TRITON_CACHE_DIR>/flashbench-locks/<sha256>.lock`: a lock only
means something next to the cache the compile writes), held with flock, which the kernel drops when the holder
exits, however it exits.

Who takes it:
  - a compile-once process, around `JITFunction.preload`; a build whose lock another process holds is left to
    that process (try_acquire);
  - a worker (install(): Triton's `jit_cache_hook`, which Triton 3.6 and 3.9 both call with the build's
    specialization data before every compile, and `jit_post_compile_hook`, called after it) waits for the lock,
    then compiles: where another process compiled the build meanwhile, Triton's compile finds it in the cache.
The time a worker waits is counted (waited_s) so a row can say how much of its compile_ms was waiting.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path
from typing import Any

FOLDER = "flashbench-locks"
WAIT_LIMIT_S = 900.0  # a lock held longer than this (a stuck holder): compile without it, as without the lock
_POLL_S = 0.02


def identity(hook_kwargs: dict[str, Any]) -> tuple[str, str, str]:
    """(module, qualname, specialization data) of the build a Triton JIT hook was called for."""
    fn = hook_kwargs["fn"].jit_function.fn
    return fn.__module__, fn.__qualname__, hook_kwargs["compile"]["specialization_data"]


def path_for(module: str, qualname: str, spec: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The lock file of one build, under `root` (default: Triton's cache dir)."""
    if root is None:
        from triton import knobs

        root = knobs.cache.dir
    digest = hashlib.sha256("\0".join((module, qualname, spec)).encode()).hexdigest()
    return Path(root) / FOLDER / f"{digest}.lock"


class BuildLock:
    """An exclusive flock on one build's lock file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False (without waiting) where another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire(self, limit_s: float = WAIT_LIMIT_S) -> float:
        """Take the lock, waiting for its holder at most `limit_s` (then go on without it); the seconds waited."""
        if self.try_acquire():
            return 0.0
        started = time.monotonic()
        while not self.try_acquire() and time.monotonic() - started < limit_s:
            time.sleep(_POLL_S)
        return time.monotonic() - started

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class _Compiles:
    """This process's JIT hooks' state: the lock held around the compile under way, the seconds waited so far."""

    held: BuildLock | None = None
    waited_s: float = 0.0
    installed: bool = False


_STATE = _Compiles()


def before_compile(**kw: Any) -> bool:
    """Triton's jit_cache_hook: wait for the build's lock and hold it; False: Triton compiles (a cache hit where
    another process compiled it while this one waited)."""
    release()  # a compile that raised never reached the post-compile hook
    lock = BuildLock(path_for(*identity(kw)))
    _STATE.waited_s += lock.acquire()
    _STATE.held = lock
    return False


def after_compile(**kw: Any) -> None:
    """Triton's jit_post_compile_hook: the build is in the cache; let the next process have it."""
    release()


def release() -> None:
    """Drop the lock of the compile under way, if any (also at the end of a first call whose compile raised)."""
    if _STATE.held is not None:
        _STATE.held.release()
        _STATE.held = None


def install() -> None:
    """Take a build's lock around each compile of this process (a CUDA worker's)."""
    from triton import knobs

    knobs.runtime.jit_cache_hook = before_compile
    knobs.runtime.jit_post_compile_hook = after_compile
    _STATE.installed = True


def waited_s() -> float | None:
    """Seconds this process has waited for other processes' compiles; None where install() was not called."""
    return _STATE.waited_s if _STATE.installed else None

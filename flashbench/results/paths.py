"""Output directories: refused in one line (exit 2) where this process cannot write, before any work starts.

A sweep checks its --out before its worker starts, so that a read-only mount or a path under a file costs a line,
not a traceback after the worker's start-up (or, worse, after the first case). The check is a real one: a
directory made and removed where the output would go, because permission bits do not tell (root ignores them;
a read-only mount or a sysfs folder refuses even root).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from flashbench.errors import FlashbenchError


def check_writable_dir(path: str | Path, flag: str, given: str | Path | None = None) -> None:
    """FlashbenchError naming `flag` and why, unless `path` is (or can be made) a directory this process writes in.

    `given`: the path the user typed when `path` is derived from it (`report -o DIR/r.html` checks DIR)."""
    path = Path(path)
    shown = f"{flag} {given if given is not None else path}"
    existing = next((p for p in (path, *path.parents) if p.exists()), Path.cwd())
    if not existing.is_dir():
        raise FlashbenchError(f"cannot write to {shown}: {existing} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".flashbench-probe-", dir=existing))
    except OSError as exc:
        where = "" if existing == path else f" (making a folder in {existing})"
        raise FlashbenchError(f"cannot write to {shown}: {exc.strerror or exc}{where}") from None


def make_dir(path: str | Path, flag: str, given: str | Path | None = None) -> Path:
    """Create `path` (and its parents) as an output directory; a one-line FlashbenchError where it cannot be."""
    path = Path(path)
    check_writable_dir(path, flag, given)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a race with another process, or a quota: still one line
        shown = given if given is not None else path
        raise FlashbenchError(f"cannot write to {flag} {shown}: {exc.strerror or exc}") from None
    return path

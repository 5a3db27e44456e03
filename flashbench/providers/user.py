"""User kernel files (``--kernel path.py``): executed in the worker, registering through the same decorator.

The parent process never executes a user file (it may import torch, or worse, crash at import): it asks a
worker to load the files and describe the providers they registered.
"""

from __future__ import annotations

from pathlib import Path

from flashbench.errors import FlashbenchError
from flashbench.providers.registry import load_kernel_file


def check_paths(paths: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Absolute paths of existing .py files, or a one-line error (checked in the parent, before any worker)."""
    out: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.is_file():
            raise FlashbenchError(f"kernel file not found: {raw}")
        if path.suffix != ".py":
            raise FlashbenchError(f"kernel file {raw} is not a .py file")
        out.append(str(path.resolve()))
    return tuple(dict.fromkeys(out))


def load(paths: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Load kernel files into this process's registry (the worker calls this): file -> provider names."""
    return {str(p): load_kernel_file(p) for p in paths}

"""Locate and read the TOML tables shipped in ``configs/`` (installed as ``flashbench.configs``)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from flashbench.errors import FlashbenchError


def config_path(*parts: str) -> Path:
    """Path of a file shipped under configs/, e.g. ``config_path("sweeps", "quick.toml")``."""
    return Path(str(resources.files("flashbench.configs").joinpath(*parts)))


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a one-line FlashbenchError."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise FlashbenchError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FlashbenchError(f"config file {path} is not valid TOML: {exc}") from None

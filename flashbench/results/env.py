"""The environment record (env.json) beside every run: a typed record with a schema version, as Row is.

Written when a sweep starts (flashbench.gpu.environment.collect + the run's spec) and again when it ends (wall time,
status counts); `flashbench merge` writes one for the merged run. Readers (the gate, the analysis, the report)
read these fields, never a guessed layout. Keys this version does not know are kept in `extra` and written back,
so a record written by a newer flashbench loses nothing when an older one rewrites it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, overload

from flashbench.errors import FlashbenchError
from flashbench.results.rows import FLOP_CONVENTION, SCHEMA_VERSION

ENV_FILE = "env.json"
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass
class Environment:
    """Where and how a run was measured. Field order is the order of `flashbench env` and the report's table."""

    schema: int = SCHEMA_VERSION
    # --- the machine ---
    device: str = "cuda"  # "cuda" or "cpu"
    gpu: str = ""  # the device name as the worker's torch saw it
    gpus: list[dict[str, Any]] = field(default_factory=list)  # NVML facts per GPU (gpu.nvml.gpu_facts)
    driver: str | None = None
    hostname: str = ""
    platform: str = ""
    # --- the software ---
    flashbench: str = ""
    git_sha: str = ""
    git_dirty: bool | None = None  # changes to tracked files or new files .gitignore does not ignore
    git_diff: str = ""  # digest of those changes (gpu/environment.py), "" where clean or not a checkout
    fingerprint: str = ""  # digest of the code that ran: the installed flashbench and kernels, --kernel files
    fingerprint_parts: dict[str, str] = field(default_factory=dict)  # "flashbench", "kernel FILE" -> digest
    python: str = ""
    python_executable: str = ""
    torch: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    triton: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)  # the worker's own view (torch, device, memory)
    calibration: dict[str, Any] | None = None  # this GPU's `flashbench calibrate` record, if any
    # --- the run ---
    argv: list[str] = field(default_factory=list)
    preset: str | None = None
    spec: dict[str, Any] | None = None  # the SweepSpec as resolved (flags over preset)
    flop_convention: str = FLOP_CONVENTION
    run_dir: str | None = None
    sweep_id: str | None = None
    shard: str | None = None
    planned_cases: int | None = None
    sweep_planned_cases: int | None = None
    devices_used: list[int] | None = None
    started: str | None = None
    finished: str | None = None
    interrupted: bool | None = None
    previous_runs: list[str | None] = field(default_factory=list)  # start times of earlier sessions (--resume)
    wall_s: float | None = None
    wall_s_total: float | None = None
    status_counts: dict[str, int] = field(default_factory=dict)
    compile_s_total: float | None = None
    compile_s_by_worker: dict[str, float] = field(default_factory=dict)  # per worker: its gpu_index, "default"
    precompile: dict[str, Any] | None = None  # the compile-once step before measuring (engine/precompile.py)
    # --- a merged run (flashbench merge) ---
    merged: str | None = None
    shard_count: int | None = None
    shards_present: list[int] = field(default_factory=list)
    shards_missing: list[int] = field(default_factory=list)
    shards: list[dict[str, Any]] = field(default_factory=list)
    wall_s_sum: float | None = None
    # --- test fixtures and notes ---
    synthetic: bool = False  # made up by a generator, not measured: the report says so
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept verbatim

    @property
    def gpu_name(self) -> str:
        """The GPU's name: torch's view of the device used, else NVML's first GPU ("" on a CPU run)."""
        if self.gpu:
            return self.gpu
        return next((str(g["name"]) for g in self.gpus if isinstance(g, dict) and g.get("name")), "")

    @property
    def gpu_facts(self) -> dict[str, Any] | None:
        """NVML's static facts of the GPU used (memory, max clocks, bus width), None where NVML saw none."""
        named = [g for g in self.gpus if isinstance(g, dict) and g.get("name")]
        return next((g for g in named if g["name"] == self.gpu), named[0] if named else None)

    @property
    def command(self) -> str:
        """The command line that ran (as the user typed it, program name shortened to `flashbench`)."""
        if not self.argv:
            return ""
        return " ".join(["flashbench", *self.argv[1:]])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        return {**extra, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Environment:
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names and v is not None}
        if isinstance(known.get("gpu"), dict):  # never written by a sweep, but accept {"name": ...}
            known["gpu"] = str(known["gpu"].get("name", ""))
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})


def same_code(baseline: str, current: str) -> str:
    """One line on whether two runs ran the same code, from their fingerprints ("" where not recorded)."""
    if not baseline or not current:
        missing = " and ".join(n for n, f in (("baseline", baseline), ("current", current)) if not f)
        return f"Code fingerprint not recorded for the {missing} run: same or different code is unknown."
    if baseline == current:
        return f"Same code on both sides (fingerprint {current}): a difference is the machine's state or noise."
    return f"Different code: fingerprint {baseline} (baseline) vs {current} (current)."


def write_env(run_dir: str | Path, env: Environment) -> None:
    """Write env.json atomically (a reader never sees half a record)."""
    path = Path(run_dir) / ENV_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(env.to_dict(), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_env(run_dir: str | Path) -> Environment:
    """The run's environment record; FlashbenchError (exit 2) when missing, corrupt or of another schema."""
    path = Path(run_dir) / ENV_FILE
    if not path.is_file():
        raise FlashbenchError(f"{run_dir}: no {ENV_FILE} (not a flashbench run directory?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlashbenchError(f"{path} is corrupt: {exc}") from None
    if not isinstance(data, dict):
        raise FlashbenchError(f"{path} is corrupt: expected a JSON object")
    if data.get("schema") != SCHEMA_VERSION:
        raise FlashbenchError(
            f"{path} has results schema {data.get('schema')!r}; this flashbench reads schema {SCHEMA_VERSION}"
        )
    try:
        return Environment.from_dict(data)
    except TypeError as exc:
        raise FlashbenchError(f"{path} is corrupt: {exc}") from None


# ------------------------------------------------------------------- Environment.shard: "i/n" (engine/shard.py)
@overload
def parse_shard(text: None) -> None: ...
@overload
def parse_shard(text: str | tuple[int, int]) -> tuple[int, int]: ...
def parse_shard(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """Parse "i/n" (1 <= i <= n) -> (i, n); None stays None. Anything else is a one-line FlashbenchError."""
    if text is None:
        return None
    if isinstance(text, tuple):
        text = f"{text[0]}/{text[1]}"
    match = _SHARD.match(str(text))
    if not match:
        raise FlashbenchError(f"--shard {text!r}: expected i/n with 1 <= i <= n (1-based), e.g. 1/4")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise FlashbenchError(f"--shard {text!r}: expected i/n with 1 <= i <= n (1-based), e.g. 1/4")
    return index, count


def format_shard(shard: tuple[int, int]) -> str:
    return f"{shard[0]}/{shard[1]}"

"""What `--resume` may continue: the same sweep, on the same device and GPU model, never someone else's run.

A resumed run's spec is the one stored in its env.json. Flags given with --resume must ask for that same sweep
(a flag equal to the stored value is fine); one that differs is refused with a line naming each difference,
never merged into the stored spec: "the old preset plus the new flags" is a third sweep that neither run
measured. `--timeout` alone may differ: it bounds how long a case may take, not what the case measures, and
retrying a timed-out case with more time is what --resume is for.

The device is part of the spec; the GPU model is checked once the worker has said which GPU it sees: rows of
two GPU models in one run would read as one GPU's numbers. A run whose every planned case already has a final
row is not rewritten at all (its env.json keeps the session that measured it).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from flashbench.errors import FlashbenchError
from flashbench.results.env import ENV_FILE, Environment
from flashbench.spec.config import SweepSpec

# SweepSpec fields a resumed run may change: limits on the run, not part of what any row measured
# (`name` and `description` follow the preset, which is compared through the fields it sets).
MAY_DIFFER = frozenset({"timeout_s", "name", "description", "extra"})


def check_resumable(out: str | Path | None) -> None:
    """--resume continues a sweep that was started: `out` must hold its env.json; else a one-line error (exit 2),
    never a silent new run in a directory the user believes holds their earlier results."""
    if out is None:
        raise FlashbenchError("nothing to resume: --resume needs --out DIR, the run directory to continue")
    if not (Path(out) / ENV_FILE).is_file():
        what = "does not exist" if not Path(out).exists() else f"holds no {ENV_FILE} (no sweep started there)"
        raise FlashbenchError(f"nothing to resume: {out} {what}; drop --resume to start a new run")


def stored_spec(env: Environment, out: str | Path) -> SweepSpec:
    """The spec the run in `out` was started with; a one-line error where its env.json has none."""
    if not isinstance(env.spec, dict):
        raise FlashbenchError(
            f"cannot resume {out}: its {ENV_FILE} records no sweep spec (not a sweep's run?)"
        )
    return SweepSpec.from_dict(env.spec)


def check_same_sweep(out: str | Path, stored: SweepSpec, asked: SweepSpec) -> None:
    """Refuse (exit 2) a resume whose flags ask for another sweep than the one `out` holds, naming each field."""
    differences = [
        f"{f.name.replace('_', '-')} {_text(getattr(asked, f.name))} (the run: {_text(getattr(stored, f.name))})"
        for f in fields(SweepSpec)
        if f.name not in MAY_DIFFER and getattr(asked, f.name) != getattr(stored, f.name)
    ]
    if differences:
        raise FlashbenchError(
            f"cannot resume {out} as another sweep: {'; '.join(differences)}; resume it without those flags, "
            "or give a new --out to run this sweep"
        )


def check_same_gpu(out: str | Path, env: Environment, gpu: str) -> None:
    """Refuse (exit 2) to add rows measured on another GPU model (or on the CPU) to a run."""
    if env.gpu and gpu and env.gpu != gpu:
        raise FlashbenchError(
            f"cannot resume {out} here: it was measured on {env.gpu}, this machine's worker sees {gpu}; "
            "give a new --out to measure this machine"
        )


def _text(value: Any) -> str:
    """A spec value as a flag would give it: 16,32 for a tuple, and at most five items of a long one."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        items = [_text(v) for v in value]
        if len(items) > 5:
            items = [*items[:2], "...", items[-1]]
        return ",".join(items) if items else "none"
    return repr(value) if value == "" else str(value)

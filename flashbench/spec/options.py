"""What a sweep option is (Option: its help, its parser, its CLI flag), and the options of a run that are not
part of its spec (RUN_OPTIONS). The spec's own options are SweepSpec's fields (spec/config.py: SPEC_OPTIONS);
`flashbench sweep`'s flags (cli/sweep.py) and `flashbench.sweep`'s keywords (api.py) are made from both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashbench.spec.parse import parse_range

# The groups `flashbench sweep --help` shows its options in.
SHAPE, CACHE, MEASURE, RUN = "Shapes", "KV cache (serving shapes)", "Providers and measurement", "Run"
PANELS = (SHAPE, CACHE, MEASURE, RUN)


@dataclass(frozen=True)
class Option:
    """One sweep option, written once: its CLI flag and its library keyword are made from it."""

    name: str  # the library keyword and TOML key (the SweepSpec field's name unless it says otherwise)
    help: str  # one line, units included: the CLI's help and the library's
    parse: Callable[[Any], Any] | None = None  # CLI text, TOML or Python value -> the field's value
    flag: str | None = None  # the CLI's ("--seq-q", "--ncu/--no-ncu"); None: TOML and library only
    cli: Any = str  # the type the CLI reads before `parse`
    panel: str = MEASURE  # the group --help shows it in
    field: str | None = None  # the SweepSpec field it sets; None: a run option (RUN_OPTIONS)
    default: Any = None  # the CLI's and the library's default: None = not given (the preset decides)


def spec_field(
    default: Any,
    help: str,
    parse: Callable[[Any], Any],
    *,
    flag: str | None = None,
    cli: Any = str,
    panel: str = MEASURE,
    name: str = "",
) -> Any:
    """A SweepSpec field with its Option (the option's name is the field's, unless `name` says otherwise)."""
    option = Option(name, help, parse, flag, cli, panel)
    return field(default=default, metadata={"option": option})


def ints(what: str) -> Callable[[Any], tuple[int, ...]]:
    return lambda v: tuple(parse_range(v, what))


def maybe(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A parser for a field where None means "derived" (seq_q = seq, batch from tokens, heads from hidden...)."""
    return lambda v: None if v is None else parse(v)


# The options of a run that are not part of its spec (api.sweep acts on them; `flashbench sweep` gives all but
# `progress`, which it always shows).
RUN_OPTIONS: tuple[Option, ...] = (
    Option("preset", "a preset from configs/sweeps (`flashbench list presets`)", flag="--preset", panel=RUN),
    Option("config", "a sweep TOML file; flags override it", flag="--config", cli=Path, panel=RUN),
    Option(
        "out",
        "run directory (default results/<YYYYmmdd-HHMMSS>-<preset>/)",
        flag="--out",
        cli=Path,
        panel=RUN,
    ),
    Option(
        "resume",
        "skip finished cases, retry crash/timeout",
        flag="--resume",
        cli=bool,
        panel=RUN,
        default=False,
    ),
    Option(
        "force", "start over in a non-empty run directory", flag="--force", cli=bool, panel=RUN, default=False
    ),
    Option(
        "shard",
        "run slice i of n (1-based, e.g. 2/4), split by shape; combine with `flashbench merge`",
        flag="--shard",
        panel=RUN,
    ),
    Option(
        "gpus",
        "all | 0,1: one worker per GPU, shapes spread over them; indices count in CUDA_VISIBLE_DEVICES where it is set (--device cpu: N CPU workers)",
        flag="--gpus",
        panel=RUN,
    ),
    Option("progress", "show a progress line on stderr", cli=bool, panel=RUN, default=False),
)

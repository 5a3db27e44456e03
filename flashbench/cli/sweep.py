"""`flashbench sweep`: parse, one library call, render (`list` and `env` are in cli/listing.py).

Its options are made from the sweep's Options (spec/config.py: SPEC_OPTIONS and RUN_OPTIONS), the same ones that
make `flashbench.sweep`'s keywords; only --json, how the result is printed, is the command's own.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from flashbench.cli.render import render_tables
from flashbench.errors import plural
from flashbench.spec.config import SPEC_OPTIONS
from flashbench.spec.options import PANELS, RUN, RUN_OPTIONS, Option

JSON_HELP = "print the rows as JSON on stdout (no table)"


def sweep_command(*, json_out: bool = False, **options: Any) -> None:
    """Measure attention providers over a sweep of shapes; rows go to <out>/rows.jsonl as each case ends."""
    from flashbench.api import sweep

    result = sweep(**options, progress=True)
    if json_out:
        payload = {
            "run_dir": str(result.run_dir),
            "wall_s": round(result.wall_s, 3),
            "counts": result.counts(),
            "rows": [r.to_dict() for r in result.rows],
        }
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
        _say_if_unread(f"{plural(len(result.rows), 'case')} in {result.wall_s:.1f} s", result.run_dir)
        return
    render_tables(result.rows, tokens=result.spec.tokens)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result.counts().items()))
    summary = f"{plural(len(result.rows), 'case')} ({counts}) in {result.wall_s:.1f} s"
    print(f"{summary}; rows in {result.run_dir}/rows.jsonl")
    _say_if_unread(summary, result.run_dir)


def cli_parameter(option: Option) -> inspect.Parameter:
    """The Typer parameter of one option: its flag, its help, its group; the type the CLI reads, or None."""
    assert option.flag is not None
    kind: Any = option.cli if option.default is not None else option.cli | None
    metavar = "<file>" if option.cli == list[Path] else None  # not typer's <list[Path]>
    info = typer.Option(option.flag, help=option.help, rich_help_panel=option.panel, metavar=metavar)
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default, annotation=Annotated[kind, info]
    )


def _signature() -> inspect.Signature:
    json_flag = Option("json_out", JSON_HELP, flag="--json", cli=bool, panel=RUN, default=False)
    given = [o for o in (*SPEC_OPTIONS, *RUN_OPTIONS, json_flag) if o.flag is not None]
    given.sort(key=lambda o: PANELS.index(o.panel))  # --help shows the groups in PANELS' order
    return inspect.Signature([cli_parameter(o) for o in given], return_annotation=None)


sweep_command.__signature__ = _signature()  # type: ignore[attr-defined]


def _say_if_unread(summary: str, run_dir: Path) -> None:
    """Where stdout's reader left early (`| head`, cli.app.ReaderSafe), say on stderr that the sweep did not stop."""
    if getattr(sys.stdout, "lost", False):
        print(
            f"flashbench: stdout closed early; the sweep ran to its end: {summary}; rows in {run_dir}/rows.jsonl",
            file=sys.stderr,
        )


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)

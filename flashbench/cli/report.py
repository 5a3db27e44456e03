"""`flashbench report`: a run as one offline HTML page, a markdown summary, or tidy CSV / JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from flashbench.analysis.runs import SPEEDUP_VS_HELP


def report(
    run: Annotated[
        Path, typer.Argument(help="Results directory of a sweep (holds env.json and rows.jsonl).")
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write. Default: RUN/report.html for html; standard output for md, csv and json.",
        ),
    ] = None,
    baseline: Annotated[
        Path | None, typer.Option(help="Another run directory: compare the two case by case (time ratios).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="html | md | csv | json.")] = "html",
    speedup_vs: Annotated[
        str | None,
        typer.Option(help=SPEEDUP_VS_HELP),
    ] = None,
) -> None:
    """Write the report of a run: figures (roofline, TFLOP/s, memory, recompute), tables, comparisons."""
    from flashbench.report import build

    if fmt == "html" and output is None:
        output = run / "report.html"
    text = build(run, fmt=fmt, out=output, baseline=baseline, speedup_vs=speedup_vs)
    if output is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {output}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("report")(report)

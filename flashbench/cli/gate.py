"""`flashbench gate` (did this change make a kernel slower?) and `flashbench baseline save` (promote a run).

Exit codes: 0 pass (and --learn wrote its file), 1 fail (a real slowdown of GPU or loop time, a newly failing
case, or baseline cases missing from the current run without --allow-missing), 2 usage or mismatch (bad paths,
corrupt files, another GPU model without --allow-mismatch, --learn over runs of different code).
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flashbench.analysis.gate import (
    CANNOT_JUDGE,
    CURRENT_ONLY,
    FIXED,
    IMPROVEMENT,
    MISSING,
    NEWLY_FAILING,
    NOISY,
    NOT_MEASURED,
    REGRESSION,
    UNCHANGED,
    GateResult,
)
from flashbench.analysis.gate_rule import pct
from flashbench.cli.render import console as make_console
from flashbench.cli.render import folding_column, name_column
from flashbench.errors import FlashbenchError
from flashbench.report.gate import fmt_change, fmt_interval, fmt_ms, natural, render_markdown, short_labels

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class Format(StrEnum):
    table = "table"
    md = "md"
    json = "json"


def gate(
    baseline: Annotated[
        Path,
        typer.Option(
            "--baseline",
            help="Baseline: a saved results/baselines/NAME.json or a run directory; with --learn, the file to write.",
        ),
    ],
    runs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="With --learn: the run directories of one code to learn noise bands from.",
            metavar="RUN",
            show_default=False,
        ),
    ] = None,
    current: Annotated[
        Path | None, typer.Option("--current", help="The run directory to judge (sweep --out).")
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="The slowdown to catch, as a fraction (0.03 = 3%): a case fails beyond half of it or beyond its "
            "noise band, whichever is larger; overrides every threshold in configs/gate.toml."
        ),
    ] = None,
    allow_mismatch: Annotated[
        bool, typer.Option("--allow-mismatch", help="Compare even when the GPU model or device differs.")
    ] = False,
    allow_missing: Annotated[
        bool,
        typer.Option(
            "--allow-missing",
            help="Pass even when baseline cases are missing from the current run (a deliberately smaller sweep).",
        ),
    ] = False,
    learn: Annotated[
        bool,
        typer.Option(
            "--learn",
            help="Write --baseline FILE from RUN RUN... (same code, one GPU model): the first run's samples "
            "plus, per case, how far the runs' medians fell apart (its noise band).",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="With --learn: replace an existing file.")] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output on stdout.")] = Format.table,
    md_out: Annotated[
        Path | None, typer.Option("--md-out", help="Also write the markdown report here.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="Gate thresholds TOML (default: the bundled configs/gate.toml).")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Preset whose thresholds apply (default: the current run's preset).")
    ] = None,
) -> None:
    """Compare a run with a baseline: exit 0 pass, 1 regression or missing cases, 2 usage or mismatch.

    `flashbench gate --learn RUN RUN... --baseline FILE` learns per-case noise bands from same-code runs instead.
    The markdown report is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    if learn:
        _learn(runs or [], baseline, current, force)
        return
    if runs:
        raise FlashbenchError(
            f"unexpected argument {runs[0]}: run directories are given with --learn; compare with --current DIR"
        )
    if current is None:  # required unless --learn, so not marked required for typer; worded as its error is
        raise FlashbenchError("Missing option '--current'. (see `flashbench gate --help`)")
    from flashbench.analysis.gate import run_gate, to_json

    result = run_gate(
        baseline,
        current,
        threshold=threshold,
        allow_mismatch=allow_mismatch,
        allow_missing=allow_missing,
        config=config,
        preset=preset,
    )
    markdown = render_markdown(result)
    if fmt is Format.md:
        print(markdown, end="")
    elif fmt is Format.json:
        print(to_json(result), end="")
    else:
        _print_table(result)
    for target, mode in ((md_out, "w"), (os.environ.get("GITHUB_STEP_SUMMARY"), "a")):
        if target:
            try:
                with open(target, mode, encoding="utf-8") as fh:
                    fh.write(markdown)
            except OSError as exc:
                raise FlashbenchError(
                    f"cannot write the markdown report to {target}: {exc.strerror}"
                ) from None
    raise SystemExit(result.exit_code)


def _learn(runs: list[Path], out: Path, current: Path | None, force: bool) -> None:
    from flashbench.results.baseline import learn_baseline

    if current is not None:
        raise FlashbenchError("--learn writes a baseline and judges nothing: leave out --current")
    path, side = learn_baseline(runs, out, force=force)
    bands = sorted(c.band for c in side.cases.values() if c.band is not None)
    print(
        f"wrote {path}: {len(side.cases)} cases from {runs[0]}, noise bands from {len(runs)} runs for {len(bands)}"
    )
    if bands:
        median = bands[len(bands) // 2]
        judged = ", ".join(f"{sum(b <= x / 2 for b in bands)} at {pct(x)}" for x in (0.03, 0.05, 0.1))
        print(f"bands: median {pct(median)}, largest {pct(bands[-1])}; judgeable by their band: {judged}")


# ---------------------------------------------------------------------------------------------- the table
# Columns a narrow terminal leaves out, first to last (their content stays in --format md and json), so that no
# column is cut to a few characters; the notes then follow the table. A note column needs this much room.
OPTIONAL_COLUMNS = (("interval",), ("base ms", "cur ms", "base", "cur"))
NOTE_WIDTH = 40


def _table(title: str, columns: list[str], rows: list[dict[str, str]]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in columns:
        if col in ("case", "shape"):
            name_column(table, col, [r[col] for r in rows])
        elif col == "note":
            folding_column(table, col, ratio=1)
        elif col == "verdict":  # the one column that may wrap ("cannot judge / at 3%"): names are never cut
            folding_column(table, col, min_width=10)
        else:
            table.add_column(
                col, no_wrap=True, justify="left" if col in ("verdict", "ratio", "interval") else "right"
            )
    for row in rows:
        table.add_row(*(row[col] for col in columns))
    return table


def _fitted(console: Console, title: str, rows: list[dict[str, str]]) -> Table:
    """The widest table of `rows` that fits the console: optional columns go until the rest fits unfolded."""
    from rich.measure import Measurement

    columns = [k for k in (rows[0] if rows else {}) if not k.startswith("_")]

    def width(cols: list[str]) -> int:
        unbounded = console.options.update(max_width=10_000)
        return Measurement.get(console, unbounded, _table(title, cols, rows)).maximum

    fixed = [c for c in columns if c != "note"]
    for drop in OPTIONAL_COLUMNS:
        if width(fixed) <= console.width:
            break
        fixed = [c for c in fixed if c not in drop]
    if "note" in columns and width(fixed) + NOTE_WIDTH <= console.width:
        fixed.append("note")
    return _table(title, fixed, rows)


def _print_table(result: GateResult) -> None:
    from rich.table import Table

    console = make_console()
    style = {REGRESSION: "bold red", NEWLY_FAILING: "bold red", NOISY: "yellow", IMPROVEMENT: "green"}
    style.update({FIXED: "green", CANNOT_JUDGE: "yellow"})
    if not result.allow_missing:
        style[MISSING] = "bold red"
    env = Table(title=f"baseline {result.baseline}  vs  current {result.current}", title_justify="left")
    for col in ("environment", "baseline", "current"):
        env.add_column(col, overflow="fold")
    for e in result.env:
        env.add_row(
            e.name, e.baseline or "?", f"[yellow]{e.current or '?'}[/]" if e.differs else e.current or "?"
        )
    console.print(env)
    labels, shared = short_labels([c.key for c in result.cases])
    title = "cases (change = current / baseline - 1; a case fails beyond its limit: max(threshold / 2, noise band))"
    if shared:
        title += f"; every case: {shared}"
    order = {REGRESSION: 0, NEWLY_FAILING: 1, MISSING: 2, NOISY: 3, CANNOT_JUDGE: 4, IMPROVEMENT: 5, FIXED: 6}
    loops = any(c.loop_verdict for c in result.cases)
    rows: list[dict[str, str]] = []
    shown = [c for c in result.cases if c.verdict != NOT_MEASURED]
    for c in sorted(shown, key=lambda c: (order.get(c.verdict, 9), natural(labels[c.key]))):
        loop = fmt_change(c.loop_ratio)
        rows.append(
            {
                "case": labels[c.key],
                "verdict": f"[{style[c.verdict]}]{c.label}[/]" if c.verdict in style else c.label,
                "base ms": fmt_ms(c.baseline_ms) or c.baseline_status,
                "cur ms": fmt_ms(c.current_ms) or c.current_status,
                "change": fmt_change(c.ratio),
                "limit": f"{c.threshold * 100:.1f}%" if c.threshold is not None else "",
                **(
                    {"loop": f"[bold red]{loop}[/]" if c.loop_verdict == REGRESSION else loop}
                    if loops
                    else {}
                ),
                "interval": fmt_interval(c.ci_low, c.ci_high) if c.ratio is not None else "",
                "note": "; ".join(filter(None, [c.note, f"throttled: {c.throttled}" if c.throttled else ""])),
                "_worth": "" if c.verdict in (UNCHANGED, CURRENT_ONLY) else "y",
            }
        )
    cases = _fitted(console, title, rows)
    console.print(cases)
    idle = [c for c in result.cases if c.verdict == NOT_MEASURED]
    if idle:
        providers = ", ".join(sorted({c.key.split("|", 1)[0] for c in idle}))
        console.print(f"{len(idle)} cases not ok on either side, not listed ({providers})", highlight=False)
    if not any(col.header == "note" for col in cases.columns):
        for row in rows:
            if row["note"] and row["_worth"]:
                console.print(f"  {row['case']}: {row['note']}", highlight=False)
    if result.ratios:
        shape_labels, shared = short_labels([r.shape for r in result.ratios], named=False)
        pairs = {f"{r.bundled} / {r.reference}" for r in result.ratios}
        title = f"in-run ratios ({pairs.pop() if len(pairs) == 1 else 'bundled / reference'})"
        title += f"; every shape: {shared}" if shared else ""
        ratio_rows = [
            {
                "shape": shape_labels[r.shape],
                **({"ratio": f"{r.bundled} / {r.reference}"} if len(pairs) > 1 else {}),
                "verdict": f"[{style[r.verdict]}]{r.label}[/]" if r.verdict in style else r.label,
                "base": f"{r.baseline_ratio:.3f}",
                "cur": f"{r.current_ratio:.3f}",
                "change": fmt_change(r.change),
                "limit": f"{r.threshold * 100:.1f}%",
            }
            for r in result.ratios
        ]
        console.print(_fitted(console, title, ratio_rows))
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    colour = "green" if result.passed else "bold red"
    console.print(f"[{colour}]{result.headline()}[/]", highlight=False)


baseline_app = typer.Typer(help="Manage committed baselines for `flashbench gate`.", no_args_is_help=True)


@baseline_app.command("save")
def save(
    run: Annotated[Path, typer.Argument(help="The run directory to promote.")],
    name: Annotated[str, typer.Option("--name", help="Baseline name, usually the GPU (h100).")],
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where baselines live.")] = Path(
        "results/baselines"
    ),
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing baseline of that name.")
    ] = False,
) -> None:
    """Save RUN as results/baselines/NAME.json: env summary + per case status, samples, median."""
    from flashbench.results.baseline import save_baseline

    path = save_baseline(run, name, out_dir, force=force)
    print(f"saved {path}")


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
    app.add_typer(baseline_app, name="baseline")

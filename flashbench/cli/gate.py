"""`flashbench gate` (did this change make a kernel slower?) and `flashbench baseline save` (promote a run).

Exit codes: 0 pass, 1 fail (a real slowdown, a newly failing case, or baseline cases missing from the current run
without --allow-missing), 2 usage or mismatch (bad paths, corrupt files, another GPU model without
--allow-mismatch).
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from flashbench.cli.render import console as make_console
from flashbench.cli.render import folding_column, name_column
from flashbench.errors import FlashbenchError
from flashbench.gate import (
    CURRENT_ONLY,
    FIXED,
    IMPROVEMENT,
    MISSING,
    NEWLY_FAILING,
    NOISY,
    REGRESSION,
    CaseVerdict,
    GateResult,
    RatioVerdict,
)


class Format(StrEnum):
    table = "table"
    md = "md"
    json = "json"


def gate(
    baseline: Annotated[
        Path,
        typer.Option("--baseline", help="Baseline: a saved results/baselines/NAME.json or a run directory."),
    ],
    current: Annotated[Path, typer.Option("--current", help="The run directory to judge (sweep --out).")],
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Slowdown threshold as a fraction (0.05 = 5%); overrides every threshold in configs/gate.toml."
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

    The markdown report is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    from flashbench.gate import run_gate, to_json

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


def _print_table(result: GateResult) -> None:
    from rich.table import Table

    console = make_console()
    style = {REGRESSION: "bold red", NEWLY_FAILING: "bold red", NOISY: "yellow", IMPROVEMENT: "green"}
    style[FIXED] = "green"
    if not result.allow_missing:
        style[MISSING] = "bold red"
    env = Table(title=f"baseline {result.baseline}  vs  current {result.current}", title_justify="left")
    for col in ("environment", "baseline", "current"):
        env.add_column(col)
    for e in result.env:
        env.add_row(
            e.name, e.baseline or "?", f"[yellow]{e.current or '?'}[/]" if e.differs else e.current or "?"
        )
    console.print(env)
    cases = Table(title="cases (change = current / baseline - 1)", title_justify="left")
    name_column(cases, "case", [show_key(c.key) for c in result.cases])
    folding_column(cases, "verdict")
    for col in ("base ms", "cur ms", "change"):
        folding_column(cases, col, justify="right")
    folding_column(cases, "interval")
    folding_column(cases, "note")
    order = {REGRESSION: 0, NEWLY_FAILING: 1, MISSING: 2, NOISY: 3, IMPROVEMENT: 4, FIXED: 5}
    for c in sorted(result.cases, key=lambda c: (order.get(c.verdict, 9), c.key)):
        note = "; ".join(filter(None, [c.note, f"throttled: {c.throttled}" if c.throttled else ""]))
        verdict = f"[{style[c.verdict]}]{c.verdict}[/]" if c.verdict in style else c.verdict
        cases.add_row(
            show_key(c.key),
            verdict,
            fmt_ms(c.baseline_ms) or c.baseline_status,
            fmt_ms(c.current_ms) or c.current_status,
            fmt_change(c.ratio),
            fmt_interval(c.ci_low, c.ci_high) if c.ratio is not None else "",
            note,
        )
    console.print(cases)
    if result.ratios:
        ratios = Table(title="in-run ratios (bundled / reference)", title_justify="left")
        name_column(ratios, "shape", [show_key(r.shape) for r in result.ratios])
        for col in ("ratio", "verdict", "baseline", "current", "change", "interval"):
            folding_column(ratios, col)
        for r in result.ratios:
            verdict = f"[{style[r.verdict]}]{r.verdict}[/]" if r.verdict in style else r.verdict
            ratios.add_row(
                show_key(r.shape),
                f"{r.bundled} / {r.reference}",
                verdict,
                f"{r.baseline_ratio:.3f}",
                f"{r.current_ratio:.3f}",
                fmt_change(r.change),
                fmt_interval(r.ci_low, r.ci_high),
            )
        console.print(ratios)
    for note in result.notes:
        console.print(f"note: {note}")
    colour = "green" if result.passed else "bold red"
    console.print(f"[{colour}]{result.headline()}[/]")


# ---------------------------------------------------------------------------------------------- markdown
def show_key(key: str) -> str:
    """A case key for display: spaces for pipes (a pipe would split a markdown table cell)."""
    return key.replace("|", " ")


def fmt_ms(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def fmt_change(ratio: float | None) -> str:
    return "" if ratio is None else f"{(ratio - 1.0) * 100.0:+.1f}%"


def fmt_interval(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"{fmt_change(low)} .. {fmt_change(high)}"


def _md_table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = right or set()
    align = ["---:" if i in right else "---" for i in range(len(header))]
    return [f"| {' | '.join(header)} |", f"|{'|'.join(align)}|", *(f"| {' | '.join(r)} |" for r in rows), ""]


def _timing_rows(cases: list[CaseVerdict], with_verdict: bool = False) -> tuple[list[str], list[list[str]]]:
    header = ["case", *(["verdict"] if with_verdict else []), "baseline ms", "current ms", "change"]
    header += ["interval", "threshold", "note"]
    rows = []
    for c in cases:
        note = "; ".join(filter(None, [c.note, f"throttled: {c.throttled}" if c.throttled else ""]))
        thr = "" if c.threshold is None else f"{c.threshold * 100:.0f}%"
        rows.append(
            [f"`{show_key(c.key)}`", *([c.verdict] if with_verdict else []), fmt_ms(c.baseline_ms)]
            + [fmt_ms(c.current_ms), fmt_change(c.ratio), fmt_interval(c.ci_low, c.ci_high), thr, note]
        )
    return header, rows


def _ratio_rows(ratios: list[RatioVerdict], with_verdict: bool = False) -> tuple[list[str], list[list[str]]]:
    header = [
        "shape",
        "ratio",
        *(["verdict"] if with_verdict else []),
        "baseline",
        "current",
        "change",
        "interval",
    ]
    rows = [
        [f"`{show_key(r.shape)}`", f"{r.bundled} / {r.reference}", *([r.verdict] if with_verdict else [])]
        + [
            f"{r.baseline_ratio:.3f}",
            f"{r.current_ratio:.3f}",
            fmt_change(r.change),
            fmt_interval(r.ci_low, r.ci_high),
        ]
        for r in ratios
    ]
    return header, rows


def render_markdown(result: GateResult) -> str:
    """The gate's report as GitHub markdown: deterministic (sorted, fixed formats, no timestamps)."""
    cfg = result.config
    pct = f"{cfg.confidence * 100:.0f}%"
    lines = [f"## flashbench gate: {'PASS' if result.passed else 'FAIL'}", "", result.headline(), ""]
    overrides = ", ".join(f"{p} {t * 100:.0f}%" for p, t in sorted(cfg.provider_thresholds.items()))
    lines += [
        f"Baseline `{result.baseline}`, current `{result.current}`. A case regresses when its median is slower by "
        f"more than the threshold ({cfg.threshold * 100:.0f}%{'; ' + overrides if overrides else ''}) and the "
        f"{pct} bootstrap interval of the median ratio lies above 1 (interval: {pct}, change = current / baseline"
        " - 1).",
        "",
    ]
    env_rows = [
        [e.name, e.baseline or "?", (f"**{e.current or '?'}** (differs)" if e.differs else e.current or "?")]
        for e in result.env
    ]
    lines += _md_table(["environment", "baseline", "current"], env_rows)
    by = {v: [c for c in result.cases if c.verdict == v] for v in (REGRESSION, NOISY, IMPROVEMENT)}
    right = {1, 2, 3, 5}
    for title, verdict in [("Regressions", REGRESSION), ("Slower, within noise (not failed)", NOISY)]:
        if by[verdict]:
            lines += [f"### {title} ({len(by[verdict])})", "", *_md_table(*_timing_rows(by[verdict]), right)]
    failing = [c for c in result.cases if c.verdict == NEWLY_FAILING]
    if failing:
        rows = [[f"`{show_key(c.key)}`", c.baseline_status, c.current_status, c.note] for c in failing]
        lines += [
            f"### Newly failing ({len(failing)})",
            "",
            *_md_table(["case", "baseline", "current", "reason"], rows),
        ]
    if result.ratio_regressions:
        header, rows = _ratio_rows(result.ratio_regressions)
        lines += [f"### In-run ratio regressions ({len(rows)})", "", *_md_table(header, rows, {2, 3, 4})]
    if by[IMPROVEMENT]:
        lines += [
            f"### Improvements ({len(by[IMPROVEMENT])})",
            "",
            *_md_table(*_timing_rows(by[IMPROVEMENT]), right),
        ]
    fixed = [c for c in result.cases if c.verdict == FIXED]
    if fixed:
        rows = [[f"`{show_key(c.key)}`", c.baseline_status, fmt_ms(c.current_ms)] for c in fixed]
        lines += [f"### Now ok ({len(fixed)})", "", *_md_table(["case", "baseline", "current ms"], rows, {2})]
    for title, verdict, status in (
        ("Missing from the current run", MISSING, "baseline_status"),
        ("Only in the current run", CURRENT_ONLY, "current_status"),
    ):
        only = [c for c in result.cases if c.verdict == verdict]
        if only:
            allowed = " (allowed by --allow-missing)" if verdict == MISSING and result.allow_missing else ""
            rows = [[f"`{show_key(c.key)}`", getattr(c, status)] for c in only]
            lines += [f"### {title} ({len(only)}){allowed}", "", *_md_table(["case", "status there"], rows)]
    throttled = [c for c in result.cases if c.throttled]
    if throttled:
        lines += [f"### Throttled ({len(throttled)})", ""]
        lines += [f"- `{show_key(c.key)}`: {c.throttled}" for c in throttled] + [""]
    if result.notes:
        lines += ["### Notes", "", *(f"- {n}" for n in result.notes), ""]
    compared = [c for c in result.cases if c.verdict not in (MISSING, CURRENT_ONLY)]
    lines += [f"<details><summary>All {len(compared)} compared cases</summary>", ""]
    lines += _md_table(*_timing_rows(compared, with_verdict=True), {2, 3, 4, 6})
    lines += ["</details>", ""]
    if result.ratios:
        lines += [f"<details><summary>In-run ratios ({len(result.ratios)})</summary>", ""]
        lines += _md_table(*_ratio_rows(result.ratios, with_verdict=True), {3, 4, 5})
        lines += ["</details>", ""]
    return "\n".join(lines)


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

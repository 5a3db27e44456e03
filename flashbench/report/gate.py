"""The gate's decision in words: GitHub markdown (`flashbench gate --format md`), and the case labels and number
formats the terminal table (cli/gate.py) shares with it. Deterministic: sorted, fixed formats, no timestamps."""

from __future__ import annotations

import re
from typing import Any

from flashbench.analysis.gate import (
    CANNOT_JUDGE,
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
from flashbench.analysis.gate_rule import cannot_judge_label, pct

# ---------------------------------------------------------------------------------------------- case labels
# Case-key fields by position (spec/cases.py Case.key); the serving and window parts follow when present.
KEY_FIELDS = ("provider", "b", "h", "kv", "q", "k", "d", "dtype", "mask", "mode")
# Fields left out of a label when the others still tell every case apart (in the speed preset the batch
# follows from N, the heads from d and seq_k equals seq_q): a 62-character key becomes "triton q1024 d128 causal
# fwd+bwd".
REDUNDANT = ("b", "kv", "h", "k")


def short_labels(keys: list[str], named: bool = True) -> tuple[dict[str, str], str]:
    """Labels made of the key fields that vary, and a line naming the fields every key shares.

    `named`: the keys start with the provider (case keys; in-run ratio shapes do not). Fields that are the same
    in every key are left out and named in the line; of the rest, REDUNDANT fields go where the labels stay
    unique.
    """
    names = KEY_FIELDS if named else KEY_FIELDS[1:]
    split = {key: key.split("|") for key in keys}
    width = max((len(parts) for parts in split.values()), default=0)
    fields = list(names) + [f"extra{i}" for i in range(width - len(names))]
    table = {
        key: dict(zip(fields, parts + [""] * (width - len(parts)), strict=True))
        for key, parts in split.items()
    }
    shared = [f for f in fields if len({row[f] for row in table.values()}) == 1 and f != "provider"]
    kept = [f for f in fields if f not in shared]
    for name in REDUNDANT:
        trial = [f for f in kept if f != name]
        if name in kept and len({tuple(row[f] for f in trial) for row in table.values()}) == len(table):
            kept = trial
    labels = {key: " ".join(row[f] for f in kept if row[f]) or key for key, row in table.items()}
    first = next(iter(table.values()), {})
    line = " ".join(first[f] for f in shared if first.get(f))
    return labels, line


def natural(key: str) -> list[Any]:
    """Sort key that orders q2048 before q16384."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


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
    header += ["interval", "limit", "noise", "note"]
    rows = []
    for c in cases:
        note = "; ".join(filter(None, [c.note, f"throttled: {c.throttled}" if c.throttled else ""]))
        limit = "" if c.threshold is None else pct(c.threshold)
        noise = "" if c.noise is None else f"{pct(c.noise)} ({c.noise_source})"
        rows.append(
            [f"`{show_key(c.key)}`", *([c.label] if with_verdict else []), fmt_ms(c.baseline_ms)]
            + [
                fmt_ms(c.current_ms),
                fmt_change(c.ratio),
                fmt_interval(c.ci_low, c.ci_high),
                limit,
                noise,
                note,
            ]
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
        [f"`{show_key(r.shape)}`", f"{r.bundled} / {r.reference}", *([r.label] if with_verdict else [])]
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
    conf = f"{cfg.confidence * 100:.0f}%"
    lines = [f"## flashbench gate: {'PASS' if result.passed else 'FAIL'}", "", result.headline(), ""]
    overrides = ", ".join(f"{p} {pct(t)}" for p, t in sorted(cfg.provider_thresholds.items()))
    lines += [
        f"Baseline `{result.baseline}`, current `{result.current}`. The gate catches slowdowns of "
        f"{pct(cfg.threshold)}{' (' + overrides + ')' if overrides else ''}: a case regresses when its median is "
        "slower than its limit, half that or its noise band if wider, in time and in cycles where both sides "
        f"recorded the SM clock, its {conf} bootstrap interval lies above 1 and its p10 moved past the limit too. "
        "A case whose noise band exceeds half the threshold cannot promise that verdict and says "
        f"{cannot_judge_label(cfg.threshold)!r} (change = current / baseline - 1; docs/gate.md).",
        "",
    ]
    env_rows = [
        [e.name, e.baseline or "?", (f"**{e.current or '?'}** (differs)" if e.differs else e.current or "?")]
        for e in result.env
    ]
    lines += _md_table(["environment", "baseline", "current"], env_rows)
    by = {
        v: [c for c in result.cases if c.verdict == v] for v in (REGRESSION, NOISY, IMPROVEMENT, CANNOT_JUDGE)
    }
    right = {1, 2, 3, 5, 6}
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
    loops = result.loop_regressions
    if loops:
        rows = [
            [f"`{show_key(c.key)}`", fmt_ms(c.loop_baseline_ms), fmt_ms(c.loop_current_ms)]
            + [fmt_change(c.loop_ratio), pct(c.loop_threshold or 0.0), fmt_change(c.ratio)]
            for c in loops
        ]
        header = ["case", "baseline loop ms", "current loop ms", "change", "limit", "GPU time change"]
        lines += [f"### Loop time regressions ({len(loops)})", "", *_md_table(header, rows, {1, 2, 3, 4, 5})]
    if result.ratio_regressions:
        header, rows = _ratio_rows(result.ratio_regressions)
        lines += [f"### In-run ratio regressions ({len(rows)})", "", *_md_table(header, rows, {2, 3, 4})]
    if by[IMPROVEMENT]:
        lines += [
            f"### Improvements ({len(by[IMPROVEMENT])})",
            "",
            *_md_table(*_timing_rows(by[IMPROVEMENT]), right),
        ]
    if by[CANNOT_JUDGE]:
        counts = ", ".join(f"{n} {label}" for label, n in result.cannot_judge().items())
        rows = [
            [
                f"`{show_key(c.key)}`",
                fmt_change(c.ratio),
                pct(c.noise or 0.0),
                c.noise_source,
                pct(c.threshold or 0.0),
            ]
            for c in by[CANNOT_JUDGE]
        ]
        lines += [
            f"<details><summary>Cannot judge ({counts}): noise band over half the threshold</summary>",
            "",
            *_md_table(["case", "change", "noise", "from", "limit"], rows, {1, 2, 4}),
            "</details>",
            "",
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
    lines += _md_table(*_timing_rows(compared, with_verdict=True), {2, 3, 4, 6, 7})
    lines += ["</details>", ""]
    if result.ratios:
        lines += [f"<details><summary>In-run ratios ({len(result.ratios)})</summary>", ""]
        lines += _md_table(*_ratio_rows(result.ratios, with_verdict=True), {3, 4, 5})
        lines += ["</details>", ""]
    return "\n".join(lines)

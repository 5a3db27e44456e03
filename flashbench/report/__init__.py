"""The report of a run: one offline HTML page, a markdown summary, or tidy CSV / JSON.

from flashbench.report import build
text = build("results/RUN", fmt="md")                       # the text of the report
build("results/RUN", fmt="html", out="report.html")         # written to a file
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flashbench.analysis import runs as analysis
from flashbench.analysis.gate import judge
from flashbench.errors import FlashbenchError
from flashbench.report import exports, markdown
from flashbench.results.baseline import side_of
from flashbench.results.paths import make_dir

FORMATS = ("html", "md", "csv", "json")


def build(
    run_dir: str | Path,
    *,
    fmt: str = "html",
    out: str | Path | None = None,
    baseline: str | Path | None = None,
    speedup_vs: str | None = None,
) -> str:
    """Render the report of `run_dir` in `fmt`; write it to `out` when given. Returns the text.

    baseline: another run directory to compare with case by case. speedup_vs: the provider speedups are
    taken against (default: analysis.runs.SPEEDUP_VS_HELP's rule, over the providers' declared baselines).
    """
    if fmt not in FORMATS:
        raise FlashbenchError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
    run = analysis.load_run(run_dir)
    base_run = analysis.load_run(baseline) if baseline is not None else None
    base_provider = analysis.pick_baseline(run.frame, speedup_vs)
    verdicts = gate_view(base_run, run) if base_run is not None else None
    if fmt == "html":
        from flashbench.report import (
            html,  # deferred: it needs plotly, which md/csv/json do not (GPU machines may lack it)
        )

        text = html.render(run, base_provider, base_run, verdicts)
    elif fmt == "md":
        text = markdown.render(run, base_provider, base_run, verdicts)
    else:
        text = exports.to_csv(run, base_provider) if fmt == "csv" else exports.to_json(run, base_provider)
    if out is not None:
        out = Path(out)
        make_dir(out.parent, "-o", out)  # "afile.txt is a file", not mkdir's "File exists"
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise FlashbenchError(f"cannot write {out}: {exc.strerror or exc}") from None
    return text


def gate_view(baseline: analysis.Run, current: analysis.Run) -> Any:
    """The gate's decision for the two runs (flashbench.analysis.gate.judge), for the report to show beside its ratios:
    judged on the rows the report read, so each run is read from disk once.

    The report never fails on it: another GPU model is allowed (and noted), and a comparison the gate refuses
    (no case in common) leaves the report's own case-by-case ratios alone (None).
    """
    sides = (side_of(run.name, run.env, run.rows) for run in (baseline, current))
    try:
        return judge(*sides, allow_mismatch=True)
    except FlashbenchError:
        return None


__all__ = ["FORMATS", "build", "gate_view"]

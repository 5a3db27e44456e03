"""The report's section on two runs side by side: per-provider ratios, the ratio figure, the changed cases.

The gate's verdict itself leads the page (report/verdict.py); this section holds the case-by-case detail.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from flashbench.analysis import comparison as cmp
from flashbench.report.tables import details, table
from flashbench.report.tables import figure as _fig
from flashbench.results.env import same_code

if TYPE_CHECKING:
    from flashbench.analysis.runs import Run


def section(run: Run, baseline_run: Run, verdicts: Any) -> tuple[str, str, str, str]:
    """(anchor, title, note, body) of the comparison with `baseline_run`."""
    from flashbench.report import figures

    joined = cmp.compare_runs(run.frame, baseline_run.frame)
    cross = not cmp.same_gpu(run, baseline_run)
    cur_label, base_label = (run.gpu_name, baseline_run.gpu_name) if cross else ("now", "before")
    body = (
        f'<div class="banner warn">{html.escape(cmp.cross_gpu_note(run, baseline_run))}</div>'
        if cross
        else ""
    )
    # Which code each side ran (env.json's fingerprint): same code and a slower case = the machine moved.
    code = same_code(baseline_run.env.fingerprint, run.env.fingerprint)
    body += f'<p class="note">{html.escape(code)}</p>'
    if verdicts is not None and cross:
        body += f"<p>{html.escape(cmp.NO_GATE_ACROSS_GPUS)}</p>"
    elif verdicts is not None:
        joined = cmp.add_verdicts(joined, verdicts)
        body += f"<p><b>Gate: {html.escape(verdicts.headline())}</b> (the summary at the top names the worst cases)</p>"
        body += "".join(f'<p class="note">{html.escape(n)}</p>' for n in verdicts.notes if n != code)
    summary = cmp.compare_summary(joined, roofline=cross)
    if cross:
        summary = summary.rename(
            columns={
                "median_pct_of_roofline": f"median % of roofline, {cur_label}",
                "median_pct_of_roofline_baseline": f"median % of roofline, {base_label}",
            }
        )
    fig = figures.comparison(joined, baseline_run.name, cur_label, base_label, cross_gpu=cross)
    body += table(summary, ratios=("median_ratio", "worst_ratio", "best_ratio"))
    body += _fig(fig) if fig is not None else "<p>No case was measured ok in both runs.</p>"
    if cross:
        both = joined[joined["ratio"].notna()]
        body += details(
            f"{len(both)} cases side by side ({cur_label} | {base_label})",
            table(cmp.side_by_side(both, cur_label, base_label), ratios=("ratio",)),
        )
    flagged = joined["change"] != ""
    if "verdict" in joined:
        flagged |= joined["verdict"].isin(["regression", "improvement", "slower-within-noise"])
    changed = joined[flagged]
    if len(changed):
        cols = ["provider", "seq_q", "head_dim", "dtype", "causal", "mode", "status_baseline", "status"]
        cols += ["median_ms_baseline", "median_ms", "ratio", "change"]
        cols += ["verdict"] if "verdict" in joined else []
        body += details(f"{len(changed)} cases changed", table(changed[cols], ratios=("ratio",)))
    sides = (
        f" This run on {html.escape(run.gpu_name)}; {html.escape(baseline_run.name)} on "
        f"{html.escape(baseline_run.gpu_name)}."
    )
    note = (
        f"Cases joined on their key; ratio = this run's median time / {html.escape(str(baseline_run.path))}'s "
        "(above 1 = slower now). Per provider: the median ratio over the cases both runs measured."
        + sides
        + (" Each side's % of roofline is against its own GPU's roofline." if cross else "")
    )
    title = f"Against {baseline_run.name}" + (f" ({base_label}): different GPUs" if cross else "")
    return "compare", title, note, body

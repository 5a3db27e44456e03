"""A markdown summary fit for a pull-request comment or $GITHUB_STEP_SUMMARY: the verdict (the same text the
HTML page leads with), then short tables; no pictures, bytes in GiB."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks, host, serving, summary, walk
from flashbench.analysis import comparison as cmp
from flashbench.analysis import runs as an
from flashbench.analysis.modelled import ROOF_RULE
from flashbench.report import decode, verdict
from flashbench.report.style import fmt_bytes
from flashbench.results.rows import FLOP_CONVENTION

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.analysis.runs import Run

MAX_LINES = 15  # longest list of cases shown in full


def render(
    run: Run, baseline_provider: str | None, baseline_run: Run | None = None, verdicts: Any = None
) -> str:
    f = run.frame
    out = [f"## flashbench report: `{run.name}`", ""]
    out += [verdict.markdown(run, baseline_provider, baseline_run, verdicts).rstrip(), ""]
    out += [f"FLOPs: {FLOP_CONVENTION}.", ""]

    best = summary.best_per_provider(f)
    if len(best):
        out += ["### Best TFLOP/s per provider", "", f"{ROOF_RULE}", ""]
        out += _table(best.drop(columns=["time", "cases"]), formats=summary.BEST_FORMATS)
    walks = walk.walk_table(f, walk.sm_count_of(run.env, run.gpu_spec))
    if len(walks):
        out += ["### SM fill of the bundled forward (modelled; the least filled first)", ""]
        out += [walk.WALK_RULE, ""]
        out += _table(walks.head(MAX_LINES), formats=walk.WALK_FORMATS)
        if len(walks) > MAX_LINES:
            out += [f"… {len(walks) - MAX_LINES} more in the HTML report.", ""]
    bw = serving.best_bandwidth(f)
    if len(bw):
        out += ["### Best GB/s per provider (serving rows)", ""]
        out += _table(bw.drop(columns=["cases"]), formats=serving.BANDWIDTH_FORMATS)
    hosts = host.host_table(f)
    if len(hosts):
        bound = int(hosts["host-bound"].eq(True).sum())
        out += [f"### Host time and energy ({bound} of {len(hosts)} cases host-bound; host-bound first)", ""]
        out += _table(hosts.head(MAX_LINES), formats=HOST_FORMATS)
        if len(hosts) > MAX_LINES:
            out += [f"… {len(hosts) - MAX_LINES} more in the CSV export (host_ms, loop_ms, energy_j).", ""]

    rc = an.recompute_overhead(f)
    refs = an.recompute_references()
    rc = rc[rc["recompute_ms"].notna() & rc["stored_ms"].notna()] if len(rc) else rc
    if len(rc):
        pair = f"`{rc['recompute_provider'].iloc[0]}` vs `{rc['stored_provider'].iloc[0]}`"
        rows = [
            {
                "mode": mode,
                "cases": len(g),
                "median time overhead %": 100 * g["time_overhead"].median(),
                **{f"expected from {ref.name} %": 100 * ref.value for ref in refs},
                "median memory saved": fmt_bytes(g["mem_saved_bytes"].median()),
            }
            for mode, g in rc.groupby("mode", sort=False)
        ]
        out += [
            f"### Recompute overhead ({pair}, the backward alone from --mode bwd rows; below 0: recomputing is "
            "faster)",
            "",
        ]
        out += _table(_frame(rows))

    out += decode.markdown_lines(run)
    if baseline_run is not None:
        joined = cmp.compare_runs(f, baseline_run.frame)
        cross = not cmp.same_gpu(run, baseline_run)
        out += [f"### Against `{baseline_run.name}` (time ratio now / before, above 1 = slower)", ""]
        this_dev = "CPU" if run.is_cpu else run.gpu_name
        base_dev = "CPU" if baseline_run.is_cpu else baseline_run.gpu_name
        out += [f"This run: **{this_dev}** · `{baseline_run.name}`: **{base_dev}**", ""]
        if cross:
            out += [f"> **{cmp.cross_gpu_note(run, baseline_run)}**", ""]
        if verdicts is not None and not cross:
            joined = cmp.add_verdicts(joined, verdicts)
        table = cmp.compare_summary(joined, roofline=cross)
        names = {"median_ratio": "median ratio", "worst_ratio": "worst", "best_ratio": "best"}
        names["median_pct_of_roofline"] = f"median % of roofline, {this_dev}"
        names["median_pct_of_roofline_baseline"] = f"median % of roofline, {base_dev}"
        out += _table(table, names)
        worst = joined[joined["ratio"].notna()].sort_values("ratio", ascending=False).head(5)
        if len(worst):
            out += ["Slowest cases now:", ""]
            for r in worst.to_dict("records"):
                line = f"- `{r['key']}`: {r['ratio']:.3f}x"
                if cross:
                    line += (
                        f" ({this_dev} {_cell(r['tflops'])} TFLOP/s, {_cell(r['pct_of_roofline'])}% of its"
                        f" roofline; {base_dev} {_cell(r['tflops_baseline'])} TFLOP/s,"
                        f" {_cell(r['pct_of_roofline_baseline'])}% of its roofline)"
                    )
                out.append(line)
            out.append("")
        failing = joined[joined["change"] == "newly failing"]
        if len(failing):
            out += [f"**{len(failing)} newly failing cases:**", ""]
            out += [
                f"- `{k}`: {s}" for k, s in zip(failing["key"][:MAX_LINES], failing["status"], strict=False)
            ]
            out.append("")

    refused = f[f["status"].isin(summary.NOT_RUN)]
    if len(refused):
        out += [f"### Refused or not attempted ({len(refused)})", ""]
        counts = (
            refused.groupby(["status", "provider"], sort=False)
            .agg(cases=("status", "size"), reason=("reason", "first"))
            .reset_index()
        )
        counts["reason"] = counts["reason"].map(lambda s: summary.shorten(s, 100).replace("|", "/"))
        out += _table(counts)
    thr = clocks.throttled_cases(f, run.env)
    if len(thr):
        out += [f"### Throttled cases ({len(thr)}), lowest clock first", ""]
        out += _table(thr.head(MAX_LINES))
        if len(thr) > MAX_LINES:
            out += [f"… {len(thr) - MAX_LINES} more in the HTML report.", ""]
    return "\n".join(out).rstrip() + "\n"


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "/")


def _table(
    df: pd.DataFrame, names: dict[str, str] | None = None, formats: dict[str, str] | None = None
) -> list[str]:
    """A markdown table; formats: {column: format spec}, one precision per column."""
    names, formats = names or {}, formats or {}
    head = [names.get(c, c) for c in df.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for rec in df.itertuples(index=False):
        cells = []
        for col, v in zip(df.columns, rec, strict=True):
            v = v.item() if hasattr(v, "item") else v
            fmt = formats.get(col)
            cells.append(format(v, fmt) if fmt and isinstance(v, float) and v == v else _cell(v))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


HOST_FORMATS = {
    "GPU ms": ".4g",
    "GPU ms in the loop": ".4g",
    "host ms": ".4g",
    "loop ms": ".4g",
    "loop / GPU": ".2f",
    "J per call": ".4g",
}

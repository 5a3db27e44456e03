"""A markdown summary fit for a pull-request comment or $GITHUB_STEP_SUMMARY: short, tables, no pictures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.results.rows import FLOP_CONVENTION

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.analysis.runs import Run

MAX_LINES = 15  # longest list of cases shown in full


def render(
    run: Run, baseline_provider: str | None, baseline_run: Run | None = None, verdicts: Any = None
) -> str:
    from flashbench.analysis import comparison as cmp
    from flashbench.analysis import runs as an
    from flashbench.report import decode

    f = run.frame
    counts = f["status"].value_counts()
    ok = int(counts.get("ok", 0))
    out = [f"## flashbench report: `{run.name}`", ""]
    device = "CPU" if run.is_cpu else run.gpu_name
    out.append(
        f"**{device}** · {len(f)} cases · {ok} ok · {len(f) - ok} not ok · {int(f['throttled'].sum())} throttled"
    )
    if run.is_cpu:
        out += [
            "",
            "> **CPU run**: all times are CPU times (torch on CPU, Triton interpreter), not GPU speeds.",
        ]
    if run.env.synthetic:
        out += ["", "> **SYNTHETIC results**: generated for tests, not measured."]
    out += ["", f"FLOPs: {FLOP_CONVENTION}.", ""]

    best = an.best_per_provider(f)
    if len(best):
        out += ["### Best TFLOP/s per provider", ""]
        has_roof = best["median_pct_of_roofline"].notna().any()
        cols = ["provider", "dtype", "mode", "max_tflops", "at"] + (
            ["median_pct_of_roofline"] if has_roof else []
        )
        names = {"max_tflops": "max TFLOP/s", "median_pct_of_roofline": "median % of roofline"}
        out += _table(best[cols], names)

    if baseline_provider:
        sp = an.speedups(f, baseline_provider)
        sp = sp[sp["provider"] != baseline_provider]
        if len(sp):
            rows = [
                {
                    "provider": p,
                    "cases": len(g),
                    "geomean": an.geomean(g["speedup"]),
                    "min": g["speedup"].min(),
                    "max": g["speedup"].max(),
                }
                for p, g in sp.groupby("provider", sort=False)
            ]
            out += [f"### Speedup over `{baseline_provider}` (same shape, both ok)", ""]
            out += _table(_frame(rows), {"geomean": "geomean ×", "min": "min ×", "max": "max ×"})

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
                "median memory saved": _bytes(g["mem_saved_bytes"].median()),
            }
            for mode, g in rc.groupby("mode", sort=False)
        ]
        out += [f"### Recompute overhead ({pair}: recompute backward against stored P)", ""]
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
        if verdicts is not None and cross:
            out += [f"{cmp.NO_GATE_ACROSS_GPUS}", ""]
        elif verdicts is not None:
            joined = cmp.add_verdicts(joined, verdicts)
            out += [f"**Gate: {verdicts.headline()}**", ""]
        summary = cmp.compare_summary(joined, roofline=cross)
        names = {"median_ratio": "median ratio", "worst_ratio": "worst", "best_ratio": "best"}
        names["median_pct_of_roofline"] = f"median % of roofline, {this_dev}"
        names["median_pct_of_roofline_baseline"] = f"median % of roofline, {base_dev}"
        out += _table(summary, names)
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

    fails = an.failures(f)
    if len(fails):
        out += [f"### Cases without a speed ({len(fails)})", ""]
        counts_df = (
            fails.groupby(["status", "provider"], sort=False)
            .agg(cases=("status", "size"), reason=("reason", "first"))
            .reset_index()
        )
        counts_df["reason"] = counts_df["reason"].map(
            lambda s: str(s)[:100].replace("|", "/").replace("\n", " ")
        )
        out += _table(counts_df)
    thr = an.throttled(f)
    if len(thr):
        out += [f"### Throttled cases ({len(thr)}): speeds suspect", ""]
        out += _table(
            thr.head(MAX_LINES)[["provider", "seq_q", "head_dim", "causal", "mode", "sm_clock_mhz_after"]]
        )
    return "\n".join(out).rstrip() + "\n"


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows)


def _bytes(value: float) -> str:
    if value != value:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "/")


def _table(df: pd.DataFrame, names: dict[str, str] | None = None) -> list[str]:
    names = names or {}
    head = [names.get(c, c) for c in df.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v.item() if hasattr(v, "item") else v) for v in rec) + " |")
    return [*lines, ""]

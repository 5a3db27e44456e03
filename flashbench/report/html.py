"""One self-contained, offline HTML page: plotly.js inlined once, no network request of any kind.

No CDN, no MathJax, no web fonts: the page opens from an e-mail attachment on a machine with no network.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flashbench.results.rows import FLOP_CONVENTION

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run

PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "toImageButtonOptions": {"format": "png", "scale": 2},
}
MAX_TABLE_ROWS = 400

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0;
       color: #1d1d1f; background: #f6f7f9; }
header { background: #14213d; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header .sub { color: #c9d1e3; font-size: 14px; }
nav { padding: 8px 32px; background: #e8ebf2; font-size: 14px; position: sticky; top: 0; z-index: 10; }
nav a { margin-right: 14px; color: #14213d; text-decoration: none; }
main { padding: 8px 32px 40px 32px; max-width: 1500px; }
section { background: #fff; border-radius: 8px; padding: 14px 20px; margin: 16px 0;
          box-shadow: 0 1px 3px rgba(0,0,0,.08); }
section h2 { font-size: 18px; margin: 4px 0 6px 0; }
p.note { color: #555; font-size: 13px; margin: 4px 0 10px 0; max-width: 1100px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0; }
.card { background: #f1f3f8; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { font-size: 12px; color: #555; }
.banner { padding: 10px 16px; border-radius: 6px; margin: 12px 0; font-weight: 600; }
.banner.warn { background: #fff4d6; border: 1px solid #e6c200; }
.banner.info { background: #e6f0ff; border: 1px solid #8fb3ff; }
table.tbl { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
table.tbl th { background: #eef0f5; text-align: left; padding: 4px 10px; position: sticky; top: 34px; }
table.tbl td { padding: 3px 10px; border-top: 1px solid #e3e5ea; vertical-align: top; }
table.tbl td.num { text-align: right; font-variant-numeric: tabular-nums; }
details summary { cursor: pointer; color: #14213d; font-size: 14px; margin: 6px 0; }
.status-bad { color: #b00020; font-weight: 600; }
footer { color: #777; font-size: 12px; padding: 0 32px 24px 32px; }
"""


def render(
    run: Run, baseline_provider: str | None, baseline_run: Run | None = None, verdicts: Any = None
) -> str:
    """The whole page for `run`; with `baseline_run`, the two-run comparison (and the gate's verdicts) too."""
    import plotly.offline

    from flashbench import __version__
    from flashbench.analysis import comparison as cmp
    from flashbench.analysis import runs as an
    from flashbench.report import decode, figures, model_figures

    sections: list[str] = []
    nav: list[tuple[str, str]] = []

    def add(anchor: str, title: str, note: str, body: str) -> None:
        nav.append((anchor, title))
        sections.append(
            f'<section id="{anchor}"><h2>{html.escape(title)}</h2>'
            + (f'<p class="note">{note}</p>' if note else "")
            + body
            + "</section>"
        )

    frame = run.frame
    cross = baseline_run is not None and not cmp.same_gpu(run, baseline_run)
    dtypes = set(frame["dtype"]) | (set(baseline_run.frame["dtype"]) if cross else set())
    for dtype in sorted(dtypes):
        if cross:
            fig = model_figures.roofline_compare([run, baseline_run], dtype)
            if fig is not None:
                add(
                    f"roofline-{dtype}",
                    f"Roofline ({dtype}): {run.gpu_name} vs {baseline_run.gpu_name}",
                    "The two runs are from different GPUs: each panel is one GPU's ceilings (datasheet, "
                    "NVML-derived and measured where recorded, in that GPU's colour) with that run's points on "
                    "them; the dotted faint line is the other GPU's datasheet roof, for reference. A point's % of "
                    "roofline is against its own GPU. Filled: compulsory intensity; open: the provider family's "
                    "no-L2 intensity. Hover a point for the case and its % of roofline.",
                    _fig(fig),
                )
            continue
        fig = model_figures.roofline(run, dtype)
        if fig is not None:
            add(
                f"roofline-{dtype}",
                f"Roofline ({dtype})",
                "Each point is one measured case (status ok), drawn twice at the same TFLOP/s: at the compulsory "
                "intensity, where every input is read once and every output written once (filled), and at the "
                "intensity of the provider family's own traffic with no L2 reuse: the naive path's N×N round "
                "trips, a tiled kernel's K/V re-reads per block (open). Lines: the GPU's ceilings, attainable = "
                "min(peak, intensity × bandwidth). Hover a point for the case and its % of roofline.",
                _fig(fig),
            )
    if run.is_cpu:
        add("roofline", "Roofline", "CPU run: there is no GPU roofline for CPU times.", "")
    elif not any(a.startswith("roofline") for a, _ in nav):
        add(
            "roofline",
            "Roofline",
            "No roofline: the byte model or this GPU's ceilings are not available.",
            "",
        )

    for anchor, title, metric in (
        ("tflops", "TFLOP/s against N", "tflops"),
        ("latency", "Latency", "median_ms"),
    ):
        fig = figures.speed_vs_seq(run, metric)
        if fig is not None:
            note = (
                f"Only cases with status ok. FLOPs: {html.escape(FLOP_CONVENTION)}. ✕ marks a throttled case."
            )
            add(anchor, title, note, _fig(fig))
    if baseline_provider:
        fig = figures.speedup(run, baseline_provider)
        if fig is not None:
            add("speedup", f"Speedup over {baseline_provider}", "Same shape key, both cases ok.", _fig(fig))
    fig = model_figures.memory(run)
    add(
        "memory",
        "Peak memory",
        "Bytes allocated above the inputs, from a separate untimed run. Dotted lines: flashbench's memory "
        "model; red crosses: out of memory (✕) or predicted not to fit and skipped (⊗), drawn at the "
        "model's bytes; dashed red line: the GPU's memory."
        if fig is not None
        else "This run recorded no peak memory and no out-of-memory case.",
        _fig(fig) if fig is not None else "",
    )
    fig = model_figures.recompute(run)
    if fig is not None:
        rc = an.recompute_overhead(frame)
        add(
            "recompute",
            "Recompute overhead",
            "FlashAttention's backward recomputes P from Q, K and the saved log-sum-exp instead of storing it. "
            "This compares the backward alone (--mode bwd) with the stored-P variant of the same kernel: the "
            "time the recomputation costs (left; the dotted lines are the overhead if time followed the credited "
            "or the executed FLOPs) and the memory it saves (right).",
            _fig(fig) + _details("Recompute overhead table", _table(_recompute_table(rc))),
        )
    decode.html_section(run, add)
    fig = model_figures.hbm_bytes(run)
    if fig is not None:
        add("bytes", "Measured vs modelled HBM bytes", "Rows measured with sweep --ncu.", _fig(fig))
    if baseline_run is not None:
        joined = cmp.compare_runs(frame, baseline_run.frame)
        cross_note = cmp.cross_gpu_note(run, baseline_run)
        cur_label, base_label = (run.gpu_name, baseline_run.gpu_name) if cross else ("now", "before")
        body = f'<div class="banner warn">{html.escape(cross_note)}</div>' if cross else ""
        if verdicts is not None and cross:
            body += f"<p>{html.escape(cmp.NO_GATE_ACROSS_GPUS)}</p>"
        elif verdicts is not None:
            joined = cmp.add_verdicts(joined, verdicts)
            body += f"<p><b>Gate: {html.escape(verdicts.headline())}</b></p>"
            body += "".join(f'<p class="note">{html.escape(n)}</p>' for n in verdicts.notes)
        summary = cmp.compare_summary(joined, roofline=cross)
        if cross:
            summary = summary.rename(
                columns={
                    "median_pct_of_roofline": f"median % of roofline, {cur_label}",
                    "median_pct_of_roofline_baseline": f"median % of roofline, {base_label}",
                }
            )
        fig = figures.comparison(joined, baseline_run.name, cur_label, base_label, cross_gpu=cross)
        body += _table(summary, ratios=("median_ratio", "worst_ratio", "best_ratio"))
        body += _fig(fig) if fig is not None else "<p>No case was measured ok in both runs.</p>"
        if cross:
            both = joined[joined["ratio"].notna()]
            body += _details(
                f"{len(both)} cases side by side ({cur_label} | {base_label})",
                _table(cmp.side_by_side(both, cur_label, base_label), ratios=("ratio",)),
            )
        flagged = joined["change"] != ""
        if "verdict" in joined:
            flagged |= joined["verdict"].isin(["regression", "improvement", "slower-within-noise"])
        changed = joined[flagged]
        if len(changed):
            cols = ["provider", "seq_q", "head_dim", "dtype", "causal", "mode", "status_baseline", "status"]
            cols += ["median_ms_baseline", "median_ms", "ratio", "change"]
            cols += ["verdict"] if "verdict" in joined else []
            body += _details(f"{len(changed)} cases changed", _table(changed[cols], ratios=("ratio",)))
        sides = (
            f" This run on {html.escape(run.gpu_name)}; {html.escape(baseline_run.name)} on "
            f"{html.escape(baseline_run.gpu_name)}."
        )
        add(
            "compare",
            f"Against {baseline_run.name}" + (f" ({base_label}): different GPUs" if cross else ""),
            f"Cases joined on their key; ratio = this run's median time / {html.escape(str(baseline_run.path))}'s "
            "(above 1 = slower now). Per provider: the median ratio over the cases both runs measured."
            + sides
            + (" Each side's % of roofline is against its own GPU's roofline." if cross else ""),
            body,
        )
    best = an.best_per_provider(frame)
    if len(best) and best["median_pct_of_roofline"].isna().all():
        best = best.drop(columns="median_pct_of_roofline")
    if len(best):
        names = {
            "max_tflops": "max TFLOP/s",
            "median_pct_of_roofline": "median % of roofline",
            "time_label": "time",
        }
        add("best", "Best TFLOP/s per provider", "", _table(best.rename(columns=names)))
    fails = an.failures(frame)
    add(
        "failed",
        f"Failed, unsupported and skipped cases ({len(fails)})",
        "Never shown as speeds. The reason is the provider's refusal, the error, or the predicted bytes.",
        _status_counts(fails) + (_details("All cases", _table(fails)) if len(fails) else ""),
    )
    thr = an.throttled(frame)
    add(
        "throttled",
        f"Throttled cases ({len(thr)})",
        "NVML reported a clock-event reason other than idle during these cases: their speed is suspect.",
        _table(thr) if len(thr) else "<p>None.</p>",
    )
    add("env", "Environment", "", _table(_env_table(run.env.to_dict()), header=False))

    head = _header(run, baseline_provider, baseline_run)
    nav_html = "".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in nav)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>flashbench report: {html.escape(run.name)}</title>"
        f"<style>{CSS}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        f"</head><body>{head}<nav>{nav_html}</nav><main>{''.join(sections)}</main>"
        f"<footer>flashbench {__version__} · generated {stamp} · offline page, plotly.js embedded</footer>"
        "</body></html>\n"
    )


def _fig(fig: go.Figure) -> str:
    height = fig.layout.height or 500
    return fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        include_mathjax=False,
        config=PLOTLY_CONFIG,
        default_height=f"{height}px",
        default_width="100%",
    )


def _header(run: Run, baseline_provider: str | None, baseline_run: Run | None) -> str:
    f = run.frame
    counts = f["status"].value_counts()
    cards = [
        ("device", "CPU" if run.is_cpu else run.gpu_name),
        ("cases", len(f)),
        ("ok", int(counts.get("ok", 0))),
        ("not ok", int(len(f) - counts.get("ok", 0))),
        ("throttled", int(f["throttled"].sum())),
        ("providers", len(f["provider"].unique())),
        ("speedups over", baseline_provider or "—"),
    ]
    card_html = "".join(
        f'<div class="card"><div class="v">{html.escape(str(v))}</div><div class="k">{k}</div></div>'
        for k, v in cards
    )
    banners = ""
    if run.is_cpu:
        banners += (
            '<div class="banner warn">CPU run: every time on this page is a CPU time (torch on CPU, Triton '
            "interpreter), useful to check the pipeline, meaningless as a GPU speed.</div>"
        )
    elif (f["device"] == "cpu").any():
        banners += (
            '<div class="banner warn">Some rows are CPU times (device = cpu): they are labelled so.</div>'
        )
    if run.env.synthetic:
        banners += '<div class="banner warn">SYNTHETIC results: generated for tests, not measured.</div>'
    if baseline_run is not None:
        from flashbench.analysis.comparison import cross_gpu_note

        banners += f'<div class="banner info">Compared with {html.escape(str(baseline_run.path))}.</div>'
        note = cross_gpu_note(run, baseline_run)
        if note:
            banners += f'<div class="banner warn">{html.escape(note[0].upper() + note[1:])}</div>'
    return (
        f"<header><h1>flashbench report: {html.escape(run.name)}</h1>"
        f'<div class="sub">{html.escape(" · ".join(_facts(run)))}</div></header>'
        f'<main style="padding-bottom:0">{banners}<div class="cards">{card_html}</div></main>'
    )


def _facts(run: Run) -> list[str]:
    """The header line: where the run is, the GPU, and the versions the environment record has."""
    out = [str(run.path), "CPU" if run.is_cpu else run.gpu_name]
    for key, label in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"), ("triton", "triton")):
        value = getattr(run.env, key)
        if value:
            out.append(f"{label} {value}")
    return out


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def _fmt(value: Any, col: str, ratios: tuple[str, ...]) -> tuple[str, bool]:
    """(text, is_number) for one table cell."""
    if value is None or (isinstance(value, float) and value != value):
        return "", False
    if isinstance(value, bool):
        return ("yes" if value else "no"), False
    if isinstance(value, float):
        if col.endswith("bytes"):
            return _si(value) + "B", True
        if col in ratios:
            return f"{value:.3f}", True
        return f"{value:.4g}", True
    if isinstance(value, int):
        return (_si(value) + "B" if col.endswith("bytes") else str(value)), True
    return str(value), False


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} "


def _table(df: pd.DataFrame, header: bool = True, ratios: tuple[str, ...] = ()) -> str:
    if df.empty:
        return "<p>None.</p>"
    shown = df.head(MAX_TABLE_ROWS)
    out = ['<table class="tbl">']
    if header:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns) + "</tr>")
    for rec in shown.itertuples(index=False):
        cells = []
        for col, value in zip(shown.columns, rec, strict=True):
            text, num = _fmt(value.item() if hasattr(value, "item") else value, str(col), ratios)
            cls = (
                ' class="num"' if num else (' class="status-bad"' if col == "status" and text != "ok" else "")
            )
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    if len(df) > MAX_TABLE_ROWS:
        out.append(f"<p class='note'>… {len(df) - MAX_TABLE_ROWS} more rows: see --format csv.</p>")
    return "".join(out)


def _status_counts(fails: pd.DataFrame) -> str:
    if fails.empty:
        return "<p>None: every case produced a speed.</p>"
    counts = (
        fails.groupby(["status", "provider"], sort=False)
        .agg(cases=("status", "size"), first_reason=("reason", "first"))
        .reset_index()
    )
    counts["first_reason"] = counts["first_reason"].str.slice(0, 160)
    return _table(counts)


def _recompute_table(rc: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "seq_q",
        "head_dim",
        "causal",
        "mode",
        "recompute_ms",
        "stored_ms",
        "time_overhead",
        "credited_flops_recompute",
        "executed_flops_recompute",
        "recompute_mem_bytes",
        "stored_mem_bytes",
        "mem_saved_bytes",
    ]
    return rc[cols]


def _env_table(env: dict[str, Any]) -> pd.DataFrame:
    """The environment record flattened to (key, value) rows: nested objects as dotted keys."""
    import pandas as pd

    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k in sorted(value):
                walk(f"{prefix}.{k}" if prefix else str(k), value[k])
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(f"{prefix}[{i}]", v)
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            rows.append((prefix, text if len(text) <= 300 else text[:300] + " …"))

    walk("", env)
    return pd.DataFrame(rows, columns=["key", "value"])

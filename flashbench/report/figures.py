"""Plotly figures of a run's speeds, built from analysis frames: TFLOP/s, latency, speedup, run comparison.

Each function returns a Figure, or None with no data. Only rows that analysis marks ok are drawn as speeds;
failed cases appear in the memory figure (as OOM markers) and in the report's tables. Facets are one panel
per (head dim, causal, mode[, dtype]), the frame's "panel" column. The model-side figures (roofline, memory,
recompute, HBM bytes) are in model_figures.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from flashbench.spec.cases import mask_label

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
CEILING_DASH = {"datasheet": "solid", "NVML-derived": "dash", "measured": "dot"}
MODE_SYMBOL = {"fwd": "circle", "bwd": "diamond", "fwd+bwd": "square"}
PANEL_HEIGHT = 300
COLS = 4


def colors(provider_names: list[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(provider_names)}


def _hover(df: pd.DataFrame, extra: list[tuple[str, str, str]] = ()) -> list[str]:
    """One HTML hover text per row: the case, then its numbers. extra: (label, column, format)."""
    out = []
    for r in df.to_dict("records"):
        lines = [
            f"<b>{r['provider']}</b> · {r['time_label']}",
            f"N={r['seq_q']}"
            + (f"×{r['seq_k']}" if r["seq_k"] != r["seq_q"] else "")
            + f" d={r['head_dim']} {r['dtype']} {mask_label(r['causal'])} {r['mode']}",
            f"batch={r['batch']} heads={r['heads']}"
            + (f" kv={r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""),
        ]
        if r.get("median_ms") == r.get("median_ms") and r.get("median_ms") is not None:
            lines.append(f"median {r['median_ms']:.4g} ms (p20 {r['p20_ms']:.4g}, p80 {r['p80_ms']:.4g})")
        if r.get("tflops") == r.get("tflops") and r.get("tflops") is not None:
            lines.append(f"{r['tflops']:.4g} TFLOP/s")
        for label, col, fmt in extra:
            value = r.get(col)
            if value is not None and value == value and value != "":
                lines.append(f"{label}: {_si_bytes(value) if fmt == 'B' else format(value, fmt)}")
        if r.get("throttled"):
            lines.append("⚠ throttled during this case")
        if r.get("status") != "ok":
            lines.append(f"status: {r['status']} {str(r.get('reason', ''))[:80]}")
        out.append("<br>".join(lines))
    return out


def _si_bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.0f} B"


def _grid(
    panels: list[str], title: str, y_title: str, x_title: str = "sequence length N", **kw: Any
) -> go.Figure:
    from plotly.subplots import make_subplots

    cols = min(COLS, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=panels,
        horizontal_spacing=0.06,
        vertical_spacing=min(0.12, 0.5 / max(rows - 1, 1)),
        **kw,
    )
    fig.update_layout(
        title=title,
        height=PANEL_HEIGHT * rows + 140,
        template="plotly_white",
        legend={"orientation": "h", "y": -0.08 if rows > 1 else -0.2, "x": 0},
        margin={"t": 80, "l": 60, "r": 20, "b": 60},
        hoverlabel={"align": "left"},
    )
    fig.update_xaxes(type="log", title_text=None)
    for c in range(1, cols + 1):
        fig.update_xaxes(title_text=x_title, row=rows, col=c)
    for r in range(1, rows + 1):
        fig.update_yaxes(title_text=y_title, row=r, col=1)
    return fig


def _n_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _n_ticks(fig: go.Figure, values: Any) -> None:
    """Tick the log N axes at the measured sequence lengths (512, 1k, 2k, ...) instead of 2, 5, 10."""
    ns = sorted({int(v) for v in values})
    if len(ns) > 12:
        ns = ns[:: math.ceil(len(ns) / 12)]
    fig.update_xaxes(tickvals=ns, ticktext=[_n_label(n) for n in ns])


def _cell(panels: list[str], panel: str) -> tuple[int, int]:
    i = panels.index(panel)
    cols = min(COLS, len(panels))
    return i // cols + 1, i % cols + 1


def _panels(df: pd.DataFrame) -> list[str]:
    order = df.sort_values(["dtype", "mode", "causal", "head_dim"])["panel"]
    return list(dict.fromkeys(order))


def _time_word(df: pd.DataFrame) -> str:
    labels = set(df["time_label"])
    return (
        "CPU time" if labels == {"CPU time"} else ("GPU time" if labels == {"GPU time"} else "GPU/CPU time")
    )


def speed_vs_seq(run: Run, metric: str = "tflops") -> go.Figure | None:
    """TFLOP/s (metric="tflops") or latency (metric="median_ms", log y) against N, per provider, faceted."""
    import plotly.graph_objects as go

    df = run.frame[run.frame["ok"] & run.frame[metric].notna()].sort_values("seq_q")
    if df.empty:
        return None
    panels, cmap = _panels(df), colors(list(dict.fromkeys(run.frame["provider"])))
    word = _time_word(df)
    if metric == "tflops":
        fig = _grid(panels, f"Achieved TFLOP/s against sequence length ({word})", "TFLOP/s")
    else:
        fig = _grid(panels, f"Latency against sequence length ({word}, median, bars p20–p80)", "ms (log)")
        fig.update_yaxes(type="log")
    seen: set[str] = set()
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = _cell(panels, panel)
        y = grp[metric]
        if metric == "tflops":
            hi, lo = (
                grp["flops"] / (grp["p20_ms"] * 1e-3) / 1e12,
                grp["flops"] / (grp["p80_ms"] * 1e-3) / 1e12,
            )
        else:
            hi, lo = grp["p80_ms"], grp["p20_ms"]
        err = {
            "type": "data",
            "array": (hi - y).clip(lower=0),
            "arrayminus": (y - lo).clip(lower=0),
            "width": 2,
        }
        fig.add_trace(
            go.Scatter(
                x=grp["seq_q"],
                y=y,
                mode="lines+markers",
                name=provider,
                legendgroup=provider,
                showlegend=provider not in seen,
                line={"color": cmap[provider]},
                marker={"symbol": ["x" if t else "circle" for t in grp["throttled"]], "size": 7},
                error_y=err,
                text=_hover(grp, [("% of roofline", "pct_of_roofline", ".1f"), ("bound", "bound", "s")]),
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        seen.add(provider)
    _n_ticks(fig, df["seq_q"])
    return fig


def speedup(run: Run, baseline: str) -> go.Figure | None:
    """Speedup against the baseline provider on the same shape, per provider, faceted."""
    import plotly.graph_objects as go

    from flashbench.analysis.runs import speedups

    df = speedups(run.frame, baseline)
    df = df[df["provider"] != baseline].sort_values("seq_q")
    if df.empty:
        return None
    panels, cmap = _panels(df), colors(list(dict.fromkeys(run.frame["provider"])))
    fig = _grid(panels, f"Speedup over {baseline} (its median time / the provider's, same shape)", "× faster")
    seen: set[str] = set()
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = _cell(panels, panel)
        fig.add_trace(
            go.Scatter(
                x=grp["seq_q"],
                y=grp["speedup"],
                mode="lines+markers",
                name=provider,
                legendgroup=provider,
                showlegend=provider not in seen,
                line={"color": cmap[provider]},
                text=_hover(grp, [("speedup", "speedup", ".3g"), (f"{baseline} ms", "baseline_ms", ".4g")]),
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        seen.add(provider)
    fig.add_hline(y=1.0, line={"color": "#888", "width": 1, "dash": "dot"})
    _n_ticks(fig, df["seq_q"])
    return fig


def comparison(
    joined: pd.DataFrame,
    baseline_name: str,
    current_label: str = "now",
    baseline_label: str = "before",
    cross_gpu: bool = False,
) -> go.Figure | None:
    """Two runs case by case: current median time / baseline median time against N (above 1 = slower).

    current_label / baseline_label name the two sides in the hover (the GPU names for a cross-GPU comparison,
    where the hover also gives each side's TFLOP/s and % of its own GPU's roofline).
    """
    import plotly.graph_objects as go

    df = joined[joined["ratio"].notna()].sort_values("seq_q")
    if df.empty:
        return None
    panels, cmap = _panels(df), colors(list(dict.fromkeys(joined["provider"])))
    if cross_gpu:
        title = (
            f"{current_label} against {baseline_label} ({baseline_name}): time ratio per case; "
            "different GPUs: ratios compare machines, not code"
        )
    else:
        title = f"This run against {baseline_name}: time ratio per case (above 1 = slower now)"
    fig = _grid(panels, title, "ratio")
    seen: set[str] = set()
    cur, base = _hover_escape(current_label), _hover_escape(baseline_label)
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = _cell(panels, panel)
        cols = ["median_ms", "median_ms_baseline", "tflops", "tflops_baseline"]
        cols += ["pct_of_roofline", "pct_of_roofline_baseline"]
        fig.add_trace(
            go.Scatter(
                x=grp["seq_q"],
                y=grp["ratio"],
                mode="lines+markers",
                name=provider,
                legendgroup=provider,
                showlegend=provider not in seen,
                line={"color": cmap[provider]},
                customdata=grp.reindex(columns=cols).to_numpy(dtype=float),
                hovertemplate=(
                    f"{provider}<br>N=%{{x}}<br>ratio %{{y:.3f}}<br>"
                    f"{cur}: %{{customdata[0]:.4g}} ms, %{{customdata[2]:.4g}} TFLOP/s, "
                    "%{customdata[4]:.1f}% of its roofline<br>"
                    f"{base}: %{{customdata[1]:.4g}} ms, %{{customdata[3]:.4g}} TFLOP/s, "
                    "%{customdata[5]:.1f}% of its roofline<extra></extra>"
                ),
            ),
            row=row,
            col=col,
        )
        seen.add(provider)
    fig.add_hline(y=1.0, line={"color": "#888", "width": 1, "dash": "dot"})
    _n_ticks(fig, df["seq_q"])
    return fig


def _hover_escape(text: str) -> str:
    import html

    return html.escape(text).replace("{", "(").replace("}", ")")  # no plotly %{...} inside a label

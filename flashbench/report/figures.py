"""Plotly figures of a run's speeds, built from analysis frames: TFLOP/s, latency, speedup, run comparison.

Each function returns a Figure, or None with no data. Only rows that analysis marks ok are drawn as speeds; a
line that stops because the next N ran out of memory ends in the OOM mark (✕, the same mark as the memory
figure's). Facets are one panel per (head dim, mask, mode[, dtype]), the frame's "panel" column; TFLOP/s panels
of one mode share their scale and show the GPU's peak. A point measured while the GPU throttled carries a dark
ring (its clock and the reason are in the hover). The roofline is in roofline_figure.py, the model-side figures
(memory, recompute, HBM bytes) in model_figures.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from flashbench.analysis import summary
from flashbench.analysis.summary import speedups
from flashbench.report.hover import ROOF_HOVER, hover, with_context
from flashbench.report.style import (
    OOM_MARK,
    PREDICTED_OOM_MARK,
    THROTTLE_RING,
    colors,
    decade_axis,
    n_ticks,
)
from flashbench.results.rows import OOM, PREDICTED_OOM, SKIPPED

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run

PANEL_HEIGHT = 300
COLS = 4
ENDED_BY_OOM = (OOM, PREDICTED_OOM, SKIPPED)


def grid(
    panels: list[str], title: str, y_title: str, x_title: str = "sequence length N", **kw: Any
) -> go.Figure:
    from plotly.subplots import make_subplots

    cols = min(COLS, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[panel_title(p) for p in panels],
        horizontal_spacing=0.06,
        vertical_spacing=min(0.14, 0.55 / max(rows - 1, 1)),
        **kw,
    )
    fig.update_layout(
        title=title,
        height=PANEL_HEIGHT * rows + 150,
        template="plotly_white",
        legend={"orientation": "h", "y": -0.1 if rows > 1 else -0.25, "x": 0},
        margin={"t": 100 if any("<br>" in panel_title(p) for p in panels) else 80, "l": 60, "r": 20, "b": 60},
        hoverlabel={"align": "left"},
    )
    fig.update_annotations(font_size=12)  # the subplot titles
    fig.update_xaxes(type="log", title_text=None)
    for c in range(1, cols + 1):
        fig.update_xaxes(title_text=x_title, row=rows, col=c)
    for r in range(1, rows + 1):
        fig.update_yaxes(title_text=y_title, row=r, col=1)
    return fig


def panel_title(panel: str, width: int = 32) -> str:
    """A panel's title on two lines where it is long (a serving variant after the mode), so neighbouring
    titles of a four-column grid never run into each other."""
    if len(panel) <= width:
        return panel
    parts = panel.split(" · ")
    cut = min(range(1, len(parts)), key=lambda i: abs(len(" · ".join(parts[:i])) - len(panel) / 2))
    return " · ".join(parts[:cut]) + "<br>" + " · ".join(parts[cut:])


def cell(panels: list[str], panel: str) -> tuple[int, int]:
    i = panels.index(panel)
    cols = min(COLS, len(panels))
    return i // cols + 1, i % cols + 1


def panel_order(df: pd.DataFrame) -> list[str]:
    order = df.sort_values(["dtype", "mode", "causal", "head_dim"])["panel"]
    return list(dict.fromkeys(order))


def time_word(df: pd.DataFrame) -> str:
    labels = set(df["time_label"])
    return (
        "CPU time" if labels == {"CPU time"} else ("GPU time" if labels == {"GPU time"} else "GPU/CPU time")
    )


def x_title(df: pd.DataFrame) -> str:
    """The x-axis of a speed figure: every speed is drawn against seq_k, the KV length; for training rows that is
    N (seq_q = seq_k), for serving rows the cache length (seq_q is the handful of new tokens)."""
    if df["serving"].all():
        return "KV length (keys in the cache)"
    return "N (KV length for serving rows)" if df["serving"].any() else "sequence length N"


def speed_vs_seq(run: Run, metric: str = "tflops") -> go.Figure | None:
    """TFLOP/s (metric="tflops") or latency (metric="median_ms", log y) against N, per provider, faceted.

    TFLOP/s leaves out the serving rows: a decode does ~H/Hkv FLOP per byte, so its TFLOP/s says nothing (its
    GB/s is the decode section's headline); latency draws them against their KV length."""
    import plotly.graph_objects as go

    f = run.frame
    df = f[f["ok"] & f[metric].notna() & ~(f["serving"] & (metric == "tflops"))].sort_values("seq_k")
    if df.empty:
        return None
    df = with_context(df)
    panels, cmap = panel_order(df), colors(dict.fromkeys(run.frame["provider"]))
    word, against = time_word(df), x_title(df)
    if metric == "tflops":
        title = f"Achieved TFLOP/s against {against} ({word}; bars p20–p80)"
        fig = grid(panels, title, "TFLOP/s", against)
    else:
        title = f"Latency against {against} ({word}, median, bars p20–p80)"
        fig = grid(panels, title, "ms (log)", against)
    seen: set[str] = set()
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = cell(panels, panel)
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
                x=grp["seq_k"],
                y=y,
                mode="lines+markers",
                name=provider,
                legendgroup=provider,
                showlegend=provider not in seen,
                line={"color": cmap[provider]},
                marker={
                    "symbol": "circle",
                    "size": 7,
                    "line": {"color": THROTTLE_RING, "width": [2 if t else 0 for t in grp["throttled"]]},
                },
                error_y=err,
                text=hover(grp, ROOF_HOVER),
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        seen.add(provider)
        _oom_end(fig, run.frame, grp, metric, cmap[provider], row, col)
    if metric == "tflops":
        _peaks_and_scale(fig, run, df, panels)
    else:
        for panel in panels:
            row, col = cell(panels, panel)
            sub = df[df["panel"] == panel]
            decade_axis(fig, list(sub["p20_ms"]) + list(sub["p80_ms"]), row=row, col=col)
    _legend_marks(fig, df, run.frame)
    n_ticks(fig, df, x="seq_k")
    return fig


def _oom_end(
    fig: go.Figure, frame: pd.DataFrame, grp: pd.DataFrame, metric: str, color: str, row: int, col: int
) -> None:
    """Where a provider's line stops because the next N ran out of memory: a dotted step to the ✕ there."""
    import plotly.graph_objects as go

    r0 = grp.iloc[-1]
    same = (
        (frame["provider"] == r0["provider"])
        & (frame["panel"] == r0["panel"])
        & frame["status"].isin(ENDED_BY_OOM)
        & (frame["seq_k"] > r0["seq_k"])
    )
    if not same.any():
        return
    nxt = frame[same].sort_values("seq_k").iloc[0]
    fig.add_trace(
        go.Scatter(
            x=[r0["seq_k"], nxt["seq_k"]],
            y=[r0[metric], r0[metric]],
            mode="lines+markers+text",
            line={"color": color, "dash": "dot", "width": 1},
            marker={
                "symbol": ["circle", OOM_MARK if nxt["status"] == OOM else PREDICTED_OOM_MARK],
                "size": [0, 12],
                "color": ["rgba(0,0,0,0)", "#c00"],
            },
            text=["", "OOM" if nxt["status"] == OOM else "OOM, predicted"],
            textposition="top left",
            textfont={"color": "#c00", "size": 10},
            showlegend=False,
            hovertext=[
                "",
                f"{nxt['provider']} at N={nxt['seq_k']}: {nxt['status']}: {summary.shorten(nxt['reason'], 100)}",
            ],
            hoverinfo="text",
        ),
        row=row,
        col=col,
    )


def _peaks_and_scale(fig: go.Figure, run: Run, df: pd.DataFrame, panels: list[str]) -> None:
    """TFLOP/s panels: the datasheet peak of each panel's dtype as a line, one y scale per mode (0 to the
    highest of the peaks and the p20 bars of that mode)."""
    peaks: dict[str, float] = {}
    roof = run.ceilings[0] if run.ceilings else None
    for panel in panels:
        sub = df[df["panel"] == panel]
        dtype, mode = sub["dtype"].iloc[0], sub["mode"].iloc[0]
        peak = roof.peak(dtype) / 1e12 if roof is not None and roof.peak(dtype) else None
        top = float((sub["flops"] / (sub["p20_ms"] * 1e-3) / 1e12).max())
        peaks[mode] = max(peaks.get(mode, 0.0), top, peak or 0.0)
        if peak and roof is not None:
            row, col = cell(panels, panel)
            fig.add_hline(
                y=peak,
                line={"color": "#555", "dash": "dash", "width": 1},
                annotation_text=f"{dtype} peak {peak:.0f} ({roof.source})",
                annotation_position="bottom right",
                annotation_font={"size": 10, "color": "#555"},
                row=row,
                col=col,
            )
    for panel in panels:
        row, col = cell(panels, panel)
        mode = df.loc[df["panel"] == panel, "mode"].iloc[0]
        fig.update_yaxes(range=[0, peaks[mode] * 1.08], row=row, col=col)


def _legend_marks(fig: go.Figure, df: pd.DataFrame, frame: pd.DataFrame) -> None:
    """Legend entries that explain the marks once: the throttle ring and the OOM end of a line."""
    import plotly.graph_objects as go

    marks = []
    if df["throttled"].any():
        n = int(df["throttled"].sum())
        marks.append(
            (
                f"ring: throttled during the case ({n} of {len(df)}; clock in the hover)",
                {"symbol": "circle-open", "color": THROTTLE_RING, "size": 10, "line": {"width": 2}},
            )
        )
    if frame["status"].isin(ENDED_BY_OOM).any():
        marks.append(
            ("✕ OOM: the next N ran out of memory", {"symbol": OOM_MARK, "color": "#c00", "size": 10})
        )
    for name, marker in marks:
        fig.add_trace(
            go.Scatter(x=[None], y=[None], mode="markers", marker=marker, name=name, legendgroup="marks")
        )


def speedup(run: Run, baseline: str) -> go.Figure | None:
    """Speedup over the reference provider on the same shape (above 1 = faster than it), per provider."""
    import plotly.graph_objects as go

    df = speedups(run.frame, baseline)
    df = df[df["provider"] != baseline].sort_values("seq_k")
    if df.empty:
        return None
    df = with_context(df)
    panels, cmap = panel_order(df), colors(dict.fromkeys(run.frame["provider"]))
    fig = grid(
        panels,
        f"Speedup over {baseline}: its median time / the provider's, same shape (above 1 = faster than {baseline})",
        f"× {baseline}",
        x_title(df),
    )
    seen: set[str] = set()
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = cell(panels, panel)
        fig.add_trace(
            go.Scatter(
                x=grp["seq_k"],
                y=grp["speedup"],
                mode="lines+markers",
                name=provider,
                legendgroup=provider,
                showlegend=provider not in seen,
                line={"color": cmap[provider]},
                text=hover(
                    grp,
                    [("speedup", "speedup", ".3g"), (f"{baseline} ms", "baseline_ms", ".4g"), *ROOF_HOVER],
                ),
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        seen.add(provider)
    top = max(float(df["speedup"].max()), 1.0) * 1.08
    low = min(float(df["speedup"].min()), 1.0) * 0.92
    for mode in dict.fromkeys(df["mode"]):
        for panel in dict.fromkeys(df.loc[df["mode"] == mode, "panel"]):
            row, col = cell(panels, panel)
            sub = df[df["mode"] == mode]["speedup"]
            fig.update_yaxes(range=[min(low, sub.min() * 0.92), max(top, sub.max() * 1.08)], row=row, col=col)
    fig.add_hline(y=1.0, line={"color": "#888", "width": 1, "dash": "dot"})
    n_ticks(fig, df, x="seq_k")
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

    df = joined[joined["ratio"].notna()].sort_values("seq_k")
    if df.empty:
        return None
    panels, cmap = panel_order(df), colors(dict.fromkeys(joined["provider"]))
    if cross_gpu:
        title = (
            f"{current_label} against {baseline_label} ({baseline_name}): time ratio per case; "
            "different GPUs: ratios compare machines, not code"
        )
    else:
        title = f"This run against {baseline_name}: time ratio per case (above 1 = slower now)"
    fig = grid(panels, title, "ratio", x_title(df))
    seen: set[str] = set()
    cur, base = _hover_escape(current_label), _hover_escape(baseline_label)
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = cell(panels, panel)
        cols = ["median_ms", "median_ms_baseline", "tflops", "tflops_baseline"]
        cols += ["pct_of_roofline", "pct_of_roofline_baseline"]
        fig.add_trace(
            go.Scatter(
                x=grp["seq_k"],
                y=grp["ratio"],
                mode="lines+markers",
                name=provider,
                legendgroup=provider,
                showlegend=provider not in seen,
                line={"color": cmap[provider]},
                customdata=grp.reindex(columns=cols).to_numpy(dtype=float),
                hovertemplate=(
                    f"{provider}<br>N (KV length)=%{{x}}<br>ratio %{{y:.3f}}<br>"
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
    n_ticks(fig, df, x="seq_k")
    return fig


def _hover_escape(text: str) -> str:
    import html

    return html.escape(text).replace("{", "(").replace("}", ")")  # no plotly %{...} inside a label

"""Plotly figures that put a run beside the models: peak memory, recompute overhead, HBM bytes.

Bytes are in GiB everywhere (binary units, as the rows and the OOM messages use). The roofline is in
roofline_figure.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashbench.analysis.runs import recompute_references
from flashbench.report.figures import cell, grid, panel_order, time_word, x_title
from flashbench.report.hover import hover
from flashbench.report.style import (
    GIB,
    OOM_MARK,
    PREDICTED_OOM_MARK,
    colors,
    decade_axis,
    n_ticks,
)
from flashbench.results.env import Environment
from flashbench.results.rows import OOM, PREDICTED_OOM

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run

RECOMPUTE_FASTER = "rgba(44,160,44,0.08)"  # the band where recomputing P beats reading it back


def gpu_memory(env: Environment) -> float | None:
    """The GPU's memory in bytes, from the NVML facts the sweep recorded."""
    total = (env.gpu_facts or {}).get("memory_total_bytes")
    return float(total) if total else None


def memory(run: Run) -> go.Figure | None:
    """Peak memory above the inputs against N (log-log, GiB): measured markers, model lines, OOM markers.

    The y axis spans the data (measured, modelled, the bytes of OOM cases); the GPU's memory is drawn where it
    falls inside that span or close above it, and otherwise named in the title.
    """
    import plotly.graph_objects as go

    df = run.frame.sort_values("seq_k")
    has_mem = df["peak_mem_bytes"].notna() | df["status"].isin([OOM, PREDICTED_OOM])
    if not has_mem.any():
        return None
    df = df[df["provider"].isin(df.loc[has_mem, "provider"])]
    panels, cmap = panel_order(df), colors(dict.fromkeys(run.frame["provider"]))
    total = gpu_memory(run.env)
    failed_at = df["predicted_mem_bytes"].fillna(df["model_mem_bytes"])
    shown = list(df.loc[df["ok"], "peak_mem_bytes"].dropna()) + list(
        df.loc[df["ok"], "model_mem_bytes"].dropna()
    )
    shown += list(failed_at[df["status"].isin([OOM, PREDICTED_OOM])].dropna())
    draw_total = total is not None and max(shown, default=0) * 4 >= total
    title = "Peak memory above the inputs (markers: measured; dotted lines: memory model)"
    if total and not draw_total:
        title += f"; the GPU's {total / GIB:.1f} GiB is far above this scale"
    fig = grid(panels, title, "GiB (log)", x_title(df))
    seen: set[str] = set()
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = cell(panels, panel)
        # The model's line only where the provider ran (or ran out of memory): an unsupported provider's model
        # line was a line no marker or legend entry explained.
        model = grp[grp["model_mem_bytes"].notna() & (grp["ok"] | grp["status"].isin([OOM, PREDICTED_OOM]))]
        if len(model):
            fig.add_trace(
                go.Scatter(
                    x=model["seq_k"],
                    y=model["model_mem_bytes"] / GIB,
                    mode="lines",
                    name=f"{provider} (model)",
                    legendgroup=provider,
                    showlegend=False,
                    line={"color": cmap[provider], "dash": "dot", "width": 1.5},
                    hovertemplate=f"{provider} model: %{{y:.3g}} GiB at KV length %{{x}}<extra></extra>",
                ),
                row=row,
                col=col,
            )
        meas = grp[grp["peak_mem_bytes"].notna() & grp["ok"]]
        show = provider not in seen and len(meas) > 0
        seen |= {provider} if show else set()
        if len(meas):
            fig.add_trace(
                go.Scatter(
                    x=meas["seq_k"],
                    y=meas["peak_mem_bytes"] / GIB,
                    mode="markers",
                    name=provider,
                    legendgroup=provider,
                    showlegend=show,
                    marker={"color": cmap[provider], "size": 7},
                    text=hover(meas, [("peak", "peak_mem_bytes", "B"), ("model", "model_mem_bytes", "B")]),
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=row,
                col=col,
            )
        failed = grp[grp["status"].isin([OOM, PREDICTED_OOM])]
        if len(failed):
            fig.add_trace(
                go.Scatter(
                    x=failed["seq_k"],
                    y=failed["predicted_mem_bytes"].fillna(failed["model_mem_bytes"]) / GIB,
                    mode="markers",
                    name=f"{provider} OOM",
                    legendgroup=provider,
                    showlegend=False,
                    marker={
                        "color": "#c00",
                        "size": 12,
                        "symbol": [OOM_MARK if s == OOM else PREDICTED_OOM_MARK for s in failed["status"]],
                        "line": {"color": cmap[provider], "width": 1},
                    },
                    text=hover(failed, [("model", "model_mem_bytes", "B")]),
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=row,
                col=col,
            )
    if draw_total and total is not None:
        # The line runs through every panel but plotly labels one: the legend names it for all of them.
        line = {"color": "#c00", "width": 1, "dash": "dash"}
        fig.add_hline(y=total / GIB, line=line)
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="lines", line=line, name=f"the GPU's memory, {total / GIB:.1f} GiB"
            ),
            row=1,
            col=1,
        )
        shown.append(total)
    decade_axis(fig, [v / GIB for v in shown])
    for name, status, marker in (
        ("✕ OOM (at the model's bytes)", OOM, {"symbol": OOM_MARK, "color": "#c00", "size": 10}),
        (
            "⊗ predicted OOM, not run",
            PREDICTED_OOM,
            {"symbol": PREDICTED_OOM_MARK, "color": "#c00", "size": 10},
        ),
    ):
        if df["status"].eq(status).any():
            fig.add_trace(
                go.Scatter(x=[None], y=[None], mode="markers", marker=marker, name=name), row=1, col=1
            )
    n_ticks(fig, df, x="seq_k")
    return fig


def recompute(run: Run, rc: pd.DataFrame) -> go.Figure | None:
    """Recompute backward vs stored-P backward (--mode bwd; analysis.runs.recompute_overhead's frame `rc`): the
    time the recomputation costs (below 0: recomputing P is faster than reading the stored P back) beside its
    labelled references (analysis.runs.recompute_references: credited and executed FLOPs), and peak memory."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if rc.empty:
        return None
    df = rc.sort_values("seq_q")
    pairs = list(dict.fromkeys(df["panel"]))
    palette = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
    cmap = {p: palette[i % len(palette)] for i, p in enumerate(pairs)}
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "backward time: recompute / stored-P − 1 (below 0: recomputing P is faster; dotted: if time "
            "followed FLOPs)",
            "peak memory (solid: recompute, dashed: stored-P)",
        ),
        horizontal_spacing=0.1,
    )
    timed = df[df["recompute_ms"].notna() & df["stored_ms"].notna()]
    for panel, grp in timed.groupby("panel", sort=False):
        fig.add_trace(
            go.Scatter(
                x=grp["seq_q"],
                y=100 * grp["time_overhead"],
                mode="lines+markers",
                name=panel,
                legendgroup=panel,
                line={"color": cmap[panel]},
                hovertemplate=(
                    f"{panel}<br>N=%{{x}}<br>overhead %{{y:.1f}}%<br>"
                    "recompute %{customdata[0]:.4g} ms, stored-P %{customdata[1]:.4g} ms<extra></extra>"
                ),
                customdata=grp[["recompute_ms", "stored_ms"]].to_numpy(),
            ),
            row=1,
            col=1,
        )
    if len(timed) and (timed["time_overhead"] < 0).any():
        low = float(100 * timed["time_overhead"].min()) * 1.2
        fig.add_hrect(y0=low, y1=0, fillcolor=RECOMPUTE_FASTER, line_width=0, row=1, col=1)
        fig.add_annotation(
            text="recomputing P is faster here",
            xref="x domain",
            yref="y",
            x=0.02,
            y=low * 0.9,
            showarrow=False,
            xanchor="left",
            font={"size": 11, "color": "#2a7a2a"},
        )
    fig.add_hline(y=0, line={"color": "#888", "width": 1}, row=1, col=1)
    for ref in recompute_references():
        fig.add_hline(
            y=100 * ref.value,
            line={"color": "#666", "dash": "dot", "width": 1},
            annotation_text=ref.label,
            annotation_position="top left",
            annotation_font={"size": 10},
            row=1,
            col=1,
        )
    for panel, grp in df.groupby("panel", sort=False):
        for col, dash, name in (
            ("recompute_mem_bytes", "solid", "recompute"),
            ("stored_mem_bytes", "dash", "stored-P"),
        ):
            sub = grp[grp[col].notna()]
            fig.add_trace(
                go.Scatter(
                    x=sub["seq_q"],
                    y=sub[col] / GIB,
                    mode="lines+markers",
                    name=f"{panel} {name}",
                    legendgroup=panel,
                    showlegend=False,
                    line={"color": cmap[panel], "dash": dash},
                    hovertemplate=f"{panel} {name}<br>N=%{{x}}: %{{y:.3g}} GiB<extra></extra>",
                ),
                row=1,
                col=2,
            )
    provider = f"{df['recompute_provider'].iloc[0]} vs {df['stored_provider'].iloc[0]}"
    fig.update_xaxes(type="log", title_text="sequence length N")
    fig.update_yaxes(title_text="% slower than stored-P", row=1, col=1)
    fig.update_yaxes(title_text="GiB (log)", row=1, col=2)
    mem = list(df["recompute_mem_bytes"].dropna() / GIB) + list(df["stored_mem_bytes"].dropna() / GIB)
    decade_axis(fig, mem, row=1, col=2)
    fig.update_layout(
        title=f"Recompute overhead: {provider} ({time_word(df)})",
        template="plotly_white",
        height=480,
        legend={"orientation": "h", "y": -0.2},
        margin={"t": 80, "l": 60, "r": 20, "b": 60},
    )
    n_ticks(fig, df)
    return fig


def hbm_bytes(run: Run) -> go.Figure | None:
    """Measured (Nsight Compute) against modelled HBM bytes, log-log in GiB, with the y = x line."""
    import numpy as np
    import plotly.graph_objects as go

    df = run.frame[run.frame["ncu_dram_bytes"].notna() & run.frame["model_bytes_provider"].notna()]
    if df.empty:
        return None
    cmap = colors(dict.fromkeys(run.frame["provider"]))
    fig = go.Figure()
    both = np.concatenate([df["ncu_dram_bytes"].to_numpy(), df["model_bytes_provider"].to_numpy()]) / GIB
    lo, hi = float(both.min()) / 2, float(both.max()) * 2
    fig.add_trace(
        go.Scatter(
            x=[lo, hi],
            y=[lo, hi],
            mode="lines",
            name="measured = model",
            line={"color": "#888", "dash": "dot"},
        )
    )
    for provider, grp in df.groupby("provider", sort=False):
        fig.add_trace(
            go.Scatter(
                x=grp["model_bytes_provider"] / GIB,
                y=grp["ncu_dram_bytes"] / GIB,
                mode="markers",
                name=provider,
                marker={"color": cmap[provider], "size": 9},
                text=hover(
                    grp,
                    [
                        ("ncu read", "ncu_dram_read_bytes", "B"),
                        ("ncu write", "ncu_dram_write_bytes", "B"),
                        ("model", "model_bytes_provider", "B"),
                        ("compulsory", "model_bytes_compulsory", "B"),
                    ],
                ),
                hovertemplate="%{text}<extra></extra>",
            )
        )
    fig.update_layout(
        title="HBM bytes: Nsight Compute (read + write) against the model",
        xaxis={"title": "modelled bytes (GiB, log)"},
        yaxis={"title": "measured DRAM bytes (GiB, log)"},
        template="plotly_white",
        height=480,
        hoverlabel={"align": "left"},
    )
    decade_axis(fig, [lo, hi], axis="x")
    decade_axis(fig, [lo, hi], axis="y")
    return fig

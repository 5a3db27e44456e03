"""Plotly figures that put a run beside the models: roofline, peak memory, recompute overhead, HBM bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.report.figures import (
    CEILING_DASH,
    MODE_SYMBOL,
    PALETTE,
    _cell,
    _grid,
    _hover,
    _n_ticks,
    _panels,
    _time_word,
    colors,
)
from flashbench.results.env import Environment
from flashbench.results.rows import OOM, PREDICTED_OOM

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run


def roofline(run: Run, dtype: str) -> go.Figure | None:
    """Log-log roofline for one input dtype: the ceilings as lines, one point per provider and case.

    Filled markers sit at the compulsory intensity (inputs read once, outputs written once: the best any
    kernel can do); open markers at the provider family's no-L2 intensity (the naive path's N x N round trips,
    a tiled kernel's K/V re-reads per block) for the same measurement. A point between the two shows what
    the L2 cache saved.
    """
    import plotly.graph_objects as go

    df = _roofline_points(run, dtype)
    if df.empty or not run.ceilings:
        return None
    fig = go.Figure()
    for trace in _roofline_traces(run, dtype, df, _ai_range(df)):
        fig.add_trace(trace)
    fig.update_layout(
        title=f"Roofline, {dtype} inputs, {run.gpu_name} (filled: compulsory intensity; open: no-L2 intensity)",
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP per DRAM byte, modelled)"},
        yaxis={"type": "log", "title": "TFLOP/s"},
        **_ROOF_LAYOUT,
    )
    return fig


# The two GPUs of a cross-GPU comparison: each one's ceilings in its own colour.
GPU_COLORS = ("#14213d", "#c05600")
_ROOF_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 600,
    "legend": {"font": {"size": 11}},
    "hoverlabel": {"align": "left"},
    "margin": {"t": 60, "l": 60, "r": 20, "b": 50},
}


def roofline_compare(runs: list[Run], dtype: str) -> go.Figure | None:
    """Runs from different GPUs, one panel per run side by side (shared log axes): each panel shows its GPU's
    ceilings (datasheet, NVML-derived, measured; in that GPU's colour) and that run's points on them.

    The other GPU's datasheet roof is repeated faintly in each panel, so the gap between the machines is
    visible where the points are. None when no run has points and ceilings for this dtype.
    """
    import numpy as np
    import pandas as pd
    from plotly.subplots import make_subplots

    frames = [_roofline_points(r, dtype) for r in runs]
    if all(df.empty or not r.ceilings for r, df in zip(runs, frames, strict=True)):
        return None
    filled = [df for df in frames if not df.empty]
    lo, hi = _ai_range(pd.concat(filled))
    titles = [f"{r.gpu_name} ({r.name})" for r in runs]
    fig = make_subplots(
        rows=1, cols=len(runs), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.05
    )
    cmap = colors(list(dict.fromkeys(p for r in runs for p in r.frame["provider"])))
    for col, (run, df) in enumerate(zip(runs, frames, strict=True), start=1):
        color = GPU_COLORS[(col - 1) % len(GPU_COLORS)]
        prefix = f"{run.gpu_name} · "
        for trace in _roofline_traces(run, dtype, df, (lo, hi), color, prefix, cmap, col == 1):
            fig.add_trace(trace, row=1, col=col)
        for k, other in enumerate(runs):
            if other is run or not other.ceilings or not other.ceilings[0].peak(dtype):
                continue
            c = other.ceilings[0]
            xs = np.geomspace(lo, hi, 60)
            fig.add_trace(
                _roof_line(
                    xs,
                    c,
                    dtype,
                    f"{other.gpu_name} · {_roof_label(c.source)} (for reference)",
                    GPU_COLORS[k % len(GPU_COLORS)],
                    "dot",
                    opacity=0.35,
                    showlegend=False,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP/B, modelled)")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=1)
    names = " vs ".join(r.gpu_name for r in runs)
    fig.update_layout(
        title=f"Roofline, {dtype} inputs, {names}: each run on its own GPU's ceilings "
        "(filled: compulsory intensity; open: no-L2 intensity)",
        **_ROOF_LAYOUT,
    )
    return fig


def _roof_label(source: str) -> str:
    from flashbench.analysis.modelled import ROOF_LABELS

    return ROOF_LABELS.get(source, source)


def _roofline_points(run: Run, dtype: str) -> Any:
    f = run.frame
    df = f[(f["dtype"] == dtype) & f["ok"] & f["tflops"].notna()]
    return df[df["ai_compulsory"].notna() & (df["ai_compulsory"] > 0)]


def _ai_range(df: Any) -> tuple[float, float]:
    import numpy as np

    ais = np.concatenate([df["ai_compulsory"].to_numpy(), df["ai_no_l2"].dropna().to_numpy()])
    return float(np.nanmin(ais)) / 3, float(np.nanmax(ais)) * 3


def _roof_line(
    xs: Any,
    c: Any,
    cdt: str,
    label: str,
    color: str,
    dash: str,
    opacity: float = 1.0,
    showlegend: bool = True,
) -> go.Scatter:
    import numpy as np
    import plotly.graph_objects as go

    peak = c.peak(cdt)
    return go.Scatter(
        x=xs,
        y=np.minimum(peak, xs * c.bw_bytes_s) / 1e12,
        mode="lines",
        name=label,
        opacity=opacity,
        showlegend=showlegend,
        line={"color": color, "dash": dash, "width": 1.5},
        hovertemplate=f"{html_escape(label)}<br>AI %{{x:.3g}} FLOP/B → %{{y:.4g}} TFLOP/s<extra></extra>",
    )


def _roofline_traces(
    run: Run,
    dtype: str,
    df: Any,
    ai_range: tuple[float, float],
    roof_color: str = "#333",
    prefix: str = "",
    cmap: dict[str, str] | None = None,
    point_legend: bool = True,
) -> list[go.Scatter]:
    """The ceilings of `run` (labelled with `prefix`) and its points for one dtype, as Scatter traces."""
    import numpy as np
    import plotly.graph_objects as go

    traces: list[go.Scatter] = []
    cmap = cmap or colors(list(dict.fromkeys(run.frame["provider"])))
    lo, hi = ai_range
    # The input dtype's roof for every ceiling, plus the datasheet roof of any other compute dtype in use
    # (sdpa-math upcasts fp16/bf16 to fp32, so its roof is the fp32 one).
    roofs = [(c, dtype, CEILING_DASH.get(_roof_label(c.source), "dashdot"), roof_color) for c in run.ceilings]
    other_color = "#999" if roof_color == "#333" else roof_color
    for other in sorted(set(df["compute_dtype"]) - {dtype}) if run.ceilings else []:
        users = ", ".join(sorted(set(df.loc[df["compute_dtype"] == other, "provider"])))
        roofs.append((run.ceilings[0], other, "dot", other_color, users))
    for roof in roofs:
        c, cdt, dash, color = roof[:4]
        peak = c.peak(cdt)
        if not peak or not c.bw_bytes_s:
            continue
        ridge = peak / c.bw_bytes_s
        xs = np.unique(np.concatenate([np.geomspace(min(lo, ridge / 3), max(hi, ridge * 3), 80), [ridge]]))
        label = f"{_roof_label(c.source)}: {peak / 1e12:.0f} TFLOP/s {cdt}, {c.bw_bytes_s / 1e12:.2f} TB/s"
        if len(roof) > 4:
            label = f"{cdt} peak ({roof[4]} compute in {cdt}): {peak / 1e12:.0f} TFLOP/s"
        traces.append(_roof_line(xs, c, cdt, prefix + label, color, dash))
    extra = [
        ("compulsory intensity", "ai_compulsory", ".3g"),
        ("modelled intensity (L2 reuse)", "ai_provider", ".3g"),
        ("no-L2 intensity", "ai_no_l2", ".3g"),
        ("% of roofline (at the modelled intensity)", "pct_of_roofline", ".1f"),
        ("% of roofline (at the compulsory intensity)", "pct_of_floor_roofline", ".1f"),
        ("% of family no-L2 bound", "pct_of_family_bound", ".1f"),
        ("bound", "bound", "s"),
        ("compute dtype", "compute_dtype", "s"),
    ]
    for (provider, mode), grp in df.groupby(["provider", "mode"], sort=False):
        symbol = MODE_SYMBOL.get(mode, "circle")
        text = _hover(grp, extra)
        if prefix:
            text = [f"<b>{html_escape(prefix.rstrip(' ·'))}</b><br>{t}" for t in text]
        traces.append(
            go.Scatter(
                x=grp["ai_compulsory"],
                y=grp["tflops"],
                mode="markers",
                name=f"{provider} {mode}",
                legendgroup=f"{provider} {mode}",
                showlegend=point_legend,
                marker={
                    "color": cmap[provider],
                    "symbol": symbol,
                    "size": 8,
                    "line": {"width": 0.5, "color": "#fff"},
                },
                text=text,
                hovertemplate="%{text}<extra></extra>",
            )
        )
        no_l2 = grp["ai_no_l2"]
        differs = no_l2.notna() & ((no_l2 - grp["ai_compulsory"]).abs() > 1e-9 * grp["ai_compulsory"])
        if differs.any():
            traces.append(
                go.Scatter(
                    x=no_l2[differs],
                    y=grp["tflops"][differs],
                    mode="markers",
                    name=f"{provider} {mode} (no-L2 intensity)",
                    legendgroup=f"{provider} {mode}",
                    showlegend=False,
                    marker={"color": cmap[provider], "symbol": f"{symbol}-open", "size": 8, "opacity": 0.7},
                    text=[t for t, d in zip(text, differs, strict=True) if d],
                    hovertemplate="at the no-L2 intensity<br>%{text}<extra></extra>",
                )
            )
    return traces


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def memory(run: Run) -> go.Figure | None:
    """Peak memory above the inputs against N (log-log): measured markers, model lines, OOM markers."""
    import plotly.graph_objects as go

    df = run.frame.sort_values("seq_q")
    has_mem = df["peak_mem_bytes"].notna() | df["status"].isin([OOM, PREDICTED_OOM])
    if not has_mem.any():
        return None
    df = df[df["provider"].isin(df.loc[has_mem, "provider"])]
    panels, cmap = _panels(df), colors(list(dict.fromkeys(run.frame["provider"])))
    fig = _grid(
        panels, "Peak memory above the inputs (markers: measured; lines: memory model)", "bytes (log)"
    )
    fig.update_yaxes(type="log", exponentformat="SI", ticksuffix="B")
    seen: set[str] = set()
    for (panel, provider), grp in df.groupby(["panel", "provider"], sort=False):
        row, col = _cell(panels, panel)
        show = provider not in seen
        seen.add(provider)
        model = grp[grp["model_mem_bytes"].notna()]
        if len(model):
            fig.add_trace(
                go.Scatter(
                    x=model["seq_q"],
                    y=model["model_mem_bytes"],
                    mode="lines",
                    name=f"{provider} (model)",
                    legendgroup=provider,
                    showlegend=False,
                    line={"color": cmap[provider], "dash": "dot", "width": 1.5},
                    hovertemplate=f"{provider} model: %{{y:.3s}}B at N=%{{x}}<extra></extra>",
                ),
                row=row,
                col=col,
            )
        meas = grp[grp["peak_mem_bytes"].notna() & grp["ok"]]
        fig.add_trace(
            go.Scatter(
                x=meas["seq_q"],
                y=meas["peak_mem_bytes"],
                mode="markers",
                name=provider,
                legendgroup=provider,
                showlegend=show,
                marker={"color": cmap[provider], "size": 7},
                text=_hover(meas, [("peak", "peak_mem_bytes", "B"), ("model", "model_mem_bytes", "B")]),
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        failed = grp[grp["status"].isin([OOM, PREDICTED_OOM])]
        if len(failed):
            fig.add_trace(
                go.Scatter(
                    x=failed["seq_q"],
                    y=failed["predicted_mem_bytes"].fillna(failed["model_mem_bytes"]),
                    mode="markers",
                    name=f"{provider} OOM",
                    legendgroup=provider,
                    showlegend=False,
                    marker={
                        "color": "#c00",
                        "size": 12,
                        "symbol": ["x" if s == OOM else "x-open" for s in failed["status"]],
                        "line": {"color": cmap[provider], "width": 1},
                    },
                    text=_hover(failed, [("model", "model_mem_bytes", "B")]),
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=row,
                col=col,
            )
    total = _gpu_memory(run.env)
    if total:
        fig.add_hline(y=total, line={"color": "#c00", "width": 1, "dash": "dash"})
    # Legend entries that explain the marker kinds once.
    for name, marker in (
        ("✕ OOM (at the model's bytes)", {"symbol": "x", "color": "#c00", "size": 10}),
        ("⊗ predicted OOM, not run", {"symbol": "x-open", "color": "#c00", "size": 10}),
    ):
        if df["status"].eq(OOM if marker["symbol"] == "x" else PREDICTED_OOM).any():
            fig.add_trace(
                go.Scatter(x=[None], y=[None], mode="markers", marker=marker, name=name), row=1, col=1
            )
    _n_ticks(fig, df["seq_q"])
    return fig


def _gpu_memory(env: Environment) -> float | None:
    """The GPU's memory from the NVML facts the sweep recorded."""
    facts = env.gpu_facts or {}
    total = facts.get("memory_total_bytes")
    return float(total) if total else None


def recompute(run: Run) -> go.Figure | None:
    """Recompute backward vs stored-P backward (--mode bwd): time overhead beside its labelled references
    (analysis.recompute_references: credited and executed FLOPs) and peak memory."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from flashbench.analysis.runs import recompute_overhead, recompute_references

    df = recompute_overhead(run.frame)
    if df.empty:
        return None
    df = df.sort_values("seq_q")
    pairs = list(dict.fromkeys(df["panel"]))
    cmap = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(pairs)}
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "backward time: recompute / stored-P − 1 (dotted: if time followed FLOPs)",
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
    for ref in recompute_references():
        fig.add_hline(
            y=100 * ref.value,
            line={"color": "#666", "dash": "dot", "width": 1},
            annotation_text=ref.label,
            annotation_position="top left",
            row=1,
            col=1,
        )
    for panel, grp in df.groupby("panel", sort=False):
        for col, dash, label in (
            ("recompute_mem_bytes", "solid", "recompute"),
            ("stored_mem_bytes", "dash", "stored-P"),
        ):
            sub = grp[grp[col].notna()]
            fig.add_trace(
                go.Scatter(
                    x=sub["seq_q"],
                    y=sub[col],
                    mode="lines+markers",
                    name=f"{panel} {label}",
                    legendgroup=panel,
                    showlegend=False,
                    line={"color": cmap[panel], "dash": dash},
                    hovertemplate=f"{panel} {label}<br>N=%{{x}}: %{{y:.4s}}B<extra></extra>",
                ),
                row=1,
                col=2,
            )
    provider = f"{df['recompute_provider'].iloc[0]} vs {df['stored_provider'].iloc[0]}"
    fig.update_xaxes(type="log", title_text="sequence length N")
    fig.update_yaxes(title_text="% slower than stored-P", row=1, col=1)
    fig.update_yaxes(type="log", title_text="bytes (log)", exponentformat="SI", ticksuffix="B", row=1, col=2)
    fig.update_layout(
        title=f"Recompute overhead: {provider} ({_time_word(df)})",
        template="plotly_white",
        height=480,
        legend={"orientation": "h", "y": -0.2},
        margin={"t": 80, "l": 60, "r": 20, "b": 60},
    )
    _n_ticks(fig, df["seq_q"])
    return fig


def hbm_bytes(run: Run) -> go.Figure | None:
    """Measured (Nsight Compute) against modelled HBM bytes, log-log, with the y = x line."""
    import numpy as np
    import plotly.graph_objects as go

    df = run.frame[run.frame["ncu_dram_bytes"].notna() & run.frame["model_bytes_provider"].notna()]
    if df.empty:
        return None
    cmap = colors(list(dict.fromkeys(run.frame["provider"])))
    fig = go.Figure()
    both = np.concatenate([df["ncu_dram_bytes"].to_numpy(), df["model_bytes_provider"].to_numpy()])
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
                x=grp["model_bytes_provider"],
                y=grp["ncu_dram_bytes"],
                mode="markers",
                name=provider,
                marker={"color": cmap[provider], "size": 9},
                text=_hover(
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
        xaxis={"type": "log", "title": "modelled bytes", "exponentformat": "SI"},
        yaxis={"type": "log", "title": "measured DRAM bytes", "exponentformat": "SI"},
        template="plotly_white",
        height=480,
        hoverlabel={"align": "left"},
    )
    return fig

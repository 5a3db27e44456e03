"""The roofline, drawn the way Nsight Compute draws it: each roof named on the chart, the ridge point marked,
every measured case a point whose colour is its provider, whose symbol is its mode and mask, and whose size
grows with N.

A point sits at its case's compulsory intensity (analysis.modelled.ROOF_RULE: FLOPs over the DRAM bytes any
exact attention must move), the same x for every provider of one case, so providers compare by height alone:
left of the ridge the case is memory-bound, right of it compute-bound, and a point's % of roofline is its
height over the roof above it. What each implementation's own traffic allows is on demand: a legend entry shows
the same measurements, open, at the provider family's own intensity with L2 reuse, and another at its no-L2
intensity (every K/V re-read counted as DRAM traffic: an open point above the memory roof there is the L2 cache
serving those re-reads, not a kernel beating the hardware). Hidden by default, so a run of 120 cases draws 120
markers, not 360.

Bandwidth slopes of ceilings that agree within 1% (the datasheet and NVML-derived HBM bandwidth usually do) are
one line, labelled with both names. A measured roof from a throttled calibration is drawn in red and says so,
quoting the clock of that dtype's own matmul; a run without a calibration says it has no measured roof. The
x-axis spans the points: a decode run's 1-4 FLOP/B do not sit on an axis that runs to the ridge, which is then
named at the right edge instead.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks
from flashbench.report.hover import with_context
from flashbench.report.roofline_points import points_traces
from flashbench.report.style import decade_axis

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run

ROOF_DASH = {"datasheet": "solid", "nvml": "dash", "measured": "dot"}
ROOF_NAMES = {"datasheet": "datasheet", "nvml": "NVML-derived", "measured": "measured"}
SAME_BW = 0.01  # slopes closer than this (relative) are drawn as one
THROTTLED_ROOF = "#c0392b"
GPU_COLORS = ("#14213d", "#c05600")  # the two GPUs of a cross-GPU comparison
LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 640,
    "legend": {"font": {"size": 11}},
    "hoverlabel": {"align": "left"},
    "margin": {"t": 60, "l": 60, "r": 20, "b": 50},
}


def points(run: Run, dtype: str) -> pd.DataFrame:
    """The ok cases of one input dtype that have a modelled intensity, with roof_view's and the clock columns."""
    f = run.frame
    df = f[(f["dtype"] == dtype) & f["ok"] & f["tflops"].notna()]
    df = df[df["ai_compulsory"].notna() & (df["ai_compulsory"] > 0)]
    return with_context(df) if len(df) else df


def roofline(run: Run, dtype: str) -> go.Figure | None:
    """Log-log roofline for one input dtype: the ceilings, labelled on the chart, and one point per case."""
    import plotly.graph_objects as go

    df = points(run, dtype)
    if df.empty or not run.ceilings:
        return None
    lo, hi = _ai_range(df, run, dtype)
    fig = go.Figure()
    traces, notes = _roofs(run, dtype, df, (lo, hi))
    for trace in traces + points_traces(df, run):
        fig.add_trace(trace)
    for note in notes:
        fig.add_annotation(**note)
    fig.update_layout(
        title=f"Roofline, {dtype} inputs, {run.gpu_name} (each case at its compulsory intensity)",
        xaxis={
            "title": "arithmetic intensity (FLOP per compulsory DRAM byte: inputs read once, outputs written once)"
        },
        yaxis={"title": "TFLOP/s"},
        **LAYOUT,
    )
    decade_axis(fig, [lo, hi], axis="x", widen=False)
    decade_axis(fig, _y_range(df, run, dtype, hi), widen=False)
    return fig


def roofline_compare(runs: list[Run], dtype: str) -> go.Figure | None:
    """Runs from different GPUs, one panel per run (shared log axes): each panel shows its GPU's ceilings and
    that run's points; the other GPU's datasheet roof is repeated faintly. None when nothing to draw."""
    import numpy as np
    import pandas as pd
    from plotly.subplots import make_subplots

    frames = [points(r, dtype) for r in runs]
    if all(df.empty or not r.ceilings for r, df in zip(runs, frames, strict=True)):
        return None
    lo, hi = _ai_range(pd.concat([df for df in frames if not df.empty]), runs[0], dtype)
    titles = [f"{r.gpu_name} ({r.name})" for r in runs]
    fig = make_subplots(
        rows=1, cols=len(runs), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.05
    )
    for col, (run, df) in enumerate(zip(runs, frames, strict=True), start=1):
        color = GPU_COLORS[(col - 1) % len(GPU_COLORS)]
        traces, notes = _roofs(run, dtype, df, (lo, hi), color, f"{run.gpu_name} · ")
        for trace in traces:
            trace.showlegend = (
                False  # each roof is named on its panel: a legend of both GPUs' roofs squeezed them
            )
        for trace in traces + (points_traces(df, run, f"{run.gpu_name} · ", col == 1) if len(df) else []):
            fig.add_trace(trace, row=1, col=col)
        axis = "" if col == 1 else str(col)
        for note in notes:
            fig.add_annotation(**{**note, "xref": f"x{axis}", "yref": f"y{axis}"})
        for k, other in enumerate(runs):
            if other is run or not other.ceilings or not other.ceilings[0].peak(dtype):
                continue
            c = other.ceilings[0]
            xs = np.geomspace(lo, hi, 60)
            fig.add_trace(
                _line(
                    xs,
                    np.minimum(c.peak(dtype), xs * c.bw_bytes_s) / 1e12,
                    f"{other.gpu_name} · {ROOF_NAMES.get(c.source, c.source)} (for reference)",
                    GPU_COLORS[k % len(GPU_COLORS)],
                    "dot",
                    opacity=0.35,
                    showlegend=False,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="arithmetic intensity (FLOP per compulsory DRAM byte)")
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=1)
    decade_axis(fig, [lo, hi], axis="x", widen=False)
    spans = [_y_range(df, r, dtype, hi) for r, df in zip(runs, frames, strict=True) if len(df)]
    decade_axis(fig, [min(s[0] for s in spans), max(s[1] for s in spans)], widen=False)
    names = " vs ".join(r.gpu_name for r in runs)
    # The legend goes under both panels in rows: beside them it took the width the two panels need.
    layout = {
        **LAYOUT,
        "height": 720,
        "legend": {"orientation": "h", "y": -0.14, "x": 0, "font": {"size": 11}},
    }
    fig.update_layout(
        title=f"Roofline, {dtype} inputs, {names}: each run on its own GPU's ceilings", **layout
    )
    return fig


def _ai_range(df: pd.DataFrame, run: Run, dtype: str) -> tuple[float, float]:
    """The x-axis: the points' intensities (the on-demand open ones too) widened 3x each side, and the ridges
    where they lie within a decade and a half of the points; a ridge further out is named at the edge instead
    (a decode run's 1-4 FLOP/B against a ridge near 300)."""
    import numpy as np

    cols = [df[c].dropna().to_numpy() for c in ("ai_compulsory", "ai_provider", "ai_no_l2") if c in df]
    ais = np.concatenate(cols)
    ais = ais[ais > 0]
    lo, hi = float(np.nanmin(ais)) / 3, float(np.nanmax(ais)) * 3
    ridges = [c.ridge(dtype) for c in run.ceilings if c.ridge(dtype)]
    near = [r for r in ridges if lo / RIDGE_REACH <= r <= hi * RIDGE_REACH]  # lo, hi: already 3x out
    return min([lo, *(r / 3 for r in near)]), max([hi, *(r * 3 for r in near)])


RIDGE_REACH = 10.0  # a ridge more than a decade from the points is named at the axis' edge, not drawn


def _y_range(df: pd.DataFrame, run: Run, dtype: str, ai_hi: float) -> list[float]:
    """TFLOP/s from under the slowest point to over the highest roof drawn within the x-axis."""
    roofs = [c for c in run.ceilings if c.bw_bytes_s]
    tops = []
    for c in roofs:
        for cdt in {dtype, *df["compute_dtype"]}:
            peak = c.peak(cdt)
            tops.append(min(peak, ai_hi * c.bw_bytes_s) if peak else ai_hi * c.bw_bytes_s)
    low = float(df["tflops"].min()) / 2.5
    return [low, max(tops, default=low * 1e13) / 1e12 * 1.6]


def _line(xs: Any, ys: Any, label: str, color: str, dash: str, **kw: Any) -> go.Scatter:
    import plotly.graph_objects as go

    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines",
        name=label,
        line={"color": color, "dash": dash, "width": 1.6},
        hovertemplate=f"{html.escape(label)}<br>AI %{{x:.3g}} FLOP/B → %{{y:.4g}} TFLOP/s<extra></extra>",
        **kw,
    )


def _roofs(
    run: Run,
    dtype: str,
    df: pd.DataFrame,
    ai_range: tuple[float, float],
    color: str = "#333",
    prefix: str = "",
) -> tuple[list[go.Scatter], list[dict[str, Any]]]:
    """The ceilings of `run` as traces (memory slopes merged where equal, flat compute roofs, the ridges) and
    the annotations that name them on the chart."""
    import numpy as np
    import plotly.graph_objects as go

    lo, hi = ai_range
    cal = clocks.calibration(run.env, run.ceilings, run.gpu_spec)
    roofs = [c for c in run.ceilings if c.peak(dtype) and c.bw_bytes_s]
    traces: list[go.Scatter] = []
    notes: list[dict[str, Any]] = []

    # Each measured figure is judged by its own measurement's clock-event reasons (a steady-regime record has them):
    # a power-capped matmul does not make the unthrottled copy a suspect bandwidth. An older record: all or none.
    copy_throttled = (
        any(r for name, _, _, r in cal.bandwidth if name == "copy") if cal.bandwidth else cal.throttled
    )
    peak_throttled = bool(cal.matmul_clock(dtype)[1]) if cal.matmul else cal.throttled

    def roof_color(c: Any, kind: str = "peak") -> str:
        suspect = copy_throttled if kind == "bandwidth" else peak_throttled
        return THROTTLED_ROOF if c.source == "measured" and suspect else color

    # Memory slopes: one per distinct bandwidth, up to the highest ridge among the ceilings sharing it.
    groups: list[list[Any]] = []
    for c in sorted(roofs, key=lambda c: -c.bw_bytes_s):
        if groups and abs(groups[-1][0].bw_bytes_s - c.bw_bytes_s) <= SAME_BW * c.bw_bytes_s:
            groups[-1].append(c)
        else:
            groups.append([c])
    for k, group in enumerate(groups):
        bw = group[0].bw_bytes_s
        end = max(c.ridge(dtype) for c in group)
        names = " = ".join(ROOF_NAMES.get(c.source, c.source) for c in group)
        xs = np.geomspace(lo, min(end, hi), 40)
        label = f"{prefix}HBM {bw / 1e12:.2f} TB/s ({names})"
        traces.append(
            _line(
                xs,
                xs * bw / 1e12,
                label,
                roof_color(group[0], "bandwidth"),
                ROOF_DASH.get(group[0].source, "dashdot"),
            )
        )
        x0 = max(lo * 1.6, float(df["tflops"].min()) / 2 * 1e12 / bw) if len(df) else lo * 1.6
        notes.append(
            # The highest slope labelled above its line, the others below theirs: two labels never stack.
            _note(
                x0,
                x0 * bw / 1e12,
                f"{bw / 1e12:.2f} TB/s · {names}",
                roof_color(group[0], "bandwidth"),
                "left",
                k == 0,
            )
        )
    # Compute roofs, flat from each ridge; the highest labelled above its line, the others below. A ridge right of
    # the axis (every point far into the memory-bound side) is named at the edge instead of drawn.
    beyond = [c for c in roofs if c.ridge(dtype) >= hi]
    if beyond:
        ridge, name = beyond[0].ridge(dtype), ROOF_NAMES.get(beyond[0].source, beyond[0].source)
        notes.append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 0.99,
                "y": 0.02,
                "showarrow": False,
                "xanchor": "right",
                "align": "right",
                "text": (
                    f"compute roofs start at the ridge ({name}: {ridge:.0f} FLOP/B), off this chart to the right: "
                    "every point here is memory-bound"
                ),
                "font": {"size": 11, "color": "#555"},
            }
        )
    for i, c in enumerate(sorted((c for c in roofs if c.ridge(dtype) < hi), key=lambda c: -c.peak(dtype))):
        peak, ridge = c.peak(dtype), c.ridge(dtype)
        name = ROOF_NAMES.get(c.source, c.source)
        if c.source == "measured" and peak_throttled:
            clock, reasons = cal.matmul_clock(dtype)  # this dtype's own matmul, not the lowest of all
            at = f"{dtype} matmul at {clock:.0f} MHz, " if clock else ""
            why = f"calibration throttled: {at}{', '.join(reasons) or 'throttled'}"
            label = f"{prefix}{name} ({why}): {peak / 1e12:.0f} TFLOP/s {dtype}, not a ceiling"
            name += " (throttled calibration: not a ceiling)"
        else:
            label = f"{prefix}{name}: {peak / 1e12:.0f} TFLOP/s {dtype}"
        traces.append(
            _line([ridge, hi], [peak / 1e12] * 2, label, roof_color(c), ROOF_DASH.get(c.source, "dashdot"))
        )
        notes.append(
            _note(hi, peak / 1e12, f"{name} {peak / 1e12:.0f} TFLOP/s", roof_color(c), "right", above=i == 0)
        )
        traces.append(
            go.Scatter(
                x=[ridge],
                y=[peak / 1e12],
                mode="markers",
                marker={
                    "symbol": "diamond-tall",
                    "size": 11,
                    "color": roof_color(c),
                    "line": {"width": 1, "color": "#fff"},
                },
                name=f"{prefix}ridge ({name})",
                showlegend=False,
                hovertemplate=(
                    f"ridge point of the {html.escape(name)} roof: {ridge:.0f} FLOP/B<br>left of it memory-bound, "
                    "right of it compute-bound<extra></extra>"
                ),
            )
        )
    first = run.ceilings[0] if run.ceilings else None
    if first is not None and first.ridge(dtype) and first.ridge(dtype) < hi:
        ridge = first.ridge(dtype)
        # Below and right of the ridge: under the flat roof and clear of the slope, which runs down-left.
        notes.append(
            {
                "x": math.log10(ridge),
                "y": math.log10(first.peak(dtype) / 1e12),
                "text": f"ridge {ridge:.0f} FLOP/B",
                "showarrow": True,
                "arrowhead": 0,
                "ax": 46,
                "ay": 34,
                "xanchor": "left",
                "font": {"size": 11, "color": color},
                "bgcolor": "rgba(255,255,255,0.75)",
            }
        )
    # Any other compute dtype in use (sdpa-math computes fp16/bf16 inputs in fp32): that dtype's datasheet roof.
    for other in sorted(set(df["compute_dtype"]) - {dtype}) if roofs else []:
        peak = run.ceilings[0].peak(other)
        if not peak:
            continue
        users = ", ".join(sorted(set(df.loc[df["compute_dtype"] == other, "provider"])))
        ridge = peak / run.ceilings[0].bw_bytes_s
        if ridge >= hi:
            continue
        label = f"{prefix}{other} peak ({users} compute in {other}): {peak / 1e12:.0f} TFLOP/s"
        traces.append(_line([ridge, hi], [peak / 1e12] * 2, label, "#999", "dot"))
        notes.append(
            _note(hi, peak / 1e12, f"{other} peak {peak / 1e12:.0f} ({users})", "#777", "right", above=False)
        )
    if not cal.source:
        notes.append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 0.01,
                "y": 0.99,
                "showarrow": False,
                "align": "left",
                "text": "no measured roof: this run has no calibration (flashbench calibrate)",
                "font": {"size": 11, "color": "#777"},
            }
        )
    return traces, notes


def _note(x: float, y: float, text: str, color: str, side: str, above: bool = True) -> dict[str, Any]:
    """An annotation that names a roof on the chart (data coordinates; log axes take log10 positions)."""
    return {
        "x": math.log10(x),
        "y": math.log10(y),
        "text": html.escape(text),
        "showarrow": False,
        "xanchor": side,
        "yanchor": "bottom" if above else "top",
        "font": {"size": 11, "color": color},
        "bgcolor": "rgba(255,255,255,0.75)",  # legible over the points it may cross
    }

"""The roofline, drawn the way Nsight Compute draws it: each roof named on the chart, the ridge point marked,
every measured case a point whose colour is its provider, whose symbol is its mode and mask, and whose size
grows with N.

A point sits at the intensity of models.roofline's one rule for "bound" (analysis.summary.roof_view: FLOPs over
the DRAM bytes the provider's family is modelled to move with L2 reuse); left of the ridge it is memory-bound,
right of it compute-bound, and its % of roofline is its height over the roof above it. The same measurement is
repeated, open and joined by a faint line, at the family's no-L2 intensity (every K/V re-read counted as DRAM
traffic): an open point above the memory roof there is not faster than the hardware, it is the L2 cache serving
re-reads the no-L2 model charges to DRAM.

Bandwidth slopes of ceilings that agree within 1% (the datasheet and NVML-derived HBM bandwidth usually do) are
one line, labelled with both names. A measured roof from a throttled calibration is drawn in red and says so;
a run without a calibration says it has no measured roof.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks
from flashbench.report.figures import hover, with_context
from flashbench.report.style import colors, decade_axis, n_tick_label, symbol
from flashbench.spec.cases import mask_label

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
    df = df[df["ai_provider"].notna() & (df["ai_provider"] > 0)]
    return with_context(df) if len(df) else df


def above_no_l2_roof(df: pd.DataFrame) -> pd.Series:
    """Points whose TFLOP/s beat the memory roof at their no-L2 intensity: the L2 served the re-reads."""
    return df["ai_no_l2"].notna() & (df["tflops"] > df["attainable_no_l2_tflops"] * 1.0001)


def roofline(run: Run, dtype: str) -> go.Figure | None:
    """Log-log roofline for one input dtype: the ceilings, labelled on the chart, and one point per case."""
    import plotly.graph_objects as go

    df = points(run, dtype)
    if df.empty or not run.ceilings:
        return None
    lo, hi = _ai_range(df, run, dtype)
    fig = go.Figure()
    traces, notes = _roofs(run, dtype, df, (lo, hi))
    for trace in traces + _points(df, run):
        fig.add_trace(trace)
    for note in notes:
        fig.add_annotation(**note)
    fig.update_layout(
        title=f"Roofline, {dtype} inputs, {run.gpu_name} (filled: the case's intensity; open: its no-L2 intensity)",
        xaxis={"title": "arithmetic intensity (FLOP per DRAM byte, modelled with L2 reuse)"},
        yaxis={"title": "TFLOP/s"},
        **LAYOUT,
    )
    decade_axis(fig, [lo, hi], axis="x", widen=False)
    decade_axis(fig, _y_range(df, run, dtype), widen=False)
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
        for trace in traces + (_points(df, run, f"{run.gpu_name} · ", col == 1) if len(df) else []):
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
    fig.update_xaxes(title_text="arithmetic intensity (FLOP/B, modelled with L2 reuse)")
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=1)
    decade_axis(fig, [lo, hi], axis="x", widen=False)
    spans = [_y_range(df, r, dtype) for r, df in zip(runs, frames, strict=True) if len(df)]
    decade_axis(fig, [min(s[0] for s in spans), max(s[1] for s in spans)], widen=False)
    names = " vs ".join(r.gpu_name for r in runs)
    fig.update_layout(
        title=f"Roofline, {dtype} inputs, {names}: each run on its own GPU's ceilings", **LAYOUT
    )
    return fig


def _ai_range(df: pd.DataFrame, run: Run, dtype: str) -> tuple[float, float]:
    import numpy as np

    ais = np.concatenate([df["ai_provider"].to_numpy(), df["ai_no_l2"].dropna().to_numpy()])
    ridges = [c.ridge(dtype) for c in run.ceilings if c.ridge(dtype)]
    return min(float(np.nanmin(ais)), *ridges) / 3, max(float(np.nanmax(ais)), *ridges) * 3


def _y_range(df: pd.DataFrame, run: Run, dtype: str) -> list[float]:
    """TFLOP/s from under the slowest point to over the highest roof."""
    peaks = [c.peak(cdt) for c in run.ceilings for cdt in {dtype, *df["compute_dtype"]} if c.peak(cdt)]
    low = float(df["tflops"].min()) / 2.5
    return [low, max(peaks, default=low * 1e13) / 1e12 * 1.6]


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

    def roof_color(c: Any) -> str:
        return THROTTLED_ROOF if c.source == "measured" and cal.throttled else color

    # Memory slopes: one per distinct bandwidth, up to the highest ridge among the ceilings sharing it.
    groups: list[list[Any]] = []
    for c in sorted(roofs, key=lambda c: -c.bw_bytes_s):
        if groups and abs(groups[-1][0].bw_bytes_s - c.bw_bytes_s) <= SAME_BW * c.bw_bytes_s:
            groups[-1].append(c)
        else:
            groups.append([c])
    for group in groups:
        bw = group[0].bw_bytes_s
        end = max(c.ridge(dtype) for c in group)
        names = " = ".join(ROOF_NAMES.get(c.source, c.source) for c in group)
        xs = np.geomspace(lo, end, 40)
        label = f"{prefix}HBM {bw / 1e12:.2f} TB/s ({names})"
        traces.append(
            _line(xs, xs * bw / 1e12, label, roof_color(group[0]), ROOF_DASH.get(group[0].source, "dashdot"))
        )
        x0 = max(lo * 1.6, float(df["tflops"].min()) / 2 * 1e12 / bw) if len(df) else lo * 1.6
        notes.append(
            _note(x0, x0 * bw / 1e12, f"{bw / 1e12:.2f} TB/s · {names}", roof_color(group[0]), "left")
        )
    # Compute roofs, flat from each ridge; the highest labelled above its line, the others below.
    for i, c in enumerate(sorted(roofs, key=lambda c: -c.peak(dtype))):
        peak, ridge = c.peak(dtype), c.ridge(dtype)
        name = ROOF_NAMES.get(c.source, c.source)
        if c.source == "measured" and cal.throttled:
            at = f"{cal.clock_mhz:.0f} MHz, " if cal.clock_mhz else ""
            why = f"calibration throttled: {at}{', '.join(cal.reasons) or 'throttled'}"
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
    if first is not None and first.ridge(dtype):
        ridge = first.ridge(dtype)
        notes.append(
            {
                "x": math.log10(ridge),
                "y": math.log10(first.peak(dtype) / 1e12),
                "text": f"ridge {ridge:.0f} FLOP/B",
                "showarrow": True,
                "arrowhead": 0,
                "ax": 0,
                "ay": 36,
                "font": {"size": 11, "color": color},
            }
        )
    # Any other compute dtype in use (sdpa-math computes fp16/bf16 inputs in fp32): that dtype's datasheet roof.
    for other in sorted(set(df["compute_dtype"]) - {dtype}) if roofs else []:
        peak = run.ceilings[0].peak(other)
        if not peak:
            continue
        users = ", ".join(sorted(set(df.loc[df["compute_dtype"] == other, "provider"])))
        ridge = peak / run.ceilings[0].bw_bytes_s
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


def _points(df: pd.DataFrame, run: Run, prefix: str = "", legend: bool = True) -> list[go.Scatter]:
    """One trace per (provider, mode, mask): filled at the rule's intensity, sized by N; open at the no-L2
    intensity, joined to it; plus legend-only entries that explain colour, symbol and size once."""
    import plotly.graph_objects as go

    traces: list[go.Scatter] = []
    cmap = colors(dict.fromkeys(run.frame["provider"]))
    n = df["seq_k"].astype(float)
    n_lo = float(n.min())
    df = df.assign(size=(7 + 3.2 * (n / n_lo).map(math.log2)).clip(upper=24))
    above = above_no_l2_roof(df)
    extra = [
        ("intensity with L2 reuse (the rule's)", "roof_ai", ".4g"),
        ("bound", "roof_bound", "s"),
        ("% of roofline (at that intensity)", "roof_pct", ".1f"),
        ("compulsory intensity", "ai_compulsory", ".4g"),
        ("% of roofline (at the compulsory intensity)", "pct_of_floor_roofline", ".1f"),
        ("no-L2 intensity", "ai_no_l2", ".4g"),
        ("% of family no-L2 bound", "pct_of_family_bound", ".1f"),
        ("compute dtype", "compute_dtype", "s"),
    ]
    text = hover(df, extra)
    if prefix:
        text = [f"<b>{html.escape(prefix.rstrip(' ·'))}</b><br>{t}" for t in text]
    df = df.assign(text=text, above=above)
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for (provider, mode, causal), grp in df.groupby(["provider", "mode", "causal"], sort=False):
        sym = symbol(mode, causal)
        traces.append(
            go.Scatter(
                x=grp["roof_ai"],
                y=grp["tflops"],
                mode="markers",
                name=f"{provider} {mode} {mask_label(causal)}",
                legendgroup=provider,
                showlegend=False,
                marker={
                    "color": cmap[provider],
                    "symbol": sym,
                    "size": grp["size"],
                    "line": {"width": 0.6, "color": "#fff"},
                },
                text=grp["text"],
                hovertemplate="%{text}<extra></extra>",
            )
        )
        far = grp[
            grp["ai_no_l2"].notna() & ((grp["ai_no_l2"] - grp["roof_ai"]).abs() > 0.01 * grp["roof_ai"])
        ]
        if far.empty:
            continue
        note = [
            "above the memory roof at this intensity: the L2 cache served re-reads that the no-L2 model counts "
            "as DRAM traffic<br>"
            if a
            else "at or under the memory roof at this intensity<br>"
            for a in far["above"]
        ]
        traces.append(
            go.Scatter(
                x=far["ai_no_l2"],
                y=far["tflops"],
                mode="markers",
                name=f"{provider} {mode} {mask_label(causal)} (no-L2 intensity)",
                legendgroup=provider,
                showlegend=False,
                marker={
                    "color": cmap[provider],
                    "symbol": f"{sym}-open",
                    "size": far["size"] * 0.8,
                    "opacity": 0.6,
                },
                text=[
                    f"the same measurement at its no-L2 intensity, {nt}{t}"
                    for nt, t in zip(note, far["text"], strict=True)
                ],
                hovertemplate="%{text}<extra></extra>",
            )
        )
        for a, b, y in zip(far["roof_ai"], far["ai_no_l2"], far["tflops"], strict=True):
            links_x += [a, b, None]
            links_y += [y, y, None]
    if links_x:
        traces.insert(
            0,
            go.Scatter(
                x=links_x,
                y=links_y,
                mode="lines",
                line={"color": "rgba(120,120,120,0.13)", "width": 0.8},
                hoverinfo="skip",
                showlegend=False,
                name="no-L2 link",
            ),
        )
    if legend:
        traces += _legend(df, cmap, bool(links_x))
    return traces


def _legend(df: pd.DataFrame, cmap: dict[str, str], open_points: bool) -> list[go.Scatter]:
    """Legend-only entries: one per provider (colour), one per mode and mask (symbol), size and open points."""
    import plotly.graph_objects as go

    def entry(name: str, marker: dict[str, Any], group: str) -> go.Scatter:
        return go.Scatter(x=[None], y=[None], mode="markers", marker=marker, name=name, legendgroup=group)

    out = [
        entry(p, {"color": cmap[p], "symbol": "circle", "size": 10}, p) for p in dict.fromkeys(df["provider"])
    ]
    for mode, causal in dict.fromkeys(zip(df["mode"], df["causal"], strict=True)):
        marker = {"color": "#777", "symbol": symbol(mode, causal), "size": 10}
        out.append(entry(f"{mode} · {mask_label(causal)}", marker, "symbols"))
    ns = sorted(df["seq_k"].unique())
    out.append(
        entry(
            f"size: N ({n_tick_label(int(ns[0]))} … {n_tick_label(int(ns[-1]))})",
            {"color": "#bbb", "size": 16},
            "symbols",
        )
    )
    if open_points:
        out.append(
            entry(
                "open: same point at its no-L2 intensity",
                {"color": "#777", "symbol": "circle-open", "size": 10},
                "symbols",
            )
        )
    return out

"""The roofline's points: one trace per (provider, mode, mask) at each case's compulsory intensity, the
on-demand overlays at each provider's own intensities (with and without L2 reuse), and the legend entries that
explain colour, symbol and size once (roofline_figure.py draws the roofs and lays the figure out)."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

from flashbench.report.hover import hover
from flashbench.report.style import colors, n_tick_label, symbol
from flashbench.spec.cases import mask_label

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run


def above_no_l2_roof(df: pd.DataFrame) -> pd.Series:
    """Points whose TFLOP/s beat the memory roof at their no-L2 intensity: the L2 served the re-reads."""
    return df["ai_no_l2"].notna() & (df["tflops"] > df["attainable_no_l2_tflops"] * 1.0001)


# The on-demand overlays: the same measurements at each provider family's own intensities (legend group, name,
# intensity column, what the hover says of a point there).
OVERLAYS = (
    (
        "own",
        "open: at its own traffic's intensity, with L2 reuse (click to show)",
        "ai_provider",
        "the same measurement at the intensity of this implementation's own modelled traffic (L2 reuse)",
    ),
    (
        "no-l2",
        "open: at its own traffic's intensity, no L2 reuse (click to show)",
        "ai_no_l2",
        "the same measurement at its no-L2 intensity (every K/V re-read counted as DRAM traffic)",
    ),
)


def points_traces(df: pd.DataFrame, run: Run, prefix: str = "", legend: bool = True) -> list[go.Scatter]:
    """One trace per (provider, mode, mask), filled at the case's compulsory intensity and sized by N; the
    on-demand OVERLAYS, each one toggle in the legend; legend-only entries that explain colour, symbol, size."""
    import plotly.graph_objects as go

    traces: list[go.Scatter] = []
    cmap = colors(dict.fromkeys(run.frame["provider"]))
    n = df["seq_k"].astype(float)
    n_lo = float(n.min())
    df = df.assign(size=(7 + 3.2 * (n / n_lo).map(math.log2)).clip(upper=24))
    extra = [
        ("compulsory intensity (ROOF_RULE)", "roof_ai", ".4g"),
        ("% of roofline (one roof per case)", "roof_pct", ".1f"),
        ("bound (the case's)", "roof_bound", "s"),
        ("own traffic's intensity, L2 reuse", "ai_provider", ".4g"),
        ("what this implementation's own traffic allows, TFLOP/s", "attainable_own_tflops", ".4g"),
        ("% of that", "pct_of_own_roofline", ".1f"),
        ("its own bound", "own_bound", "s"),
        ("no-L2 intensity", "ai_no_l2", ".4g"),
        ("% of family no-L2 bound", "pct_of_family_bound", ".1f"),
        ("compute dtype", "compute_dtype", "s"),
    ]
    text = hover(df, extra)
    if prefix:
        text = [f"<b>{html.escape(prefix.rstrip(' ·'))}</b><br>{t}" for t in text]
    df = df.assign(text=text, above=above_no_l2_roof(df))
    for (provider, mode, causal), grp in df.groupby(["provider", "mode", "causal"], sort=False):
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
                    "symbol": symbol(mode, causal),
                    "size": grp["size"],
                    "line": {"width": 0.6, "color": "#fff"},
                },
                text=grp["text"],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    for group, name, column, words in OVERLAYS:
        traces += _overlay(df, cmap, group, name if legend else "", column, words)
    if legend:
        traces += _legend(df, cmap)
    return traces


def _overlay(
    df: pd.DataFrame, cmap: dict[str, str], group: str, name: str, column: str, words: str
) -> list[go.Scatter]:
    """Open points at another intensity, joined to their filled point by a faint line; hidden until their legend
    entry is clicked (name "" : no entry of its own, the entry of another panel toggles it)."""
    import plotly.graph_objects as go

    far = df[df[column].notna() & ((df[column] - df["roof_ai"]).abs() > 0.01 * df["roof_ai"])]
    if far.empty:
        return []
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for a, b, y in zip(far["roof_ai"], far[column], far["tflops"], strict=True):
        links_x += [a, b, None]
        links_y += [y, y, None]
    if column == "ai_no_l2":
        notes = [
            ": above the memory roof there, the L2 cache served re-reads that the no-L2 model counts as DRAM traffic"
            if a
            else ": at or under the memory roof there"
            for a in far["above"]
        ]
    else:
        notes = [""] * len(far)
    common = {"legendgroup": group, "visible": "legendonly"}
    return [
        go.Scatter(
            x=links_x,
            y=links_y,
            mode="lines",
            line={"color": "rgba(120,120,120,0.25)", "width": 0.8},
            hoverinfo="skip",
            showlegend=False,
            name=f"{group} link",
            **common,
        ),
        go.Scatter(
            x=far[column],
            y=far["tflops"],
            mode="markers",
            name=name or group,
            showlegend=bool(name),
            marker={
                "color": [cmap[p] for p in far["provider"]],
                "symbol": [f"{symbol(m, c)}-open" for m, c in zip(far["mode"], far["causal"], strict=True)],
                "size": far["size"] * 0.8,
                "opacity": 0.7,
            },
            text=[f"{words}{nt}<br>{t}" for nt, t in zip(notes, far["text"], strict=True)],
            hovertemplate="%{text}<extra></extra>",
            **common,
        ),
    ]


def _legend(df: pd.DataFrame, cmap: dict[str, str]) -> list[go.Scatter]:
    """Legend-only entries: one per provider (colour), one per mode and mask (symbol), and size."""
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
    return out

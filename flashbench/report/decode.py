"""The report's decode section: serving rows judged on bytes/s (docs/decode.md).

A decode row is a case with fewer query tokens than keys (seq_q < seq_k: new tokens over a KV cache), or a paged or
ragged one. Per provider and cache length: achieved GB/s (analysis.modelled.add_bandwidth: the modelled DRAM bytes,
Q, K and V over the valid lengths once per KV head, O and the split partials, over the median time), its % of the
calibrated read bandwidth and of the datasheet's, the latency per generated token (the median time of the call
over seq_q: one call produces seq_q new tokens of every sequence of the batch), and the split count and tile the
bundled decode kernel chose (its kernel_config).

Drawn in the report's own theme and provider colours (report.style: a provider is the same colour here as in
every other figure; a paged cache is its dashed line), against the KV length with the batch under each length
where it changes, the calibrated read bandwidth and the datasheet's drawn as the roofs.

Self-contained: html.py and markdown.py each make one call (html_section / markdown_lines).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flashbench.report.hover import hover, with_context
from flashbench.report.style import colors, decade_axis, n_ticks

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.analysis.runs import Run

NOTE = (
    "Decode rows: seq_q query tokens per sequence over a KV cache of N keys (seq_q < N, or paged, or ragged). "
    "GB/s = the byte model's DRAM bytes (Q, K and V over the valid lengths once per KV head, O, and the split "
    "partials the bundled kernel reported) / the median time; % of read BW = of the calibrated read-only "
    "bandwidth (flashbench calibrate); % of datasheet BW = of the GPU's datasheet bandwidth. ms per token = the "
    "median time of one call / seq_q: one call produces seq_q new tokens of every sequence of the batch. "
    "x floor = the median time / the call's floor, its compulsory bytes at the calibrated read bandwidth plus the "
    "calibrated empty-kernel time (of a CUDA-graph replay for rows timed as one); 1.0 only moves the bytes. "
    "tokens/J: batch × seq_q / the joules per call (NVML's energy counter over back-to-back calls), where measured."
)
COLUMNS = {
    "provider": "provider",
    "layout": "KV cache",
    "heads": "H",
    "kv_heads": "Hkv",
    "seq_q": "Nq",
    "seq_k": "N",
    "batch": "batch",
    "kv_mb": "KV MB",
    "latency_ms": "ms per token",
    "achieved_gb_s": "GB/s",
    "pct_of_read_bw": "% of read BW",
    "pct_of_datasheet_bw": "% of datasheet BW",
    "time_over_floor": "x floor",
    "tokens_per_j": "tokens/J",
    "loop_ms": "eager loop ms",
    "host_bound": "host-bound",
    "timed_as": "timed as",
    "splits": "splits",
    "tile": "tile",
}
OPTIONAL = (
    "x floor",
    "tokens/J",
    "eager loop ms",
    "host-bound",
)  # left out of a run that measured none of them


def decode_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok decode rows of a run's tidy frame with the section's columns (COLUMNS) and each case's clock, in a
    stable order."""
    import numpy as np

    rows = frame[frame["serving"] & frame["ok"] & (frame["mode"] == "fwd")].copy()
    if rows.empty:
        return rows
    stores = rows["kv_dtype"].fillna("") if "kv_dtype" in rows else [""] * len(rows)
    rows["layout"] = [
        f"{lay}{p if lay == 'paged' else ''}{', ' + s if s != 'uniform' else ''}{', ' + kv if kv else ''}"
        for lay, p, s, kv in zip(rows["kv_layout"], rows["page_size"], rows["seqlens"], stores, strict=True)
    ]
    rows["kv_mb"] = rows["model_bytes_compulsory"] / 1e6
    rows["latency_ms"] = rows["median_ms"] / rows["seq_q"]
    configs = [json.loads(c) if c else {} for c in rows["kernel_config"]]
    rows["splits"] = [c.get("num_splits", np.nan) for c in configs]
    rows["tile"] = [
        f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c.get('num_warps', '?')} s{c.get('num_stages', '?')}"
        if "BLOCK_M" in c and "BLOCK_N" in c
        else ""
        for c in configs
    ]
    keys = ["dtype", "head_dim", "heads", "kv_heads", "seq_q", "layout", "provider", "seq_k", "batch"]
    return with_context(rows).sort_values(keys, kind="stable")


def shown(rows: pd.DataFrame) -> pd.DataFrame:
    """decode_rows() as the table prints it: COLUMNS renamed, the OPTIONAL ones only where some row has them."""
    out = rows[list(COLUMNS)].rename(columns=COLUMNS)
    empty = [c for c in OPTIONAL if out[c].isna().all()]
    return out.drop(columns=empty)


def markdown_lines(run: Run) -> list[str]:
    """The section as markdown lines ([] when the run has no ok decode row)."""
    rows = decode_rows(run.frame)
    if rows.empty:
        return []
    out = ["### Decode: bandwidth per provider and cache length", "", NOTE, ""]
    if (rows["device"] == "cpu").all():
        out += ["> CPU run: CPU times; GB/s on the CPU says nothing about a GPU.", ""]
    table = shown(rows)
    out.append("| " + " | ".join(table.columns) + " |")
    out.append("|" + "|".join("---" for _ in table.columns) + "|")
    for rec in table.itertuples(index=False):
        out.append("| " + " | ".join(_cell(v) for v in rec) + " |")
    return [*out, ""]


def html_section(run: Run, add: Callable[[str, str, str, str], None]) -> None:
    """Add the section to the page through html.render's add(anchor, title, note, body), if there are decode rows."""
    rows = decode_rows(run.frame)
    if rows.empty:
        return
    body = "".join(_figure_html(fig) for fig in figures(rows))
    table = shown(rows)
    body += f"<details><summary>Decode rows ({len(table)})</summary>{_table_html(table)}</details>"
    add("decode", "Decode: GB/s against KV length", html.escape(NOTE), body)


def figures(rows: pd.DataFrame) -> list[Any]:
    """Per (dtype, d, heads / KV heads, query tokens): GB/s and ms per token against the KV length, one line per
    provider (its fixed colour) and KV layout (paged: dashed); the calibrated read bandwidth and the datasheet's
    drawn as the roofs of the GB/s panel."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out = []
    cmap = colors(dict.fromkeys(rows["provider"]))
    groups = rows.groupby(["dtype", "head_dim", "heads", "kv_heads", "seq_q"], sort=False)
    for (dtype, d, h, kv, nq), grp in groups:
        fig = make_subplots(
            rows=1,
            cols=2,
            subplot_titles=("GB/s (modelled bytes / median time)", "ms per token (median, log)"),
            horizontal_spacing=0.08,
        )
        for (provider, layout), line in grp.groupby(["provider", "layout"], sort=False):
            line = line.sort_values("seq_k")
            name = f"{provider} · {layout}"
            style = {"color": cmap[provider], "dash": "solid" if layout == "contiguous" else "dash"}
            for col, metric in ((1, "achieved_gb_s"), (2, "latency_ms")):
                fig.add_trace(
                    go.Scatter(
                        x=line["seq_k"], y=line[metric], mode="lines+markers", name=name, legendgroup=name,
                        showlegend=col == 1, line=style, marker={"color": cmap[provider], "size": 7},
                        text=_hover(line), hovertemplate="%{text}<extra></extra>",
                    ),
                    row=1, col=col,
                )  # fmt: skip
        # The roofs as legend entries, not labels on the chart: the best rows run right along them.
        top = [float(grp["achieved_gb_s"].max())]
        ends = [float(grp["seq_k"].min()), float(grp["seq_k"].max())]
        for column, label, dash in (
            ("datasheet_bw_gb_s", "datasheet BW", "dash"),
            ("read_bw_gb_s", "calibrated read BW", "dot"),
        ):
            value = _first(grp, column)
            if value == value:
                top.append(value)
                fig.add_trace(
                    go.Scatter(
                        x=ends, y=[value, value], mode="lines", name=f"roof: {label} {value:.0f} GB/s",
                        line={"color": "#555", "dash": dash, "width": 1.4},
                        hovertemplate=f"{label}: {value:.0f} GB/s<extra></extra>",
                    ),
                    row=1, col=1,
                )  # fmt: skip
        gqa = f"/{kv}" if kv != h else ""
        fig.update_xaxes(type="log", title_text="KV length (keys in the cache)")
        fig.update_yaxes(range=[0, max(top) * 1.08], title_text="GB/s", row=1, col=1)
        decade_axis(fig, list(grp["latency_ms"]), row=1, col=2)
        n_ticks(fig, grp, x="seq_k")
        fig.update_layout(
            title=f"Decode, {dtype} d={d} H={h}{gqa}, {nq} new token{'s' * (nq != 1)} per sequence",
            height=440,
            template="plotly_white",
            legend={"orientation": "h", "y": -0.22, "x": 0},
            margin={"t": 80, "l": 60, "r": 20, "b": 60},
            hoverlabel={"align": "left"},
        )
        out.append(fig)
    return out


def _hover(line: pd.DataFrame) -> list[str]:
    """The decode numbers of each point, then the report's common hover (timing, clock, loop, energy)."""
    head = [
        f"{g:.4g} GB/s, {p:.3g}% of calibrated read BW, {q:.3g}% of datasheet BW<br>"
        f"{lat:.4g} ms per token · splits {s}, tile {t}"
        for g, p, q, lat, s, t in zip(
            line["achieved_gb_s"], line["pct_of_read_bw"], line["pct_of_datasheet_bw"], line["latency_ms"],
            line["splits"], line["tile"], strict=True,
        )
    ]  # fmt: skip
    return [f"{h}<br>{t}" for h, t in zip(head, hover(line), strict=True)]


def _first(rows: Any, col: str) -> float:
    if col not in rows:
        return float("nan")
    values = rows[col].dropna()
    return float(values.iloc[0]) if len(values) else float("nan")


def _figure_html(fig: Any) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, default_width="100%")


def _table_html(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in rec) + "</tr>"
        for rec in df.itertuples(index=False)
    )
    return f'<table class="tbl"><tr>{head}</tr>{body}</table>'


def _cell(value: Any) -> str:
    value = value.item() if hasattr(value, "item") else value
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value).replace("|", "/")

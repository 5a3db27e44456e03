"""The report's decode section: serving rows judged on bytes/s (docs/decode.md).

A decode row is a case with fewer query tokens than keys (seq_q < seq_k: new tokens over a KV cache), or a paged or
ragged one. Per provider and cache length: achieved GB/s (analysis.modelled.add_bandwidth: the modelled DRAM bytes,
Q, K and V over the valid lengths once per KV head, O and the split partials, over the median time), its % of the
calibrated read bandwidth and of the datasheet's, the latency per generated token (the median time of the call
over seq_q: one call produces seq_q new tokens of every sequence of the batch), and the split count and tile the
bundled decode kernel chose (its kernel_config).

Self-contained: html.py and markdown.py each make one call (html_section / markdown_lines).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.analysis.runs import Run

NOTE = (
    "Decode rows: seq_q query tokens per sequence over a KV cache of N keys (seq_q < N, or paged, or ragged). "
    "GB/s = the byte model's DRAM bytes (Q, K and V over the valid lengths once per KV head, O, and the split "
    "partials the bundled kernel reported) / the median time; % of read BW = of the calibrated read-only "
    "bandwidth (flashbench calibrate); % of datasheet BW = of the GPU's datasheet bandwidth. ms per token = the "
    "median time of one call / seq_q: one call produces seq_q new tokens of every sequence of the batch."
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
    "splits": "splits",
    "tile": "tile",
}


def decode_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok decode rows of a run's tidy frame, with the section's columns (COLUMNS), in a stable order."""
    import numpy as np

    serving = (
        (frame["seq_q"] < frame["seq_k"])
        | (frame["kv_layout"] != "contiguous")
        | (frame["seqlens"] != "uniform")
    )
    rows = frame[serving & frame["ok"] & (frame["mode"] == "fwd")].copy()
    if rows.empty:
        return rows
    rows["layout"] = [
        f"{lay}{p if lay == 'paged' else ''}{', ' + s if s != 'uniform' else ''}"
        for lay, p, s in zip(rows["kv_layout"], rows["page_size"], rows["seqlens"], strict=True)
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
    for col in ("achieved_gb_s", "pct_of_read_bw", "pct_of_datasheet_bw"):
        if col not in rows:
            rows[col] = np.nan
    keys = ["dtype", "head_dim", "heads", "kv_heads", "seq_q", "layout", "provider", "seq_k", "batch"]
    return rows.sort_values(keys, kind="stable")[[*COLUMNS, "dtype", "head_dim", "device"]]


def markdown_lines(run: Run) -> list[str]:
    """The section as markdown lines ([] when the run has no ok decode row)."""
    rows = decode_rows(run.frame)
    if rows.empty:
        return []
    out = ["### Decode: bandwidth per provider and cache length", "", NOTE, ""]
    if (rows["device"] == "cpu").all():
        out += ["> CPU run: CPU times; GB/s on the CPU says nothing about a GPU.", ""]
    shown = rows[list(COLUMNS)].rename(columns=COLUMNS)
    out.append("| " + " | ".join(shown.columns) + " |")
    out.append("|" + "|".join("---" for _ in shown.columns) + "|")
    for rec in shown.itertuples(index=False):
        out.append("| " + " | ".join(_cell(v) for v in rec) + " |")
    return [*out, ""]


def html_section(run: Run, add: Callable[[str, str, str, str], None]) -> None:
    """Add the section to the page through html.render's add(anchor, title, note, body), if there are decode rows."""
    rows = decode_rows(run.frame)
    if rows.empty:
        return
    body = "".join(_figure_html(fig) for fig in figures(rows))
    table = rows[list(COLUMNS)].rename(columns=COLUMNS)
    body += f"<details><summary>Decode rows ({len(table)})</summary>{_table_html(table)}</details>"
    add("decode", "Decode: bandwidth against cache length", html.escape(NOTE), body)


def figures(rows: pd.DataFrame) -> list[Any]:
    """Per (dtype, d, heads / KV heads, query tokens): GB/s and latency against the cache length, one line per
    provider and KV layout; the calibrated read bandwidth and the datasheet's drawn as horizontal lines."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out = []
    groups = rows.groupby(["dtype", "head_dim", "heads", "kv_heads", "seq_q"], sort=False)
    for (dtype, d, h, kv, nq), grp in groups:
        fig = make_subplots(
            rows=1, cols=2, subplot_titles=("GB/s (modelled bytes / median time)", "ms per token")
        )
        for (provider, layout), line in grp.groupby(["provider", "layout"], sort=False):
            line = line.sort_values("seq_k")
            name = f"{provider} · {layout}"
            hover = [
                f"{name}<br>N={n} batch={b}<br>{g:.4g} GB/s, {p:.3g}% of read BW<br>splits {s}, tile {t}"
                for n, b, g, p, s, t in zip(
                    line["seq_k"], line["batch"], line["achieved_gb_s"], line["pct_of_read_bw"],
                    line["splits"], line["tile"], strict=True,
                )
            ]  # fmt: skip
            for col, metric in ((1, "achieved_gb_s"), (2, "latency_ms")):
                fig.add_trace(
                    go.Scatter(
                        x=line["seq_k"], y=line[metric], mode="lines+markers", name=name, legendgroup=name,
                        showlegend=col == 1, hovertext=hover, hoverinfo="text",
                    ),
                    row=1, col=col,
                )  # fmt: skip
        for column, label in (("read_bw_gb_s", "calibrated read BW"), ("datasheet_bw_gb_s", "datasheet BW")):
            value = _first(grp, column)
            if value == value:
                fig.add_hline(y=value, line_dash="dot", annotation_text=label, row=1, col=1)
        gqa = f"/{kv}" if kv != h else ""
        fig.update_xaxes(type="log", title_text="cache length N (keys)")
        fig.update_yaxes(type="log", row=1, col=2)
        fig.update_layout(title=f"{dtype} d={d} H={h}{gqa} Nq={nq}", height=420)
        out.append(fig)
    return out


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

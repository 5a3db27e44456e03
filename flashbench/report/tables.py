"""The report's HTML pieces: a figure as a div, pandas frames as plain tables, the recompute table that says why
a cell is empty, and the environment as a readable table (GPU, clocks, power cap, driver, versions, git state,
the command)."""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks
from flashbench.analysis.summary import shorten
from flashbench.report.style import GIB, fmt_bytes
from flashbench.spec.cases import mask_label

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from flashbench.analysis.runs import Run

MAX_TABLE_ROWS = 400
NAME_COLUMNS = ("provider", "key", "case", "at", "mode")  # what users type or search for: never wrapped
PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "toImageButtonOptions": {"format": "png", "scale": 2},
}


def figure(fig: go.Figure) -> str:
    """A figure as a div for the page (plotly.js is inlined once in the head, not per figure)."""
    height = fig.layout.height or 500
    return fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        include_mathjax=False,
        config=PLOTLY_CONFIG,
        default_height=f"{height}px",
        default_width="100%",
    )


def details(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>{body}</details>"


def _fmt(value: Any, col: str, ratios: tuple[str, ...], formats: dict[str, str]) -> tuple[str, bool]:
    """(text, is_number) for one table cell."""
    if value is None or (isinstance(value, float) and value != value):
        return "", False
    if isinstance(value, bool):
        return ("yes" if value else "no"), False
    if isinstance(value, int | float) and col.endswith("bytes"):
        return fmt_bytes(value), True
    if isinstance(value, float) and col in formats:
        return format(value, formats[col]), True
    if isinstance(value, float):
        return (f"{value:.3f}" if col in ratios else f"{value:.4g}"), True
    if isinstance(value, int):
        return str(value), True
    return str(value), False


def table(
    df: pd.DataFrame,
    header: bool = True,
    ratios: tuple[str, ...] = (),
    limit: int = MAX_TABLE_ROWS,
    formats: dict[str, str] | None = None,
) -> str:
    """A plain HTML table. ratios: columns printed with 3 decimals; formats: {column: format spec}, so a column
    keeps one precision in every row."""
    if df.empty:
        return "<p>None.</p>"
    shown = df.head(limit)
    out = ['<table class="tbl">']
    if header:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns) + "</tr>")
    for rec in shown.itertuples(index=False):
        cells = []
        for col, value in zip(shown.columns, rec, strict=True):
            text, num = _fmt(
                value.item() if hasattr(value, "item") else value, str(col), ratios, formats or {}
            )
            bad = col == "status" and text != "ok"
            cls = ' class="num"' if num else (' class="status-bad"' if bad else "")
            cls = ' class="name"' if col in NAME_COLUMNS and not bad else cls
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    if len(df) > limit:
        out.append(f"<p class='note'>… {len(df) - limit} more rows: see --format csv.</p>")
    return "".join(out)


def status_counts(rows: pd.DataFrame) -> str:
    """Cases per status and provider with the first reason: the refusals and failures, one line each."""
    if rows.empty:
        return "<p>None.</p>"
    counts = (
        rows.groupby(["status", "provider"], sort=False)
        .agg(cases=("status", "size"), first_reason=("reason", "first"))
        .reset_index()
    )
    counts["first_reason"] = counts["first_reason"].map(lambda r: shorten(r, 160))
    return table(counts)


def recompute_table(rc: pd.DataFrame) -> pd.DataFrame:
    """recompute_overhead's frame for reading: an empty time or memory cell says why (OOM, crash, ...)."""
    import pandas as pd

    def cell(value: Any, status: Any, unit: str) -> str:
        if value == value and value is not None:
            return fmt_bytes(value) if unit == "B" else f"{value:.4g}"
        return (
            "OOM"
            if status in ("oom", "predicted-oom")
            else (str(status) if status and status != "ok" else "")
        )

    status_r = rc["status"] if "status" in rc else pd.Series([""] * len(rc), index=rc.index)
    status_s = rc["status_stored"] if "status_stored" in rc else status_r
    out = rc[["seq_q", "head_dim", "causal", "mode"]].copy()
    out["causal"] = out["causal"].map(mask_label)
    out["recompute ms"] = [cell(v, s, "ms") for v, s in zip(rc["recompute_ms"], status_r, strict=True)]
    out["stored-P ms"] = [cell(v, s, "ms") for v, s in zip(rc["stored_ms"], status_s, strict=True)]
    out["time overhead %"] = [f"{100 * v:+.1f}" if v == v else "" for v in rc["time_overhead"]]
    # The recompute backward's FLOPs as credited (2.5x forward) and as the bundled kernels execute them.
    out["credited TFLOP"] = [f"{v / 1e12:.4g}" for v in rc["credited_flops_recompute"]]
    out["executed TFLOP"] = [f"{v / 1e12:.4g}" for v in rc["executed_flops_recompute"]]
    out["recompute memory"] = [
        cell(v, s, "B") for v, s in zip(rc["recompute_mem_bytes"], status_r, strict=True)
    ]
    out["stored-P memory"] = [cell(v, s, "B") for v, s in zip(rc["stored_mem_bytes"], status_s, strict=True)]
    out["memory saved"] = [fmt_bytes(v) if v == v else "" for v in rc["mem_saved_bytes"]]
    return out.reset_index(drop=True)


def _cudnn(value: Any) -> str:
    """torch.backends.cudnn.version()'s integer as a version: 91900 -> 9.19.0, 8902 -> 8.9.2."""
    if not isinstance(value, int):
        return str(value or "")
    if value >= 10000:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}"


def env_rows(run: Run) -> list[tuple[str, str]]:
    """The environment record as (what, value) lines a reader scans: the machine, its clocks and power cap,
    the software, the git state, the command; fields the record lacks say "not recorded"."""
    env = run.env
    facts = env.gpu_facts or {}
    worker = env.worker or {}
    rows: list[tuple[str, str]] = []
    gpu = [run.gpu_name]
    if facts.get("memory_total_bytes"):
        gpu.append(f"{facts['memory_total_bytes'] / GIB:.1f} GiB")
    if worker.get("sm_count"):
        gpu.append(f"{worker['sm_count']} SMs")
    if worker.get("l2_cache_bytes"):
        gpu.append(f"L2 {fmt_bytes(worker['l2_cache_bytes'])}")
    if worker.get("capability"):
        gpu.append(f"compute capability {worker['capability']}")
    rows.append(("GPU", " · ".join(gpu)))
    sm, mem = facts.get("max_sm_clock_mhz"), facts.get("max_mem_clock_mhz")
    rows.append(
        (
            "clocks (max, NVML)",
            " · ".join(filter(None, [sm and f"SM {sm} MHz", mem and f"memory {mem} MHz"])) or "not recorded",
        )
    )
    limit = facts.get("power_limit_w")  # the enforced limit (gpu.nvml.gpu_facts), where the sweep recorded it
    rows.append(("power cap", f"{float(limit):.0f} W" if limit else "not recorded by this run"))
    rows.append(
        ("driver", " · ".join(filter(None, [env.driver, env.cuda and f"CUDA {env.cuda}"])) or "not recorded")
    )
    versions = [
        ("torch", env.torch),
        ("triton", env.triton),
        ("cuDNN", _cudnn(env.cudnn)),
        ("Python", env.python),
        ("flashbench", env.flashbench),
    ]
    rows.append(("versions", " · ".join(f"{k} {v}" for k, v in versions if v)))
    if env.packages:
        rows.append(
            ("packages", " · ".join(f"{k} {v or 'not installed'}" for k, v in sorted(env.packages.items())))
        )
    git = env.git_sha[:10] if env.git_sha else "not recorded"
    if env.git_dirty:
        git += " with uncommitted changes"
    elif env.git_dirty is False:
        git += " (clean)"
    rows.append(("git", git))
    rows.append(("command", env.command or "not recorded"))
    if env.preset:
        rows.append(("preset", env.preset))
    cal = clocks.calibration(env, run.ceilings, run.gpu_spec)
    measured = next((c for c in run.ceilings if c.source == "measured"), None)
    if cal.source and measured is not None:
        read = (env.calibration or {}).get("read_bw_gb_s") if cal.source == "run" else None
        text = " · ".join(
            filter(
                None,
                [
                    cal.when,
                    f"copy {measured.bw_bytes_s / 1e12:.2f} TB/s",
                    read and f"read {read / 1e3:.2f} TB/s",
                    ", ".join(f"{d} {v / 1e12:.0f} TFLOP/s" for d, v in measured.flops_s.items()),
                ],
            )
        )
        if cal.throttled:
            text += f" · THROTTLED ({cal.reason or 'reason not recorded'})"
        if cal.source != "run":
            text += " · this machine's calibrate file, not the run's record"
        rows.append(("calibration", text))
    else:
        rows.append(("calibration", "none: no measured roof"))
    when = " → ".join(filter(None, [env.started, env.finished]))
    wall = f"{env.wall_s:.0f} s" if env.wall_s else ""
    if env.compile_s_total:
        wall += f" (compile and autotune {env.compile_s_total:.0f} s)"
    rows.append(("when", " · ".join(filter(None, [when, wall])) or "not recorded"))
    rows.append(("host", " · ".join(filter(None, [env.hostname, env.platform])) or "not recorded"))
    if env.status_counts:
        rows.append(("sweep's own count", ", ".join(f"{n} {s}" for s, n in env.status_counts.items())))
    return rows


def env_table(run: Run) -> str:
    """The readable environment table, with the raw record collapsed under it."""
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in env_rows(run))
    raw = json.dumps(run.env.to_dict(), indent=1, sort_keys=True, default=str)
    return f'<table class="tbl env">{body}</table>' + details(
        "The raw environment record (env.json)", f"<pre class='raw'>{html.escape(raw)}</pre>"
    )

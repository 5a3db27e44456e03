"""What every figure of the report shares: a provider's colour (the same in every report), the marker symbol
of a mode and mask, byte units (GiB, as the rows and errors use), log axes labelled by decades, N ticks.

Colours: a provider flashbench ships declares its own (providers/builtin.py), so triton is blue in every report
whatever else ran; a provider that declares none (a user kernel) gets a colour from a stable hash of its name
(crc32, not Python's salted hash), so it too keeps its colour from one report to the next.
"""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING, Any

from flashbench.providers import builtin

if TYPE_CHECKING:
    import plotly.graph_objects as go

# For providers that declare no colour (user kernels): picked by crc32 of the name, none of them a declared one.
HASH_COLORS = ("#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#e6550d", "#31a354")
# Marker symbol per mode: (non-causal, causal).
MODE_SYMBOLS = {
    "fwd": ("circle", "triangle-up"),
    "bwd": ("diamond", "triangle-down"),
    "fwd+bwd": ("square", "star"),
}
OTHER_SYMBOLS = ("hexagon", "cross")
OOM_MARK = "x"  # ✕ means out of memory, and only that, on every figure
PREDICTED_OOM_MARK = "x-open"
THROTTLE_RING = "#222"  # a dark ring around a point measured while the GPU throttled
GIB = 1 << 30


def provider_color(name: str) -> str:
    return builtin.colours().get(name) or HASH_COLORS[zlib.crc32(name.encode()) % len(HASH_COLORS)]


def colors(names: Any) -> dict[str, str]:
    return {n: provider_color(n) for n in names}


def symbol(mode: str, causal: bool) -> str:
    return MODE_SYMBOLS.get(mode, OTHER_SYMBOLS)[int(bool(causal))]


def fmt_bytes(value: float) -> str:
    """Binary units, as the rows and the OOM messages use: 1.5 GiB, 66 MiB, 512 B."""
    if value != value:
        return ""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def decades(lo: float, hi: float) -> tuple[list[float], list[str], list[float]]:
    """(tick values, their labels, the axis range in log10 units) for a log axis from lo to hi: one labelled
    tick per decade (0.1, 1, 10), the range widened to whole decades so at least two are labelled."""
    a = math.floor(math.log10(lo))
    b = max(math.ceil(math.log10(hi)), a + 1)
    vals = [10.0**k for k in range(a, b + 1)]
    return vals, [f"{v:g}" for v in vals], [a, b]


def decade_axis(fig: go.Figure, values: Any, axis: str = "y", widen: bool = True, **where: Any) -> None:
    """Make `axis` ("x" or "y") of the subplot(s) `where` a log axis over `values`, labelled by decades.

    widen: stretch the range to whole decades (at least two labelled); else span the values exactly."""
    finite = [float(v) for v in values if v == v and v > 0]
    if not finite:
        return
    vals, text, rng = decades(min(finite), max(finite))
    if not widen:
        lo, hi = min(finite), max(finite)
        rng = [math.log10(lo), math.log10(hi)]
        vals = [v for v in vals if lo <= v <= hi]
        if len(vals) < 3:
            # Fewer than three decades inside the range (a roofline's 50-1600 TFLOP/s had labels at 100 and 1000
            # only): label 1, 2 and 5 of each decade instead.
            vals = [
                v * m
                for v in [vals[0] / 10 if vals else 10.0 ** math.floor(rng[0]), *vals]
                for m in (1, 2, 5)
            ]
            vals = [v for v in vals if lo <= v <= hi] or [float(f"{lo:.2g}"), float(f"{hi:.2g}")]
        text = [f"{v:g}" for v in vals]
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    update(
        type="log",
        range=rng,
        tickvals=vals,
        ticktext=text,
        minor={
            "tickvals": [
                10.0**k * m
                for k in range(math.floor(rng[0]) - 1, math.ceil(rng[1]) + 1)
                for m in range(2, 10)
            ],
            "showgrid": True,
        },
        **where,
    )


def n_tick_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def n_ticks(fig: go.Figure, frame: Any, x: str = "seq_q") -> None:
    """Tick the log N axes at the measured lengths (512, 1k, 2k, ...); with the batch under each N where every
    N ran at one batch that changes with N (a fixed token count: batch × N = constant)."""
    ns = sorted({int(v) for v in frame[x]})
    batches = frame.groupby(x)["batch"].unique()
    one_each = all(len(b) == 1 for b in batches)
    show_batch = one_each and len({int(b[0]) for b in batches}) > 1
    if len(ns) > 12:
        ns = ns[:: math.ceil(len(ns) / 12)]
    text = [n_tick_label(n) + (f"<br>b{int(batches[n][0])}" if show_batch else "") for n in ns]
    fig.update_xaxes(tickvals=ns, ticktext=text)

"""The hover every figure of the report shares: a case in words, its numbers, its clock, how it was timed, what
an eager loop pays and the joules per call, and the two roofs (the case's, and the provider's own traffic's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks, summary
from flashbench.report.style import fmt_bytes
from flashbench.spec.cases import mask_label

if TYPE_CHECKING:
    import pandas as pd


def with_context(df: pd.DataFrame) -> pd.DataFrame:
    """df with the one roofline rule's columns (roof_ai, roof_bound, roof_pct) and each case's clock."""
    return df.join(summary.roof_view(df)).join(clocks.case_clocks(df))


def hover(df: pd.DataFrame, extra: Any = ()) -> list[str]:
    """One HTML hover text per row: the case, its numbers, its clock, how it was timed and what a loop pays.
    extra: (label, column, format)."""
    out = []
    for r in df.to_dict("records"):
        lines = [
            f"<b>{r['provider']}</b> · {r['time_label']}"
            + (f" · timed as {r['timed_as']}" if r.get("timed_as") else ""),
            f"N={summary.n_label(r['seq_q'], r['seq_k'])} d={r['head_dim']} {r['dtype']} "
            f"{mask_label(r['causal'])} {r['mode']}",
            f"batch={r['batch']} heads={r['heads']}"
            + (f" kv={r['kv_heads']}" if r["kv_heads"] != r["heads"] else "")
            + (f" · {r['variant']}" if r.get("variant") else ""),
        ]
        if _num(r.get("median_ms")):
            lines.append(f"median {r['median_ms']:.4g} ms (p20 {r['p20_ms']:.4g}, p80 {r['p80_ms']:.4g})")
        if _num(r.get("tflops")):
            lines.append(f"{r['tflops']:.4g} TFLOP/s")
        for label, col, fmt in extra:
            value = r.get(col)
            if value is not None and value == value and value != "":
                lines.append(f"{label}: {fmt_bytes(value) if fmt == 'B' else format(value, fmt)}")
        if _num(r.get("loop_ms")):
            host = f", host {r['host_ms']:.4g} ms to enqueue" if _num(r.get("host_ms")) else ""
            bound = " · host-bound" if r.get("host_bound") is True else ""
            lines.append(
                f"eager loop {r['loop_ms']:.4g} ms per call ({r['loop_over_gpu']:.2f}× the GPU's "
                f"{r['gpu_in_loop_ms']:.4g} ms in the loop){host}{bound}"
            )
        if _num(r.get("energy_j")):
            per = (
                f"{r['tokens_per_j']:.4g} tokens/J" if r.get("serving") else f"{r['tflop_per_j']:.3g} TFLOP/J"
            )
            lines.append(f"energy {r['energy_j']:.4g} J per call, {per}")
        if _num(r.get("clock_mhz")):
            lo, hi = r.get("clock_min_mhz"), r.get("clock_max_mhz")
            span = f", {lo:.0f}–{hi:.0f}" if _num(lo) and _num(hi) and lo != hi else ""
            why = f"; throttled: {r['reasons'] or 'reason not recorded'}" if r.get("throttled") else ""
            share = r.get("throttled_share")
            if why and _num(share):
                why += f" (in {share:.0%} of the readings)"
            lines.append(f"SM clock {r['clock_mhz']:.0f} MHz{span} ({r['clock_source']}){why}")
        if (
            r.get("warmup_settled") is False
        ):  # the measurement regime's own flags, where the sweep recorded them
            lines.append("the warm-up stopped before the SM clock settled")
        if r.get("host_time_included") is True:
            lines.append("host launch gaps may be counted in this GPU time")
        if r.get("status") != "ok":
            lines.append(f"status: {r['status']} {summary.shorten(r.get('reason', ''), 80)}")
        out.append("<br>".join(lines))
    return out


# The hover lines of ROOF_RULE and of the provider's own traffic, for every figure that shows a speed.
ROOF_HOVER = (
    ("% of roofline (one roof per case, compulsory traffic)", "roof_pct", ".1f"),
    ("bound (the case's)", "roof_bound", "s"),
    ("what this implementation's own traffic allows", "attainable_own_tflops", ".4g"),
    ("% of that", "pct_of_own_roofline", ".1f"),
)


def _num(value: Any) -> bool:
    return value is not None and value == value

"""What the machine did, in the verdict's words: the clocks the cases ran at and which leads they decide, the
measured roof and which of its figures a throttled GPU gave, serving rows above the calibrated read bandwidth and
why, and what an eager loop pays per call (host time). Computed in flashbench.analysis; worded here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks, host, serving
from flashbench.analysis import leads as lead_rows
from flashbench.analysis.modelled import ROOF_LABELS
from flashbench.report.words import Block, pct, span, x

if TYPE_CHECKING:
    from flashbench.analysis.runs import Run


def clock_blocks(run: Run, groups: list[lead_rows.Lead]) -> list[Block]:
    out: list[Block] = []
    t = clocks.throttling(run.frame, run.env)
    if t.clock_min is None or t.clock_max is None:
        text = (
            "**Clocks**: not recorded by this run (no NVML readings), so no ratio here can be checked against a "
            "clock difference."
        )
    else:
        top = f" (maximum {t.max_clock:.0f} MHz)" if t.max_clock else ""
        span = (
            f"{t.clock_min:.0f}"
            if round(t.clock_min) == round(t.clock_max)
            else f"{t.clock_min:.0f}–{t.clock_max:.0f}"
        )
        text = f"**Clocks**: the {t.cases} measured cases ran at SM clocks of {span} MHz{top}, read {t.clock_source}; "
        if t.throttled:
            text += (
                f"{t.throttled} of {t.cases} ran throttled ({', '.join(t.reasons) or 'reason not recorded'})."
            )
        else:
            text += "none ran throttled."
        text += " " + _clock_gap_words(groups)
        text += " Absolute TFLOP/s and GB/s hold at these clocks."
    kind = "warn" if t.throttled > t.cases / 2 else "text"
    out.append(Block(kind, text))
    cal = clocks.calibration(run.env, run.ceilings, run.gpu_spec)
    measured_roof = next((c for c in run.ceilings if c.source == "measured"), None)
    if not cal.source:
        out.append(
            Block(
                "text",
                "**Measured roof**: none. This run has no calibration, so there is no measured roof, only the "
                "datasheet and NVML-derived ones (`flashbench calibrate` on the GPU before the sweep records one).",
            )
        )
    elif cal.throttled:
        where = "" if cal.source == "run" else " (this machine's calibrate file, not the run's record)"
        rates = ""
        if measured_roof is not None:
            rates = _throttled_rates(run, cal, measured_roof)
        out.append(
            Block(
                "warn",
                f"**Measured roof**: the calibration{where} ran on a throttled GPU "
                f"({cal.reason or 'reason not recorded'}).{rates} % of roofline is against the "
                f"{_first_roof(run)} roof.",
            )
        )
    return out


def _clock_gap_words(groups: list[lead_rows.Lead]) -> str:
    """Which leads the clocks decide, from the rows: those whose margin is inside the fastest's clock advantage
    plus the noise but not inside the noise alone; else the widest clock difference between a group's fastest
    and runner-up, and that no lead depends on it."""
    pairs = [g for g in groups if g.runner_up and g.fastest_clock == g.fastest_clock]
    pairs = [g for g in pairs if g.runner_clock == g.runner_clock]
    if not pairs:
        return ""
    noise = [g.noise if g.noise == g.noise else 0.0 for g in pairs]
    decided = [g for g, n in zip(pairs, noise, strict=True) if g.tied and g.geomean - 1.0 > n]
    if decided:
        each = "; ".join(
            f"{g.group}: {g.fastest} at {g.fastest_clock:.0f} MHz, {g.runner_up} at {g.runner_clock:.0f} MHz, "
            f"{pct(g.clock_gap)} apart against a {pct(g.geomean - 1.0)} margin"
            for g in decided
        )
        return f"Within a group the clocks differ, and in {len(decided)} the difference covers the lead ({each}): those are called tied."
    widest = max(pairs, key=lambda g: abs(g.fastest_clock / g.runner_clock - 1.0))
    gap = widest.fastest_clock / widest.runner_clock - 1.0
    if abs(gap) < 0.01:
        return "Within each group the fastest and the runner-up ran at clocks within 1% of each other."
    faster = "higher" if gap > 0 else "lower"
    return (
        f"Within a group the fastest and the runner-up ran up to {pct(abs(gap))} apart ({widest.group}: "
        f"{widest.fastest} at a {faster} clock, {widest.fastest_clock:.0f} vs {widest.runner_clock:.0f} MHz); "
        "no lead here is within its clock advantage and noise."
    )


def bandwidth_blocks(run: Run) -> list[Block]:
    """Serving rows above the calibrated read bandwidth, explained from the rows and the GPU's L2."""
    l2 = getattr(run.gpu_spec, "l2_bytes", None)
    over = serving.above_read_bw(run.frame, l2)
    if over.empty:
        return []
    read = float(run.frame["read_bw_gb_s"].dropna().iloc[0])
    sheet = run.frame["datasheet_bw_gb_s"].dropna()
    where = ", ".join(
        dict.fromkeys(
            f"{r.provider} at N={r.seq_k // 1024}k batch {r.batch} ({r.variant})" for r in over.itertuples()
        )
    )
    text = (
        f"**Above the calibrated read bandwidth**: {len(over)} serving row{'s' * (len(over) != 1)} ({where}) "
        f"read at {span(over['achieved_gb_s'], '.0f')} GB/s, {span(over['pct_of_read_bw'], '.1f')}% of the "
        f"calibrated {read:.0f} GB/s."
    )
    fits = over[over["why"] == "fits in L2"]
    if len(fits) and l2:
        text += (
            f" {len(fits)} of them move a KV cache that fits in the L2 ({span(fits['model_bytes_compulsory'] / 2**20, '.0f')} "
            f"MiB of {l2 / 2**20:.0f} MiB): the L2 served part of their reads."
        )
    rest = over[over["why"] != "fits in L2"]
    if len(rest):
        text += (
            " The calibration's read is one kernel's rate (torch.sum over 1 GiB), a lower bound of what the memory "
            "delivers, not its ceiling"
            + (
                f": these rows stay at {span(rest['pct_of_datasheet_bw'], '.1f')}% of the datasheet's "
                f"{float(sheet.iloc[0]):.0f} GB/s."
                if len(sheet)
                else "."
            )
        )
    return [Block("text", text)]


def host_blocks(frame: Any) -> list[Block]:
    lines = host.host_lines(frame)
    ok = int(frame["ok"].sum())
    if not lines:
        if not ok or (frame.loc[frame["ok"], "device"] == "cpu").all():
            return []
        return [
            Block(
                "text",
                "**Host time**: not measured in this run (its rows predate host and loop timing), so the times "
                "above are what the GPU worked, not what an eager loop pays per call.",
            )
        ]
    head = (
        "**Host time** (loop = per-call time of back-to-back eager calls with one sync and no spin kernel, what "
        "a Python loop pays; the GPU's work = its time per call held back to back, where recorded, else the "
        "samples' median; host-bound = the sweep's flag, loop time above the GPU's work by more than its margin):"
    )
    items = []
    for h in lines:
        timed = "" if h.timed_as == "eager" else f" (timed as {h.timed_as})"
        worst = (
            f"at {h.worst_at} an eager loop pays {h.worst_loop_ms:.4g} ms per call where the GPU works "
            f"{h.worst_gpu_ms:.4g} ms ({x(h.worst_ratio)}"
            + (
                f"; {h.worst_host_ms:.4g} ms of host time to enqueue it"
                if h.worst_host_ms == h.worst_host_ms
                else ""
            )
            + ")"
        )
        if h.host_bound:
            named = ", ".join(h.where[: host.MAX_WHERE])
            more = f", … {len(h.where) - host.MAX_WHERE} more" if len(h.where) > host.MAX_WHERE else ""
            items.append(
                f"- **{h.provider}**{timed} host-bound in {h.host_bound} of {h.measured} cases ({named}{more}); {worst}."
            )
        else:
            items.append(f"- {h.provider}{timed}: none of {h.measured} cases host-bound; the most: {worst}.")
    kind = "warn" if any(h.host_bound for h in lines) else "text"
    return [Block(kind, "\n".join([head, "", *items]))]


def _throttled_rates(run: Run, cal: clocks.Calibration, roof: Any) -> str:
    """Which of the calibration's figures a throttled GPU gave (not ceilings), and which ran unthrottled and
    stand: each measurement is judged by its own clock-event reasons where the record has them."""
    throttled: list[str] = []
    sound: list[str] = []
    for d in dict.fromkeys(run.frame["dtype"]):
        if roof.peak(d):
            clock, reasons = cal.matmul_clock(d)
            figure = f"{roof.peak(d) / 1e12:.0f} TFLOP/s {d}"
            (throttled if reasons or not cal.matmul else sound).append(figure)
    if cal.bandwidth:
        for name, gb_s, clock, reasons in cal.bandwidth:
            at = f" at {clock:.0f} MHz" if clock else ""
            (throttled if reasons else sound).append(f"{gb_s:.0f} GB/s {name}{at}")
    else:  # an older record: its bandwidth is as suspect as the rest
        throttled.append(f"{roof.bw_bytes_s / 1e12:.2f} TB/s")
    text = f" Its {', '.join(throttled)} are what a throttled GPU did, not ceilings." if throttled else ""
    if sound:
        text += f" Its {', '.join(sound)} ran unthrottled and stand."
    return text


def _first_roof(run: Run) -> str:
    return ROOF_LABELS.get(run.ceilings[0].source, run.ceilings[0].source) if run.ceilings else "datasheet"

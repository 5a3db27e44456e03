"""The verdict the report leads with, in words a reader can paste into a pull request.

One markdown text, built from analysis.summary and analysis.clocks: the markdown report prints it as it is and
the HTML page renders the same text (markdown-it, raw HTML escaped) above its figures, each block in its own
colour (a gate that failed in red). Nothing here computes a number: it only words them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashbench.analysis import clocks, host, serving, summary
from flashbench.analysis import leads as lead_rows
from flashbench.analysis.comparison import NO_GATE_ACROSS_GPUS, same_gpu, same_run
from flashbench.analysis.modelled import ROOF_LABELS
from flashbench.analysis.runs import DEFAULT_BASELINES, pick_baseline

if TYPE_CHECKING:
    from flashbench.analysis.runs import Run

MAX_WORST = 5  # worst gate cases named
# Gate verdicts (flashbench.gate) of cases that compare nothing, and of the cases worth naming, worst kinds first.
# "baseline-only" became "missing" when the gate learnt to fail on cases the current run lost: both are read.
NOT_COMPARED = ("not-ok-both", "baseline-only", "missing", "current-only")
WORST = ("regression", "newly-failing", "missing", "slower-within-noise")
# What the gate's in-run ratio is, for readers who never opened docs/gate.md.
IN_RUN_RATIO = (
    "*In-run ratio*: the bundled kernel's time over its reference provider's for one shape in the same run "
    "({pairs}), compared with the same ratio in the baseline run. A slower or hotter machine slows both and "
    "leaves the ratio alone, so a ratio that moved points at the code, not the machine."
)


@dataclass(frozen=True)
class Block:
    """One paragraph or list of the verdict. kind: "text", "pass", "fail" or "warn" (the HTML's colour)."""

    kind: str
    markdown: str


def blocks(run: Run, reference: str | None, baseline_run: Run | None = None, gate: Any = None) -> list[Block]:
    """The verdict of `run` as markdown blocks (with a baseline run: the gate's verdict first)."""
    f = run.frame
    out: list[Block] = []
    if baseline_run is not None:
        out += _gate_blocks(run, baseline_run, gate)
    out.append(Block("text", _what_ran(run)))
    groups = lead_rows.leads(f)
    lead_lines = [_lead_line(x, len({g.dtype for g in groups}) > 1) for x in groups]
    if lead_lines:
        head = (
            "**Fastest per case group** (× = the runner-up's median time / the fastest's: geometric mean over N, "
            "then the range; *tied* where that margin is within the rows' p20–p80 noise plus the fastest's "
            "clock advantage; best % of roofline in the group, one roof per case, and the case's bound; for "
            "serving groups the best % of the calibrated read bandwidth"
            + ("; the energy per unit of work where measured" if any(g.energy for g in groups) else "")
            + "):"
        )
        out.append(Block("text", "\n".join([head, "", *lead_lines])))
    if reference:
        line = _reference_line(f, reference)
        if line:
            out.append(Block("text", line))
    out += _failure_blocks(f)
    out += _bandwidth_blocks(run)
    if not run.is_cpu:
        out += _clock_blocks(run, groups)
    out += _host_blocks(f)
    return out


def markdown(run: Run, reference: str | None, baseline_run: Run | None = None, gate: Any = None) -> str:
    """The verdict as one markdown text (the markdown report's first section)."""
    return "\n\n".join(b.markdown for b in blocks(run, reference, baseline_run, gate)) + "\n"


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _what_ran(run: Run) -> str:
    f = run.frame
    meas = summary.measured(f)
    ok = int(meas["ok"].sum())
    device = "CPU" if run.is_cpu else run.gpu_name
    text = f"**{device}** · " + " · ".join(summary.description(f))
    text += f": {len(meas)} cases, {'all' if ok == len(meas) else ok} ok"
    modes = meas.loc[meas["ok"], "timed_as"].value_counts()
    if len(modes) == 1:
        text += f", every one timed as {TIMED_AS.get(modes.index[0], modes.index[0])}."
    elif len(modes) > 1:
        text += ", timed as " + " and ".join(f"{TIMED_AS.get(m, m)} ({n})" for m, n in modes.items()) + "."
    else:
        text += "."
    missing = summary.not_installed(f)
    if missing:
        text += f" Not installed, so neither cases nor providers here: {', '.join(missing)}."
    if run.is_cpu:
        text += " **CPU run**: all times are CPU times (torch on CPU, Triton interpreter), not GPU speeds."
    if run.env.synthetic:
        text += " **SYNTHETIC results**: generated for tests, not measured."
    return text


# How each row's samples were taken (the rows' cuda_graph flag), in words.
TIMED_AS = {"eager": "eager calls", "CUDA graph": "CUDA graph replays"}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _lead_line(lead: lead_rows.Lead, with_dtype: bool) -> str:
    text = f"- {lead.group}" + (f" · {lead.dtype}" if with_dtype else "") + ": "
    if lead.runner_up is None:
        text += f"**{lead.fastest}** (the only provider measured)"
    else:
        (lo_n, lo), (hi_n, hi) = lead.low, lead.high
        span = f"{_x(lo)} at N={lo_n} … {_x(hi)} at N={hi_n}" if len(lead.ratios) > 1 else f"N={lo_n}"
        name = lead.fastest if lead.tied else f"**{lead.fastest}**"
        text += ("tied: " if lead.tied else "") + f"{name} {_x(lead.geomean)} over {lead.runner_up} ({span}"
        behind = _behind_words(lead)
        text += f"; {lead.runner_up} ahead {behind})" if behind else ")"
        text += _noise_words(lead)
    if lead.best_pct is not None:
        text += (
            f" · best {lead.best_pct:.0f}% of {lead.best_pct_of} ({lead.best_pct_provider}, "
            f"N={lead.best_pct_at}, {lead.best_pct_bound})"
        )
    if lead.energy:
        each = ", ".join(f"{p} {e:.3g}" for p, e in lead.energy)
        text += f" · {lead.energy_unit}: {each}"
    return text


def _noise_words(lead: lead_rows.Lead) -> str:
    """What the margin is judged against: the noise, and the two clocks where they differ by 1% or more."""
    words = []
    if lead.noise == lead.noise:
        words.append(f"noise ±{_pct(lead.noise)}")
    a, b = lead.fastest_clock, lead.runner_clock
    if a == a and b == b and abs(a / b - 1.0) >= 0.01:
        words.append(f"SM clock {a:.0f} vs {b:.0f} MHz")
    if not words:
        return ""
    if lead.tied:
        return "; within " + " and ".join(words) if len(words) == 1 else f"; within {words[0]}, {words[1]}"
    return "; " + ", ".join(words)


def _behind_words(lead: lead_rows.Lead) -> str:
    """Where the runner-up was faster: "from N=4k", "up to N=2k" or "at N=1k, 8k"."""
    labels = [n for n, _ in lead.ratios]
    behind = lead.behind_at
    if not behind or len(behind) == len(labels):
        return ""
    if len(behind) == 1:
        return f"at N={behind[0]}"
    if labels[-len(behind) :] == behind:
        return f"from N={behind[0]}"
    if labels[: len(behind)] == behind:
        return f"up to N={behind[-1]}"
    return "at N=" + ", ".join(behind)


def _reference_line(frame: Any, reference: str) -> str:
    sp = summary.reference_speedups(frame, reference)
    if sp.empty:
        return ""
    parts = []
    for mode, g in sp.groupby("mode", sort=False):
        each = [
            f"{r['provider']} {_x(r['geomean'])} ({r['min']:.2f}–{_x(r['max'])})"
            for r in g.to_dict("records")
        ]
        parts.append(f"{mode}: " + ", ".join(each))
    return (
        f"**Speedup over {reference}** (above 1 = faster than {reference}: its median time over the provider's "
        f"on the same shape, geometric mean over the cases, then the range; {reference} is "
        f"{_reference_rule(frame, reference)}): " + "; ".join(parts) + "."
    )


def _reference_rule(frame: Any, reference: str) -> str:
    if pick_baseline(frame) != reference:
        return "named by `--speedup-vs`"
    if reference in DEFAULT_BASELINES:
        return f"the first of {', '.join(DEFAULT_BASELINES)} that ran; `--speedup-vs` picks another"
    return (
        "the first provider measured, none of the usual references having run; `--speedup-vs` picks another"
    )


def _failure_blocks(frame: Any) -> list[Block]:
    bad = summary.failures_that_matter(frame)
    not_run = summary.not_run_counts(frame)
    tail = ""
    if not_run:
        tail = " Not run: " + ", ".join(f"{n} {s}" for s, n in not_run.items()) + " (refusals, listed below)."
    if bad.empty:
        return [
            Block("text", "**Failures that matter**: none (no wrong result, crash, timeout or OOM)." + tail)
        ]
    lines = [f"**Failures that matter** ({int(bad['cases'].sum())} cases):", ""]
    for r in bad.to_dict("records"):
        reason = summary.shorten(r["reason"], 120)
        lines.append(f"- {r['cases']} {r['status']}, {r['provider']}: {r['where']} (`{reason}`)")
    return [Block("warn", "\n".join(lines) + ("\n\n" + tail.strip() if tail else ""))]


def _clock_blocks(run: Run, groups: list[lead_rows.Lead]) -> list[Block]:
    out: list[Block] = []
    t = clocks.throttling(run.frame, run.env)
    if t.clock_min is None:
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
            f"{_pct(g.clock_gap)} apart against a {_pct(g.geomean - 1.0)} margin"
            for g in decided
        )
        return f"Within a group the clocks differ, and in {len(decided)} the difference covers the lead ({each}): those are called tied."
    widest = max(pairs, key=lambda g: abs(g.fastest_clock / g.runner_clock - 1.0))
    gap = widest.fastest_clock / widest.runner_clock - 1.0
    if abs(gap) < 0.01:
        return "Within each group the fastest and the runner-up ran at clocks within 1% of each other."
    faster = "higher" if gap > 0 else "lower"
    return (
        f"Within a group the fastest and the runner-up ran up to {_pct(abs(gap))} apart ({widest.group}: "
        f"{widest.fastest} at a {faster} clock, {widest.fastest_clock:.0f} vs {widest.runner_clock:.0f} MHz); "
        "no lead here is within its clock advantage and noise."
    )


def _bandwidth_blocks(run: Run) -> list[Block]:
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
        f"read at {_span(over['achieved_gb_s'], '.0f')} GB/s, {_span(over['pct_of_read_bw'], '.1f')}% of the "
        f"calibrated {read:.0f} GB/s."
    )
    fits = over[over["why"] == "fits in L2"]
    if len(fits):
        text += (
            f" {len(fits)} of them move a KV cache that fits in the L2 ({_span(fits['model_bytes_compulsory'] / 2**20, '.0f')} "
            f"MiB of {l2 / 2**20:.0f} MiB): the L2 served part of their reads."
        )
    rest = over[over["why"] != "fits in L2"]
    if len(rest):
        text += (
            " The calibration's read is one kernel's rate (torch.sum over 1 GiB), a lower bound of what the memory "
            "delivers, not its ceiling"
            + (
                f": these rows stay at {_span(rest['pct_of_datasheet_bw'], '.1f')}% of the datasheet's "
                f"{float(sheet.iloc[0]):.0f} GB/s."
                if len(sheet)
                else "."
            )
        )
    return [Block("text", text)]


def _span(values: Any, fmt: str) -> str:
    lo, hi = float(min(values)), float(max(values))
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}–{format(hi, fmt)}"


def _host_blocks(frame: Any) -> list[Block]:
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
        "a Python loop pays; host-bound = the sweep's flag, loop time above the GPU time by more than its margin):"
    )
    items = []
    for h in lines:
        timed = "" if h.timed_as == "eager" else f" (timed as {h.timed_as})"
        worst = (
            f"at {h.worst_at} an eager loop pays {h.worst_loop_ms:.4g} ms per call where the GPU works "
            f"{h.worst_gpu_ms:.4g} ms ({_x(h.worst_ratio)}"
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
    throttled, sound = [], []
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


# ------------------------------------------------------------------------------------------- the gate


def _gate_blocks(run: Run, baseline_run: Run, gate: Any) -> list[Block]:
    name = baseline_run.name
    self_compare = []
    why = same_run(run, baseline_run)
    if why:
        self_compare = [
            Block(
                "warn",
                f"**The baseline is this run itself** ({why}): every ratio below is 1 by construction, and the "
                "gate's verdict says nothing about the code.",
            )
        ]
    if not same_gpu(run, baseline_run):
        return [*self_compare, Block("warn", NO_GATE_ACROSS_GPUS)]
    if gate is None:
        return [
            *self_compare,
            Block("warn", f"**No gate verdict against `{name}`**: the two runs have no case in common."),
        ]
    threshold = getattr(getattr(gate, "config", None), "threshold", None)
    thr = f" (threshold {threshold:.0%} slower)" if threshold is not None else ""
    word = "PASS" if gate.passed else "FAIL"
    # The gate's headline counts every key; cases not ok on either side (a provider not installed) compare nothing.
    compared = sum(c.verdict not in NOT_COMPARED for c in gate.cases)
    counts = gate.headline().split("; ", 1)[1:]
    text = f"**Gate against `{name}`: {word}**{thr}. {compared} cases compared" + (
        f"; {counts[0]}." if counts else "."
    )
    lines = [text]
    keys = run.frame.set_index("key")
    worst = sorted(
        (c for c in gate.cases if c.verdict in WORST),
        key=lambda c: (c.verdict == "slower-within-noise", -(c.ratio or float("inf"))),
    )[:MAX_WORST]
    if worst:
        lines += ["", "Worst cases (now / before, median time):", ""]
        for c in worst:
            ratio = f"{_x(c.ratio)} slower" if c.ratio else c.current_status or "not in this run"
            ci = f", interval {c.ci_low:.3f}–{c.ci_high:.3f}" if c.ci_low is not None else ""
            lines.append(f"- {_case_of(keys, c.key)}: {ratio} ({c.verdict}{ci})")
    ratios = getattr(gate, "ratios", [])
    if ratios:
        pairs = ", ".join(dict.fromkeys(f"{r.bundled} / {r.reference}" for r in ratios))
        moved = [r for r in ratios if r.verdict in ("regression", "slower-within-noise")]
        lines += ["", IN_RUN_RATIO.format(pairs=pairs)]
        if moved:
            lines += [""]
            for r in sorted(moved, key=lambda r: -r.change)[:MAX_WORST]:
                lines.append(
                    f"- {r.bundled} / {r.reference} at {_shape_of(run.frame, r.shape)}: {r.baseline_ratio:.3f} "
                    f"before, {r.current_ratio:.3f} now ({r.change - 1:+.1%}, {r.verdict})"
                )
    return [*self_compare, Block("pass" if gate.passed else "fail", "\n".join(lines))]


def _case_of(keys: Any, key: str) -> str:
    """A gate case key in words (provider, N, d, mask, mode), or the key itself where the run lacks it."""
    if key not in keys.index:
        return f"`{key}`"
    r = keys.loc[key]
    return f"{r['provider']} {summary.case_words(r)} {r['mode']}"


def _shape_of(frame: Any, shape: str) -> str:
    """A shape key in words (N, d, mask, mode), or the key itself where the run lacks it."""
    rows = frame[frame["shape_key"] == shape]
    if rows.empty:
        return f"`{shape}`"
    r = rows.iloc[0]
    return f"{summary.case_words(r)} {r['mode']}"

"""The verdict the report leads with, in words a reader can paste into a pull request.

One markdown text, built from analysis.summary, analysis.leads and (through report.machine_words: clocks, the
measured roof, bandwidth, host time) analysis.clocks and analysis.host: the markdown report prints it as it is and
the HTML page renders the same text (markdown-it, raw HTML escaped) above its figures, each block in its own
colour (a gate that failed in red). Nothing here computes a number: it only words them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.analysis import leads as lead_rows
from flashbench.analysis import summary
from flashbench.analysis.comparison import NO_GATE_ACROSS_GPUS, same_gpu, same_run
from flashbench.analysis.runs import pick_baseline
from flashbench.providers import builtin
from flashbench.report.machine_words import bandwidth_blocks, clock_blocks, host_blocks
from flashbench.report.words import Block, pct, x

if TYPE_CHECKING:
    from flashbench.analysis.runs import Run

__all__ = ["Block", "blocks", "markdown"]

MAX_WORST = 5  # worst gate cases named
# Gate verdicts (flashbench.analysis.gate) of cases that compare nothing, and of the cases worth naming, worst kinds first.
# "baseline-only" became "missing" when the gate learnt to fail on cases the current run lost: both are read.
NOT_COMPARED = ("not-ok-both", "baseline-only", "missing", "current-only")
WORST = ("regression", "newly-failing", "missing", "slower-within-noise")
# What the gate's in-run ratio is, for readers who never opened docs/gate.md.
IN_RUN_RATIO = (
    "*In-run ratio*: the bundled kernel's time over its reference provider's for one shape in the same run "
    "({pairs}), compared with the same ratio in the baseline run. A slower or hotter machine slows both and "
    "leaves the ratio alone, so a ratio that moved points at the code, not the machine."
)


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
    out += bandwidth_blocks(run)
    if not run.is_cpu:
        out += clock_blocks(run, groups)
    out += host_blocks(f)
    return out


def markdown(run: Run, reference: str | None, baseline_run: Run | None = None, gate: Any = None) -> str:
    """The verdict as one markdown text (the markdown report's first section)."""
    return "\n\n".join(b.markdown for b in blocks(run, reference, baseline_run, gate)) + "\n"


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


def _lead_line(lead: lead_rows.Lead, with_dtype: bool) -> str:
    text = f"- {lead.group}" + (f" · {lead.dtype}" if with_dtype else "") + ": "
    if lead.runner_up is None:
        text += f"**{lead.fastest}** (the only provider measured)"
    else:
        (lo_n, lo), (hi_n, hi) = lead.low, lead.high
        span = f"{x(lo)} at N={lo_n} … {x(hi)} at N={hi_n}" if len(lead.ratios) > 1 else f"N={lo_n}"
        name = lead.fastest if lead.tied else f"**{lead.fastest}**"
        text += ("tied: " if lead.tied else "") + f"{name} {x(lead.geomean)} over {lead.runner_up} ({span}"
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
        words.append(f"noise ±{pct(lead.noise)}")
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
            f"{r['provider']} {x(r['geomean'])} ({r['min']:.2f}–{x(r['max'])})" for r in g.to_dict("records")
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
    references = builtin.baselines()
    if reference in references:
        return f"the first of {', '.join(references)} that ran; `--speedup-vs` picks another"
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
    # the threshold is the slowdown the gate is asked to catch; each case fails beyond its own limit
    thr = f" (catching {threshold:.0%} slowdowns where the noise allows)" if threshold is not None else ""
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
            ratio = f"{x(c.ratio)} slower" if c.ratio else c.current_status or "not in this run"
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

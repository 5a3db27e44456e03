"""The report's verdict: who is fastest and by how much, failures that matter, clocks in words, the measured
roof's trust, what ran; computed from rows whose numbers the tests know (no browser, no plotly)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from report_helpers import H100, H100_FACTS, H100_SPEED, case_row, needs_plotly, write_run

from flashbench.analysis import clocks, leads, summary
from flashbench.analysis import runs as analysis
from flashbench.engine.calibrate import throttle_verdict
from flashbench.report import tables, verdict
from flashbench.report.hover import hover, with_context
from flashbench.results.rows import Row
from flashbench.spec.cases import Case

TIMES = {  # provider -> median ms at N = 1k, 2k, 4k (fwd, d=64, non-causal)
    "A": (1.0, 2.0, 4.0),
    "B": (1.2, 2.2, 3.8),
    "C": (2.0, 4.0, 8.0),
}


@pytest.fixture(autouse=True)
def no_local_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No calibrate file of this machine may stand in for a run's own record."""
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path / "home"))


def three_providers(tmp_path: Path) -> analysis.Run:
    rows = [
        case_row(p, ms, n=n)
        for p, times in TIMES.items()
        for n, ms in zip((1024, 2048, 4096), times, strict=True)
    ]
    rows += [
        case_row("D", None, n=n, status="unavailable", reason="D is not installed") for n in (1024, 2048)
    ]
    return analysis.load_run(write_run(tmp_path / "run", rows))


def test_fastest_and_its_margin_over_the_runner_up_per_group(tmp_path: Path) -> None:
    (lead,) = leads.leads(three_providers(tmp_path).frame)
    ratios = [b / a for a, b in zip(TIMES["A"], TIMES["B"], strict=True)]  # B's time / A's: 1.2, 1.1, 0.95
    assert (lead.fastest, lead.runner_up) == ("A", "B")
    assert lead.geomean == pytest.approx(statistics.geometric_mean(ratios))
    assert lead.low == ("4k", pytest.approx(0.95)) and lead.high == ("1k", pytest.approx(1.2))
    assert lead.behind_at == ["4k"]  # B was faster at the largest N
    assert lead.providers == ("A", "B", "C") and "D" not in lead.providers


def test_verdict_names_the_fastest_with_its_numbers(tmp_path: Path) -> None:
    run = three_providers(tmp_path)
    md = verdict.markdown(run, analysis.pick_baseline(run.frame))
    g = statistics.geometric_mean([1.2 / 1.0, 2.2 / 2.0, 3.8 / 4.0])
    line = (
        f"- fwd · d=64 · non-causal: **A** {g:.2f}× over B (0.95× at N=4k … 1.20× at N=1k; B ahead at N=4k)"
    )
    assert line in md


def test_a_provider_not_installed_is_neither_a_case_nor_a_provider(tmp_path: Path) -> None:
    run = three_providers(tmp_path)
    assert summary.not_installed(run.frame) == ["D"]
    assert summary.description(run.frame)[0] == "3 providers (A, B, C)"
    assert summary.failures_that_matter(run.frame).empty
    md = verdict.markdown(run, None)
    assert (
        ": 9 cases, all ok, every one timed as eager calls." in md
        and "Not installed, so neither cases nor providers here: D." in md
    )


def test_failures_that_matter_are_wrong_crash_timeout_oom_not_refusals(tmp_path: Path) -> None:
    rows = [
        case_row("A", 1.0),
        case_row("A", None, n=2048, status="wrong", reason="rel_err 3e-1 > budget 8e-3"),
        case_row("B", None, status="crash", reason="worker exited with SIGSEGV"),
        case_row("B", None, n=2048, status="oom", reason="CUDA out of memory"),
        case_row("C", None, status="unsupported", reason="head dim 64 not supported"),
        case_row("C", None, n=2048, status="predicted-oom", reason="needs 90 GiB"),
        case_row("D", None, status="unavailable"),
    ]
    frame = analysis.load_run(write_run(tmp_path / "run", rows)).frame
    bad = summary.failures_that_matter(frame)
    assert sorted(zip(bad["status"], bad["provider"], strict=True)) == [
        ("crash", "B"),
        ("oom", "B"),
        ("wrong", "A"),
    ]
    assert summary.not_run_counts(frame) == {"unsupported": 1, "predicted-oom": 1}


def test_decode_shapes_need_not_have_seq_q_equal_seq_k(tmp_path: Path) -> None:
    rows = [
        case_row(p, ms * nk / 1024, n=1, nk=nk) for p, ms in (("A", 0.01), ("B", 0.02)) for nk in (1024, 8192)
    ]
    frame = analysis.load_run(write_run(tmp_path / "run", rows)).frame
    (lead,) = leads.leads(frame)
    assert lead.fastest == "A" and [n for n, _ in lead.ratios] == ["1×1k", "1×8k"]
    assert lead.geomean == pytest.approx(2.0)
    assert "Nq = 1 over Nk = 1k, 8k" in summary.description(frame)


def test_windowed_cases_are_ranked_apart_from_full_ones(tmp_path: Path) -> None:
    # A is faster without a window, B with one: one group each, never a mixture of the two.
    def row(provider: str, ms: float, n: int, window: str) -> Row:
        case = Case(provider, 1, 8, 8, n, n, 64, "bf16", True, "fwd", window=window)
        return Row.for_case(case, "ok", gpu=H100, samples_ms=[ms] * 10, median_ms=ms, p20_ms=ms, p80_ms=ms)

    rows = [row("A", 1.0 * n / 1024, n, "") for n in (1024, 2048)] + [
        row("B", 1.5 * n / 1024, n, "") for n in (1024, 2048)
    ]
    rows += [row("A", 0.5, n, "256,0") for n in (1024, 2048)] + [
        row("B", 0.25, n, "256,0") for n in (1024, 2048)
    ]
    groups = leads.leads(analysis.load_run(write_run(tmp_path / "run", rows)).frame)
    assert [(lead.variant, lead.fastest, lead.geomean) for lead in groups] == [
        ("", "A", pytest.approx(1.5)),
        ("window 256,0", "B", pytest.approx(2.0)),
    ]
    assert groups[1].group.endswith("causal · window 256,0")


def test_clock_event_reasons_in_words() -> None:
    assert clocks.reason_words(0x4) == ["software power cap"]
    assert clocks.reason_words(0x20 | 0x40) == ["software thermal slowdown", "hardware thermal slowdown"]
    assert clocks.reason_words(0x1 | 0x2) == []  # idle and application clocks are not throttling
    assert clocks.reason_words(0x8 | 0x10000) == ["hardware slowdown", "0x10000"]
    assert clocks.reason_words(None, ["sw_power_cap", "gpu_idle"]) == ["software power cap"]


def test_the_clock_a_case_ran_at_prefers_the_timed_window() -> None:
    frame = pd.DataFrame(
        {
            "sm_clock_mhz": [1755.0, float("nan")],  # the median during the samples, where recorded
            "sm_clock_mhz_before": [1980.0, 1980.0],
            "sm_clock_mhz_after": [1800.0, 1650.0],
            "clock_event_reasons_before": [0.0, 0.0],
            "clock_event_reasons_after": [4.0, 0x40],
            "throttle_reasons": [["sw_power_cap"], []],
        }
    )
    got = clocks.case_clocks(frame)
    assert list(got["clock_mhz"]) == [1755.0, 1650.0]
    assert list(got["clock_source"]) == ["during the samples", "before/after the case"]
    assert list(got["reasons"]) == ["software power cap", "hardware thermal slowdown"]


def test_a_case_runs_at_its_median_clock_during_the_samples_or_around_them_in_older_runs(
    tmp_path: Path,
) -> None:
    around = {"sm_clock_mhz": 1980, "clock_event_reasons": 0}
    rows = [
        # the steady regime's row: the median SM clock of the NVML readings during the samples, their range,
        # the reasons seen then (names) and the share of readings that throttled
        case_row(
            "A",
            1.0,
            sm_clock_mhz=1500.0,
            sm_clock_min_mhz=1320,
            sm_clock_max_mhz=1680,
            throttle_reasons=["sw_power_cap"],
            throttled_share=0.4,
            throttled=True,
            nvml_before=around,
            nvml_after={"sm_clock_mhz": 1755, "clock_event_reasons": 0},
        ),
        # an older row: only the samples before and after the case
        case_row(
            "B",
            2.0,
            throttled=True,
            nvml_before=around,
            nvml_after={"sm_clock_mhz": 1650, "clock_event_reasons": 0x40},
        ),
    ]
    run = analysis.load_run(write_run(tmp_path / "run", rows))
    thr = clocks.throttled_cases(run.frame, run.env)
    assert list(thr["provider"]) == ["A", "B"] and list(thr["SM clock MHz"]) == [1500.0, 1650.0]
    assert list(thr["why (NVML)"]) == ["software power cap", "hardware thermal slowdown"]
    a, b = hover(with_context(run.frame.sort_values("provider")))
    assert "SM clock 1500 MHz, 1320–1680 (during the samples); throttled: software power cap (in 40% of" in a
    assert "SM clock 1650 MHz (before/after the case); throttled: hardware thermal slowdown" in b
    t = clocks.throttling(run.frame, run.env)
    assert (t.throttled, t.clock_min, t.clock_max) == (2, 1500.0, 1650.0)
    assert t.clock_source == "before/after the case / during the samples"


def test_throttled_cases_lowest_clock_first() -> None:
    """The committed H100 run's throttled cases, lowest clock first, each with the NVML reasons its row recorded
    (the run's own facts, read back: a new run of the table changes them)."""
    run = analysis.load_run(H100_SPEED)
    thr = clocks.throttled_cases(run.frame, run.env)
    assert len(thr) == int(run.frame["throttled"].sum()) > 0
    assert list(thr["SM clock MHz"]) == sorted(thr["SM clock MHz"])
    for why in thr["why (NVML)"]:  # each a list of NVML's reasons in words
        assert why and set(why.split(", ")) <= set(clocks.REASON_WORDS.values()), why


def test_a_throttled_calibration_is_no_ceiling_and_the_summary_says_so() -> None:
    run = analysis.load_run(H100_SPEED)
    cal = clocks.calibration(run.env, run.ceilings, run.gpu_spec)
    # the committed run's calibration (flashbench calibrate in the steady regime) hit the power cap in its matmuls
    record = run.env.calibration
    assert (cal.source, cal.throttled) == ("run", True)
    assert cal.clock_mhz == record["sm_clock_mhz"] and "software power cap" in cal.reasons
    md = verdict.markdown(run, "sdpa-flash")
    assert "**Measured roof**: the calibration ran on a throttled GPU (bf16 matmul: sw power cap" in md
    assert f"{record['matmul_tflops']['bf16']:.0f} TFLOP/s bf16" in md and "not ceilings" in md


def steady_calibration(bf16_reasons: list[str], **record: object) -> dict[str, object]:
    """A calibration record as `flashbench calibrate` writes it in the steady regime (engine/calibrate.py): each
    measurement with the clocks of its repetitions, the verdict worded by calibrate's own throttle_verdict."""
    details = {
        "copy": {"gb_s": 3000.0, "sm_clock_mhz": 1980.0, "power_w": 300.0, "throttle_reasons": []},
        "read": {"gb_s": 3100.0, "sm_clock_mhz": 1980.0, "power_w": 280.0, "throttle_reasons": []},
        "matmul": {
            "bf16": {"tflops": 640.0, "sm_clock_mhz": 1260.0, "power_w": 697.0, "throttled_share": 0.9}
            | {"throttle_reasons": bf16_reasons}
        },
    }
    measured = {"copy": details["copy"], "read": details["read"], "bf16 matmul": details["matmul"]["bf16"]}
    reason = throttle_verdict(measured, 1980)
    return {
        "gpu": "NVIDIA H100 80GB HBM3",
        "key": "h100-sxm",
        "copy_bw_gb_s": 3000.0,
        "read_bw_gb_s": 3100.0,
        "matmul_tflops": {"bf16": 640.0},
        "sm_clock_mhz": 1260.0,
        "max_sm_clock_mhz": 1980,
        "throttled": bool(reason),
        "throttle_reason": reason,
        "details": details,
        "timestamp_utc": "2026-12-01T10:00:00Z",
        **record,
    }


def test_a_steady_regime_calibration_is_judged_by_its_own_verdict(tmp_path: Path) -> None:
    rows = [case_row(p, ms) for p, ms in (("A", 1.0), ("B", 2.0))]
    run = analysis.load_run(
        write_run(tmp_path / "throttled", rows, calibration=steady_calibration(["sw_power_cap"]))
    )
    assert [c.source for c in run.ceilings][-1] == "measured"
    cal = clocks.calibration(run.env, run.ceilings, run.gpu_spec)
    assert (cal.source, cal.throttled, cal.clock_mhz) == ("run", True, 1260.0)
    assert cal.reasons == ("software power cap",)
    reason = (
        "bf16 matmul: sw power cap (in 90% of its clock readings) at 1260 MHz (64% of its 1980 MHz maximum)"
    )
    assert cal.reason == reason
    assert f"**Measured roof**: the calibration ran on a throttled GPU ({reason})." in verdict.markdown(
        run, None
    )
    env = dict(tables.env_rows(run))
    assert "read 3.10 TB/s" in env["calibration"] and f"THROTTLED ({reason})" in env["calibration"]

    # No reason during its repetitions: a sound ceiling, even if a sample taken after it saw the power cap.
    after = {"nvml_after": {"sm_clock_mhz": 1500, "clock_event_reasons": 0x4, "throttled": True}}
    run = analysis.load_run(write_run(tmp_path / "steady", rows, calibration=steady_calibration([], **after)))
    cal = clocks.calibration(run.env, run.ceilings, run.gpu_spec)
    assert (cal.throttled, cal.reason) == (False, "")
    assert "**Measured roof**" not in verdict.markdown(run, None)
    assert "THROTTLED" not in dict(tables.env_rows(run))["calibration"]


def test_the_environment_table_states_the_enforced_power_limit(tmp_path: Path) -> None:
    facts = {**H100_FACTS, "power_limit_w": 700.0}  # gpu.nvml.gpu_facts: nvmlDeviceGetEnforcedPowerLimit
    run = analysis.load_run(write_run(tmp_path / "run", [case_row("A", 1.0)], gpus=[facts]))
    assert dict(tables.env_rows(run))["power cap"] == "700 W"
    run = analysis.load_run(write_run(tmp_path / "old", [case_row("A", 1.0)]))
    assert dict(tables.env_rows(run))["power cap"] == "not recorded by this run"


def test_a_run_without_calibration_says_it_has_no_measured_roof(tmp_path: Path) -> None:
    run = three_providers(tmp_path)
    assert clocks.calibration(run.env, run.ceilings, run.gpu_spec).source == ""
    assert all(c.source != "measured" for c in run.ceilings)
    assert "**Measured roof**: none. This run has no calibration" in verdict.markdown(run, None)


def test_bound_and_percent_of_roofline_are_one_roof_per_case() -> None:
    run = analysis.load_run(H100_SPEED)
    ok = run.frame[run.frame["ok"]]
    view = summary.roof_view(ok)
    roof = run.ceilings[0]  # the datasheet roof: % of roofline is against it
    peak, bw = roof.peak("bf16"), roof.bw_bytes_s
    for (_, r), (_, v) in zip(ok.iterrows(), view.iterrows(), strict=True):
        ai = r["flops"] / r["model_bytes_compulsory"]
        assert v["roof_ai"] == pytest.approx(ai)
        assert v["roof_bound"] == ("compute-bound" if ai >= peak / bw else "memory-bound")
        assert v["roof_pct"] == pytest.approx(100 * r["tflops"] * 1e12 / min(peak, ai * bw))


def test_the_default_reference_is_a_baseline_not_the_bundled_kernel() -> None:
    frame = analysis.load_run(H100_SPEED).frame
    assert analysis.pick_baseline(frame) == "sdpa-flash"  # the run has triton, sdpa-flash and sdpa-cudnn
    sp = summary.reference_speedups(frame, "sdpa-flash")
    triton = sp[(sp["mode"] == "fwd") & (sp["provider"] == "triton")].iloc[0]
    ok = frame[frame["ok"] & (frame["mode"] == "fwd")]
    times = ok.pivot_table(index="shape_key", columns="provider", values="median_ms")
    ratios = times["sdpa-flash"] / times["triton"]
    assert triton["geomean"] == pytest.approx(math.exp(ratios.map(math.log).mean()))
    assert (triton["min"], triton["max"]) == (pytest.approx(ratios.min()), pytest.approx(ratios.max()))


def test_the_run_is_described_from_what_ran_not_the_preset(tmp_path: Path) -> None:
    run = analysis.load_run(H100_SPEED)
    assert run.env.spec["description"].startswith("bundled kernel vs SDPA")  # the preset's own words
    assert summary.description(run.frame) == [
        "3 providers (triton, sdpa-flash, sdpa-cudnn)",  # as first seen
        "bf16",
        "N = 1k–16k (5 sizes)",
        "batch × N = 16k tokens (batch 16…1)",
        "d = 64, 128 at heads × d = 2048",
        "causal and non-causal",
        "fwd, fwd+bwd",
    ]


def timed_row(provider: str, ms: float, spread: float, clock: float, n: int = 1024) -> Row:
    """An ok row at `ms` whose p20-p80 band is ms x (1 -/+ spread), run at SM clock `clock` MHz."""
    case = Case(provider, 1, 8, 8, n, n, 64, "bf16", False, "fwd")
    samples = [ms * (1 - spread)] * 3 + [ms] * 4 + [ms * (1 + spread)] * 3
    return Row.for_case(
        case,
        "ok",
        gpu=H100,
        samples_ms=samples,
        median_ms=ms,
        p20_ms=ms * (1 - spread),
        p80_ms=ms * (1 + spread),
        sm_clock_mhz=clock,
    )


@pytest.mark.parametrize(
    ("spread", "clock_a", "tied"),
    [
        (0.0, 1800.0, False),  # A 3% faster, no noise, same clock: a win
        (0.02, 1800.0, True),  # each row's p20-p80 is +-2%: half-widths add to 4% > 3%
        (0.005, 1800.0 * 1.03, True),  # 1% noise, and A ran at a 3% higher clock: 3% is within 4%
        (0.005, 1800.0 / 1.03, False),  # A won at the lower clock: the clock explains nothing
    ],
)
def test_a_margin_within_noise_and_clock_advantage_is_a_tie(
    tmp_path: Path, spread: float, clock_a: float, tied: bool
) -> None:
    rows = [timed_row("A", 1.0 * k, spread, clock_a, n=1024 * k) for k in (1, 2)]
    rows += [timed_row("B", 1.03 * k, spread, 1800.0, n=1024 * k) for k in (1, 2)]
    run = analysis.load_run(write_run(tmp_path / "run", rows))
    (lead,) = leads.leads(run.frame)
    assert (lead.fastest, lead.runner_up) == ("A", "B")
    assert lead.noise == pytest.approx(2 * spread)
    assert lead.clock_gap == pytest.approx(max(clock_a / 1800.0 - 1, 0.0))
    assert lead.tied is tied
    line = next(x for x in verdict.markdown(run, None).splitlines() if x.startswith("- fwd"))
    assert line.startswith("- fwd · d=64 · non-causal: tied: A 1.03× over B") == tied
    assert line.startswith("- fwd · d=64 · non-causal: **A** 1.03× over B") == (not tied)


def test_the_clock_sentence_is_computed_even_when_nothing_throttled(tmp_path: Path) -> None:
    rows = [timed_row("A", 1.0, 0.0, 1980.0), timed_row("B", 1.2, 0.0, 1755.0)]
    md = verdict.markdown(analysis.load_run(write_run(tmp_path / "run", rows)), None)
    assert (
        "**Clocks**: the 2 measured cases ran at SM clocks of 1755–1980 MHz" in md
        and "none ran throttled" in md
    )
    assert "A at 1980 MHz, B at 1755 MHz, 12.8% apart against a 20.0% margin" not in md  # 20% > 12.8%: a win
    assert "ran up to 12.8% apart (fwd · d=64 · non-causal: A at a higher clock, 1980 vs 1755 MHz)" in md
    assert "compare like with like" not in md  # the sentence that was written in, not computed


@needs_plotly
def test_a_measured_roof_quotes_its_own_dtypes_clock() -> None:
    from flashbench.report import roofline_figure

    run = analysis.load_run(H100_SPEED)
    details = run.env.calibration["details"]["matmul"]
    bf16, fp8 = details["bf16"]["sm_clock_mhz"], details["fp8"]["sm_clock_mhz"]
    assert bf16 != fp8  # the committed calibration: bf16 at 1380 MHz, fp8 at 1215 MHz
    fig = roofline_figure.roofline(run, "bf16")
    (label,) = [t.name for t in fig.data if t.name and t.name.startswith("measured (")]
    assert f"bf16 matmul at {bf16:.0f} MHz" in label and f"{fp8:.0f} MHz" not in label


@needs_plotly
def test_each_calibration_figure_is_judged_by_its_own_measurement() -> None:
    """The committed calibration: every matmul power-capped, the copy and the read at full clock. The summary calls
    only the matmul figures no ceiling, and the roofline draws only the measured compute roof in red."""
    from flashbench.report import roofline_figure
    from flashbench.report.roofline_figure import THROTTLED_ROOF

    run = analysis.load_run(H100_SPEED)
    details = run.env.calibration["details"]
    copy, read = details["copy"], details["read"]
    assert (
        copy["throttle_reasons"] == [] == read["throttle_reasons"]
        and details["matmul"]["bf16"]["throttle_reasons"]
    )
    md = verdict.markdown(run, None)
    assert (
        f"{run.ceilings[-1].peak('bf16') / 1e12:.0f} TFLOP/s bf16 are what a throttled GPU did, not ceilings"
        in md
    )
    assert (
        f"{copy['gb_s']:.0f} GB/s copy at {copy['sm_clock_mhz']:.0f} MHz, {read['gb_s']:.0f} GB/s read at "
        f"{read['sm_clock_mhz']:.0f} MHz ran unthrottled and stand"
    ) in md
    fig = roofline_figure.roofline(run, "bf16")
    colours = {t.name: t.line.color for t in fig.data if t.mode == "lines"}
    assert colours["HBM 3.00 TB/s (measured)"] != THROTTLED_ROOF
    (peak,) = [c for n, c in colours.items() if n.startswith("measured (")]
    assert peak == THROTTLED_ROOF

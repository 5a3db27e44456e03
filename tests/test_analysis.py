"""analysis.py: tidy frames from rows + models (speeds, speedups, roofline, recompute, comparisons)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from flashbench.analysis import comparison, summary
from flashbench.analysis import runs as analysis
from flashbench.errors import FlashbenchError
from flashbench.results.env import Environment, write_env
from flashbench.results.rows import Row, append_row
from flashbench.spec.cases import Case

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SYNTHETIC = FIXTURES / "synthetic-h100"
GPU = "NVIDIA H100 80GB HBM3"


def make_run(run_dir: Path, rows: list[Row], gpu: str = GPU) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_env(run_dir, Environment(gpu=gpu or ""))
    for row in rows:
        append_row(run_dir, row)
    return run_dir


def ok_row(provider: str, n: int, ms: float, mode: str = "fwd", device: str = "cuda", **kw: object) -> Row:
    case = Case(provider, 1, 4, 4, n, n, 64, "fp16", False, mode)
    return Row.for_case(
        case,
        "ok",
        device=device,
        gpu=GPU if device == "cuda" else "",
        samples_ms=[ms] * 10,
        median_ms=ms,
        p20_ms=ms,
        p80_ms=ms,
        **kw,
    )


def test_failed_rows_never_carry_a_speed() -> None:
    frame = analysis.load_run(SYNTHETIC).frame
    failed = frame[frame["status"] != "ok"]
    assert len(failed) > 0
    assert failed["tflops"].isna().all() and failed["median_ms"].isna().all()
    assert not failed["ok"].any()


def test_speedup_is_baseline_time_over_provider_time_on_the_same_shape(tmp_path: Path) -> None:
    run = make_run(
        tmp_path / "r",
        [ok_row("naive", 256, 4.0), ok_row("triton", 256, 1.0), ok_row("triton", 512, 1.0)],
    )
    frame = analysis.load_run(run).frame
    sp = summary.speedups(frame, "naive")
    tri = sp[sp["provider"] == "triton"]
    assert list(tri["seq_q"]) == [256]  # N=512 has no naive row to compare with
    assert tri["speedup"].iloc[0] == pytest.approx(4.0)


def test_tflops_derived_from_flops_and_median_when_the_row_lacks_it(tmp_path: Path) -> None:
    frame = analysis.load_run(make_run(tmp_path / "r", [ok_row("triton", 1024, 2.0)])).frame
    flops = 4 * 1 * 4 * 64 * 1024 * 1024  # 4 B H d N^2, full mask
    assert frame["flops"].iloc[0] == flops
    assert frame["tflops"].iloc[0] == pytest.approx(flops / 2e-3 / 1e12)


def test_pick_baseline_defaults_to_naive_and_rejects_unknown_with_a_suggestion(tmp_path: Path) -> None:
    frame = analysis.load_run(
        make_run(tmp_path / "r", [ok_row("triton", 256, 1.0), ok_row("naive", 256, 2.0)])
    ).frame
    assert analysis.pick_baseline(frame) == "naive"
    with pytest.raises(FlashbenchError, match="did you mean triton"):
        analysis.pick_baseline(frame, "trtion")


def test_recompute_overhead_pairs_the_stored_p_variant_with_its_recompute_kernel(tmp_path: Path) -> None:
    rows = [
        ok_row("triton", 256, 3.0, mode="bwd", peak_mem_bytes=1_000),
        ok_row("triton-stored-p", 256, 2.0, mode="bwd", peak_mem_bytes=5_000),
        ok_row("triton", 256, 1.0, mode="fwd"),  # forward-only rows have no recompute to measure
        ok_row("triton-stored-p", 256, 1.0, mode="fwd"),
    ]
    rc = analysis.recompute_overhead(analysis.load_run(make_run(tmp_path / "r", rows)).frame)
    assert len(rc) == 1
    r = rc.iloc[0]
    assert r["time_overhead"] == pytest.approx(0.5)  # 3 ms vs 2 ms: recomputing costs 50% here
    assert r["mem_saved_bytes"] == 4_000


def test_recompute_overhead_is_the_backward_alone_with_its_flops_stated(tmp_path: Path) -> None:
    # fwd+bwd rows time each kernel's own forward too (the stored-P forward does one more Q K^T): not used.
    rows = [
        ok_row("triton", 256, 1.4, mode="bwd"),
        ok_row("triton-stored-p", 256, 1.0, mode="bwd"),
        ok_row("triton", 256, 2.0, mode="fwd+bwd"),
        ok_row("triton-stored-p", 256, 2.6, mode="fwd+bwd"),
    ]
    rc = analysis.recompute_overhead(analysis.load_run(make_run(tmp_path / "r", rows)).frame)
    assert list(rc["mode"]) == ["bwd"] and rc["time_overhead"].iloc[0] == pytest.approx(0.4)
    fwd = 4 * 1 * 4 * 64 * 256 * 256  # one forward of the shape (ok_row: B 1, H 4, d 64, N 256)
    r = rc.iloc[0]
    assert (r["credited_flops_recompute"], r["credited_flops_stored"]) == (2.5 * fwd, 2.0 * fwd)
    assert (r["executed_flops_recompute"], r["executed_flops_stored"]) == (3.5 * fwd, 2.5 * fwd)
    refs = {round(ref.value, 6): ref.label for ref in analysis.recompute_references()}
    assert set(refs) == {
        0.25,
        0.4,
        0.0,
    }  # what the axis (recompute / stored-P - 1) compares with; not 0.5 / 2.5
    assert "credited" in refs[0.25] and "2.5" in refs[0.25] and "2.0" in refs[0.25]
    assert "executed" in refs[0.4] and "two-pass" in refs[0.4] and "7" in refs[0.4] and "5" in refs[0.4]
    assert "executed" in refs[0.0] and "one-pass" in refs[0.0]
    assert analysis.RECOMPUTE_OVERHEAD.startswith("recompute overhead = ")


def test_a_one_pass_recompute_backward_executes_what_the_stored_p_one_does(tmp_path: Path) -> None:
    """The one-pass backward (its row's kernel_config: dQ from the dK/dV kernel) runs 5 block matmuls, as the
    stored-P passes do: its executed FLOPs are 2.5x a forward, not the two passes' 3.5x."""
    one_pass = {
        "bwd": {"dkdv": {"kernel": "gluon-ws", "ONE_PASS": 1}, "dq": {"kernel": "gluon-ws", "ONE_PASS": 1}}
    }
    two_pass = {"bwd": {"dkdv": {"kernel": "gluon-ws", "ONE_PASS": 0}, "dq": {"BLOCK_M": 128, "BLOCK_N": 64}}}
    for config, executed in ((one_pass, 2.5), (two_pass, 3.5)):
        rows = [
            ok_row("triton", 256, 1.1, mode="bwd", kernel_config=config),
            ok_row("triton-stored-p", 256, 1.0, mode="bwd"),
        ]
        run = make_run(tmp_path / str(executed), rows)
        r = analysis.recompute_overhead(analysis.load_run(run).frame).iloc[0]
        fwd = 4 * 1 * 4 * 64 * 256 * 256
        assert (r["executed_flops_recompute"], r["executed_flops_stored"]) == (executed * fwd, 2.5 * fwd)


def test_compare_runs_ratio_and_newly_failing_cases(tmp_path: Path) -> None:
    base = make_run(tmp_path / "base", [ok_row("triton", 256, 1.0), ok_row("triton", 512, 2.0)])
    oom = Row.for_case(Case("triton", 1, 4, 4, 512, 512, 64, "fp16", False, "fwd"), "oom", reason="OOM")
    cur = make_run(tmp_path / "cur", [ok_row("triton", 256, 1.25), oom])
    joined = comparison.compare_runs(analysis.load_run(cur).frame, analysis.load_run(base).frame)
    by_n = joined.set_index("seq_q")
    assert by_n.loc[256, "ratio"] == pytest.approx(1.25)
    assert by_n.loc[512, "change"] == "newly failing" and math.isnan(by_n.loc[512, "ratio"])
    summary = comparison.compare_summary(joined).iloc[0]
    assert summary["median_ratio"] == pytest.approx(1.25) and summary["newly_failing"] == 1


def test_roofline_columns_from_the_gpu_table_and_models() -> None:
    run = analysis.load_run(SYNTHETIC)
    assert [c.source for c in run.ceilings][:2] == ["datasheet", "nvml"]
    ok = run.frame[run.frame["ok"]]
    assert ok["pct_of_roofline"].between(0, 100).all()
    assert (
        ok["ai_no_l2"] <= ok["ai_compulsory"] * (1 + 1e-9)
    ).all()  # no model moves fewer bytes than the floor
    assert set(ok["bound"]) <= {"memory-bound", "compute-bound"}


def test_bound_and_pct_of_roofline_follow_the_one_roof_per_case() -> None:
    # ROOF_RULE: at the case's compulsory intensity, under the first ceiling and the case's tensor-core peak.
    ok = analysis.load_run(SYNTHETIC).frame.query("ok")
    assert len(ok) > 10
    compute = ok["ai_compulsory"] >= ok["ridge_ai"]
    assert (ok["bound"] == compute.map({True: "compute-bound", False: "memory-bound"})).all()
    attainable = (ok["ai_compulsory"] * ok["bw_bytes_s"] / 1e12).clip(upper=ok["peak_tflops"])
    assert ok["attainable_tflops"].to_numpy() == pytest.approx(attainable.to_numpy())
    assert ok["pct_of_roofline"].to_numpy() == pytest.approx((100 * ok["tflops"] / attainable).to_numpy())
    # one roof per case: every provider of a shape is held to the same attainable TFLOP/s and bound
    per_shape = ok.groupby("shape_key")[["attainable_tflops", "peak_tflops"]].nunique()
    assert (per_shape == 1).all().all()
    assert (ok.groupby("shape_key")["bound"].nunique() == 1).all()
    # sdpa-math computes in fp32, but its case is held to the bf16 tensor-core peak like every other provider
    math_rows = ok[ok["provider"] == "sdpa-math"]
    assert len(math_rows) and (math_rows["peak_tflops"] == ok["peak_tflops"].max()).all()


def test_each_providers_own_traffic_roof_is_kept_apart() -> None:
    # models.roofline.BOUND_RULE, at the family's own intensity with L2 reuse: the hover's "what this
    # implementation's own traffic allows", never the headline.
    ok = analysis.load_run(SYNTHETIC).frame.query("ok")
    own = (ok["ai_provider"] * ok["bw_bytes_s"] / 1e12).clip(upper=ok["own_peak_tflops"])
    assert ok["attainable_own_tflops"].to_numpy() == pytest.approx(own.to_numpy())
    assert ok["pct_of_own_roofline"].to_numpy() == pytest.approx((100 * ok["tflops"] / own).to_numpy())
    # moving extra bytes lowers the one roof's %, never raises it: naive's own roof is far lower than the case's
    naive = ok[ok["family"] == "naive"]
    assert (naive["own_bound"] == "memory-bound").all()
    assert (naive["pct_of_roofline"] < naive["pct_of_own_roofline"]).all()
    assert (ok["pct_of_roofline"] <= ok["pct_of_own_roofline"] * (1 + 1e-9)).all()
    long_flash = ok[(ok["family"] == "flash") & (ok["seq_q"] >= 4096)]
    assert (
        len(long_flash) and (long_flash["own_bound"] == "compute-bound").all()
    )  # the L2 serves K/V re-reads


def test_a_time_faster_than_the_roofline_allows_is_flagged_not_reported() -> None:
    frame = analysis.load_run(SYNTHETIC).frame
    flagged = frame[frame["above_roofline"]]
    assert len(flagged) == 1  # the synthetic fixture plants one impossible time
    assert flagged["tflops"].isna().all() and not flagged["ok"].any()
    assert "faster than the roofline allows" in flagged["roofline_error"].iloc[0]
    fails = analysis.failures(frame)
    assert (fails["status"] == "ok, above roofline").sum() == 1


def test_cpu_rows_are_labelled_cpu_time_and_get_no_gpu_roofline(tmp_path: Path) -> None:
    run = analysis.load_run(make_run(tmp_path / "r", [ok_row("naive", 32, 0.5, device="cpu")], gpu=""))
    assert run.is_cpu and run.ceilings == []
    assert list(run.frame["time_label"]) == ["CPU time"]
    assert run.frame["pct_of_roofline"].isna().all()
    assert run.frame["tflops"].notna().all()  # CPU speeds exist, labelled as CPU


def test_empty_rows_file_is_a_one_line_error(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [])
    (run / "rows.jsonl").write_text("")
    with pytest.raises(FlashbenchError, match="no rows"):
        analysis.load_run(run)


def test_runs_of_two_gpu_models_compare_each_against_its_own_roofline(tmp_path: Path) -> None:
    """Same cases on an H100 and an A100 (made-up times): each side's % of roofline uses its own GPU."""
    a = make_run(tmp_path / "h100", [ok_row("naive", 4096, 2.0)])
    b = make_run(tmp_path / "a100", [ok_row("naive", 4096, 3.0)], gpu="NVIDIA A100-SXM4-80GB")
    h100, a100 = analysis.load_run(a), analysis.load_run(b)
    assert not comparison.same_gpu(h100, a100) and comparison.same_gpu(h100, analysis.load_run(a))
    assert "different GPUs: ratios compare machines, not code" in comparison.cross_gpu_note(h100, a100)
    assert comparison.cross_gpu_note(h100, analysis.load_run(a)) == ""
    joined = comparison.compare_runs(h100.frame, a100.frame)
    row = joined.iloc[0]
    assert math.isclose(row["ratio"], 2.0 / 3.0)
    assert row["pct_of_roofline"] == h100.frame["pct_of_roofline"].iloc[0]
    assert row["pct_of_roofline_baseline"] == a100.frame["pct_of_roofline"].iloc[0]
    assert h100.frame["peak_tflops"].iloc[0] != a100.frame["peak_tflops"].iloc[0]  # two different roofs
    summary = comparison.compare_summary(joined, roofline=True)
    assert math.isclose(summary["median_pct_of_roofline"].iloc[0], row["pct_of_roofline"])
    table = comparison.side_by_side(joined, "H100", "A100")
    assert {"H100 ms", "H100 % of roofline", "A100 TFLOP/s", "A100 % of roofline", "ratio"} <= set(table)

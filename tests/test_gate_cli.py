"""`flashbench gate` and `flashbench baseline save` end to end, through main() as a user runs them.

Fixtures: tests/fixtures/gate-synthetic-aa{1,2}/ are SYNTHETIC runs of the ci preset's shape (two "same code"
runs with 1-2% drift), made by `python tests/test_gate_cli.py` below. The real A/A pairs from two H100 runs
(tests/fixtures/aa-run1/, aa-run2/, aa-*.json) are picked up automatically when they exist, and the injected
slowdowns are derived from a real run when there is one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from flashbench.cli.app import main
from flashbench.results.env import ENV_FILE, Environment, write_env
from flashbench.results.rows import ROWS_FILE, Row, append_row, read_rows

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
SYNTH = [FIXTURES / "gate-synthetic-aa1", FIXTURES / "gate-synthetic-aa2"]
REAL_RUNS = sorted(p for p in FIXTURES.glob("aa-run*") if (p / ROWS_FILE).is_file())
REAL_BASELINES = sorted(FIXTURES.glob("aa-*.json"))


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def gate(
    capsys: pytest.CaptureFixture[str], baseline: Path, current: Path, *extra: str
) -> tuple[int, str, str]:
    rc = main(["gate", "--baseline", str(baseline), "--current", str(current), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def derive_run(src: Path, dst: Path, change) -> Path:
    """Copy a run, passing each row through change(row) -> Row | None (None drops the row)."""
    dst.mkdir(parents=True)
    shutil.copy(src / ENV_FILE, dst / ENV_FILE)
    for row in read_rows(src):
        new = change(row)
        if new is not None:
            append_row(dst, new)
    return dst


def scaled(row: Row, factor: float) -> Row:
    samples = [s * factor for s in row.samples_ms]
    q = np.percentile(samples, [20, 50, 80]) if samples else [None] * 3
    return Row.from_dict(
        {**row.to_dict(), "samples_ms": samples, "p20_ms": q[0], "median_ms": q[1], "p80_ms": q[2]}
    )


def slow_provider(provider: str, factor: float):
    return lambda row: scaled(row, factor) if row.provider == provider and row.status == "ok" else row


def _source_pair() -> tuple[Path, Path]:
    """(baseline run, run to inject into): the real A/A runs when the lead has committed them."""
    return (REAL_RUNS[0], REAL_RUNS[1]) if len(REAL_RUNS) >= 2 else (SYNTH[0], SYNTH[1])


# ---------------------------------------------------------------------------------------------- A/A
AA_PAIRS = [(a, b) for a, b in combinations(REAL_RUNS, 2)] + [
    (j, r) for j in REAL_BASELINES for r in REAL_RUNS
]


@pytest.mark.parametrize("pair", [SYNTH, *AA_PAIRS], ids=lambda p: f"{p[0].name}-vs-{p[1].name}")
def test_aa_runs_of_the_same_code_pass(capsys, pair):
    rc, out, err = gate(capsys, pair[0], pair[1], "--format", "json")
    result = json.loads(out)
    assert rc == 0, result["headline"]
    assert result["passed"] and not err
    rc, _, _ = gate(capsys, pair[1], pair[0])  # and in the other direction
    assert rc == 0


# ---------------------------------------------------------------------------------------------- regressions
def test_provider_slowed_by_ten_percent_fails_with_exit_1(capsys, tmp_path):
    base, src = _source_pair()
    slow = derive_run(src, tmp_path / "slow", slow_provider("triton", 1.10))
    rc, out, _ = gate(capsys, base, slow, "--format", "json")
    result = json.loads(out)
    assert rc == 1 and not result["passed"]
    regressed = {c["key"] for c in result["cases"] if c["verdict"] == "regression"}
    triton_ok = {
        c["key"] for c in result["cases"] if c["key"].startswith("triton|") and c["baseline_status"] == "ok"
    }
    assert regressed <= triton_ok  # nothing but triton
    assert len(regressed) >= 0.9 * len(triton_ok)  # and (nearly) all of it, whatever the A/A drift was
    flagged = [r for r in result["ratios"] if r["verdict"] == "regression"]
    assert len(flagged) >= 0.9 * len(result["ratios"])  # triton / sdpa-flash moved too


def test_kernel_forced_to_a_worse_config_fails_on_that_case(capsys, tmp_path):
    base, src = _source_pair()
    target = max(
        (r for r in read_rows(src) if r.provider == "triton" and r.status == "ok"), key=lambda r: r.seq_q
    )

    def worse(row: Row) -> Row:
        if row.key != target.key:
            return row
        new = scaled(row, 1.35)  # small tiles, few warps: the slowdown such a config costs at long N
        new.kernel_config = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}
        return new

    rc, out, _ = gate(capsys, base, derive_run(src, tmp_path / "worse", worse), "--format", "json")
    result = json.loads(out)
    assert rc == 1
    assert [c["key"] for c in result["cases"] if c["verdict"] == "regression"] == [target.key]


@pytest.mark.skipif(not (FIXTURES / "aa-worse" / ROWS_FILE).is_file(), reason="no real worse-config run")
def test_real_run_with_triton_forced_to_a_worse_config_fails(capsys):
    """tests/fixtures/aa-worse: the ci preset on the same H200 right after aa-run1/2, with
    FLASHBENCH_TRITON_CONFIG forcing 64x32 tiles, 4 warps, 2 stages on the bundled forward."""
    for base in REAL_RUNS:
        rc, out, _ = gate(capsys, base, FIXTURES / "aa-worse", "--format", "json")
        result = json.loads(out)
        assert rc == 1
        regressed = {c["key"] for c in result["cases"] if c["verdict"] == "regression"}
        # Only the bundled kernel's forward config was forced: every regressed case is triton's.
        assert regressed and all(k.startswith("triton|") for k in regressed)
        assert any(r["verdict"] == "regression" for r in result["ratios"])


def test_whole_machine_slower_fails_absolute_but_in_run_ratio_holds(capsys, tmp_path):
    base, src = _source_pair()
    drift = derive_run(src, tmp_path / "drift", lambda r: scaled(r, 1.08) if r.status == "ok" else r)
    rc, out, _ = gate(capsys, base, drift, "--format", "json")
    result = json.loads(out)
    assert rc == 1  # the absolute gate sees 8% on everything
    assert result["ratios"] and not any(r["verdict"] == "regression" for r in result["ratios"])
    assert any("machine drift?" in c["note"] for c in result["cases"])
    cfg = tmp_path / "ratios-only.toml"
    cfg.write_text("[gate]\nabsolute = false\n")
    rc, _, _ = gate(capsys, base, drift, "--config", str(cfg))
    assert rc == 0  # with the absolute gate off, only the drift-proof ratio gates


def test_a_slowdown_the_lower_sm_clock_explains_passes_and_every_case_names_the_clocks(capsys, tmp_path):
    # The same kernels at 1845 instead of 1980 MHz take 1980/1845 = 1.073x as long: slower in time, the same in
    # cycles, so not a regression (gate_rule.py: the machine's state). Every compared case's note gives both clocks
    # and the change in cycles; the bundled kernel 10% slower on top of the clock is slower in both and fails.
    _, src = SYNTH

    def clocked(mhz: float):
        return lambda row: (
            Row.from_dict({**row.to_dict(), "sm_clock_mhz": mhz}) if row.status == "ok" else row
        )

    high = derive_run(src, tmp_path / "high", clocked(1980.0))
    low = derive_run(high, tmp_path / "low", lambda r: clocked(1845.0)(scaled(r, 1980 / 1845)))
    rc, out, _ = gate(capsys, high, low, "--format", "json")
    cases = [c for c in json.loads(out)["cases"] if c["ratio"] is not None]
    assert rc == 0 and not any(c["verdict"] == "regression" for c in cases)
    assert all("SM clock 1980 -> 1845 MHz (-6.8%)" in c["note"] and " in cycles" in c["note"] for c in cases)
    assert all(c["ratio"] > 1.05 and abs(c["cycles_ratio"] - 1.0) < 0.03 for c in cases)
    triton = [c for c in cases if c["key"].startswith("triton|")]
    assert main(["baseline", "save", str(high), "--name", "high", "--out-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    slower = derive_run(low, tmp_path / "slower", slow_provider("triton", 1.10))
    rc, out, _ = gate(capsys, high, slower, "--format", "json")
    regressed = {c["key"] for c in json.loads(out)["cases"] if c["verdict"] == "regression"}
    assert rc == 1 and regressed == {c["key"] for c in triton}
    # A saved baseline keeps the clock:
    rc, out, _ = gate(capsys, tmp_path / "high.json", slower, "--format", "json")
    assert {c["key"] for c in json.loads(out)["cases"] if c["verdict"] == "regression"} == regressed
    rc, out, _ = gate(
        capsys, high, derive_run(high, tmp_path / "same", slow_provider("triton", 1.10)), "--format", "json"
    )
    assert rc == 1 and not any("SM clock" in c["note"] for c in json.loads(out)["cases"])


def test_case_that_was_ok_and_now_fails_fails_the_gate(capsys, tmp_path):
    base, src = _source_pair()
    victim = next(r for r in read_rows(src) if r.status == "ok")

    def broken(row: Row) -> Row:
        if row.key != victim.key:
            return row
        return Row.for_case(row.case, "wrong", reason="rel_err 0.31 > budget 0.004", gpu=row.gpu)

    rc, out, _ = gate(capsys, base, derive_run(src, tmp_path / "broken", broken), "--format", "md")
    assert rc == 1
    assert "### Newly failing (1)" in out and "rel_err 0.31 > budget 0.004" in out


def test_improvements_and_one_sided_cases_are_reported_and_pass(capsys, tmp_path):
    base, src = _source_pair()
    rows = read_rows(src)
    # A provider outside the in-run ratio pairs (speeding up sdpa-flash would make triton / sdpa-flash regress).
    others = sorted({r.provider for r in rows if r.status == "ok"} - {"triton", "sdpa-flash"})
    if not others:
        pytest.skip("the run has no ok provider besides triton and sdpa-flash")
    dropped = next(r for r in rows if r.provider == "sdpa-flash")
    faster = derive_run(
        src,
        tmp_path / "faster",
        lambda r: None if r.key == dropped.key else slow_provider(others[0], 0.85)(r),
    )
    rc, out, _ = gate(capsys, base, faster, "--format", "json", "--allow-missing")
    result = json.loads(out)
    assert rc == 0
    improved = {c["key"] for c in result["cases"] if c["verdict"] == "improvement"}
    assert improved and all(k.startswith(f"{others[0]}|") for k in improved)
    assert [c["key"] for c in result["cases"] if c["verdict"] == "missing"] == [dropped.key]
    _, md, _ = gate(capsys, base, faster, "--format", "md", "--allow-missing")
    assert "### Improvements" in md and "### Missing from the current run (1)" in md


# ---------------------------------------------------------------------------------------------- missing cases
def test_gate_fails_when_baseline_cases_are_missing_from_the_current_run(capsys, tmp_path):
    base, src = SYNTH
    keys = [r.key for r in read_rows(base)]
    kept = keys[0]
    truncated = derive_run(src, tmp_path / "crashed", lambda r: r if r.key == kept else None)
    rc, out, err = gate(capsys, base, truncated)
    assert rc == 1 and not err
    lost = len(keys) - 1
    assert "FAIL: 1 case compared" in out and f"{lost} baseline cases missing from the current run" in out
    assert show(sorted(keys)[1]) in out  # the first few missing keys are named
    result = json.loads(gate(capsys, base, truncated, "--format", "json")[1])
    assert not result["passed"] and len(result["missing"]) == lost and kept not in result["missing"]
    # Deliberately fewer cases (a shard, a narrower sweep): --allow-missing, and the report still says so.
    rc, md, _ = gate(capsys, base, truncated, "--format", "md", "--allow-missing")
    assert rc == 0 and f"### Missing from the current run ({lost})" in md and "--allow-missing" in md
    # one case lost reads as one case
    one_lost = derive_run(src, tmp_path / "one-lost", lambda r: None if r.key == kept else r)
    assert "; 1 baseline case missing from the current run" in gate(capsys, base, one_lost)[1]


def test_torn_last_row_is_a_one_line_warning_and_counts_as_missing(capsys, tmp_path):
    base, src = SYNTH
    run = derive_run(src, tmp_path / "killed", lambda r: r)
    rows_file = run / ROWS_FILE
    lines = rows_file.read_text().splitlines(keepends=True)
    torn_key = read_rows(run)[-1].key
    rows_file.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    rc, out, err = gate(capsys, base, run, "--format", "json")
    assert rc == 1
    assert err.count("\n") == 1 and err.startswith("flashbench: warning: ") and "half-written" in err
    assert show(torn_key) in err  # the torn row's case, recovered from what was written
    assert json.loads(out)["missing"] == [torn_key]


def show(key: str) -> str:
    return key.replace("|", " ")


# ---------------------------------------------------------------------------------------------- environment
def _with_env(src: Path, dst: Path, **changes) -> Path:
    def relabel(row: Row) -> Row:
        return Row.from_dict({**row.to_dict(), "gpu": changes.get("gpu", row.gpu)})

    derive_run(src, dst, relabel)
    env = json.loads((src / ENV_FILE).read_text())
    env.update({k: v for k, v in changes.items() if k != "gpu"})
    if "gpu" in changes:
        env["gpu"] = (
            {**env.get("gpu", {}), "name": changes["gpu"]}
            if isinstance(env.get("gpu"), dict)
            else changes["gpu"]
        )
    (dst / ENV_FILE).write_text(json.dumps(env))
    return dst


def test_another_gpu_model_exits_2_unless_allowed(capsys, tmp_path):
    base, src = SYNTH
    other = _with_env(src, tmp_path / "a100", gpu="NVIDIA A100-SXM4-80GB")
    rc, out, err = gate(capsys, base, other)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "mismatch" in err and "A100" in err and "Traceback" not in err
    rc, out, _ = gate(capsys, base, other, "--allow-mismatch", "--format", "md")
    assert rc == 0 and "allowed by --allow-mismatch" in out


def test_version_differences_are_shown_not_refused(capsys, tmp_path):
    base, src = SYNTH
    newer = _with_env(src, tmp_path / "newer", torch="2.12.0+cu128", driver="570.86.15")
    rc, out, _ = gate(capsys, base, newer, "--format", "md")
    assert rc == 0
    assert "| torch | 2.11.0+cu128 | **2.12.0+cu128** (differs) |" in out
    assert "**570.86.15** (differs)" in out


def test_a_change_of_l2_flush_between_runs_is_named_in_the_gate_notes(capsys, tmp_path):
    base, src = SYNTH
    spec = json.loads((src / ENV_FILE).read_text()).get("spec") or {}
    wrote = _with_env(src, tmp_path / "wrote", spec={k: v for k, v in spec.items() if k != "l2_flush"})
    read = _with_env(src, tmp_path / "read", spec={**spec, "l2_flush": "read"})
    rc, out, _ = gate(capsys, wrote, read, "--format", "md")
    assert rc == 0
    assert "| l2_flush | write | **read** (differs) |" in out
    assert "The L2 flush differs (baseline write, current read)" in out
    rc, out, _ = gate(capsys, read, read, "--format", "md")
    assert "The L2 flush differs" not in out and "| l2_flush | read | read |" in out


def test_env_summary_reads_the_sweep_environment_record():
    from flashbench.gpu.environment import collect
    from flashbench.results.baseline import summarize_env

    facts = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu128", "cuda": "12.8", "cudnn": 91002}
    env = replace(collect("cuda", worker_facts={**facts, "triton": "3.6.0"}), preset="ci", driver="550.54.15")
    summary = summarize_env(env, [])
    assert summary["gpu"] == "NVIDIA H100 80GB HBM3" and summary["device"] == "cuda"
    assert (summary["torch"], summary["cuda"], summary["cudnn"], summary["triton"]) == (
        "2.11.0+cu128",
        "12.8",
        "91002",
        "3.6.0",
    )
    assert (summary["driver"], summary["preset"], summary["flashbench"]) == ("550.54.15", "ci", "0.1.0")


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "content",
    [
        '{"format": "flashbench-baseline", "schema": 1, "env": {}, "cases": {"x": {"status": "fine"}}',
        "[1, 2",
        "{}",
    ],
    ids=["truncated", "not-json", "not-a-baseline"],
)
def test_corrupt_baseline_exits_2_with_one_line(capsys, tmp_path, content):
    bad = tmp_path / "h100.json"
    bad.write_text(content)
    rc, out, err = gate(capsys, bad, SYNTH[1])
    assert rc == 2 and out == ""
    assert err.startswith("flashbench: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_missing_baseline_or_run_exits_2_with_one_line(capsys, tmp_path):
    for base, cur in [(tmp_path / "nope.json", SYNTH[1]), (SYNTH[0], tmp_path / "no-run")]:
        rc, out, err = gate(capsys, base, cur)
        assert rc == 2 and out == "" and err.count("\n") == 1 and "not found" in err


def test_runs_with_nothing_in_common_exit_2(capsys, tmp_path):
    other = derive_run(SYNTH[1], tmp_path / "other", lambda r: Row.from_dict({**r.to_dict(), "batch": 99}))
    rc, _, err = gate(capsys, SYNTH[0], other)
    assert rc == 2 and "no case in common" in err


# ---------------------------------------------------------------------------------------------- outputs
def _golden_current(tmp_path: Path) -> Path:
    """aa2 with triton 10% slower, one case OOMing, sdpa-cudnn 15% faster: every section of the report."""
    victim = "sdpa-flash|b2|h16|kv16|q8192|k8192|d128|bf16|full|fwd+bwd"

    def change(row: Row) -> Row:
        if row.key == victim:
            return Row.for_case(row.case, "oom", reason="CUDA out of memory", gpu=row.gpu)
        return {"triton": lambda r: scaled(r, 1.10), "sdpa-cudnn": lambda r: scaled(r, 0.85)}.get(
            row.provider, lambda r: r
        )(row)

    return derive_run(SYNTH[1], tmp_path / "current", change)


def test_markdown_matches_golden_file(capsys, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    md_out = tmp_path / "gate.md"
    rc, out, _ = gate(capsys, SYNTH[0], _golden_current(tmp_path), "--format", "md", "--md-out", str(md_out))
    assert rc == 1
    golden = GOLDEN / "gate_regression.md"
    if os.environ.get("FLASHBENCH_UPDATE_GOLDEN"):  # after a deliberate format change: review the diff
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")
    assert md_out.read_text() == out and summary.read_text() == out


def test_table_output_names_the_verdicts(capsys, tmp_path):
    rc, out, _ = gate(capsys, SYNTH[0], _golden_current(tmp_path))
    assert rc == 1
    assert "regression" in out and "newly-failing" in out and "improvement" in out and "FAIL" in out


def test_threshold_flag_overrides_config(capsys, tmp_path):
    rc, _, _ = gate(capsys, SYNTH[0], _golden_current(tmp_path), "--threshold", "0.5")
    assert rc == 1  # the OOM still fails
    # --threshold is the slowdown to catch: a case fails beyond half of it (or its noise band), so 10% passes a
    # 25% gate (limit 12.5%) and fails a 5% one (limit 2.5%).
    slow = derive_run(SYNTH[1], tmp_path / "slow", slow_provider("triton", 1.10))
    assert gate(capsys, SYNTH[0], slow, "--threshold", "0.25")[0] == 0
    assert gate(capsys, SYNTH[0], slow, "--threshold", "0.05")[0] == 1


# ---------------------------------------------------------------------------------------------- baseline save
def test_baseline_save_round_trips(capsys, tmp_path):
    rc = main(["baseline", "save", str(SYNTH[0]), "--name", "h100", "--out-dir", str(tmp_path)])
    out, _ = capsys.readouterr()
    saved = tmp_path / "h100.json"
    assert rc == 0 and str(saved) in out
    doc = json.loads(saved.read_text())
    rows = read_rows(SYNTH[0])
    assert doc["env"]["gpu"] == rows[0].gpu and doc["env"]["preset"] == "ci"
    assert set(doc["cases"]) == {r.key for r in rows}
    row = rows[0]
    assert doc["cases"][row.key]["samples_ms"] == pytest.approx(row.samples_ms, abs=1e-6)
    assert saved.stat().st_size < 40_000  # small: what the gate needs
    # The saved file gates like the run it came from: identical verdicts against the same current run.
    current = _golden_current(tmp_path)
    # (Samples are stored to the nanosecond, so compare the rendered report, not the last float bits.)
    from_file = gate(capsys, saved, current, "--format", "md")[1]
    from_run = gate(capsys, SYNTH[0], current, "--format", "md")[1]
    assert from_file.replace("h100.json", SYNTH[0].name) == from_run
    # Saving again needs --force.
    assert main(["baseline", "save", str(SYNTH[0]), "--name", "h100", "--out-dir", str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err


def test_baseline_stores_long_sample_lists_as_quantiles_and_gates_the_same(capsys, tmp_path):
    rng = np.random.default_rng(5)

    def long(row: Row) -> Row | None:
        if row.provider == "sdpa-cudnn":
            return None  # fewer cases: a faster test
        samples = list(row.median_ms * np.exp(rng.normal(0.0, 0.02, 600)))
        return Row.from_dict({**row.to_dict(), "samples_ms": samples, "median_ms": float(np.median(samples))})

    run = derive_run(SYNTH[0], tmp_path / "long", long)
    assert main(["baseline", "save", str(run), "--name", "long", "--out-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "long.json").read_text())
    entry = next(iter(doc["cases"].values()))
    assert entry["n"] == 600 and len(entry["samples_ms"]) == 201
    assert entry["median_ms"] == pytest.approx(entry["samples_ms"][100], abs=1e-6)
    assert (tmp_path / "long.json").stat().st_size < 60_000
    slow = derive_run(run, tmp_path / "slow", slow_provider("triton", 1.10))
    from_run = json.loads(gate(capsys, run, slow, "--format", "json")[1])
    from_file = json.loads(gate(capsys, tmp_path / "long.json", slow, "--format", "json")[1])
    assert [c["verdict"] for c in from_file["cases"]] == [c["verdict"] for c in from_run["cases"]]
    for a, b in zip(from_file["cases"], from_run["cases"], strict=True):
        if a["ci_low"] is not None:  # same width of interval: the bootstrap draws n, not 201
            assert a["ci_high"] - a["ci_low"] == pytest.approx(b["ci_high"] - b["ci_low"], rel=0.3)


# ---------------------------------------------------------------------------------------------- fixtures
def make_synthetic_run(out: Path, seed: int) -> None:
    """A SYNTHETIC run shaped like the ci preset: bf16 d=128 N 1024..8192, three providers, fwd and fwd+bwd.

    Samples (10-200, as a 100 ms budget gives): median from a plausible H100 throughput, lognormal noise (1.5%), a
    per-run offset of N(0, 0.63%) (what same-code H100 speed runs showed: tests/test_gate_stats.py), a within-run
    clock drift (up to 1% end to end) and rare outliers (+10-40%). Not a measurement.
    """
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True)
    env = Environment(
        synthetic=True,
        note="generated by tests/test_gate_cli.py make_synthetic_run; not a measurement",
        flashbench="0.1.0",
        gpu="NVIDIA H100 80GB HBM3",
        driver="550.54.15",
        cuda="12.8",
        cudnn="91002",
        torch="2.11.0+cu128",
        triton="3.6.0",
        preset="ci",
    )
    write_env(out, env)
    run_offset = rng.normal(0.0, 0.0063)
    tflops = {"triton": 330.0, "sdpa-flash": 360.0, "sdpa-cudnn": 420.0}
    for provider in ("sdpa-cudnn", "sdpa-flash", "triton"):
        for mode in ("fwd", "fwd+bwd"):
            for n in (1024, 2048, 4096, 8192):
                batch = 16384 // n  # the sweep's tokens convention
                flops = 4 * batch * 16 * 128 * n * n * (3.5 if mode == "fwd+bwd" else 1.0)
                median = flops / (tflops[provider] * 1e12 * (0.8 if mode == "fwd+bwd" else 1.0)) * 1e3
                k = int(min(200, max(10, 100.0 / median)))  # a 100 ms budget, 10..200 samples
                drift = np.linspace(0.0, rng.uniform(-0.01, 0.01), k)
                x = median * np.exp(run_offset + drift + rng.normal(0.0, 0.015, k))
                x[rng.random(k) < 0.03] *= rng.uniform(1.1, 1.4)
                samples = [round(float(s), 6) for s in x]
                q = np.percentile(samples, [20, 50, 80])
                case = dict(
                    provider=provider, batch=batch, heads=16, kv_heads=16, seq_q=n, seq_k=n, head_dim=128
                )
                row = Row(
                    **case, dtype="bf16", causal=False, mode=mode, status="ok", gpu=env.gpu,
                    samples_ms=samples, p20_ms=float(q[0]), median_ms=float(q[1]), p80_ms=float(q[2]),
                    flops=flops, tflops=flops / (q[1] * 1e-3) / 1e12,
                )  # fmt: skip
                append_row(out, row)


if __name__ == "__main__":  # regenerate the synthetic fixtures
    for i, path in enumerate(SYNTH, start=1):
        shutil.rmtree(path, ignore_errors=True)
        make_synthetic_run(path, seed=100 + i)
        print("wrote", path)

"""The gate's per-case noise: "cannot judge", learned bands (`gate --learn`), the loop time, the code fingerprints,
and its table at 80 and 100 columns. Through main() as a user runs it, on the synthetic fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from report_helpers import needs_plotly
from test_gate_cli import SYNTH, derive_run, gate, scaled, slow_provider

from flashbench.cli.app import main
from flashbench.results.env import ENV_FILE
from flashbench.results.rows import Row, read_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def with_env(run: Path, **fields) -> Path:
    env = json.loads((run / ENV_FILE).read_text())
    (run / ENV_FILE).write_text(json.dumps({**env, **fields}))
    return run


def noisy(key: str, spread: float, seed: int = 0):
    """Rows unchanged except `key`, whose samples get lognormal noise of `spread`."""
    rng = np.random.default_rng(seed)

    def change(row: Row) -> Row:
        if row.key != key:
            return row
        samples = [s * float(np.exp(rng.normal(0.0, spread))) for s in row.samples_ms]
        return Row.from_dict({**row.to_dict(), "samples_ms": samples, "median_ms": float(np.median(samples))})

    return change


# ---------------------------------------------------------------------------------------------- cannot judge
def test_a_case_too_noisy_for_the_threshold_says_it_cannot_judge_instead_of_unchanged(capsys, tmp_path):
    base, src = SYNTH
    key = next(r.key for r in read_rows(src) if r.provider == "sdpa-flash")
    base = derive_run(base, tmp_path / "base", noisy(key, 0.08, seed=1))
    cur = derive_run(src, tmp_path / "cur", noisy(key, 0.08, seed=2))
    rc, out, _ = gate(capsys, base, cur, "--format", "json")
    result = json.loads(out)
    case = next(c for c in result["cases"] if c["key"] == key)
    assert rc == 0 and case["verdict"] == "cannot-judge" and case["label"] == "cannot judge at 5%"
    assert case["noise"] > 0.025 and case["threshold"] == case["noise"]  # its limit is its band
    assert "1 cannot judge at 5%" in result["headline"]
    _, md, _ = gate(capsys, base, cur, "--format", "md")
    assert "Cannot judge (1 cannot judge at 5%)" in md
    # At 20% its band is under half the threshold: judged, and unchanged.
    rc, out, _ = gate(capsys, base, cur, "--format", "json", "--threshold", "0.2")
    assert next(c for c in json.loads(out)["cases"] if c["key"] == key)["verdict"] == "unchanged"


# ---------------------------------------------------------------------------------------------- --learn
def test_learn_writes_bands_that_widen_a_case_the_runs_disagree_on(capsys, tmp_path):
    base, src = SYNTH
    victim = next(r.key for r in read_rows(src) if r.provider == "sdpa-cudnn")
    # A third same-code run in which one case came out 4% slower (another cuDNN plan, a warmer GPU): the learned
    # band of that case covers it, so a later run at +4% on it passes where the within-run band alone fails.
    third = derive_run(src, tmp_path / "third", lambda r: scaled(r, 1.04) if r.key == victim else r)
    learned = tmp_path / "h100.json"
    rc = main(["gate", "--learn", str(base), str(src), str(third), "--baseline", str(learned)])
    out = capsys.readouterr().out
    assert rc == 0 and f"wrote {learned}" in out and "noise bands from 3 runs for 24" in out
    doc = json.loads(learned.read_text())
    assert doc["learned_from"] == [base.name, src.name, "third"] and doc["source"] == base.name
    band = doc["cases"][victim]["band"]
    assert band > 0.04 and all(c["band_runs"] == 3 for c in doc["cases"].values())
    later = derive_run(src, tmp_path / "later", lambda r: scaled(r, 1.04) if r.key == victim else r)
    assert gate(capsys, base, later)[0] == 1  # the run directory as baseline: no learned band
    rc, out, _ = gate(capsys, learned, later, "--format", "json")
    result = json.loads(out)
    case = next(c for c in result["cases"] if c["key"] == victim)
    assert rc == 0 and case["noise_source"] == "history" and case["noise"] == pytest.approx(band, abs=1e-6)
    assert "Noise bands learned from 3 same-code runs for 24 of the baseline's cases." in result["notes"]


def test_learn_refuses_runs_of_different_code_one_run_and_an_existing_file(capsys, tmp_path):
    base, src = SYNTH
    one = with_env(derive_run(base, tmp_path / "one", lambda r: r), fingerprint="aaaa")
    other = with_env(derive_run(src, tmp_path / "other", lambda r: r), fingerprint="bbbb")
    out = tmp_path / "b.json"
    for argv, message in [
        ([str(one), str(other)], "ran other code than one (bbbb vs aaaa)"),
        ([str(one)], "needs at least two runs"),
    ]:
        assert main(["gate", "--learn", *argv, "--baseline", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert main(["gate", "--learn", str(base), str(src), "--baseline", str(out)]) == 0
    assert main(["gate", "--learn", str(base), str(src), "--baseline", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["gate", "--learn", str(base), str(src), "--baseline", str(out), "--force"]) == 0
    assert main(["gate", str(base), "--baseline", str(out), "--current", str(src)]) == 2
    assert "run directories are given with --learn" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- loop time
def with_loops(factor: float = 1.0, provider: str = "triton"):
    """Give every ok row eager-loop samples (5 loops at 1.1x its GPU time, 1% apart), `provider`'s x factor."""

    def change(row: Row) -> Row:
        if row.status != "ok":
            return row
        f = factor if row.provider == provider else 1.0
        loops = [row.median_ms * 1.1 * f * (1.0 + 0.01 * (i - 2) / 2) for i in range(5)]
        return Row.from_dict({**row.to_dict(), "loop_samples_ms": loops, "loop_ms": float(np.median(loops))})

    return change


def test_loop_time_that_regressed_fails_the_gate_while_gpu_time_stands_still(capsys, tmp_path):
    base, src = SYNTH
    before = derive_run(base, tmp_path / "before", with_loops())
    same = derive_run(src, tmp_path / "same", with_loops())
    assert gate(capsys, before, same)[0] == 0
    slower = derive_run(src, tmp_path / "slower", with_loops(1.15))
    rc, out, _ = gate(capsys, before, slower, "--format", "json")
    result = json.loads(out)
    looped = {c["key"] for c in result["cases"] if c["loop_verdict"] == "regression"}
    assert rc == 1 and looped and all(k.startswith("triton|") for k in looped)
    assert not any(c["verdict"] == "regression" for c in result["cases"])  # the GPU time did not move
    assert f"{len(looped)} loop time regressed" in result["headline"]
    _, md, _ = gate(capsys, before, slower, "--format", "md")
    assert f"### Loop time regressions ({len(looped)})" in md
    # A baseline saved from the run keeps the loop samples; a run without them (older) is not loop-gated.
    assert main(["baseline", "save", str(before), "--name", "b", "--out-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert gate(capsys, tmp_path / "b.json", slower)[0] == 1
    assert gate(capsys, base, slower)[0] == 0


def test_loop_time_slowed_by_a_lower_sm_clock_is_not_a_regression(capsys, tmp_path):
    """Every provider's loop 10% slower on a side whose SM clock ran 10% lower (a power-capped run): the GPU time
    and the loop time follow the clock alike, so neither is judged a regression; at the same clock it is one."""
    base, src = SYNTH

    def at(clock: float, factor: float):
        """Every ok row's loops (with_loops) x factor, its samples at `clock` MHz."""

        def change(row: Row) -> Row:
            row = with_loops()(row)
            if row.status != "ok":
                return row
            loops = [x * factor for x in row.loop_samples_ms]
            return Row.from_dict(
                {
                    **row.to_dict(),
                    "sm_clock_mhz": clock,
                    "loop_samples_ms": loops,
                    "loop_ms": float(np.median(loops)),
                }
            )

        return change

    before = derive_run(base, tmp_path / "before", at(1980.0, 1.0))
    capped = derive_run(src, tmp_path / "capped", at(1782.0, 1.10))
    rc, out, _ = gate(capsys, before, capped, "--format", "json")
    assert rc == 0, json.loads(out)["headline"]
    assert not any(c["loop_verdict"] == "regression" for c in json.loads(out)["cases"])
    same_clock = derive_run(src, tmp_path / "same-clock", at(1980.0, 1.10))
    rc, out, _ = gate(capsys, before, same_clock, "--format", "json")
    assert rc == 1 and any(c["loop_verdict"] == "regression" for c in json.loads(out)["cases"])


# ---------------------------------------------------------------------------------------------- fingerprints
def test_gate_shows_both_fingerprints_and_says_whether_the_code_is_the_same(capsys, tmp_path):
    base, src = SYNTH
    a = with_env(derive_run(base, tmp_path / "a", lambda r: r), fingerprint="1234abcd1234abcd")
    b = with_env(derive_run(src, tmp_path / "b", lambda r: r), fingerprint="1234abcd1234abcd")
    c = with_env(derive_run(src, tmp_path / "c", lambda r: r), fingerprint="ffffeeeeffffeeee")
    _, md, _ = gate(capsys, a, b, "--format", "md")
    assert "| code | 1234abcd1234abcd | 1234abcd1234abcd |" in md
    assert "Same code on both sides (fingerprint 1234abcd1234abcd)" in md
    _, md, _ = gate(capsys, a, c, "--format", "md")
    assert "**ffffeeeeffffeeee** (differs)" in md
    assert "Different code: fingerprint 1234abcd1234abcd (baseline) vs ffffeeeeffffeeee (current)." in md


# ---------------------------------------------------------------------------------------------- the table
@pytest.mark.parametrize("columns", [80, 100])
def test_table_fits_the_terminal_without_cutting_a_name_verdict_or_number(
    capsys, monkeypatch, tmp_path, columns
):
    monkeypatch.setenv("COLUMNS", str(columns))
    run = ROOT / "results" / "examples" / "h100-speed"
    slow = derive_run(run, tmp_path / "slow", slow_provider("triton", 1.10))
    rc, out, _ = gate(capsys, run, slow, "--threshold", "0.03")
    assert rc == 1
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns and "…" not in out
    # The case column holds the fields that vary, never the 62-character key; the shared ones head the table.
    assert "triton q1024 d128 causal fwd+bwd " in out and "every case: bf16" in out
    row = next(line for line in lines if line.lstrip().startswith("triton q1024 d128 causal fwd+bwd "))
    assert "regression" in row and "+10.0%" in row
    assert "80 cases not ok on either side, not listed (flash-attn, flash-attn-3)" in out


@needs_plotly
def test_report_comparison_says_which_code_each_side_ran(tmp_path):
    from flashbench.analysis.runs import load_run
    from flashbench.report import compare

    base, src = SYNTH
    a = with_env(derive_run(base, tmp_path / "a", lambda r: r), fingerprint="1234abcd1234abcd")
    b = with_env(derive_run(src, tmp_path / "b", lambda r: r), fingerprint="ffffeeeeffffeeee")
    body = compare.section(load_run(b), load_run(a), None)[3]
    assert "Different code: fingerprint 1234abcd1234abcd (baseline) vs ffffeeeeffffeeee (current)." in body
    same = with_env(derive_run(src, tmp_path / "same", lambda r: r), fingerprint="1234abcd1234abcd")
    body = compare.section(load_run(same), load_run(a), None)[3]
    assert "Same code on both sides (fingerprint 1234abcd1234abcd)" in body

"""The small things a new user trips over: a wrong --device for env, the roofline's words for a window and for
fp8's backward, the gate's threshold message, a closed output pipe, and counts of one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.errors import plural
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows

EXAMPLE = Path(__file__).resolve().parent.parent / "results" / "examples" / "h100-speed"


def test_counts_of_one_are_singular(capsys, tmp_path):
    assert [plural(1, "case"), plural(2, "case"), plural(0, "query", "queries")] == [
        "1 case",
        "2 cases",
        "0 queries",
    ]
    assert main(["memory", "--model", "llama-70b", "--seq", "1024", "--batch", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "KV cache for serving: 1 sequence x N tokens" in out
    args = ["sweep", "--device", "cpu", "--providers", "naive", "--seq", "16", "--batch", "1", "--heads", "1"]
    assert (
        main([*args, "--head-dim", "16", "--causal", "false", "--mode", "fwd", "--out", str(tmp_path / "r")])
        == 0
    )
    assert "\n1 case (1 ok) in " in capsys.readouterr().out


@pytest.mark.parametrize("command", [["env"], ["list", "providers"]])
def test_an_unknown_device_is_one_line_and_exit_2(capsys, command):
    assert main([*command, "--device", "tpu"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err == "flashbench: error: unknown device 'tpu'; did you mean 'cpu'?\n"
        and captured.out == ""
    )


def test_roofline_names_the_window_its_numbers_apply(capsys):
    assert main(["roofline", "--gpu", "h100", "--seq", "8192", "--window", "4096,0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sliding window 4096,0 (4096 keys back, none ahead)" in out and "non-causal" not in out


@pytest.mark.parametrize(("mode", "noted"), [("fwd+bwd", True), ("bwd", True), ("fwd", False)])
def test_roofline_says_fp8_is_forward_only(capsys, mode, noted):
    assert (
        main(["roofline", "--gpu", "h100", "--seq", "8192", "--dtype", "fp8", "--mode", mode, "--json"]) == 0
    )
    err = capsys.readouterr().err
    assert ("fp8 is forward only in every provider" in err) is noted


@pytest.mark.parametrize("value", ["-0.1", "0", "1.5"])
def test_gate_threshold_out_of_range_names_the_flag(capsys, value):
    run = str(EXAMPLE)
    assert main(["gate", "--baseline", run, "--current", run, "--threshold", value]) == 2
    assert capsys.readouterr().err == (
        f"flashbench: error: --threshold {float(value):g}: a slowdown threshold is a fraction in (0, 1), 0.05 = 5%\n"
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_report_of_an_example_run_is_not_a_change_to_the_repository():
    """`flashbench report results/examples/RUN` writes RUN/report.html: git ignores it."""
    root = EXAMPLE.parent.parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(
        ["git", "check-ignore", "-q", str(EXAMPLE / "report.html")],
        cwd=root,
        check=False,
        capture_output=True,
    )
    assert done.returncode == 0


def test_a_closed_pipe_does_not_stop_the_sweep(tmp_path):
    """`flashbench sweep ... 2>&1 | head -1`: the reader leaves after the first progress line; the sweep goes on,
    every row is written, and the exit code is the sweep's (it was 1 after a few rows, with no message)."""
    out = tmp_path / "run"
    args = [
        "--device",
        "cpu",
        "--providers",
        "naive,sdpa-math",
        "--seq",
        "16..128",
        "--batch",
        "1",
        "--heads",
        "2",
    ]
    args += ["--head-dim", "16", "--causal", "false", "--mode", "fwd", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashbench", "sweep", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    assert proc.stdout.readline()  # the first line of progress
    proc.stdout.close()  # as `head -1` does
    assert proc.wait(timeout=600) == 0
    rows = read_rows(out)
    assert len(rows) == 8 and all(r.status == "ok" for r in rows) and read_env(out).finished


def test_a_sweep_whose_stdout_closes_says_on_stderr_that_it_ran_to_its_end(tmp_path):
    out = tmp_path / "run"
    args = ["--device", "cpu", "--providers", "naive", "--seq", "16", "--batch", "1", "--heads", "2"]
    args += ["--head-dim", "16", "--causal", "false", "--mode", "fwd", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashbench", "sweep", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # nobody reads the table
    err = proc.stderr.read()
    assert proc.wait(timeout=600) == 0
    assert "flashbench: stdout closed early; the sweep ran to its end: 1 case (1 ok) in " in err
    assert f"; rows in {out}/rows.jsonl" in err and len(read_rows(out)) == 1

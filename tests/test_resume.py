"""`--resume` continues the run in --out and nothing else: another sweep, device or GPU model is refused with one
line naming what differs, a finished run is not rewritten, and --resume with --force is a usage error. Every
refusal leaves the run's files byte for byte as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows

EXAMPLE = Path(__file__).resolve().parent.parent / "results" / "examples" / "h100-speed"
TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
ONE = [*TINY, "--providers", "naive", "--causal", "false", "--mode", "fwd"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith("flashbench: error: ")
    return err[0]


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    assert main(["sweep", *ONE, "--seq", "16", "--out", str(out)]) == 0
    return out


def test_resuming_an_h100_run_on_the_cpu_is_refused_naming_each_difference(tmp_path, capsys):
    run = tmp_path / "h100"
    shutil.copytree(EXAMPLE, run)
    before = _files(run)
    code = main(
        ["sweep", "--device", "cpu", "--providers", "naive", "--seq", "16", "--out", str(run), "--resume"]
    )
    assert code == 2
    line = _error_line(capsys)
    assert f"cannot resume {run} as another sweep" in line
    assert "device cpu (the run: cuda)" in line and "providers naive (the run: " in line
    assert "seq 16 (the run: 1024,2048,4096,8192,16384)" in line
    assert _files(run) == before  # the H100 environment record and its rows are untouched


def test_a_flag_that_repeats_the_stored_spec_resumes(tiny_run, capsys):
    env = json.loads((tiny_run / "env.json").read_text())
    env["finished"] = None  # as if killed after its last row
    (tiny_run / "env.json").write_text(json.dumps(env))
    assert main(["sweep", *ONE, "--seq", "16", "--out", str(tiny_run), "--resume", "--timeout", "60"]) == 0
    resumed = read_env(tiny_run)
    assert resumed.finished and len(resumed.previous_runs) == 1 and resumed.spec["timeout_s"] == 60


def test_resume_with_another_seq_is_refused_and_nothing_is_written(tiny_run, capsys):
    before = _files(tiny_run)
    assert main(["sweep", *ONE, "--seq", "16,32", "--out", str(tiny_run), "--resume"]) == 2
    assert "seq 16,32 (the run: 16)" in _error_line(capsys)
    assert _files(tiny_run) == before


def test_resume_on_another_gpu_model_is_refused(tiny_run, capsys):
    env = json.loads((tiny_run / "env.json").read_text())
    env.update(gpu="NVIDIA H100 80GB HBM3", finished=None)  # a run some other machine started
    (tiny_run / "env.json").write_text(json.dumps(env))
    before = _files(tiny_run)
    assert main(["sweep", "--out", str(tiny_run), "--resume"]) == 2
    line = _error_line(capsys)
    assert "measured on NVIDIA H100 80GB HBM3" in line and "sees cpu" in line
    assert _files(tiny_run) == before


def test_resuming_a_finished_run_rewrites_nothing(tiny_run, capsys):
    before = _files(tiny_run)
    assert main(["sweep", "--out", str(tiny_run), "--resume"]) == 0
    assert "is finished; nothing to resume, nothing written" in capsys.readouterr().err
    assert _files(tiny_run) == before and len(read_rows(tiny_run)) == 1


def test_resume_and_force_together_are_a_usage_error(tiny_run, capsys):
    before = _files(tiny_run)
    assert main(["sweep", *ONE, "--seq", "16", "--out", str(tiny_run), "--resume", "--force"]) == 2
    assert "--resume and --force exclude each other" in _error_line(capsys)
    assert _files(tiny_run) == before

"""`flashbench sweep` end to end on the CPU (--device cpu), and its one-line errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tiers import interpreter_sweep

import flashbench
from flashbench.cli.app import main
from flashbench.gpu import environment
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows

TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
TINY = ["--config", str(Path(__file__).with_name("fast_measure.toml")), *TINY]  # tests/fast_measure.toml: why


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq", "0"], "seq: 0 must be a positive number"),
        (["--seq", "4096..512"], "reversed"),
        (["--seq", "lots"], "'lots' is not a whole number"),
        (["--head-dim", "64.5"], "not a whole number"),
        (["--providers", "sdpa-flsh"], "unknown provider 'sdpa-flsh'; did you mean 'sdpa-flash'?"),
        (["--dtype", "fp4"], "unknown dtype 'fp4'"),
        (["--causal", "sometimes"], "true, false or both"),
        (["--mode", "forward"], "unknown mode 'forward'"),
        (["--preset", "defualt"], "did you mean 'default'"),
        (["--kernel", "/nonexistent/k.py"], "kernel file not found"),
        (["--batch", "2", "--tokens", "4096"], "either batch or tokens"),
        (["--order", "shape"], "unknown order 'shape'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys, tmp_path):
    code = main(["sweep", "--device", "cpu", "--out", str(tmp_path / "run"), *args])
    assert code == 2
    line = _error_line(capsys)
    assert line.startswith("flashbench: error: ") and message in line


def test_forced_provider_with_an_unsupported_head_dim_is_refused(capsys, tmp_path):
    code = main(
        ["sweep", *TINY[:-4], "--providers", "triton", "--head-dim", "24", "--out", str(tmp_path / "r")]
    )
    line = _error_line(capsys)
    if "unavailable" in line or code == 0:
        pytest.skip("bundled kernels not importable here")
    assert code == 2 and "head_dim 24" in line


@pytest.mark.skipif(environment.gpu_present()[0], reason="this machine has a GPU")
def test_no_gpu_without_device_cpu_exits_3(capsys, tmp_path):
    assert main(["sweep", "--seq", "512", "--out", str(tmp_path / "r")]) == 3
    assert (
        "no NVIDIA GPU" in _error_line(capsys) and "--device cpu" in capsys.readouterr().err + "--device cpu"
    )


def test_cpu_sweep_writes_every_expected_row(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--providers", "naive,sdpa-math,sdpa-cudnn", "--seq", "16,32", "--causal", "both"]
    code = main([*args, "--mode", "fwd,fwd+bwd", "--out", str(out)])
    assert code == 0
    rows = read_rows(out, latest_only=False)
    assert len(rows) == 3 * 2 * 2 * 2 and len({r.key for r in rows}) == len(rows)
    for row in rows:
        assert row.device == "cpu"
        if row.provider == "sdpa-cudnn":
            assert row.status == "unsupported" and "cuda" in row.reason
            continue
        assert row.status == "ok", row.reason
        # min_samples 3 (tests/fast_measure.toml)
        assert len(row.samples_ms) >= 3 and row.median_ms > 0 and row.flops > 0 and row.rel_err is not None
    env = read_env(out)
    assert env.device == "cpu" and env.spec["providers"] == ["naive", "sdpa-math", "sdpa-cudnn"]
    assert [r.provider for r in rows[:4]] == ["naive"] * 4  # provider-major by default
    assert env.status_counts == {"ok": 16, "unsupported": 8} and env.torch and env.git_sha
    table = capsys.readouterr().out
    assert "CPU ms (median)" in table and "naive" in table and "unsup" in table


def test_case_order_runs_providers_side_by_side(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--providers", "naive,sdpa-math", "--seq", "16,32", "--causal", "false"]
    assert main([*args, "--mode", "fwd", "--order", "case", "--out", str(out)]) == 0
    rows = read_rows(out, latest_only=False)
    assert [(r.provider, r.seq_q) for r in rows] == [
        ("naive", 16), ("sdpa-math", 16), ("sdpa-math", 32), ("naive", 32),
    ]  # fmt: skip
    assert all(r.status == "ok" for r in rows) and read_env(out).spec["order"] == "case"


@pytest.mark.skipif(importlib.util.find_spec("flashbench.kernels") is None, reason="bundled kernels missing")
@interpreter_sweep
def test_bundled_triton_kernel_runs_through_the_interpreter(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "sweep",
            *TINY,
            "--head-dim",
            "32",
            "--providers",
            "triton",
            "--seq",
            "16",
            "--causal",
            "true",
            "--mode",
            "fwd,fwd+bwd",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["counts"] == {"ok": 2}
    for row in payload["rows"]:
        assert row["provider"] == "triton" and row["rel_err"] <= row["err_budget"]
        assert row["kernel_config"]["BLOCK_M"]  # the forward tile (flashbench.kernels.last_config())
    # the backward's tiles where a backward ran, and only there (a forward clears the previous case's)
    by_mode = {row["mode"]: row["kernel_config"] for row in payload["rows"]}
    assert set(by_mode["fwd+bwd"]["bwd"]) == {"dkdv", "dq"} and by_mode["fwd+bwd"]["bwd"]["dkdv"]["BLOCK_N"]
    assert "bwd" not in by_mode["fwd"]


def test_existing_run_dir_is_refused_without_resume_or_force(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "rows.jsonl").write_text("")
    (out / "notes.txt").write_text("keep me")
    args = ["sweep", *TINY, "--providers", "naive", "--seq", "16", "--causal", "false", "--mode", "fwd"]
    assert main([*args, "--out", str(out)]) == 2
    assert "--resume" in _error_line(capsys)
    assert main([*args, "--out", str(out), "--force"]) == 0
    assert len(read_rows(out)) == 1 and (out / "notes.txt").read_text() == "keep me"


def test_library_sweep_returns_rows_and_a_frame(tmp_path):
    result = flashbench.sweep(
        device="cpu",
        providers="naive",
        seq="16..32",
        batch=1,
        heads=2,
        head_dim=16,
        dtype="fp32",
        causal=False,
        mode="fwd",
        out=tmp_path / "lib",
    )
    assert result.counts() == {"ok": 2}
    frame = result.frame()
    assert list(frame["seq_k"]) == [16, 32] and (frame["status"] == "ok").all()
    assert result.env.wall_s > 0


def test_list_and_env_commands(capsys):
    assert main(["list", "presets"]) == 0
    assert "long-context" in capsys.readouterr().out
    assert main(["list", "providers", "--device", "cpu", "--json"]) == 0
    infos = {i["name"]: i for i in json.loads(capsys.readouterr().out)}
    assert infos["naive"]["available"] and not infos["flash-attn"]["available"] or "flash_attn" in str(infos)
    assert infos["flash-attn"]["reason"] or infos["flash-attn"]["available"]
    assert main(["env", "--device", "cpu", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["flashbench"] == flashbench.__version__ and env["torch"] and env["python"]


@pytest.mark.parametrize("out", ["missing", None], ids=["no-such-dir", "no-out"])
def test_resume_with_nothing_to_resume_exits_2(tmp_path, capsys, out):
    args = ["sweep", *TINY, "--providers", "naive", "--seq", "16", "--causal", "false", "--mode", "fwd"]
    target = [] if out is None else ["--out", str(tmp_path / out)]
    assert main([*args, *target, "--resume"]) == 2
    line = _error_line(capsys)
    assert line.startswith("flashbench: error: ") and "nothing to resume" in line
    assert not (tmp_path / "missing").exists()


def test_resume_keeps_the_runs_calibration_when_this_machine_has_none(tmp_path, monkeypatch):
    """A run resumed where no `flashbench calibrate` record is stored keeps the measured ceiling its env.json
    already holds (the report's roofs); one stored here replaces it."""
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--providers", "naive", "--causal", "false", "--mode", "fwd", "--out", str(out)]
    assert main([*args, "--seq", "16"]) == 0
    env_path = out / "env.json"
    env = json.loads(env_path.read_text())
    assert env["calibration"] is None  # none stored in this FLASHBENCH_HOME
    record = {"gpu": env["gpu"], "bf16_tflops": 700.0}
    env["calibration"] = record
    env["finished"] = None  # a session that did not finish: a finished run is not rewritten
    env_path.write_text(json.dumps(env))
    assert main([*args, "--seq", "16", "--resume"]) == 0
    resumed = read_env(out)
    assert resumed.calibration == record and len(resumed.previous_runs) == 1


@pytest.mark.parametrize(
    "size", [["--seq", "99999999999999", "--batch", "1"], ["--seq", "16", "--batch", "10000000000"]]
)
def test_impossible_sizes_on_the_cpu_are_predicted_oom_rows_not_crashes(tmp_path, size):
    """The host's memory bounds a CPU sweep as the GPU's bounds a GPU sweep: nothing is allocated, nothing crashes."""
    out = tmp_path / "run"
    args = ["sweep", "--device", "cpu", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
    args += ["--providers", "naive,sdpa-math", "--causal", "false", "--mode", "fwd", *size, "--out", str(out)]
    assert main(args) == 0
    rows = read_rows(out)
    assert len(rows) == 2 and all(r.status == "predicted-oom" for r in rows), [
        (r.status, r.reason) for r in rows
    ]
    assert all(r.reason.endswith("GiB of host memory") for r in rows)

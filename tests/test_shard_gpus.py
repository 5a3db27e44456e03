"""`sweep --gpus`: one worker per device, shapes spread over them, one rows.jsonl written by the parent."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows

TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
TINY = ["--config", str(Path(__file__).with_name("fast_measure.toml")), *TINY]  # tests/fast_measure.toml: why


def test_gpus_with_device_cpu_runs_two_workers_and_writes_every_case_once(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--providers", "naive,sdpa-math", "--seq", "16,32,64", "--causal", "both"]
    assert main([*args, "--mode", "fwd", "--gpus", "0,1", "--out", str(out)]) == 0
    rows = read_rows(out, latest_only=False)
    assert len(rows) == 2 * 3 * 2 and len({r.key for r in rows}) == len(rows)  # every case once
    assert all(r.status == "ok" for r in rows), [r.reason for r in rows if r.status != "ok"]
    by_shape = defaultdict(set)
    for row in rows:
        by_shape[row.case.shape_key].add(row.gpu_index)
    assert all(len(devices) == 1 for devices in by_shape.values())  # a shape's providers on one worker
    assert {d for devices in by_shape.values() for d in devices} == {0, 1}  # both workers ran cases
    env = read_env(out)
    assert env.devices_used == [0, 1] and env.planned_cases == len(rows)
    assert env.status_counts == {"ok": len(rows)}
    assert set(env.compile_s_by_worker) == {"0", "1"}  # each worker's first calls, apart
    assert sum(env.compile_s_by_worker.values()) == pytest.approx(env.compile_s_total, abs=2e-3)
    assert (
        env.precompile is not None and "interpreter" in env.precompile["skipped"]
    )  # nothing to compile on CPU
    assert main([*args, "--mode", "fwd", "--gpus", "0,1", "--out", str(out), "--resume"]) == 0
    assert len(read_rows(out, latest_only=False)) == len(rows)  # resume: nothing run twice


def test_gpus_combines_with_shard(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--providers", "naive,sdpa-math", "--seq", "16,32,64,128", "--causal", "false"]
    assert main([*args, "--mode", "fwd", "--gpus", "0,1", "--shard", "1/2", "--out", str(out)]) == 0
    rows = read_rows(out)
    # costliest first, each to the lighter shard: N = 128 to shard 1, 64 and 32 to shard 2, 16 to shard 1
    assert {r.seq_k for r in rows} == {16, 128} and {r.gpu_index for r in rows} == {0, 1}


@pytest.mark.parametrize(
    ("value", "message"),
    [("all", "--gpus all needs --device cuda"), ("0,0", "listed twice"), ("x", "expected 'all'")],
)
def test_bad_gpus_is_one_line_and_exit_2(value, message, tmp_path, capsys):
    code = main(["sweep", *TINY, "--seq", "16", "--out", str(tmp_path / "r"), "--gpus", value])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_every_worker_and_the_record_process_start_before_the_first_worker_is_ready(tmp_path, monkeypatch):
    """The start-ups overlap: the second GPU's worker and the compile-once step's record process are started
    before the first worker has answered (they used to start only once it had, and the sweep was planned)."""
    from flashbench.engine import precompile, runner

    events: list[str] = []
    start, ready, spawn = runner.Worker.__init__, runner.Worker.wait_ready, precompile._start

    def logged_start(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        events.append(f"start {kwargs.get('visible')}")
        start(self, *args, **kwargs)

    def logged_ready(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        ready(self, *args, **kwargs)
        events.append("ready")

    def fake_record(cmd, visible):  # type: ignore[no-untyped-def]
        events.append("record")
        return spawn([*cmd[:1], "-c", "import sys; sys.stdin.read()"], visible)

    monkeypatch.setattr(runner.Worker, "__init__", logged_start)
    monkeypatch.setattr(runner.Worker, "wait_ready", logged_ready)
    monkeypatch.setattr(precompile, "off_reason", lambda device: None)  # as on a GPU
    monkeypatch.setattr(precompile, "skip_reason", lambda device, cases: "stub: no builds")
    monkeypatch.setattr(precompile, "_start", fake_record)
    args = ["sweep", *TINY, "--providers", "naive", "--seq", "16,32", "--causal", "false", "--mode", "fwd"]
    assert main([*args, "--gpus", "0,1", "--out", str(tmp_path / "run")]) == 0
    assert events[:3] == ["start 0", "start 1", "record"] and events.count("ready") == 2, events
    assert all(r.status == "ok" for r in read_rows(tmp_path / "run"))

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


@pytest.mark.parametrize(
    ("visible", "gpus", "workers"),
    [
        (None, "all", ["0", "1", "2", "3"]),  # no CUDA_VISIBLE_DEVICES: every GPU NVML sees
        (None, "1,3", ["1", "3"]),
        ("2,3", "all", ["2", "3"]),  # a Slurm allocation of two of the node's four GPUs
        ("2,3", "0,1", ["2", "3"]),  # indices count in the visible list, as CUDA numbers devices
        ("2,3", "1", ["3"]),
        ("GPU-8a1c,MIG-5f2e/1/0", "all", ["GPU-8a1c", "MIG-5f2e/1/0"]),  # UUIDs pass through as they are
        ("GPU-8a1c,MIG-5f2e/1/0", "1", ["MIG-5f2e/1/0"]),
        ("1,-1,0", "all", ["1"]),  # like CUDA, the list ends at the first entry that names no device
        ("3,7,0", "all", ["3"]),  # NVML has no GPU 7 here
    ],
)
def test_gpus_index_the_gpus_this_process_sees(visible, gpus, workers):
    from flashbench.engine.shard import parse_gpus

    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert parse_gpus(gpus, "cuda", 4, environ) == workers


@pytest.mark.parametrize(
    ("visible", "gpus", "message"),
    [
        ("2,3", "2", "--gpus '2': no GPU 2 here (2 found with CUDA_VISIBLE_DEVICES=2,3, indices 0..1)"),
        ("", "all", "--gpus all: no GPU found with CUDA_VISIBLE_DEVICES="),
        (None, "0,4", "--gpus '0,4': no GPU 4 here (4 found, indices 0..3)"),
    ],
)
def test_a_gpu_outside_the_visible_list_is_one_line_and_exit_2(
    visible, gpus, message, tmp_path, capsys, monkeypatch
):
    from flashbench.gpu import environment

    monkeypatch.setattr(environment, "gpu_present", lambda: (True, [{"index": i} for i in range(4)]))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    args = ["sweep", "--device", "cuda", "--seq", "16", "--providers", "naive", "--out", str(tmp_path / "r")]
    assert main([*args, "--gpus", gpus]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"flashbench: error: {message}"]


def test_each_worker_runs_with_its_entry_of_the_parents_visible_list(monkeypatch):
    """The worker process's own CUDA_VISIBLE_DEVICES is the parent's entry that --gpus picked, a UUID included."""
    from flashbench.engine import runner, shard
    from flashbench.engine import worker as worker_process

    environ = {"CUDA_VISIBLE_DEVICES": "GPU-8a1c,GPU-77d0"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", environ["CUDA_VISIBLE_DEVICES"])
    spawn = worker_process.spawn
    echo = "import json, os; print(json.dumps({'visible': os.environ['CUDA_VISIBLE_DEVICES']}), flush=True)"
    monkeypatch.setattr(worker_process, "spawn", lambda cmd, env, log: spawn([cmd[0], "-c", echo], env, log))
    seen = []
    for visible in shard.parse_gpus("1,0", "cuda", 2, environ) or []:
        worker = runner.Worker("cuda", (), None, visible=visible)
        try:
            seen.append(worker._messages.get(timeout=60)["visible"])
        finally:
            worker.close()
    assert seen == ["GPU-77d0", "GPU-8a1c"]


class _PinnedWorker:
    """What run_cases asks of a worker, answering as one pinned to a GPU by UUID whose NVML index is 5."""

    ready = False
    facts = {"gpu": "NVIDIA H100 80GB HBM3", "nvml_index": 5}

    def alive(self) -> bool:
        return True

    def wait_ready(self) -> None:
        self.ready = True

    def run(self, case, opts, timeout):
        from flashbench.results.rows import Row

        return Row.for_case(case, "ok", timestamp=1.0, device="cuda", gpu=self.facts["gpu"]).to_dict(), False

    def close(self) -> None:
        pass


def test_rows_of_a_worker_pinned_by_uuid_name_the_gpu_nvml_reported(tmp_path):
    """A --gpus worker's rows take NVML's index of its GPU from the worker (found by its PCI address), not from
    its CUDA_VISIBLE_DEVICES entry, which may be a UUID."""
    from flashbench.engine import runner
    from flashbench.spec.cases import Case
    from flashbench.spec.plan import PlannedCase

    planned = [PlannedCase(Case("triton", 1, 2, 2, 64, 64, 64, "bf16", causal=False, mode="fwd"))]
    rows = runner.run_cases(
        planned, tmp_path, device="cuda", kernels=(), opts={}, timeout_s=10, worker=_PinnedWorker(),  # type: ignore[arg-type]
        visible="GPU-77d0",
    )  # fmt: skip
    assert [r.gpu_index for r in rows] == [5] and read_rows(tmp_path)[0].gpu_index == 5


def test_gpus_hand_out_whole_shapes_costliest_first_to_whichever_gpu_is_free():
    """runner.Deal over shard.by_shape: a shape's providers go together, the costliest shape first, each shape
    once; a GPU asks for its next shape only when it has finished the last, so one busy with a costly shape takes
    no more while a faster one takes the rest. An OOM noted by one GPU skips a larger N on another."""
    from flashbench.engine import runner, shard
    from flashbench.results.rows import Row
    from flashbench.spec.cases import Case
    from flashbench.spec.plan import PlannedCase

    plan = [
        PlannedCase(Case(p, 1, 2, 2, n, n, 64, "bf16", causal=False, mode="fwd"))
        for p in ("naive", "sdpa-math")  # --order provider: a shape's cases are not neighbours in the plan
        for n in (64, 512, 128, 256)
    ]
    deal = runner.Deal(shard.by_shape(plan))
    busy = deal.take(None)  # GPU 0: the costliest shape, still measuring
    assert busy is not None and [(p.case.provider, p.case.seq_k) for p in busy] == [
        ("naive", 512),
        ("sdpa-math", 512),
    ]
    rest = []
    while (group := deal.take(None)) is not None:  # GPU 1 finishes each shape before GPU 0 its one
        rest.append([p.case.seq_k for p in group])
    assert rest == [[256, 256], [128, 128], [64, 64]]

    deal = runner.Deal(shard.by_shape(plan))
    deal.skips.note(Row.for_case(plan[0].case, "oom", reason="out of memory"))  # naive OOMed at N = 64
    assert "ran out of memory at N=64" in (deal.skips.reason(plan[2].case) or "")  # naive N = 128, elsewhere
    assert deal.skips.reason(plan[4].case) is None  # sdpa-math

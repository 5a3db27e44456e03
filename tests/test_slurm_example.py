"""examples/slurm: the array job's tasks run one after another here, as bash with the variables Slurm sets, in place
of sbatch's array; then its merge step. Each task must run its own 1-based shard, the shards together must hold
every case of the unsharded sweep once, the merged run must load, and a resubmitted task must resume, not repeat.

The sweep is a CPU one of providers that need no Triton (naive, sdpa-math), so the whole module takes seconds.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashbench.results.env import read_env
from flashbench.results.rows import ROWS_FILE, read_rows
from flashbench.spec.config import load_spec
from flashbench.spec.plan import expand

ROOT = Path(__file__).resolve().parents[1]
SWEEP_SCRIPT = ROOT / "examples" / "slurm" / "sweep.sbatch"
MERGE_SCRIPT = ROOT / "examples" / "slurm" / "merge.sbatch"
TASKS = 3
PROVIDERS = ["naive", "sdpa-math"]
SPEC = {"device": "cpu", "batch": "1", "heads": "2", "head_dim": "16", "dtype": "fp16", "seq": "16,32,48"}
SPEC |= {"causal": "both", "mode": "fwd"}
# The same sweep as arguments of sweep.sbatch, which passes them on to `flashbench sweep`.
ARGS = [f"--{k.replace('_', '-')}={v}" for k, v in SPEC.items()]
ARGS += ["--providers", ",".join(PROVIDERS), "--config", str(ROOT / "tests" / "fast_measure.toml")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    """The submit directory, with a `flashbench` on PATH that runs this checkout, as an activated environment."""
    root = tmp_path_factory.mktemp("cluster")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "flashbench"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m flashbench "$@"\n')
    shim.chmod(0o755)
    (root / "submit").mkdir()
    return root


def _env(cluster: Path, **slurm: str) -> dict[str, str]:
    """Slurm's variables over this process's environment, without the caches the script chooses itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHBENCH_HOME", "TRITON_CACHE_DIR")}
    env["PATH"] = f"{cluster / 'bin'}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env | slurm


def _task(cluster: Path, task_id: int, **extra: str) -> subprocess.CompletedProcess[str]:
    """One array task on its own node (its own TMPDIR), as sbatch would start it."""
    slurm = {"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": str(task_id)}
    slurm |= {"SLURM_ARRAY_TASK_COUNT": str(TASKS), "TMPDIR": str(cluster / f"node{task_id}")}
    env = _env(cluster, **(slurm | extra))
    return subprocess.run(
        ["bash", str(SWEEP_SCRIPT), *ARGS],
        cwd=cluster / "submit",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _merge(cluster: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(MERGE_SCRIPT), "--format", "md"],
        cwd=cluster / "submit",
        env=_env(cluster, SLURM_JOB_ID="4243"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_array_tasks_then_merge_cover_the_sweep_once_and_a_resubmitted_task_resumes(cluster):
    sweep_dir = cluster / "submit" / "results" / "sweep"
    for task_id in range(TASKS - 1):  # the last task has not run yet
        task = _task(cluster, task_id)
        assert task.returncode == 0, task.stderr[-2000:]
        assert f"flashbench shard {task_id + 1}/{TASKS} on " in task.stdout
        node = cluster / f"node{task_id}" / f"flashbench-{os.environ.get('USER') or getpass.getuser()}"
        assert f"TRITON_CACHE_DIR={node / 'triton'} FLASHBENCH_HOME={node / 'home'}" in task.stdout
        assert (node / "triton").is_dir() and (node / "home").is_dir()  # per node by default

    merged = _merge(cluster)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert f"shard {TASKS}/{TASKS} missing" in merged.stderr  # a warning, and the merge goes on
    assert read_env(sweep_dir / "merged").shards_missing == [TASKS]

    task = _task(cluster, TASKS - 1)
    assert task.returncode == 0, task.stderr[-2000:]
    merged = _merge(cluster)
    assert merged.returncode == 0 and "missing" not in merged.stderr, merged.stderr[-2000:]
    assert merged.stdout.startswith(f"merged {TASKS}/{TASKS} shards")
    planned = [c.key for c in expand(load_spec(preset="cpu", overrides=SPEC), PROVIDERS)]
    assert "## flashbench report: `merged`" in merged.stdout  # the merged run loads: its report (markdown)
    assert f"{len(planned)} cases, all ok" in merged.stdout

    shards = [sweep_dir / f"shard-{i}" for i in range(1, TASKS + 1)]
    assert [read_env(s).shard for s in shards] == [f"{i}/{TASKS}" for i in range(1, TASKS + 1)]
    keys = [[r.key for r in read_rows(s, latest_only=False)] for s in shards]
    assert all(keys), "a shard ran no case: the test's sweep has too few shapes for its tasks"
    assert sorted(k for part in keys for k in part) == sorted(planned)  # every case once, over the shards
    merged_rows = read_rows(sweep_dir / "merged", latest_only=False)
    assert sorted(r.key for r in merged_rows) == sorted(planned)
    assert {r.status for r in merged_rows} == {"ok"}

    # Task 2 killed after its first rows: drop its last row, resubmit it alone (SHARDS, as the script's header
    # says) with a Triton cache of the user's own, which the script keeps.
    rows_file = shards[1] / ROWS_FILE
    lines = rows_file.read_text().splitlines()
    rows_file.write_text("\n".join(lines[:-1]) + "\n")
    user_cache = cluster / "shared-triton-cache"
    again = _task(cluster, 1, SLURM_ARRAY_TASK_COUNT="1", SHARDS=str(TASKS), TRITON_CACHE_DIR=str(user_cache))
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"shard 2/{TASKS} on " in again.stdout and "--resume" in again.stdout
    assert f"TRITON_CACHE_DIR={user_cache} " in again.stdout
    resumed = [r.key for r in read_rows(shards[1], latest_only=False)]
    assert sorted(resumed) == sorted(keys[1])  # the dropped case measured again, none twice


def test_task_outside_the_array_or_without_a_count_is_refused_before_any_sweep(cluster):
    outside = _task(cluster, TASKS)
    assert outside.returncode == 2
    assert outside.stderr.strip() == (
        f"sweep.sbatch: task id {TASKS} is outside 0..{TASKS - 1} ({TASKS} shards): number the tasks from 0 "
        f"(--array=0-{TASKS - 1}), and set SHARDS=N where you resubmit some tasks only"
    )
    uncounted = _task(cluster, 0, SLURM_ARRAY_TASK_COUNT="")
    assert uncounted.returncode == 2 and "how many shards?" in uncounted.stderr
    assert not (cluster / "submit" / "results" / "sweep" / f"shard-{TASKS + 1}").exists()

"""`flashbench merge`: shard runs of one sweep become the run an unsharded sweep writes; mixed runs are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.results.env import ENV_FILE, read_env
from flashbench.results.rows import read_rows

SWEEP = [
    "sweep",
    "--device",
    "cpu",
    "--batch",
    "1",
    "--heads",
    "2",
    "--head-dim",
    "16",
    "--dtype",
    "fp16",
    "--config",
    str(Path(__file__).with_name("fast_measure.toml")),  # tests/fast_measure.toml: why
    "--providers",
    "naive,sdpa-math",
    "--seq",
    "16,32",
    "--causal",
    "both",
    "--mode",
    "fwd",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Shard 1/2 and 2/2 of a tiny CPU sweep, and the same sweep unsharded."""
    root = tmp_path_factory.mktemp("runs")
    for name, extra in (("s1", ["--shard", "1/2"]), ("s2", ["--shard", "2/2"]), ("whole", [])):
        assert main([*SWEEP, *extra, "--out", str(root / name)]) == 0
    return root


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_merged_shards_equal_the_unsharded_run(runs, tmp_path, capsys):
    assert main(["merge", str(runs / "s2"), str(runs / "s1"), "--out", str(tmp_path / "m")]) == 0
    merged = {r.key: r.status for r in read_rows(tmp_path / "m", latest_only=False)}
    whole = {r.key: r.status for r in read_rows(runs / "whole")}
    assert merged == whole and len(merged) == 8
    assert len(read_rows(tmp_path / "m", latest_only=False)) == 8  # no duplicates
    env = read_env(tmp_path / "m")
    assert env.sweep_id == read_env(runs / "whole").sweep_id
    assert env.shard_count == 2 and env.shards_present == [1, 2] and env.shards_missing == []
    assert [s["shard"] for s in env.shards] == ["1/2", "2/2"]
    assert env.planned_cases == 8 and env.status_counts == {"ok": 8}
    assert env.wall_s_sum >= env.wall_s > 0
    assert "merged 2/2 shards: 8 cases" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "m"), "--format", "md"]) == 0  # a merged run is a run


def test_missing_shard_is_a_warning_not_a_refusal(runs, tmp_path, capsys):
    assert main(["merge", str(runs / "s1"), "--out", str(tmp_path / "m")]) == 0
    assert "shard 2/2 missing" in capsys.readouterr().err
    env = read_env(tmp_path / "m")
    assert env.shards_present == [1] and env.shards_missing == [2]


def test_merge_rejects_runs_of_another_sweep(runs, tmp_path, capsys):
    other = tmp_path / "other"
    assert main([*SWEEP[:-6], "--seq", "16", "--causal", "false", "--shard", "2/2", "--out", str(other)]) == 0
    capsys.readouterr()
    assert main(["merge", str(runs / "s1"), str(other), "--out", str(tmp_path / "m")]) == 2
    assert "merge: runs of different sweeps (sweep_id)" in _error_line(capsys)
    assert not (tmp_path / "m").exists()


def test_merge_rejects_runs_of_another_flashbench_version(runs, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(runs / "s2", old)
    env = json.loads((old / ENV_FILE).read_text())
    env["flashbench"] = "0.0.9"
    (old / ENV_FILE).write_text(json.dumps(env))
    assert main(["merge", str(runs / "s1"), str(old), "--out", str(tmp_path / "m")]) == 2
    line = _error_line(capsys)
    assert "merge: runs of different flashbench versions" in line and "0.0.9" in line


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["s1", "s1"], "shard 1/2 given twice"),
        (["s1", "whole"], "shards of different counts"),
    ],
)
def test_merge_rejects_duplicate_and_mismatched_shards(runs, tmp_path, capsys, names, message):
    assert main(["merge", *(str(runs / n) for n in names), "--out", str(tmp_path / "m")]) == 2
    assert message in _error_line(capsys)


def test_merge_refuses_a_non_empty_out_without_force(runs, tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["merge", str(runs / "s1"), str(runs / "s2"), "--out", str(out)]) == 0
    assert main(["merge", str(runs / "s1"), str(runs / "s2"), "--out", str(out)]) == 2
    assert "add --force" in _error_line(capsys)
    assert main(["merge", str(runs / "s1"), str(runs / "s2"), "--out", str(out), "--force"]) == 0
    assert len(read_rows(out, latest_only=False)) == 8

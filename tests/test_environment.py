"""The environment record carries this GPU's calibration, so a report built elsewhere shows its measured ceiling."""

from __future__ import annotations

import json

import pytest

from flashbench.errors import FlashbenchError
from flashbench.gpu import environment
from flashbench.results.env import ENV_FILE, Environment, read_env, write_env


def test_env_record_copies_the_calibration_of_the_gpu_that_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    (tmp_path / "calibration").mkdir()
    stored = {"gpu": "NVIDIA H200", "key": "h200", "copy_bw_gb_s": 4223.6, "matmul_tflops": {"bf16": 680.2}}
    (tmp_path / "calibration" / "h200.json").write_text(json.dumps(stored))
    record = environment.collect("cuda", {"gpu": "NVIDIA H200"})
    assert record.calibration["copy_bw_gb_s"] == 4223.6
    assert record.calibration["matmul_tflops"]["bf16"] == 680.2


def test_env_record_without_calibration_or_with_a_corrupt_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    assert environment.collect("cuda", {"gpu": "NVIDIA H200"}).calibration is None
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "h200.json").write_text("{not json")
    record = environment.collect("cuda", {"gpu": "NVIDIA H200"})
    assert "error" in record.calibration  # recorded, and the sweep goes on


def test_a_cpu_run_on_a_gpu_machine_carries_no_gpu_calibration(tmp_path, monkeypatch):
    """NVML lists the machine's GPU in a `--device cpu` run's record, but the rows measured the CPU."""
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "h200.json").write_text(
        json.dumps({"gpu": "NVIDIA H200", "copy_bw_gb_s": 4223.6})
    )
    monkeypatch.setattr(environment, "nvml_gpus", lambda: [{"index": 0, "name": "NVIDIA H200"}])
    record = environment.collect("cpu", {})
    assert record.gpus[0]["name"] == "NVIDIA H200" and record.calibration is None


def test_env_json_round_trips_as_a_typed_record_and_keeps_unknown_keys(tmp_path):
    env = Environment(
        gpu="NVIDIA H100 80GB HBM3", torch="2.11.0", preset="quick", argv=["/x/flashbench", "sweep"]
    )
    write_env(tmp_path, env)
    data = json.loads((tmp_path / ENV_FILE).read_text())
    data["written_by_a_newer_flashbench"] = {"x": 1}
    (tmp_path / ENV_FILE).write_text(json.dumps(data))
    back = read_env(tmp_path)
    assert back.gpu_name == "NVIDIA H100 80GB HBM3" and back.torch == "2.11.0" and back.preset == "quick"
    assert back.command == "flashbench sweep"
    write_env(tmp_path, back)  # rewriting with this version loses nothing it does not know
    assert json.loads((tmp_path / ENV_FILE).read_text())["written_by_a_newer_flashbench"] == {"x": 1}


def test_env_json_of_another_schema_or_corrupt_is_a_one_line_error(tmp_path):
    (tmp_path / ENV_FILE).write_text(json.dumps({"schema": 99}))
    with pytest.raises(FlashbenchError, match="schema 99"):
        read_env(tmp_path)
    (tmp_path / ENV_FILE).write_text("[1, 2]")
    with pytest.raises(FlashbenchError, match="corrupt"):
        read_env(tmp_path)


def test_gpu_name_falls_back_to_nvml_facts_when_torch_named_none():
    env = Environment(gpus=[{"name": "NVIDIA H200", "memory_total_bytes": 150_000_000_000}])
    assert env.gpu_name == "NVIDIA H200" and env.gpu_facts["memory_total_bytes"] == 150_000_000_000


# ---------------------------------------------------------------------------------------------- the code's fingerprint
def test_fingerprint_covers_the_installed_package_and_kernels_not_configs_or_bytecode():
    files = environment.package_files()
    assert "flashbench/analysis/gate.py" in files and "flashbench/kernels/api.py" in files
    assert not any(n.startswith("flashbench/configs/") or "__pycache__" in n for n in files)
    fingerprint, parts = environment.code_fingerprint()
    assert len(fingerprint) == environment.FINGERPRINT_CHARS and set(parts) == {"flashbench"}


def test_fingerprint_changes_with_a_file_of_the_package_or_a_kernel_file_not_with_its_folder(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    files = {"flashbench/a.py": pkg / "a.py"}
    kernel = tmp_path / "one" / "my_attn.py"
    kernel.parent.mkdir()
    kernel.write_text("def attn(): ...\n")
    first, parts = environment.code_fingerprint([kernel], files=files)
    assert set(parts) == {"flashbench", "kernel my_attn.py"}
    moved = tmp_path / "two" / "my_attn.py"
    moved.parent.mkdir()
    moved.write_text(kernel.read_text())
    assert environment.code_fingerprint([moved], files=files)[0] == first  # same content elsewhere: same code
    moved.write_text("def attn(): return 1\n")
    assert environment.code_fingerprint([moved], files=files)[0] != first
    (pkg / "a.py").write_text("x = 2\n")
    assert environment.code_fingerprint([kernel], files=files)[0] != first


def _git(root, *args):
    import subprocess

    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_git_info_counts_new_files_and_digests_the_change(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "one")
    clean = environment.git_info(repo)
    assert clean["git_sha"] and clean["git_dirty"] is False and clean["git_diff"] == ""
    (repo / "new.py").write_text("y = 1\n")  # untracked: `git status --untracked-files=no` missed it
    dirty = environment.git_info(repo)
    assert dirty["git_dirty"] is True and dirty["git_diff"]
    (repo / "new.py").write_text("y = 2\n")
    assert environment.git_info(repo)["git_diff"] not in ("", dirty["git_diff"])


def test_a_tree_copied_into_another_checkout_names_no_commit(tmp_path):
    outer = tmp_path / "outer"
    (outer / "copy").mkdir(parents=True)
    _git(outer, "init", "-q")
    assert environment.git_info(outer / "copy") == {"git_sha": "", "git_dirty": None, "git_diff": ""}


def test_same_code_line_says_equal_different_or_unknown():
    from flashbench.results.env import same_code

    assert same_code("ab12", "ab12").startswith("Same code on both sides (fingerprint ab12)")
    assert same_code("ab12", "cd34") == "Different code: fingerprint ab12 (baseline) vs cd34 (current)."
    assert "not recorded for the baseline run" in same_code("", "cd34")


def test_flashbench_env_prints_the_fingerprint_of_the_code_installed(capsys):
    from flashbench.cli.app import main

    assert main(["env", "--device", "cpu"]) == 0
    # a key with an empty value (git_diff of a clean checkout) is a line of its own
    lines = dict(
        (line.split(None, 1) + [""])[:2] for line in capsys.readouterr().out.splitlines() if line.strip()
    )
    assert lines["fingerprint"].strip() == environment.code_fingerprint()[0]

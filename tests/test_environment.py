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
    assert environment.collect("cpu", {}).calibration is None


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

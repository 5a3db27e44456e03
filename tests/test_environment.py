"""The environment record carries this GPU's calibration, so a report built elsewhere shows its measured ceiling."""

from __future__ import annotations

import json

from flashbench.gpu import environment


def test_env_record_copies_the_calibration_of_the_gpu_that_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    (tmp_path / "calibration").mkdir()
    stored = {"gpu": "NVIDIA H200", "key": "h200", "copy_bw_gb_s": 4223.6, "matmul_tflops": {"bf16": 680.2}}
    (tmp_path / "calibration" / "h200.json").write_text(json.dumps(stored))
    record = environment.collect("cuda", {"gpu": "NVIDIA H200"})
    assert record["calibration"]["copy_bw_gb_s"] == 4223.6
    assert record["calibration"]["matmul_tflops"]["bf16"] == 680.2


def test_env_record_without_calibration_or_with_a_corrupt_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    assert environment.collect("cuda", {"gpu": "NVIDIA H200"})["calibration"] is None
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "h200.json").write_text("{not json")
    record = environment.collect("cuda", {"gpu": "NVIDIA H200"})
    assert "error" in record["calibration"]  # recorded, and the sweep goes on
    assert environment.collect("cpu", {})["calibration"] is None

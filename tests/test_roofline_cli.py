"""`flashbench roofline`, `memory` and `calibrate` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from flashbench.cli.app import main
from flashbench.results.env import Environment, write_env
from flashbench.results.rows import OK, Row, append_row


def test_roofline_json_parses_and_needs_no_gpu(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    code = main(["roofline", "--gpu", "h100", "--seq", "1024,4096", "--dtype", "bf16,fp16", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["gpu"]["key"] == "h100-sxm"
    assert report["ceilings"][0]["ridge"]["bf16"] > 290
    fams = {p["family"] for p in report["predictions"]}
    assert {"naive", "flash", "stored-p", "flash-v1", "sdpa-math"} == fams
    naive = next(p for p in report["predictions"] if p["family"] == "naive" and p["seq"] == 4096)
    assert naive["bound"] == "memory-bound"


def test_a_window_models_its_own_pairs_and_a_contradiction_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    flops = {}
    for window in ("-1,-1", "4096,0"):
        args = ["roofline", "--gpu", "h100", "--seq", "32768", "--causal", "--families", "flash", "--json"]
        assert main([*args, "--window", window]) == 0
        (p,) = json.loads(capsys.readouterr().out)["predictions"]
        flops[window] = p["flops"]
    n, w = 32768, 4096  # causal pairs n(n+1)/2 against the window's: w + 1 keys per row once a row has them
    window_pairs = sum(min(i + 1, w + 1) for i in range(n))
    assert flops["-1,-1"] / flops["4096,0"] == pytest.approx(n * (n + 1) / 2 / window_pairs)
    assert main(["roofline", "--gpu", "h100", "--causal", "--window", "10,3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "causal means window right = 0" in err


def test_roofline_table_renders(capsys):
    assert main(["roofline", "--gpu", "a100", "--seq", "2048", "--families", "naive,flash"]) == 0
    assert "Ceilings" in capsys.readouterr().out


def test_bad_gpu_name_exits_2_with_suggestion(capsys):
    code = main(["roofline", "--gpu", "h1OO"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("flashbench: error: unknown GPU") and "did you mean" in err and "h100" in err
    assert len(err.strip().splitlines()) == 1


def test_auto_without_nvml_exits_3(capsys, monkeypatch):
    from flashbench.gpu import nvml

    monkeypatch.setitem(nvml._state, "tried", True)
    monkeypatch.setitem(nvml._state, "nvml", None)
    assert main(["roofline", "--gpu", "auto"]) == 3
    assert "--gpu" in capsys.readouterr().err


def _row(provider: str, ms: float) -> Row:
    return Row(
        provider=provider,
        batch=1,
        heads=16,
        kv_heads=16,
        seq_q=4096,
        seq_k=4096,
        head_dim=128,
        dtype="bf16",
        causal=False,
        mode="fwd",
        status=OK,
        gpu="NVIDIA H100 80GB HBM3",
        median_ms=ms,
    )


def test_overlay_flags_a_point_above_the_roofline(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    run.mkdir()
    write_env(run, Environment(gpu="NVIDIA H100 80GB HBM3"))
    append_row(run, _row("sdpa-flash", 0.5))  # ~0.14 ms is the floor: plausible
    append_row(run, _row("bundled", 0.01))  # 14x faster than the GPU allows: an error
    assert main(["roofline", "--gpu", "h100", "--seq", "4096", "--results", str(run), "--json"]) == 0
    measured = {m["provider"]: m for m in json.loads(capsys.readouterr().out)["measured"]}
    assert measured["sdpa-flash"]["valid"] and 0 < measured["sdpa-flash"]["pct_of_roofline"] < 100
    assert not measured["bundled"]["valid"] and measured["bundled"]["achieved_tflops"] is None
    assert "faster than the roofline allows" in measured["bundled"]["error"]


def test_memory_planner_reports_per_head_and_per_model_bytes(capsys):
    assert main(["memory", "--model", "llama-70b", "--seq", "131072", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["standard_per_head"] == 34_359_738_368
    assert row["flash_ml_per_head"] == 1_048_576
    assert row["standard_per_model"] == 34_359_738_368 * 64 * 80


def test_memory_table_and_unknown_model(capsys):
    assert main(["memory", "--model", "gpt2", "--seq", "2048..8192", "--checkpointing"]) == 0
    assert main(["memory", "--model", "llama-71b"]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_calibrate_without_gpu_exits_3(capsys):
    import torch

    if torch.cuda.is_available():
        return
    assert main(["calibrate"]) == 3
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_one_bound_rule_in_the_modelled_table_the_overlay_and_the_json(capsys, tmp_path, monkeypatch):
    """A bundled forward at 646 TFLOP/s (65% of the H100's bf16 roof) is compute-bound wherever it is shown,
    and the modelled table gives its family the same bound at the same N; naive at N = 4096 is memory-bound."""
    monkeypatch.setenv("COLUMNS", "200")  # whole words in the bound column (an xdist worker has 80)
    from flashbench.models.flops import attention_flops
    from flashbench.models.roofline import BOUND_RULE

    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    run.mkdir()
    write_env(run, Environment(gpu="NVIDIA H100 80GB HBM3"))
    flops = attention_flops(1, 16, 4096, 4096, 128, False, "fwd")
    append_row(run, _row("triton", flops / 646e12 * 1e3))
    append_row(run, _row("naive", flops / 60e12 * 1e3))
    args = ["roofline", "--gpu", "h100", "--seq", "4096", "--families", "flash,naive", "--results", str(run)]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bound_rule"] == BOUND_RULE
    modelled = {p["family"]: p["bound"] for p in report["predictions"]}
    measured = {m["provider"]: m for m in report["measured"]}
    assert modelled == {"flash": "compute-bound", "naive": "memory-bound"}
    assert measured["triton"]["bound"] == modelled["flash"]
    assert measured["triton"]["pct_of_roofline"] == pytest.approx(646 / 989.4 * 100, rel=1e-3)
    assert measured["naive"]["bound"] == modelled["naive"]
    naive_attainable = measured["naive"]["ai"] * 3.35e12  # the memory roof at naive's own intensity
    assert measured["naive"]["pct_of_roofline"] == pytest.approx(60e12 / naive_attainable * 100, rel=1e-3)
    assert main(args) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if "triton" in line]
    assert lines and "compute-bound" in lines[0] and "memory" not in lines[0]
    assert " ".join(BOUND_RULE.split()) in " ".join(text.split())

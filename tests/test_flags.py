"""One flag convention in every command: switches are bare flags shown without a type; `--causal` is a choice
(true | false | both) in sweep and in roofline alike, a bare `--causal` meaning true."""

from __future__ import annotations

import json

import pytest

from flashbench.cli.app import implied_values, main
from flashbench.results.rows import read_rows

HELPS = [
    ["sweep"],
    ["roofline"],
    ["memory"],
    ["calibrate"],
    ["merge"],
    ["report"],
    ["gate"],
    ["baseline", "save"],
    ["list", "providers"],
    ["env"],
    [],
]


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "flashbench")
def test_help_shows_no_type_for_a_flag(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "120")
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--help" in out and "<bool>" not in out


def test_a_bare_causal_means_true_wherever_it_stands():
    assert implied_values(["sweep", "--causal", "--out", "x"]) == ["sweep", "--causal", "true", "--out", "x"]
    assert implied_values(["roofline", "--causal"]) == ["roofline", "--causal", "true"]
    assert implied_values(["sweep", "--causal", "both"]) == ["sweep", "--causal", "both"]
    assert implied_values(["report", "--", "--causal"]) == ["report", "--", "--causal"]  # a path, not a flag


def test_sweep_takes_a_bare_causal_before_another_option(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["sweep", "--device", "cpu", "--providers", "naive", "--seq", "16", "--batch", "1", "--heads", "1"]
    assert main([*args, "--head-dim", "16", "--mode", "fwd", "--causal", "--out", str(out)]) == 0
    assert [r.causal for r in read_rows(out)] == [True]


@pytest.mark.parametrize("given", [["--causal"], ["--causal", "true"], ["--causal", "yes"]])
def test_roofline_takes_causal_as_sweep_does(capsys, given):
    assert main(["roofline", "--gpu", "h100", "--seq", "1024", *given, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shape"]["causal"] is True


def test_roofline_models_one_mask_per_call(capsys):
    assert main(["roofline", "--gpu", "h100", "--causal", "both"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "flashbench: error: --causal both: roofline models one mask per call; give --causal true or false"
    ]

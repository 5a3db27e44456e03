"""Spec -> Cases: ordering, tokens -> batch, unsupported / unavailable / predicted-oom marked up front."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from flashbench.errors import FlashbenchError
from flashbench.providers.registry import ProviderInfo
from flashbench.spec import plan as plan_mod
from flashbench.spec.cases import Case
from flashbench.spec.config import load_spec
from flashbench.spec.plan import expand, input_bytes, plan


def _infos(**extra):
    infos = {
        "fast": ProviderInfo(
            "fast",
            dtypes=("fp16", "bf16"),
            head_dims=(64, 128),
            devices=("cuda", "cpu"),
            memory_family="flash",
            gqa=True,
        ),
        "slow": ProviderInfo("slow", devices=("cuda", "cpu"), memory_family="naive", backward=False),
        "gone": ProviderInfo("gone", available=False, reason="gone is not installed"),
    }
    infos.update(extra)
    return infos


def test_tokens_give_batch_and_cases_run_in_ascending_n():
    spec = load_spec(overrides={"seq": "512..4096", "tokens": 2048, "providers": "fast", "causal": "false"})
    cases = expand(spec, ["fast"])
    assert [(c.seq_q, c.batch) for c in cases] == [(512, 4), (1024, 2), (2048, 1), (4096, 1)]
    assert all(c.seq_k == c.seq_q and c.kv_heads == c.heads for c in cases)


def test_case_order_interleaves_providers_shape_by_shape():
    """order = "case": per shape every provider back to back, the direction alternating from shape to shape;
    each provider's lengths still ascend (the skips after an OOM rely on it). The default keeps providers
    together."""
    over = {"seq": "512..2048", "tokens": 2048, "causal": "false", "providers": "fast,slow"}
    by_provider = expand(load_spec(overrides=over), ["fast", "slow"])
    assert [c.provider for c in by_provider] == ["fast"] * 3 + ["slow"] * 3
    by_case = expand(load_spec(overrides={**over, "order": "case"}), ["fast", "slow"])
    assert [(c.provider, c.seq_q) for c in by_case] == [
        ("fast", 512), ("slow", 512), ("slow", 1024), ("fast", 1024), ("fast", 2048), ("slow", 2048),
    ]  # fmt: skip
    assert sorted(by_case, key=lambda c: c.key) == sorted(by_provider, key=lambda c: c.key)
    assert load_spec(preset="speed").order == "case" and load_spec().order == "provider"
    with pytest.raises(FlashbenchError, match="unknown order 'random'"):
        load_spec(overrides={"order": "random"})


def test_hidden_sets_heads_per_head_dim():
    """--hidden 2048 sweeps 32 heads at d = 64 and 16 at d = 128 (FlashAttention's benchmark convention)."""
    spec = load_spec(overrides={"seq": "1024", "hidden": 2048, "head_dim": "64,128", "causal": "false"})
    assert {(c.head_dim, c.heads, c.kv_heads) for c in expand(spec, ["fast"])} == {
        (64, 32, 32),
        (128, 16, 16),
    }
    assert load_spec(preset="speed").hidden == 2048


def test_hidden_conflicts_and_divisibility_are_one_line_errors():
    with pytest.raises(FlashbenchError, match="either heads or hidden"):
        load_spec(overrides={"heads": "8", "hidden": 1024})
    with pytest.raises(FlashbenchError, match="multiple of every head dim"):
        load_spec(overrides={"hidden": 1000, "head_dim": "64"})
    # A flag overrides a preset's width: --heads after a preset with hidden.
    assert load_spec(preset="speed", overrides={"heads": "4"}).hidden is None


def test_unsupported_and_unavailable_are_marked_with_the_reason():
    spec = load_spec(
        overrides={
            "seq": "128",
            "batch": 1,
            "providers": "all",
            "dtype": "fp32",
            "mode": "fwd,bwd",
            "causal": "true",
            "head_dim": 64,
            "device": "cpu",
        }
    )
    rows = {(p.case.provider, p.case.mode): p for p in plan(spec, _infos())}
    assert rows[("fast", "fwd")].status == "unsupported" and "fp32" in rows[("fast", "fwd")].reason
    assert rows[("slow", "fwd")].status is None
    assert rows[("slow", "bwd")].status == "unsupported" and "backward" in rows[("slow", "bwd")].reason
    assert (
        rows[("gone", "fwd")].status == "unavailable"
        and rows[("gone", "fwd")].reason == "gone is not installed"
    )


def test_predicted_oom_skips_up_front_with_the_bytes(monkeypatch):
    monkeypatch.setattr(
        plan_mod,
        "predicted_mem_bytes",
        lambda case, family, workspace=0.0, device="cuda": case.seq_q**2 * 1000,
    )
    spec = load_spec(
        overrides={
            "seq": "1024..4096",
            "batch": 1,
            "providers": "slow",
            "causal": "false",
            "dtype": "bf16",
            "mode": "fwd",
        }
    )
    planned = plan(spec, _infos(), memory_bytes=8 * 2**30)
    status = {p.case.seq_q: p.status for p in planned}
    assert status == {1024: None, 2048: None, 4096: "predicted-oom"}
    oom = planned[-1]
    assert oom.predicted_mem_bytes == 4096**2 * 1000 and "GiB" in oom.reason and "bytes" in oom.reason
    # no device memory known: nothing is predicted to fail
    assert all(p.status is None for p in plan(spec, _infos(), memory_bytes=None))


def test_unknown_provider_suggests_a_close_match():
    spec = load_spec(overrides={"providers": "fats"})
    with pytest.raises(FlashbenchError, match="unknown provider 'fats'; did you mean 'fast'"):
        plan(spec, _infos())


def test_a_single_forced_provider_must_support_the_request():
    spec = load_spec(overrides={"providers": "fast", "head_dim": "64,96", "dtype": "bf16"})
    with pytest.raises(FlashbenchError, match="head_dim 96"):
        plan(spec, _infos())
    # the same head dim among several providers is an `unsupported` row instead
    spec = load_spec(overrides={"providers": "fast,slow", "head_dim": "96", "dtype": "bf16", "seq": 128})
    assert {p.status for p in plan(spec, _infos()) if p.case.provider == "fast"} == {"unsupported"}


def test_input_bytes_counts_q_k_v_and_the_output_gradient():
    case = Case("x", 2, 8, 2, 100, 200, 64, "bf16", False, "fwd")
    assert input_bytes(case) == 2 * (2 * 8 * 100 * 64 + 2 * 2 * 2 * 200 * 64)
    bwd = Case("x", 2, 8, 2, 100, 200, 64, "bf16", False, "fwd+bwd")
    assert input_bytes(bwd) - input_bytes(case) == 2 * 2 * 8 * 100 * 64


def test_a_case_whose_inputs_exceed_the_memory_is_predicted_oom_without_a_model():
    """A provider with no memory model still cannot hold inputs larger than the device: those bytes are certain."""
    spec = load_spec(
        overrides={"seq": "1024", "batch": 1, "providers": "plain", "causal": "false", "mode": "fwd"}
    )
    infos = _infos(plain=ProviderInfo("plain", devices=("cuda", "cpu"), memory_family=None))  # not modelled
    (case,) = plan(spec, infos, memory_bytes=2**20)
    assert case.status == "predicted-oom" and case.predicted_mem_bytes is None
    assert case.reason == f"0.0117 GiB of inputs ({input_bytes(case.case)} bytes) > 0.0 GiB on the GPU"


@pytest.mark.parametrize("name", ["every-axis", "hidden-tokens", "case-order"])
def test_expansion_keeps_the_cases_and_their_order(name):
    """expand() gives the cases the nested-loop expansion gave, in its order (tests/golden/plan_expansions.json:
    every axis swept with two or more values, --hidden and --tokens, and the interleaved case order)."""
    golden = json.loads((Path(__file__).parent / "golden" / "plan_expansions.json").read_text())[name]
    keys = [c.key for c in expand(load_spec(overrides=golden["overrides"]), ["p", "q"])]
    assert (len(keys), keys[:3], keys[-3:]) == (golden["count"], golden["first"], golden["last"])
    assert hashlib.sha256("\n".join(keys).encode()).hexdigest() == golden["sha256"]

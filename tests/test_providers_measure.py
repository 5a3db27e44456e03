"""Providers and the in-process measurement on the CPU: reference check, error budget, classification."""

from __future__ import annotations

import contextlib

import pytest
import torch

from flashbench.engine import correctness, timing
from flashbench.engine.measure import Context, Options, classify, measure_case, prepare
from flashbench.providers import builtin, registry
from flashbench.spec.cases import Case

builtin.load()
FAST = Options(warmup_ms=0, rep_ms=1, min_samples=10, max_samples=10)


@pytest.mark.parametrize("provider", ["naive", "sdpa-math", "sdpa"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "seq_q", "seq_k", "causal", "mode"),
    [
        (4, 4, 33, 33, True, "fwd+bwd"),
        (4, 2, 17, 40, True, "fwd+bwd"),  # GQA, Nq != Nk: causal is bottom-right
        (2, 1, 1, 127, False, "bwd"),
        (2, 2, 64, 64, False, "fwd"),
    ],
)
def test_torch_providers_pass_the_float64_check(provider, heads, kv_heads, seq_q, seq_k, causal, mode):
    case = Case(provider, 2, heads, kv_heads, seq_q, seq_k, 32, "fp32", causal, mode)
    row, fatal = measure_case(case, FAST, Context(device="cpu", gpu="cpu"))
    assert not fatal
    assert row.status == "ok", row.reason
    assert row.rel_err is not None and row.rel_err <= row.err_budget
    assert len(row.samples_ms) == 10 and row.p20_ms <= row.median_ms <= row.p80_ms
    assert row.flops > 0 and row.compile_ms is not None and row.device == "cpu"
    assert "float64 on cpu, all" in row.ref


def test_reference_check_catches_a_wrong_causal_alignment():
    # top-left causal (torch's is_causal for Nq != Nk) is not the bottom-right convention
    case = Case("sdpa-math", 1, 2, 2, 8, 24, 16, "fp32", True, "fwd")
    q, k, v = (torch.randn(1, 2, n, 16) for n in (8, 24, 24))
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    verdict = correctness.check(case, {"q": q, "k": k, "v": v}, {"out": top_left}, "cpu")
    assert not verdict.ok and "exceeds the budget" in verdict.reason


def test_reference_check_samples_slices_beyond_its_budget():
    case = Case("naive", 4, 4, 4, 64, 64, 16, "fp16", False, "fwd")
    with contextlib.ExitStack() as stack:
        prepared = prepare(case, "cpu", stack)
        verdict = correctness.check(case, prepared.inputs, prepared.full(), "cpu", flops_limit=3e6)
    assert verdict.ok and "of 16 (batch, kv-head) slices" in verdict.ref
    verdict = correctness.check(case, prepared.inputs, {"out": prepared.forward()}, "cpu", flops_limit=10)
    assert verdict.ok and verdict.rel_err is None and verdict.ref.startswith("skipped:")


def test_unsupported_declarations_and_sdpa_refusals_become_unsupported_rows():
    ctx = Context(device="cpu", gpu="cpu")
    row, _ = measure_case(Case("sdpa-cudnn", 1, 2, 2, 16, 16, 16, "fp16", False, "fwd"), FAST, ctx)
    assert row.status == "unsupported" and "cuda" in row.reason
    status, reason, fatal = classify(
        RuntimeError("No available kernel. Aborting execution."),
        ["Flash attention requires q,k,v to have the same last dimension"],
    )
    assert (status, fatal) == ("unsupported", False) and "same last dimension" in reason


def test_exceptions_are_classified():
    assert classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), [])[0] == "oom"
    status, reason, fatal = classify(RuntimeError("CUDA error: an illegal memory access was encountered"), [])
    assert status == "crash" and fatal
    status, reason, fatal = classify(ValueError("bad block size"), [])
    assert status == "crash" and not fatal and reason.startswith("ValueError: bad block size")
    assert classify(registry.Unsupported("d=96 not tiled"), [])[:2] == ("unsupported", "d=96 not tiled")


def test_bwd_mode_times_only_the_backward():
    case = Case("naive", 1, 2, 2, 32, 32, 16, "fp32", False, "bwd")
    with contextlib.ExitStack() as stack:
        prepared = prepare(case, "cpu", stack)
        call, setup = prepared.timed()
        assert setup is not None
        setup()
        dq, dk, dv = call()
    assert dq.shape == prepared.q.shape and dk.shape == prepared.k.shape


def test_quantiles_and_sample_counts():
    assert timing.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert timing.quantile([1.0, 2.0], 0.2) == pytest.approx(1.2)
    stats = timing.summarize([5.0, 1.0, 3.0])
    assert stats == {"median_ms": 3.0, "p20_ms": pytest.approx(1.8), "p80_ms": pytest.approx(4.2)}
    assert timing.sample_count(0.01, 100, 10, 1000) == 1000
    assert timing.sample_count(50.0, 100, 10, 1000) == 10


_TIMING_OOM = {"calls": 0, "fail_from": 0, "fail_until": 0}


@registry.register("test-oom-in-timing", devices=("cpu",), description="OOM in the timing loop (tests)")
def _oom_in_timing(q, k, v, causal=False, sm_scale=None):
    _TIMING_OOM["calls"] += 1
    if _TIMING_OOM["fail_from"] <= _TIMING_OOM["calls"] < _TIMING_OOM["fail_until"]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test provider)")
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)


@pytest.mark.parametrize(("fails", "status", "words"), [
    (1, "ok", "ran out of memory once; it ran after emptying the allocator cache"),
    (10**6, "oom", "out of memory in the timing loop, again after emptying the allocator cache"),
])  # fmt: skip
def test_timing_loop_out_of_memory_is_retried_once_after_emptying_the_cache(fails, status, words):
    # call 1 is the first (compile) call whose result is checked; the timing loop's calls follow
    _TIMING_OOM.update(calls=0, fail_from=3, fail_until=3 + fails)
    case = Case("test-oom-in-timing", 1, 2, 2, 16, 16, 16, "fp32", False, "fwd")
    row, fatal = measure_case(case, FAST, Context(device="cpu", gpu="cpu"))
    assert not fatal and row.status == status and words in row.reason
    assert (len(row.samples_ms) == 10) is (status == "ok") and row.rel_err is not None

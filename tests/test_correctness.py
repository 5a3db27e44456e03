"""The one oracle (flashbench.engine.correctness): the float64 reference against an independent float64
attention, its decode-shaped lengths, and the error budget the sweep and the kernel tests share."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flashbench.engine import correctness
from flashbench.spec.cases import DTYPES, Case


def make(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def inputs(b: int, h: int, hkv: int, nq: int, nk: int, d: int, dtype: torch.dtype = torch.float64):
    """q, k, v, do with fresh values each (seeds 0..3)."""
    shapes = [(b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d), (b, h, nq, d)]
    return tuple(make(*shape, dtype=dtype, seed=seed) for seed, shape in enumerate(shapes))


def sdpa64(q, k, v, causal: bool, scale: float, do=None) -> dict[str, torch.Tensor]:
    """Attention through torch's SDPA in float64 (math path), GQA by repeat, bottom-right mask, autograd."""
    q, k, v = (t.detach().double().requires_grad_(do is not None) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    keep = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq) if causal else None
    out = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=keep, scale=scale
    )
    result = {"out": out.detach()}
    if do is not None:
        result.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), do.double()), strict=True))
    return result


@pytest.mark.parametrize(("nq", "nk"), [(17, 17), (9, 40), (1, 33)], ids=["square", "q<k", "one-query"])
@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_reference_matches_an_independent_float64_attention(nq, nk, causal):
    q, k, v, do = inputs(2, 4, 2, nq, nk, 16)
    ref = correctness.reference(q, k, v, causal=causal, sm_scale=0.3, do=do)
    expected = sdpa64(q, k, v, causal, 0.3, do)
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(ref[name], expected[name], rtol=1e-10, atol=1e-12, msg=name)
    s = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(2, 1)) * 0.3
    if causal:
        s = s.masked_fill(~torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq), float("-inf"))
    torch.testing.assert_close(ref["lse"], torch.logsumexp(s, -1))


def test_rows_that_see_no_key_give_zero_output_and_gradients():
    q, k, v, do = inputs(1, 2, 2, 6, 3, 8)
    ref = correctness.reference(
        q, k, v, causal=True, do=do
    )  # bottom-right: the first 3 of 6 rows see nothing
    assert (ref["out"][:, :, :3] == 0).all() and (ref["dq"][:, :, :3] == 0).all()
    assert torch.isinf(ref["lse"][:, :, :3]).all() and torch.isfinite(ref["lse"][:, :, 3:]).all()


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_seqlens_k_is_each_sequence_alone_with_its_queries_last(causal):
    # decode: 3 new queries over KV caches of 5 and 9 valid tokens in a 12-slot buffer
    q, k, v, do = inputs(2, 4, 2, 3, 12, 8)
    lengths = [5, 9]
    ref = correctness.reference(q, k, v, causal=causal, do=do, seqlens_k=torch.tensor(lengths))
    for b, n in enumerate(lengths):
        alone = correctness.reference(
            q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=causal, do=do[b : b + 1]
        )
        for name in ("out", "lse", "dq"):
            torch.testing.assert_close(ref[name][b : b + 1], alone[name])
        for name in ("dk", "dv"):
            torch.testing.assert_close(ref[name][b : b + 1, :, :n], alone[name])
            assert (ref[name][b, :, n:] == 0).all()  # padding gets no gradient


def test_blocked_rows_give_the_same_result(monkeypatch):
    q, k, v, do = inputs(1, 2, 1, 50, 50, 8)
    whole = correctness.reference(q, k, v, causal=True, do=do)
    monkeypatch.setattr(correctness, "_BLOCK_ELEMS", 50 * 7)  # 7 query rows per block
    blocked = correctness.reference(q, k, v, causal=True, do=do)
    for name in whole:
        torch.testing.assert_close(blocked[name], whole[name], rtol=1e-12, atol=1e-12)


def test_budget_is_twice_torchs_low_precision_error_plus_eps():
    q, k, v, _ = inputs(1, 2, 2, 64, 64, 32, torch.float16)
    ref = correctness.reference(q, k, v, causal=False)
    low = correctness.reference(q, k, v, causal=False, dtype=torch.float16)
    kernel = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
    verdict = correctness.compare({"out": kernel}, ref, low, torch.float16)
    err, budget = verdict.errors["out"]
    rel = lambda x: ((x.double() - ref["out"]).norm() / ref["out"].norm()).item()  # noqa: E731
    assert err == pytest.approx(rel(kernel)) and budget == pytest.approx(2 * rel(low["out"]) + 1e-4)
    assert verdict.ok and verdict.rel_err == err and verdict.err_budget == budget


def test_a_wrong_scale_and_a_nan_fail_with_the_reason():
    q, k, v, _ = inputs(1, 2, 2, 32, 32, 16, torch.float32)
    wrong = F.scaled_dot_product_attention(q, k, v, scale=2 * 16**-0.5)
    verdict = correctness.verify({"out": wrong}, q, k, v, causal=False)
    assert (
        not verdict.ok and verdict.reason.startswith("out error") and "exceeds the budget" in verdict.reason
    )
    right = F.scaled_dot_product_attention(q, k, v)
    assert correctness.verify({"out": right}, q, k, v, causal=False).ok
    poisoned = right.clone()
    poisoned[0, 1, 5, 3] = float("nan")
    verdict = correctness.verify({"out": poisoned}, q, k, v, causal=False)
    assert not verdict.ok and "NaN" in verdict.reason


def test_one_eps_table_for_every_dtype():
    assert set(correctness.EPS) == {"fp16", "bf16", "fp32", "fp8"} == set(DTYPES)
    assert correctness.dtype_name(torch.bfloat16) == "bf16" and correctness.dtype_name("fp16") == "fp16"
    # about a quarter of the unit roundoff for the 16-bit formats; fp32 admits TF32 tensor-core math
    assert correctness.EPS["fp16"] == pytest.approx(2**-11 / 4, rel=0.25)
    assert correctness.EPS["bf16"] == pytest.approx(2**-8 / 4, rel=0.25)
    with pytest.raises(ValueError, match="no error budget"):
        correctness.dtype_name(torch.float64)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_the_sweep_and_the_tests_reach_the_same_verdict(mode):
    """A kernel cannot pass its tests and be "wrong" in a sweep: check() (the sweep) and verify() (the tests)
    compute the same errors and budgets from the same tensors."""
    case = Case("x", 2, 4, 2, 24, 40, 16, "fp16", True, mode)
    q, k, v, do = inputs(2, 4, 2, 24, 40, 16, torch.float16)
    grad = mode != "fwd"
    ins = [t.clone().float().requires_grad_(grad) for t in (q, k, v)]
    keep = torch.ones(24, 40, dtype=torch.bool).tril(16)
    out = F.scaled_dot_product_attention(
        ins[0], ins[1].repeat_interleave(2, 1), ins[2].repeat_interleave(2, 1), attn_mask=keep
    )
    results = {"out": out.detach().half()}
    if grad:
        results.update(
            zip(
                ("dq", "dk", "dv"), (g.half() for g in torch.autograd.grad(out, ins, do.float())), strict=True
            )
        )
    sweep = correctness.check(case, {"q": q, "k": k, "v": v, "do": do}, results, "cpu")
    tests = correctness.verify(results, q, k, v, causal=True, do=do if grad else None)
    assert sweep.ok and tests.ok
    assert sweep.rel_err == pytest.approx(tests.rel_err) and sweep.err_budget == pytest.approx(
        tests.err_budget
    )
    assert tests.describe() in sweep.ref
    assert not math.isnan(sweep.rel_err)


def test_reference_is_immune_to_nan_poisoned_empty(monkeypatch):
    # The kernel tests fill everything torch.empty / empty_like returns with NaN; the oracle must not care.
    real_empty, real_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: real_like(*a, **kw).fill_(float("nan")))
    q, k, v, do = inputs(1, 2, 2, 9, 9, 8)
    for dtype in (None, torch.float16):
        ref = correctness.reference(q, k, v, causal=True, do=do, dtype=dtype)
        assert all(torch.isfinite(ref[n]).all() for n in ("out", "dq", "dk", "dv"))

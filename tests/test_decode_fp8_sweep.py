"""`--kv-dtype fp8` end to end: the option, the Case key, the e4m3 cache the worker makes, the oracle's FP8-cache
budget (engine/correctness.py, KV_FP8_EPS), the byte model's 1 byte per K/V element and the providers that refuse
an FP8 cache (--device cpu here, cuda on the GPU machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashbench.analysis.runs import load_run
from flashbench.cli.app import main
from flashbench.engine import correctness, fp8
from flashbench.gpu import environment
from flashbench.models import io_model
from flashbench.report import build
from flashbench.results.rows import read_rows
from flashbench.spec.cases import Case

DEVICE = "cuda" if environment.gpu_present()[0] else "cpu"
DECODE = ["--device", DEVICE, "--batch", "3", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"]
DECODE += ["--dtype", "fp16", "--causal", "true", "--mode", "fwd", "--seq", "48", "--seq-q", "1"]
DECODE += ["--config", str(Path(__file__).with_name("fast_measure.toml"))]


def test_the_default_kv_dtype_leaves_every_key_unchanged():
    case = Case("triton-decode", 3, 4, 2, 1, 48, 32, "fp16", True, "fwd")
    assert case.key == "triton-decode|b3|h4|kv2|q1|k48|d32|fp16|causal|fwd" and not case.serving
    fp8_cache = Case("triton-decode", 3, 4, 2, 1, 48, 32, "fp16", True, "fwd", kv_dtype="fp8")
    assert fp8_cache.key == case.key + "|kvfp8" and fp8_cache.serving and fp8_cache.kv_elem_bytes == 1


def test_the_byte_model_counts_one_byte_per_kv_element():
    # B=3, H=4, Hkv=2, Nq=1, N=48, d=32, fp16 q: Q and O 3*4*32*2 = 768 bytes each; K and V 2*3*2*48*32 bytes
    # in e4m3 (18432), twice that in fp16.
    shape = (3, 4, 2, 1, 48, 32, 2)
    assert io_model.compulsory_traffic(*shape, "fwd", kv_elem_bytes=1).total == 768 + 768 + 18432
    assert io_model.compulsory_traffic(*shape, "fwd").total == 768 + 768 + 2 * 18432
    decode = io_model.hbm_traffic("decode", *shape, True, "fwd", kv_elem_bytes=1, seqlens_k=[48, 24, 1])
    assert decode.total == 768 + 768 + 2 * 2 * 32 * (48 + 24 + 1)


def _budget_case(kv_dtype: str) -> Case:
    return Case("x", 2, 4, 2, 1, 200, 64, "fp16", True, "fwd", kv_dtype=kv_dtype)


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 1, 64, generator=gen).half()
    (k8, ks), (v8, vs) = (fp8.quantize(torch.randn(2, 2, 200, 64, generator=gen), 2) for _ in range(2))
    return {"q": q, "k": fp8.dequantize(k8, ks), "v": fp8.dequantize(v8, vs), "do": None}


def test_the_fp8_cache_budget_admits_e4m3_compute_and_refuses_a_wrong_scale():
    inputs = _inputs()
    q8, qs = fp8.quantize(inputs["q"], 2)
    # An FP8 tensor-core decode: q rounded to e4m3 (scaled per KV head), P to e4m3 (FA3's numerics), bf16 out.
    e4m3_math = correctness.reference(
        fp8.dequantize(q8, qs), inputs["k"], inputs["v"], causal=True, dtype=torch.float8_e4m3fn
    )["out"]
    verdict = correctness.check(_budget_case("fp8"), inputs, {"out": e4m3_math}, "cpu")
    assert verdict.ok, verdict.reason
    assert verdict.err_budget > correctness.KV_FP8_EPS > verdict.rel_err > 1e-2  # e4m3-sized, not zero
    # The same output under the bf16-cache budget is wrong: the extra term is what admits it.
    assert not correctness.check(_budget_case(""), inputs, {"out": e4m3_math}, "cpu").ok
    exact = correctness.reference(inputs["q"], inputs["k"], inputs["v"], causal=True)["out"]
    wrong_scale = correctness.check(_budget_case("fp8"), inputs, {"out": exact * 1.1}, "cpu")
    assert not wrong_scale.ok and "exceeds the budget" in wrong_scale.reason


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8kv") / "run"
    args = ["sweep", *DECODE, "--providers", "triton-decode,naive", "--kv-dtype", "same,fp8"]
    assert main([*args, "--kv-layout", "contiguous,paged", "--out", str(out)]) == 0
    return out


def test_fp8_cache_rows_are_ok_within_the_budget_and_other_providers_refuse(fp8_run):
    rows = {(r.provider, r.kv_layout, r.kv_dtype): r for r in read_rows(fp8_run)}
    for layout in ("contiguous", "paged"):
        row = rows[("triton-decode", layout, "fp8")]
        assert row.status == "ok", row.reason
        assert row.rel_err is not None and row.rel_err <= row.err_budget, row.key
        assert row.err_budget > correctness.KV_FP8_EPS and row.key.endswith("|kvfp8")
        assert rows[("triton-decode", layout, "")].status == "ok"
    refused = rows[("naive", "contiguous", "fp8")]
    assert refused.status == "unsupported" and "it is not run on a dequantized copy" in refused.reason


def test_fp8_cache_rows_carry_half_the_kv_bytes_and_their_own_variant(fp8_run):
    frame = load_run(fp8_run).frame
    ok = frame[(frame["provider"] == "triton-decode") & (frame["kv_layout"] == "contiguous")]
    by_store = ok.set_index("kv_dtype")
    q_and_o = 2 * 3 * 4 * 1 * 32 * 2
    kv = by_store.loc["", "model_bytes_compulsory"] - q_and_o
    assert by_store.loc["fp8", "model_bytes_compulsory"] == q_and_o + kv / 2
    assert by_store.loc["fp8", "variant"].endswith("fp8 KV") and "fp8" not in by_store.loc["", "variant"]


def test_the_decode_report_names_the_fp8_cache(fp8_run):
    text = build(fp8_run, fmt="md").split("### Decode")[1]
    assert "| contiguous, fp8 |" in text and "| paged16, fp8 |" in text and "| contiguous |" in text

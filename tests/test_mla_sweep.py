"""MLA decode cases (Case.head_dim_v, DeepSeek's absorbed form): their keys, the models' FLOPs and bytes by
hand-computed examples, the roofline's bound moving with the query rows, and `flashbench sweep` over them end to
end (--device cpu here: the bundled kernel through Triton's interpreter, the torch baselines on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.gpu import environment
from flashbench.models import io_model, memory, roofline
from flashbench.models.flops import attention_flops, case_flops
from flashbench.providers import builtin
from flashbench.providers.registry import get
from flashbench.results.rows import read_rows
from flashbench.spec.cases import Case
from flashbench.spec.config import load_spec

V3 = dict(heads=128, kv_heads=1, head_dim=576, head_dim_v=512)  # DeepSeek-V3's MLA decode


def _case(**kw) -> Case:
    base = dict(provider="triton-mla", batch=2, seq_q=1, seq_k=4096, dtype="bf16", causal=True, mode="fwd")
    return Case(**{**base, **V3, **kw})


def test_a_latent_case_keys_apart_and_every_other_key_is_unchanged():
    plain = Case("triton-decode", 2, 32, 8, 1, 4096, 128, "bf16", True, "fwd")
    assert plain.key == "triton-decode|b2|h32|kv8|q1|k4096|d128|bf16|causal|fwd"  # no latent part
    mla = _case()
    assert mla.key == "triton-mla|b2|h128|kv1|q1|k4096|d576|bf16|causal|fwd|latent512"
    assert mla.latent and mla.value_dim == 512 and not plain.latent and plain.value_dim == 128


def test_the_latent_key_part_follows_the_packed_and_kv_cache_parts_and_the_models_take_all_three():
    assert _case(min_seq=256, kv_dtype="fp8").key.endswith("|min256|kvfp8|latent512")
    # An e4m3 latent cache: 1 byte per cached element, Q and O as before (bf16).
    floor = io_model.compulsory_traffic(2, 128, 1, 1, 4096, 576, 2, "fwd", kv_elem_bytes=1, head_dim_v=512)
    assert floor.read == 2 * 4096 * 576 + 294_912 and floor.write == 262_144
    # Documents of 3 and 2 tokens, causal: 6 + 3 pairs, each 2 * (576 + 512) FLOPs per query head.
    assert attention_flops(1, 4, 5, 5, 576, True, "fwd", documents=(3, 2), head_dim_v=512) == 9 * 4 * 2176
    packed = Case(
        "flex", 1, 4, 1, 64, 64, 576, "bf16", True, "fwd", seqlens="random", min_seq=8, head_dim_v=512
    )
    assert "packed documents have no MLA path" in get("flex").info.supports(packed, "cuda")


def test_flops_of_the_absorbed_form_by_hand():
    # Per (query head, key) pair: q k^T over 576 dims (2 * 576) and P v over 512 (2 * 512) = 2176 FLOPs.
    # Batch 2, 128 heads, one query over 4096 keys (causal bottom-right: all of them): 2 * 128 * 4096 * 2176.
    assert case_flops(_case()) == 2 * 128 * 4096 * 2176 == 2_281_701_376
    # Nq = 2, causal: query 0 sees 4095 keys, query 1 all 4096.
    assert case_flops(_case(seq_q=2)) == 2 * 128 * (4095 + 4096) * 2176
    # Without head_dim_v the convention is unchanged: 4 * d per pair.
    assert attention_flops(1, 8, 1, 100, 128, False, "fwd") == 4 * 8 * 100 * 128


def test_bytes_of_the_absorbed_form_read_the_latent_cache_once():
    # bf16, batch 2, 4096 keys: the cache is 2 * 4096 * 576 * 2 = 9,437,184 B, read once (V lies within it);
    # Q 2 * 128 * 576 * 2 = 294,912 B; O 2 * 128 * 512 * 2 = 262,144 B.
    shape = (2, 128, 1, 1, 4096, 576, 2)
    floor = io_model.compulsory_traffic(*shape, "fwd", head_dim_v=512)
    assert floor.read == 9_437_184 + 294_912 and floor.write == 262_144
    one = io_model.hbm_traffic("decode", *shape, True, "fwd", head_dim_v=512)
    assert one.total == floor.total
    # 4 splits: each writes its fp32 partial (512 dims + its LSE) per query row, and the combine reads it back.
    split = io_model.hbm_traffic(
        "decode", *shape, True, "fwd", head_dim_v=512, blocks=io_model.Blocks(splits=4)
    )
    assert split.total - floor.total == 2 * 4 * (2 * 128) * (512 + 1) * 4
    # A fused kernel over K and V as two tensors (flex, SDPA efficient) reads V's 512 dims again.
    flash = io_model.hbm_traffic("flash", *shape, True, "fwd", head_dim_v=512)
    assert flash.read == 294_912 + 9_437_184 + 2 * 4096 * 512 * 2
    # Ragged: only the valid keys count (100 + 300 tokens of 1152 B).
    ragged = io_model.compulsory_traffic(*shape, "fwd", seqlens_k=[100, 300], head_dim_v=512)
    assert ragged.read == 400 * 1152 + 294_912
    # The decode family's workspace above the inputs is O: 512 dims per row.
    assert memory.predicted_peak_bytes("decode", *shape, True, "fwd", head_dim_v=512) == 262_144
    # SDPA math folds the 128 heads into query rows: no per-head fp32 copy of the 9.4 MB cache (that would be
    # 2 x 128 x 9.4 MB x 2, the GQA figure), only its own fp32 upcast of K and V.
    math_mla = memory.predicted_peak_bytes("sdpa-math", *shape, True, "fwd", head_dim_v=512)
    assert math_mla < 60e6 < 4e9 < memory.predicted_peak_bytes("sdpa-math", *shape, True, "fwd")


def test_the_bound_moves_from_memory_to_compute_with_the_query_rows():
    # An H100-like roof: 989 TFLOP/s bf16, 3.35 TB/s: ridge 295 FLOP/B. At 32k keys the intensity is about
    # 2176 * H * Nq / 1152 = 1.89 H Nq: 242 at 128 heads x 1 query (memory-bound), 484 at 2 (compute-bound).
    peaks, bw = {"bf16": 989e12}, 3.35e12
    bound = {}
    for nq in (1, 2):
        p = roofline.predict(
            "decode", 64, 128, 1, nq, 32768, 576, "bf16", 2, True, "fwd", peaks, bw, head_dim_v=512
        )
        bound[nq] = (p.bound, p.model.ai)
    assert bound[1][0] == "memory-bound" and 235 < bound[1][1] < 242
    assert bound[2][0] == "compute-bound" and 470 < bound[2][1] < 484


def test_mla_preset_holds_deepseek_v3_shapes():
    spec = load_spec(preset="mla")
    assert (
        spec.heads == (128,)
        and spec.kv_heads == (1,)
        and spec.head_dim == (576,)
        and spec.head_dim_v == (512,)
    )
    assert spec.seq_q == (1, 2) and set(spec.kv_layout) == {"contiguous", "paged"} and spec.dtype == ("bf16",)
    assert "triton-mla" in spec.providers and "flash-mla" in spec.providers


def test_providers_declare_what_they_take():
    mla = _case(seq_q=2, kv_layout="paged", page_size=64, seqlens="random", seed=1)
    assert get("triton-mla").info.supports(mla, "cuda") is None
    assert get("flex").info.supports(mla, "cuda") is None
    assert "takes no paged" in get("sdpa-math").info.supports(mla, "cuda")
    assert get("sdpa-efficient").info.supports(_case(), "cuda") is None
    assert "takes no MLA latent cache" in get("sdpa-flash").info.supports(_case(), "cuda")
    assert "takes no MLA latent cache" in get("triton-decode").info.supports(
        _case(provider="triton-decode"), "cuda"
    )
    plain = Case("triton-mla", 1, 16, 1, 1, 64, 128, "bf16", True, "fwd")
    assert "takes MLA cases only" in get("triton-mla").info.supports(plain, "cuda")
    assert "one latent KV head" in get("triton-mla").info.supports(_case(kv_heads=2, heads=128), "cuda")
    assert get("flash-mla").info.latent == "only" and "flash_mla" in builtin.packages()


def test_a_paged_latent_case_pools_the_cache_once_and_v_views_its_prefix():
    import torch

    from flashbench.engine import kv_cache

    case = _case(batch=2, heads=4, head_dim=24, head_dim_v=16, seq_k=40, kv_layout="paged", page_size=16)
    case = Case(**{**case.to_dict(), "seqlens": "random", "seed": 1})
    k = torch.randn(2, 1, 40, 24)
    pool, v, cache = kv_cache.build(case, k, k[..., :16])
    assert pool.shape[1:] == (1, 16, 24) and v.shape == (*pool.shape[:3], 16)
    assert v.data_ptr() == pool.data_ptr() and v.stride() == pool.stride()  # a view, not a second pool
    back = kv_cache.unpage(pool, cache["block_table"], case.kv_lengths(), 40)
    for b, n in enumerate(case.kv_lengths()):
        assert torch.equal(back[b, :, :n], k[b, :, :n])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_over_a_paged_latent_cache_matches_the_oracle():
    # The flex provider's serving path (providers/serving.py) on CPU, with eager flex_attention standing in for
    # the compiled one the provider runs on CUDA: the pool flattened for torch's PagedAttention, V with its own dims.
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from flashbench.engine import kv_cache
    from flashbench.engine.correctness import reference
    from flashbench.providers import serving

    case = Case("flex", 2, 4, 1, 2, 40, 24, "fp32", True, "fwd", "paged", 16, "random", 1, "", head_dim_v=16)
    k, q = torch.randn(2, 1, 40, 24), torch.randn(2, 4, 2, 24)
    pool, v, cache = kv_cache.build(case, k, k[..., :16])
    call = serving.flex_kv_cache(case, "cpu", flex_attention, True, 24**-0.5, None)
    out = call(*call.prepare(q, pool, v, **cache)[:3])
    ref = reference(q, k, k[..., :16], causal=True, seqlens_k=case.kv_lengths())["out"]
    assert out.shape == (2, 4, 2, 16) and torch.allclose(out.double(), ref, atol=1e-5)


# --- the sweep, end to end ---------------------------------------------------------------------------------

DEVICE = "cuda" if environment.gpu_present()[0] else "cpu"
# Scaled down on the CPU (the kernel takes any power-of-two latent and rotary dims): 16 heads, 64 + 16 dims.
MLA = ["--device", DEVICE, "--batch", "2", "--heads", "16", "--kv-heads", "1", "--head-dim", "80"]
MLA += ["--head-dim-v", "64", "--dtype", "fp16" if DEVICE == "cpu" else "bf16", "--causal", "true"]
MLA += ["--mode", "fwd", "--seq", "40", "--config", str(Path(__file__).with_name("fast_measure.toml"))]


@pytest.fixture(scope="module")
def mla_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mla") / "run"
    args = ["sweep", *MLA, "--providers", "triton-mla,sdpa-math,naive", "--seq-q", "1,2"]
    args += [
        "--kv-layout",
        "contiguous,paged",
        "--seqlens",
        "uniform,random",
        "--seed",
        "3",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    return out


def test_mla_sweep_rows_are_ok_within_budget_or_refused_with_reasons(mla_run):
    rows = read_rows(mla_run)
    assert len(rows) == 3 * 2 * 4 and all(r.head_dim_v == 64 for r in rows)
    for row in rows:
        serving = row.kv_layout == "paged" or row.seqlens == "random"
        if row.provider == "naive":
            assert row.status == "unsupported" and "takes no MLA latent cache" in row.reason
        elif row.provider == "sdpa-math" and serving:
            assert row.status == "unsupported" and "takes no" in row.reason
        else:
            assert row.status == "ok", (row.key, row.reason)
            assert row.rel_err is not None and row.rel_err <= row.err_budget, row.key
            lengths = Case.from_dict(row.__dict__).kv_lengths()
            pairs = sum(n - (row.seq_q - 1 - i) for n in lengths for i in range(row.seq_q))
            assert row.flops == 2 * 16 * (80 + 64) * pairs  # the absorbed form's FLOPs, by hand
    mla = [r for r in rows if r.provider == "triton-mla"]
    assert len(mla) == 8 and all(r.family == "decode" and "num_splits" in r.kernel_config for r in mla)

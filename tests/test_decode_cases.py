"""Serving cases as Cases: keys, ragged lengths, the plan's expansion, the page pool, the providers' refusals."""

from __future__ import annotations

import pytest
import torch

from flashbench.engine import kv_cache
from flashbench.providers import builtin, registry
from flashbench.results.rows import read_rows
from flashbench.spec.cases import Case, kv_lengths
from flashbench.spec.config import load_spec
from flashbench.spec.plan import expand, input_bytes

FIXTURE = "tests/fixtures/synthetic-h100"


def _old_key(c: Case) -> str:
    """Case.key as it was before the serving fields existed."""
    mask = "causal" if c.causal else "full"
    return (
        f"{c.provider}|b{c.batch}|h{c.heads}|kv{c.kv_heads}|q{c.seq_q}|k{c.seq_k}|d{c.head_dim}|{c.dtype}|{mask}"
        f"|{c.mode}"
    )


def test_training_case_keys_are_unchanged_and_baselines_still_join():
    rows = read_rows(FIXTURE)
    assert rows and all(r.key == _old_key(r.case) for r in rows)
    assert all(r.kv_layout == "contiguous" and r.seqlens == "uniform" for r in rows)
    case = Case("triton", 4, 16, 16, 1024, 1024, 128, "bf16", True, "fwd")
    assert case.key == "triton|b4|h16|kv16|q1024|k1024|d128|bf16|causal|fwd" and not case.serving


def test_serving_fields_append_key_parts_only_when_not_default():
    base = ("triton-decode", 2, 32, 8, 1, 4096, 128, "bf16", True, "fwd")
    assert Case(*base).key.endswith("|fwd")
    assert Case(*base, "paged", 16).key.endswith("|fwd|paged16")
    assert Case(*base, "contiguous", 0, "random", 3).key.endswith("|fwd|random-s3")
    assert Case(*base, "paged", 64, "random", 0).key.endswith("|fwd|paged64|random-s0")
    keys = {Case(*base, lay, p, s, seed).key for lay, p in (("contiguous", 0), ("paged", 16)) for s, seed in
            (("uniform", 0), ("random", 0), ("random", 1))}  # fmt: skip
    assert len(keys) == 6


def test_random_lengths_are_deterministic_in_range_and_seeded():
    first = kv_lengths(64, 1, 1000, "random", seed=0)
    assert first == kv_lengths(64, 1, 1000, "random", seed=0)  # the same draw every time, every machine
    assert first != kv_lengths(64, 1, 1000, "random", seed=1)
    assert all(500 <= n <= 1000 for n in first) and len(set(first)) > 10
    assert kv_lengths(3, 1, 1000) == (1000, 1000, 1000)
    assert kv_lengths(2, 1, 1, "random") == (1, 1)
    # pinned: Python's random.Random seeded with a string is the same on every platform and version
    assert kv_lengths(4, 1, 8192, "random", seed=0) == (4373, 8048, 7619, 7316)
    ragged = Case("x", 4, 8, 8, 1, 8192, 64, "fp16", True, "fwd", seqlens="random")
    assert ragged.kv_lengths() == (4373, 8048, 7619, 7316)


def test_plan_expands_serving_variants_with_page_and_seed_only_where_they_apply():
    spec = load_spec(
        overrides={
            "seq": "1024,4096",
            "seq_q": "1,4",
            "tokens": 8192,
            "heads": 8,
            "kv_heads": 2,
            "causal": "true",
            "kv_layout": "contiguous,paged",
            "page_size": "16,64",
            "seqlens": "uniform,random",
            "seed": 5,
        }
    )
    cases = expand(spec, ["triton-decode"])
    variants = {(c.kv_layout, c.page_size, c.seqlens, c.seed) for c in cases}
    assert variants == {
        (lay, p, s, seed)
        for lay, p in (("contiguous", 0), ("paged", 16), ("paged", 64))
        for s, seed in (("uniform", 0), ("random", 5))
    }
    assert {(c.seq_q, c.seq_k, c.batch) for c in cases} == {
        (q, n, 8192 // n) for q in (1, 4) for n in (1024, 4096)
    }
    assert len(cases) == 6 * 4 and len({c.key for c in cases}) == len(cases)
    runs = [c.seq_k for c in cases]  # sequence length innermost, ascending (the OOM skips rely on it)
    assert all(runs[i] < runs[i + 1] for i in range(0, len(runs), 2))


def test_input_bytes_count_the_page_pool_of_a_paged_case():
    contiguous = Case("p", 2, 4, 2, 1, 100, 64, "fp16", True, "fwd")
    paged = Case("p", 2, 4, 2, 1, 100, 64, "fp16", True, "fwd", "paged", 16)
    pool = 2 * (2 * 7 * 16) * 2 * 64 * 2  # K and V: 2 sequences x 7 pages of 16 tokens, 2 heads, d 64, fp16
    assert input_bytes(paged) == input_bytes(contiguous) + pool


def test_page_pool_holds_each_sequence_in_shuffled_pages():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(3, 2, 50, 8, generator=gen)
    v = torch.randn(3, 2, 50, 8, generator=gen)
    lengths = (50, 1, 17)
    k_pool, v_pool, table = kv_cache.page(k, v, lengths, 16, seed=7)
    assert k_pool.shape == (4 + 1 + 2, 2, 16, 8) and table.shape == (3, 4) and table.dtype == torch.int32
    used = [table[b, : -(-n // 16)].tolist() for b, n in enumerate(lengths)]
    assert sorted(p for pages in used for p in pages) == list(range(7))  # every pool page used once
    assert used != [[0, 1, 2, 3], [4], [5, 6]]  # shuffled
    for pool, src in ((k_pool, k), (v_pool, v)):
        back = kv_cache.unpage(pool, table, lengths, 50)
        for b, n in enumerate(lengths):
            assert torch.equal(back[b, :, :n], src[b, :, :n])
    assert kv_cache.page(k, v, lengths, 16, seed=7)[2].tolist() == table.tolist()  # deterministic


def test_probe_inputs_draw_the_sweeps_caches_for_a_decode_shape():
    """kv_cache.probe_inputs (tools/decode_timeline.py, tools/ncu_stalls.py): bf16 q and a full cache, seeded; e4m3
    with its scales; paged over the same keys."""
    q, k, v, cache = kv_cache.probe_inputs(2, 4, 2, 40, None, "bf16", "cpu")
    assert q.shape == (2, 4, 1, 128) and q.dtype == torch.bfloat16 and k.shape == v.shape == (2, 2, 40, 128)
    assert cache["cache_seqlens"].tolist() == [40, 40] and set(cache) == {"cache_seqlens"}
    assert torch.equal(kv_cache.probe_inputs(2, 4, 2, 40, None, "bf16", "cpu")[1], k)  # seeded
    _, k8, v8, cache = kv_cache.probe_inputs(2, 4, 2, 40, 16, "fp8", "cpu")
    assert k8.dtype == v8.dtype == torch.float8_e4m3fn and k8.shape == (6, 2, 16, 128)
    assert set(cache) == {"cache_seqlens", "block_table", "k_scale", "v_scale"} and cache[
        "k_scale"
    ].shape == (2, 2)
    back = kv_cache.unpage(k8.view(torch.uint8), cache["block_table"], (40, 40), 40)
    assert torch.equal(back, kv_cache.quantize(k, v)[0].view(torch.uint8))  # the e4m3 cache, paged


def test_cache_keywords_for_each_kind_of_case():
    k = v = torch.zeros(2, 1, 40, 8)
    train = Case("p", 2, 1, 1, 40, 40, 8, "fp32", True, "fwd")
    assert kv_cache.build(train, k, v) == (k, v, {})
    ragged = Case("p", 2, 1, 1, 1, 40, 8, "fp32", True, "fwd", seqlens="random")
    _, _, cache = kv_cache.build(ragged, k, v)
    assert cache["cache_seqlens"].tolist() == list(ragged.kv_lengths()) and set(cache) == {"cache_seqlens"}
    paged = Case("p", 2, 1, 1, 1, 40, 8, "fp32", True, "fwd", "paged", 16)
    kp, _, cache = kv_cache.build(paged, k, v)
    assert kp.shape == (6, 1, 16, 8) and cache["cache_seqlens"].tolist() == [40, 40]
    assert cache["block_table"].shape == (2, 3)


@pytest.fixture(scope="module")
def infos() -> dict[str, registry.ProviderInfo]:
    builtin.load()
    return {name: registry.get(name).info for name in registry.names()}


DECODE = ("triton-decode", 2, 32, 8, 1, 4096, 128, "bf16", True, "fwd")


@pytest.mark.parametrize(
    ("provider", "extra", "reason"),
    [
        ("naive", ("paged", 16), "naive takes no paged KV cache (takes contiguous)"),
        ("sdpa-flash", ("contiguous", 0, "random"), "sdpa-flash takes no per-sequence KV lengths"),
        ("triton", ("paged", 16, "random"), "triton takes no paged KV cache"),
        ("flex", ("paged", 16, "random"), None),
        ("triton-decode", ("paged", 16, "random"), None),
        ("flash-attn-kvcache", ("paged", 256, "random"), None),
    ],
)
def test_providers_declare_which_kv_caches_they_take(infos, provider, extra, reason):
    case = Case(provider, *DECODE[1:], *extra)
    assert infos[provider].supports(case, "cuda") == reason or reason in infos[provider].supports(
        case, "cuda"
    )


def test_decode_kernel_refuses_training_shapes_and_backwards(infos):
    info = infos["triton-decode"]
    assert "at most 64 query tokens" in info.supports(Case(*DECODE[:4], 4096, 4096, *DECODE[6:]), "cpu")
    assert "no backward" in info.supports(Case(*DECODE[:-1], "fwd+bwd"), "cpu")
    paged_bwd = Case("flex", *DECODE[1:-1], "fwd+bwd", "paged", 16)
    assert "forward only" in infos["flex"].supports(paged_bwd, "cuda")
    assert infos["naive"].supports(Case("naive", *DECODE[1:]), "cpu") is None  # contiguous, uniform: runs


@pytest.mark.parametrize("layout", [("contiguous", 0), ("paged", 16)], ids=["contiguous", "paged"])
def test_flex_over_a_ragged_kv_cache_matches_the_reference(layout):
    # The `flex` provider's masks and page mapping, run by FlexAttention uncompiled on the CPU (the provider
    # itself compiles, on CUDA): ragged lengths, Nq = 2, causal, GQA, pages shuffled over the pool.
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention
    import warnings

    from flashbench.engine.correctness import verify
    from flashbench.providers import serving

    case = Case("flex", 3, 4, 2, 2, 70, 32, "fp32", True, "fwd", *layout, "random", 1)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, n, 32, generator=gen) for h, n in ((4, 2), (2, 70), (2, 70)))
    call = serving.flex_kv_cache(case, "cpu", flex_attention, True, 32**-0.5, lambda: None)
    kc, vc, cache = kv_cache.build(case, k, v)
    qc, kc, vc, cache = call.prepare(q, kc, vc, **cache)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncompiled FlexAttention warns that it is slow
        out = call(qc, kc, vc, **cache)
    verdict = verify({"out": out}, q, k, v, causal=True, seqlens_k=case.kv_lengths())
    assert verdict.ok, verdict.reason


def test_an_oom_skips_larger_n_of_the_same_kv_cache_only():
    from flashbench.engine.runner import _Skips
    from flashbench.results.rows import OOM, Row

    skips = _Skips()
    skips.note(Row.for_case(Case(*DECODE[:5], 4096, *DECODE[6:], "paged", 16), OOM))
    assert "ran out of memory at N=4096" in skips.reason(Case(*DECODE[:5], 8192, *DECODE[6:], "paged", 16))
    assert skips.reason(Case(*DECODE[:5], 8192, *DECODE[6:])) is None  # contiguous: its own memory
    assert skips.reason(Case(*DECODE[:4], 4, 8192, *DECODE[6:], "paged", 16)) is None  # other query tokens


def test_a_torn_row_names_its_case_when_the_case_fields_were_written(tmp_path):
    import json

    from flashbench.results.rows import Row, _torn_case_key

    paged = Row.for_case(Case(*DECODE, "paged", 16, "random", 3), "ok")
    line = json.dumps(paged.to_dict(), separators=(",", ":"))  # as rows.jsonl writes it
    assert _torn_case_key(line[: line.index('"reason"')]) == paged.key
    assert _torn_case_key(line[: line.index('"seqlens"')]) is None  # cut among the serving fields: unknown
    legacy = {k: v for k, v in Row.for_case(Case(*DECODE), "ok").to_dict().items()}
    for name in ("kv_layout", "page_size", "seqlens", "seed"):
        del legacy[name]  # a row written before the serving fields existed
    text = json.dumps(legacy, separators=(",", ":"))
    assert _torn_case_key(text[: text.index('"reason"')]) == Case(*DECODE).key

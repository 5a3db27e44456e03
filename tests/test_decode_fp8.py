"""flash_decode over an e4m3 KV cache (kernels/decode.py, FP8 cache) against the one oracle, and its refusals.

The cache is made as the sweep makes it (engine/fp8.quantize: per-(sequence, KV head) amax scales) or with one
scale for the whole tensor; the float64 reference reads the real values the cache stands for (stored value x
scale, engine/fp8.dequantize). The kernel is held to the strict rule, err <= 2 * err(torch in q's dtype over
those values) + EPS[q's dtype], which is tighter than the sweep's FP8-cache budget (correctness.KV_FP8_EPS, for
providers that also round q or P to e4m3): the kernel converts each stored value exactly to fp16, runs both dots
in fp16 (q at a power-of-two scale per row, P times 2^15) and applies the scales in fp32. Slots past each length
and unused pages hold e4m3 NaN (0x7f), so a read of one shows in the output. On the CPU machine the kernel runs
through Triton's interpreter (fp16 q; V converted with .to, not the GPU's inline asm).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_decode
from flashbench.kernels import decode as decode_module
from tiers import smoke

from flashbench.engine import fp8, kv_cache
from flashbench.engine.correctness import compare, reference

HAS_CUDA = torch.cuda.is_available()
E4M3_NAN = 0x7F  # float8_e4m3fn's NaN bit pattern

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty


def _poison_past(cache: torch.Tensor, lengths: list[int]) -> None:
    """e4m3 NaN in every slot at or past each sequence's length (contiguous [B, Hkv, N, D], in place)."""
    raw = cache.view(torch.uint8)
    for b, n in enumerate(lengths):
        raw[b, :, n:] = E4M3_NAN


class Fp8Problem:
    """Random fp16/bf16 q and an e4m3 cache [B, Hkv, Nmax, D] with its scales; `scales` is "per-head"
    (engine/fp8.quantize's [B, Hkv]), "tensor" (one 0-d scale for K, one for V) or "none" (values already in
    e4m3's range, scale 1)."""

    def __init__(self, heads, kv_heads, nq, d, lengths, *, scales="per-head", dtype=torch.float16, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.lengths, self.dtype, self.refs = list(lengths), dtype, {}
        b, n = len(lengths), max(lengths)
        self.q = torch.randn(b, heads, nq, d, generator=gen).to(dtype)
        # K with a spread of magnitudes per (sequence, head): a scale that lands on the wrong head shows.
        spread = torch.logspace(-1, 1, b * kv_heads).view(b, kv_heads, 1, 1)
        k = torch.randn(b, kv_heads, n, d, generator=gen) * spread
        v = torch.randn(b, kv_heads, n, d, generator=gen) * spread.flip(0)
        if scales == "per-head":
            (self.k8, self.ks), (self.v8, self.vs) = fp8.quantize(k, kv_heads), fp8.quantize(v, kv_heads)
        elif scales == "tensor":
            self.ks, self.vs = (t.abs().amax() / fp8.E4M3_MAX for t in (k, v))
            self.k8, self.v8 = (k / self.ks).to(torch.float8_e4m3fn), (v / self.vs).to(torch.float8_e4m3fn)
        else:
            self.ks = self.vs = None
            self.k8, self.v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        one = torch.ones(b, kv_heads)
        self.k_real = fp8.dequantize(self.k8, one if self.ks is None else self.ks.expand(b, kv_heads))
        self.v_real = fp8.dequantize(self.v8, one if self.vs is None else self.vs.expand(b, kv_heads))
        for t in (self.k8, self.v8):
            _poison_past(t, self.lengths)
        self.seqlens = torch.tensor(lengths, dtype=torch.int32)

    def run(self, device, *, paged=False, page=16, causal=True, **kw) -> torch.Tensor:
        k, v, cache = self.k8, self.v8, {"cache_seqlens": self.seqlens}
        if paged:  # the sweep's own pool (engine/kv_cache.page): pages shuffled, each sequence's own only
            k, v, table = kv_cache.page(k, v, tuple(self.lengths), page, seed=len(self.lengths))
            cache["block_table"] = table
        scales = {"k_scale": self.ks, "v_scale": self.vs}
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        cache = {name: to(t) for name, t in {**cache, **scales}.items()}
        return flash_decode(self.q.to(device), k.to(device), v.to(device), causal=causal, **cache, **kw)

    def check(self, out: torch.Tensor, *, causal=True) -> None:
        """Hold `out` to the strict budget over the cache's real values, sequence by sequence."""
        out = out.cpu()
        assert out.shape == self.q.shape and out.dtype == self.dtype
        assert torch.isfinite(out).all(), (
            "NaN/Inf in the output (an unwritten element, or a poisoned slot read)"
        )
        if causal not in self.refs:  # the references, once per problem and mask (the CPU's bf16 is slow)
            kw = dict(causal=causal, seqlens_k=self.lengths)
            self.refs[causal] = (
                reference(self.q, self.k_real, self.v_real, **kw)["out"],
                reference(self.q, self.k_real, self.v_real, **kw, dtype=self.dtype)["out"],
            )
        ref, low = self.refs[causal]
        for b, n in enumerate(self.lengths):
            one = slice(b, b + 1)
            verdict = compare({"out": out[one]}, {"out": ref[one]}, {"out": low[one]}, self.dtype)
            assert verdict.ok, f"seq {b} (L={n}): {verdict.reason} ({verdict.describe()})"


HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (3, 1)}


@smoke(lambda heads, **_: heads == "gqa" or not HAS_CUDA)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("scales", ["per-head", "tensor", "none"])
@pytest.mark.parametrize("heads", list(HEADS))
def test_contiguous_e4m3_cache_matches_reference(device, heads, scales, num_splits):
    # Lengths 1, 37 (prime) and 80 (whole blocks); 2 queries, so with L = 1 a causal row sees no key.
    prob = Fp8Problem(*HEADS[heads], 2, 64, [1, 37, 80], scales=scales, seed=num_splits)
    prob.check(prob.run(device, num_splits=num_splits))
    prob.check(prob.run(device, causal=False, num_splits=num_splits), causal=False)


@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("scales", ["per-head", "tensor"])
def test_paged_e4m3_cache_matches_reference(device, scales, page):
    prob = Fp8Problem(4, 2, 1, 64, [1, 17, 47, 64], scales=scales, seed=page)
    prob.check(prob.run(device, paged=True, page=page, num_splits=2))
    prob.check(prob.run(device, paged=True, page=page, num_splits=1))


def test_paged_e4m3_blocks_across_pages_match_reference(device):
    # 64-key blocks over 16-token pages: each block's rows from four pages; lengths end mid-page, on a page and
    # mid-block, with and without splits.
    prob = Fp8Problem(4, 2, 1, 64, [1, 15, 16, 47, 100, 150], seed=5)
    for splits in (1, 3):
        prob.check(prob.run(device, paged=True, page=16, num_splits=splits, config={"BLOCK_N": 64}))


@smoke(lambda page, **_: page is None or not HAS_CUDA)
@pytest.mark.parametrize("full", [0, 1], ids=["masked", "full-blocks"])
@pytest.mark.parametrize("page", [None, 16])
def test_e4m3_cache_warps_stream_their_own_keys(device, page, full):
    """At d = 128 with at most 16 query rows a tile, each warp streams its own keys of every block and the streams
    merge after the loop (decode.fp8_streams). 32-key blocks of 2 warps: 16 keys a stream. Lengths where the last
    block's second stream sees no key (17), where a sequence's only key leaves most streams empty (1), whole blocks
    (64) and a partial one (100); 3 queries of 4 heads per KV head (12 rows); causal and not; 1 and 3 splits; the
    whole blocks without the key mask or not (FULL_BLOCKS)."""
    prob = Fp8Problem(8, 2, 3, 128, [1, 17, 64, 100], seed=12)
    tile = {"BLOCK_N": 32, "num_warps": 2, "FULL_BLOCKS": full}
    for splits in (1, 3):
        for causal in (True, False):
            out = prob.run(
                device, paged=page is not None, page=page or 16, causal=causal, num_splits=splits, config=tile
            )
            launch = decode_module.last_decode_config()
            assert launch is not None and launch["streams"] == 2
            prob.check(out, causal=causal)


def test_fp8_streams_where_a_warp_holds_its_own_rows():
    """One stream per warp at d = 128 with 16 rows a tile and at least 16 keys a warp; else one."""
    streams = decode_module.fp8_streams
    for tile in (*decode_module.FP8_TILES.values(), *decode_module.FP8_DEEP_TILES.values()):
        assert streams(tile, 16, 128) == tile["num_warps"] == 2
        assert streams(tile, 32, 128) == 1  # 32 rows: a warp's accumulator would spill
        assert streams(tile, 16, 64) == 1  # other head dims: the bf16 tiles' loop
    assert streams({"BLOCK_N": 128, "num_warps": 4, "num_stages": 3}, 16, 128) == 4
    assert streams(decode_module.INTERPRET_CONFIG, 16, 128) == 1  # 16 keys over 4 warps


def test_scale_rows_broadcast_over_sequences(device):
    # k_scale [1, Hkv] (one scale per KV head for every sequence) and v_scale [B, 1] (one per sequence).
    prob = Fp8Problem(4, 2, 1, 32, [20, 33], scales="none", seed=5)
    prob.ks = torch.tensor([[0.5, 2.0]])
    prob.vs = torch.tensor([[3.0], [0.25]])
    prob.k_real = prob.k8.float().nan_to_num(0.0) * prob.ks[:, :, None, None]
    prob.v_real = prob.v8.float().nan_to_num(0.0) * prob.vs[:, :, None, None]
    prob.check(prob.run(device, num_splits=2))


def test_the_scales_are_applied_per_sequence_and_head(device):
    # The check fails where the scales are swapped between the KV heads: the scales do reach the output.
    prob = Fp8Problem(4, 2, 1, 32, [40, 40], seed=6)
    good = prob.run(device, num_splits=2)
    prob.check(good)
    prob.ks = prob.ks.flip(1).contiguous()
    with pytest.raises(AssertionError, match="exceeds the budget"):
        prob.check(prob.run(device, num_splits=2))


def test_query_rows_far_apart_in_magnitude(device):
    # The dots run in fp16, each query row at its own power-of-two scale: rows whose largest |q| is tiny,
    # ordinary, or (bf16 q, on the GPU) far past fp16's 65504 all meet the budget, none overflows to Inf / NaN.
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    tops = (2.0**-20, 1.0, 2.0**40) if dtype == torch.bfloat16 else (2.0**-12, 1.0, 6.0e4)
    prob = Fp8Problem(3, 1, 2, 64, [37, 80], dtype=dtype, seed=9)
    q = prob.q.float()
    prob.q = (q / q.abs().amax(dim=(2, 3), keepdim=True) * torch.tensor(tops).view(1, 3, 1, 1)).to(dtype)
    prob.check(prob.run(device, num_splits=2))


def test_fp16_cache_takes_no_scales_and_runs_as_before(device):
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 1, 32, generator=gen).half().to(device) for _ in range(3))
    out = flash_decode(q, k, v)
    ref, low = (
        reference(q.cpu(), k.cpu(), v.cpu(), causal=True, dtype=t)["out"] for t in (None, torch.float16)
    )
    assert compare({"out": out.cpu()}, {"out": ref}, {"out": low}, torch.float16).ok
    with pytest.raises(KernelUnsupported, match="k_scale and v_scale are for a float8_e4m3fn cache"):
        flash_decode(q, k, v, k_scale=torch.ones(1, device=device))


def _bad_cases(device):
    prob = Fp8Problem(4, 2, 1, 32, [10, 20], seed=8)
    q, k8, v8 = (t.to(device) for t in (prob.q, prob.k8, prob.v8))
    lens, ks = prob.seqlens.to(device), prob.ks.to(device)
    return {
        "fp32 q": ((q.float(), k8, v8, lens), {}, "an e4m3 cache needs e4m3 k_cache and v_cache under fp16"),
        "v not e4m3": ((q, k8, v8.half(), lens), {}, "an e4m3 cache needs e4m3 k_cache and v_cache"),
        "fp64 scale": ((q, k8, v8, lens), {"k_scale": ks.double()}, "k_scale must be a float32 torch.Tensor"),
        "list scale": ((q, k8, v8, lens), {"v_scale": [1.0]}, "v_scale must be a float32 torch.Tensor"),
        "scale shape": ((q, k8, v8, lens), {"k_scale": ks[:, :1].expand(2, 3)}, "does not broadcast to [batch=2"),
        "scale 3-D": ((q, k8, v8, lens), {"k_scale": ks[None]}, "k_scale of shape (1, 2, 2) does not broadcast"),
        "scale device": ((q, k8, v8, lens), {"k_scale": ks.to("meta")}, "k_scale must be a float32 torch.Tensor on"),
        "scale zero": ((q, k8, v8, lens), {"v_scale": ks * 0}, "v_scale holds a value that is not finite and > 0"),
        "scale nan": ((q, k8, v8, lens), {"k_scale": ks * math.nan}, "k_scale holds a value that is not finite"),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(_bad_cases("cpu")))
def test_bad_e4m3_inputs_raise_kernel_unsupported(device, case):
    args, kw, message = _bad_cases(device)[case]
    with pytest.raises(KernelUnsupported, match=re.escape(message)):
        flash_decode(*args, **kw)


@pytest.mark.gpu
@smoke(lambda nq, **_: nq == 1)
@pytest.mark.parametrize("nq", [1, 4])
@pytest.mark.parametrize("page", [None, 16, 256])
@pytest.mark.parametrize("heads", [(32, 8), (32, 32)], ids=["gqa", "mha"])
def test_gpu_e4m3_cache_bf16_q_matches_reference(heads, page, nq):
    lengths = [1, 257, 1000, 2045, 2048, 3]
    prob = Fp8Problem(*heads, nq, 128, lengths, dtype=torch.bfloat16, seed=11)
    for splits in (None, 1, 7):
        for _ in range(2):  # Triton's JIT launch, then the cached compiled kernel
            prob.check(prob.run("cuda", paged=page is not None, page=page or 16, num_splits=splits))


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16])
def test_gpu_e4m3_cache_past_the_fill_runs_one_split(page):
    """More unsplit programs than FP8_FILL per SM (MHA 32/32 at batch 18 on 132 SMs: 576): FP8_TILES' tile, one
    split."""
    lengths = [1, 64, 300, 511, 512, 129] * 3
    prob = Fp8Problem(32, 32, 1, 128, lengths, dtype=torch.bfloat16, seed=5)
    prob.check(prob.run("cuda", paged=page is not None, page=page or 16))
    launch = decode_module.last_decode_config()
    assert launch is not None and launch["num_splits"] == 1
    tile = decode_module.FP8_TILES[page is not None]
    assert {key: launch[key] for key in tile} == tile


def test_fp8_plan_splits_until_each_sm_runs_its_fill_of_programs():
    """fp8_plan on 132 SMs, at the decode-fp8 preset's program counts (batch x KV heads) and at batch 1."""
    plan, tiles, deep = decode_module.fp8_plan, decode_module.FP8_TILES, decode_module.FP8_DEEP_TILES
    # GQA 32/8 at batch 16 / 8 / 4 (128 / 64 / 32 programs): split to 512 programs, 4 per SM, either layout
    for programs, splits in [(128, 4), (64, 8), (32, 16)]:
        for paged in (False, True):
            assert plan(programs, 131072 // (programs // 8), paged, 132) == (tiles[paged], splits)
    # MHA at batch 8 / 4 (256 / 128 programs): to 512 as well
    assert plan(256, 16384, True, 132) == (tiles[True], 2)
    assert plan(128, 32768, False, 132) == (tiles[False], 4)
    # MHA at batch 16 (512 programs): within the fill unsplit; batch 18 (576) past it: one split either way
    for programs in (512, 576):
        assert plan(programs, 8192, False, 132) == (tiles[False], 1)
        assert plan(programs, 8192, True, 132) == (tiles[True], 1)
    # the fill's splits would keep fewer than FP8_FILL_SPLIT_KEYS keys: the deep plan, 2 per SM. GQA 32/8 at
    # batch 1 (8 programs): as many splits as keep FP8_MIN_SPLIT_KEYS keys each (16 at 8k); at 32k the fill's 30,
    # then 32 in the same wave (16 key blocks a split, not 18)
    assert plan(8, 8192, True, 132) == (deep[True], 8192 // decode_module.FP8_MIN_SPLIT_KEYS)
    assert plan(8, 32768, False, 132) == (deep[False], 32)
    # MHA at batch 8 over a 1024-key cache: 256 programs, no split of 2048 keys: the deep tile unsplit
    assert plan(256, 1024, False, 132) == (deep[False], 1)
    # a short cache: one split
    assert plan(1, 256, False, 132) == (deep[False], 1)

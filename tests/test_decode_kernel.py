"""flash_decode (kernels/decode.py) against the one oracle (flashbench.engine.correctness), sequence by sequence.

Budget: correctness.compare's rule, err(kernel, ref64) <= 2 * err(torch in the input dtype, ref64) + EPS[dtype]
(relative Frobenius norm), held for every sequence of the batch on its own (a wrong short sequence cannot hide
behind a long one): the references cover the whole batch (seqlens_k: each sequence's valid keys) and compare()
is applied to each sequence's slice of them; fp32 is also held to FP32_IEEE (the kernel's IEEE fp32 dots). Every float tensor made with torch.empty starts as NaN (the output and the split partials), and every
cache slot the kernel must not read (past a sequence's length, unused pages) holds NaN too.

On the CPU machine the kernel runs through Triton's interpreter (fp16, fp32: its bf16 tl.dot is wrong), where
key blocks are 16 wide so that small shapes cross many blocks and split boundaries; the `gpu` tests add bf16
and larger shapes.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_decode
from flashbench.kernels import decode as decode_module
from tiers import smoke

from flashbench.engine.correctness import compare, reference

HAS_CUDA = torch.cuda.is_available()
HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (3, 1)}
# The kernel's fp32 path uses IEEE fp32 dots, which the shared budget does not require (it admits TF32 for other
# providers): held here to this bound on top of it, as tests/test_kernels.py holds the other bundled kernels.
FP32_IEEE = 1e-6


pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty, no autotuning


def make(shape, dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


class Problem:
    """Random q and a contiguous cache [B, Hkv, Nmax, D] (NaN past each length), optionally also as a shuffled
    page pool with unused pages (NaN) and -1 in the page-table entries past each length."""

    def __init__(self, heads, kv_heads, nq, d, lengths, dtype, *, nmax=None, page=None, seed=0, device="cpu"):
        gen = torch.Generator().manual_seed(seed)
        self.lengths, self.dtype, self.device, self.refs = list(lengths), dtype, device, {}
        b, nmax = len(lengths), nmax or max(lengths)
        self.q = make((b, heads, nq, d), dtype, gen)
        self.k = make((b, kv_heads, nmax, d), dtype, gen)
        self.v = make((b, kv_heads, nmax, d), dtype, gen)
        for t in (self.k, self.v):
            for i, n in enumerate(lengths):
                t[i, :, n:] = float("nan")
        self.seqlens = torch.tensor(lengths, dtype=torch.int32)
        self.table = None
        if page is not None:
            blocks = -(-nmax // page)
            need = [-(-n // page) for n in lengths]
            pool = sum(need) + 3  # three pages nobody uses
            order = torch.randperm(pool, generator=gen).tolist()
            self.k_pool = torch.full((pool, kv_heads, page, d), float("nan"), dtype=dtype)
            self.v_pool = torch.full_like(self.k_pool, float("nan"))
            self.table = torch.full((b, blocks), -1, dtype=torch.int32)
            for i, n in enumerate(lengths):
                for p in range(need[i]):
                    slot = order.pop()
                    self.table[i, p] = slot
                    end = min(n, (p + 1) * page) - p * page
                    self.k_pool[slot, :, :end] = self.k[i, :, p * page : p * page + end]
                    self.v_pool[slot, :, :end] = self.v[i, :, p * page : p * page + end]

    def run(self, *, paged=False, causal=True, lengths=True, **kw) -> torch.Tensor:
        to = lambda t: None if t is None else t.to(self.device)  # noqa: E731
        k, v = (self.k_pool, self.v_pool) if paged else (self.k, self.v)
        table = self.table if paged else None
        return flash_decode(
            to(self.q), to(k), to(v), to(self.seqlens) if lengths else None, to(table), causal=causal, **kw
        )

    def check(self, out: torch.Tensor, *, causal=True, sm_scale=None) -> None:
        """Hold `out` to the error budget against float64, sequence by sequence."""
        out = out.cpu()
        assert out.shape == self.q.shape and out.dtype == self.dtype
        assert torch.isfinite(out).all(), (
            "NaN/Inf in the output (an unwritten element, or a poisoned key read)"
        )
        scale = 1.0 / math.sqrt(self.q.shape[-1]) if sm_scale is None else sm_scale
        if (causal, scale) not in self.refs:  # the references, once per problem and mask
            kw = dict(causal=causal, sm_scale=scale, seqlens_k=self.lengths)
            self.refs[causal, scale] = (
                reference(self.q, self.k, self.v, **kw)["out"],
                reference(self.q, self.k, self.v, **kw, dtype=self.dtype)["out"],
            )
        ref, lowp = self.refs[causal, scale]
        for b, n in enumerate(self.lengths):
            one = slice(b, b + 1)
            verdict = compare({"out": out[one]}, {"out": ref[one]}, {"out": lowp[one]}, self.dtype)
            assert verdict.ok, f"seq {b} (L={n}): {verdict.reason} ({verdict.describe()})"
            if self.dtype == torch.float32:  # fp32 inputs take IEEE dots (no TF32): stricter than the budget
                err = verdict.errors["out"][0]
                assert err <= FP32_IEEE, (
                    f"seq {b} (L={n}): fp32 error {err:.2e} > {FP32_IEEE:.0e}: a TF32 dot?"
                )


def test_the_check_fails_on_one_wrong_short_sequence():
    # Sequence 0 holds 2 keys, sequence 1 holds 200: an error in the short one is small next to the whole
    # batch's norm, and the per-sequence budget still catches it.
    prob = Problem(2, 1, 1, 32, [2, 200], torch.float32, seed=15)
    good = reference(prob.q, prob.k, prob.v, causal=True, seqlens_k=prob.lengths)["out"].float()
    prob.check(good)
    bad = good.clone()
    bad[0, 0, 0, 0] += 0.05
    with pytest.raises(AssertionError, match="seq 0"):
        prob.check(bad)


def test_poisoning_is_active():
    assert torch.empty(3).isnan().all() and torch.empty_like(torch.ones(2)).isnan().all()


# ---------------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU: fp16 and fp32, small shapes
# ---------------------------------------------------------------------------------------------------------


# On CUDA the query rows per KV head (heads x nq), the mask and the dtype each select a compile: the smoke tier runs
# GQA and MQA in fp16 there (the gpu tests add bf16 at serving shapes); the interpreter runs every case.
@smoke(lambda dtype, heads, **_: dtype == torch.float16 and heads != "mha" or not HAS_CUDA)
@pytest.mark.parametrize("nq", [1, 4])
@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_contiguous_ragged_lengths_match_reference(device, dtype, causal, heads, nq):
    # Lengths 1 (a lone key, and for nq=4 rows that see nothing), 37 (prime), 80 (whole blocks); 3 splits
    # leave the length-1 sequence two empty splits.
    prob = Problem(*HEADS[heads], nq, 64, [1, 37, 80], dtype, nmax=83, seed=nq, device=device)
    prob.check(prob.run(causal=causal, num_splits=3), causal=causal)


@smoke(lambda dtype, **_: dtype == torch.float16 or not HAS_CUDA)
@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_paged_shuffled_pages_match_reference(device, dtype, causal, page, nq):
    # Lengths off the page grid (1, 17, 47) and on it (64); pages shuffled in a pool with unused NaN pages.
    prob = Problem(4, 2, nq, 64, [1, 17, 47, 64], dtype, nmax=70, page=page, seed=page + nq, device=device)
    prob.check(prob.run(paged=True, causal=causal, num_splits=2), causal=causal)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 64, None])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_forced_num_splits_match_reference(device, paged, num_splits):
    # 64 splits: more than the 7 key blocks of the longest sequence, so most splits are empty.
    prob = Problem(4, 2, 2, 64, [1, 31, 97], torch.float16, page=16, seed=3, device=device)
    prob.check(prob.run(paged=paged, num_splits=num_splits))


def test_heuristic_splits_a_long_lone_sequence(device):
    # One sequence, one KV head, 64 interpreter key blocks of 16 on the interpreter's 8 "SMs": 8 splits would
    # fill them, MIN_SPLIT_KEYS caps them at 4; the case below runs with 4.
    capacity = 4 * decode_module.MIN_SPLIT_KEYS
    block_n = decode_module.INTERPRET_CONFIG["BLOCK_N"]
    assert decode_module.choose_num_splits(1, capacity, block_n, decode_module.INTERPRET_SMS) == 4
    prob = Problem(2, 1, 1, 32, [capacity - 5], torch.float32, nmax=capacity, seed=4, device=device)
    prob.check(prob.run())


def test_choose_num_splits_fills_the_gpu_within_bounds():
    choose, min_keys, top = (
        decode_module.choose_num_splits,
        decode_module.MIN_SPLIT_KEYS,
        decode_module.MAX_SPLITS,
    )
    n32k = 32768
    assert choose(106, n32k, 128, 132) == 1 and choose(1000, n32k, 128, 132) == 1  # 80% of the SMs already
    assert choose(8, n32k, 128, 132) == 16  # batch 1, 8 KV heads: 128 programs, 16 blocks each
    assert choose(8, 8192, 128, 132) == 16  # 4 blocks each; 15 splits would leave some with 5
    assert choose(32, n32k, 128, 132) == 4  # batch 4: 128 of 132
    assert choose(128, 8192, 128, 132) == 1 and choose(128, 8192, 128, 2 * 132) == 2  # contiguous, paged
    assert choose(8, 8 * min_keys, 128, 132) == 8  # capped so that every split keeps MIN_SPLIT_KEYS keys
    assert choose(8, min_keys - 1, 128, 132) == 1  # short cache: no split
    assert 0.9 * top <= choose(1, 1 << 30, 128, 132) <= top  # never past MAX_SPLITS
    assert choose(8, n32k, 64, 132) == 16  # MLA at 32k keys, batch 4: 16 splits of 32 blocks, not 15 of 35
    for programs in range(1, 140):
        # waves x blocks per split: the fewest splits within 10% of the cheapest, then the cheapest in as many
        # waves (the fewest on a tie)
        s = choose(programs, n32k, 128, 132)
        waves = [math.ceil(programs * n / 132) for n in range(1, top + 1)]
        cost = [w * math.ceil(256 / n) for n, w in enumerate(waves, start=1)]
        first = next(n for n, c in enumerate(cost, start=1) if 0.9 * c <= min(cost))
        same = [n for n in range(first, top + 1) if waves[n - 1] == waves[first - 1]]
        ok = s in same and all((cost[s - 1], s) <= (cost[n - 1], n) for n in same)
        assert programs >= 0.8 * 132 or ok


def test_split_counters_are_zero_after_a_call_and_results_repeat(device):
    prob = Problem(4, 2, 2, 32, [9, 70], torch.float16, page=16, seed=13, device=device)
    first = prob.run(paged=True, num_splits=3)
    here = str(torch.zeros(0, device=device).device)  # "cuda:0", not "cuda"
    counters = [t for (dev, _), (t, _) in decode_module._SCRATCH.items() if dev == here]
    assert counters and all((t == 0).all() for t in counters)
    assert torch.equal(prob.run(paged=True, num_splits=3), first)  # on CUDA: the cached compiled kernel


@pytest.mark.parametrize("d", [32, 128])
def test_head_dims_match_reference(device, d):
    prob = Problem(4, 2, 2, d, [5, 40], torch.float16, page=16, seed=d, device=device)
    prob.check(prob.run(num_splits=2))
    prob.check(prob.run(paged=True, num_splits=1))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_rows_that_see_no_key_are_zero(device, num_splits):
    # Causal, 4 queries: with L = 1 queries 0..2 see no key; with L = 2, queries 0..1.
    prob = Problem(2, 1, 4, 32, [1, 2, 10], torch.float32, seed=5, device=device)
    out = prob.run(num_splits=num_splits).cpu()
    assert (out[0, :, :3] == 0).all() and (out[1, :, :2] == 0).all()
    assert (out[0, :, 3] != 0).any() and (out[1, :, 2:] != 0).any()
    prob.check(out)


def test_many_query_rows_take_several_row_blocks(device):
    # MQA, 24 query heads x 3 queries = 72 rows > MAX_ROWS: two row blocks, each reading K/V. At d = 32 the
    # combine holds 4 splits of 64 rows per step, so 7 splits (7 blocks of 16 keys at L = 100) take two steps,
    # both with keys: the running max and its rescaling across steps count.
    assert 24 * 3 > decode_module.MAX_ROWS
    assert decode_module.COMBINE_ELEMENTS // (64 * 32) == 4
    prob = Problem(24, 1, 3, 32, [20, 100], torch.float32, page=16, seed=6, device=device)
    prob.check(prob.run(num_splits=7))
    prob.check(prob.run(paged=True, causal=False, num_splits=1), causal=False)


@pytest.mark.parametrize("sm_scale", [0.3, -0.2])
def test_default_lengths_strided_q_and_explicit_scale(device, sm_scale):
    prob = Problem(4, 2, 3, 64, [50, 50], torch.float16, seed=7, device=device)
    q = (
        prob.q.transpose(1, 2).contiguous().transpose(1, 2)
    )  # [B, Hq, Nq, D] view with Hq, Nq swapped in memory
    assert not q.is_contiguous()
    out = flash_decode(q.to(device), prob.k.to(device), prob.v.to(device), sm_scale=sm_scale, num_splits=2)
    prob.check(out, sm_scale=sm_scale)


def test_forced_block_n_matches_reference(device):
    prob = Problem(4, 2, 1, 64, [3, 130, 200], torch.float16, page=32, seed=8, device=device)
    prob.check(prob.run(num_splits=2, config={"BLOCK_N": 64}))
    prob.check(prob.run(paged=True, num_splits=2, config={"BLOCK_N": 64}))


@pytest.mark.parametrize("page, block_n", [(16, 64), (64, 16)], ids=["4-pages-a-block", "4-blocks-a-page"])
def test_paged_blocks_across_pages_and_pages_across_blocks_match_reference(device, page, block_n):
    # A key block's rows come from BLOCK_N / PAGE pages, or a page's rows from PAGE / BLOCK_N blocks, the later
    # ones starting mid-page. Lengths end mid-page (1, 15, 47, 150), on a page (16) and mid-block; a block's rows
    # past the last page (150 of a 160-key table) are masked; 3 splits start some splits mid-page.
    lengths = [1, 15, 16, 47, 100, 150]
    prob = Problem(4, 2, 2, 32, lengths, torch.float16, nmax=160, page=page, seed=page, device=device)
    for splits in (1, 3):
        prob.check(prob.run(paged=True, num_splits=splits, config={"BLOCK_N": block_n}))


def test_paged_pool_with_a_page_stride_off_the_16_element_grid_matches_reference(device):
    # Pools that are views with 3 spare elements after each page: a page stride that is no multiple of 16,
    # which the kernel must not take for one (on CUDA its page offsets then claim no alignment).
    prob = Problem(4, 2, 1, 32, [5, 40, 70], torch.float16, page=16, seed=21, device=device)
    for name in ("k_pool", "v_pool"):
        pool = getattr(prob, name)
        pages, size = pool.shape[0], pool[0].numel()
        spread = torch.full((pages, size + 3), float("nan"), dtype=pool.dtype, device=device)
        spread[:, :size] = pool.reshape(pages, size)
        setattr(prob, name, spread[:, :size].view(pool.shape))
    assert prob.k_pool.stride(0) == prob.v_pool.stride(0) == 16 * 2 * 32 + 3
    prob.check(prob.run(paged=True, num_splits=2))


def test_validate_false_skips_the_check_and_the_kernel_clamps_lengths(device):
    prob = Problem(2, 1, 1, 32, [30, 40], torch.float32, seed=9, device=device)
    q, k, v = (t.to(device) for t in (prob.q, prob.k, prob.v))
    too_long = torch.tensor([30, 99], dtype=torch.int32, device=device)
    with pytest.raises(KernelUnsupported, match="past the cache capacity 40"):
        flash_decode(q, k, v, too_long)
    prob.check(flash_decode(q, k, v, too_long, validate=False))  # read as 40, the capacity


# ---------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------


def _bad_cases(device):
    prob = Problem(4, 2, 1, 64, [10, 20], torch.float16, nmax=32, page=16, seed=10)
    q, k, v, kp, vp = (t.to(device) for t in (prob.q, prob.k, prob.v, prob.k_pool, prob.v_pool))
    lens, table = prob.seqlens.to(device), prob.table.to(device)
    pool = kp.shape[0]
    return {
        "k 3-D": ((q, k[0], v, lens), "k_cache must be a 4-D torch.Tensor"),
        "dtype mix": ((q, k.float(), v, lens), "dtypes differ"),
        "int dtype": ((q.long(), k.long(), v.long(), lens), "dtype torch.int64 unsupported"),
        "k != v": ((q, k, v[:, :, :20], lens), "shapes differ"),
        "head dim": ((q[..., :48], k[..., :48], v[..., :48], lens), "head_dim 48 unsupported"),
        "head dim mismatch": ((q[..., :32], k, v, lens), "head_dim differs"),
        "heads": ((q[:, :3], k, v, lens), "do not divide query heads 3"),
        "batch": ((q[:1], k, v), "batch differs"),
        "lens dtype": ((q, k, v, lens.long()), "cache_seqlens must be an int32 torch.Tensor or None"),
        "lens shape": ((q, k, v, lens[:1]), "cache_seqlens must be [batch=2]"),
        "lens negative": ((q, k, v, -lens), "negative length"),
        "lens too long": ((q, k, v, lens + 30), "past the cache capacity 32"),
        "table dtype": ((q, kp, vp, lens, table.long()), "block_table must be an int32 torch.Tensor"),
        "table shape": ((q, kp, vp, lens, table[:1]), "block_table must be [2, blocks]"),
        "page past pool": (
            (q, kp, vp, lens, torch.where(table == table[1, 1], pool, table)),
            f"outside the pool of {pool}",
        ),
        "page negative": (
            (q, kp, vp, lens, torch.where(table == table[0, 0], -1, table)),
            "page -1, outside",
        ),
        "page size 8": ((q, kp[:, :, :8], vp[:, :, :8], lens, table), "page size 8"),
        "page size 24": (
            (q, *(torch.cat([t, t[:, :, :8]], 2) for t in (kp, vp)), lens, table),
            "power of two",
        ),
        "paged past capacity": ((q, kp, vp, lens + 20, table), "past the cache capacity 32"),
        "device": ((q, k, v, lens.to("meta")), "different devices"),
        "causal": ((q, k, v, lens, None, 1), "causal must be a bool"),
        "scale": ((q, k, v, lens, None, True, float("inf")), "sm_scale must be a finite number"),
        "splits 0": ((q, k, v, lens, None, True, None, 0), "num_splits must be an int in 1..128"),
        "splits big": ((q, k, v, lens, None, True, None, 129), "num_splits must be an int in 1..128"),
        "not a tensor": ((q.tolist(), k, v), "q must be a 4-D torch.Tensor"),
    }


@pytest.mark.parametrize("case", list(_bad_cases("cpu")))
def test_bad_inputs_raise_kernel_unsupported(device, case):
    args, message = _bad_cases(device)[case]
    with pytest.raises(KernelUnsupported, match=re.escape(message)):
        flash_decode(*args)


def test_full_blocks_is_an_e4m3_tiles_key(device):
    # FULL_BLOCKS acts in the loop whose warps stream their own keys, an e4m3 cache's (test_decode_fp8.py); over an
    # fp16 cache it is refused by name, not ignored.
    prob = Problem(4, 2, 1, 64, [10, 20], torch.float16, seed=10, device=device)
    with pytest.raises(
        KernelUnsupported, match=r"config keys must be among \['BLOCK_N', 'num_stages', 'num_warps'\]"
    ):
        prob.run(config={"FULL_BLOCKS": 1})


def test_kernel_unsupported_is_a_value_error():
    assert issubclass(KernelUnsupported, ValueError)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter's refusal")
def test_bf16_refused_under_the_interpreter():
    prob = Problem(2, 1, 1, 32, [4], torch.float16)
    with pytest.raises(KernelUnsupported, match="bf16 under the Triton interpreter"):
        flash_decode(prob.q.bfloat16(), prob.k.bfloat16(), prob.v.bfloat16())


# ---------------------------------------------------------------------------------------------------------
# GPU: bf16 and fp16, serving-sized shapes
# ---------------------------------------------------------------------------------------------------------


GPU_LAYOUTS = {  # heads, kv heads, page size (None: contiguous)
    "gqa-contig": (32, 8, None),
    "gqa-page16": (32, 8, 16),
    "gqa-page256": (32, 8, 256),
    "mha-page64": (32, 32, 64),
    "mqa-contig": (16, 1, None),
    "mqa-page16": (16, 1, 16),
}


@pytest.mark.gpu
# smoke: every layout in bf16 with one new token, and fp16 on the contiguous GQA cache
@smoke(lambda dtype, layout, nq: dtype == torch.bfloat16 and nq == 1 or layout == "gqa-contig")
@pytest.mark.parametrize("nq", [1, 4])
@pytest.mark.parametrize("layout", list(GPU_LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_ragged_batch_matches_reference(dtype, layout, nq):
    heads, kv_heads, page = GPU_LAYOUTS[layout]
    lengths = [1, 257, 1000, 2045, 2048, 3]
    prob = Problem(heads, kv_heads, nq, 128, lengths, dtype, nmax=2048, page=page, seed=11, device="cuda")
    for splits in (None, 1, 7, 128):  # each twice: Triton's JIT launch, then the cached compiled kernel
        for _ in range(2):
            prob.check(prob.run(paged=page is not None, num_splits=splits))
    prob.check(prob.run(paged=page is not None, causal=False), causal=False)


@pytest.mark.gpu
@smoke(lambda d: d in (64, 256))  # d = 128 runs in the tests above; 256 takes a smaller tile (GPU_CONFIGS)
@pytest.mark.parametrize("d", decode_module.DECODE_HEAD_DIMS)
def test_gpu_head_dims_match_reference(d):
    prob = Problem(8, 2, 2, d, [100, 2048, 777], torch.bfloat16, page=32, seed=12, device="cuda")
    prob.check(prob.run())
    prob.check(prob.run(paged=True, num_splits=1))


@pytest.mark.gpu
def test_gpu_forced_config_too_large_is_refused():
    # d = 256 with 128-key blocks in 3 stages needs 274 KB of shared memory (an H100 has 227 KB per block).
    prob = Problem(4, 2, 1, 256, [300], torch.bfloat16, seed=14, device="cuda")
    with pytest.raises(KernelUnsupported, match="does not fit this GPU"):
        prob.run(num_splits=2, config={"BLOCK_N": 128, "num_warps": 4, "num_stages": 3})


def test_timeline_probe_fits_the_kernel(tmp_path):
    """tools/decode_timeline.py instruments a copy of kernels/decode.py by its lines: the copy must still take
    every edit and import, and a kernel that lost one of those lines is named, not silently timed uninstrumented."""
    import importlib.util

    from scripts_helpers import ROOT, load_script

    tool = load_script("tools/decode_timeline.py")
    source = (ROOT / "kernels/decode.py").read_text()
    copy = tool.instrumented_source(source)
    for word in ("t_start", "t_loop", "t_stored", "t_moved", "t_end", "_TIMES[0]"):
        assert word in copy
    path = tmp_path / "decode_copy.py"
    path.write_text(copy.replace("from .common import", "from flashbench.kernels.common import"))
    module_spec = importlib.util.spec_from_file_location("decode_copy", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    assert module._TIMES == [None] and "Times" in module._decode.arg_names
    with pytest.raises(ValueError, match="no longer has this line once"):
        tool.instrumented_source(source.replace("    seen = l_i > 0.0\n", "    seen = l_i != 0.0\n"))


def test_timeline_summary_reads_the_programs_words():
    """tools/decode_timeline.py's numbers from a call's timer words (ns): loop times, the last program's tail, the
    programs per SM and how far apart the SMs' last loop ends lie (SM 5's two programs end at 5 and 6 us)."""
    import torch
    from scripts_helpers import load_script

    tool = load_script("tools/decode_timeline.py")
    t = torch.zeros(6, tool.WORDS, dtype=torch.int64)
    t[:, 1] = torch.tensor([1000, 2000, 3000, 4000, 5000, 6000])  # loop ends; every program starts at 0
    t[:, 2] = t[:, 1] + 500  # ends
    t[:, 3] = torch.tensor([0, 0, 1, 1, 5, 5])  # SMs
    t[:, 4] = t[:, 1] + 100  # partial stored
    t[:, 5] = t[:, 1] + 300  # counter moved
    row = tool.summary(t, 6, 2)
    assert (row["loop_min_us"], row["loop_median_us"], row["loop_max_us"]) == (1.0, 3.5, 6.0)
    assert row["span_us"] == 6.5 and row["programs_per_sm"] == [2]
    assert row["tail_store_us"] == 0.1 and row["tail_counter_us"] == 0.2 and row["tail_combine_us"] == 0.2
    assert row["sm_loop_end_us"] == [2.0, 4.0, 6.0]

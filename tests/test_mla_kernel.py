"""flash_mla_decode (kernels/mla.py) against the one oracle (flashbench.engine.correctness), sequence by sequence.

The reference reads the latent cache as k (all D dims) and its first head_dim_v dims as v: MLA's absorbed form.
Budget: correctness.compare's rule per sequence, as tests/test_decode_kernel.py holds flash_decode (its module
docstring says why per sequence); every torch.empty output and partial starts as NaN, and every cache slot the
kernel must not read (past a sequence's length, unused pages) holds NaN.

On the CPU machine the kernel runs through Triton's interpreter (fp16, fp32) at scaled-down latents (D_V = 64,
D_ROPE = 16: the kernel takes any powers of two), with one test at DeepSeek-V3's 576 / 512; the `gpu` tests run
bf16 at DeepSeek-V3's 128 heads.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_mla_decode
from flashbench.kernels import mla as mla_module
from tiers import smoke

from flashbench.engine.correctness import compare, reference

HAS_CUDA = torch.cuda.is_available()
SMALL = (64, 16)  # (D_V, D_ROPE) on the interpreter
FP32_IEEE = 1e-6  # the fp32 path's IEEE dots, held beyond the shared budget (as test_decode_kernel.py does)

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty


class Latent:
    """Random q [B, H, Nq, D] and a latent cache [B, 1, Nmax, D] (NaN past each length), optionally also as a
    shuffled page pool with unused NaN pages and -1 in the table past each length."""

    def __init__(self, heads, nq, lengths, dtype, *, dims=SMALL, nmax=None, page=None, seed=0, device="cpu"):
        gen = torch.Generator().manual_seed(seed)
        self.dv, rope = dims
        self.lengths, self.dtype, self.device, self.refs = list(lengths), dtype, device, {}
        b, nmax, d = len(lengths), nmax or max(lengths), self.dv + rope
        self.q = torch.randn((b, heads, nq, d), generator=gen).to(dtype)
        self.kv = torch.randn((b, 1, nmax, d), generator=gen).to(dtype)
        for i, n in enumerate(lengths):
            self.kv[i, :, n:] = float("nan")
        self.seqlens = torch.tensor(lengths, dtype=torch.int32)
        self.table = None
        if page is not None:
            need = [-(-n // page) for n in lengths]
            order = torch.randperm(sum(need) + 3, generator=gen).tolist()  # three pages nobody uses
            self.pool = torch.full((len(order), 1, page, d), float("nan"), dtype=dtype)
            self.table = torch.full((b, -(-nmax // page)), -1, dtype=torch.int32)
            for i, n in enumerate(lengths):
                for p in range(need[i]):
                    slot = order.pop()
                    self.table[i, p] = slot
                    end = min(n, (p + 1) * page) - p * page
                    self.pool[slot, :, :end] = self.kv[i, :, p * page : p * page + end]

    def run(self, *, paged=False, causal=True, lengths=True, **kw) -> torch.Tensor:
        to = lambda t: None if t is None else t.to(self.device)  # noqa: E731
        cache, table = (self.pool, self.table) if paged else (self.kv, None)
        lens = to(self.seqlens) if lengths else None
        return flash_mla_decode(
            to(self.q), to(cache), lens, to(table), causal=causal, head_dim_v=self.dv, **kw
        )

    def check(self, out: torch.Tensor, *, causal=True) -> None:
        """Hold `out` [B, H, Nq, D_V] to the error budget against float64, sequence by sequence."""
        out = out.cpu()
        assert out.shape == (*self.q.shape[:3], self.dv) and out.dtype == self.dtype
        assert torch.isfinite(out).all(), (
            "NaN/Inf in the output (an unwritten element, or a poisoned key read)"
        )
        if causal not in self.refs:
            kw = dict(causal=causal, seqlens_k=self.lengths)  # sm_scale: D^-0.5, the kernel's default too
            k, v = self.kv, self.kv[..., : self.dv]
            self.refs[causal] = (
                reference(self.q, k, v, **kw)["out"],
                reference(self.q, k, v, **kw, dtype=self.dtype)["out"],
            )
        ref, lowp = self.refs[causal]
        for b, n in enumerate(self.lengths):
            one = slice(b, b + 1)
            verdict = compare({"out": out[one]}, {"out": ref[one]}, {"out": lowp[one]}, self.dtype)
            assert verdict.ok, f"seq {b} (L={n}): {verdict.reason} ({verdict.describe()})"
            if self.dtype == torch.float32:
                err = verdict.errors["out"][0]
                assert err <= FP32_IEEE, (
                    f"seq {b} (L={n}): fp32 error {err:.2e} > {FP32_IEEE:.0e}: a TF32 dot?"
                )


def test_reference_reads_v_as_the_latent_prefix():
    # The oracle with v = k[..., :Dv]: one key gives exactly that key's latent, and two keys a softmax blend.
    q = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    k = torch.randn(1, 1, 2, 8, dtype=torch.float64)
    out = reference(q, k[:, :, :1], k[:, :, :1, :4], causal=False)["out"]
    assert out.shape == (1, 2, 1, 4) and torch.allclose(out, k[0, 0, 0, :4].expand(1, 2, 1, 4))
    p = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(8), -1)
    assert torch.allclose(reference(q, k, k[..., :4], causal=False)["out"], p @ k[..., :4])


# ---------------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU: fp16 and fp32, small shapes
# ---------------------------------------------------------------------------------------------------------


@smoke(lambda dtype, **_: dtype == torch.float16 or not HAS_CUDA)
@pytest.mark.parametrize("nq", [1, 2, 4])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_ragged_lengths_causal_and_split_match_reference(device, dtype, paged, nq):
    # 16 heads x nq rows = 16..64 rows, one row block. Lengths 1 (for nq > 1 rows that see no key), 37 (prime),
    # 80 (whole blocks); 3 splits leave the length-1 sequence two empty splits.
    prob = Latent(16, nq, [1, 37, 80], dtype, nmax=83, page=16, seed=nq, device=device)
    prob.check(prob.run(paged=paged, num_splits=3))
    prob.check(prob.run(paged=paged, num_splits=1, causal=False), causal=False)


@pytest.mark.parametrize("num_splits", [1, 2, 7, None])
def test_two_row_blocks_and_the_chunked_combine_match_reference(device, num_splits):
    # 32 heads x 4 queries = 128 rows: two row blocks of 64, each combined in chunks of COMBINE_ROWS rows.
    assert 32 * 4 == 2 * mla_module.BLOCK_M and mla_module.BLOCK_M > mla_module.COMBINE_ROWS
    prob = Latent(32, 4, [20, 100], torch.float16, page=32, seed=4, device=device)
    prob.check(prob.run(num_splits=num_splits))
    prob.check(prob.run(paged=True, num_splits=num_splits))


def test_no_rotary_part_and_default_lengths(device):
    # D_ROPE = 0 (head dim = head_dim_v): a plain MQA over the latent; no cache_seqlens: every key is valid.
    prob = Latent(16, 2, [40, 40], torch.float32, dims=(32, 0), seed=5, device=device)
    prob.check(prob.run(lengths=False, num_splits=2))


def test_deepseek_v3_dims_match_reference(device):
    # The real 576 / 512 latent; 16 of its 128 heads keep the interpreter quick; 2 splits over 50 keys.
    prob = Latent(16, 1, [50, 3], torch.float16, dims=(512, 64), page=16, seed=6, device=device)
    prob.check(prob.run(num_splits=2))
    prob.check(prob.run(paged=True, num_splits=1))


def test_split_counters_are_zero_after_a_call_and_results_repeat(device):
    from flashbench.kernels import decode as decode_module

    prob = Latent(16, 2, [9, 70], torch.float16, page=16, seed=13, device=device)
    first = prob.run(paged=True, num_splits=3)
    assert mla_module.last_mla_config()["num_splits"] == 3
    here = str(torch.zeros(0, device=device).device)
    counters = [t for (dev, _), (t, _) in decode_module._SCRATCH.items() if dev == here]
    assert counters and all((t == 0).all() for t in counters)
    assert torch.equal(prob.run(paged=True, num_splits=3), first)


def test_rows_that_see_no_key_are_zero(device):
    # Causal, 4 queries: with L = 1 queries 0..2 see no key.
    prob = Latent(16, 4, [1, 10], torch.float32, seed=7, device=device)
    out = prob.run(num_splits=2).cpu()
    assert (out[0, :, :3] == 0).all() and (out[0, :, 3] != 0).any()
    prob.check(out)


# ---------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------


def _bad_cases(device):
    prob = Latent(16, 1, [10, 20], torch.float16, nmax=32, page=16, seed=10)
    q, kv, pool = (t.to(device) for t in (prob.q, prob.kv, prob.pool))
    lens, table = prob.seqlens.to(device), prob.table.to(device)
    return {
        "kv 3-D": ((q, kv[0], lens), "kv_cache must be a 4-D torch.Tensor"),
        "dtype mix": ((q, kv.float(), lens), "dtypes differ"),
        "two latent heads": ((q, torch.cat([kv, kv], 1), lens), "one head"),
        "head dim mismatch": ((q[..., :64], kv, lens), "head dim differs"),
        "rope not pow2": ((q, kv, lens, None, True, None, None, 32), "0 or a power of two"),
        "dv too big": ((q, kv, lens, None, True, None, None, 1024), "power of two in 16..512"),
        "too many queries": ((q.expand(2, 16, 5, 80), kv, lens), "at most 4 query tokens"),
        "batch": ((q[:1], kv), "batch differs"),
        "lens too long": ((q, kv, lens + 30), "past the cache capacity 32"),
        "page past pool": ((q, pool, lens, torch.where(table == table[1, 1], 99, table)), "outside the pool"),
        "page size 8": ((q, pool[:, :, :8], lens, table), "page size 8"),
        "splits 0": ((q, kv, lens, None, True, None, 0), "num_splits must be an int in 1..128"),
        "causal": ((q, kv, lens, None, 1), "causal must be a bool"),
    }


@pytest.mark.parametrize("case", list(_bad_cases("cpu")))
def test_bad_inputs_raise_one_line_kernel_unsupported(device, case):
    args, message = _bad_cases(device)[case]
    kw = {} if len(args) >= 8 else {"head_dim_v": SMALL[0]}
    with pytest.raises(KernelUnsupported, match=re.escape(message)) as info:
        flash_mla_decode(*args, **kw)
    assert str(info.value).startswith("flash_mla_decode: ") and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------
# GPU: bf16 and fp16 at DeepSeek-V3's shapes
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@smoke(
    lambda dtype, nq, page, kernel: (
        (dtype == torch.bfloat16 or (nq == 1 and page is None))
        and (kernel == "default" or (page is None and dtype == torch.bfloat16))
    )
)
@pytest.mark.parametrize("kernel", ["default", "tl"])
@pytest.mark.parametrize("page", [None, 64])
@pytest.mark.parametrize("nq", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_deepseek_v3_ragged_batch_matches_reference(dtype, nq, page, kernel, monkeypatch):
    """The default (on Hopper the Gluon kernel from 1024 keys, contiguous or paged) and, with FLASHBENCH_GLUON=0,
    the tl kernel the default takes elsewhere."""
    if kernel == "tl":
        monkeypatch.setenv("FLASHBENCH_GLUON", "0")
    lengths = [1, 257, 1000, 2045, 2048, 3]
    prob = Latent(128, nq, lengths, dtype, dims=(512, 64), nmax=2048, page=page, seed=11, device="cuda")
    for splits in (None, 1, 7):  # each twice: Triton's JIT launch, then the cached compiled kernel
        for _ in range(2):
            prob.check(prob.run(paged=page is not None, num_splits=splits))
    if kernel == "tl":
        assert mla_module.last_mla_config().get("kernel") != "gluon-ws"


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(mla_module.CANDIDATE_CONFIGS)))
def test_gpu_candidate_configs_match_reference(index):
    prob = Latent(128, 2, [300, 2048], torch.bfloat16, dims=(512, 64), page=64, seed=12, device="cuda")
    config = mla_module.CANDIDATE_CONFIGS[index]
    prob.check(prob.run(num_splits=3, config=config))
    prob.check(prob.run(paged=True, num_splits=None, config=config))

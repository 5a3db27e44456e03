"""flash_mla_decode's Gluon kernel (kernels/mla_ws.py, forced by config={"kernel": "gluon-ws"}) against the one
oracle, as tests/test_mla_kernel.py holds the tl kernel (its Latent problems: NaN outputs and NaN cache slots past
each length; as a page pool, shuffled pages, unused NaN pages and -1 in the table past each length). The kernel
itself needs a Hopper GPU (the `gpu` tests, contiguous and paged); on the CPU machine: its refusals, the routing
(contiguous and paged) and the combine it shares with kernels/decode.py, fed partials in the layout the kernel
writes.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch
from flashbench.kernels import KernelUnsupported, launch, mla_ws
from flashbench.kernels import decode as decode_module
from flashbench.kernels import mla as mla_module
from flashbench.kernels.mla import flash_mla_decode
from test_mla_kernel import Latent
from tiers import smoke

from flashbench.engine.correctness import compare, reference

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty

GLUON = {"kernel": "gluon-ws"}
V3 = (512, 64)  # DeepSeek-V3's latent and rotary dims: the only ones the Gluon kernel takes


def test_forced_on_an_input_it_does_not_take_raises_one_line_why(device):
    prob = Latent(16, 1, [10, 20], torch.float16, dims=V3, nmax=32, page=16, seed=1, device=device)
    small = Latent(16, 1, [10, 20], torch.float16, nmax=32, seed=1, device=device)
    pages_of_64 = Latent(16, 1, [10, 70], torch.float16, dims=V3, nmax=128, page=64, seed=1, device=device)
    cases = [
        (lambda: prob.run(paged=True, config=GLUON), "page size 16 (pages must be a multiple of 64 tokens"),
        (lambda: small.run(config=GLUON), "head dims 80 / 64"),
        (lambda: prob.run(config={**GLUON, "BLOCK_N": 32}), "takes no tile keys"),
    ]
    if device == "cpu":  # past the page rule: only the GPU is missing
        cases.append((lambda: prob.run(config=GLUON), "needs a Hopper GPU"))
        cases.append((lambda: pages_of_64.run(paged=True, config=GLUON), "needs a Hopper GPU"))
    for call, message in cases:
        with pytest.raises(KernelUnsupported, match=re.escape(message)) as info:
            call()
        assert str(info.value).startswith("flash_mla_decode: ") and "\n" not in str(info.value)


def test_the_default_takes_it_from_min_capacity_per_nq_where_it_runs(monkeypatch):
    """MIN_CAPACITY's cache capacity per Nq, contiguous caches it takes (refusal: here every input passes), and
    never under FLASHBENCH_GLUON=0; elsewhere the tl kernel."""
    q2, q1 = torch.empty(1, 128, 2, V3[0]), torch.empty(1, 128, 1, V3[0])
    monkeypatch.setattr(mla_ws, "MIN_CAPACITY", {2: 4096})
    monkeypatch.setattr(mla_ws, "refusal", lambda *a: None)
    assert mla_ws.preferred(q2, torch.empty(1, 1, 4096, 8), None, head_dim_v=V3[1])
    assert not mla_ws.preferred(q2, torch.empty(1, 1, 4095, 8), None, head_dim_v=V3[1])
    assert not mla_ws.preferred(q1, torch.empty(1, 1, 4096, 8), None, head_dim_v=V3[1])
    monkeypatch.setenv("FLASHBENCH_GLUON", "0")
    assert not mla_ws.preferred(q2, torch.empty(1, 1, 4096, 8), None, head_dim_v=V3[1])


def test_a_paged_cache_is_the_default_only_from_its_own_table(monkeypatch):
    """Paged caches follow MIN_CAPACITY_PAGED by the table's capacity (its pages times the page size), not
    MIN_CAPACITY, and the pool's own length (a page) does not count."""
    q = torch.empty(1, 128, 1, V3[0])
    pool = torch.empty(70, 1, 64, 8)
    table = torch.zeros(1, 64, dtype=torch.int32)  # 64 pages of 64 tokens: 4096 keys
    monkeypatch.setattr(mla_ws, "refusal", lambda *a: None)
    monkeypatch.setattr(mla_ws, "MIN_CAPACITY", {1: 64})  # the contiguous table would take even one page
    monkeypatch.setattr(mla_ws, "MIN_CAPACITY_PAGED", {})
    assert not mla_ws.preferred(q, pool, table, head_dim_v=V3[1])
    monkeypatch.setattr(mla_ws, "MIN_CAPACITY_PAGED", {1: 4096})
    assert mla_ws.preferred(q, pool, table, head_dim_v=V3[1])
    assert not mla_ws.preferred(q, pool, table[:, :63], head_dim_v=V3[1])


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "from-table"])
def test_a_paged_cache_reaches_the_kernel_with_its_table_and_capacity(monkeypatch, device, forced):
    """flash_mla_decode hands the Gluon launcher the pool and its table, and splits the table's capacity (pages
    times 64), not the page: forced by config, or by default once MIN_CAPACITY_PAGED takes it. The launcher is
    replaced here by one that records what it got (the kernel's own GPU tests are below)."""
    prob = Latent(16, 2, [1, 70, 1024], torch.float16, dims=V3, nmax=1024, page=64, seed=2, device=device)
    seen = {}

    def launcher(q, kv, lens, table, causal, qk_scale, splits):
        seen.update(kv=kv, table=table, splits=splits, causal=causal)
        return torch.zeros(*q.shape[:3], 512, dtype=q.dtype, device=q.device)

    monkeypatch.setattr(mla_ws, "refusal", lambda *a: None)
    monkeypatch.setattr(mla_ws, "mla_decode_ws", launcher)
    if not forced:
        monkeypatch.setattr(mla_ws, "MIN_CAPACITY_PAGED", {2: 256})
    prob.run(paged=True, num_splits=None, config=GLUON if forced else None)
    assert seen["kv"].shape == prob.pool.shape and torch.equal(seen["table"].cpu(), prob.table)
    assert mla_module.last_mla_config()["kernel"] == GLUON["kernel"]
    # 32 query rows: one row block, so the split consumers' schedule (the row's kernel_config says so)
    assert mla_module.last_mla_config()["schedule"] == "split"
    # 1024 keys of capacity split (at most 4: decode.MIN_SPLIT_KEYS each); one page's 64 keys would not
    assert 1 < seen["splits"] <= 1024 // decode_module.MIN_SPLIT_KEYS


def test_where_the_gluon_kernel_refuses_the_default_falls_back_to_the_tl_kernel(monkeypatch, device):
    """The shipped table takes Nq = 1 from 1024 keys; where the Gluon kernel refuses the input (here made to
    refuse, as it does on a machine without Hopper), the tl kernel runs instead, and is right."""
    prob = Latent(2, 1, [4096, 100], torch.float16, dims=V3, seed=3, device=device)
    assert mla_ws.MIN_CAPACITY.get(1, 1 << 30) <= prob.kv.shape[2]
    monkeypatch.setattr(mla_ws, "refusal", lambda *a: "refused by the test")
    prob.check(prob.run())
    assert mla_module.last_mla_config().get("kernel") != GLUON["kernel"]


def test_grid_and_workspace_hold_every_row_and_split():
    assert mla_ws.grid(3, 128 * 2, 5) == (4, 5, 3)
    assert mla_ws.grid(2, 16, 1) == (1, 1, 2)  # 16 rows still take one 64-row program
    part, lse = mla_ws.workspace(torch.device("cpu"), 2, 20, 3)
    assert part.shape == (2, 3, 20, 512) and lse.shape == (2, 3, 20)
    assert part.is_contiguous() and lse.is_contiguous()
    assert lse.data_ptr() == part.data_ptr() + part.numel() * 4  # lse right after the partial outputs


class _Compiled:
    """What a compiled kernel's first (JIT) launch returns, as far as launch.KernelCall reads it: later launches go
    to `run`, recorded by the kernel that compiled it."""

    function = packed_metadata = object()

    def __init__(self, kernel):
        self.kernel = kernel

    def run(self, gx, gy, gz, stream, function, metadata, *rest):
        self.kernel.launches.append(("direct", (gx, gy, gz), rest[3:]))


class _Kernel:
    """A stand-in for a compiled Hopper kernel on the CPU: records each launch's grid and run-time arguments, the
    first through the JIT (real descriptors), the rest direct (each descriptor's tensor in a TmaArg)."""

    def __init__(self, real):
        self.params = [SimpleNamespace(name=n, default=None) for n in real.arg_names]
        self.launches = []

    def __getitem__(self, grid):
        def jit(*args, **constexprs):
            self.launches.append(("jit", grid, args))
            return _Compiled(self)

        return jit


def test_a_plan_launches_each_call_with_its_own_tensors(monkeypatch):
    """mla_decode_ws keeps one plan per input signature (the kernel's and the combine's launches): a later call of
    the same shape reaches the compiled kernels with its own q, cache, lengths, table, output and workspace, never
    the first call's; a new split count or no lengths is another plan, through the JIT again. 16 query rows are
    one row block: mla_split_kernel's schedule runs them, never the seesaw."""
    seesaw, kernel = _Kernel(mla_ws._mla_decode_ws), _Kernel(mla_ws._mla_decode_split)
    combine = _Kernel(mla_ws._mla_combine)
    monkeypatch.setattr(mla_ws, "_mla_decode_ws", seesaw)
    monkeypatch.setattr(mla_ws, "_mla_decode_split", kernel)
    monkeypatch.setattr(mla_ws, "_mla_combine", combine)
    monkeypatch.setattr(launch, "_stream_getters", lambda: (lambda device: 0, lambda: 0))
    monkeypatch.setattr(mla_ws, "_PLANS", launch.PlanCache(mla_ws._plan))

    def inputs(page=None):
        q = torch.randn(2, 16, 1, 576, dtype=torch.float16)
        if page is None:
            return q, torch.randn(2, 1, 256, 576, dtype=torch.float16), None
        return (
            q,
            torch.randn(9, 1, page, 576, dtype=torch.float16),
            torch.randperm(8, dtype=torch.int32).view(2, 4),
        )

    for page in (None, 64):
        kernel.launches.clear()
        combine.launches.clear()
        for call in range(3):
            q, kv, table = inputs(page)
            lens = torch.tensor([100, 256], dtype=torch.int32)
            out = mla_ws.mla_decode_ws(q, kv, lens, table, True, 0.1, 3)
            how, grid, args = kernel.launches[-1]
            assert (how, grid) == ("jit" if call == 0 else "direct", (1, 3, 2))
            q_lat, q_rope, k_lat, k_rope = (a.base for a in args[:4])
            assert (q_lat.data_ptr(), q_rope.data_ptr()) == (q.data_ptr(), q.data_ptr() + 512 * 2)
            assert (k_lat.data_ptr(), k_rope.data_ptr()) == (kv.data_ptr(), kv.data_ptr() + 512 * 2)
            assert q_lat.shape == (32, 512) and k_rope.shape == (kv.shape[0] * kv.shape[2], 64)
            assert args[4] is lens and args[5] is out and args[13] is (out if table is None else table)
            part, lse = mla_ws.workspace(q.device, 2, 16, 3)
            assert args[6].data_ptr() == part.data_ptr() and args[7].data_ptr() == lse.data_ptr()
            how, grid, args = combine.launches[-1]
            assert how == ("jit" if call == 0 else "direct") and args[0] is out and args[3] == 3
        assert len(kernel.launches) == len(combine.launches) == 3
        mla_ws.mla_decode_ws(q, kv, None, table, True, 0.1, 3)  # no lengths: another plan
        assert kernel.launches[-1][0] == "jit" and kernel.launches[-1][2][4] is kernel.launches[-1][2][5]
        mla_ws.mla_decode_ws(q, kv, lens, table, True, 0.1, 1)  # one split: another plan, no combine
        assert kernel.launches[-1][:2] == ("jit", (1, 1, 2)) and len(combine.launches) == 4
    assert not seesaw.launches


def test_one_row_block_takes_the_split_schedule_and_more_rows_the_seesaw(monkeypatch):
    """mla_ws.split_schedule: a sequence's query rows (H x Nq) that fit one 64-row program run the split
    consumers, more the seesaw; the launched kernel is the one the rule names, on the same grid rule."""
    assert [mla_ws.split_schedule(r) for r in (1, 16, 32, 64, 65, 128, 256)] == [True] * 4 + [False] * 3
    monkeypatch.setattr(launch, "_stream_getters", lambda: (lambda device: 0, lambda: 0))
    monkeypatch.setattr(mla_ws, "_PLANS", launch.PlanCache(mla_ws._plan))
    kernels = mla_ws._mla_decode_ws, mla_ws._mla_decode_split
    for heads, nq, split in ((16, 4, True), (64, 1, True), (32, 3, False), (128, 1, False)):
        seesaw, one_block = (_Kernel(k) for k in kernels)
        monkeypatch.setattr(mla_ws, "_mla_decode_ws", seesaw)
        monkeypatch.setattr(mla_ws, "_mla_decode_split", one_block)
        q = torch.randn(2, heads, nq, 576, dtype=torch.float16)
        mla_ws.mla_decode_ws(q, torch.randn(2, 1, 128, 576, dtype=torch.float16), None, None, True, 0.1, 1)
        ran, idle = (one_block, seesaw) if split else (seesaw, one_block)
        assert [(how, grid) for how, grid, _ in ran.launches] == [("jit", mla_ws.grid(2, heads * nq, 1))]
        assert not idle.launches
    monkeypatch.setattr(mla_ws, "SPLIT_ROWS", 0)  # turned off: every grid takes the seesaw
    assert not mla_ws.split_schedule(16)


def _split_partials(q, kv, lengths, splits, block):
    """Per sequence and split (whole `block`-key blocks, as the kernel splits), the normalised partial output and
    its log2-sum-exp, non-causal, in float64: [B, splits, rows, 512] and [B, splits, rows]."""
    B, H, Nq, D = q.shape
    rows = H * Nq
    part = torch.zeros(B, splits, rows, 512, dtype=torch.float64)
    lse = torch.full((B, splits, rows), float("-inf"), dtype=torch.float64)
    for b, n in enumerate(lengths):
        per = -(-(-(-n // block)) // splits) * block
        qb = q[b].reshape(rows, D).double()
        for s in range(splits):
            lo, hi = s * per, min(s * per + per, n)
            if lo >= hi:
                continue
            k = kv[b, 0, lo:hi].double()
            logits = qb @ k.T / math.sqrt(D) * math.log2(math.e)
            top = logits.max(-1, keepdim=True).values
            w = torch.exp2(logits - top)
            part[b, s] = (w @ k[:, :512]) / w.sum(-1, keepdim=True)
            lse[b, s] = (top + torch.log2(w.sum(-1, keepdim=True))).squeeze(-1)
    return part, lse


def test_the_combine_reads_every_split_in_one_step_where_its_rows_allow():
    # combine_rows: the most rows (at most COMBINE_ROWS) whose partials of every split fit one step of _combine
    # (decode.combine_chunk), so a program waits for one round of loads; past 16 splits one row, in several steps.
    for splits in range(1, 129):
        rows = mla_ws.combine_rows(splits)
        assert rows in (1, 2, 4) and rows <= mla_ws.COMBINE_ROWS
        one_step = decode_module.combine_chunk(splits, rows, 512) >= splits
        assert one_step or rows == 1, splits
        if rows < mla_ws.COMBINE_ROWS:  # no more rows would still read every split at once
            assert decode_module.combine_chunk(splits, 2 * rows, 512) < splits, splits
    assert [mla_ws.combine_rows(s) for s in (2, 4, 5, 8, 9, 16, 32)] == [4, 4, 2, 2, 1, 1, 1]


@pytest.mark.parametrize("splits", [2, 5, 16])
def test_combine_of_the_kernels_partials_matches_reference(device, splits):
    # The Gluon kernel's partials (mla_ws.workspace's layout) through _mla_combine (decode._combine): lengths 3 and
    # 130 leave the short sequence splits with no key (-inf, zeros).
    lengths = [3, 130]
    prob = Latent(4, 2, lengths, torch.float16, dims=V3, seed=3, device="cpu")
    part64, lse64 = _split_partials(prob.q, prob.kv.nan_to_num(0.0), lengths, splits, mla_ws.BLOCK_N)
    part, lse = mla_ws.workspace(torch.device(device), 2, 8, splits)
    part.copy_(part64.float())
    lse.copy_(lse64.float())
    out = torch.empty(2, 4, 2, 512, dtype=torch.float16, device=device)
    mla_ws.combine(out, part, lse, 8, splits)
    kw = dict(causal=False, seqlens_k=lengths)
    k, v = prob.kv, prob.kv[..., :512]
    ref = reference(prob.q, k, v, **kw)["out"]
    lowp = reference(prob.q, k, v, **kw, dtype=torch.float16)["out"]
    for b in range(2):
        one = slice(b, b + 1)
        verdict = compare({"out": out.cpu()[one]}, {"out": ref[one]}, {"out": lowp[one]}, torch.float16)
        assert verdict.ok, f"seq {b}: {verdict.reason}"


# ---------------------------------------------------------------------------------------------------------
# GPU (Hopper): DeepSeek-V3's dims
# ---------------------------------------------------------------------------------------------------------

LENGTHS = [
    1,
    37,
    64,
    1000,
    2045,
    2048,
    3,
]  # 1, not a multiple of the 64-key tile, whole tiles, the full cache


@pytest.mark.gpu
@smoke(lambda nq, heads: nq == 1 and heads == 128)
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("nq", [1, 2, 4])
def test_gpu_gluon_ragged_batch_matches_reference(nq, heads):
    prob = Latent(heads, nq, LENGTHS, torch.bfloat16, dims=V3, nmax=2048, seed=21, device="cuda")
    for splits in (1, 7, None):  # each twice: Triton's JIT launch, then the plan's compiled kernel
        for _ in range(2):
            prob.check(prob.run(num_splits=splits, config=GLUON))
            assert mla_module.last_mla_config()["kernel"] == "gluon-ws"
    prob.check(prob.run(num_splits=3, causal=False, config=GLUON), causal=False)


@pytest.mark.gpu
def test_gpu_gluon_fp16_and_default_lengths_match_reference():
    prob = Latent(128, 2, [700, 700], torch.float16, dims=V3, seed=22, device="cuda")
    prob.check(prob.run(lengths=False, num_splits=2, config=GLUON))
    prob.check(prob.run(lengths=False, num_splits=1, config=GLUON))


@pytest.mark.gpu
@smoke(lambda dtype, nq, page: dtype == torch.bfloat16 and nq == 1 and page == 64)
@pytest.mark.parametrize("page", [64, 128])
@pytest.mark.parametrize("nq", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_gluon_paged_pool_matches_reference(dtype, nq, page):
    # Latent's pool: shuffled pages, three unused NaN pages, NaN past each length in its last page, -1 in the
    # table past each length.
    prob = Latent(128, nq, LENGTHS, dtype, dims=V3, nmax=2048, page=page, seed=23, device="cuda")
    for splits in (1, 7, None):  # each twice: Triton's JIT launch, then the plan's compiled kernel
        for _ in range(2):
            prob.check(prob.run(paged=True, num_splits=splits, config=GLUON))
            assert mla_module.last_mla_config()["kernel"] == "gluon-ws"
    prob.check(prob.run(paged=True, num_splits=3, causal=False, config=GLUON), causal=False)


@pytest.mark.gpu
@smoke(lambda heads, nq, page: nq == 4 and page == 64)
@pytest.mark.parametrize("page", [64, 128])
@pytest.mark.parametrize("heads, nq", [(16, 1), (16, 4)])
def test_gpu_gluon_one_row_block_paged_pool_matches_reference(heads, nq, page):
    # 16 and 64 query rows: one row block, mla_split_kernel's schedule (as the ragged test's 16 heads), here over
    # Latent's poisoned pool.
    assert mla_ws.split_schedule(heads * nq)
    prob = Latent(heads, nq, LENGTHS, torch.bfloat16, dims=V3, nmax=2048, page=page, seed=25, device="cuda")
    for splits in (1, 7, None):
        prob.check(prob.run(paged=True, num_splits=splits, config=GLUON))
    prob.check(prob.run(paged=True, num_splits=3, causal=False, config=GLUON), causal=False)
    ran = {plan.call.kernel for plan in mla_ws._PLANS.plans.values()}
    assert mla_ws._mla_decode_split in ran


@pytest.mark.gpu
def test_gpu_gluon_paged_default_from_its_table_matches_reference():
    # No cache_seqlens (every table entry in use), fp16, the default split count: the shipped table takes it.
    prob = Latent(128, 2, [4096, 4096], torch.float16, dims=V3, page=64, seed=24, device="cuda")
    assert mla_ws.MIN_CAPACITY_PAGED.get(2, 1 << 30) <= 4096
    prob.check(prob.run(paged=True, lengths=False))
    assert mla_module.last_mla_config()["kernel"] == "gluon-ws"
    assert mla_module.last_mla_config()["schedule"] == "seesaw"  # 256 rows: four row blocks


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_gpu_gluon_calls_of_one_signature_read_their_own_inputs(paged):
    """After a signature's first call its calls go straight to the compiled kernels (mla_ws's plans, the tensor
    maps kept by address): two problems of the same shapes, alternating, each get their own result."""
    probs = [
        Latent(
            128, 1, [1000, 64, 2048], torch.bfloat16, dims=V3, nmax=2048, page=64, seed=seed, device="cuda"
        )
        for seed in (31, 32)
    ]
    outs = []  # kept, so that each call's output is another block
    for prob in probs * 2:
        outs.append(prob.run(paged=paged, config=GLUON))
        prob.check(outs[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])  # both schedules
def test_gpu_gluon_split_combine_is_a_dependent_launch_that_waits_for_the_kernel(heads):
    """With splits the combine is a programmatic dependent launch (mla_ws.PDL): it may start while the kernel's
    programs run and must wait for their partials. Back to back without a sync, and replayed from a CUDA graph,
    every call holds the budget; the combine's compiled launch asks for PDL, and its wait is in the binary."""
    assert mla_ws.PDL
    prob = Latent(heads, 1, [4096, 77, 2048, 4096], torch.bfloat16, dims=V3, seed=41, device="cuda")
    outs = [prob.run(num_splits=9, config=GLUON) for _ in range(6)]
    for out in outs:
        prob.check(out)
    combines = [plan.combine for plan in mla_ws._PLANS.plans.values() if plan.combine is not None]
    assert combines and all(c.compiled.metadata.launch_pdl for c in combines)
    assert all("griddepcontrol.wait" in c.compiled.asm["ptx"] for c in combines)
    q, kv, lens = (t.cuda() for t in (prob.q, prob.kv, prob.seqlens))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captured after warm calls: the plan is compiled, nothing syncs
        captured = flash_mla_decode(q, kv, lens, num_splits=9, validate=False, config=GLUON)
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        prob.check(captured)

"""flash_attn_varlen (packed documents, flash-attn's varlen convention) against the float64 reference per document.

The oracle and its budget are flashbench.engine.correctness (the sweep's): out, dq, dk, dv of every document held,
together, to 2x torch's own low-precision error + eps. Outputs are NaN-poisoned (torch.empty), so a row the
kernels forget to write fails. On the CPU machine through Triton's interpreter (fp16, fp32: its bf16 dot is
wrong); the `gpu` tests run bf16 at the issue's shape class and under a CUDA graph.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from flashbench.kernels import (
    KernelUnsupported,
    backward_ws,
    flash_attn,
    flash_attn_varlen,
    flash_ws,
    last_config,
    varlen_ws,
)
from flashbench.kernels.common import document_walk, last_bwd_config

from flashbench.engine import correctness

HAS_CUDA = torch.cuda.is_available()
HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
GLUON = {"kernel": "gluon-ws"}  # forces the Gluon forward (varlen_ws.py)
DEVICE = "cuda" if HAS_CUDA else "cpu"
FP32_IEEE = 1e-6  # the kernels' fp32 dots are IEEE fp32, as in test_kernels.py
KERNELS = Path(inspect.getfile(flash_attn_varlen)).parent

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty, no autotuning

# Document lengths around the interpreter's 64-row tiles: odd, one token, empty, several tiles, exactly one tile.
SELF = ([37, 1, 0, 130, 64, 5], None)
# seq_q != seq_k per document: fewer and more keys than queries, keys without queries, queries without keys.
CROSS = ([37, 1, 0, 130, 64, 5], [50, 1, 3, 100, 64, 0])


def prefix(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def inputs(lq, lk, h, hkv, d, dtype, seed=0, extra_rows=0):
    """q [total_q, h, d], k, v [total_k, hkv, d], do; `extra_rows` rows past the last document on both sides."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tq, tk = sum(lq) + extra_rows, sum(lk) + extra_rows
    shapes = ((tq, h, d), (tk, hkv, d), (tk, hkv, d), (tq, h, d))
    return [torch.randn(s, generator=gen).to(device=DEVICE, dtype=dtype) for s in shapes]


def run(q, k, v, do, cu_q, cu_k, **kw):
    """out, dq, dk, dv of flash_attn_varlen."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    lq, lk = (cu[1:] - cu[:-1] for cu in (cu_q, cu_k))
    out = flash_attn_varlen(*leaves, cu_q, cu_k, int(lq.max()), int(lk.max()), **kw)
    grads = torch.autograd.grad(out, leaves, do)
    return dict(zip(("out", "dq", "dk", "dv"), (out, *grads), strict=True))


def per_document(results, q, k, v, do, lq, lk, *, causal, window=None):
    """The oracle's verdict over every document: each document's rows against the reference of that document
    alone ([1, H, L, D] slices), all documents' errors summed into one verdict."""
    tally = correctness.ErrorTally()
    cq, ck = prefix(lq).tolist(), prefix(lk).tolist()
    for b in range(len(lq)):
        rq, rk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        doc = [t.transpose(0, 1).unsqueeze(0) for t in (q[rq], k[rk], v[rk], do[rq])]
        kw = dict(causal=causal, do=doc[3], window=window)
        ref = correctness.reference(*doc[:3], **kw)
        low = correctness.reference(*doc[:3], **kw, dtype=q.dtype)
        rows = {"out": rq, "dq": rq, "dk": rk, "dv": rk}
        got = {n: t[rows[n]].transpose(0, 1).unsqueeze(0) for n, t in results.items()}
        tally.add(got, ref, low)
    return tally.verdict(q.dtype)


def check(lengths, h, hkv, d, dtype, *, causal, window=None, validate=False, config=None, bwd_config=None):
    lq, lk = lengths[0], lengths[1] or lengths[0]
    q, k, v, do = inputs(lq, lk, h, hkv, d, dtype)
    kw = dict(causal=causal, window=window, validate=validate, config=config, bwd_config=bwd_config)
    results = run(q, k, v, do, prefix(lq), prefix(lk), **kw)
    verdict = per_document(results, q, k, v, do, lq, lk, causal=causal, window=window)
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"
    if dtype == torch.float32:
        assert max(e for e, _ in verdict.errors.values()) < FP32_IEEE, verdict.describe()
    return results


CASES = [  # (lengths, heads, kv_heads, dtype, causal, window)
    (SELF, 4, 2, torch.float16, False, None),
    (SELF, 4, 2, torch.float16, True, None),
    (SELF, 2, 2, torch.float32, True, None),
    (CROSS, 4, 2, torch.float16, True, None),
    (CROSS, 4, 1, torch.float32, False, (20, 5)),
    (SELF, 4, 2, torch.float16, False, (10, -1)),
]


@pytest.mark.parametrize(
    "lengths,h,hkv,dtype,causal,window",
    CASES,
    ids=[
        f"{'self' if c[0] is SELF else 'cross'}-h{c[1]}kv{c[2]}-{str(c[3])[-7:]}-c{int(c[4])}-{c[5]}"
        for c in CASES
    ],
)
def test_every_document_forward_backward_within_budget(lengths, h, hkv, dtype, causal, window):
    check(lengths, h, hkv, 32, dtype, causal=causal, window=window, validate=dtype == torch.float32)


def test_a_document_gets_what_flash_attn_gives_it_alone(monkeypatch):
    """The varlen launch is the uniform kernel with a per-program document offset: each document's output and
    gradients are the very numbers flash_attn computes for that document as a batch of one (through pointers, as
    varlen loads: no TMA on Hopper)."""
    monkeypatch.setenv("FLASHBENCH_TMA", "0")
    lq = [70, 1, 130]
    q, k, v, do = inputs(lq, lq, 2, 2, 32, torch.float32, seed=1)
    cu = prefix(lq)
    packed = run(q, k, v, do, cu, cu, causal=True)
    for b in range(len(lq)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        alone = [t[rows].transpose(0, 1).unsqueeze(0).detach().requires_grad_(True) for t in (q, k, v)]
        out = flash_attn(*alone, causal=True)
        grads = torch.autograd.grad(out, alone, do[rows].transpose(0, 1).unsqueeze(0))
        for name, want in zip(("out", "dq", "dk", "dv"), (out, *grads), strict=True):
            assert torch.equal(packed[name][rows], want[0].transpose(0, 1)), (b, name)


def test_packed_sequence_with_a_document_mask_is_the_same_call():
    """Block-diagonal attention, causal within each document, over one packed sequence (float64 attention with
    that explicit mask) is what flash_attn_varlen computes."""
    lq = [45, 19, 100]
    q, k, v, _ = inputs(lq, lq, 2, 2, 32, torch.float32, seed=2)
    doc = torch.repeat_interleave(torch.arange(len(lq)), torch.tensor(lq)).to(DEVICE)
    pos = torch.arange(sum(lq), device=DEVICE)
    mask = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    want = torch.nn.functional.scaled_dot_product_attention(
        *(t.double().transpose(0, 1) for t in (q, k, v)), attn_mask=mask
    ).transpose(0, 1)
    got = flash_attn_varlen(q, k, v, prefix(lq), prefix(lq), max(lq), max(lq), causal=True)
    assert (got.double() - want).abs().max() < FP32_IEEE


def test_rows_past_the_last_document_get_zero_output_and_gradients():
    lq = [40, 25]
    q, k, v, do = inputs(lq, lq, 2, 2, 32, torch.float32, extra_rows=30)
    results = run(q, k, v, do, prefix(lq), prefix(lq), causal=True, validate=True)
    for name, t in results.items():
        assert torch.isfinite(t).all(), name
        assert (t[sum(lq) :] == 0).all(), name
    verdict = per_document(
        {n: t[: sum(lq)] for n, t in results.items()},
        *(t[: sum(lq)] for t in (q, k, v, do)),
        lq,
        lq,
        causal=True,
    )
    assert verdict.ok, verdict.describe()


def _spy_host_reads(monkeypatch):
    """Every .item(), .tolist(), bool() and int() of a tensor made from code in the kernels' folder, as a list."""
    seen = []
    for name in ("item", "tolist", "__bool__", "__int__", "__index__"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **kw):
            caller = Path(inspect.stack(0)[1].filename).resolve()
            if caller.is_relative_to(KERNELS.resolve()):
                seen.append(f"{_name} from {caller.name}")
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return seen


def test_validate_false_reads_nothing_on_the_host_and_validate_true_syncs_once(monkeypatch):
    lq = [33, 70]
    q, k, v, do = inputs(lq, lq, 2, 1, 32, torch.float16)
    cu = prefix(lq)
    seen = _spy_host_reads(monkeypatch)
    run(q, k, v, do, cu, cu, causal=True)
    assert seen == []
    flash_attn_varlen(q, k, v, cu, cu, 70, 70, validate=True)
    assert seen == ["tolist from varlen.py"]


def test_bad_prefix_sums_without_validate_stay_inside_the_tensors():
    """validate=False reads nothing on the host; the kernels clamp every offset, so prefix sums past the tensor
    or decreasing give numbers (finite), never an access outside q, k, v."""
    q, k, v, _ = inputs([64], [64], 2, 2, 32, torch.float32)
    for bad in ([0, 50, 10_000], [0, 60, 20], [-5, 30, 64]):
        cu = torch.tensor(bad, dtype=torch.int32, device=DEVICE)
        assert torch.isfinite(flash_attn_varlen(q, k, v, cu, cu, 64, 64)).all(), bad


def _call(q=None, k=None, v=None, cu_q=None, cu_k=None, max_q=64, max_k=64, **kw):
    base_q, base_k, base_v, _ = inputs([40, 24], [40, 24], 2, 2, 32, torch.float32)
    cu = prefix([40, 24])
    args = [
        x if x is not None else d for x, d in zip((q, k, v, cu_q, cu_k), (base_q, base_k, base_v, cu, cu))
    ]
    return flash_attn_varlen(*args, max_q, max_k, **kw)


def _int32(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


REFUSED = [  # (arguments, words the one-line message holds)
    (dict(cu_q=_int32(0, 40, 64).long()), "cu_seqlens_q must be an int32"),
    (dict(cu_k=[0, 40, 64]), "cu_seqlens_k must be an int32"),
    (dict(cu_q=_int32(64)), "at least 2 entries"),
    (dict(cu_q=_int32(0, 40, 64).reshape(1, 3)), "must be 1-D"),
    (dict(cu_k=_int32(0, 64)), "lengths differ (3 vs 2)"),
    (dict(max_q=-1), "max_seqlen_q must be an int >= 0"),
    (dict(max_k=True), "max_seqlen_k must be an int >= 0"),
    (dict(q=torch.zeros(1, 64, 2, 32, device=DEVICE)), "q must be a 3-D torch.Tensor"),
    (dict(v=torch.zeros(60, 2, 32, device=DEVICE)), "k and v shapes differ"),
    (dict(q=torch.zeros(64, 3, 32, device=DEVICE)), "does not divide heads"),
    (dict(q=torch.zeros(64, 2, 32, dtype=torch.float64, device=DEVICE)), "q, k, v dtypes differ"),
    (dict(window=(4,)), "window must be a pair"),
    # the value checks: validate=True only
    (dict(cu_q=_int32(1, 40, 64), validate=True), "cu_seqlens_q must start at 0, starts at 1"),
    (dict(cu_k=_int32(0, 40, 30), validate=True), "cu_seqlens_k decreases"),
    (dict(cu_q=_int32(0, 40, 65), validate=True), "cu_seqlens_q ends at 65, past the 64 rows of q"),
    (dict(max_q=39, validate=True), "a document has 40 queries, max_seqlen_q is 39"),
    (dict(max_k=0, validate=True), "max_seqlen_k is 0"),
]


@pytest.mark.parametrize("kwargs,words", REFUSED, ids=[w for _, w in REFUSED])
def test_bad_inputs_get_a_one_line_refusal(kwargs, words):
    with pytest.raises(KernelUnsupported) as err:
        _call(**kwargs)
    message = str(err.value)
    assert message.startswith("flash_attn_varlen: ") and words in message and "\n" not in message


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_documents_at_the_issue_shape_class_within_budget(causal):
    """d = 128, GQA 8:2, documents of 256..4096 tokens packed to ~16k (the issue's shape class, fewer heads)."""
    lengths = torch.randint(256, 4097, (7,), generator=torch.Generator().manual_seed(0)).tolist()
    check((lengths, None), 8, 2, 128, torch.bfloat16, causal=causal, validate=True)
    if HOPPER:  # the Gluon forward and backward, forced
        check((lengths, None), 8, 2, 128, torch.bfloat16, causal=causal, config=GLUON, bwd_config=GLUON)
        assert last_config()["kernel"] == "gluon-ws" and last_bwd_config()["dkdv"]["kernel"] == "gluon-ws"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("config", [None, GLUON], ids=["default", "gluon"])
def test_captured_in_a_cuda_graph_it_follows_new_lengths(config):
    """validate=False needs no host sync, so the forward and backward capture in a CUDA graph; replayed after the
    prefix sums change in place (same shapes), the graph computes the new documents (the tl kernels, and the
    Gluon forward and backward on Hopper)."""
    if config is not None and not HOPPER:
        pytest.skip("the Gluon forward needs a Hopper GPU")
    lq, new = [300, 1, 211, 512], [100, 400, 24, 500]
    q, k, v, do = inputs(lq, lq, 4, 2, 64, torch.float16)
    cu = prefix(lq)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def step():
        out = flash_attn_varlen(*leaves, cu, cu, 512, 512, causal=True, config=config, bwd_config=config)
        return (out, *torch.autograd.grad(out, leaves, do))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    cu.copy_(prefix(new))
    graph.replay()
    torch.cuda.synchronize()
    results = dict(zip(("out", "dq", "dk", "dv"), captured, strict=True))
    verdict = per_document(results, q, k, v, do, new, new, causal=True)
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"


# The Gluon forward (varlen_ws.py, forced): documents shorter than its 128-row tiles, of one token, empty, crossing
# a tile, one tile exactly; fewer and more keys than queries (CROSS); GQA and MQA; each head dim; a program per
# tile (not causal by default) and the persistent walk (causal by default; d = 256 without buffers of its own for
# O). The backward is the tl kernels', reading the Gluon forward's LSE: the gradients check it.
GLUON_CASES = [  # (lengths, heads, kv_heads, head dim, dtype, causal, config)
    (SELF, 4, 2, 128, torch.float16, True, {}),
    (CROSS, 4, 1, 128, torch.bfloat16, False, {}),
    (CROSS, 8, 2, 64, torch.float16, True, {}),
    (SELF, 2, 2, 256, torch.bfloat16, True, {}),
    (SELF, 4, 2, 128, torch.bfloat16, True, {"PERSISTENT": 0, "STAGES": 3}),
    (SELF, 2, 2, 256, torch.bfloat16, True, {"O_HALVES": 1}),  # O through [64, 128] buffers of its own
    (CROSS, 4, 1, 256, torch.bfloat16, False, {"PERSISTENT": 1, "O_HALVES": 1}),
]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize(
    "lengths,h,hkv,d,dtype,causal,config",
    GLUON_CASES,
    ids=[
        f"gluon-{'self' if c[0] is SELF else 'cross'}-h{c[1]}kv{c[2]}-d{c[3]}-{str(c[4])[-4:]}-c{int(c[5])}"
        + ("-o-halves" if c[6].get("O_HALVES") else "-per-tile" if c[6] else "")
        for c in GLUON_CASES
    ],
)
def test_gluon_forward_every_document_within_budget(lengths, h, hkv, d, dtype, causal, config):
    check(lengths, h, hkv, d, dtype, causal=causal, config={**GLUON, **config})
    assert last_config() == {**varlen_ws.default_config(d, causal), **config, **GLUON}


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward needs a Hopper GPU")
def test_gluon_walk_takes_every_tile_on_every_call():
    """Three programs walk every tile of 4 heads (the counter hands each tile out once), and its last program
    resets the counter: a second and a third call give the first call's output, bitwise."""
    lq = SELF[0]
    q, k, v, do = inputs(lq, lq, 4, 2, 128, torch.float16, seed=3)
    cu = prefix(lq)
    config = {**GLUON, "PROGRAMS": 3}
    first = flash_attn_varlen(q, k, v, cu, cu, max(lq), max(lq), causal=True, config=config)
    assert last_config()["PERSISTENT"] == 1
    verdict = per_document({"out": first}, q, k, v, do, lq, lq, causal=True)
    assert verdict.ok, verdict.describe()
    for _ in range(2):
        again = flash_attn_varlen(q, k, v, cu, cu, max(lq), max(lq), causal=True, config=config)
        assert torch.equal(again, first)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward needs a Hopper GPU")
def test_gluon_forward_rows_past_the_last_document_get_zero_output():
    lq = [200, 75]
    q, k, v, do = inputs(lq, lq, 2, 2, 128, torch.bfloat16, extra_rows=60)
    results = run(q, k, v, do, prefix(lq), prefix(lq), causal=True, config=GLUON)
    for name, t in results.items():
        assert torch.isfinite(t).all(), name
        assert (t[sum(lq) :] == 0).all(), name
    docs = {n: t[: sum(lq)] for n, t in results.items()}
    verdict = per_document(docs, *(t[: sum(lq)] for t in (q, k, v, do)), lq, lq, causal=True)
    assert verdict.ok, verdict.describe()


class _Routed(Exception):
    """Raised by a stubbed Gluon plan's run: the call took the Gluon forward."""


@pytest.fixture
def gluon_stub(monkeypatch):
    """The Gluon path's host logic on this machine: flash_ws's device checks pass (no Hopper here), an H100's 132
    SMs, and the plan's launch raises _Routed instead of running the kernel."""
    monkeypatch.setattr(flash_ws, "tensor_refusal", lambda *a, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)

    def routed(*a, **kw):
        raise _Routed

    monkeypatch.setattr(varlen_ws.VarlenPlan, "run", routed)


def test_the_forward_takes_the_gluon_kernel_from_the_longest_documents_min_seq_names(gluon_stub, monkeypatch):
    """varlen_ws.MIN_SEQ's rule on max(max_seqlen_q, max_seqlen_k) (here d = 128 causal from 1024); below it, with
    a window, with FLASHBENCH_GLUON=0, or without an entry for the head dim and mask (not timed), the tl kernel
    (which runs here, under the interpreter)."""
    q, k, v, _ = inputs([100, 60], [100, 60], 2, 2, 128, torch.float16)
    cu = prefix([100, 60])
    monkeypatch.delitem(varlen_ws.MIN_SEQ, (128, True), raising=False)
    flash_attn_varlen(q, k, v, cu, cu, 64, 4096, causal=True)
    assert "kernel" not in last_config()
    monkeypatch.setitem(varlen_ws.MIN_SEQ, (128, True), 1024)
    with pytest.raises(_Routed):
        flash_attn_varlen(q, k, v, cu, cu, 64, 1024, causal=True)
    for kw in (dict(max_seqlen_k=1023), dict(max_seqlen_k=4096, window=(2048, 0))):
        out = flash_attn_varlen(q, k, v, cu, cu, **{"max_seqlen_q": 64, "causal": True, **kw})
        assert torch.isfinite(out).all() and "kernel" not in last_config()
    monkeypatch.setenv("FLASHBENCH_GLUON", "0")
    flash_attn_varlen(q, k, v, cu, cu, 64, 4096, causal=True)
    assert "kernel" not in last_config()
    with pytest.raises(_Routed):  # a forced config takes it whatever the lengths
        flash_attn_varlen(q, k, v, cu, cu, 64, 64, causal=True, config=GLUON)


def test_the_gluon_plan_walks_every_documents_tiles_per_head(gluon_stub):
    """PERSISTENT=0 (the default without a mask at d = 64 and 256), one program per (head, walk position):
    document_walk(total_q, docs, 128) positions a head (the device finds each one's document); PERSISTENT=1 (causal,
    and d = 128 without a mask), PROGRAMS persistent programs (one per SM) take them through a zeroed counter."""
    q, k, v, _ = inputs(SELF[0], SELF[0], 4, 2, 128, torch.float16)
    plan = varlen_ws.VarlenPlan(q, k, v, len(SELF[0]), False, {"PERSISTENT": 0, "STAGES": 3})
    walk = document_walk(q.shape[0], len(SELF[0]), 128)
    assert walk == (237 + 7 * 127) // 128
    assert plan.call.grid == (walk * 4, 1, 1) and plan.counter is None
    assert plan.call.constexprs["VARLEN"] == 1 and plan.sizes == (4, 2, 237, 237, walk, 4)
    for causal in (False, True):
        plan = varlen_ws.VarlenPlan(q, k, v, len(SELF[0]), causal)
        assert plan.call.grid == (min(walk * 4, 132), 1, 1) and plan.call.constexprs["VARLEN"] == 2
        assert plan.config["PERSISTENT"] == 1 and plan.config["STAGES"] == 2
    d64 = inputs(SELF[0], SELF[0], 4, 2, 64, torch.float16)[:3]
    assert varlen_ws.VarlenPlan(*d64, len(SELF[0]), False).counter is None
    persistent = varlen_ws.VarlenPlan(q, k, v, len(SELF[0]), True, {"PROGRAMS": 5})
    assert persistent.call.grid == (5, 1, 1) and persistent.call.constexprs["VARLEN"] == 2
    assert persistent.counter is not None and persistent.counter.tolist() == [0, 0]


GLUON_REFUSED = [  # (lengths, config, window, words of the refusal)
    (SELF[0], {"LPT": 1}, None, "flash_ws varlen forward: no list-scheduled walk"),
    (SELF[0], {"SCHED_HEADS": 4}, None, "flash_ws varlen forward: tiles are walked one head at a time"),
    (SELF[0], {"LEAD_S": 1}, None, "flash_ws varlen forward: no early first S"),
    (SELF[0], {"Q2": 1}, None, "flash_ws varlen forward: no second Q buffer"),
    (SELF[0], {"LOOP_FIRST": 1}, None, "flash_ws varlen forward: a first block of its own"),
    (SELF[0], {"BLOCK_M": 192}, None, "flash_ws varlen forward: BLOCK_M 192"),
    (SELF[0], {"STAGES": 4, "PERSISTENT": 1}, None, "KiB of shared memory at head dim 128"),
    (SELF[0], {}, (100, 0), "flash_ws varlen forward: sliding window (100, 0)"),
    (SELF[0], {"STAGES": 5}, None, "gluon-ws config: STAGES=5 must be one of"),
    ([40, 24], {}, None, "needs at least 64 query rows and 128 key rows in all"),
]


@pytest.mark.parametrize("lengths,config,window,words", GLUON_REFUSED, ids=[w for *_, w in GLUON_REFUSED])
def test_a_forced_gluon_config_it_cannot_run_gets_a_one_line_refusal(
    gluon_stub, lengths, config, window, words
):
    q, k, v, _ = inputs(lengths, lengths, 4, 2, 128, torch.float16)
    cu = prefix(lengths)
    with pytest.raises(KernelUnsupported) as err:
        flash_attn_varlen(q, k, v, cu, cu, 130, 130, causal=True, window=window, config={**GLUON, **config})
    message = str(err.value)
    assert message.startswith("flash_attn_varlen: ") and words in message and "\n" not in message, message


@pytest.mark.skipif(HOPPER, reason="what a machine without a Hopper GPU answers")
def test_without_hopper_a_forced_gluon_config_is_refused():
    q, k, v, _ = inputs([100, 60], [100, 60], 2, 2, 64, torch.float16)
    cu = prefix([100, 60])
    with pytest.raises(KernelUnsupported, match="flash_ws varlen forward: needs a Hopper GPU"):
        flash_attn_varlen(q, k, v, cu, cu, 100, 100, config=GLUON)


# The Gluon backward (varlen_ws.BackwardPlan, forced with the Gluon forward): documents shorter than its 64-row
# query blocks and 128-key blocks, of one token, empty, crossing a block, one block exactly; keys without queries
# and queries without keys (CROSS); GQA and MQA; d = 64 and 128; causal or not.
# The persistent walk over three programs: each takes many tiles, the empty ones past the last document included.
PERSISTENT_3 = {"PERSISTENT": 1, "PROGRAMS": 3}
GLUON_BWD_CASES = [  # (lengths, heads, kv_heads, head dim, dtype, causal)
    (SELF, 4, 2, 128, torch.float16, True),
    (SELF, 4, 2, 128, torch.bfloat16, False),
    (CROSS, 4, 1, 128, torch.bfloat16, True),
    (CROSS, 8, 2, 64, torch.float16, False),
    (SELF, 2, 2, 64, torch.bfloat16, True),
]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize("walk", [{}, PERSISTENT_3], ids=["grid", "persistent-3"])
@pytest.mark.parametrize(
    "lengths,h,hkv,d,dtype,causal",
    GLUON_BWD_CASES,
    ids=[
        f"gluon-bwd-{'self' if c[0] is SELF else 'cross'}-h{c[1]}kv{c[2]}-d{c[3]}-{str(c[4])[-4:]}-c{int(c[5])}"
        for c in GLUON_BWD_CASES
    ],
)
def test_gluon_backward_every_document_within_budget(lengths, h, hkv, d, dtype, causal, walk):
    check(lengths, h, hkv, d, dtype, causal=causal, config=GLUON, bwd_config={**GLUON, **walk})
    ran = backward_ws.reported_config(backward_ws.config_for(d, walk), persist=bool(walk))
    assert last_bwd_config()["dkdv"] == ran  # packed documents: a program per tile unless forced


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize("walk", [{}, PERSISTENT_3], ids=["grid", "persistent-3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_dq_zeroed_by_the_programs_of_the_head_before_on_every_call(causal, walk):
    """bwd_config ZERO_AHEAD=1: each K/V head's programs zero the next head's dQ accumulator (the preprocess only
    the first's), and each launch leaves the counts (and the persistent walk's tile counter) at zero for the
    next: three calls of one plan."""
    bwd = {**GLUON, "ZERO_AHEAD": 1, **walk}
    for _ in range(3):
        check(CROSS, 8, 4, 128, torch.bfloat16, causal=causal, config=GLUON, bwd_config=bwd)
        assert last_bwd_config()["dkdv"]["ZERO_AHEAD"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
def test_gluon_backward_rows_past_the_last_document_get_zero_gradients():
    """Rows past cu_seqlens[-1] on both sides: their dK, dV are stored zeros (one more document without queries),
    their dQ stays the zeroed accumulator's; a document ending inside a key block stores none of the next rows."""
    lq = [200, 75]
    q, k, v, do = inputs(lq, lq, 2, 2, 128, torch.bfloat16, extra_rows=60)
    results = run(q, k, v, do, prefix(lq), prefix(lq), causal=False, config=GLUON, bwd_config=GLUON)
    for name, t in results.items():
        assert torch.isfinite(t).all(), name
        assert (t[sum(lq) :] == 0).all(), name
    docs = {n: t[: sum(lq)] for n, t in results.items()}
    verdict = per_document(docs, *(t[: sum(lq)] for t in (q, k, v, do)), lq, lq, causal=False)
    assert verdict.ok, verdict.describe()


class _RoutedBackward(Exception):
    """Raised by a stubbed Gluon backward plan's run: the backward took the Gluon kernel."""


@pytest.fixture
def gluon_bwd_stub(monkeypatch):
    """The Gluon backward's host logic on this machine: flash_ws's device checks pass, and the backward plan's
    launch raises _RoutedBackward instead of running the kernel (the tl forward runs, under the interpreter)."""
    monkeypatch.setattr(flash_ws, "tensor_refusal", lambda *a, **kw: None)

    def routed(*a, **kw):
        raise _RoutedBackward

    monkeypatch.setattr(varlen_ws.BackwardPlan, "run", routed)


def backward_of(lengths, d=64, causal=True, longest=None, **kw):
    """flash_attn_varlen's forward and backward over documents of `lengths` (fp16, 2 heads)."""
    q, k, v, do = inputs(lengths, lengths, 2, 2, d, torch.float16)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    cu, most = prefix(lengths), longest or max(lengths)
    out = flash_attn_varlen(*leaves, cu, cu, most, most, causal=causal, **kw)
    out.backward(do)


def test_the_backward_takes_the_gluon_kernel_when_forced_or_from_bwd_min_seq(gluon_bwd_stub, monkeypatch):
    """bwd_config={"kernel": "gluon-ws"} takes it whatever the lengths; without one, varlen_ws.BWD_MIN_SEQ on the
    longest document (without an entry for the head dim and mask: the tl passes, which run here), never with
    deterministic algorithms."""
    lengths = [100, 60]
    with pytest.raises(_RoutedBackward):
        backward_of(lengths, bwd_config=GLUON)
    monkeypatch.delitem(varlen_ws.BWD_MIN_SEQ, (64, True), raising=False)
    backward_of(lengths, longest=4096)
    assert "kernel" not in last_bwd_config()["dkdv"]
    monkeypatch.setitem(varlen_ws.BWD_MIN_SEQ, (64, True), 1024)
    with pytest.raises(_RoutedBackward):
        backward_of(lengths, longest=1024)
    backward_of(lengths, longest=1023)
    assert "kernel" not in last_bwd_config()["dkdv"]
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    backward_of(lengths, longest=4096)
    assert "kernel" not in last_bwd_config()["dkdv"]


def test_the_gluon_backward_plan_walks_every_documents_key_blocks_per_kv_head(gluon_bwd_stub):
    """A program per (walk position over the keys, K/V head): document_walk(total_k, docs, 128) positions; the
    one pass in its VARLEN mode, the preprocess zeroing dQ's fp32 accumulator over every query row and head."""
    q, k, v, do = inputs(SELF[0], CROSS[1], 4, 2, 128, torch.float16)
    plan = varlen_ws.BackwardPlan(q, k, v, do, len(SELF[0]), True, GLUON)
    walk = document_walk(k.shape[0], len(SELF[0]), 128)
    assert walk == (218 + 7 * 127) // 128
    assert plan.call.grid == (walk, 2, 1) and plan.pre.grid == (4, 4, 1)  # cdiv(237, 64) query blocks, H
    assert plan.call.constexprs["VARLEN"] is True and plan.call.constexprs["ONE_PASS"] is True
    assert plan.pre.constexprs["ZERO_DQ"] is True and plan.sizes == (4, 2, 237, 218)
    assert plan.config == backward_ws.reported_config(backward_ws.config_for(128), persist=False)
    assert plan.config["PERSISTENT"] == 0 and backward_ws.config_for(128, plan.config) == {
        **backward_ws.config_for(128),
        "PERSISTENT": 0,
    }
    # two K/V heads: fewer than a wave of the SMs ahead, so the preprocess zeroes both; forced, the programs of
    # head 0 zero head 1's accumulator
    assert plan.ahead == 2 and plan.call.constexprs["ZERO"] is True
    forced = varlen_ws.BackwardPlan(q, k, v, do, len(SELF[0]), True, {**GLUON, "ZERO_AHEAD": 1})
    assert forced.ahead == 1 and forced.config["ZERO_AHEAD"] == 1
    # dQ converted behind the pass: a unit per K/V head, its 2 query heads' columns of every row, waiting for the
    # walk's programs of that head
    assert plan.call.constexprs["BEHIND"] is True and plan.convert is not None
    assert plan.convert.call.grid == (4 * 2, 2, 1) and plan.convert.args == (
        walk,
        237,
        2 * 128,
        4 * 128,
        2 * 128,
    )
    after = varlen_ws.BackwardPlan(q, k, v, do, len(SELF[0]), True, {**GLUON, "CONVERT_BEHIND": 0})
    assert after.convert is None and after.call.constexprs["BEHIND"] is False
    longest = varlen_ws.BackwardPlan(q, k, v, do, len(SELF[0]), True, GLUON, longest=16384)
    assert longest.convert is None  # d = 128 causal, a document of 16k: after the pass (CONVERT_MAX_SEQ)
    # the persistent walk: a program per SM at most one per tile (the compile stub's 132 here), over the same tiles,
    # and the conversion waits for the same walk's tiles of each head
    walks = varlen_ws.BackwardPlan(q, k, v, do, len(SELF[0]), True, {**GLUON, "PERSISTENT": 1})
    assert walks.call.grid == (walk * 2, 1, 1) and walks.tiles == (walk, 2)
    assert walks.call.constexprs["PERSIST"] is True and walks.convert.args == plan.convert.args
    three = varlen_ws.BackwardPlan(q, k, v, do, len(SELF[0]), True, {**GLUON, **PERSISTENT_3})
    assert three.call.grid == (3, 1, 1)


GLUON_BWD_REFUSED = [  # (bwd_config, window, words of the refusal)
    ({"kernel": "gluon-ws", "ONE_PASS": 0}, None, "gluon-ws varlen backward: one pass only"),
    ({"kernel": "gluon-ws", "STAGES": 5}, None, "gluon-ws backward config: STAGES=5 must be one of"),
    ({"kernel": "gluon-ws", "LPT": 1}, None, "gluon-ws backward config: unknown key 'LPT'"),
    ({"BLOCK_M": 64}, None, 'bwd_config must be {"kernel": "gluon-ws", ...}'),
    (GLUON, (100, 0), "gluon-ws varlen backward: sliding window (100, 0)"),
]


@pytest.mark.parametrize("bwd_config,window,words", GLUON_BWD_REFUSED, ids=[w for *_, w in GLUON_BWD_REFUSED])
def test_a_forced_gluon_backward_it_cannot_run_gets_a_one_line_refusal(
    gluon_bwd_stub, bwd_config, window, words
):
    with pytest.raises(KernelUnsupported) as err:
        backward_of([100, 60], causal=window is None, window=window, bwd_config=bwd_config)
    message = str(err.value)
    assert message.startswith("flash_attn_varlen: ") and words in message and "\n" not in message, message

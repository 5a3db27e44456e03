"""The Gluon backward (kernels/backward_ws.py) against the float64 reference, and where the backward takes it.

The oracle and budget are the sweep's (flashbench.engine.correctness), as in test_kernels.py: the forward is the
bundled one, the backward is forced to the Gluon kernel: one pass (dQ there too, the default) or its dK/dV pass
beside the tl dQ pass (ONE_PASS=0). Hopper only: elsewhere `supported` must refuse with a reason, and a forced
config raises KernelUnsupported.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import KernelUnsupported, backward, backward_ws, flash_attn, flash_ws
from flashbench.kernels.backward import DqScratch, attention_backward, last_bwd_config
from flashbench.kernels.flash_v2 import attention_forward
from tiers import smoke

from flashbench.engine import correctness

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(b, h, hkv, nq, nk, d, dtype, seed=0, device=DEVICE):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    return t(b, h, nq, d), t(b, hkv, nk, d), t(b, hkv, nk, d), t(b, h, nq, d)


# The persistent walk over three programs: each takes several tiles of every shape below (their K/V buffers, ring
# stages, dS slots and tile slots reused from tile to tile), the empty ones included.
PERSISTENT_3 = {"PERSISTENT": 1, "PROGRAMS": 3}


def check(shape, dtype, causal, config):
    q, k, v, do = inputs(*shape, dtype, seed=sum(shape))
    scale = shape[-1] ** -0.5
    o, lse, _ = attention_forward(q, k, v, causal, scale)
    dq, dk, dv = attention_backward(
        q, k, v, o, lse, do, None, causal, scale, {"kernel": "gluon-ws", **config}
    )
    used = last_bwd_config()["dkdv"]
    assert used["kernel"] == "gluon-ws" and used["BLOCK_N"] == 128
    verdict = correctness.verify(
        {"out": o, "dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=causal, sm_scale=scale, do=do
    )
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "shape",
    [
        (2, 4, 4, 256, 256, 128),
        (1, 8, 2, 1024, 1024, 64),
        (2, 4, 1, 384, 640, 128),
        (1, 2, 2, 128, 128, 64),
        (1, 4, 2, 320, 512, 128),
    ],
    ids=["d128", "d64-gqa4", "nk>nq-mqa", "one-block", "odd-blocks-gqa2"],
)
@pytest.mark.parametrize(
    "config",
    [
        {},
        {"STAGES": 2},
        {"ONE_PASS": 0, "STAGES": 2},
        {"ONE_PASS": 0, "STAGES": 3},
        PERSISTENT_3,
    ],
    ids=["default", "s2", "two-pass", "two-pass-s3", "persistent-3"],
)
# The smoke tier: the configs the backward dispatches (the one pass, and the two passes where torch asks for
# deterministic algorithms: backward_ws.TWO_PASS) and the persistent walk on every shape in bf16, and in fp16 on
# the first.
@smoke(
    lambda shape, dtype, config, **_: (
        config in ({}, backward_ws.TWO_PASS, PERSISTENT_3)
        and (dtype == torch.bfloat16 or shape == (2, 4, 4, 256, 256, 128))
    )
)
def test_gluon_dkdv_matches_reference(shape, dtype, causal, config):
    check(shape, dtype, causal, config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize("walk", [{"PERSISTENT": 0}, PERSISTENT_3], ids=["grid", "persistent-3"])
@pytest.mark.parametrize("ahead", [1, 2])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape", [(2, 4, 4, 256, 256, 128), (3, 8, 2, 512, 512, 64)], ids=["d128-8-units", "d64-gqa4-6-units"]
)
def test_dq_zeroed_by_the_programs_ahead_on_every_call(shape, causal, ahead, walk):
    """ZERO_AHEAD forced below the grid's rows: the dK/dV programs zero the accumulator of the units `ahead`
    rows on and wait for their own (the preprocess zeroes the first `ahead`). Three calls of one plan: each
    launch leaves its counts at zero for the next (a stale count would let a unit add into an accumulator not
    yet zeroed: wrong dQ; a stale tile counter would leave the persistent walk's tiles undone)."""
    for _ in range(3):
        check(shape, torch.bfloat16, causal, {"ZERO_AHEAD": ahead, **walk})
        assert last_bwd_config()["dkdv"]["ZERO_AHEAD"] == ahead


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize(
    "walk", [{"PERSISTENT": 0}, {"PERSISTENT": 1, "PROGRAMS": 7}], ids=["grid", "persistent-7"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dq_converted_behind_the_pass_back_to_back_and_from_a_cuda_graph(causal, walk):
    """dQ's conversion is a programmatic dependent launch: its programs start while the pass's last ones run and
    convert each unit once all its programs' reduce-adds have landed. Six calls back to back without a sync (a
    unit converted early would miss adds: wrong dQ), then replays of a CUDA graph, each within the budget, and the
    same gradients as the conversion after the pass (CONVERT_BEHIND=0) up to the adds' order; the compiled
    conversion asks for PDL and the pass lets it start. The persistent walk over 7 programs: its tile counter set
    back by every call's preprocess, in the graph too."""
    shape = (4, 8, 2, 1024, 1024, 128)  # 8 units of 8 programs
    q, k, v, do = inputs(*shape, torch.bfloat16, seed=11)
    scale = shape[-1] ** -0.5
    o, lse, _ = attention_forward(q, k, v, causal, scale)

    def grads(behind):
        cfg = {"kernel": "gluon-ws", "CONVERT_BEHIND": behind, **walk}
        return attention_backward(q, k, v, o, lse, do, None, causal, scale, cfg)

    after = grads(0)
    calls = [grads(1) for _ in range(6)]
    for dq, dk, dv in calls:
        verdict = correctness.verify(
            {"out": o, "dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=causal, sm_scale=scale, do=do
        )
        assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"
        torch.testing.assert_close(dq, after[0], rtol=2e-2, atol=2e-2)
        assert torch.equal(dk, after[1]) and torch.equal(dv, after[2])
    plans = [p for p in backward._PLANS.plans.values() if getattr(p, "convert", None) is not None]
    persist = bool(walk["PERSISTENT"])
    plans = [p for p in plans if p.ws.call.constexprs["PERSIST"] == persist and p.ws.tiles == (8, 8)]
    assert plans and all(p.convert.call.compiled.metadata.launch_pdl for p in plans)
    assert all(p.ws.call.grid == ((7, 1, 1) if persist else (8, 8, 1)) for p in plans)
    assert all("griddepcontrol.launch_dependents" in p.ws.call.compiled.asm["ptx"] for p in plans)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captured after warm calls: the plan is compiled, nothing syncs
        captured = grads(1)[0]
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(captured, after[0], rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_takes_gluon_by_default_where_it_measured_faster(monkeypatch, causal):
    q, k, v, do = inputs(1, 2, 2, 2048, 2048, 128, torch.bfloat16, seed=3)

    def grads(q, k, v, do):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flash_attn(*leaves, causal=causal).backward(do)
        return [t.grad for t in leaves], last_bwd_config()

    ref, used = {}, {}
    for on in ("1", "0"):
        monkeypatch.setenv("FLASHBENCH_GLUON_BWD", on)
        ref[on], used[on] = grads(q, k, v, do)
    assert used["1"]["dkdv"]["kernel"] == "gluon-ws" and used["1"]["dkdv"]["ONE_PASS"] == 1
    assert used["1"]["dq"] == {"kernel": "gluon-ws", "ONE_PASS": 1}
    assert used["0"]["dkdv"].get("kernel") != "gluon-ws"
    for a, b in zip(ref["1"], ref["0"], strict=True):
        assert ((a.double() - b.double()).norm() / b.double().norm()).item() < 1e-2
    monkeypatch.delenv("FLASHBENCH_GLUON_BWD")
    # d = 64 takes the one pass too
    d64 = [t[..., :64].contiguous() for t in (q, k, v, do)]
    assert grads(*d64)[1]["dkdv"]["ONE_PASS"] == 1
    # deterministic algorithms asked for: the two passes (Gluon dK/dV at d = 128, tl at d = 64), bitwise repeatable
    with torch_deterministic():
        first, cfg = grads(q, k, v, do)
        assert cfg["dkdv"]["kernel"] == "gluon-ws" and cfg["dkdv"]["ONE_PASS"] == 0
        assert cfg["dq"].get("kernel") != "gluon-ws"
        second, _ = grads(q, k, v, do)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
        assert grads(*d64)[1]["dkdv"].get("kernel") != "gluon-ws"


class torch_deterministic:
    """torch.use_deterministic_algorithms(True) for a block (warn_only: torch ops without a deterministic
    implementation warn rather than raise), restored after."""

    def __enter__(self):
        self.was = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        torch.use_deterministic_algorithms(True, warn_only=True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.was[0], warn_only=self.was[1])


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
def test_reported_config_can_be_forced_back():
    q, k, v, do = inputs(1, 2, 2, 1024, 1024, 128, torch.float16, seed=4)
    o, lse, _ = attention_forward(q, k, v, True, 0.1)
    attention_backward(q, k, v, o, lse, do, None, True, 0.1, {"kernel": "gluon-ws", "STAGES": 3})
    reported = last_bwd_config()
    assert reported["dkdv"]["kernel"] == "gluon-ws" and reported["dkdv"]["STAGES"] == 3
    attention_backward(q, k, v, o, lse, do, None, True, 0.1, reported["dkdv"], reported["dq"])
    assert last_bwd_config() == reported


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
def test_refusals_name_the_reason():
    cfg = backward_ws.config_for(128)
    q, k, v, do = inputs(1, 2, 2, 256, 256, 128, torch.bfloat16)

    def why(q=q, k=k, v=v, do=do, causal=False, window=None):
        return backward_ws.supported(q, k, v, do, causal, window, cfg)

    assert why() is None and why(causal=True) is None
    assert "fp16 or bf16" in why(q.float(), k.float(), v.float(), do.float())
    assert "head dim 96" in why(*(t[..., :96].contiguous() for t in (q, k, v, do)))
    assert "seq_q % 64" in why(q[:, :, :200].contiguous(), do=do[:, :, :200].contiguous())
    assert "seq_k % 128" in why(k=k[:, :, :192].contiguous(), v=v[:, :, :192].contiguous())
    assert "contiguous" in why(do=do.transpose(2, 3).contiguous().transpose(2, 3))
    assert "seq_k >= seq_q" in why(k=k[:, :, :128].contiguous(), v=v[:, :, :128].contiguous(), causal=True)
    assert "sliding windows" in why(window=(64, 0))
    o, lse, _ = attention_forward(q, k, v, False, 0.1)
    with pytest.raises(KernelUnsupported, match="stored-P backward"):
        p = torch.zeros(1, 2, 256, 256, device="cuda", dtype=q.dtype)
        attention_backward(q, k, v, o, lse, do, p, False, 0.1, {"kernel": "gluon-ws"})


@pytest.mark.skipif(HOPPER, reason="checks the refusal off Hopper")
def test_forced_off_hopper_raises_with_the_reason():
    q, k, v, do = inputs(1, 1, 1, 64, 64, 64, torch.float16, device="cpu")
    o, lse, _ = attention_forward(q, k, v, False, 0.125)
    with pytest.raises(
        KernelUnsupported, match="gluon-ws backward: (needs a Hopper GPU|this Triton has no Gluon)"
    ):
        attention_backward(q, k, v, o, lse, do, None, False, 0.125, {"kernel": "gluon-ws"})
    # not forced: the tl passes run
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, None, False, 0.125)
    assert last_bwd_config()["dkdv"].get("kernel") != "gluon-ws" and dk.isfinite().all()


def test_forced_config_is_checked():
    with pytest.raises(ValueError, match="unknown key 'BLOCK_K'"):
        backward_ws.config_for(128, {"BLOCK_K": 64})
    with pytest.raises(ValueError, match="STAGES=4 must be one of"):
        backward_ws.config_for(128, {"STAGES": 4})
    with pytest.raises(ValueError, match="STAGES=1 must be one of"):
        backward_ws.config_for(128, {"ONE_PASS": 0, "STAGES": 1})  # no default used one stage
    for lost in (
        "ROTATE",
        "SCHED_HEADS",
    ):  # measured slower, removed: every program rotates, heads go in order
        with pytest.raises(ValueError, match=f"unknown key '{lost}'"):
            backward_ws.config_for(128, {lost: 0})
    with pytest.raises(ValueError, match="NUM_WG=3 must be one of"):
        backward_ws.config_for(128, {"NUM_WG": 3})
    assert backward_ws.config_for(64, {"kernel": "gluon-ws", "STAGES": 2})["STAGES"] == 2
    with pytest.raises(ValueError, match="BLOCK_N=64 must be one of"):
        backward_ws.config_for(128, {"BLOCK_N": 64})
    # a reported config (what a row's kernel_config holds under "bwd") is accepted back as it is
    for one_pass, warps in ((1, 13), (0, 9)):
        cfg = backward_ws.config_for(128, {"ONE_PASS": one_pass})
        reported = {"kernel": "gluon-ws", **cfg, "BLOCK_N": 128, "num_warps": warps}
        assert backward_ws.config_for(128, reported) == cfg
    with pytest.raises(ValueError, match="num_warps=12 must be one of"):
        backward_ws.config_for(128, {"num_warps": 12})
    with pytest.raises(ValueError, match="PERSISTENT=1 needs ONE_PASS=1"):
        backward_ws.config_for(128, {"PERSISTENT": 1, "ONE_PASS": 0})
    with pytest.raises(ValueError, match="PROGRAMS needs PERSISTENT=1"):
        backward_ws.config_for(128, {"PROGRAMS": 4})
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="PROGRAMS=.* must be an int >= 1"):
            backward_ws.config_for(128, {"PERSISTENT": 1, "PROGRAMS": bad})


def test_the_persistent_walk_launches_a_program_per_sm_over_the_tiles_grid():
    """PERSISTENT=1: a grid of min(tiles, SMs) programs (PROGRAMS, where forced) over the tiles [parts, units];
    else the tiles' grid itself. The kernel is told PERSIST."""
    cpu = torch.device("cpu")  # the sm_90a compile stub's 132 SMs
    one = backward_ws.config_for(128, {"PERSISTENT": 1})
    assert backward_ws.launch_grid(one, (16, 32), cpu, True) == (132,)
    assert backward_ws.launch_grid(one, (4, 8), cpu, True) == (32,)
    assert backward_ws.launch_grid({**one, "PROGRAMS": 3}, (16, 32), cpu, True) == (3,)
    assert backward_ws.launch_grid(backward_ws.config_for(128), (16, 32), cpu, False) == (16, 32)
    assert backward_ws.kernel_constexprs(one, 128, True, 4096)["PERSIST"] is True
    off = backward_ws.config_for(128, {"PERSISTENT": 0})
    assert backward_ws.kernel_constexprs(off, 64, False, 4096)["PERSIST"] is False


def test_the_persistent_walk_by_default_only_where_it_measured_faster():
    """Unforced: at d = 64 over a batch below 4096 keys (the lengths measured), not at d = 128, never over packed
    documents or for the two passes; PERSISTENT forces it either way."""
    d128, d64 = backward_ws.config_for(128), backward_ws.config_for(64)

    def walks(cfg, d, causal, n=2048, varlen=False):
        return backward_ws.walks_persistent(cfg, d, causal, n, varlen)

    assert walks(d64, 64, True) and walks(d64, 64, False) and walks(d64, 64, False, 1024)
    assert not walks(d128, 128, True) and not walks(d128, 128, True, 1024)
    assert not walks(d128, 128, False, 1024) and not walks(d128, 128, False)
    assert not walks(d64, 64, True, 4096) and not walks(d128, 128, False, 16384)
    assert not walks(d64, 64, True, varlen=True)
    assert walks({**d128, "PERSISTENT": 1}, 128, True, 16384, varlen=True)
    assert not walks({**d64, "PERSISTENT": 0}, 64, True)
    assert not walks(backward_ws.config_for(64, backward_ws.TWO_PASS), 64, True)
    assert backward_ws.kernel_constexprs(d64, 64, True, 2048)["PERSIST"] is True
    # a row reports the walk that ran, and that config forced back runs it again
    ran = backward_ws.reported_config(d64, persist=True)
    assert ran["PERSISTENT"] == 1 and walks(backward_ws.config_for(64, ran), 64, True, 16384)
    assert "PERSISTENT" not in backward_ws.reported_config(
        backward_ws.config_for(64, backward_ws.TWO_PASS), False
    )


def test_default_config_only_where_measured(monkeypatch):
    def default(n, d, causal=False):
        return backward_ws.default_config(torch.empty(1, 2, n, d), causal)

    # causal or not; two stages at d = 128, three at d = 64
    assert default(1024, 128) == backward_ws.config_for(128)
    assert default(16384, 128, True) == default(1024, 128)
    assert default(1024, 128)["ONE_PASS"] == 1 and default(1024, 128)["STAGES"] == 2
    assert default(4096, 64, True)["STAGES"] == 3
    assert default(2048, 64, True)["ONE_PASS"] == 1
    assert default(512, 128) is None and default(512, 64) is None and default(1024, 64)["ONE_PASS"] == 1
    with torch_deterministic():
        assert default(2048, 128) == {**backward_ws.config_for(128), "ONE_PASS": 0, "STAGES": 2}
        assert default(2048, 128, True) == default(2048, 128)
        assert default(1024, 128) is None and default(8192, 64) is None
    monkeypatch.setenv("FLASHBENCH_GLUON_BWD", "0")
    assert default(4096, 128) is None


def test_one_pass_shared_memory_fits():
    """The one pass adds two dS slots (both consumers' [64, 64] 16-bit slices), dQ's fp32 staging tiles and, where
    it fits, the zero box of dQ's accumulator ([64, 32] fp32) to the K / V slices and the Q / dO ring with its
    fp32 LSE and D rows; with three stages it still fits an H100 at d = 128, without the zero box."""
    cfg = backward_ws.config_for(128, {"STAGES": 3})
    two_pass = backward_ws.smem_bytes({**cfg, "ONE_PASS": 0}, 128)
    assert two_pass == 2 * 128 * (2 * 2 * 64 + 2 * 3 * 64) + 2 * 4 * 3 * 64
    assert backward_ws.smem_bytes(cfg, 128) == two_pass + 2 * 2 * 2 * 64 * 64 + 4 * 64 * 128
    assert backward_ws.smem_bytes(cfg, 128) <= flash_ws.SMEM_LIMIT
    assert not backward_ws.zero_box(
        cfg, 128
    )  # three stages leave no room for the zero box: the preprocess zeroes
    two = backward_ws.config_for(128)
    assert backward_ws.zero_box(two, 128) and not backward_ws.zero_box({**two, "ONE_PASS": 0}, 128)
    assert backward_ws.smem_bytes(two, 128) == backward_ws.smem_bytes({**two, "ONE_PASS": 0}, 128) + (
        2 * 2 * 2 * 64 * 64 + 4 * 64 * 128 + 4 * 64 * 32
    )
    with pytest.raises(ValueError, match="ONE_PASS=2 must be one of"):
        backward_ws.config_for(128, {"ONE_PASS": 2})


def test_dq_scratch_gives_d_then_an_aligned_contiguous_accumulator_then_the_counts_in_one_allocation():
    """The scratch's first elements are D's (the kernels take its pointer), then the accumulator, contiguous and
    128-byte aligned, past every element of D, then two int32 counts per unit past the accumulator and a row for
    the persistent walk's tile counter: a call's own, so calls of one shape share no state."""
    scratch = DqScratch((2, 3, 5, 4), (2, 3, 5), 3)
    acc, delta, counts = scratch.make(torch.device("cpu"))
    assert acc.shape == (2, 3, 5, 4) and acc.is_contiguous() and acc.dtype == delta.dtype == torch.float32
    assert acc.untyped_storage().data_ptr() == delta.untyped_storage().data_ptr() == delta.data_ptr()
    assert acc.storage_offset() == 32 and acc.data_ptr() % 128 == delta.data_ptr() % 128
    assert counts.dtype == torch.int32 and counts.shape == (4, 2) and counts.is_contiguous()
    assert delta.numel() == scratch.size == 32 + acc.numel() + 8
    rows = delta[: 2 * 3 * 5]
    acc.fill_(1.0)
    rows.fill_(2.0)
    counts.fill_(3)
    assert acc.eq(1.0).all() and rows.eq(2.0).all() and counts.eq(3).all()  # no two of them overlap
    assert scratch.make(torch.device("cpu"))[2].data_ptr() != counts.data_ptr()


def test_zero_ahead_puts_a_wave_of_the_sms_between_a_unit_and_the_programs_that_zero_it():
    """The distance in grid rows: past two waves of programs on the SMs, plus one row; at most the rows there are
    (then the preprocess zeroes every row); a forced 0 turns it off."""
    assert backward_ws.zero_ahead(8, 256, 132) == 34  # 33 rows of 8 programs are 264 = 2 x 132
    assert backward_ws.zero_ahead(128, 16, 132) == 4
    assert backward_ws.zero_ahead(132, 16, 132) == 3
    assert backward_ws.zero_ahead(8, 30, 132) == 30
    assert backward_ws.zero_ahead(8, 256, 132, forced=1) == 1
    assert backward_ws.zero_ahead(8, 256, 132, forced=0) == 256
    # off where it measured slower (ZERO_MIN_SEQ: d = 128 causal below 2048 keys), unless forced
    assert backward_ws.zero_ahead(8, 256, 132, on=False) == 256
    assert backward_ws.zero_ahead(8, 256, 132, forced=2, on=False) == 2
    assert not backward_ws.zeroes_ahead(128, True, 1024) and backward_ws.zeroes_ahead(128, True, 2048)
    assert backward_ws.zeroes_ahead(128, False, 1024) and backward_ws.zeroes_ahead(64, True, 1024)
    assert backward_ws.config_for(128, {"ZERO_AHEAD": 2})["ZERO_AHEAD"] == 2
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="ZERO_AHEAD=.* must be an int >= 0"):
            backward_ws.config_for(128, {"ZERO_AHEAD": bad})


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_the_preprocess_zeroes_the_accumulator_of_the_units_below_its_bound_only(packed):
    """_bwd_preprocess writes D = rowsum(dO * O) for every row, zeroes dQ's accumulator in the rows of the query
    heads whose unit ((b * H + h) // GROUP) is below ZERO_UNITS, leaving the rest to the dK/dV programs
    (backward_ws._zero_issue), and sets their per-unit counts and the persistent walk's tile counter (the row
    after them) to 0. The accumulator is [B, H, N, D], or packed [total, H, D]."""
    from flashbench.kernels.backward import _bwd_preprocess

    B, H, G, N, D, bound = (1, 6, 2, 150, 32, 2) if packed else (2, 4, 2, 150, 32, 3)
    g = torch.Generator().manual_seed(5)
    shape = (N, H, D) if packed else (B, H, N, D)
    o, do = (torch.randn(*shape, generator=g).to(DEVICE) for _ in range(2))
    acc = torch.full(shape, 7.0, device=DEVICE)
    delta = torch.empty(B * H * N, device=DEVICE)
    counts = torch.full((B * H // G + 2, 2), 5, dtype=torch.int32, device=DEVICE)
    if packed:  # [total, H, D] read as one batch of H heads
        rows = (0, o.stride(1), o.stride(0), 0, do.stride(1), do.stride(0))
        strides = (0, acc.stride(1), acc.stride(0))
    else:
        rows = (*o.stride()[:3], *do.stride()[:3])
        strides = acc.stride()[:3]
    _bwd_preprocess[(triton_cdiv(N, 64), B * H)](
        o, do, delta, acc, counts, *rows, H, N, *strides, G, bound, HEAD_DIM=D, BLOCK_M=64, ZERO_DQ=True
    )
    # the dK/dV kernel's counts per unit and its tile counter, set back for its launch; nothing past them
    assert counts[:-1].eq(0).all() and counts[-1].eq(5).all()
    heads = acc if not packed else acc.permute(1, 0, 2).unsqueeze(0)  # [B, H, N, D]
    want = (o * do).sum(-1)
    want = want.permute(1, 0).reshape(-1) if packed else want.reshape(-1)
    torch.testing.assert_close(delta, want, rtol=1e-5, atol=1e-5)
    for b in range(B):
        for h in range(H):
            zeroed = (b * H + h) // G < bound
            assert heads[b, h].eq(0.0 if zeroed else 7.0).all(), (b, h)


def test_dq_is_converted_behind_the_one_pass_but_where_it_measured_slower():
    """By default behind the pass (a dependent launch), but at d = 128 causal from 16384 keys (CONVERT_MAX_SEQ);
    CONVERT_BEHIND forces either way; the two passes have no accumulator to convert."""
    d128, d64 = backward_ws.config_for(128), backward_ws.config_for(64)
    assert backward_ws.converts_behind(d128, 128, True, 8192)
    assert not backward_ws.converts_behind(d128, 128, True, 16384)
    assert backward_ws.converts_behind(d128, 128, False, 16384) and backward_ws.converts_behind(
        d64, 64, True, 16384
    )
    assert backward_ws.converts_behind({**d128, "CONVERT_BEHIND": 1}, 128, True, 16384)
    assert not backward_ws.converts_behind({**d128, "CONVERT_BEHIND": 0}, 128, True, 1024)
    assert not backward_ws.converts_behind(backward_ws.config_for(128, backward_ws.TWO_PASS), 128, True, 1024)
    assert backward_ws.kernel_constexprs(d128, 128, True, 16384)["BEHIND"] is False
    with pytest.raises(ValueError, match="CONVERT_BEHIND=2 must be one of"):
        backward_ws.config_for(128, {"CONVERT_BEHIND": 2})


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_dq_convert_writes_every_units_region_in_dqs_dtype_once_its_count_is_whole(packed):
    """DqConvert over the one pass's units: [B, H, N, D] with a unit per batch and K/V head (its GROUP query
    heads' rows), or packed [total, H, D] with a unit per K/V head (its GROUP heads' columns of every row). With
    every unit's count whole, each element of dQ is its accumulator's, rounded once; the counts are only read.
    Row counts that are no multiple of the 64-row tile."""
    from flashbench.kernels.backward import DqConvert

    B, H, G, N, D = (1, 6, 3, 150, 32) if packed else (2, 4, 2, 100, 32)
    units, parts = B * H // G, 5
    shape = (N, H, D) if packed else (B, H, N, D)
    acc = torch.randn(*shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    dq = torch.full(shape, float("nan"), dtype=torch.float16, device=DEVICE)
    counts = torch.tensor([[7, parts]] * units, dtype=torch.int32, device=DEVICE)
    if packed:  # rows of H * D; a unit is G * D columns
        convert = DqConvert(N, G * D, H * D, G * D, units, D, parts)
    else:  # a unit is G * N contiguous rows of D
        convert = DqConvert(G * N, D, D, G * N * D, units, D, parts)
    assert convert.call.grid == (triton_cdiv(convert.args[1], 64) * convert.args[2] // D, units, 1)
    convert(acc, dq, counts)
    assert torch.equal(dq, acc.to(torch.float16))
    assert counts.tolist() == [[7, parts]] * units


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)

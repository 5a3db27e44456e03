"""The bundled kernels as users run them: inside torch.compile(fullgraph=True) (the custom ops of kernels/ops.py),
captured in CUDA graphs, and through the direct launch path their plans take after a first call.

On CPU torch.compile runs with the aot_eager backend (no C++ compiler needed) over the interpreter; fullgraph=True
fails on any graph break, so a pass means one graph held the forward, and its backward came from the registered
autograd formula. On the GPU the default (inductor) backend runs, and CUDA graphs replay after new data is
copied into the captured inputs.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import flash_attn, flash_decode

from flashbench.engine.correctness import verify
from flashbench.engine.timing import capture_cuda_graph

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
BACKEND = "inductor" if CUDA else "aot_eager"
DTYPE = torch.bfloat16 if CUDA else torch.float16


def _inputs(b: int, h: int, hkv: int, n: int, d: int, grad: bool = True) -> tuple[torch.Tensor, ...]:
    q = torch.randn(b, h, n, d, device=DEVICE, dtype=DTYPE)
    k, v = (torch.randn(b, hkv, n, d, device=DEVICE, dtype=DTYPE) for _ in range(2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _grads(out: torch.Tensor, q, k, v, do) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    return (out, *torch.autograd.grad(out, (q, k, v), do))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_compiles_without_graph_breaks_and_matches_eager(causal: bool) -> None:
    torch._dynamo.reset()
    q, k, v = _inputs(1, 4, 2, 128 if CUDA else 64, 64)  # GQA 4/2
    do = torch.randn_like(q)

    def step(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attn(q, k, v, causal=causal) * 2.0

    compiled = torch.compile(step, fullgraph=True, backend=BACKEND)
    got = _grads(compiled(q, k, v), q, k, v, do)
    want = _grads(step(q, k, v), q, k, v, do)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert torch.equal(g, w), f"{name}: compiled differs from eager"


def test_flash_attn_with_a_window_compiles() -> None:
    torch._dynamo.reset()
    q, k, v = _inputs(1, 2, 2, 128, 64)
    do = torch.randn_like(q)
    compiled = torch.compile(
        lambda q, k, v: flash_attn(q, k, v, window=(32, 0)), fullgraph=True, backend=BACKEND
    )
    got = _grads(compiled(q, k, v), q, k, v, do)
    want = _grads(flash_attn(q, k, v, window=(32, 0)), q, k, v, do)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_forced_config_under_compile_is_refused_in_one_line() -> None:
    torch._dynamo.reset()
    q, k, v = _inputs(1, 2, 2, 64, 64, grad=False)
    compiled = torch.compile(
        lambda q, k, v: flash_attn(
            q, k, v, config={"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
        ),
        fullgraph=True,
        backend=BACKEND,
    )
    with pytest.raises(Exception, match="config= is not taken under torch.compile"):
        compiled(q, k, v)


@pytest.mark.parametrize("paged", [False, True])
def test_flash_decode_compiles_without_graph_breaks_and_matches_eager(paged: bool) -> None:
    torch._dynamo.reset()
    b, hq, hkv, n, d, page = 2, 4, 2, 96, 64, 16
    q = torch.randn(b, hq, 1, d, device=DEVICE, dtype=DTYPE)
    k, v = (torch.randn(b, hkv, n, d, device=DEVICE, dtype=DTYPE) for _ in range(2))
    lengths = torch.tensor([n, n - 30], dtype=torch.int32, device=DEVICE)
    table = None
    if paged:  # sequence i's pages, in order, from a pool of b * n / page pages
        pages = n // page
        pool = lambda t: (
            t.reshape(b, hkv, pages, page, d).permute(0, 2, 1, 3, 4).reshape(b * pages, hkv, page, d)
        )  # noqa: E731
        k, v = pool(k), pool(v)
        table = torch.arange(b * pages, dtype=torch.int32, device=DEVICE).reshape(b, pages)

    def step(q, k, v, lengths, table):  # type: ignore[no-untyped-def]
        return flash_decode(q, k, v, cache_seqlens=lengths, block_table=table, validate=False)

    compiled = torch.compile(step, fullgraph=True, backend=BACKEND)
    assert torch.equal(compiled(q, k, v, lengths, table), step(q, k, v, lengths, table))


def test_flash_decode_over_an_e4m3_cache_compiles_with_its_scales() -> None:
    torch._dynamo.reset()
    b, hq, hkv, n, d = 2, 4, 2, 64, 64
    q = torch.randn(b, hq, 1, d, device=DEVICE, dtype=torch.float16)
    k, v = (torch.randn(b, hkv, n, d, device=DEVICE).to(torch.float8_e4m3fn) for _ in range(2))
    k_scale, v_scale = (torch.rand(b, hkv, device=DEVICE) + 0.5 for _ in range(2))

    def step(q, k, v, k_scale, v_scale):  # type: ignore[no-untyped-def]
        return flash_decode(q, k, v, k_scale=k_scale, v_scale=v_scale, validate=False)

    compiled = torch.compile(step, fullgraph=True, backend=BACKEND)
    out = compiled(q, k, v, k_scale, v_scale)
    assert torch.equal(out, step(q, k, v, k_scale, v_scale))
    assert not torch.equal(out, step(q, k, v, k_scale, v_scale * 2))  # the scales reach the compiled op


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [512, 2048])  # the tl forward and the Gluon kernels (H100)
def test_a_cuda_graph_of_a_training_step_replays_new_data_exactly(causal: bool, n: int) -> None:
    q, k, v = _inputs(2, 8, 8, n, 128)
    do = torch.randn_like(q)

    def step() -> tuple[torch.Tensor, ...]:
        return _grads(flash_attn(q, k, v, causal=causal), q, k, v, do)

    captured: tuple[torch.Tensor, ...] = ()

    def capture() -> None:
        nonlocal captured
        captured = step()

    graph = capture_cuda_graph(capture)  # warm-up on a side stream, then the capture
    with torch.no_grad():  # new data into the captured inputs
        for t in (q, k, v, do):
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    # the one-pass backward adds dQ in fp32 in no fixed order, then rounds to bf16: within two bf16 ulps (and an
    # fp32 reordering's absolute error far below the largest element); the rest bitwise
    for name, g, w in zip(("out", "dq", "dk", "dv"), captured, eager, strict=True):
        if name == "dq":
            atol = 1e-3 * w.float().abs().max().item()
            assert torch.allclose(g.float(), w.float(), rtol=2**-7, atol=atol), name
        else:
            assert torch.equal(g, w), name


@pytest.mark.gpu
def test_a_cuda_graph_of_a_decode_step_replays_new_data_exactly() -> None:
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 8, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.tensor([8192, 5000, 17, 4096], dtype=torch.int32, device="cuda")
    step = lambda: flash_decode(q, k, v, cache_seqlens=lengths, validate=False)  # noqa: E731
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, step())


@pytest.mark.gpu
# the tl forward with and without its half-width diagonal descriptors, the Gluon kernels causal and not
@pytest.mark.parametrize(("n", "causal"), [(512, True), (512, False), (1024, True), (2048, False)])
def test_later_calls_launch_directly_and_stay_correct(n: int, causal: bool) -> None:
    """The plan's first call goes through Triton's JIT, later ones launch the compiled kernels: fresh data on
    every call, each checked against the float64 oracle, and a misaligned view gets a plan of its own."""
    from flashbench.kernels import backward, flash_v2

    for _ in range(3):
        q, k, v = _inputs(2, 8, 4, n, 128)
        do = torch.randn_like(q)
        out, dq, dk, dv = _grads(flash_attn(q, k, v, causal=causal), q, k, v, do)
        verdict = verify({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=causal, do=do)
        assert verdict.ok, verdict.reason
    plans = list(flash_v2._PLANS.plans.values()) + list(backward._PLANS.plans.values())
    assert any(getattr(getattr(p, "call", None), "direct", False) for p in plans)
    # a view whose base is 2 bytes past a 16-byte boundary: Triton would specialize it differently
    buf = torch.randn(2 * 8 * n * 128 + 1, device="cuda", dtype=torch.bfloat16)
    q_odd = buf[1:].view(2, 8, n, 128)
    k2, v2 = (torch.randn(2, 4, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = flash_attn(q_odd, k2, v2, causal=causal)
    assert verify({"out": out}, q_odd, k2, v2, causal=causal).ok


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "causal"), [(1024, False), (4096, True), (2048, False)])
def test_later_fp8_calls_launch_directly_and_stay_correct(n: int, causal: bool) -> None:
    """The FP8 forward's plans (the tl kernel at d = 64, the Gluon kernel at d = 128, causal or not) on
    fresh inputs three times each: the second and third launch the compiled kernel; each held to the fp8
    budget."""
    from test_fp8 import check

    for seed in range(3):
        check(2, 8, 4, n, n, 64 if n == 1024 else 128, causal=causal, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "causal"), [(512, True), (2048, False)])  # the tl forward and the Gluon one
def test_the_raw_launch_reuses_encoded_maps_and_matches_tritons_launcher(n: int, causal: bool) -> None:
    """After its first call a plan's kernel launches through Triton's C launcher with the tensor maps of earlier
    calls at the same addresses (launch.RawLaunch): repeated calls on the same tensors encode no new map, and the
    output is bit for bit what Triton's own launcher gives."""
    from flashbench.kernels import flash_v2

    flash_v2._PLANS.plans.clear()  # this test's plan is then the only one
    flash_v2._CHECKED.plans.clear()
    q, k, v = _inputs(2, 8, 4, n, 128, grad=False)
    out = flash_attn(
        q, k, v, causal=causal
    )  # the JIT (a TunedCall: its pick, then its KernelCall's first call)
    for _ in range(3):  # outputs dropped at once: the allocator hands the next call the same block
        flash_attn(q, k, v, causal=causal)
    (plan,) = flash_v2._PLANS.plans.values()
    call = getattr(plan.call, "call", plan.call)  # a TunedCall's KernelCall, or the Gluon plan's own
    if call.raw is None:
        pytest.skip("this Triton's launcher is not the one launch.RawLaunch mirrors (Triton 3.6)")
    maps = len(call.raw.maps)
    for _ in range(5):
        flash_attn(q, k, v, causal=causal)
    assert len(call.raw.maps) == maps
    assert torch.equal(flash_attn(q, k, v, causal=causal), out)
    raw, call.raw = call.raw, None
    try:
        through_triton = flash_attn(q, k, v, causal=causal)
    finally:
        call.raw = raw
    assert torch.equal(through_triton, out)


@pytest.mark.gpu
# the tl forward and backward passes; the Gluon forward and one-pass backward
@pytest.mark.parametrize(("n", "causal"), [(512, True), (1024, True)])
def test_a_launch_hook_sees_a_compiled_plans_launches_and_they_stay_correct(n: int, causal: bool) -> None:
    """With a profiler's launch hook installed, a plan whose kernels launch directly sends each launch through
    Triton's JIT again, with real descriptors rebuilt over the tensors (launch.Descriptor.over): the hook sees
    every kernel of the step, and the output and gradients stay within the oracle's budget."""
    from triton import knobs

    q, k, v = _inputs(2, 8, 4, n, 128)
    do = torch.randn_like(q)
    for _ in range(2):  # the JIT's calls, then direct launches
        _grads(flash_attn(q, k, v, causal=causal), q, k, v, do)
    seen: list[object] = []
    knobs.runtime.launch_enter_hook.add(seen.append)  # as Triton's profiler (proton) installs its hook
    try:
        out, dq, dk, dv = _grads(flash_attn(q, k, v, causal=causal), q, k, v, do)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert len(seen) >= 3  # the forward, the preprocess and at least one backward pass
    verdict = verify({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=causal, do=do)
    assert verdict.ok, verdict.reason

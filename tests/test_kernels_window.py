"""flash_attn's sliding window (flash-attn's window_size, bottom-right aligned) against the float64 reference.

The oracle and its budget are flashbench.engine.correctness (the sweep's): out, dq, dk, dv of the bundled kernel
within 2x torch's own low-precision error + eps. Outputs are NaN-poisoned (torch.empty) so an unwritten element
fails. On the CPU machine through Triton's interpreter (fp16, fp32: its bf16 dot is wrong); the `gpu` tests run
bf16 and fp16 at d = 64 and 128 on CUDA, with the shapes that take the Gluon forward on Hopper.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_attn, last_config
from tiers import smoke

from flashbench.engine import correctness

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
FP32_IEEE = 1e-6  # the kernel's fp32 dots are IEEE fp32 (errors ~3e-7 here), as in test_kernels.py
# The interpreter's tile (kernels/configs.py INTERPRET_FWD / INTERPRET_BWD): 64 x 64.
TILE = 64


pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty, no autotuning


def inputs(b, h, hkv, nq, nk, d, dtype, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shapes = ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d), (b, h, nq, d))
    return [torch.randn(s, generator=gen).to(device=DEVICE, dtype=dtype) for s in shapes]


def run(q, k, v, do, *, causal, window, config=None):
    """out, dq, dk, dv of flash_attn with the window."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attn(*leaves, causal=causal, window=window, config=config)
    grads = torch.autograd.grad(out, leaves, do)
    return dict(zip(("out", "dq", "dk", "dv"), (out, *grads), strict=True))


def check(b, h, hkv, nq, nk, d, dtype, *, causal, window, config=None):
    q, k, v, do = inputs(b, h, hkv, nq, nk, d, dtype)
    results = run(q, k, v, do, causal=causal, window=window, config=config)
    kw = dict(causal=causal, do=do, window=window)
    ref = correctness.reference(q, k, v, **kw)
    verdict = correctness.compare(results, ref, correctness.reference(q, k, v, **kw, dtype=dtype), dtype)
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"
    if dtype == torch.float32:  # relative errors; a gradient that is exactly 0 (one key per row) has none
        tight = {n: e for n, (e, _) in verdict.errors.items() if ref[n].abs().sum() > 0}
        assert max(tight.values()) < FP32_IEEE, verdict.describe()
    return results


# (nq, nk, causal, window): windows smaller than a tile, spanning several, larger than N, one-sided, empty rows
WINDOWS = [
    (200, 200, False, (3, 0)),  # smaller than a tile, left only through the diagonal
    (200, 200, False, (0, 0)),  # each row sees its own key only
    (200, 200, False, (70, 5)),  # both sides, a block and more to the left
    (200, 200, False, (130, -1)),  # left only, no right limit
    (200, 200, False, (-1, 7)),  # right only: a causal mask shifted 7 keys right
    (200, 200, True, (100, -1)),  # causal + left window
    (129, 300, True, (64, 0)),  # seq_q < seq_k, bottom-right
    (300, 129, False, (20, 10)),  # seq_q > seq_k: the first rows see no key
    (150, 150, False, (1000, 1000)),  # larger than N: the full mask
    (1, 257, True, (30, 0)),  # one query token over a longer key range
]


# The masks are the same code in every dtype: the smoke tier holds fp32 (the IEEE path, to FP32_IEEE) on two windows,
# both sides and causal + left, and fp16 on all (on CUDA each dtype x mask is three compiles; ~4 s a case on 2 CPU
# cores through the interpreter); the full tier runs fp32 on every window.
@smoke(lambda dtype, window, **_: dtype == torch.float16 or window in ((70, 5), (100, -1)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize(
    "nq,nk,causal,window", WINDOWS, ids=[f"{w[0]}x{w[1]}-c{int(w[2])}-{w[3]}" for w in WINDOWS]
)
def test_window_forward_backward_within_budget(nq, nk, causal, window, dtype):
    check(1, 2, 2, nq, nk, 32, dtype, causal=causal, window=window)


@pytest.mark.parametrize("window", [(40, 0), (5, 90)])
def test_window_gqa_within_budget(window):
    check(2, 4, 2, 190, 190, 64, torch.float16, causal=False, window=window)


@pytest.mark.parametrize("config", [{"BLOCK_M": 32, "BLOCK_N": 64}, {"BLOCK_M": 16, "BLOCK_N": 16}])
def test_window_other_tiles_within_budget(config):
    """Half-width diagonal blocks (BLOCK_N > BLOCK_M) and tiles much smaller than the window."""
    cfg = {**config, "num_warps": 4, "num_stages": 1}
    check(1, 2, 1, 170, 170, 32, torch.float32, causal=True, window=(45, -1), config=cfg)


def test_rows_that_see_no_key_output_zero_and_get_no_gradient():
    # seq_q = 300 over seq_k = 100 with right = 10: query i sits at key i - 200 and sees nothing while i < 190.
    q, k, v, do = inputs(1, 2, 1, 300, 100, 32, torch.float32)
    results = run(q, k, v, do, causal=False, window=(20, 10))
    assert torch.equal(results["out"][:, :, :190], torch.zeros_like(results["out"][:, :, :190]))
    assert torch.equal(results["dq"][:, :, :190], torch.zeros_like(results["dq"][:, :, :190]))
    assert results["out"][:, :, 190:].abs().sum() > 0
    verdict = correctness.verify(results, q, k, v, causal=False, do=do, window=(20, 10))
    assert verdict.ok, verdict.describe()


def test_causal_window_right_minus_one_and_zero_are_the_same():
    q, k, v, do = inputs(1, 2, 2, 150, 150, 32, torch.float32)
    a = run(q, k, v, do, causal=True, window=(33, -1))
    b = run(q, k, v, do, causal=True, window=(33, 0))
    c = run(q, k, v, do, causal=False, window=(33, 0))
    for name in a:
        assert torch.equal(a[name], b[name]) and torch.equal(a[name], c[name]), name


def test_no_window_and_minus_one_window_are_the_plain_kernel():
    q, k, v, do = inputs(1, 2, 2, 100, 100, 32, torch.float32)
    plain = run(q, k, v, do, causal=True, window=None)
    assert all(torch.equal(plain[n], t) for n, t in run(q, k, v, do, causal=True, window=(-1, -1)).items())


def test_blocks_outside_every_window_are_skipped_not_masked():
    """K, V, Q and dO rows far outside the windows of the checked rows hold NaN: a kernel that loaded and masked
    those blocks would spread the NaN (0 * NaN = NaN in P V and dS K); one that skips them stays exact."""
    n, window = 8 * TILE, (TILE // 2, 0)
    q, k, v, do = inputs(1, 2, 1, n, n, 32, torch.float32)
    clean = correctness.reference(q, k, v, causal=True, do=do, window=window)
    far = slice(
        0, 2 * TILE
    )  # rows >= 4 tiles see keys >= 3.5 tiles only; keys >= 4 tiles see rows >= 4 tiles
    for t in (q, k, v, do):
        t[:, :, far] = float("nan")
    got = run(q, k, v, do, causal=True, window=window)
    keep = slice(4 * TILE, n)
    for name in ("out", "dq"):
        torch.testing.assert_close(
            got[name][:, :, keep].double(), clean[name][:, :, keep], atol=1e-5, rtol=1e-5
        )
    for name in ("dk", "dv"):
        torch.testing.assert_close(
            got[name][:, :, keep].double(), clean[name][:, :, keep], atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize(
    "causal,window,what",
    [
        (True, (10, 5), "causal=True means window right = 0"),
        (False, (10,), "pair"),
        (False, (-2, 0), "left must be an int >= -1"),
        (False, (1.5, 0), "left must be an int >= -1"),
    ],
)
def test_bad_windows_are_refused_with_the_reason(causal, window, what):
    q, k, v, _ = inputs(1, 1, 1, 8, 8, 32, torch.float32)
    with pytest.raises(KernelUnsupported, match=what):
        flash_attn(q, k, v, causal=causal, window=window)


# ---------------------------------------------------------------------------------------------- GPU
GPU_WINDOWS = [
    (4096, 4096, True, (1024, 0)),  # d=128 causal N >= 2048: the Gluon forward on Hopper, else tl
    (4096, 4096, False, (512, 512)),
    (2048, 4096, True, (300, -1)),
    (1000, 1000, False, (-1, 100)),
    (4096, 2048, False, (256, 0)),  # rows that see no key
]


@pytest.mark.gpu
@smoke(lambda d, dtype, **_: d == 128 and dtype == torch.bfloat16)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "nq,nk,causal,window", GPU_WINDOWS, ids=[f"{w[0]}x{w[1]}-c{int(w[2])}-{w[3]}" for w in GPU_WINDOWS]
)
def test_gpu_window_forward_backward_within_budget(nq, nk, causal, window, d, dtype):
    if not HAS_CUDA:
        pytest.skip("needs CUDA")
    check(2, 4, 2, nq, nk, d, dtype, causal=causal, window=window)
    assert last_config() is not None


@pytest.mark.gpu
@smoke(lambda d, window: d == 128)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", [(4096, 0), (100, 0), (4096, -1)])
def test_gpu_long_causal_window_forward_within_budget(d, window):
    """The benchmark's shape class (causal window at N = 16k, bf16), forward only, on whichever forward the
    dispatch picks; last_config says which (at d = 256 the Gluon forward's half-width output buffers, O_HALVES)."""
    if not HAS_CUDA:
        pytest.skip("needs CUDA")
    q, k, v, _ = inputs(1, 4, 4, 16384, 16384, d, torch.bfloat16)
    out = flash_attn(q, k, v, causal=True, window=window)
    verdict = correctness.verify({"out": out}, q, k, v, causal=True, window=window)
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}; config {last_config()}"


def test_gluon_forward_takes_only_windows_with_a_right_limit_of_zero():
    from flashbench.kernels import flash_ws

    if not flash_ws.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    q = torch.zeros(1, 1, 128, 128, dtype=torch.float16)
    assert "only a right limit of 0" in flash_ws.supported(q, q, q, False, window=(256, 3))
    assert "only a right limit of 0" in flash_ws.supported(q, q, q, False, window=(-1, 0))
    assert "only a right limit of 0" not in (flash_ws.supported(q, q, q, True, window=(256, 0)) or "")


HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@smoke(
    lambda d, **_: d == 64
)  # the d = 128 window runs on Gluon in test_gpu_window_forward_backward_within_budget
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "nq,nk,causal,window",
    [(4096, 4096, True, (1024, 0)), (2048, 4096, False, (700, 0)), (4096, 4096, True, (130, -1))],
)
def test_gpu_gluon_window_forward_within_budget(nq, nk, causal, window, d):
    """The Gluon forward forced on windows (left edge skipped and masked, rows whose window starts past a tile's
    first block), bf16, against the float64 reference; the backward is the tl one."""
    if not HOPPER:
        pytest.skip("the Gluon forward needs a Hopper GPU")
    q, k, v, do = inputs(2, 4, 2, nq, nk, d, torch.bfloat16)
    results = run(q, k, v, do, causal=causal, window=window, config={"kernel": "gluon-ws"})
    verdict = correctness.verify(results, q, k, v, causal=causal, do=do, window=window)
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"


@pytest.mark.gpu
def test_gpu_dispatch_sends_wide_causal_windows_to_gluon_and_the_rest_to_tl():
    if not HOPPER:
        pytest.skip("the Gluon forward needs a Hopper GPU")
    from flashbench.kernels import flash_ws

    q, k, v, _ = inputs(1, 2, 2, 4096, 4096, 128, torch.bfloat16)
    flash_attn(q, k, v, causal=True, window=(flash_ws.GLUON_MIN_WINDOW, 0))
    assert last_config().get("kernel") == "gluon-ws"
    for causal, window in ((True, (flash_ws.GLUON_MIN_WINDOW - 1, 0)), (False, (2048, 2048))):
        flash_attn(q, k, v, causal=causal, window=window)
        assert "kernel" not in last_config(), (causal, window, last_config())

"""Bundled Triton kernels against the float64 reference, forward and backward, with the sweep's error budget.

The oracle is flashbench.engine.correctness, the one the sweep uses (flash-attn's rule: rel_err(kernel, ref64)
<= 2 * rel_err(torch attention in the same dtype, ref64) + eps, relative Frobenius norm, for the output and for
dq, dk, dv). Every tensor the kernels allocate is NaN-filled
first, so an element left unwritten fails the finiteness check.

On the CPU machine the kernels run through Triton's interpreter (fp16, fp32: its bf16 tl.dot is wrong); on
CUDA the same tests run with bf16 too, plus the larger `gpu` shapes.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_attn, flash_attn_stored_p, flash_attn_v1, last_config
from flashbench.kernels.descriptors import use_tma
from tiers import smoke

from flashbench.engine import correctness

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
KERNELS = {"v2": flash_attn, "stored_p": flash_attn_stored_p, "v1": flash_attn_v1}
LOWP = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]
DTYPES = [*LOWP, torch.float32]
FP32_IEEE = 1e-6  # the bundled kernels' fp32 dots are IEEE fp32: errors ~3e-7 in these tests


pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty, no autotuning

# On CUDA every kernel x dtype x head dim x mask is its own Triton compile (seconds each: the GPU tier's time), so
# the smoke tier takes the shipped FA2 kernel (v2) through every case and the measuring variants (stored-P, the
# FA1 order) through the batched GQA one; the interpreter compiles nothing and runs them all (tests/tiers.py).
V2_ON_CUDA = smoke(lambda kernel, **_: kernel == "v2" or not HAS_CUDA)


def test_poisoning_is_active():
    assert torch.empty(3).isnan().all() and torch.empty_like(torch.ones(2)).isnan().all()


def make(shape, dtype, seed: int, *, device: str = DEVICE) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def inputs(b, h, hkv, nq, nk, d, dtype, seed=0):
    q = make((b, h, nq, d), dtype, seed)
    k = make((b, hkv, nk, d), dtype, seed + 1)
    v = make((b, hkv, nk, d), dtype, seed + 2)
    return q, k, v


def check(fn, q, k, v, *, causal: bool, sm_scale=None, config=None, do=None, backward: bool = True) -> None:
    """Run fn forward (+ backward) and hold out, dq, dk, dv to the sweep's error budget against float64
    (flashbench.engine.correctness: the one oracle). The bundled kernels' fp32 path uses IEEE fp32 dots (no TF32),
    which the shared budget does not require (it admits TF32 for other providers): held here to FP32_IEEE."""
    dtype = q.dtype
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
    out = fn(*leaves, causal=causal, sm_scale=sm_scale, config=config)
    assert out.shape == q.shape and out.dtype == dtype
    results = {"out": out}
    if do is None:
        do = make(tuple(q.shape), dtype, seed=99)
    if backward:
        results.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, do), strict=True))
    verdict = correctness.verify(
        results, q, k, v, causal=causal, sm_scale=sm_scale, do=do if backward else None
    )
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"
    if dtype == torch.float32:
        worst = max(err for err, _ in verdict.errors.values())
        assert worst <= FP32_IEEE, f"fp32 error {worst:.2e} > {FP32_IEEE:.0e}: a TF32 dot on the IEEE path?"


# ---------------------------------------------------------------------------------------------------------
# Every kernel, every dtype, causal or not: batch 2, GQA (4 query heads on 2 kv heads), N = 127.
# ---------------------------------------------------------------------------------------------------------


# fp32 (IEEE dots) of the measuring variants, whose sweeps run in 16-bit: the full tier's, here and on a CPU
@smoke(lambda kernel, dtype, **_: kernel == "v2" or dtype != torch.float32)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("kernel", KERNELS)
def test_fwd_bwd_match_reference_batch_gqa(kernel, dtype, causal):
    check(KERNELS[kernel], *inputs(2, 4, 2, 127, 127, 32, dtype), causal=causal)


@V2_ON_CUDA
@pytest.mark.parametrize("n", [1, 17, pytest.param(1000, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_odd_sequence_lengths(kernel, n):
    # N = 1000 crosses 16 key blocks (online rescaling) and ends in a partial block; causal halves its cost.
    check(KERNELS[kernel], *inputs(1, 1, 1, n, n, 32, torch.float16, seed=n), causal=n != 17)


@V2_ON_CUDA
@pytest.mark.parametrize(("nq", "nk"), [(17, 130), (130, 17)], ids=["q<k", "q>k"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_seq_q_differs_from_seq_k(kernel, causal, nq, nk):
    # q>k causal: the first nq - nk query rows see no key; they must come out 0 with 0 gradients.
    check(KERNELS[kernel], *inputs(1, 2, 1, nq, nk, 64, torch.float16, seed=nq), causal=causal)


@V2_ON_CUDA
@pytest.mark.parametrize("d", [32, 64, 128, 256])
@pytest.mark.parametrize("kernel", KERNELS)
def test_head_dims(kernel, d):
    check(KERNELS[kernel], *inputs(1, 1, 1, 70, 70, d, torch.float16, seed=d), causal=True)


@V2_ON_CUDA
@pytest.mark.parametrize("kernel", KERNELS)
def test_custom_sm_scale(kernel):
    check(KERNELS[kernel], *inputs(1, 2, 2, 40, 40, 32, torch.float16, seed=5), causal=False, sm_scale=0.3)


@V2_ON_CUDA
@pytest.mark.parametrize("kernel", KERNELS)
def test_negative_sm_scale(kernel):
    # The kernels scale after the row max, which needs scale >= 0; a negative scale is folded into q.
    check(KERNELS[kernel], *inputs(1, 2, 1, 45, 45, 32, torch.float16, seed=6), causal=True, sm_scale=-0.4)


def test_tma_and_pointer_paths_agree(monkeypatch):
    """The FA2 forward streams K/V through tensor descriptors where it may (emulated by the interpreter) and
    through pointers otherwise; both are held to the budget and must agree to rounding."""
    q, k, v = inputs(1, 2, 1, 150, 150, 64, torch.float16, seed=8)
    assert use_tma(q, k, v)
    check(flash_attn, q, k, v, causal=True)
    with_tma = flash_attn(q, k, v, causal=True)
    monkeypatch.setenv("FLASHBENCH_TMA", "0")
    assert not use_tma(q, k, v)
    check(flash_attn, q, k, v, causal=True)
    torch.testing.assert_close(flash_attn(q, k, v, causal=True), with_tma, atol=2e-3, rtol=0)


def test_host_descriptors_take_the_tile_of_each_launch(monkeypatch):
    """With TMA the FA2 forward (Q, K, V, O, and the causal diagonal's half-height K and V) and both backward
    passes (Q, dO; K, V) move their tiles through 4-D descriptors made on the host, each launch's sized to the
    config it runs with."""
    from flashbench.kernels import configs, descriptors, launch

    launched = []  # (argument, its tensor's shape, block shape, the launch's BLOCK_M and BLOCK_N) per descriptor
    size = descriptors.size_descriptors

    def spy(kernel, args, constexprs, meta):
        size(kernel, args, constexprs, meta)
        launched.extend(
            (name, tuple(a.base.shape), tuple(a.block_shape), meta["BLOCK_M"], meta["BLOCK_N"])
            for name, a in zip(kernel.arg_names, args, strict=False)
            if isinstance(a, descriptors.TensorDescriptor)
        )

    monkeypatch.setattr(launch, "size_descriptors", spy)
    q, k, v = inputs(2, 4, 2, 150, 130, 64, torch.float16, seed=12)
    check(flash_attn, q, k, v, causal=True)
    qs, kvs = tuple(q.shape), tuple(k.shape)
    # Which tile dimension sizes each descriptor: the forward walks BLOCK_M query rows over BLOCK_N keys (the
    # causal diagonal in half-width key blocks), the backward's dK/dV pass BLOCK_N keys over BLOCK_M query rows.
    rows = {"KD": ("n", 1), "VD": ("n", 1), "KD2": ("n", 2), "VD2": ("n", 2), "QD": ("m", 1), "OD": ("m", 1)}
    rows |= {"DOD": ("m", 1)}
    fwd = last_config() if HAS_CUDA else configs.INTERPRET_FWD  # what the forward ran with
    assert [x[0] for x in launched] == ["KD", "VD", "KD2", "VD2", "QD", "OD", "QD", "DOD", "KD", "VD"]
    assert launched[0][3:] == (fwd["BLOCK_M"], fwd["BLOCK_N"])
    for name, shape, block, bm, bn in launched:
        dim, div = rows[name]
        assert shape == (kvs if name[0] in "KV" else qs), name
        assert block == (1, 1, (bn if dim == "n" else bm) // div, 64), (name, block, bm, bn)
    if not HAS_CUDA:  # the interpreter's fixed configs: the whole list, literally
        m, n = configs.INTERPRET_FWD["BLOCK_M"], configs.INTERPRET_FWD["BLOCK_N"]
        bm, bn = configs.INTERPRET_BWD["BLOCK_M"], configs.INTERPRET_BWD["BLOCK_N"]
        assert [x[:3] for x in launched] == [
            ("KD", kvs, (1, 1, n, 64)),
            ("VD", kvs, (1, 1, n, 64)),
            ("KD2", kvs, (1, 1, n // 2, 64)),
            ("VD2", kvs, (1, 1, n // 2, 64)),
            ("QD", qs, (1, 1, m, 64)),
            ("OD", qs, (1, 1, m, 64)),
            ("QD", qs, (1, 1, bm, 64)),
            ("DOD", qs, (1, 1, bm, 64)),
            ("KD", kvs, (1, 1, bn, 64)),
            ("VD", kvs, (1, 1, bn, 64)),
        ]


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_forward_without_gradients_makes_no_autograd_node(name, monkeypatch):
    """Every bundled entry point runs the forward launcher alone when nothing needs a gradient (inputs that do not
    require one, or torch.no_grad), through its autograd Function otherwise (launch.record); the output is the
    same."""
    from flashbench.kernels import launch

    applied = []
    record = launch.record
    monkeypatch.setattr(launch, "record", lambda cls, *a: applied.append(cls) or record(cls, *a))
    fn = KERNELS[name]
    q, k, v = inputs(1, 2, 1, 80, 80, 32, torch.float16, seed=21)
    plain = fn(q, k, v, causal=True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.no_grad():
        untracked = fn(*leaves, causal=True)
    assert not applied and plain.grad_fn is None and untracked.grad_fn is None
    tracked = fn(*leaves, causal=True)
    assert len(applied) == 1 and isinstance(tracked.grad_fn, torch.autograd.function.BackwardCFunction)
    assert type(tracked.grad_fn)._forward_cls is applied[0]  # the node is the Function's own
    assert torch.equal(plain, tracked.detach()) and torch.equal(plain, untracked)


def test_host_descriptors_of_one_layout_are_separate():
    """host_descriptor copies a descriptor validated once per (shape, strides, dtype): each call's has its own
    tensor and block shape, and the cache keeps no tensor alive."""
    import gc
    import weakref

    from flashbench.kernels.descriptors import host_descriptor

    a, b = (make((1, 2, 64, 32), torch.float16, seed=s) for s in (1, 2))
    da, db = host_descriptor(a), host_descriptor(b)
    assert da.base is a and db.base is b
    assert (da.shape, da.strides, da.block_shape) == ([1, 2, 64, 32], [4096, 2048, 32, 1], [1, 1, 16, 32])
    da.block_shape = [1, 1, 64, 32]
    assert db.block_shape == [1, 1, 16, 32]
    t = host_descriptor(a.transpose(1, 2).contiguous().transpose(1, 2))  # same shape, other strides
    assert t.strides == [4096, 32, 64, 1]
    gone = weakref.ref(a)
    del a, da
    gc.collect()
    assert gone() is None


# On CUDA: whole blocks, a diagonal offset past a key block, and rows that see no key.
@smoke(lambda nq, nk: (nq, nk) in ((64, 64), (96, 200), (17, 130)) or not HAS_CUDA)
@pytest.mark.parametrize(("nq", "nk"), [(64, 64), (150, 150), (96, 200), (200, 96), (17, 130)])
def test_half_width_diagonal_blocks(monkeypatch, nq, nk):
    """Causal with key blocks wider than the query tile: the masked key range runs in blocks of BLOCK_N // 2,
    through half-height descriptors on the TMA path and through pointers otherwise; a square tile (full-width
    diagonal blocks) gives the same attention. Diagonal offsets (nk != nq), ragged tails and rows that see no
    key (nq > nk) included."""
    q, k, v = inputs(1, 2, 1, nq, nk, 32, torch.float16, seed=14)
    wide = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    square = {**wide, "BLOCK_N": 32}
    check(flash_attn, q, k, v, causal=True, config=wide)
    half_width = flash_attn(q, k, v, causal=True, config=wide)
    torch.testing.assert_close(half_width, flash_attn(q, k, v, causal=True, config=square), atol=2e-3, rtol=0)
    monkeypatch.setenv("FLASHBENCH_TMA", "0")
    check(flash_attn, q, k, v, causal=True, config=wide)
    torch.testing.assert_close(flash_attn(q, k, v, causal=True, config=wide), half_width, atol=2e-3, rtol=0)


def test_register_cap_is_a_launch_option():
    """config "maxnreg" (two 8-warp programs per SM at 128 registers) is passed to the launch, reported back,
    and does not change the numbers; a value out of range is refused."""
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "maxnreg": 128}
    q, k, v = inputs(1, 2, 1, 70, 90, 32, torch.float16, seed=15)
    check(flash_attn, q, k, v, causal=True, config=config)
    assert last_config() == config
    plain = {key: val for key, val in config.items() if key != "maxnreg"}
    assert torch.equal(
        flash_attn(q, k, v, causal=True, config=config), flash_attn(q, k, v, causal=True, config=plain)
    )
    with pytest.raises(KernelUnsupported, match="maxnreg"):
        flash_attn(q, k, v, config={**config, "maxnreg": 7})


def test_misaligned_view_takes_the_pointer_path():
    """A view starting 1 element into its storage breaks TMA's 16-byte rule: the pointer path must serve it."""
    base = make((1 * 2 * 60 * 32 + 1,), torch.float16, 9)
    q = base[1:].view(1, 2, 60, 32)
    k, v = inputs(1, 2, 2, 60, 60, 32, torch.float16, seed=10)[1:]
    assert not use_tma(q, k, v)
    check(flash_attn, q, k, v, causal=False)


@V2_ON_CUDA
@pytest.mark.parametrize("kernel", KERNELS)
def test_non_contiguous_inputs_and_grad(kernel):
    """q from a [B, N, H, D] layout (strided heads), k with a non-unit last stride, v sliced, dO transposed."""
    b, h, n, d = 2, 2, 50, 32
    q = make((b, n, h, d), torch.float16, 1).transpose(1, 2)
    k = make((b, h, d, n), torch.float16, 2).transpose(2, 3)
    v = make((b, h, n, 2 * d), torch.float16, 3)[..., ::2]
    do = make((b, n, h, d), torch.float16, 4).transpose(1, 2)
    assert not any(t.is_contiguous() for t in (q, k, v, do))
    check(KERNELS[kernel], q, k, v, causal=True, do=do)


@V2_ON_CUDA
@pytest.mark.parametrize(
    ("kernel", "config"),
    [
        ("v2", {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}),
        ("stored_p", {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}),
        ("v1", {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "Q_SPLIT": 3}),
    ],
)
def test_forced_config_is_used_and_reported(kernel, config):
    check(KERNELS[kernel], *inputs(1, 2, 1, 100, 77, 32, torch.float16, seed=7), causal=True, config=config)
    assert last_config() == config


@pytest.mark.parametrize("kernel", KERNELS)
def test_last_config_reports_default_config(kernel):
    q, k, v = inputs(1, 1, 1, 20, 20, 32, torch.float16)
    KERNELS[kernel](q, k, v)
    cfg = last_config()
    assert {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} <= set(cfg)
    # The reported config can be forced back.
    KERNELS[kernel](q, k, v, config=cfg)
    assert last_config() == cfg


def test_backward_is_deterministic():
    """Here (d = 32, any GPU or the CPU) dQ is a separate pass, no atomics: two runs give bit-identical gradients.
    (The Hopper one-pass backward adds dQ by TMA reduce-adds; test_backward_ws checks its deterministic mode.)"""
    q, k, v = inputs(1, 4, 1, 90, 90, 32, torch.float16, seed=3)
    do = make((1, 4, 90, 32), torch.float16, 4)
    grads = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        grads.append(torch.autograd.grad(flash_attn(*leaves, causal=True), leaves, do))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_drop_in_for_sdpa():
    """flash_attn(q, k, v) matches torch's scaled_dot_product_attention called the same way."""
    q, k, v = inputs(1, 2, 2, 33, 33, 64, torch.float32, seed=11)
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(flash_attn(q, k, v, causal=causal), want, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# GPU: larger shapes, bf16 and fp16, up to N = 16384.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
# v2 on Hopper: Gluon's forward and one-pass backward, tl's forward at d = 64 causal below N = 8192
@smoke(lambda kernel, **_: kernel == "v2")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [4096, 16384])
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_large(kernel, n, d, dtype, causal):
    b, h, hkv = (2, 4, 2) if n <= 4096 else (1, 2, 1)
    check(KERNELS[kernel], *inputs(b, h, hkv, n, n, d, dtype, seed=n + d), causal=causal)


@pytest.mark.gpu
@smoke(lambda kernel, dtype: kernel == "v2" and dtype == torch.bfloat16)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_head_dim_256_and_ragged(kernel, dtype):
    check(KERNELS[kernel], *inputs(2, 4, 1, 1000, 3001, 256, dtype, seed=3), causal=True)
    check(KERNELS[kernel], *inputs(1, 2, 2, 3001, 1000, 256, dtype, seed=4), causal=True)


@pytest.mark.gpu
@V2_ON_CUDA
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_autotuned_config(kernel, monkeypatch):
    """config=None autotunes on CUDA; the chosen config is reported, comes from the space, and can be forced."""
    from flashbench.kernels.configs import FWD_SPACE

    monkeypatch.setenv("FLASHBENCH_AUTOTUNE", "1")
    monkeypatch.setenv(
        "FLASHBENCH_GLUON", "0"
    )  # the tl forward's autotuner; Hopper d=128 would take flash_ws
    q, k, v = inputs(1, 4, 2, 2048, 2048, 128, torch.bfloat16, seed=21)
    check(KERNELS[kernel], q, k, v, causal=True)
    cfg = last_config()
    entry = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"])
    assert entry + ((cfg["maxnreg"],) if "maxnreg" in cfg else ()) in FWD_SPACE
    check(KERNELS[kernel], q, k, v, causal=True, config=cfg, backward=False)
    assert last_config() == cfg


@pytest.mark.gpu
def test_gpu_config_too_big_for_shared_memory_is_unsupported():
    q = make((1, 1, 512, 256), torch.float32, 1)
    big = {"BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 8, "num_stages": 4}
    with pytest.raises(KernelUnsupported, match="does not fit"):
        flash_attn(q, q, q, config=big)


@pytest.mark.gpu
@pytest.mark.full  # autotunes every forward and backward candidate twice (~44 compiles)
def test_gpu_autotuned_pointer_path_then_descriptor_path(monkeypatch, tmp_path):
    """A first autotuned call on the pointer path (TMA off), then one on the descriptor path: each tunes its
    own key and the second still sizes its host descriptors (with triton.autotune, the first call's missing
    hook once left the second "reshape() cannot change total number of elements" on an H100)."""
    from flashbench.kernels import autotune

    monkeypatch.setenv("FLASHBENCH_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    autotune.forget()
    q, k, v = inputs(1, 2, 2, 256, 256, 64, torch.bfloat16, seed=14)
    monkeypatch.setenv("FLASHBENCH_TMA", "0")
    check(flash_attn, q, k, v, causal=False)
    monkeypatch.setenv("FLASHBENCH_TMA", "1")
    assert use_tma(q, k, v)
    check(flash_attn, q, k, v, causal=False)

"""The FP8 (e4m3) forward (kernels/flash_fp8.py) against the one oracle, its quantization, and its refusals.

The kernel is held to correctness's "fp8" budget: err(kernel, ref64 of the dequantized inputs) <= 2 * err(FA3's
numerics emulated in torch, ref64) + eps. Triton's interpreter runs the e4m3 dots exactly, so the CPU runs the
kernel; `gpu` tests add large shapes and the autotuned configs on CUDA.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_attn, value_layout
from flashbench.kernels.descriptors import use_tma
from tiers import smoke

import flashbench
from flashbench.analysis.runs import load_run
from flashbench.engine import correctness, fp8

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty, no autotuning


def quantized(b, h, hkv, nq, nk, d, *, seed=0, outliers=False):
    """bf16-valued inputs (normal; with outliers: 4 channels of q and k times 20) quantized per (batch, K/V head):
    ((q8, k8, v8), descales dict, (q, k, v) in fp32 holding the bf16 originals)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((b, n_h, n, d), generator=gen) for n_h, n in ((h, nq), (hkv, nk), (hkv, nk)))
    if outliers:
        for t in (q, k):
            t[..., [1, 7, d // 2, d - 3]] *= 20.0
    q, k, v = (t.to(torch.bfloat16).float().to(DEVICE) for t in (q, k, v))
    (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, hkv) for t in (q, k, v))
    return (q8, k8, v8), {"q_descale": qd, "k_descale": kd, "v_descale": vd}, (q, k, v)


def check(b, h, hkv, nq, nk, d, *, causal, seed=0, outliers=False, sm_scale=None, **kw):
    """Run the FP8 forward and hold it to the fp8 budget; return (verdict, out, inputs) for further checks."""
    (q8, k8, v8), descales, originals = quantized(b, h, hkv, nq, nk, d, seed=seed, outliers=outliers)
    out = flash_attn(q8, k8, v8, causal=causal, sm_scale=sm_scale, **descales, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == (b, h, nq, d)
    real = [fp8.dequantize(t, descales[f"{n}_descale"]) for n, t in zip("qkv", (q8, k8, v8), strict=True)]
    verdict = correctness.verify({"out": out}, *real, causal=causal, sm_scale=sm_scale, dtype="fp8")
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"
    return verdict, out, ((q8, k8, v8), descales, originals)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
def test_fp8_forward_within_budget_batch_gqa(causal, outliers):
    check(2, 4, 2, 130, 130, 64, causal=causal, outliers=outliers, seed=int(causal) + 2 * int(outliers))


@pytest.mark.parametrize("n", [1, 17, 127])
def test_fp8_odd_lengths(n):
    check(1, 2, 1, n, n, 32, causal=n != 17, seed=n)


@pytest.mark.parametrize(("nq", "nk"), [(17, 130), (130, 17)], ids=["q<k", "q>k"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp8_seq_q_differs_from_seq_k(causal, nq, nk):
    # q>k causal: the first nq - nk rows see no key and must come out 0
    _, out, _ = check(1, 2, 1, nq, nk, 64, causal=causal, seed=nq)
    if causal and nq > nk:
        assert out[:, :, : nq - nk].eq(0).all()


@pytest.mark.parametrize("d", [64, 128])
def test_fp8_head_dims(d):
    check(1, 1, 1, 70, 70, d, causal=True, seed=d)


def test_fp8_negative_sm_scale_without_a_mask():
    # Full key blocks take the row max before scaling: with a negative scale that is the row's minimum, P would
    # reach 2^8 * e^(range) and saturate at e4m3's 448.
    check(1, 2, 1, 64, 96, 64, causal=False, sm_scale=-0.4, seed=9)


def test_fp8_custom_and_negative_sm_scale():
    check(1, 2, 2, 40, 40, 32, causal=False, sm_scale=0.3, seed=5)
    check(1, 2, 1, 45, 45, 32, causal=True, sm_scale=-0.4, seed=6)  # folded into q_descale


def test_fp8_error_is_the_emulations_not_the_quantized_inputs():
    """The kernel's error against float64 of its own (dequantized) inputs is near the FA3 emulation's; against the
    bf16 originals it adds the inputs' e4m3 rounding, and stays under 10% on normal inputs."""
    verdict, out, (_, _, originals) = check(1, 2, 1, 256, 256, 64, causal=False, seed=11)
    err, budget = verdict.errors["out"]
    emulation = (budget - correctness.EPS["fp8"]) / 2
    assert 0.5 * emulation < err < 1.5 * emulation
    ref = correctness.reference(*originals, causal=False)["out"]
    to_originals = float((out.double() - ref).norm() / ref.norm())
    assert err < to_originals < 0.1


def test_fp8_tma_and_pointer_paths_and_value_layouts_agree(monkeypatch):
    """V in the ordinary layout (transposed once per call) and in value_layout (read as it is) give the same
    output bit for bit; the pointer path (FLASHBENCH_TMA=0) agrees to rounding."""
    (q8, k8, v8), descales, _ = quantized(1, 2, 1, 150, 150, 64, seed=8)
    vt = value_layout(v8)
    assert vt.stride(-2) == 1 and vt.shape == v8.shape and torch.equal(vt.float(), v8.float())
    assert value_layout(vt) is vt
    assert use_tma(q8, k8)
    ordinary = flash_attn(q8, k8, v8, causal=True, **descales)
    assert torch.equal(ordinary, flash_attn(q8, k8, vt, causal=True, **descales))
    monkeypatch.setenv("FLASHBENCH_TMA", "0")
    pointers = flash_attn(q8, k8, v8, causal=True, **descales)
    torch.testing.assert_close(pointers, ordinary, atol=2e-2, rtol=0)


def test_fp8_lse_is_the_scaled_scores_log_sum_exp():
    from flashbench.kernels.flash_fp8 import attention_forward_fp8, value_layout

    (q8, k8, v8), d, _ = quantized(1, 2, 1, 100, 90, 64, seed=3)
    real = [fp8.dequantize(t, d[f"{n}_descale"]) for n, t in zip("qkv", (q8, k8, v8), strict=True)]
    descales = (d["q_descale"], d["k_descale"], d["v_descale"])
    _, lse2, _ = attention_forward_fp8(q8, k8, value_layout(v8), True, 64**-0.5, None, descales)
    ref = correctness.reference(*real, causal=True)["lse"]  # natural log; -inf where a row sees no key
    seen = torch.isfinite(ref)
    assert torch.isinf(lse2[~seen]).all()
    # The interpreter's e4m3 dots are exact. Hopper's FP8 MMA keeps ~14 bits of its running sum (DeepSeek-V3
    # report, 3.3.2), so on CUDA a score may be off by ~2^-14 of the products' magnitude per step: bounded here by
    # 2^-11 of sum_i |q_i k_i| * scale (H100: 7.0e-4 off at most against a bound of ~2.5e-3). A wrong base or a
    # lost scale is off by 0.3 or more.
    magnitude = (real[0].double().abs() @ real[1].double().abs().transpose(-1, -2)).amax().item() * 64**-0.5
    atol = 1e-4 if q8.device.type == "cpu" else magnitude * 2**-11
    torch.testing.assert_close(lse2[seen].double() * 0.6931471805599453, ref[seen], atol=atol, rtol=1e-5)


def test_fp8_backward_raises_unsupported():
    (q8, k8, v8), descales, _ = quantized(1, 1, 1, 32, 32, 32)
    q8.requires_grad_(True)
    out = flash_attn(q8, k8, v8, **descales)
    with pytest.raises(KernelUnsupported, match="forward only"):
        out.float().sum().backward()


def test_fp8_refusals_name_the_problem():
    (q8, k8, v8), d, (q, k, v) = quantized(1, 2, 1, 32, 32, 32)
    with pytest.raises(KernelUnsupported, match="k_descale has shape"):
        flash_attn(q8, k8, v8, q_descale=d["q_descale"], k_descale=torch.ones(3, device=DEVICE))
    with pytest.raises(KernelUnsupported, match="v_descale must be a float32 tensor"):
        flash_attn(q8, k8, v8, v_descale=d["v_descale"].double())
    with pytest.raises(KernelUnsupported, match="dtype torch.bfloat16 unsupported"):
        flash_attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), q_descale=d["q_descale"])
    with pytest.raises(KernelUnsupported, match="v .* must match k"):
        flash_attn(q8, k8, v.bfloat16())
    with pytest.raises(KernelUnsupported, match="window not supported with FP8"):
        flash_attn(q8, k8, v8, window=(4, 0))


def test_fp8_per_tensor_descale_broadcasts():
    """A single descale (per tensor) is expanded to [B, Hkv]: the same output as the explicit per-head one."""
    (q8, k8, v8), d, _ = quantized(2, 2, 2, 40, 40, 32, seed=4)
    one = torch.tensor([0.05], device=DEVICE)
    per_head = torch.full((2, 2), 0.05, device=DEVICE)
    assert torch.equal(
        flash_attn(q8, k8, v8, q_descale=one, k_descale=one, v_descale=one),
        flash_attn(q8, k8, v8, q_descale=per_head, k_descale=per_head, v_descale=per_head),
    )


def test_quantize_scales_each_kv_head_group_by_its_amax():
    x = torch.randn(2, 4, 8, 16)
    x[1, 2, 3, 4] = 100.0  # batch 1, query head 2: K/V head 1 of 2
    x8, scale = fp8.quantize(x, kv_heads=2)
    assert x8.dtype == torch.float8_e4m3fn and scale.shape == (2, 2) and scale.dtype == torch.float32
    assert scale[1, 1] == pytest.approx(100.0 / 448.0)
    assert x8.float().abs().amax() == 448.0  # every group's amax maps onto e4m3's largest value
    back = fp8.dequantize(x8, scale)
    assert float((back - x).norm() / x.norm()) < 0.05  # e4m3: 3 mantissa bits
    bnhd = torch.randn(1, 5, 3, 16).transpose(1, 2)  # a [B, N, H, D]-stored view keeps its layout
    assert fp8.quantize(bnhd, 3)[0].stride() == bnhd.stride()
    assert fp8.quantize(torch.zeros(1, 1, 4, 16), 1)[1].item() == 1.0


def test_fp8_reference_emulation_quantizes_p():
    """The fp8 'low precision' reference differs from float64 by FA3's P rounding (1-5% on random inputs), and
    rounds its output to bf16."""
    _, _, (q, k, v) = quantized(1, 2, 2, 64, 64, 32, seed=9)
    ref = correctness.reference(q, k, v, causal=False)["out"]
    emu = correctness.reference(q, k, v, causal=False, dtype="fp8")["out"]
    err = float((emu.double() - ref).norm() / ref.norm())
    assert 0.003 < err < 0.05
    assert torch.equal(emu, emu.bfloat16().float())
    assert correctness.dtype_name(torch.float8_e4m3fn) == "fp8" and "fp8" in correctness.EPS
    with pytest.raises(ValueError, match="forward only"):
        correctness.reference(q, k, v, causal=False, dtype="fp8", do=torch.ones_like(q))


# ---------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@smoke(lambda outliers, **_: not outliers)  # the outlier inputs share the kernels: the full tier's
@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("n", "d"), [(1024, 64), (2048, 128), (1000, 128)])
def test_gpu_fp8_large(request, monkeypatch, n, d, causal, outliers):
    monkeypatch.setenv(
        "FLASHBENCH_GLUON", "0"
    )  # the tl kernel's test (the Gluon kernel's: test_fp8_gluon.py)
    if outliers and d == 128 and (n == 2048 or not causal):
        # Measured on an H100: 7.7e-3 against the budget's 6.85e-3 (2048, full). The budget's emulation sums
        # Q K^T exactly; Hopper's FP8 MMA keeps ~14 bits of its running sum (DeepSeek-V3 report, 3.3.2), which
        # x20 outlier channels make visible. Strict: if the kernel comes within the budget, this says so.
        request.applymarker(pytest.mark.xfail(strict=True, reason="FP8 MMA accumulation on outlier inputs"))
    check(2, 8, 2, n, n, d, causal=causal, outliers=outliers, seed=n + d)


@pytest.mark.gpu
@pytest.mark.parametrize(("nq", "nk"), [(384, 1000), (1000, 384)])
def test_gpu_fp8_seq_q_differs_from_seq_k(nq, nk):
    check(1, 4, 1, nq, nk, 128, causal=True, seed=nq)


@pytest.mark.gpu
def test_gpu_fp8_autotuned_and_every_space_config(monkeypatch):
    """Every config of the FP8 space compiles on this GPU and passes; the autotuner's pick is one of them."""
    monkeypatch.setenv("FLASHBENCH_GLUON", "0")  # else d = 128 not causal runs the Gluon kernel
    from flashbench.kernels import last_config
    from flashbench.kernels.configs import FP8_FWD_SPACE, config_dict

    for entry in FP8_FWD_SPACE:
        check(1, 4, 2, 1024, 1024, 128, causal=False, config=config_dict(entry), seed=1)
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE_CACHE", "0")
    check(1, 4, 2, 2048, 2048, 128, causal=False, seed=2)
    assert tuple(last_config()[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")) in FP8_FWD_SPACE


@pytest.mark.skipif(
    HAS_CUDA, reason="a CPU-interpreter sweep: Triton 3.6's interpreter (the GPU machine's) has no e4m3"
)
def test_fp8_sweep_rows_ok_unsupported_and_the_fp8_roofline(tmp_path):
    """`--dtype fp8` on the CPU: the bundled kernel's forward is timed and checked against its own budget; its
    fwd+bwd and every provider without an FP8 path are `unsupported` rows with the reason (no upcast run); the
    analysis frame models 1-byte inputs, a bf16 O, and the fp8 compute dtype."""
    result = flashbench.sweep(
        device="cpu",
        providers="triton,naive",
        seq="64",
        batch=1,
        heads=2,
        kv_heads=1,
        head_dim=32,
        dtype="fp8",
        causal=False,
        mode="fwd,fwd+bwd",
        out=tmp_path / "fp8",
    )
    rows = {(r.provider, r.mode): r for r in result.rows}
    ok = rows[("triton", "fwd")]
    assert ok.status == "ok" and 0 < ok.rel_err <= ok.err_budget, ok.reason
    assert ok.err_budget > correctness.EPS["fp8"]  # 2x the FA3 emulation's error + eps
    assert "forward only" in rows[("triton", "fwd+bwd")].reason
    assert rows[("naive", "fwd")].status == "unsupported" and "no FP8" in rows[("naive", "fwd")].reason
    frame = load_run(tmp_path / "fp8").frame.set_index(["provider", "mode"])
    mine = frame.loc[("triton", "fwd")]
    assert mine["compute_dtype"] == "fp8"
    q_kv, o = (2 + 2 * 1) * 64 * 32, 2 * 64 * 32 * 2  # 1-byte Q, K, V; bf16 O
    assert mine["model_bytes_compulsory"] == q_kv + o

"""The Gluon dK/dV pass (kernels/backward_ws.py) against the float64 reference, and where the backward takes it.

The oracle and budget are the sweep's (flashbench.engine.correctness), as in test_kernels.py: the forward is the
bundled one, the backward's dK/dV pass is forced to the Gluon kernel (dQ is the tl pass either way). Hopper only:
elsewhere `supported` must refuse with a reason, and a forced config raises KernelUnsupported.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import KernelUnsupported, backward_ws, flash_attn, flash_ws
from flashbench.kernels.backward import attention_backward, last_bwd_config
from flashbench.kernels.flash_v2 import attention_forward

from flashbench.engine import correctness

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(b, h, hkv, nq, nk, d, dtype, seed=0, device=DEVICE):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    return t(b, h, nq, d), t(b, hkv, nk, d), t(b, hkv, nk, d), t(b, h, nq, d)


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
    [{}, {"STAGES": 1}, {"STAGES": 3}, {"ROTATE": 0}, {"ONE_PASS": 1}, {"ONE_PASS": 1, "STAGES": 3}],
    ids=["default", "s1", "s3", "no-rotate", "one-pass", "one-pass-s3"],
)
def test_gluon_dkdv_matches_reference(shape, dtype, causal, config):
    check(shape, dtype, causal, config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon backward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_takes_gluon_by_default_where_it_measured_faster(monkeypatch, causal):
    q, k, v, do = inputs(1, 2, 2, 2048, 2048, 128, torch.bfloat16, seed=3)
    grads = {}
    for on in ("1", "0"):
        monkeypatch.setenv("FLASHBENCH_GLUON_BWD", on)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flash_attn(*leaves, causal=causal).backward(do)
        assert (last_bwd_config()["dkdv"].get("kernel") == "gluon-ws") == (on == "1")
        grads[on] = [t.grad for t in leaves]
    for a, b in zip(grads["1"], grads["0"], strict=True):
        assert ((a.double() - b.double()).norm() / b.double().norm()).item() < 1e-2
    # d = 64 stays on the tl passes (they measured faster there)
    q64 = [t[..., :64].contiguous().requires_grad_() for t in (q, k, v)]
    flash_attn(*q64, causal=causal).backward(do[..., :64].contiguous())
    assert last_bwd_config()["dkdv"].get("kernel") != "gluon-ws"


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
    with pytest.raises(ValueError, match="NUM_WG=3 must be one of"):
        backward_ws.config_for(128, {"NUM_WG": 3})
    assert backward_ws.config_for(64, {"kernel": "gluon-ws", "STAGES": 3})["STAGES"] == 3
    with pytest.raises(ValueError, match="BLOCK_N=64 must be one of"):
        backward_ws.config_for(128, {"BLOCK_N": 64})
    # a reported config (what a row's kernel_config holds under "bwd") is accepted back as it is
    reported = {"kernel": "gluon-ws", **backward_ws.config_for(128), "BLOCK_N": 128, "num_warps": 9}
    assert backward_ws.config_for(128, reported) == backward_ws.config_for(128)
    # two stages at d = 128: K, V of 128 keys and two Q / dO tiles of 64 rows, 16-bit
    assert backward_ws.smem_bytes(backward_ws.config_for(128), 128) == 2 * 128 * (2 * 128 + 2 * 2 * 64)


def test_preferred_only_where_measured(monkeypatch):
    q = torch.empty(1, 2, 4096, 128)
    assert backward_ws.preferred(q, False) and backward_ws.preferred(q, True)
    assert not backward_ws.preferred(torch.empty(1, 2, 512, 128), False)
    assert not backward_ws.preferred(torch.empty(1, 2, 4096, 64), False)
    monkeypatch.setenv("FLASHBENCH_GLUON_BWD", "0")
    assert not backward_ws.preferred(q, False)


def test_one_pass_config_is_accepted_reported_and_fits():
    """ONE_PASS is a known key whose value is checked; its extra shared memory (two dS slots and dQ's fp32 staging
    tiles) still fits three stages at d = 128, and the two-pass footprint is unchanged by the key's absence."""
    cfg = backward_ws.config_for(128, {"kernel": "gluon-ws", "ONE_PASS": 1, "STAGES": 3})
    assert cfg["ONE_PASS"] == 1 and cfg["STAGES"] == 3
    with pytest.raises(ValueError, match="ONE_PASS=2 must be one of"):
        backward_ws.config_for(128, {"ONE_PASS": 2})
    two_pass = backward_ws.smem_bytes({**cfg, "ONE_PASS": 0}, 128)
    assert two_pass == 2 * 128 * (2 * 2 * 64 + 2 * 3 * 64)
    assert backward_ws.smem_bytes(cfg, 128) == two_pass + 2 * 2 * 2 * 64 * 64 + 4 * 64 * 128
    assert backward_ws.smem_bytes(cfg, 128) <= flash_ws.SMEM_LIMIT

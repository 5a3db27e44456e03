"""The kernels' public contract: what they refuse (KernelUnsupported, with a message naming why) and config checks.

Every refusal here happens in the launcher before any kernel runs, so these tests are fast on any machine.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import (
    SUPPORTED_HEAD_DIMS,
    KernelUnsupported,
    flash_attn,
    flash_attn_stored_p,
    flash_attn_v1,
)

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
KERNELS = [flash_attn, flash_attn_stored_p, flash_attn_v1]


def t(*shape, dtype=torch.float16, device=DEVICE):
    return torch.randn(*shape, device=device).to(dtype)


def test_public_constants():
    assert SUPPORTED_HEAD_DIMS == (32, 64, 128, 256)
    assert issubclass(KernelUnsupported, ValueError)


@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: (t(1, 2, 8, 48), t(1, 2, 8, 48), t(1, 2, 8, 48)), "head_dim 48 unsupported"),
        (lambda: (t(1, 2, 8, 512), t(1, 2, 8, 512), t(1, 2, 8, 512)), "head_dim 512 unsupported"),
        (lambda: (t(1, 2, 8, 32, dtype=torch.float64),) * 3, "dtype torch.float64 unsupported"),
        (lambda: (t(1, 2, 8, 32), t(1, 2, 8, 32, dtype=torch.float32), t(1, 2, 8, 32)), "dtypes differ"),
        (lambda: (t(1, 2, 8, 32), t(1, 2, 8, 32), t(1, 2, 9, 32)), "k and v shapes differ"),
        (lambda: (t(2, 2, 8, 32), t(1, 2, 8, 32), t(1, 2, 8, 32)), "batch differs"),
        (lambda: (t(1, 2, 8, 64), t(1, 2, 8, 32), t(1, 2, 8, 32)), "head_dim differs"),
        (lambda: (t(1, 3, 8, 32), t(1, 2, 8, 32), t(1, 2, 8, 32)), "kv_heads 2 does not divide heads 3"),
        (lambda: (t(2, 8, 32), t(2, 8, 32), t(2, 8, 32)), "must be 4-D"),
        (lambda: (t(1, 2, 0, 32), t(1, 2, 8, 32), t(1, 2, 8, 32)), "empty tensor"),
        (
            lambda: (t(1, 2, 8, 32).numpy() if not HAS_CUDA else None, t(1, 2, 8, 32), t(1, 2, 8, 32)),
            "torch.Tensor",
        ),
    ],
    ids=[
        "head_dim_48",
        "head_dim_512",
        "float64",
        "mixed_dtypes",
        "kv_shape_mismatch",
        "batch_mismatch",
        "head_dim_mismatch",
        "gqa_not_dividing",
        "not_4d",
        "empty_seq",
        "not_a_tensor",
    ],
)
def test_unsupported_inputs_raise_naming_the_reason(fn, make, match):
    with pytest.raises(KernelUnsupported, match=match):
        fn(*make())


@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
def test_bad_arguments_raise(fn):
    q = t(1, 2, 8, 32)
    with pytest.raises(KernelUnsupported, match="causal must be a bool"):
        fn(q, q, q, causal="yes")
    with pytest.raises(KernelUnsupported, match="sm_scale must be finite"):
        fn(q, q, q, sm_scale=float("nan"))


@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"BLOCK_M": 64}, "config needs BLOCK_N"),
        ({"BLOCK_M": 24, "BLOCK_N": 64}, "BLOCK_M=24 must be a power of two"),
        ({"BLOCK_M": 64, "BLOCK_N": 8}, "BLOCK_N=8 must be a power of two in 16..256"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 3}, "num_warps=3"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 0}, "num_stages=0"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, "unknown config keys"),
        ("fast", "config must be a dict"),
    ],
)
def test_bad_config_raises(fn, config, match):
    q = t(1, 2, 8, 32)
    with pytest.raises(KernelUnsupported, match=match):
        fn(q, q, q, config=config)


def test_q_split_is_a_v1_only_config_key():
    q = t(1, 2, 8, 32)
    with pytest.raises(KernelUnsupported, match="unknown config keys"):
        flash_attn(q, q, q, config={"BLOCK_M": 16, "BLOCK_N": 16, "Q_SPLIT": 2})
    with pytest.raises(KernelUnsupported, match="Q_SPLIT=0"):
        flash_attn_v1(q, q, q, config={"BLOCK_M": 16, "BLOCK_N": 16, "Q_SPLIT": 0})


@pytest.mark.skipif(HAS_CUDA, reason="interpreter-only refusal")
@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
def test_bf16_refused_under_interpreter(fn):
    q = t(1, 2, 8, 32, dtype=torch.bfloat16)
    with pytest.raises(KernelUnsupported, match="bf16 under the Triton interpreter"):
        fn(q, q, q)


@pytest.mark.skipif(HAS_CUDA, reason="CPU-only refusal")
def test_cpu_tensors_without_interpreter_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = t(1, 2, 8, 32)
    with pytest.raises(KernelUnsupported, match="device cpu needs Triton's interpreter"):
        flash_attn(q, q, q)


@pytest.mark.gpu
def test_mixed_devices_refused():
    q = t(1, 2, 8, 32)
    with pytest.raises(KernelUnsupported, match="different devices"):
        flash_attn(q, q.cpu(), q)
    with pytest.raises(KernelUnsupported, match="device cpu needs"):
        flash_attn(q.cpu(), q.cpu(), q.cpu())


def test_default_config_fits_every_head_dim():
    """Without autotuning the first fitting config of each space is used; D = 256 gets smaller tiles; the
    16-bit forward at D = 128 gets the one-warpgroup 128-row tile measured fastest on an H100, fp32 a smaller one."""
    from flashbench.kernels.configs import (
        BWD_DKDV_SPACE,
        BWD_DQ_SPACE,
        FWD_SPACE,
        default_config,
        estimate,
        register_budget,
    )

    h100_smem = 232448
    assert default_config("fwd", FWD_SPACE, 64, 2) == {
        "BLOCK_M": 128,
        "BLOCK_N": 64,
        "num_warps": 4,
        "num_stages": 2,
    }
    for kind, space in (("fwd", FWD_SPACE), ("dkdv", BWD_DKDV_SPACE), ("dq", BWD_DQ_SPACE)):
        for d in SUPPORTED_HEAD_DIMS:
            for elem in (2, 4):
                cfg = default_config(kind, space, d, elem, h100_smem)
                smem, regs = estimate(kind, cfg, d, elem)
                assert smem <= h100_smem and regs <= register_budget(elem), (kind, d, elem, cfg)
    assert default_config("fwd", FWD_SPACE, 128, 2, h100_smem) == {
        "BLOCK_M": 128,
        "BLOCK_N": 64,
        "num_warps": 4,
        "num_stages": 2,
    }
    assert default_config("fwd", FWD_SPACE, 128, 4, h100_smem) == {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "num_warps": 4,
        "num_stages": 3,
    }
    big = default_config("fwd", FWD_SPACE, 256, 2)
    assert big["BLOCK_M"] * big["BLOCK_N"] < 128 * 64


def test_a_repeated_call_skips_the_checks_but_not_what_they_refuse(monkeypatch):
    """flash_attn checks a call signature once (kernels/flash_v2._CHECKED): a second call with the same tensors'
    shapes, strides, dtypes, alignment, device, arguments and environment runs without the checks and gives the
    same output; an argument the checks refuse (causal=1, a bad window) is still refused after a good call."""
    from flashbench.kernels import flash_v2

    calls = []
    real = flash_v2.check_inputs
    monkeypatch.setattr(flash_v2, "check_inputs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = (t(1, 2, 16, 32, dtype=torch.float32) for _ in range(3))
    first = flash_attn(q, k, v, causal=True, window=(4, 0))
    again = flash_attn(q, k, v, causal=True, window=(4, 0))
    assert len(calls) == 1 and torch.equal(first, again)
    q2 = t(1, 2, 16, 32, dtype=torch.float32)  # new data, same signature: no check, its own output
    i = torch.arange(16, device=q.device)
    visible = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - 4)
    scores = (q2 @ k.transpose(-1, -2) / 32**0.5).masked_fill(~visible, float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    assert torch.allclose(flash_attn(q2, k, v, causal=True, window=(4, 0)), expected, atol=1e-4)
    assert len(calls) == 1
    with pytest.raises(KernelUnsupported, match="causal must be a bool"):
        flash_attn(q, k, v, causal=1, window=(4, 0))
    with pytest.raises(KernelUnsupported, match="window left must be an int"):
        flash_attn(q, k, v, causal=True, window=(True, 0))
    flash_attn(q, k, v, causal=True, window=(4, 0), sm_scale=-0.5)  # negated q: checked on every call
    flash_attn(q, k, v, causal=True, window=(4, 0), sm_scale=-0.5)
    assert len(calls) == 5


def _check_step(q, k, v, do, causal=True):  # type: ignore[no-untyped-def]
    """flash_attn's output and gradients for dO, held to the one oracle (engine/correctness.verify)."""
    from flashbench.engine.correctness import verify

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flash_attn(*leaves, causal=causal)
    dq, dk, dv = torch.autograd.grad(out, leaves, do)
    verdict = verify({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=causal, do=do)
    assert verdict.ok, verdict.reason


def _count_plans(monkeypatch):  # type: ignore[no-untyped-def]
    """A fresh backward plan cache and the forward's checked signatures; the list grows by one per plan made."""
    from flashbench.kernels import backward, flash_v2
    from flashbench.kernels.launch import PlanCache

    made: list[int] = []
    cache = PlanCache(lambda *a: made.append(1) or backward._BackwardPlan(*a))
    monkeypatch.setattr(backward, "_PLANS", cache)
    monkeypatch.setattr(flash_v2, "_CHECKED", PlanCache(lambda: None))
    return made


def test_the_backward_plans_once_per_signature_and_again_on_what_decides_it(monkeypatch):
    """attention_backward called alone makes its launch plan once per signature: a repeated call (new data)
    reuses it; dO of another layout, torch's deterministic flag or an environment switch each give a plan of
    their own, each plan's gradients held to the oracle."""
    from flashbench.kernels import backward, flash_v2

    made = _count_plans(monkeypatch)
    q, k, v = (t(1, 2, 16, 32, dtype=torch.float32) for _ in range(3))
    o, lse, _ = flash_v2.attention_forward(q, k, v, True, 32**-0.5)

    def grads(do):  # type: ignore[no-untyped-def]
        from flashbench.engine.correctness import verify

        dq, dk, dv = backward.attention_backward(q, k, v, o, lse, do, None, True, 32**-0.5)
        verdict = verify({"dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=True, do=do)
        assert verdict.ok, verdict.reason

    grads(t(1, 2, 16, 32, dtype=torch.float32))
    grads(t(1, 2, 16, 32, dtype=torch.float32))
    assert len(made) == 1
    grads(t(1, 16, 2, 32, dtype=torch.float32).transpose(1, 2))  # [B, N, H, D] memory: other strides
    assert len(made) == 2
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    grads(t(1, 2, 16, 32, dtype=torch.float32))
    assert len(made) == 3
    monkeypatch.setenv("FLASHBENCH_TMA", "0")
    grads(t(1, 2, 16, 32, dtype=torch.float32))
    grads(t(1, 2, 16, 32, dtype=torch.float32))
    assert len(made) == 4


def test_a_training_steps_backward_is_planned_once_and_again_on_what_it_adds_to_the_forward(monkeypatch):
    """Through flash_attn's checked signature the backward keys its plans by what it adds to the forward's
    signature (attention_backward's `plans`): repeated steps make one plan and look up no whole key; dO of another
    layout, the deterministic flag or an environment switch set between the forward and the backward each give a
    plan of their own; every step's output and gradients are held to the oracle."""
    from flashbench.kernels import backward

    made = _count_plans(monkeypatch)
    whole = []
    real = backward._PLANS.get
    monkeypatch.setattr(backward._PLANS, "get", lambda *a: whole.append(1) or real(*a))
    q, k, v = (t(1, 2, 16, 32, dtype=torch.float32) for _ in range(3))
    for _ in range(4):
        _check_step(q, k, v, t(1, 2, 16, 32, dtype=torch.float32))
    # the whole key twice: the first call's (its signature not yet checked) and the second's (it fills `plans`)
    assert (len(made), len(whole)) == (1, 2)
    _check_step(q, k, v, t(1, 16, 2, 32, dtype=torch.float32).transpose(1, 2))
    assert len(made) == 2

    from flashbench.engine.correctness import verify

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flash_attn(*leaves, causal=True)  # recorded with this environment
    monkeypatch.setenv("FLASHBENCH_TMA", "0")  # the backward runs under another: a plan without descriptors
    do = t(1, 2, 16, 32, dtype=torch.float32)
    dq, dk, dv = torch.autograd.grad(out, leaves, do)
    assert len(made) == 3 and not list(backward._PLANS.plans.values())[-1].tma
    assert verify({"dq": dq, "dk": dk, "dv": dv}, q, k, v, causal=True, do=do).ok
    monkeypatch.delenv("FLASHBENCH_TMA")
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    _check_step(q, k, v, t(1, 2, 16, 32, dtype=torch.float32))
    assert len(made) == 4


@pytest.mark.parametrize("private", ["found", "moved"])
def test_the_eager_autograd_node_keeps_autograds_checks(private, monkeypatch):
    """flash_attn records its node without Function.apply's Python (launch.attend): the node still saves q, k
    and v, so an in-place change of one between the forward and the backward is refused, not differentiated
    with the changed values; without the change the gradients hold to the oracle. The same through
    Function.apply, where a torch moved the private pieces launch.record uses ("moved")."""
    from flashbench.kernels import launch

    if private == "moved":
        monkeypatch.setattr(launch, "_C_APPLY", None)
    q, k, v = (t(1, 2, 16, 32, dtype=torch.float32) for _ in range(3))
    base = q.detach().requires_grad_()
    q_in = base * 1  # a non-leaf, so that it can be changed in place
    out = flash_attn(q_in, k, v, causal=True)
    assert type(out.grad_fn).__name__ == "RecomputeAttentionBackward"
    q_in.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, base, torch.ones_like(out))
    _check_step(q, k, v, t(1, 2, 16, 32, dtype=torch.float32))


def test_last_configs_are_copies_the_caller_may_change():
    """last_config() and last_bwd_config() return copies of the plans' configs (kept by reference on every
    call): changing what they return changes neither the next report nor the config the plan launches."""
    from flashbench.kernels import last_config
    from flashbench.kernels.backward import last_bwd_config

    q, k, v = (t(1, 2, 16, 32, dtype=torch.float32) for _ in range(3))
    do = t(1, 2, 16, 32, dtype=torch.float32)
    _check_step(q, k, v, do)
    fwd, bwd = last_config(), last_bwd_config()
    assert fwd and set(bwd) == {"dkdv", "dq"}
    changed_fwd, changed_bwd = last_config(), last_bwd_config()
    changed_fwd["BLOCK_M"] = changed_bwd["dkdv"]["BLOCK_N"] = -1
    _check_step(q, k, v, do)
    assert (last_config(), last_bwd_config()) == (fwd, bwd)
    flash_attn(q, k, v, causal=True)  # a new forward: no backward of it yet
    assert last_bwd_config() == {}

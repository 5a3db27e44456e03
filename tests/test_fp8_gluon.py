"""The Gluon FP8 forward (flash_ws's FP8 mode, which kernels/flash_fp8.py dispatches to) and the dispatch.

The kernel is held to the tl FP8 kernel's budget (test_fp8.check: correctness's "fp8" budget on the dequantized
inputs). Gluon runs only on Hopper: elsewhere the dispatch must never pick it and forcing it is a clear refusal.
"""

from __future__ import annotations

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_attn, flash_ws, last_config, value_layout
from flashbench.kernels.flash_fp8 import attention_forward_fp8
from test_fp8 import check, quantized
from tiers import smoke

from flashbench.engine import correctness, fp8

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py: NaN-filled torch.empty, no autotuning

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
GLUON = {"kernel": "gluon-ws"}
TL = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}
hopper_only = pytest.mark.skipif(not HOPPER, reason="the Gluon forward needs a Hopper GPU")


def forced_tiles(d: int, block_n: int, **keys: int) -> dict:
    """The Gluon FP8 forward forced onto block_n-key tiles at head dim d, in the stages that fit them (two of the
    wide tiles, three of the head dim's), with `keys` over the default's."""
    return {**GLUON, "BLOCK_N": block_n, "STAGES": 2 if block_n * d >= 256 * 128 else 3, **keys}


def kernel_ran() -> str:
    return last_config().get("kernel", "tl")


@pytest.mark.gpu
@hopper_only
@smoke(lambda n, d: d != 64)  # FP8 at d = 64 is dispatched to the tl kernel (flash_ws.GLUON_FP8_MIN_SEQ)
@pytest.mark.parametrize("d", [128, 64, 256])
@pytest.mark.parametrize("n", [1024, 4096])
def test_gpu_gluon_fp8_within_budget_batch_gqa(n, d):
    check(2, 4, 2, n, n, d, causal=False, config=GLUON, seed=n + d)
    assert kernel_ran() == "gluon-ws"


@pytest.mark.gpu
@pytest.mark.full  # forced configs; the dispatched one (flash_ws.FP8_CONFIG) runs in the tests around
@hopper_only
@pytest.mark.parametrize(
    "config",
    [
        {"BLOCK_N": 128, "STAGES": 2},
        {"BLOCK_N": 128, "STAGES": 4},
        {"PERSISTENT": 1, "PROGRAMS": 3},
        {"PERSISTENT": 1, "PROGRAMS": 5, "SCHED_HEADS": 4, "STAGES": 4, "BLOCK_N": 128},
        {"PERSISTENT": 1, "PROGRAMS": 5, "SCHED_HEADS": 4, "LPT": 1},
        {"PERSISTENT": 0},
        {"PERSISTENT": 1, "PROGRAMS": 3, "Q2": 1},
        {
            "PERSISTENT": 1,
            "PROGRAMS": 5,
            "SCHED_HEADS": 4,
            "LPT": 1,
            "Q2": 1,
            "BLOCK_N": 128,
            "STAGES": 3,
            "SUM_MMA": 0,
        },
    ],
    ids=[
        "s2",
        "s4",
        "persistent",
        "persistent-grouped",
        "persistent-lpt",
        "wide-one-per-tile",
        "q2",
        "q2-lpt-narrow",
    ],
)
def test_gpu_gluon_fp8_configs_within_budget(config):
    """Persistent programs walk several tiles each: the ring, the turns and the Q/O barriers carry over; over
    the default's 256-key tiles (flash_ws.FP8_WIDE_N, P V waited before each S) and over 128-key ones."""
    check(2, 4, 2, 1024, 1024, 128, causal=False, config={**GLUON, **config}, seed=5)
    cfg = last_config()
    assert cfg["kernel"] == "gluon-ws" and all(cfg[key] == val for key, val in config.items())


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize(
    ("nq", "nk", "d"),
    [(512, 2048, 128), (320, 512, 128), (320, 576, 256)],
    ids=["nq<nk", "partial-tile", "d256-partial-tile"],
)
def test_gpu_gluon_fp8_seq_q_differs_from_seq_k(nq, nk, d):
    """320 rows: the first 128-row tile starts 64 rows before row 0, so its first warpgroup owns no row and
    only keeps the barrier protocol. d = 256: 576 keys are nine 64-key tiles."""
    check(2, 4, 1, nq, nk, d, causal=False, config=GLUON, seed=nq)


@pytest.mark.gpu
@hopper_only
def test_gpu_gluon_fp8_agrees_with_the_tl_kernel_and_its_lse():
    """Same numerics as the tl FP8 kernel: over the same 128-key blocks, outputs agree to the P quantization's
    rounding (P is scaled by each block's running row max, so other blocks round it apart: the default's 256-key
    tiles read 1.2% from the tl kernel, each within its budget), and the base-2 LSE is the descaled scores'
    (the bound of test_fp8's LSE test: Hopper's FP8 MMA keeps ~14 bits of its sum), in either tile."""
    (q8, k8, v8), d, _ = quantized(2, 4, 2, 1024, 1024, 128, seed=4)
    descales = (d["q_descale"], d["k_descale"], d["v_descale"])
    scale = 128**-0.5
    narrow = {**GLUON, "BLOCK_N": 128, "STAGES": 3}
    o_g, lse_g, cfg = attention_forward_fp8(q8, k8, value_layout(v8), False, scale, narrow, descales)
    o_t, lse_t, _ = attention_forward_fp8(q8, k8, value_layout(v8), False, scale, TL, descales)
    assert cfg["kernel"] == "gluon-ws"
    assert ((o_g.double() - o_t.double()).norm() / o_t.double().norm()).item() < 1e-2
    _, lse_wide, cfg = attention_forward_fp8(q8, k8, value_layout(v8), False, scale, GLUON, descales)
    assert cfg["BLOCK_N"] == 256
    real = [fp8.dequantize(t, d[f"{n}_descale"]) for n, t in zip("qkv", (q8, k8, v8), strict=True)]
    ref = correctness.reference(*real, causal=False)["lse"]
    k_per_q = real[1].double().abs().repeat_interleave(2, dim=1)  # GQA: 4 query heads on 2 K/V heads
    magnitude = (real[0].double().abs() @ k_per_q.transpose(-1, -2)).amax().item() * scale
    for lse in (lse_g, lse_wide):
        torch.testing.assert_close(lse.double() * 0.6931471805599453, ref, atol=magnitude * 2**-11, rtol=1e-5)


@pytest.mark.gpu
@hopper_only
def test_gpu_fp8_dispatch_takes_gluon_only_where_it_should(monkeypatch):
    """d = 128 with N % 128 == 0 (causal from flash_ws.GLUON_FP8_MIN_SEQ's length, list-scheduled in groups of 4
    heads with two Q buffers; 256-key tiles without a mask where N % 256 == 0): Gluon (V in either layout); shorter
    causal, d = 64, N % 128 != 0, a forced tl config, a negative sm_scale or FLASHBENCH_GLUON=0: the tl kernel."""
    n = flash_ws.GLUON_FP8_MIN_SEQ[(128, True)]

    def ran(b, h, hkv, nq, nk, d, causal=False, config=None, layout=True):
        (q8, k8, v8), descales, _ = quantized(b, h, hkv, nq, nk, d, seed=nq)
        flash_attn(q8, k8, value_layout(v8) if layout else v8, causal=causal, config=config, **descales)
        return kernel_ran()

    assert ran(2, 4, 2, 1024, 1024, 128) == "gluon-ws"
    assert last_config()["BLOCK_N"] == 256  # flash_ws.FP8_WIDE_N
    assert ran(1, 2, 1, 1152, 1152, 128) == "gluon-ws"
    assert last_config()["BLOCK_N"] == 128  # keys not a multiple of 256: the head dim's tiles
    assert ran(1, 2, 1, 1024, 1024, 128, layout=False) == "gluon-ws"  # laid out once per call, then Gluon
    assert ran(1, 2, 1, n // 2, n // 2, 128, causal=True) == "tl"
    assert ran(1, 2, 1, n, n, 128, causal=True) == "gluon-ws"
    assert last_config()["Q2"] == 1  # flash_ws.FP8_Q2_DIMS: 128-key tiles below 4096 keys
    fp8_causal = flash_ws.default_config(128, True, fp8=True)
    heads = flash_ws.lpt_heads(fp8_causal, 2, n, n, 128, True, 132, fp8=True)
    assert last_config()["LPT"] == 1 and last_config()["SCHED_HEADS"] == heads
    assert ran(1, 2, 1, 1024, 1024, 64) == "tl"
    assert ran(1, 2, 1, 1000, 1000, 128) == "tl"
    assert ran(1, 2, 1, 1024, 1024, 128, config=TL) == "tl"
    (q8, k8, v8), descales, _ = quantized(1, 2, 1, 1024, 1024, 128, seed=1)
    # A negative scale: the tl kernel takes the row min (the Gluon one would take the max)
    flash_attn(q8, k8, value_layout(v8), sm_scale=-0.1, **descales)
    assert kernel_ran() == "tl"
    with pytest.raises(KernelUnsupported, match="negative sm_scale"):
        flash_attn(q8, k8, value_layout(v8), sm_scale=-0.1, config=GLUON, **descales)
    monkeypatch.setenv("FLASHBENCH_GLUON", "0")
    assert ran(1, 2, 1, 1024, 1024, 128) == "tl"


@pytest.mark.gpu
@hopper_only
def test_gpu_gluon_fp8_refusals_name_the_reason():
    (q8, k8, v8), descales, _ = quantized(1, 2, 1, 1024, 1024, 128)
    assert "contiguous" in flash_ws.supported(q8, k8, v8, False)  # V must be laid out (value_layout)
    assert "BLOCK_M 192 with FP8" in flash_ws.supported(q8, k8, value_layout(v8), False, block_m=192)
    assert "sliding window" in flash_ws.supported(q8, k8, value_layout(v8), True, window=(256, 0))
    with pytest.raises(KernelUnsupported, match="BLOCK_M 192 with FP8"):
        flash_attn(q8, k8, v8, config={**GLUON, "BLOCK_M": 192}, **descales)


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize(("d", "block_n"), [(128, 128), (128, 256), (256, 64), (256, 128)])
def test_gpu_gluon_fp8_forced_causal_within_budget(d, block_n):
    """Causal FP8 below flash_ws.GLUON_FP8_MIN_SEQ's length is not dispatched to Gluon, but a forced config runs
    it correctly (the masks read the keys in flash_ws_parts.key_order within 64- to 256-key tiles; the wide
    ones wait each P V before the next S)."""
    n = flash_ws.GLUON_FP8_MIN_SEQ[(d, True)] // 2
    check(2, 4, 2, n, n, d, causal=True, config={**GLUON, "BLOCK_N": block_n, "STAGES": 2}, seed=3)
    assert (kernel_ran(), last_config()["BLOCK_N"]) == ("gluon-ws", block_n)


@pytest.mark.gpu
@pytest.mark.full  # forced; the dispatched d = 128 causal walk runs it in the tests above
@hopper_only
@pytest.mark.parametrize(("d", "causal", "poly"), [(256, True, 1), (128, False, 1), (128, True, 0)])
def test_gpu_gluon_fp8_exp2_poly_forced_either_way_within_budget(d, causal, poly):
    """EXP_POLY forced on where no default has it (64-key tiles at d = 256, an unmasked walk) and off where the
    default has it: the budget holds either way (masked scores stay 0 in P, flash_ws_parts._exp2_poly)."""
    check(2, 4, 2, 1024, 1024, d, causal=causal, config={**GLUON, "EXP_POLY": poly}, seed=7)
    assert last_config()["EXP_POLY"] == poly


@pytest.mark.gpu
@pytest.mark.full  # forced; the dispatched d = 128 walk over 256-key tiles runs it in the tests above
@hopper_only
@pytest.mark.parametrize(
    ("d", "causal", "block_n", "sums"),
    [
        (128, False, 256, 0),
        (128, True, 128, 1),
        (128, False, 128, 1),
        (256, False, 128, 1),
        (256, True, 64, 1),
    ],
)
def test_gpu_gluon_fp8_sum_mma_forced_either_way_within_budget(d, causal, block_n, sums):
    """SUM_MMA forced off where the default has it (d = 128's wide tiles, P V before S) and on where none has it:
    the narrow tiles' order (S, then P V and its sums in flight under the softmax, the sums rescaled as O is) and
    d = 256's P_EARLY order, unmasked and causal. The row sums come from the e4m3 P that P V reads."""
    check(2, 4, 2, 2048, 2048, d, causal=causal, config=forced_tiles(d, block_n, SUM_MMA=sums), seed=11)
    assert (last_config()["SUM_MMA"], last_config()["BLOCK_N"]) == (sums, block_n)


@pytest.mark.gpu
@pytest.mark.full  # forced; the dispatched causal d = 128 walk over 256-key tiles runs it in the test below
@hopper_only
@pytest.mark.parametrize(
    ("d", "causal", "block_n", "programs"),
    [
        (128, True, 128, 3),
        (128, False, 128, 0),
        (128, True, 256, 0),
        (128, False, 256, 3),
        (256, True, 64, 3),
        (256, False, 128, 3),
    ],
)
def test_gpu_gluon_fp8_loop_first_within_budget(d, causal, block_n, programs):
    """A tile's first key block through the step loops (LOOP_FIRST) in FP8: its P V one of zeros (P in fp32,
    converted) on its own V, held past its step, in each of the step's orders: S then P V (the narrow tiles), P V
    waited before S (PV_FIRST: d = 128's 256 keys), P converted before S (P_EARLY: d = 256's 128 keys); with 3
    programs each walks many tiles, so a V held or released wrongly carries into the next tile's ring. Without Q2
    (the narrow causal default's two Q buffers): the pair is refused (flash_ws.loop_first_refusal)."""
    config = forced_tiles(d, block_n, LOOP_FIRST=1, Q2=0, **({"PROGRAMS": programs} if programs else {}))
    check(2, 4, 2, 2048, 2048, d, causal=causal, config=config, seed=13)
    assert (last_config()["LOOP_FIRST"], last_config()["BLOCK_N"]) == (1, block_n)


@pytest.mark.gpu
@pytest.mark.full  # forced
@hopper_only
@pytest.mark.parametrize(
    ("causal", "loop_first", "programs", "nq"),
    [(False, 0, 0, 2048), (False, 0, 3, 2048), (True, 1, 3, 2048), (True, 0, 0, 2048), (True, 1, 0, 640)],
)
def test_gpu_gluon_fp8_pv_first_within_budget(causal, loop_first, programs, nq):
    """d = 128's 256-key step (PV_FIRST: P V, then S_g in two halves of its keys, the second half issued once P V
    is done): the halves joined are the whole tile's scores, with and without LOOP_FIRST's P V of zeros, with and
    without SUM_MMA (the causal default below 4096 keys has none), on 3 programs that walk many tiles (a half read
    from the wrong stage or a V released early carries into the next tile), and 640 rows over 2048 keys (the
    diagonal mid-way through a 256-key tile)."""
    config = forced_tiles(
        128, 256, LOOP_FIRST=loop_first, Q2=0, **({"PROGRAMS": programs} if programs else {})
    )
    check(2, 4, 2, nq, 2048, 128, causal=causal, config=config, seed=19)
    assert (last_config()["LOOP_FIRST"], last_config()["BLOCK_N"]) == (loop_first, 256)


@pytest.mark.gpu
@pytest.mark.full  # forced
@hopper_only
@pytest.mark.parametrize(
    ("d", "block_n", "nq"),
    [(128, 128, 2048), (128, 256, 2048), (256, 128, 2048), (128, 128, 640), (256, 64, 640)],
)
def test_gpu_gluon_fp8_fast_mask_within_budget(d, block_n, nq):
    """The causal diagonal by flash_ws_parts._key_order_mask (FAST_MASK): each score's key in FP8's key_order split
    into a register constant and a lane part folded into its row's limit, over 64- to 256-key tiles, square and with
    640 rows over 2048 keys (the diagonal 1408 keys on: mid-way through a 256-key tile)."""
    check(2, 4, 2, nq, 2048, d, causal=True, config=forced_tiles(d, block_n, FAST_MASK=1), seed=17)
    assert (last_config()["FAST_MASK"], last_config()["BLOCK_N"]) == (1, block_n)


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("nq", [0, 640], ids=["square", "diagonal-mid-tile"])
def test_gpu_gluon_fp8_causal_d128_takes_the_wide_tiles_from_their_min_keys(nq):
    """d = 128 causal from flash_ws.FP8_WIDE_MIN_KEYS keys: 256-key tiles, list-scheduled, P's row sums by the
    matmul, every exp2 on the MUFU and each tile's first key block through the step loops (LOOP_FIRST). Square
    (nq 0: as many rows as keys), or 640 rows over 4096 keys, which put the diagonal 3456 keys on, mid-way through a
    256-key tile, so a tile's last key block has a masked half and a diagonal half."""
    n_k = flash_ws.FP8_WIDE_MIN_KEYS[(128, True)]
    nq = nq or n_k
    check(1, 2, 1, nq, n_k, 128, causal=True, config=GLUON, seed=nq)
    cfg = last_config()
    assert (cfg["BLOCK_N"], cfg["SUM_MMA"], cfg.get("EXP_POLY", 0), cfg["LPT"], cfg["LOOP_FIRST"]) == (
        256,
        1,
        0,
        1,
        1,
    )
    assert (n_k - 640) % 256 == 128  # the mid-tile diagonal


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_fp8_d256_runs_gluon_from_its_min_length_and_the_tl_kernel_below(causal):
    """d = 256 FP8 runs Gluon with 128-key tiles (flash_ws.FP8_WIDE_N) from flash_ws.GLUON_FP8_MIN_SEQ's length
    and the tl kernel below it, where a forced {"kernel": "gluon-ws"} still runs Gluon."""
    n = flash_ws.GLUON_FP8_MIN_SEQ[(256, causal)]
    (q8, k8, v8), descales, _ = quantized(1, 2, 1, n, n, 256, seed=3)
    flash_attn(q8, k8, value_layout(v8), causal=causal, **descales)
    assert (kernel_ran(), last_config()["BLOCK_N"]) == ("gluon-ws", 128), causal
    (q8, k8, v8), descales, _ = quantized(1, 2, 1, n // 2, n // 2, 256, seed=3)
    flash_attn(q8, k8, value_layout(v8), causal=causal, **descales)
    assert kernel_ran() == "tl", causal
    flash_attn(q8, k8, value_layout(v8), causal=causal, config=GLUON, **descales)
    assert kernel_ran() == "gluon-ws", causal


@pytest.mark.skipif(HOPPER, reason="checks the dispatch off Hopper")
def test_fp8_dispatch_never_picks_gluon_without_a_hopper_gpu():
    (q8, k8, v8), descales, _ = quantized(1, 1, 1, 128, 128, 128, seed=2)
    assert not flash_ws.preferred(q8, k8, value_layout(v8), False)
    check(1, 1, 1, 128, 128, 128, causal=False, seed=2)
    assert kernel_ran() == "tl"
    with pytest.raises(
        KernelUnsupported, match=r"flash_attn \(fp8\): flash_ws forward: (needs a Hopper|this Triton)"
    ):
        flash_attn(q8, k8, v8, config=GLUON, **descales)


def test_fp8_gluon_default_config_fits_and_reports_its_tiles():
    """FP8 tiles are half the bytes: four 128-key K/V stages fit in shared memory at d = 128 (bf16's do not), and
    so do two stages of the wide key tiles the default takes where the keys are a multiple of them (256 at d = 128
    without a mask, 128 at d = 256), else the head dim's; the default config passes check_config and names the
    tiles the byte model reads."""
    from flashbench.models.io_model import Blocks

    cfg = flash_ws.default_config(128, False, fp8=True, n_k=4096)
    assert flash_ws.check_config(dict(cfg)) == cfg
    assert (cfg["BLOCK_N"], cfg["STAGES"]) == (256, 2)
    assert Blocks.from_config(cfg) == Blocks(fwd_m=cfg["BLOCK_M"], fwd_n=256)
    # Q (e4m3), O (bf16, its own buffers), the ring and SUM_MMA's ones tile: the 182,672 B that sm90_compile
    # reports, less barriers
    assert cfg["SUM_MMA"] == 1
    assert flash_ws.smem_bytes(cfg, 128, fp8=True) == 128 * 128 * 3 + 2 * 2 * 256 * 128 + 8 * 256
    narrow = flash_ws.default_config(128, False, fp8=True, n_k=4096 + 128)
    assert (narrow["BLOCK_N"], narrow["STAGES"]) == (128, 3)
    # causal: 128 keys up to FP8_WIDE_MIN_KEYS, where the wide tiles' diagonal waste costs more than they save;
    # over the wide ones each tile's first key block goes through the step loops (LOOP_FIRST), over 128 not
    causal_narrow = flash_ws.default_config(128, True, fp8=True, n_k=2048)
    assert (causal_narrow["BLOCK_N"], causal_narrow.get("LOOP_FIRST", 0)) == (128, 0)
    causal_wide = flash_ws.default_config(128, True, fp8=True, n_k=4096)
    assert (causal_wide["BLOCK_N"], causal_wide["LOOP_FIRST"]) == (256, 1)
    assert not any(
        flash_ws.default_config(256, c, fp8=True, n_k=8192).get("LOOP_FIRST") for c in (False, True)
    )
    assert not cfg.get("LOOP_FIRST")  # d = 128 without a mask
    four = {**narrow, "STAGES": 4}
    assert flash_ws.smem_bytes(four, 128, fp8=True) <= flash_ws.SMEM_LIMIT < flash_ws.smem_bytes(four, 128)
    for causal in (False, True):
        d256 = flash_ws.default_config(256, causal, fp8=True, n_k=4096)
        assert (d256["BLOCK_N"], d256["STAGES"]) == (128, 2)
        assert flash_ws.smem_bytes(d256, 256, fp8=True) <= flash_ws.SMEM_LIMIT  # 229,760 B with the barriers
        assert flash_ws.default_config(256, causal, fp8=True, n_k=4096 + 64)["BLOCK_N"] == 64
    assert "BLOCK_N 256 only in FP8" in flash_ws.tile_refusal(256, 128, 256, fp8=True)
    assert "BLOCK_N 256 only in FP8" in flash_ws.tile_refusal(128, 128, 256)
    assert flash_ws.tile_refusal(256, 128, 128, fp8=True) is None
    assert "in 16 bits" in flash_ws.tile_refusal(256, 128, 128)


@pytest.mark.skipif(not flash_ws.HAVE_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize(("d", "block_n"), [(64, 128), (128, 128), (128, 256), (256, 64), (256, 128)])
def test_fp8_key_tiles_load_their_rows_in_the_operand_order(d, block_n):
    """The FP8 K descriptor's 5-D box, read as TMA reads it (shape and strides over K's rows), puts key
    16R + 4t + 2g + e at tile row 16R + 8g + 2t + e: the order flash_ws_parts.key_order undoes in the masks.
    Every key of a tile appears once, and the next tile starts BLOCK_N keys on (the narrow and wide tiles)."""
    n = 512
    k = torch.zeros(1, 2, n, d, dtype=torch.float8_e4m3fn)
    rows = torch.arange(2 * n, dtype=torch.float64)[:, None].expand(2 * n, d).contiguous()
    q = torch.empty(1, 2, 128, d).to(torch.float8_e4m3fn)
    _, kd, _, _ = flash_ws._descriptors(q, k, k, torch.empty(1, 2, 128, d, dtype=torch.bfloat16), block_n, d)
    assert kd.block_shape == [block_n // 16, 2, 4, 2, d] and kd.shape[0] == 2 * n // 16
    box = rows.as_strided(kd.block_shape, kd.strides)  # the box at coordinate 0, each element its key
    tile = box.reshape(block_n, d)[:, 0].long()
    expected = [
        16 * r + 4 * t + 2 * g + e
        for r in range(block_n // 16)
        for g in (0, 1)
        for t in range(4)
        for e in (0, 1)
    ]
    assert tile.tolist() == expected and sorted(expected) == list(range(block_n))
    next_tile = rows.as_strided(kd.block_shape, kd.strides, storage_offset=kd.strides[0] * (block_n // 16))
    assert (next_tile.reshape(block_n, d)[:, 0].long() - tile).unique().tolist() == [block_n]

"""Hand-computed FLOP, byte, memory and roofline cases; the models import no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flashbench.models import flops, io_model, memory
from flashbench.models import roofline as rl
from flashbench.spec.cases import DTYPE_BYTES

N128K = 131072


def test_models_do_not_import_torch():
    code = (
        "import sys\n"
        "import flashbench.models.flops, flashbench.models.io_model, flashbench.models.memory\n"
        "import flashbench.models.roofline, flashbench.gpu.hardware, flashbench.gpu.nvml\n"
        "assert 'torch' not in sys.modules, 'a pure model imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- FLOPs


def test_causal_pairs_exact_not_half():
    assert flops.unmasked_pairs(4, 4, causal=True) == 10  # 1 + 2 + 3 + 4
    assert flops.unmasked_pairs(16, 16, causal=True) == 16 * 17 // 2  # the 0.5x shortcut says 128
    # seq_q != seq_k: bottom-right row i sees i + (6 - 2) + 1 keys -> 5 + 6; top-left: 1 + 2
    assert flops.unmasked_pairs(2, 6, causal=True, alignment="bottom-right") == 11
    assert flops.unmasked_pairs(2, 6, causal=True, alignment="top-left") == 3
    # more queries than keys, bottom-right: the first 2 rows see nothing, then 1, 2, 3, 4
    assert flops.unmasked_pairs(6, 4, causal=True) == 10


def test_forward_backward_flops_and_recompute_share():
    fwd = flops.forward_flops(2, 8, 1024, 1024, 64, causal=False)
    assert fwd == 4 * 2 * 8 * 64 * 1024 * 1024
    assert flops.attention_flops(2, 8, 1024, 1024, 64, False, "bwd") == 2.5 * fwd
    assert flops.attention_flops(2, 8, 1024, 1024, 64, False, "fwd+bwd") == 3.5 * fwd
    share = flops.recompute_share()
    assert share["over_stored_p_backward_2x"] == pytest.approx(0.25)  # the documents' 25% of backward
    assert share["of_fwd_bwd_without_recompute_3x"] == pytest.approx(1 / 6)  # and 16.7% of the total


# ---------------------------------------------------------------- memory


def test_one_head_fp16_attention_matrix_at_128k_is_34_36_gb():
    assert memory.attention_matrix_bytes(1, 1, N128K, N128K, 2) == 34_359_738_368
    assert round(memory.attention_matrix_bytes(1, 1, N128K, N128K, 2) / 1e9, 2) == 34.36


def test_m_and_l_fp32_at_128k_is_1_05_mb():
    assert memory.softmax_stats_bytes(1, 1, N128K, stats=2) == 1_048_576
    assert round(memory.softmax_stats_bytes(1, 1, N128K, stats=2) / 1e6, 2) == 1.05


def test_documents_83_tb_is_really_88_tb():
    plan = memory.plan_model_memory(80, 32, 32, 128, 4096, N128K, 2)
    assert round(plan["standard_per_model"] / 1e12, 2) == 87.96


def test_llama70b_plan_and_checkpointing():
    plan = memory.plan_model_memory(80, 64, 8, 128, 8192, N128K, 2)
    assert round(plan["standard_per_model"] / 1e9, 1) == 175921.9  # 000's Llama-70B figure
    ck = memory.plan_model_memory(80, 64, 8, 128, 8192, N128K, 2, checkpointing=True)
    boundary = 80 * N128K * 8192 * 2
    assert ck["standard_per_model"] == 64 * 34_359_738_368 + boundary
    assert ck["flash_lse_per_model"] == 64 * N128K * 4 + boundary


def test_naive_forward_peak_is_inside_softmax_before_o_exists():
    b, h, n, d = 2, 4, 256, 64
    E, mask = b * h * n * n, n * n
    o32 = b * h * n * d * 4
    # fp16: s (2) + s.float() (4) + the fp32 softmax (4) = 10 bytes/element; O comes later, when s (2) and P (2)
    # are what is left: max(10 E, 4 E + O)
    assert memory.predicted_peak_bytes("naive", b, h, h, n, n, d, 2, False, "fwd") == 10 * E
    assert memory.predicted_peak_bytes("naive", b, h, h, n, n, d, 2, True, "fwd") == 10 * E + mask
    tiny = memory.predicted_peak_bytes("naive", 1, 1, 1, 4, 4, 64, 2, False, "fwd")  # O larger than 6 E
    assert tiny == 4 * 16 + 4 * 64 * 2
    # fp32: .float() and .to() are no-ops, so s (4) and P (4) are still alive when O is written: 8 E + O
    assert memory.predicted_peak_bytes("naive", b, h, h, n, n, d, 4, False, "fwd") == 8 * E + o32


def test_naive_backward_peak_is_16_bytes_per_element_on_cuda_and_12_on_the_cpu():
    # At the softmax backward: the saved fp32 P (4) + dP.float() (4) + its result dS (4) live together with, on
    # CUDA, softmax_backward's fp32 `grad * output` temporary (4): 16 E (measured 16.0-16.3 on an H200). The CPU
    # kernel needs no temporary: 12 E (measured 12.2-12.3 here, test_memory_vs_measured.py). Beside them O and
    # dV (dQ and dK do not exist yet); causal adds one bool mask.
    b, h, n, d = 2, 4, 256, 64
    E, o_dv = b * h * n * n, 2 * b * h * n * d * 2
    for mode in ("bwd", "fwd+bwd"):
        cuda = memory.predicted_peak_bytes("naive", b, h, h, n, n, d, 2, True, mode)
        cpu = memory.predicted_peak_bytes("naive", b, h, h, n, n, d, 2, True, mode, device="cpu")
        assert (cuda, cpu) == (16 * E + n * n + o_dv, 12 * E + n * n + o_dv)
    fp32 = memory.predicted_peak_bytes("naive", b, h, h, n, n, d, 4, False, "bwd", device="cpu")
    assert fp32 == 12 * E + 2 * o_dv


def test_sdpa_math_peak_memory_hand_computed():
    # torch's math backend on bf16: fp32 copies of q, k, v and the scaled q (4 x 16 KiB here) live through the
    # call; the peak is in _safe_softmax: 9 bytes/element + 1 byte per row (+ an fp32 causal mask).
    b, h, n, d = 1, 2, 64, 32
    E, rows, t32 = b * h * n * n, b * h * n, b * h * n * d * 4
    assert (
        memory.predicted_peak_bytes("sdpa-math", b, h, h, n, n, d, 2, False, "fwd") == 9 * E + rows + 4 * t32
    )
    causal = memory.predicted_peak_bytes("sdpa-math", b, h, h, n, n, d, 2, True, "fwd")
    assert causal == 9 * E + rows + 4 * t32 + 4 * n * n
    # fwd+bwd: the softmax backward's 16 E beside the scaled q and k, dV in fp32 and O in bf16
    bwd = memory.predicted_peak_bytes("sdpa-math", b, h, h, n, n, d, 2, True, "fwd+bwd")
    assert bwd == 16 * E + 3 * t32 + t32 // 2


def test_flash_peak_memory_is_linear_in_n():
    b, h, n, d = 1, 8, 4096, 128
    fwd = memory.predicted_peak_bytes("flash", b, h, h, n, n, d, 2, True, "fwd")
    assert fwd == b * h * n * d * 2 + b * h * n * 4  # O + log-sum-exp
    bwd2 = memory.predicted_peak_bytes("flash", b, h, h, 2 * n, 2 * n, d, 2, True, "fwd+bwd")
    bwd1 = memory.predicted_peak_bytes("flash", b, h, h, n, n, d, 2, True, "fwd+bwd")
    assert bwd2 == 2 * bwd1
    # O, dQ, dK, dV + LSE and Delta; a declared workspace (an fp32 dQ accumulator = 2 q-sized bf16) adds to it
    assert bwd1 == 4 * b * h * n * d * 2 + 2 * b * h * n * 4
    with_acc = memory.predicted_peak_bytes("flash", b, h, h, n, n, d, 2, True, "fwd+bwd", bwd_workspace_q=2)
    assert with_acc - bwd1 == 2 * b * h * n * d * 2
    assert memory.predicted_peak_bytes("stored-p", b, h, h, n, n, d, 2, False, "fwd") >= b * h * n * n * 2
    # flash-v1: O (e) + fp32 O accumulator + m, l and the saved LSE (fp32 each)
    assert memory.predicted_peak_bytes("flash-v1", b, h, h, n, n, d, 2, False, "fwd") == b * h * n * (
        d * 2 + d * 4 + 12
    )


def test_memory_rejects_unknown_family_and_mode():
    with pytest.raises(ValueError):
        memory.predicted_peak_bytes("nope", 1, 1, 1, 8, 8, 8, 2, False, "fwd")
    with pytest.raises(ValueError):
        memory.predicted_peak_bytes("flash", 1, 1, 1, 8, 8, 8, 2, False, "sideways")


# ---------------------------------------------------------------- bytes


def test_compulsory_bytes_hand_computed():
    b, h, n, d, e = 1, 2, 1024, 64, 2
    t = io_model.compulsory_traffic(b, h, h, n, n, d, e, "fwd")
    assert t.read == 3 * b * h * n * d * e and t.write == b * h * n * d * e
    gqa = io_model.compulsory_traffic(1, 8, 2, n, n, d, e, "fwd")
    assert gqa.read == (8 + 2 * 2) * n * d * e  # K and V have 2 heads


def test_naive_fp16_forward_moves_28_bytes_per_element():
    b, h, n, d, e = 1, 1, 4096, 64, 2
    t = io_model.hbm_traffic("naive", b, h, h, n, n, d, e, False, "fwd")
    per_element = t.total - 4 * n * d * e  # minus Q, K, V read and O written
    assert per_element == 28 * n * n
    t32 = io_model.hbm_traffic("naive", b, h, h, n, n, d, 4, False, "fwd")
    assert t32.total - 4 * n * d * 4 == 24 * n * n


def test_naive_fp16_backward_moves_48_bytes_per_element_with_the_softmax_backward_temporary():
    # dP = dO V^T (2 written), dV = P^T dO (2 read), dP.float() (2 + 4), CUDA's softmax backward: first
    # tmp = grad * output (4 + 4 read, 4 written), then its kernel over tmp and the output (8 read, 4 written),
    # dS.to() (4 + 2), dS * scale (2 + 2), dQ = dS K and dK = dS^T Q (2 read each): 48 bytes per element.
    n, d, e = 4096, 64, 2
    bwd = io_model.hbm_traffic("naive", 1, 1, 1, n, n, d, e, False, "bwd")
    assert bwd.total - 8 * n * d * e == 48 * n * n  # minus dO, V, dO, Q, K read and dV, dQ, dK written
    temporary = [p for p in bwd.parts if "grad * output" in p.name]
    assert [(p.read, p.write) for p in temporary] == [(8 * n * n, 4 * n * n)]
    math = io_model.hbm_traffic("sdpa-math", 1, 1, 1, n, n, d, e, False, "bwd")
    assert [(p.read, p.write) for p in math.parts if "grad * output" in p.name] == [(8 * n * n, 4 * n * n)]


def test_flash_no_l2_rereads_kv_once_per_query_block():
    n, d, e, bm = 4096, 64, 2, 128
    blocks = io_model.Blocks(fwd_m=bm, fwd_n=64)
    t = io_model.hbm_traffic("flash", 1, 1, 1, n, n, d, e, False, "fwd", l2_reuse=False, blocks=blocks)
    kv = (n // bm) * 2 * n * d * e
    assert t.total == n * d * e + kv + n * d * e + n * 4  # Q, K/V re-reads, O, LSE
    comp = io_model.hbm_traffic("flash", 1, 1, 1, n, n, d, e, False, "fwd")
    assert comp.total == 4 * n * d * e + n * 4


def test_causal_tiles_skip_masked_blocks():
    s = io_model.Shape(1, 1, 1, 256, 256, 64, 2, True)
    # 2 query blocks of 128 over key blocks of 64: the first sees 2 key blocks, the second 4
    assert io_model.kv_rows_per_head(s, 128, 64) == 128 + 256
    assert io_model.tile_elements_per_head(s, 128, 64) == 128 * 128 + 128 * 256
    # 4 key blocks of 64 over query blocks of 128: blocks 0,1 are seen from row 0; blocks 2,3 from row 128
    assert io_model.q_rows_per_head(s, 128, 64) == 256 + 256 + 128 + 128


def test_flash_moves_fewer_bytes_than_naive_even_without_l2():
    # 003's "Complexity Analysis" says the opposite; per head and block 128 the ratio is ~2 Br / d.
    for n in (512, 2048, 8192, 32768):
        naive = io_model.hbm_bytes("naive", 1, 12, 12, n, n, 64, 2, False, "fwd")
        flash = io_model.hbm_bytes("flash", 1, 12, 12, n, n, 64, 2, False, "fwd", l2_reuse=False)
        assert flash < naive


def test_v1_reads_and_writes_o_once_per_kv_block():
    n, d, e = 1024, 64, 2
    blocks = io_model.Blocks(fwd_m=128, fwd_n=128)
    t = io_model.hbm_traffic("flash-v1", 1, 1, 1, n, n, d, e, False, "fwd", blocks=blocks)
    parts = {p.name: p for p in t.parts}
    rmw = parts["read + write O_acc, m, l (once per K/V block)"]
    assert rmw.read == rmw.write == (n // 128) * n * (d * 4 + 8)  # fp32 accumulator row + m + l


def test_stored_p_backward_reads_p_twice():
    n, d, e = 1024, 64, 2
    flash = io_model.hbm_bytes("flash", 1, 1, 1, n, n, d, e, False, "bwd")
    stored = io_model.hbm_bytes("stored-p", 1, 1, 1, n, n, d, e, False, "bwd")
    assert stored - flash == 2 * n * n * e


def test_fwd_bwd_is_the_sum_of_fwd_and_bwd():
    args = (2, 4, 2, 512, 768, 64, 2, True)
    for fam in io_model.FAMILIES:
        total = io_model.hbm_bytes(fam, *args, "fwd+bwd")
        assert total == io_model.hbm_bytes(fam, *args, "fwd") + io_model.hbm_bytes(fam, *args, "bwd")


def test_compute_dtype_of_a_family():
    assert io_model.compute_dtype("sdpa-math", "bf16") == "fp32"
    assert io_model.compute_dtype("flash", "fp32") == "tf32"


# ---------------------------------------------------------------- roofline


def test_roofline_arithmetic():
    peak, bw = 989.4e12, 3.35e12
    assert rl.ridge_point(peak, bw) == pytest.approx(295.3, abs=0.1)
    assert rl.attainable_flops_s(100, peak, bw) == pytest.approx(335e12)
    assert rl.attainable_flops_s(1000, peak, bw) == peak
    assert rl.bound_kind(100, peak, bw) == "memory-bound" and rl.bound_kind(300, peak, bw) == "compute-bound"
    assert rl.min_time_s(1e12, 1e9, peak, bw) == pytest.approx(max(1e12 / peak, 1e9 / bw))
    assert rl.attainable_flops_s(10, None, bw) == 10 * bw


def test_validity_guard_flags_points_above_the_roof():
    p = rl.predict("flash", 1, 16, 16, 4096, 4096, 128, "bf16", 2, False, "fwd", {"bf16": 989.4e12}, 3.35e12)
    ok = rl.assess(p.compulsory.min_time_s * 2, p)
    assert ok.valid and ok.pct_of_roofline == pytest.approx(50.0)
    too_fast = rl.assess(p.compulsory.min_time_s / 2, p)
    assert not too_fast.valid and "faster than the roofline allows" in too_fast.error


def test_blocks_from_a_reported_kernel_config():
    assert io_model.Blocks.from_config({"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4}) == io_model.Blocks(
        64, 32
    )
    assert io_model.Blocks.from_config({"block_m": 128, "block_n": 128}).fwd_n == 128
    assert io_model.Blocks.from_config(None) is None
    assert io_model.Blocks.from_config({"num_warps": 4}) is None  # no tiles reported: the model's defaults
    reported = {"BLOCK_M": 64, "BLOCK_N": 128, "bwd": {"dkdv": {"BLOCK_M": 32, "BLOCK_N": 128}, "dq": {}}}
    assert io_model.Blocks.from_config(reported) == io_model.Blocks(64, 128, bwd_m=32, bwd_n=128)
    one_pass = {
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "bwd": {
            "dkdv": {"BLOCK_M": 64, "BLOCK_N": 128, "ONE_PASS": 1},
            "dq": {"kernel": "gluon-ws", "ONE_PASS": 1},
        },
    }
    assert io_model.Blocks.from_config(one_pass).bwd_one_pass
    assert not io_model.Blocks.from_config(reported).bwd_one_pass


def test_one_pass_backward_traffic():
    """The one-pass backward has no dQ pass (K and V read once, Q and dO streamed once per K/V block) but zeroes,
    adds into and converts an fp32 dQ: without L2 reuse an fp32 tile read and written per K/V block, with it
    each fp32 line once."""
    b, h, n, d = 1, 16, 8192, 128
    two, one = io_model.Blocks(bwd_m=64, bwd_n=128), io_model.Blocks(bwd_m=64, bwd_n=128, bwd_one_pass=True)

    def traffic(blocks, l2):
        return io_model.hbm_traffic("flash", b, h, h, n, n, d, 2, False, "bwd", l2_reuse=l2, blocks=blocks)

    q, q32, kv, stats = b * h * n * d * 2, b * h * n * d * 4, b * h * n * d * 2, 2 * b * h * n * 4
    per_kv_block = n // 128  # query rows streamed per K/V block, summed over the blocks: n * n / 128
    pre_read, pre_write = 2 * q, b * h * n * 4  # the Delta pre-pass: read O, dO; write Delta
    # read Q, K, V, dO, LSE, Delta; the adds read each fp32 line once; the conversion reads it
    assert traffic(one, True).read == pre_read + 2 * q + 2 * kv + stats + q32 + q32
    # zero the fp32 dQ, the sums written back once, dK, dV, dQ converted
    assert traffic(one, True).write == pre_write + q32 + q32 + 2 * kv + q
    streamed = per_kv_block * (2 * q + stats)
    assert traffic(one, False).read == pre_read + 2 * kv + streamed + per_kv_block * q32 + q32
    assert traffic(one, False).write == pre_write + q32 + per_kv_block * q32 + 2 * kv + q
    # the two passes re-read K and V once per 64-row query block instead, and write dQ once, in the input dtype
    assert traffic(two, False).read - traffic(one, False).read == (
        2 * q + stats + (n // 64) * 2 * kv - per_kv_block * q32 - q32
    )


def test_fp8_inputs_are_one_byte_and_write_a_bf16_output():
    """FP8 (e4m3) attention reads Q, K, V at 1 byte per element and writes O in bf16: the compulsory and the flash
    forward traffic, and the flash forward's memory, count O at 2 bytes; the roofline uses the fp8 peak."""
    b, h, n, d = 2, 16, 4096, 128
    qkv, o, lse = 3 * b * h * n * d, 2 * b * h * n * d, 4 * b * h * n
    assert DTYPE_BYTES["fp8"] == 1
    assert io_model.compulsory_traffic(b, h, h, n, n, d, 1, "fwd").total == qkv + o
    assert io_model.hbm_traffic("flash", b, h, h, n, n, d, 1, False, "fwd").total == qkv + o + lse
    assert memory.predicted_peak_bytes("flash", b, h, h, n, n, d, 1, False, "fwd") == o + lse
    assert io_model.compute_dtype("flash", "fp8") == "fp8"
    # bf16 unchanged: O in the input's 2 bytes
    assert io_model.compulsory_traffic(b, h, h, n, n, d, 2, "fwd").total == 2 * qkv + o


def test_a_one_pass_backward_adds_its_fp32_dq_buffer_to_the_prediction():
    """The provider declares no workspace for the bundled backward (its two passes allocate none); a row whose
    kernel_config says dQ ran in one pass gets the fp32 dQ buffer that pass allocates added to the plan's figure."""
    from flashbench.engine.runner import _predicted_mem
    from flashbench.spec.cases import Case
    from flashbench.spec.plan import PlannedCase

    one = {"BLOCK_M": 128, "bwd": {"dkdv": {"ONE_PASS": 1}, "dq": {"kernel": "gluon-ws", "ONE_PASS": 1}}}
    two = {"BLOCK_M": 128, "bwd": {"dkdv": {"ONE_PASS": 0}, "dq": {"BLOCK_M": 128, "BLOCK_N": 64}}}
    fp32_dq = 2 * 16 * 4096 * 128 * 4
    assert memory.reported_workspace_bytes(one, 2, 16, 4096, 128, "bwd") == fp32_dq
    assert memory.reported_workspace_bytes(one, 2, 16, 4096, 128, "fwd+bwd") == fp32_dq
    assert memory.reported_workspace_bytes(one, 2, 16, 4096, 128, "fwd") == 0
    assert memory.reported_workspace_bytes(two, 2, 16, 4096, 128, "bwd") == 0
    assert memory.reported_workspace_bytes(None, 2, 16, 4096, 128, "bwd") == 0
    case = Case("triton", 2, 16, 16, 4096, 4096, 128, "bf16", False, "bwd")
    assert (
        _predicted_mem(PlannedCase(case, predicted_mem_bytes=1000), {"kernel_config": one}) == 1000 + fp32_dq
    )
    assert _predicted_mem(PlannedCase(case, predicted_mem_bytes=1000), {"kernel_config": two}) == 1000
    assert _predicted_mem(PlannedCase(case), {"kernel_config": one}) is None

"""The serving side of the models by hand-computed cases: FLOPs and bytes over ragged lengths, the split-KV byte
model, the bound of a decode row, the KV-cache planner."""

from __future__ import annotations

import pytest

from flashbench.analysis.memory_plan import build_memory
from flashbench.gpu import hardware
from flashbench.models import flops, io_model, memory
from flashbench.models import roofline as rl
from flashbench.providers import builtin


def test_flops_of_a_ragged_batch_sum_each_sequence():
    # Nq = 2, causal bottom-right: a sequence of L keys keeps (L - 1) + L pairs; L = 1 keeps 0 + 1.
    assert flops.forward_flops(3, 4, 2, 10, 8, True, seqlens_k=[10, 5, 1]) == 4 * 4 * 8 * (19 + 9 + 1)
    assert flops.attention_flops(2, 4, 1, 10, 8, False, "fwd", seqlens_k=[10, 3]) == 4 * 4 * 8 * 13
    with pytest.raises(ValueError, match="2 lengths for a batch of 3"):
        flops.forward_flops(3, 4, 1, 10, 8, True, seqlens_k=[1, 2])


def test_decode_bytes_read_kv_once_per_kv_head_plus_the_split_partials():
    # B 2, H 32, Hkv 8, Nq 1, N 4096, d 128, bf16; 4 splits
    q = 2 * 32 * 1 * 128 * 2
    kv = 2 * 2 * 8 * 4096 * 128 * 2
    partials = 4 * (2 * 32 * 1) * (128 + 1) * 4
    t = io_model.hbm_traffic(
        "decode", 2, 32, 8, 1, 4096, 128, 2, True, "fwd", blocks=io_model.Blocks(splits=4)
    )
    assert t.read == q + kv + partials and t.write == q + partials
    unsplit = io_model.hbm_traffic("decode", 2, 32, 8, 1, 4096, 128, 2, True, "fwd")
    assert unsplit.total == 2 * q + kv == io_model.compulsory_traffic(2, 32, 8, 1, 4096, 128, 2, "fwd").total
    with pytest.raises(ValueError, match="forward only"):
        io_model.hbm_traffic("decode", 2, 32, 8, 1, 4096, 128, 2, True, "bwd")


def test_ragged_bytes_count_the_valid_keys_only():
    lens = [4096, 1000, 1]
    kv = 2 * sum(lens) * 8 * 128 * 2
    q_and_o = 2 * 3 * 32 * 128 * 2
    assert io_model.compulsory_traffic(3, 32, 8, 1, 4096, 128, 2, "fwd", seqlens_k=lens).total == kv + q_and_o
    got = io_model.hbm_traffic("flash", 3, 32, 8, 1, 4096, 128, 2, True, "fwd", seqlens_k=lens)
    assert got.total == kv + q_and_o + 3 * 32 * 4  # + the LSE the flash family writes


def test_kernel_config_gives_the_split_count():
    blocks = io_model.Blocks.from_config({"num_splits": 16, "BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4})
    assert blocks is not None and blocks.splits == 16 and blocks.fwd_n == 128
    assert builtin.family_of("triton-decode") == "decode"  # its declaration, which both models take


def test_bound_rule_puts_decode_on_the_memory_slope():
    h100 = hardware.lookup("h100")
    roof = hardware.datasheet_ceiling(h100)
    p = rl.predict("decode", 1, 32, 8, 1, 32768, 128, "bf16", 2, True, "fwd", roof.flops_s, roof.bw_bytes_s)
    assert p.model.ai == pytest.approx(4 * 32 * 128 * 32768 / p.model.bytes) and p.model.ai < 4.01
    assert p.bound == rl.MEMORY_BOUND and p.model.ai < p.ridge / 50
    # measured at 2.8 TB/s: % of roofline = bytes/s over the bandwidth
    a = rl.assess(p.model.bytes / 2.8e12, p)
    assert a.bound == rl.MEMORY_BOUND and a.pct_of_roofline == pytest.approx(100 * 2.8e12 / roof.bw_bytes_s)


def test_measured_ceiling_carries_the_calibrated_read_bandwidth():
    ceiling = hardware.measured_ceiling({"copy_bw_gb_s": 3000.0, "read_bw_gb_s": 3150.0, "matmul_tflops": {}})
    assert ceiling.bw_bytes_s == 3.0e12 and ceiling.read_bw_bytes_s == 3.15e12
    assert hardware.measured_ceiling({"copy_bw_gb_s": 3000.0}).read_bw_bytes_s is None


def test_decode_memory_is_the_output_only():
    assert memory.predicted_peak_bytes("decode", 2, 32, 8, 1, 4096, 128, 2, True, "fwd") == 2 * 32 * 128 * 2


def test_kv_cache_bytes_contiguous_and_paged_by_hand():
    # Llama 3 8B: 32 layers x 8 KV heads x d 128, bf16: 2 * 32 * 8 * 128 * 2 = 131072 bytes per token
    assert memory.kv_cache_bytes(32, 8, 128, 2, [8192] * 4) == 4 * 8192 * 131072
    assert memory.kv_cache_bytes(32, 8, 128, 2, [100, 16], page_size=16) == (112 + 16) * 131072  # 7 + 1 pages
    assert memory.kv_cache_bytes(1, 1, 1, 2, [1], page_size=64) == 2 * 2 * 64
    # expected: the last page of every sequence (page - 1) / 2 tokens short of full
    assert memory.kv_cache_expected_bytes(32, 8, 128, 2, 8192, 4, 16) == 4 * (8192 + 7.5) * 131072
    assert memory.kv_cache_expected_bytes(32, 8, 128, 2, 8192, 4) == 4 * 8192 * 131072


def test_memory_planner_reports_the_kv_cache_of_a_model():
    report = build_memory("llama3-8b", [8192, 131072], dtype="bf16", batch=8, page_size=16)
    first, last = report["rows"]
    assert first["kv_cache_contiguous"] == 8 * 8192 * 131072  # 8.59 GB
    assert last["kv_cache_contiguous"] == 8 * 131072 * 131072  # 137 GB
    assert first["kv_cache_paged_unused"] == pytest.approx(8 * 7.5 * 131072)
    assert report["page_size"] == 16


def test_decode_floor_is_the_read_time_plus_the_empty_kernel():
    # 256 MB at 3000 GB/s is 85.33 us; with a 4.5 us empty kernel the floor is 89.83 us.
    assert rl.decode_floor_s(256e6, 3.0e12, 4.5e-6) == pytest.approx(89.8333e-6, rel=1e-5)
    assert rl.decode_floor_s(0, 3.0e12, 4.5e-6) == 4.5e-6  # no bytes: the launch alone


def test_measured_ceiling_carries_the_empty_kernel_times():
    calibration = {"read_bw_gb_s": 3000.0, "empty_kernel_us": {"eager": 4.5, "cuda_graph": 2.5}}
    ceiling = hardware.measured_ceiling(calibration)
    assert ceiling.empty_kernel_s == pytest.approx(4.5e-6) and ceiling.empty_graph_s == pytest.approx(2.5e-6)
    assert hardware.measured_ceiling({"read_bw_gb_s": 3000.0}).empty_kernel_s is None  # an older calibration


def test_time_over_floor_per_serving_row_takes_the_floor_of_its_timing_mode():
    import pandas as pd

    from flashbench.analysis.modelled import add_bandwidth

    roof = hardware.measured_ceiling(
        {"read_bw_gb_s": 3000.0, "empty_kernel_us": {"eager": 4.5, "cuda_graph": 2.5}}
    )
    frame = pd.DataFrame(
        {
            "ok": [True, True, True],
            "serving": [True, True, False],
            "cuda_graph": [False, True, False],
            "median_ms": [0.12, 0.12, 1.0],
            "model_bytes_compulsory": [256e6, 256e6, 1e9],
            "model_bytes_provider": [256e6, 256e6, 1e9],
        }
    )
    add_bandwidth(frame, [roof])
    eager_floor, graph_floor = ((256e6 / 3e12 + e) * 1e3 for e in (4.5e-6, 2.5e-6))
    assert frame["floor_ms"].tolist()[:2] == pytest.approx([eager_floor, graph_floor])
    assert frame["time_over_floor"].tolist()[:2] == pytest.approx([0.12 / eager_floor, 0.12 / graph_floor])
    assert frame["time_over_floor"].isna().tolist() == [False, False, True]  # training rows have no floor
    add_bandwidth(frame, [hardware.measured_ceiling({"read_bw_gb_s": 3000.0})])  # no empty-kernel time
    assert frame["time_over_floor"].isna().all()

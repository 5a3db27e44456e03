"""tools/ncu_pipes.py's reading of Nsight Compute's raw page: the SMs' spread of active cycles and the top stall
reasons, on the committed profiles of d = 64 causal N = 1024 (H200; results/examples/h200-speed/d64-causal-1024)."""

from __future__ import annotations

from pathlib import Path

from scripts_helpers import ROOT, load_script

PROFILES = ROOT / "results/examples/h200-speed/d64-causal-1024/ncu/mask-all"


def _row(tool, name: str) -> dict[str, str]:
    rows = tool.read_rows(PROFILES / f"{name}.ncu.csv")
    assert rows is not None and len(rows) == 1
    return rows[0]


def test_the_walks_uneven_table_shows_as_a_wide_sm_spread():
    """The 192-row walk under its schedule table of then: its busiest SM 13% above the mean and its idlest 30%
    below; cuDNN's within 3-4%. A row without the metrics gives none."""
    tool = load_script("tools/ncu_pipes.py")
    low, high = tool.sm_spread(_row(tool, "gluon_192"))
    assert round(low, 3) == 0.695 and round(high, 3) == 1.133
    low, high = tool.sm_spread(_row(tool, "sdpa-cudnn"))
    assert 0.96 < low < 1.0 < high < 1.04
    assert tool.sm_spread({"sm__cycles_active.avg": "1"}) is None


def test_top_stalls_rank_reasons_without_the_issuing_warp(capsys):
    """The walk's warps wait most on barriers, fixed latencies and the long scoreboard, and 0.79 per issue on
    instruction fetch; parse() prints both derived lines for every kernel of a folder."""
    tool = load_script("tools/ncu_pipes.py")
    row = _row(tool, "gluon_192")
    assert [reason for reason, _ in tool.top_stalls(row, top=3)] == ["barrier", "wait", "long_scoreboard"]
    stalls = dict(tool.top_stalls(row, top=8))
    assert "selected" not in stalls and stalls["no_instruction"] == 0.79
    tool.parse(Path(PROFILES))
    out = capsys.readouterr().out
    assert out.count("SM active cycles over their mean") == 3 and out.count("stalls per issue") == 3


def test_gluon_providers_force_a_block_m_or_any_flash_ws_keys():
    """gluon@BM forces BLOCK_M; gluon@KEY=V/KEY=V any flash_ws keys (the FP8 profiles' narrow tiles), over the
    defaults: the forced config names the Gluon kernel either way. triton@BM.BN.W.S forces a tl tile, triton
    none."""
    tool = load_script("tools/ncu_pipes.py")
    assert tool.gluon_config("gluon@192") == {"kernel": "gluon-ws", "BLOCK_M": 192}
    assert tool.gluon_config("gluon") == {"kernel": "gluon-ws", "BLOCK_M": 128}
    forced = tool.gluon_config("gluon@BLOCK_N=128/STAGES=3")
    assert forced == {"kernel": "gluon-ws", "BLOCK_N": 128, "STAGES": 3}
    assert tool.tl_config("triton") is None
    assert tool.tl_config("triton@64.128.4.3") == {
        "BLOCK_M": 64,
        "BLOCK_N": 128,
        "num_warps": 4,
        "num_stages": 3,
    }

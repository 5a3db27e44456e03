"""tools/ncu_stalls.py's reading of an Nsight Compute source page: stall reasons, the hottest instructions and the
shared-memory wavefronts past their ideal."""

from __future__ import annotations

import gzip

from scripts_helpers import ROOT, load_script

HEADER = (
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
    '"Instructions Executed","L1 Wavefronts Shared","L1 Wavefronts Shared Ideal","stall_long_sb","stall_short_sb",'
    '"stall_selected","stall_long_sb (Not Issued)"'
)
# Four SASS lines as ncu prints them (a title row first): a cp.async wait, a conflicted 2x store, a clean
# ldmatrix, an FMNMX waiting on shared memory.
PAGE = "\n".join(
    [
        '"Kernel Name","_decode",',
        HEADER,
        '"0x10","      UIADD3 UR9, UR9, 0x1, URZ","60","60","100","0","0","50","0","10","50"',
        '"0x20","      STS.128 [R7+UR7+0x9000], R48","10","8","100","800","400","0","6","4","0"',
        '"0x30","      LDSM.16.M88.4 R12, [R6+UR14]","5","5","100","400","400","0","5","0","0"',
        '"0x40","      FMNMX R2, R171, R2, !PT","25","20","100","0","0","0","20","5","0"',
    ]
)


def test_summary_sums_reasons_ranks_instructions_and_counts_conflicts(tmp_path):
    tool = load_script("tools/ncu_stalls.py")
    plain, packed = tmp_path / "page.csv", tmp_path / "page.csv.gz"
    plain.write_text(PAGE)
    packed.write_bytes(gzip.compress(PAGE.encode()))
    for path in (plain, packed):
        summary = tool.summarize(tool.read_source_page(path), top=2)
        # every sample counted once, by reason (the "Not Issued" columns are a subset, not added)
        assert summary["samples"] == 100
        assert summary["reasons"] == {"long_sb": 50, "short_sb": 31, "selected": 19}
        assert [(item["sass"].split()[0], item["samples"], item["reason"]) for item in summary["top"]] == [
            ("UIADD3", 60, "long_sb"),
            ("FMNMX", 25, "short_sb"),
        ]
        assert summary["hottest"] == {
            "executed": 100,
            "samples": 100,
            "opcodes": {"UIADD3": 60, "FMNMX": 25, "STS": 10, "LDSM": 5},
        }
        assert (summary["shared_wavefronts"], summary["shared_excess"]) == (1200, 400)
        assert [item["sass"].split()[0] for item in summary["shared_conflicted"]] == ["STS.128"]
    text = tool.render(tool.summarize(tool.read_source_page(plain)))
    assert "long_sb                    50  50.0%" in text
    assert "400 beyond the ideal (33.3%)" in text and "2.0x the ideal" in text


def test_a_file_that_is_no_source_page_is_one_line_and_exit_2(tmp_path, capsys):
    tool = load_script("tools/ncu_stalls.py")
    other = tmp_path / "details.txt"
    other.write_text("    Section: Warp State Statistics\n")
    assert tool.main(["summary", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no source-page header" in err
    assert tool.main(["summary", str(tmp_path / "missing.csv")]) == 2


def test_profiled_childs_config_line_reads_back_among_other_output(capsys):
    """The ncu tools' children print the config their kernels ran on one marked line (ncu_bytes.print_config) and
    the drivers read it back from the child's stdout (read_config): None where the child printed none."""
    tool = load_script("tools/ncu_bytes.py")
    config = {"BLOCK_N": 64, "num_splits": 4, "kernel": "tl"}
    print("==PROF== Connected to process 7")
    tool.print_config(config)
    print("==PROF== Disconnected")
    assert tool.read_config(capsys.readouterr().out) == config
    assert tool.read_config("==PROF== Connected to process 7\n") is None


def test_the_hottest_code_is_the_fp8_forwards_consumer_loop_and_its_exp2s_lead():
    """The committed profile of the FP8 Gluon forward (d = 128, 256-key tiles, H200): the instructions executed
    516,096 times each (the two consumers' steady loop) hold 65% of the samples (8 of the 12 warps; the producer's
    idle warps wait on a barrier elsewhere), MUFU.EX2 the most of them, then the waits for the warpgroup's own
    matmuls; predicates and modifiers are not part of an opcode."""
    tool = load_script("tools/ncu_stalls.py")
    page = ROOT / "results/examples/h200-fp8/studies/step-order/ncu/d128-16384-source.csv.gz"
    summary = tool.summarize(tool.read_source_page(page))
    hot = summary["hottest"]
    assert hot["executed"] == 516096
    assert 0.64 < hot["samples"] / summary["samples"] < 0.66
    assert list(hot["opcodes"])[:3] == ["MUFU", "WARPGROUP", "FMNMX"]
    assert 0.30 < hot["opcodes"]["MUFU"] / hot["samples"] < 0.32
    assert tool.opcode("@!P3  BRA 0x7ff1d77f7b80") == "BRA"
    assert tool.opcode("WARPGROUP.DEPBAR.LE gsb0, 0x0") == "WARPGROUP"
    assert "the hottest code, the instructions executed 516096 times each" in tool.render(summary)


def test_code_by_execution_count_splits_the_causal_walk_into_its_loops_and_tile_code(tmp_path):
    """The committed profile of the FP8 causal forward at d = 128, N = 2048 (128-key tiles, one Q buffer, H200):
    grouped by how often each instruction ran, the unmasked steps (53,760 executions: 13,440 steps of each
    consumer's four warps) hold the most samples, then the producer's idle warps, then the tile's code (8,192:
    2,048 tiles, four warps), whose runs of lines are each consumer's placement, first block and epilogue; the
    masked steps run 7,680 times. The synthetic page is one group of one run."""
    tool = load_script("tools/ncu_stalls.py")
    page = ROOT / "results/examples/h200-fp8/studies/q2-narrow-causal/ncu/fp8-d128c-2048-source.csv.gz"
    summary = tool.summarize(tool.read_source_page(page))
    groups = {group["executed"]: group for group in summary["groups"]}
    assert summary["groups"][0]["executed"] == 53760 and len(groups[53760]["runs"]) == 2  # two consumers
    assert 0.42 < groups[53760]["samples"] / summary["samples"] < 0.43
    tile_runs = sorted(groups[8192]["runs"], key=lambda run: -run[2])
    assert sum(run[2] for run in tile_runs) == groups[8192]["samples"]
    assert [run[1] - run[0] + 1 for run in tile_runs[:2]] == [589, 588]  # each consumer's first block
    assert groups[7680]["instructions"] == 1525
    assert "53760x:" in tool.render(summary)
    plain = tmp_path / "page.csv"
    plain.write_text(PAGE)
    assert [
        (group["executed"], group["runs"]) for group in tool.code_groups(tool.read_source_page(plain))
    ] == [(100, [(0, 3, 100)])]

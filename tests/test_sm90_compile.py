"""tools/sm90_compile.py's reading of SASS: which loops run the matmuls, and what each pass of them spills."""

from __future__ import annotations

from scripts_helpers import load_script

# Two partitions' loops around their wgmmas, each with an mbarrier wait's retry loop inside, the second spilling;
# a loop without matmuls around it all (a persistent walk's tile loop) and one on its own.
SASS = """
.L_x_0:
        /*0000*/                   LDL R2, [R1] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], RZ ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ ;
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12], R24, gsb0 ;
        /*0050*/                   BRA `(.L_x_0) ;
.L_x_2:
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, gsb0 ;
        /*0070*/                   LDL R3, [R1+0x4] ;
        /*0080*/                   STL [R1+0x8], R3 ;
.L_x_3:
        /*0090*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], RZ ;
        /*00a0*/              @!P0 BRA `(.L_x_3) ;
        /*00b0*/                   LDL R4, [R1+0xc] ;
        /*00c0*/              @P1 BRA `(.L_x_2) ;
        /*00d0*/                   BRA `(.L_x_0) ;
.L_x_4:
        /*00e0*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00f0*/                   BRA `(.L_x_4) ;
"""


def test_each_matmul_loop_and_its_spills_per_pass():
    tool = load_script("tools/sm90_compile.py")
    # the first loop reloads one spilled value a pass (its retry loop holds no matmul); the second pays 3
    assert tool.mma_loop_spills(SASS) == [1, 3]
    assert tool.mma_loop_spills(SASS.replace("HGMMA", "IMAD")) == []
    # the main loop: the most tensor-core ops (the tile loop around both partitions' loops)
    assert len(tool.main_loop(SASS)) == 14


def test_the_step_loop_is_the_shortest_matmul_loop_that_runs_exp2s():
    """An attention step's summary reads the innermost matmul loop with MUFU.EX2 in it, the shortest of them (a
    warp-specialized kernel's consumers each have one), and counts its softmax and matmul opcodes."""
    tool = load_script("tools/sm90_compile.py")
    assert tool.step_loop(SASS) == []  # no exp2s
    step = SASS.replace("LDL R2, [R1]", "MUFU.EX2 R2, R2").replace("LDL R3, [R1+0x4]", "MUFU.EX2 R3, R3")
    # both partitions' matmul loops run an exp2 now: the first (6 instructions, the second 7) is the step
    assert len(tool.step_loop(step)) == 6
    assert len(tool.step_loop(step.replace("MUFU.EX2 R2, R2", "IADD3 R2, R2, 0x1, RZ"))) == 7
    body = tool.step_loop(step)
    assert len(body) == 6 and body[0] == "MUFU.EX2 R2, R2"
    assert tool.loop_summary(body, tool.STEP_OPS, "step loop") == (
        "step loop: 6 instructions, HGMMA.64x64x16.F32.BF16 2, MUFU.EX2 1"
    )


def test_a_dump_part_names_one_of_its_n_shares_from_zero():
    """--part i/n: every n-th kernel from the i-th, i from 0 to n - 1; one past it would compile nothing and say
    nothing, so it is refused in one line, as is anything but two integers."""
    import pytest

    tool = load_script("tools/sm90_compile.py")
    assert (
        tool.parse_part("0/2") == (0, 2)
        and tool.parse_part("1/2") == (1, 2)
        and tool.parse_part("0/1") == (0, 1)
    )
    for bad, why in [("2/2", "0 to 1"), ("-1/3", "0 to 2"), ("1", "two integers"), ("a/2", "two integers")]:
        with pytest.raises(ValueError, match=why) as err:
            tool.parse_part(bad)
        assert "\n" not in str(err.value)

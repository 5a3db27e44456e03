"""The Gluon warp-specialized forward (kernels/flash_ws.py) against the float64 reference.

The oracle and budget are the sweep's (flashbench.engine.correctness); the base-2 LSE within 1e-3 of the
reference's. Hopper only:
elsewhere `supported` must refuse, with a reason.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from flashbench.kernels import KernelUnsupported, flash_attn, flash_ws, flash_ws_parts, last_config, varlen_ws
from tiers import smoke

from flashbench.engine import correctness

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
D128 = (2, 4, 4, 256, 256, 128)
D256 = (2, 4, 4, 256, 256, 256)
FP8 = torch.float8_e4m3fn


def default_config_bf16(shape, dtype, causal, config) -> bool:
    """The smoke tier: the config flash_attn dispatches (DEFAULT_CONFIG: 128-row tiles at d = 128 and 256, 192-row
    persistent ones at d = 64, list-scheduled when causal) on every shape in bf16, and in fp16 on the d = 128 and
    d = 256 ones; the forced configs (stages, persistent walks, head groups) are the full tier's."""
    return config == {} and (dtype == torch.bfloat16 or shape in (D128, D256))


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "shape",
    [
        (2, 4, 4, 256, 256, 128),
        (1, 8, 2, 1024, 1024, 64),
        (2, 4, 1, 384, 640, 128),
        (1, 2, 2, 128, 128, 64),
        (2, 4, 2, 320, 512, 128),
        D256,
        (1, 8, 2, 1024, 1024, 256),
        (2, 4, 1, 320, 576, 256),
    ],
    ids=[
        "d128",
        "d64-gqa4",
        "nk>nq-mqa",
        "one-block",
        "partial-tile",
        "d256",
        "d256-gqa4",
        "d256-partial-mqa",
    ],
)
@pytest.mark.parametrize(
    "config",
    [
        {},
        {"STAGES": 2},
        {"PERSISTENT": 1, "PROGRAMS": 3, "STAGES": 2},
        {"PERSISTENT": 1, "PROGRAMS": 4, "STAGES": 2, "SCHED_HEADS": 4},
        {"PERSISTENT": 1, "PROGRAMS": 3, "STAGES": 2, "SCHED_HEADS": 4, "LPT": 1},
        {"PERSISTENT": 1, "PROGRAMS": 3, "STAGES": 2, "Q2": 1, "LEAD_S": 0},
        {"PERSISTENT": 1, "PROGRAMS": 3, "STAGES": 2, "SCHED_HEADS": 4, "LPT": 1, "Q2": 1, "LEAD_S": 0},
        {
            "PERSISTENT": 1,
            "PROGRAMS": 3,
            "STAGES": 2,
            "SCHED_HEADS": 4,
            "LPT": 1,
            "LEAD_S": 0,
            "Q2": 0,
            "LOOP_FIRST": 1,
        },
        {"STAGES": 2, "LEAD_S": 0, "Q2": 0, "LOOP_FIRST": 1},
        {"FAST_MASK": 1},
        {"FAST_MASK": 0},
    ],
    ids=[
        "default",
        "s2",
        "persistent",
        "persistent-grouped",
        "persistent-lpt",
        "q2",
        "q2-lpt",
        "loop-first-lpt",
        "loop-first-tile",
        "fast-mask",
        "key-mask",
    ],
)
@smoke(default_config_bf16)
def test_forward_matches_reference(shape, dtype, causal, config):
    if config.get("Q2") and shape[-1] == 256:  # two Q buffers do not fit beside d = 256's tiles: refused
        with pytest.raises(ValueError, match=r"shared memory .* \(Q2=1 holds two Q buffers\)"):
            check_forward(shape, dtype, causal, config)
        return
    check_forward(shape, dtype, causal, config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "shape",
    [(1, 8, 2, 1024, 1024, 64), (2, 4, 2, 320, 512, 64), (1, 2, 2, 128, 128, 64), (1, 3, 1, 384, 640, 64)],
    ids=["two-idle-warpgroups", "one-idle", "one-tile", "exact-nk>nq"],
)
@pytest.mark.parametrize(
    "config",
    [
        {},
        {"STAGES": 2},
        {"PERSISTENT": 1, "PROGRAMS": 3},
        {"PERSISTENT": 1, "PROGRAMS": 2, "SCHED_HEADS": 4, "STAGES": 2},
        {"PERSISTENT": 1, "PROGRAMS": 5, "SCHED_HEADS": 4, "STAGES": 2, "LPT": 1},
        {"PERSISTENT": 1, "PROGRAMS": 3, "Q2": 1},
        {"PERSISTENT": 1, "PROGRAMS": 5, "SCHED_HEADS": 4, "STAGES": 2, "LPT": 1, "Q2": 1},
        {"LOOP_FIRST": 1, "Q2": 0},
        {"PERSISTENT": 1, "PROGRAMS": 5, "SCHED_HEADS": 4, "STAGES": 2, "LPT": 1, "LOOP_FIRST": 1, "Q2": 0},
        {"PERSISTENT": 1, "PROGRAMS": 3, "LOOP_FIRST": 0},
        {"BLOCK_N": 64, "STAGES": 3},
        {"BLOCK_N": 64, "STAGES": 2, "PERSISTENT": 1, "PROGRAMS": 5, "SCHED_HEADS": 4, "LPT": 1},
    ],
    ids=[
        "default",
        "s2",
        "persistent",
        "persistent-grouped",
        "persistent-lpt-p5",
        "q2",
        "q2-lpt-p5",
        "loop-first",
        "loop-first-lpt-p5",
        "no-loop-first",
        "n64-s3",
        "n64-lpt-p5",
    ],
)
@smoke(lambda dtype, config, **_: config == {} and dtype == torch.bfloat16)  # d = 64's dispatched config
def test_three_warpgroup_forward_matches_reference(shape, dtype, causal, config):
    """192-row tiles (d = 64): tiles end at seq_q, so the first one's leading warpgroups own no row and only
    keep the barrier protocol; a wrong turn or release count hangs or corrupts the rows after it. Persistent
    configs with 2-3 programs walk many tiles each: the ring, turn and Q/O barriers carry over between tiles. The
    causal default runs each tile's first block through the step loops (LOOP_FIRST: its V held past its step),
    `no-loop-first` the first block's own code; without a mask the default holds two Q buffers (Q2)."""
    check_forward(shape, dtype, causal, {"BLOCK_M": 192, **config})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
def test_idle_warpgroups_release_q_only_after_it_lands():
    """Every SM's program walking causal 192-row tiles in groups of four heads: each head's first tile has two idle
    warpgroups and one key block, so an idle warpgroup that released the Q buffers without waiting for this tile's
    Q could complete the last tile's release while another warpgroup still read it (wrong rows, seen on an H100 at
    this shape before the wait). A race: repeated."""
    for _ in range(4):
        check_forward(
            (16, 32, 32, 1024, 1024, 64),
            torch.bfloat16,
            True,
            {"BLOCK_M": 192, "PERSISTENT": 1, "SCHED_HEADS": 4, "STAGES": 2, "LPT": 1},
        )


def check_forward(shape, dtype, causal, config):
    b, h, hkv, nq, nk, d = shape
    g = torch.Generator(device="cuda").manual_seed(nq + nk + d)
    q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype, generator=g)
    scale = d**-0.5
    o, lse, cfg = flash_ws.attention_forward(q, k, v, causal, scale, config)
    ref = correctness.reference(q, k, v, causal=causal, sm_scale=scale)
    low = correctness.reference(q, k, v, causal=causal, sm_scale=scale, dtype=dtype)
    verdict = correctness.compare({"out": o}, ref, low, dtype)
    assert verdict.ok, f"{verdict.reason}; {verdict.describe()}"
    assert (lse - ref["lse"] / math.log(2)).abs().max().item() < 1e-3  # the kernel's LSE is base 2
    assert cfg["kernel"] == "gluon-ws" and all(cfg[key] == val for key, val in config.items())


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
def test_refusals_name_the_reason():
    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    q = t(1, 2, 256, 128)
    assert "fp16 or bf16" in flash_ws.supported(q.float(), q.float(), q.float(), False)
    assert "head dim 96" in flash_ws.supported(t(1, 2, 256, 96), t(1, 2, 256, 96), t(1, 2, 256, 96), False)
    assert "seq_q % 64" in flash_ws.supported(t(1, 2, 200, 128), t(1, 2, 256, 128), t(1, 2, 256, 128), False)
    assert "only at head dim 64" in flash_ws.supported(q, q, q, False, block_m=192)
    assert "contiguous" in flash_ws.supported(q.transpose(1, 2).contiguous().transpose(1, 2), q, q, False)
    assert "seq_k >= seq_q" in flash_ws.supported(
        t(1, 2, 512, 128), t(1, 2, 256, 128), t(1, 2, 256, 128), True
    )
    assert flash_ws.supported(q, q, q, True) is None
    with pytest.raises(ValueError, match="head dim 96"):
        flash_ws.attention_forward(t(1, 2, 256, 96), t(1, 2, 256, 96), t(1, 2, 256, 96), False, 0.1)
    with pytest.raises(ValueError, match="KiB of shared memory"):
        flash_ws.attention_forward(q, q, q, False, 0.1, {"PERSISTENT": 1, "STAGES": 3})
    q256 = t(1, 2, 256, 256)
    assert "BLOCK_N 128 at head dim 256" in flash_ws.supported(q256, q256, q256, False, block_n=128)
    k288 = t(1, 2, 288, 256)
    assert "seq_k % 64" in flash_ws.supported(q256, k288, k288, False)
    with pytest.raises(ValueError, match="KiB of shared memory at head dim 256"):
        flash_ws.attention_forward(q256, q256, q256, False, 0.1, {"STAGES": 3})


@pytest.mark.skipif(HOPPER, reason="checks the refusal off Hopper")
def test_refused_off_hopper():
    q = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
    why = flash_ws.supported(q, q, q, False)
    assert why in ("needs a Hopper GPU (capability 9.x)", "this Triton has no Gluon")


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d, n", [(128, 2048), (64, 8192), (256, 2048)], ids=["d128", "d64", "d256"])
def test_flash_attn_takes_gluon_and_backward_agrees(monkeypatch, causal, d, n):
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, do = (
        torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    grads = {}
    for gluon in ("1", "0"):
        monkeypatch.setenv("FLASHBENCH_GLUON", gluon)
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = flash_attn(qq, kk, vv, causal=causal)
        assert (last_config().get("kernel") == "gluon-ws") == (gluon == "1")
        o.backward(do)
        grads[gluon] = (o, qq.grad, kk.grad, vv.grad)
    for a, b in zip(grads["1"], grads["0"], strict=True):
        assert rel(a, b) < 1e-2  # two bf16 forwards: outputs agree to bf16 rounding, so do the gradients


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
def test_reported_gluon_config_can_be_forced_back():
    q = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.float16)
    flash_attn(q, q, q, config={"kernel": "gluon-ws", "STAGES": 2})
    cfg = last_config()
    assert cfg["kernel"] == "gluon-ws" and cfg["STAGES"] == 2
    flash_attn(q, q, q, config=cfg)
    assert last_config() == cfg


def test_forced_gluon_config_is_checked():
    with pytest.raises(ValueError, match="unknown key 'BLOCK_K'"):
        flash_ws.check_config({"BLOCK_K": 64})
    with pytest.raises(ValueError, match="STAGES=5 must be one of"):
        flash_ws.check_config({"STAGES": 5})
    with pytest.raises(ValueError, match="BLOCK_M=256 must be one of"):
        flash_ws.check_config({"BLOCK_M": 256})
    with pytest.raises(ValueError, match="PROGRAMS=-1 must be a count"):
        flash_ws.check_config({"PROGRAMS": -1})
    for chain in (-1, True, "2"):
        with pytest.raises(ValueError, match="LPT_CHAIN=.* must be a number >= 0"):
            flash_ws.check_config({"LPT_CHAIN": chain})
    with pytest.raises(ValueError, match="SCHED_HEADS=32 must be one of"):
        flash_ws.check_config({"SCHED_HEADS": 32})  # groups of 32 went with the round-robin causal walk
    with pytest.raises(ValueError, match="BLOCK_N=80 must be one of"):
        flash_ws.check_config({"BLOCK_N": 80})  # Gluon tensors are powers of two (FA3's d = 256 tile)
    assert flash_ws.check_config({"BLOCK_N": 64}) == {"BLOCK_N": 64}
    with pytest.raises(ValueError, match="unknown key 'PIN_WAIT'"):
        flash_ws.check_config({"PIN_WAIT": 1})  # measured no gain, removed
    assert flash_ws.check_config({"PERSISTENT": 1, "SCHED_HEADS": 4}) == {"PERSISTENT": 1, "SCHED_HEADS": 4}
    assert flash_ws.smem_bytes({"BLOCK_M": 128, "STAGES": 3, "PERSISTENT": 1}, 128) > flash_ws.SMEM_LIMIT
    assert flash_ws.smem_bytes({"BLOCK_M": 128, "STAGES": 3}, 128) == 128 * 128 * 2 + 2 * 3 * 128 * 128 * 2
    assert flash_ws.check_config({"STAGES": 2, "PERSISTENT": 0}) == {"STAGES": 2, "PERSISTENT": 0}


def test_causal_persistent_walk_must_be_list_scheduled():
    """Round-robin left causal programs unbalanced (their tiles are unequal): a forced causal persistent config
    without LPT is refused before any input check, and the causal defaults are list-scheduled."""
    q = torch.zeros(1, 2, 256, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="causal persistent walk is list-scheduled"):
        flash_ws.attention_forward(q, q, q, True, 0.1, {"PERSISTENT": 1, "LPT": 0})
    with pytest.raises(ValueError, match="causal persistent walk is list-scheduled"):
        flash_ws.attention_forward(q, q, q, False, 0.1, {"PERSISTENT": 1, "LPT": 0}, window=(1024, 0))
    for (_, causal), cfg in flash_ws.DEFAULT_CONFIG.items():
        assert not causal or (cfg["PERSISTENT"] and cfg["LPT"])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "num_m,bh,heads,programs", [(8, 256, 16, 132), (4, 6, 4, 5), (64, 16, 1, 132), (3, 2, 4, 7)]
)
def test_lpt_table_hands_out_every_tile_once_and_balances_the_work(num_m, bh, heads, programs, causal):
    """The persistent schedule (LPT=1): each tile exactly once, each program's in the kernel's tile order, padded
    past the last tile, and no program more than one tile's work (the longest) above the least loaded."""
    n = num_m * 128
    cost = flash_ws.tile_costs(num_m, 128, 128, n, n, causal, -1, 0)
    table = flash_ws.lpt_table(cost, bh, heads, programs, causal, torch.device("cpu"))
    tiles = num_m * bh
    assert table.shape[0] == programs and table.dtype == torch.int32
    seen = table[table < tiles]
    assert sorted(seen.tolist()) == list(range(tiles))
    assert all((row[row < tiles].diff() > 0).all() for row in table)

    def work(
        t,
    ):  # key blocks of tile t (flash_ws_parts.tile's order: groups of `heads`, longest first if causal)
        group_base = (t // (num_m * heads)) * heads
        in_group = min(bh - group_base, heads)
        m = (t % (num_m * heads)) // in_group
        return (num_m - m if causal else num_m) + flash_ws.TILE_COST

    loads = [sum(work(t) for t in row.tolist() if t < tiles) for row in table]
    assert max(loads) - min(loads) <= num_m + flash_ws.TILE_COST
    if causal and tiles >= 4 * programs:  # heavy tiles first: round-robin's worst program is well above
        robin = [sum(work(t) for t in range(p, tiles, programs)) for p in range(programs)]
        assert max(loads) <= max(robin)


def test_the_table_evens_what_the_list_schedule_leaves_uneven():
    """d = 64 causal at N = 1024 (16 x 32 heads, 192-row tiles in groups of 4 heads, 132 programs): handing each tile
    to the least loaded program leaves the busiest 4% above the mean, as the schedule charges it; the table the
    kernel walks trades tiles until it is within 0.5% (the GPU's busiest SM was 13% above the mean before, by Nsight
    Compute's active cycles). Every program keeps a tile, in tile order, where there are barely more tiles than
    programs."""
    n, bh, programs = 1024, 512, 132
    num_m = -(-n // 192)
    cost = flash_ws.tile_costs(num_m, 192, 128, n, n, True, -1, 0)
    order = [
        (t % (num_m * 4)) // 4 for t in range(num_m * bh)
    ]  # query block from the last: groups of 4 heads
    mean = sum(cost) * bh / programs
    _, greedy = flash_ws._list_schedule(cost, bh, 4, programs, True)
    table = flash_ws.lpt_table(cost, bh, 4, programs, True, torch.device("cpu"))
    loads = [sum(cost[num_m - 1 - order[t]] for t in row.tolist() if t < num_m * bh) for row in table]
    assert greedy > 1.03 * mean and max(loads) <= 1.005 * mean
    few = flash_ws.lpt_table(
        flash_ws.tile_costs(4, 128, 128, 512, 512, True, -1, 0), 2, 4, 5, True, torch.device("cpu")
    )
    assert all((row < 8).sum() >= 1 and (row[row < 8].diff() > 0).all() for row in few)


def test_the_rebalancing_step_picks_what_trying_every_pair_in_order_picks():
    """_nearest_option bisects per tile where a step used to list every move and trade: it must pick the same
    option, the first in order (moves, then trades by the two programs' tiles in order) whose cost difference lies
    in (0, gap) nearest half the gap, ties included (costs in halves and thirds tie often), and the tables the
    kernel walks stay as they were measured."""

    def every_pair(mine, theirs, gap, can_move):
        options = [(c, t, None) for c, t in mine.items() if can_move]
        options += [(c - d, t, u) for c, t in mine.items() for d, u in theirs.items()]
        fits = [o for o in options if 1e-9 < o[0] < gap - 1e-9]
        return min(fits, key=lambda o: abs(o[0] - gap / 2)) if fits else None

    rng = random.Random(7)
    for _ in range(3000):
        step = rng.choice((0.5, 1 / 3, 0.25))
        mine = {rng.randint(1, 40) * step + 0.5: t for t in range(rng.randint(1, 12))}
        theirs = {rng.randint(1, 40) * step + 0.5: 100 + u for u in range(rng.randint(1, 12))}
        gap = rng.randint(0, 60) * rng.choice((0.5, 1 / 3, 0.25))
        can_move = rng.random() < 0.8
        args = (mine, theirs, gap, can_move)
        assert flash_ws._nearest_option(*args) == every_pair(*args)


def test_a_block_costs_the_warpgroups_that_run_it():
    """tile_blocks_cost: a key block costs max(a, chain) / W for the a of the tile's W warpgroups that run it. A
    192-row tile that starts 128 rows before row 0 has one warpgroup with rows; under a causal mask with three
    warpgroups each stops after its last block (SKIP_DIAG); chain 0 charges every block in full."""
    cost = flash_ws.tile_blocks_cost
    # 1024 keys in 8 blocks of 128, no mask: a whole tile, then the first tile of N = 1024 (rows -128..63)
    assert cost(64, 192, 128, 1024, 0, False, -1, 2) == 8
    assert cost(-128, 192, 128, 1024, 0, False, -1, 2) == pytest.approx(8 * 2 / 3)
    assert cost(-128, 192, 128, 1024, 0, False, -1, 1) == pytest.approx(8 / 3)
    assert cost(-128, 192, 128, 1024, 0, False, -1, 0) == 8  # in full, whoever runs it
    assert cost(-64, 192, 128, 1024, 0, False, -1, 1) == pytest.approx(8 * 2 / 3)  # two warpgroups with rows
    # causal, rows 192..383 over 384 keys: the warpgroups need blocks [0, 2), [0, 3), [0, 3)
    assert cost(192, 192, 128, 384, 0, True, -1, 1) == pytest.approx(3 / 3 + 3 / 3 + 2 / 3)
    assert cost(192, 192, 128, 384, 0, True, -1, 0) == 3
    # two warpgroups (128 rows) never skip a block: chain 2 is the full charge
    assert cost(128, 128, 128, 256, 0, True, -1, 2) == cost(128, 128, 128, 256, 0, True, -1, 0) == 2


def test_d64_walk_without_a_mask_spreads_its_part_empty_tiles():
    """d = 64 without a mask: 192-row tiles over N = 1024 leave each head's first tile with one warpgroup of rows.
    Round-robin over 132 programs hands all 512 of them to the 22 programs whose index is a multiple of 6 (132 is
    6 x 22), while the others walk whole tiles only; the default's list schedule (LPT_CHAIN 2) spreads them, so its
    most loaded program, costed as it schedules, has less work than round-robin's."""
    cfg = flash_ws.default_config(64, False)
    assert cfg["LPT"] == 1 and cfg["LPT_CHAIN"] == 2 and cfg["BLOCK_M"] == 192
    n, bh, programs = 1024, 512, 132
    num_m = -(-n // 192)
    costs = flash_ws.walk_costs(cfg, n, n, False, -1)  # tile_blocks_cost + TILE_COST per m
    assert costs == flash_ws.tile_costs(num_m, 192, 128, n, n, False, -1, 2)
    table = flash_ws.lpt_table(costs, bh, 4, programs, False, torch.device("cpu"))
    tiles = num_m * bh
    assert sorted(table[table < tiles].tolist()) == list(range(tiles))

    def m_of(t):  # flash_ws_parts.tile's order: groups of 4 heads, then query block, then head
        return (t % (num_m * 4)) // 4

    lpt = [sum(costs[m_of(t)] for t in row.tolist() if t < tiles) for row in table]
    robin_first = [sum(1 for t in range(p, tiles, programs) if t % num_m == 0) for p in range(programs)]
    robin = [sum(costs[t % num_m] for t in range(p, tiles, programs)) for p in range(programs)]
    assert max(robin_first) > 20 and sum(c > 0 for c in robin_first) == 22
    part_empty = [sum(1 for t in row.tolist() if t < tiles and m_of(t) == 0) for row in table]
    # the programs that get part-empty tiles: four times round-robin's 22
    spread = sum(c > 0 for c in part_empty)
    assert max(part_empty) <= max(robin_first) // 2 and spread >= 4 * 22
    assert max(lpt) < 0.95 * max(robin)


def test_the_d64_walk_without_a_mask_is_list_scheduled_only_where_that_beats_round_robin():
    """list_schedule_pays, 16k tokens of 32 heads at d = 64 over 132 programs: the list schedule's most loaded
    program has less work than round-robin's where 192 does not divide N and the part-empty tiles pile up (N =
    1024-4096), the same at 8192 and 16384 (there the default walks round-robin), and with 128-row tiles (d = 128:
    every tile equal) or a tile per program."""
    pays, costs = flash_ws.list_schedule_pays, flash_ws.tile_costs
    for n, expected in ((1024, True), (2048, True), (4096, True), (8192, False), (16384, False)):
        cost = costs(-(-n // 192), 192, 128, n, n, False, -1, 2)
        bh = 16384 // n * 32
        heads = flash_ws.lpt_heads(flash_ws.default_config(64, False), bh, n, n, 64, False, 132)
        assert pays(cost, bh, heads, 132) == expected, n
    assert not pays(costs(8, 128, 128, 1024, 1024, False, -1, 2), 256, 4, 132)
    assert not pays(costs(6, 192, 128, 1024, 1024, False, -1, 2), 2, 4, 12)  # 12 tiles, 12 programs


def test_a_round_robin_fallback_keeps_a_forced_head_group(monkeypatch):
    """d = 64 without a mask at 8192 keys walks round-robin (list_schedule_pays: equal tiles); a forced
    SCHED_HEADS stays the walk's tile order and the reported config (a forced config is reported as run)."""
    monkeypatch.setattr(flash_ws, "input_refusal", lambda *args, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)
    x = torch.empty(2, 32, 8192, 64, dtype=torch.bfloat16)
    for config, heads in (({}, 1), ({"SCHED_HEADS": 4}, 4)):
        plan = flash_ws.ForwardPlan(x, x, x, False, config)
        assert plan.config["LPT"] == 0 and plan.config["SCHED_HEADS"] == heads
        assert plan.call.constexprs["SCHED_HEADS"] == heads


def test_walk_load_costs_the_walk_the_plan_runs():
    """walk_load, the report's reading of a row's config: round-robin over 2048 equal tiles on 132 programs is 15.5
    rounds, so the busiest program walks 16 tiles of 8 key blocks + TILE_COST against a mean of 2048 such tiles
    over 132 programs; a
    list-scheduled config's busiest program is the busiest row of the very table the kernel walks (lpt_table);
    one program per tile has no walk; PROGRAMS sets the programs."""
    full, tile = flash_ws.default_config(128, False), 8 + flash_ws.TILE_COST
    assert flash_ws.walk_load(16, 16, 1024, 1024, False, full, 132) == (
        2048,
        132,
        16 * tile,
        2048 * tile / 132,
    )
    assert flash_ws.walk_load(16, 16, 1024, 1024, False, {**full, "PROGRAMS": 128}, 132)[1:3] == (
        128,
        16 * tile,
    )
    assert flash_ws.walk_load(16, 16, 1024, 1024, False, {**full, "PERSISTENT": 0}, 132) is None
    for d, n, causal, win in (
        (128, 1024, True, -1),
        (64, 1024, False, -1),
        (64, 2048, True, -1),
        (128, 4096, True, 512),
    ):
        cfg, bh = flash_ws.default_config(d, causal), 16384 // n * 2048 // d
        cfg["SCHED_HEADS"] = flash_ws.lpt_heads(cfg, bh, n, n, d, causal, 132, win)
        num_m = -(-n // cfg["BLOCK_M"])
        tiles, programs, busiest, mean = flash_ws.walk_load(bh, 1, n, n, causal, cfg, 132, win)
        chain = cfg.get("LPT_CHAIN", 0)
        cost = flash_ws.tile_costs(num_m, cfg["BLOCK_M"], cfg["BLOCK_N"], n, n, causal, win, chain)
        table = flash_ws.lpt_table(cost, bh, cfg["SCHED_HEADS"], programs, causal, torch.device("cpu"))
        walked = [
            sum(cost[_block_of(t, num_m, cfg["SCHED_HEADS"], bh, causal)] for t in row if t < tiles)
            for row in table.tolist()
        ]
        assert (tiles, programs) == (num_m * bh, 132) and busiest == pytest.approx(max(walked)), (
            d,
            n,
            causal,
        )
        assert mean == pytest.approx(sum(walked) / programs) and mean <= busiest


def _block_of(t: int, num_m: int, group: int, bh: int, causal: bool) -> int:
    """The query block of tile t in the list schedule's order (flash_ws_parts.tile): groups of `group` heads, the
    blocks of a group's heads side by side, the longest first under a causal mask."""
    base = t // (num_m * group) * group
    r = t - base * num_m
    heads = min(bh - base, group)
    return num_m - 1 - r // heads if causal else r // heads


def _speed_heads(d: int, n: int, fp8: bool = False) -> int:
    """lpt_heads of the speed preset's causal shape (16k tokens, hidden 2048) on 132 programs."""
    cfg = flash_ws.default_config(d, True, fp8, n_k=n)
    return flash_ws.lpt_heads(cfg, max(1, 16384 // n) * 2048 // d, n, n, d, True, 132, fp8=fp8)


def test_lpt_takes_the_smallest_head_group_the_schedule_model_fills_best():
    """The bf16 causal walk's head groups at the speed preset's shapes (N = 1k-32k): where the model fills 132 SMs
    better with wider groups (d = 256 at N = 1024: 16 heads 0.970 of the time filled, 4 heads 0.892), the smallest
    within LPT_SLACK of the best, but 8 heads where they are within it over at most LPT_EIGHT_KEYS keys; one head
    where 4 heads' K and V pass 8 MiB and the model charges one head within 1%, or no group's K and V fit 32 MiB.
    The walks without a mask keep the smallest group. FP8 walks 8 heads while their K and V (1 byte) fit 8 MiB,
    else 4, and 4 with two Q buffers (Q2: d = 128's causal walk over 128-key tiles, below 4096 keys)."""
    seqs = (1024, 2048, 4096, 8192, 16384, 32768)
    assert [_speed_heads(64, n) for n in seqs] == [8, 8, 4, 4, 4, 1]
    assert [_speed_heads(128, n) for n in seqs] == [8, 8, 4, 4, 1, 1]
    unmasked = flash_ws.default_config(64, False)
    unmasked_heads = [
        flash_ws.lpt_heads(unmasked, 16384 // n * 32, n, n, 64, False, 132) for n in (1024, 2048)
    ]
    assert unmasked_heads == [4, 4]
    assert [_speed_heads(256, n) for n in seqs] == [16, 8, 4, 4, 1, 1]
    assert [_speed_heads(128, n, fp8=True) for n in (1024, 2048, 4096, 8192, 32768)] == [4, 4, 8, 4, 4]
    assert [_speed_heads(256, n, fp8=True) for n in (2048, 4096)] == [8, 4]


def test_lpt_heads_reads_the_tiles_the_walk_has():
    """Too few heads to fill a wider group: the smallest group (every group walks the same tiles). A window's walk
    is costed with its window: 128 keys make the tiles near equal, and 4 heads fill as well as 8."""
    cfg = flash_ws.default_config(128, True)
    assert flash_ws.lpt_heads(cfg, 2, 1024, 1024, 128, True, 16) == 4
    assert flash_ws.lpt_heads(cfg, 64, 2048, 2048, 128, True, 132) == 8
    assert flash_ws.lpt_heads(cfg, 64, 2048, 2048, 128, True, 132, win=128) == 4


@pytest.mark.parametrize("head_dim", [128, 256])
def test_fp8_defaults_are_persistent_and_list_scheduled_when_causal(head_dim):
    """FP8 at d = 128 and 256: a persistent walk of 128-row tiles (d = 128: 1.04-1.10x one program per tile up to
    N = 8192; d = 256: 1.06-1.09x at N = 1024-2048), list-scheduled under a causal mask, over two stages of the
    wide key tiles (flash_ws.FP8_WIDE_N) where the keys are a multiple of them (d = 128 causal: from 4096 keys,
    where they waste less of the diagonal than they save), else three of the head dim's, where d = 128's causal walk
    holds two Q buffers (Q2). Each default fits shared memory and passes check_config, so a row's reported config
    can be forced back."""
    wide = {(128, False): 256, (256, False): 128, (256, True): 128}
    for causal, n_k in itertools.product((False, True), (2048, 4096, 4096 + 64, 8192, 16384)):
        cfg = flash_ws.default_config(head_dim, causal, fp8=True, n_k=n_k)
        block_n = 256 if (head_dim, causal) == (128, True) and n_k >= 4096 else wide.get((head_dim, causal))
        stages = 2 if block_n and n_k % block_n == 0 else 3
        assert cfg["BLOCK_N"] == (block_n if stages == 2 else flash_ws.BLOCK_N[head_dim]), (cfg, n_k)
        assert cfg["PERSISTENT"] == 1 and cfg["STAGES"] == stages and cfg.get("LPT", 0) == int(causal), cfg
        q2 = causal and head_dim in flash_ws.FP8_Q2_DIMS and stages == 3
        assert cfg.get("Q2", 0) == int(q2), cfg
        assert flash_ws.smem_bytes(cfg, head_dim, fp8=True) <= flash_ws.SMEM_LIMIT
        assert flash_ws.check_config(dict(cfg)) == cfg


def test_fp8_exp2_poly_is_on_for_the_causal_d128_walk_only():
    """An eighth of the exp2s on the FMA pipe (EXP_POLY) where it was measured faster: FP8 at d = 128 under a
    causal mask (0.971-0.989x the time from N = 2048 on an H200); d = 256 causal lost 1.2-3.5%, and without a mask
    d = 128 1-3%. The kernel gets it only in FP8 mode, forced or not (kernel_constexprs)."""
    on = [
        (d, c)
        for d in (128, 256)
        for c in (False, True)
        if flash_ws.default_config(d, c, fp8=True).get("EXP_POLY")
    ]
    assert on == [(128, True)]
    assert not any(
        flash_ws.default_config(d, c).get("EXP_POLY") for d in (64, 128, 256) for c in (False, True)
    )
    # over the wide key tiles (causal from 8192 keys) the step would spill with it: SUM_MMA instead
    wide = flash_ws.default_config(128, True, fp8=True, n_k=8192)
    assert (wide["BLOCK_N"], wide.get("EXP_POLY", 0), wide["SUM_MMA"]) == (256, 0, 1)
    cfg = flash_ws.default_config(128, True, fp8=True)
    assert flash_ws.kernel_constexprs(cfg, 128, True, fp8=True)["EXP_POLY"] is True
    assert flash_ws.kernel_constexprs({**cfg, "EXP_POLY": 1}, 128, True)["EXP_POLY"] is False  # bf16: never


def test_fp8_sum_mma_is_on_over_the_wide_d128_tiles_only():
    """P's row sums by a matmul beside P V (SUM_MMA) where it was measured faster: FP8 at d = 128 over the wide
    key tiles (keys a multiple of 256, and from 4096 of them under a causal mask: 0.93x the time without a mask on
    an H200); not over the narrow tiles (keys not a multiple of 256, or fewer causal ones), not at d = 256, not in
    bf16. The kernel gets it only in FP8 mode, and its ones tile (8 x BLOCK_N e4m3) counts in the shared memory."""
    on = [
        (d, c, n_k)
        for d in (128, 256)
        for c in (False, True)
        for n_k in (2048, 4096, 4096 + 128)
        if flash_ws.default_config(d, c, fp8=True, n_k=n_k).get("SUM_MMA")
    ]
    assert on == [(128, False, 2048), (128, False, 4096), (128, True, 4096)]
    assert not any(
        flash_ws.default_config(d, c, n_k=4096).get("SUM_MMA") for d in (64, 128, 256) for c in (False, True)
    )
    cfg = flash_ws.default_config(128, False, fp8=True, n_k=4096)
    assert flash_ws.kernel_constexprs(cfg, 128, False, fp8=True)["SUM_MMA"] is True
    assert flash_ws.kernel_constexprs(cfg, 128, False)["SUM_MMA"] is False  # bf16: never
    off = {**cfg, "SUM_MMA": 0}
    assert flash_ws.smem_bytes(cfg, 128, fp8=True) == flash_ws.smem_bytes(off, 128, fp8=True) + 8 * 256
    assert flash_ws.smem_bytes(cfg, 128) == flash_ws.smem_bytes(off, 128)  # bf16 has no ones tile


def test_exp2_poly_constants_approximate_exp2_to_1e4():
    """flash_ws_parts._exp2_poly's arithmetic in torch, with its constants: 2^x to a relative 1e-4 (e4m3 P keeps
    2^-4) from the clamp up to P's largest exponent, and a masked score (-inf) at most the clamp's 2^-126, which
    e4m3's cast of P flushes to 0."""
    c = [getattr(flash_ws_parts, f"EXP2_C{i}").value for i in range(4)]
    rounder = flash_ws_parts.ROUNDER.value
    x = torch.cat([torch.linspace(-125.0, 8.5, 200_001), torch.tensor([float("-inf"), -300.0])])
    xc = torch.clamp(x, min=-126.0)
    r = xc + rounder
    f = xc - (r - rounder)
    p = ((c[3] * f + c[2]) * f + c[1]) * f + c[0]
    y = (p.view(torch.int32) + (r.view(torch.int32) << 23)).view(torch.float32)
    ref = torch.exp2(x[:-2].double())
    assert ((y[:-2].double() - ref) / ref).abs().max() < 1e-4
    assert torch.all((y[-2:] > 0) & (y[-2:] <= 2.0**-126))
    assert torch.all(y[-2:].to(torch.float8_e4m3fn).float() == 0)


def test_default_configs_report_their_tiles_to_the_byte_model():
    """A sweep row's kernel_config is the config flash_ws reports: it names BLOCK_M and BLOCK_N, which the byte
    model reads (io_model.Blocks), and it passes check_config so that it can be forced back."""
    from flashbench.models.io_model import Blocks

    for (d, causal), cfg in flash_ws.DEFAULT_CONFIG.items():
        assert Blocks.from_config(cfg) == Blocks(fwd_m=cfg["BLOCK_M"], fwd_n=64 if d == 256 else 128), (
            d,
            causal,
        )
        assert flash_ws.check_config(dict(cfg)) == cfg
        assert flash_ws.smem_bytes(cfg, d) <= flash_ws.SMEM_LIMIT, (d, causal)


@pytest.mark.skipif(HOPPER, reason="checks the refusal off Hopper")
def test_forcing_gluon_off_hopper_is_a_clear_refusal():
    q = torch.randn(
        1, 2, 256, 128, dtype=torch.float16, device="cuda" if torch.cuda.is_available() else "cpu"
    )
    with pytest.raises(KernelUnsupported, match="flash_attn: flash_ws forward: needs a Hopper GPU"):
        flash_attn(q, q, q, config={"kernel": "gluon-ws"})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
def test_short_causal_stays_on_the_tl_kernel():
    """d = 128 causal: Gluon from N = 1024 (flash_ws.GLUON_MIN_SEQ), its tiles list-scheduled over persistent
    programs (LPT); shorter causal problems stay on the tl kernel; without a mask Gluon at any length."""
    q = torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16)
    flash_attn(q, q, q, causal=True)
    assert "kernel" not in last_config()
    flash_attn(q, q, q, causal=False)
    cfg = last_config()
    assert cfg["kernel"] == "gluon-ws" and cfg["PERSISTENT"] == 1 and cfg["STAGES"] == 2
    q = torch.randn(1, 2, 1024, 128, device="cuda", dtype=torch.bfloat16)
    flash_attn(q, q, q, causal=True)
    cfg = last_config()
    assert cfg["kernel"] == "gluon-ws" and cfg["PERSISTENT"] == 1 and cfg["LPT"] == 1
    assert cfg["SCHED_HEADS"] == 4  # flash_ws.lpt_heads: two heads fill no wider group


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
def test_d64_dispatch_follows_the_measured_thresholds():
    """d = 64: Gluon (192-row tiles) from N = 1024, causal or not (flash_ws.GLUON_MIN_SEQ)."""
    for n, causal, gluon in [
        (512, False, False),
        (512, True, False),
        (1024, False, True),
        (1024, True, True),
        (2048, True, True),
    ]:
        q = torch.randn(1, 2, n, 64, device="cuda", dtype=torch.bfloat16)
        flash_attn(q, q, q, causal=causal)
        cfg = last_config()
        assert (cfg.get("kernel") == "gluon-ws") == gluon, (n, causal, cfg)
        if gluon:  # without a mask 12 tiles on 12 programs: round-robin (list_schedule_pays)
            assert cfg["BLOCK_M"] == 192 and cfg["PERSISTENT"] == 1 and cfg.get("LPT", 0) == int(causal)
            flash_attn(
                q, q, q, causal=causal, config=cfg
            )  # the reported config forced back runs the same walk
            assert last_config() == cfg
    # 512 heads of N = 1024 (16k tokens): the part-empty first tiles make the list schedule pay
    q = torch.randn(16, 32, 1024, 64, device="cuda", dtype=torch.bfloat16)
    out = flash_attn(q, q, q)
    cfg = last_config()
    assert cfg["LPT"] == 1 and cfg["LPT_CHAIN"] == 2 and cfg["SCHED_HEADS"] == 4, cfg
    flash_attn(q, q, q, config=cfg)
    assert last_config() == cfg
    ref = torch.nn.functional.scaled_dot_product_attention(*(q[:2].double(),) * 3)  # two of the 16 sequences
    assert rel(out[:2], ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_d256_dispatch_follows_the_thresholds(causal):
    """d = 256: Gluon with 64-key tiles from flash_ws.GLUON_MIN_SEQ's length, the tl kernel below it."""
    n = flash_ws.GLUON_MIN_SEQ[(256, causal)]
    for length, gluon in ((n // 2, False), (n, True)):
        q = torch.randn(1, 2, length, 256, device="cuda", dtype=torch.bfloat16)
        flash_attn(q, q, q, causal=causal)
        cfg = last_config()
        assert (cfg.get("kernel") == "gluon-ws") == gluon, (length, causal, cfg)
        if gluon:
            assert cfg["BLOCK_N"] == 64 and cfg == {**flash_ws.default_config(256, causal), **cfg}


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    ("shape", "programs"),
    [
        (D128, 3),
        (D128, 0),
        ((1, 8, 2, 1024, 1024, 128), 5),
        ((2, 4, 1, 384, 640, 128), 7),
        ((1, 2, 2, 128, 128, 128), 0),
        ((16, 16, 16, 1024, 1024, 128), 0),
        ((2, 4, 2, 1024, 1024, 64), 5),
    ],
    ids=["d128-p3", "d128-tile-each", "gqa4-p5", "nk>nq-mqa-p7", "one-block", "every-sm", "d64-128-rows-p5"],
)
@smoke(lambda dtype, shape, programs, causal: dtype == torch.bfloat16)
def test_lead_s_walk_matches_reference(shape, programs, dtype, causal):
    """LEAD_S: each tile's first S issued before the last tile's epilogue, its Q in the other of two buffers.
    With 3, 5 or 7 programs each walks several tiles (the two Q buffers and their barriers alternate, the turns
    and the ring carry the early S from tile to tile, programs end on different rounds; causal: list-scheduled,
    tiles of unequal length); with one program per SM each has one tile, or at 16 x 16 heads many; one key block a
    tile (the first S is the only one); d = 64 in 128-row tiles (its default takes 192). Each program's last tile
    issues a stand-in S on its last K, never released to the producer."""
    config = {"LEAD_S": 1, **({"PROGRAMS": programs} if programs else {})}
    if shape[-1] == 64:
        config["BLOCK_M"] = 128
    check_forward(shape, dtype, causal, config)


def test_lead_s_is_refused_where_its_walk_cannot_run(monkeypatch):
    """A forced LEAD_S runs any persistent walk, causal or not, round-robin or list-scheduled, over whole 128-row
    tiles of two warpgroups whose two Q buffers fit shared memory (not at d = 256), with no sliding window
    (ForwardPlan on the host, input_refusal stubbed); the plan reports it and compiles the kernel with it, and the
    packed documents' launch never takes it."""
    monkeypatch.setattr(flash_ws, "input_refusal", lambda *args, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)

    def plan(n, d, causal=False, window=None, dtype=torch.bfloat16, **config):
        x = torch.empty(2, 4, n, d, dtype=dtype)
        return flash_ws.ForwardPlan(x, x, x, causal, {"LEAD_S": 1, **config}, window)

    for causal in (False, True):  # FP8: slower without a mask, wrong under one (docs/kernels.md)
        with pytest.raises(ValueError, match="LEAD_S takes 16-bit inputs, not FP8"):
            plan(1024, 128, causal, dtype=torch.float8_e4m3fn)
    for n, d, causal, window, config, why in [
        (4096, 128, True, (2048, 0), {}, "no sliding window"),
        (1024, 128, False, None, {"PERSISTENT": 0}, "persistent"),
        (320, 128, False, None, {}, "whole tiles"),
        (1024, 64, True, None, {}, "BLOCK_M 128"),
        (1024, 128, True, None, {"PERSISTENT": 1, "LPT": 0}, "list-scheduled"),
        (1024, 256, False, None, {}, "LEAD_S=1 holds two Q buffers"),
    ]:
        with pytest.raises(ValueError, match=why):
            plan(n, d, causal, window, **config)
    for n, d, causal, config in [
        (1024, 128, False, {}),
        (1024, 128, True, {}),
        (1024, 128, False, {"LPT": 1}),
        (1024, 64, True, {"BLOCK_M": 128}),
        (1024, 64, False, {"BLOCK_M": 128, "LPT": 1, "SCHED_HEADS": 16}),
    ]:
        taken = plan(n, d, causal, **config)
        assert taken.config["LEAD_S"] == 1 and taken.call.constexprs["LEAD_S"] is True, (n, d, causal)
        assert all(taken.config[key] == val for key, val in config.items())
    assert plan(1024, 128, LEAD_S=0).call.constexprs["LEAD_S"] is False

    def default(n, d, causal=False, window=None, **config):  # no LEAD_S forced
        x = torch.empty(2, 4, n, d, dtype=torch.bfloat16)
        return flash_ws.ForwardPlan(x, x, x, causal, config, window).config.get("LEAD_S", 0)

    # the defaults take it where their walk can, and drop it where it cannot
    for (d, causal), cfg in flash_ws.DEFAULT_CONFIG.items():
        if cfg.get("LEAD_S"):
            assert default(1024, d, causal) == 1
            assert default(1024, d, causal, PERSISTENT=0, LPT=0) == 0
            if causal:
                assert default(4096, d, True, (2048, 0)) == 0
            assert default(384 + 64, d, causal) == 0
    assert default(1024, 256) == default(1024, 256, True) == default(1024, 64) == default(1024, 64, True) == 0
    cfg = {**flash_ws.default_config(128, False), "LEAD_S": 1}
    assert flash_ws.kernel_constexprs(cfg, 128, False, varlen=True)["LEAD_S"] is False


def test_q2_is_refused_where_its_walk_cannot_run(monkeypatch):
    """Two Q buffers without LEAD_S (Q2): a forced one runs a persistent walk whose output has buffers of its own,
    bf16 or FP8, with no sliding window and without LEAD_S, whose shared memory holds the second buffer (not d =
    256's; ForwardPlan on the host, input_refusal stubbed), one line where it cannot; d = 64's default takes it without a mask only, and drops it where its walk cannot."""
    monkeypatch.setattr(flash_ws, "input_refusal", lambda *args, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)

    def plan(n, d, causal=False, window=None, dtype=torch.bfloat16, **config):
        x = torch.empty(2, 4, n, d, dtype=dtype)
        return flash_ws.ForwardPlan(x, x, x, causal, config, window)

    for n, d, causal, window, config, why in [
        (4096, 128, True, (2048, 0), {"LEAD_S": 0}, "Q2 walks no sliding window"),
        (1024, 64, False, None, {"PERSISTENT": 0, "LPT": 0}, "Q2 needs a persistent walk"),
        (1024, 256, False, None, {"O_HALVES": 0}, "Q2 needs the output's own buffers"),
        (1024, 128, False, None, {}, "LEAD_S=0 for Q2"),
        (1024, 256, False, None, {}, "288 KiB of shared memory .* \\(Q2=1 holds two Q buffers\\)"),
    ]:
        with pytest.raises(ValueError, match=why) as err:
            plan(n, d, causal, window, Q2=1, **config)
        assert "\n" not in str(err.value)
    for n, d, causal, dtype, config in [
        (1024, 64, True, torch.bfloat16, {}),
        (1024, 128, False, torch.bfloat16, {"LEAD_S": 0}),
        (1024, 128, True, torch.bfloat16, {"LEAD_S": 0}),
        (2048, 128, True, torch.float8_e4m3fn, {}),
    ]:
        taken = plan(n, d, causal, dtype=dtype, Q2=1, **config)
        assert taken.config["Q2"] == 1 and taken.call.constexprs["Q2"] is True, (n, d, causal, dtype)
    # d = 64's default without a mask: the two buffers (24 KiB more shared memory) where its walk is persistent
    cfg = flash_ws.default_config(64, False)
    assert cfg["Q2"] == 1 and not flash_ws.default_config(64, True).get("Q2")
    assert flash_ws.smem_bytes(cfg, 64) == flash_ws.smem_bytes({**cfg, "Q2": 0}, 64) + 192 * 64 * 2
    for n in (1024, 2048, 16384):
        assert plan(n, 64).call.constexprs["Q2"] is True, n
    assert plan(1024, 64, True).call.constexprs["Q2"] is False
    off = plan(1024, 64, PERSISTENT=0, LPT=0)
    assert off.config["Q2"] == 0 and off.call.constexprs["Q2"] is False
    assert flash_ws.kernel_constexprs(cfg, 64, False, varlen=True)["Q2"] is False


def test_loop_first_is_refused_where_its_walk_cannot_run(monkeypatch):
    """A tile's first key block through the step loops (LOOP_FIRST): a forced one runs _consumer_tile's walks on
    16-bit or FP8 inputs, with no sliding window, without LEAD_S and without Q2 (ForwardPlan on the host,
    input_refusal stubbed), one line where it cannot (a default's LEAD_S or Q2 included); d = 64's causal default
    takes it, and drops it for a forced Q2 or a window."""
    monkeypatch.setattr(flash_ws, "input_refusal", lambda *args, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)

    def plan(n, d, causal=False, window=None, dtype=torch.bfloat16, **config):
        x = torch.empty(2, 4, n, d, dtype=dtype)
        return flash_ws.ForwardPlan(x, x, x, causal, config, window)

    for n, d, causal, window, dtype, config, why in [
        (4096, 64, True, (2048, 0), torch.bfloat16, {}, "LOOP_FIRST walks no sliding window"),
        (1024, 128, False, None, torch.bfloat16, {}, "LEAD_S=0 for LOOP_FIRST"),
        (1024, 64, False, None, torch.bfloat16, {}, "Q2=0 for LOOP_FIRST"),
        (1024, 64, True, None, torch.bfloat16, {"Q2": 1}, "Q2=0 for LOOP_FIRST"),
        (
            2048,
            128,
            True,
            None,
            torch.float8_e4m3fn,
            {},
            "Q2=0 for LOOP_FIRST",
        ),  # the narrow causal FP8 walk's Q2
    ]:
        with pytest.raises(ValueError, match=why) as err:
            plan(n, d, causal, window, dtype, LOOP_FIRST=1, **config)
        assert "\n" not in str(err.value)
    for n, d, causal, config in [
        (1024, 64, False, {"Q2": 0}),
        (1024, 128, True, {"LEAD_S": 0}),
        (1024, 256, False, {}),
        (2048, 256, True, {}),
    ]:
        taken = plan(n, d, causal, LOOP_FIRST=1, **config)
        assert taken.config["LOOP_FIRST"] == 1 and taken.call.constexprs["LOOP_FIRST"] is True, (n, d, causal)
    for n, d, causal in [
        (2048, 128, True),
        (16384, 128, False),
        (4096, 256, True),
    ]:  # narrow and wide key tiles
        taken = plan(n, d, causal, None, torch.float8_e4m3fn, LOOP_FIRST=1, Q2=0)
        assert taken.call.constexprs["LOOP_FIRST"] is True, (n, d, causal)
    assert flash_ws.default_config(64, True)["LOOP_FIRST"] == 1
    assert not any(cfg.get("LOOP_FIRST") for key, cfg in flash_ws.DEFAULT_CONFIG.items() if key != (64, True))
    for n in (1024, 2048, 16384):
        assert plan(n, 64, True).call.constexprs["LOOP_FIRST"] is True, n
    with_q2 = plan(1024, 64, True, Q2=1)  # a forced Q2 wins over the default's LOOP_FIRST
    assert with_q2.config["Q2"] == 1 and with_q2.config["LOOP_FIRST"] == 0
    assert plan(4096, 64, True, (2048, 0)).call.constexprs["LOOP_FIRST"] is False
    cfg = flash_ws.default_config(64, True)
    assert flash_ws.kernel_constexprs(cfg, 64, True, varlen=True)["LOOP_FIRST"] is False


def test_d256_tiles_fit_shared_memory_beside_half_width_output_buffers():
    """d = 256: Q [128, 256] (64 KiB) and two stages of 64-key K and V (128 KiB) leave room for the output's own
    buffers only at half width (O_HALVES, the default: two [64, 128] bf16, 32 KiB, 224 KiB in all); a third
    stage or 128-key tiles overflow, and without O_HALVES a persistent walk stores O through Q's buffers; FP8's
    halved tiles take two stages of 128-key tiles, or three of 64-key ones, beside its own bf16 O buffers. The
    packed-documents forward keeps full-width O through Q's buffers unless O_HALVES is forced."""
    need = 128 * 256 * 2 + 128 * 128 * 2 + 2 * 2 * 64 * 256 * 2
    for causal in (False, True):
        cfg = flash_ws.default_config(256, causal)
        assert cfg["BLOCK_N"] == 64 and cfg["BLOCK_M"] == 128 and cfg["STAGES"] == 2
        assert cfg["PERSISTENT"] == 1 and cfg["O_HALVES"] == 1 and cfg.get("LPT", 0) == int(causal)
        assert flash_ws.own_o(cfg, 256) and flash_ws.o_cols(cfg, 256) == 128
        assert flash_ws.kernel_constexprs(cfg, 256, causal)["SEP_O"] is True
        assert flash_ws.smem_bytes(cfg, 256) == need == 224 * 1024 <= flash_ws.SMEM_LIMIT
        for forced in ({"STAGES": 3}, {"BLOCK_N": 128}):
            assert flash_ws.smem_bytes({**cfg, **forced}, 256) > flash_ws.SMEM_LIMIT, forced
        whole = {**cfg, "O_HALVES": 0}
        assert not flash_ws.own_o(whole, 256) and flash_ws.o_cols(whole, 256) == 256
        assert flash_ws.smem_bytes(whole, 256) == 128 * 256 * 2 + 2 * 2 * 64 * 256 * 2
        assert "O_HALVES" not in varlen_ws.default_config(256, causal)
        assert flash_ws.smem_bytes({**varlen_ws.default_config(256, causal), "O_HALVES": 1}, 256) == need
    assert flash_ws.own_o(flash_ws.default_config(128, False), 128)
    assert flash_ws.o_cols(flash_ws.default_config(128, False), 128) == 128
    fp8 = flash_ws.default_config(256, False, fp8=True, n_k=4096)
    assert fp8["BLOCK_N"] == 128 and fp8["STAGES"] == 2 and flash_ws.own_o(fp8, 256, fp8=True)
    assert flash_ws.smem_bytes(fp8, 256, fp8=True) == 128 * 256 * 3 + 2 * 2 * 128 * 256 <= flash_ws.SMEM_LIMIT
    narrow = flash_ws.default_config(256, False, fp8=True, n_k=4096 + 64)
    assert narrow["BLOCK_N"] == 64 and narrow["STAGES"] == 3
    assert (
        flash_ws.smem_bytes(narrow, 256, fp8=True) == 128 * 256 * 3 + 2 * 3 * 64 * 256 <= flash_ws.SMEM_LIMIT
    )
    with pytest.raises(ValueError, match="O_HALVES=2 must be one of"):
        flash_ws.check_config({"O_HALVES": 2})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon forward needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "shape", [D256, (1, 8, 2, 1024, 1024, 256), (2, 4, 1, 320, 576, 256)], ids=["d256", "gqa4", "partial-mqa"]
)
@pytest.mark.parametrize(
    "config",
    [
        {"O_HALVES": 1, "PERSISTENT": 1},
        {"O_HALVES": 1, "PERSISTENT": 1, "PROGRAMS": 3},
        {"O_HALVES": 1, "PERSISTENT": 1, "PROGRAMS": 3, "SCHED_HEADS": 4, "LPT": 1},
        {"O_HALVES": 1, "PERSISTENT": 0},
    ],
    ids=["persistent", "persistent-p3", "persistent-lpt-p3", "per-tile"],
)
@smoke(lambda dtype, config, shape, **_: dtype == torch.bfloat16 and shape == D256 and "PROGRAMS" in config)
def test_d256_half_width_output_buffers_match_reference(shape, dtype, causal, config):
    """O_HALVES=1 at d = 256 (the default's output buffers): each warpgroup stores its [64, 256] output as two [64, 128] column halves through
    its own buffer; with 3 programs each walks several tiles, so a half's store overlaps the next tile's loads and
    the buffer is reused across tiles (a missed store_wait would corrupt a half)."""
    check_forward(shape, dtype, causal, config)


def test_d256_lpt_table_counts_64_key_blocks():
    """The causal schedule's work per tile is its 64-key blocks at d = 256: with 128-row tiles the last query
    block sees twice the blocks of 128-key tiles, and every tile is still handed out once."""
    num_m, n = 8, 1024
    cost = flash_ws.tile_costs(num_m, 128, 64, n, n, True, -1, 0)
    table = flash_ws.lpt_table(cost, 2, 1, 3, True, torch.device("cpu"))
    assert sorted(table[table < 2 * num_m].tolist()) == list(range(2 * num_m))
    loads = []
    for (
        row
    ) in table.tolist():  # one head per group, longest query block first: tile t is block num_m - 1 - t // 2
        loads.append(sum(2 * (num_m - t // 2) + flash_ws.TILE_COST for t in row if t < 2 * num_m))
    assert sum(loads) == 2 * sum(2 * m + flash_ws.TILE_COST for m in range(1, num_m + 1))
    assert max(loads) - min(loads) <= 2 * num_m + flash_ws.TILE_COST


def test_d256_supported_and_preferred_on_the_host(monkeypatch):
    """The host's choice at d = 256 with the device checks passed (input_refusal stubbed: these inputs are CPU
    tensors): supported checks seq_k against 64-key tiles and refuses 128-key ones; preferred takes the kernel
    from GLUON_MIN_SEQ's lengths (FP8 from GLUON_FP8_MIN_SEQ's), and FLASHBENCH_GLUON=0 turns it off."""
    seen = []

    def passed(tensors, causal, rows, block_n, head_dims, fp8=False):
        seen.append((block_n, head_dims))
        return None

    monkeypatch.setattr(flash_ws, "input_refusal", passed)
    monkeypatch.delenv("FLASHBENCH_GLUON", raising=False)
    monkeypatch.delenv("FLASHBENCH_TMA", raising=False)

    def q(n, dtype=torch.bfloat16):
        return torch.empty(1, 2, n, 256).to(dtype)

    x = q(1024)
    assert flash_ws.supported(x, x, x, False) is None and seen[-1] == (64, flash_ws.HEAD_DIMS)
    assert 256 in flash_ws.HEAD_DIMS
    assert "BLOCK_N 128 at head dim 256" in flash_ws.supported(x, x, x, False, block_n=128)
    for causal in (False, True):
        n = flash_ws.GLUON_MIN_SEQ[(256, causal)]
        assert flash_ws.preferred(q(n), q(n), q(n), causal), causal
        short = q(n // 2)
        assert not flash_ws.preferred(short, short, short, causal), causal
        n8 = flash_ws.GLUON_FP8_MIN_SEQ[(256, causal)]
        f8, short8 = q(n8, FP8), q(n8 // 2, FP8)
        assert flash_ws.preferred(f8, f8, f8, causal), causal
        assert not flash_ws.preferred(short8, short8, short8, causal), causal
    monkeypatch.setenv("FLASHBENCH_GLUON", "0")
    n = flash_ws.GLUON_MIN_SEQ[(256, False)]
    assert not flash_ws.preferred(q(n), q(n), q(n), False)


def test_the_plan_takes_lpt_heads_group_unless_one_is_forced(monkeypatch):
    """ForwardPlan on the host (input_refusal stubbed: CPU tensors; 132 SMs): a causal default takes lpt_heads'
    group for its shape and window (d = 256, 16 heads of 1024 rows: 16 per group; d = 128 at 8192 keys: 4); a
    forced SCHED_HEADS stays; a forced config without one gets the rule's group for the forced tiles; the plan's
    table is the balanced list schedule of that group."""
    monkeypatch.setattr(flash_ws, "input_refusal", lambda *args, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)

    def plan(b, h, n, d, config=None, window=None):
        x = torch.empty(b, h, n, d, dtype=torch.bfloat16)
        return flash_ws.ForwardPlan(x, x, x, True, config, window)

    def heads(b, h, n, d, cfg, win=-1):
        return flash_ws.lpt_heads(cfg, b * h, n, n, d, True, 132, win)

    d256 = plan(16, 8, 1024, 256)
    assert d256.config["SCHED_HEADS"] == heads(16, 8, 1024, 256, flash_ws.default_config(256, True)) == 16
    assert plan(2, 16, 8192, 128).config["SCHED_HEADS"] == 4
    assert plan(16, 8, 1024, 256, {"SCHED_HEADS": 1}).config["SCHED_HEADS"] == 1
    forced = {"BLOCK_M": 128, "STAGES": 2, "PERSISTENT": 1, "LPT": 1}
    d64, d128 = {**flash_ws.default_config(64, True), **forced}, flash_ws.default_config(128, True)
    assert plan(8, 32, 2048, 64, forced).config["SCHED_HEADS"] == heads(8, 32, 2048, 64, d64)
    windowed = plan(4, 16, 2048, 128, window=(128, 0)).config["SCHED_HEADS"]
    assert windowed == heads(4, 16, 2048, 128, d128, 128) != heads(4, 16, 2048, 128, d128)
    num_m, bh = 1024 // 128, 16 * 8
    cost = flash_ws.walk_costs(d256.config, 1024, 1024, True, -1)
    rows, _ = flash_ws._balanced_schedule(cost, bh, 16, 132, True)
    assert d256.table.tolist() == [list(r) + [num_m * bh] * (d256.width - len(r)) for r in rows]


def test_fast_mask_where_the_default_takes_it():
    """The causal diagonal by _diagonal_mask (FAST_MASK): the default with d = 64's three consumers, over packed
    documents and at 16-bit d = 128 (0.98-0.99x the time on an H200), not at d = 256 nor in FP8 (_key_order_mask
    took 1.01-1.03x at d = 128); forced either way, and the kernel gets it as a constexpr."""
    ws = flash_ws
    assert [ws.fast_mask(ws.default_config(d, True), d) for d in (64, 128, 256)] == [True, True, False]
    assert not ws.fast_mask(ws.default_config(128, True, fp8=True), 128, fp8=True)
    assert ws.fast_mask(ws.default_config(256, True), 256, varlen=True)
    assert not ws.fast_mask({**ws.default_config(64, True), "FAST_MASK": 0}, 64)
    assert ws.fast_mask({**ws.default_config(128, True, fp8=True), "FAST_MASK": 1}, 128, fp8=True)
    assert ws.kernel_constexprs(ws.default_config(128, True), 128, True)["FAST_MASK"] is True
    assert (
        ws.kernel_constexprs(ws.default_config(128, True, fp8=True), 128, True, fp8=True)["FAST_MASK"]
        is False
    )
    assert ws.check_config({"FAST_MASK": 1}) == {"FAST_MASK": 1}
    with pytest.raises(ValueError, match="FAST_MASK=2 must be one of"):
        ws.check_config({"FAST_MASK": 2})


def test_a_forced_tile_charge_reaches_the_plans_table(monkeypatch):
    """LPT_TILE: the key blocks the list schedule charges a tile beyond its own (TILE_COST, but FP8_TILE_COST in
    the causal FP8 walk over the head dim's tiles); a forced charge gives the plan the balanced schedule of the
    costs it makes (a heavier charge moves tiles between programs at FP8's causal d = 128, 8 x 16 heads of 2048
    rows), and a bad one is a one-line error."""
    monkeypatch.setattr(flash_ws, "input_refusal", lambda *args, **kw: None)
    monkeypatch.setattr(flash_ws, "_sm_count", lambda index: 132)
    x = torch.empty(8, 16, 2048, 128, dtype=torch.float8_e4m3fn)

    def table(config=None):
        plan = flash_ws.ForwardPlan(x, x, x, True, config)
        cost = flash_ws.walk_costs(plan.config, 2048, 2048, True, -1)
        rows, _ = flash_ws._balanced_schedule(cost, 8 * 16, plan.config["SCHED_HEADS"], 132, True)
        assert plan.table.tolist() == [list(r) + [16 * 128] * (plan.width - len(r)) for r in rows]
        return cost, plan.table.tolist()

    default, forced = table(), table({"LPT_TILE": 2})
    fp8_default = flash_ws.default_config(128, True, fp8=True, n_k=2048)
    assert fp8_default["LPT_TILE"] == flash_ws.FP8_TILE_COST[128] == 1.5
    assert [b - a for a, b in zip(default[0], forced[0], strict=True)] == [2 - 1.5] * 16
    assert default[1] != forced[1]
    wide = flash_ws.default_config(128, True, fp8=True, n_k=8192)  # the wide tiles keep TILE_COST
    assert "LPT_TILE" not in wide and "LPT_TILE" not in flash_ws.default_config(128, True)
    for tile in (-1, True, "1"):
        with pytest.raises(ValueError, match="LPT_TILE=.* must be a number >= 0"):
            flash_ws.check_config({"LPT_TILE": tile})

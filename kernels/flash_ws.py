"""FlashAttention-3-style forward for Hopper, written in Gluon: warp-specialized, consumer warpgroups in ping-pong.

Origin: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision" (2024),
sections 3.1-3.2: a producer warp streams K/V tiles with TMA into a ring of shared-memory stages, two or three
consumer warpgroups each own 64 rows of the query tile (BLOCK_M = 128 or 192, FA3's tiles for d = 128 and 64), and
  - inter-warpgroup ping-pong: a consumer issues its matmuls only on its turn (a ring of mbarriers, one per
    warpgroup), so one warpgroup's softmax runs while another's matmuls keep the tensor cores busy;
  - intra-warpgroup overlap: in iteration j a consumer issues S_j = Q K_j^T and then P_{j-1} V_{j-1}, and runs
    the softmax of S_j while P_{j-1} V_{j-1} is still in flight (ptxas moves that wait up above the softmax;
    holding it below gained nothing: docs/kernels.md, measured and not adopted).
Triton 3.6 does not generate either schedule from a tl.dot loop, which is why this kernel spells them out with
Gluon's explicit layouts, barriers and warp_specialize (flash_ws_kernel.py): it keeps the tensor pipe busier
than the best tl tile (docs/kernels.md, the Gluon forward).

Same contract as flash_v2._attn_fwd: q [B, H, Nq, D], k/v [B, Hkv, Nk, D], O in q's dtype, LSE2 (base-2
log-sum-exp, fp32) per row, exp2 with the scale folded in, causal aligned bottom-right, GQA by h // (H // Hkv).

Query tiles are aligned to the end of the sequence: when BLOCK_M does not divide Nq, the first tile starts
before row 0 and its warpgroups that own no row only keep the barrier protocol (no math, no store).
PERSISTENT=1 launches one program per SM; each walks tiles t = pid, pid + programs, ... (in flash_ws_parts.tile's order), and
the K/V ring, the turns and the Q barriers keep counting across its tiles (`it`: key blocks so far, `tc`: tiles
so far). The output then has its own shared-memory buffers, so the next tile's Q can load during this tile's
epilogue (own_o; not at d = 256, whose Q and two K/V stages fill shared memory, unless O_HALVES=1: buffers of half
the head dim's columns, each warpgroup's [64, D] output stored as two column halves one after the other). LPT=1
walks a table built on the host (lpt_table): the tiles in the same order, each handed to the program with the
least work so far, as a dynamic scheduler would, then traded between the most and the least loaded programs until
no trade evens them further, so the programs end together: under a causal mask (the longest tiles go first),
and at d = 64 without one where that beats round-robin (list_schedule_pays): a 192-row tile that starts before
row 0 leaves one or two of its warpgroups idle and costs less (LPT_CHAIN, tile_blocks_cost).
Elsewhere without a mask the tiles are equal and the walk is round-robin. At d = 128 (LEAD_S), causal or not, each
tile's first S = Q K^T is issued right behind the last tile's final P V, and the last tile's epilogue runs under
it, the next tile's Q in a second Q buffer (flash_ws_kernel._consumer_lead).

Scope (`supported` says why not, and flash_v2 serves the rest): CUDA capability 9.x, fp16/bf16, D in {64, 128,
256}, contiguous inputs, Nq % 64 == 0 and Nk % BLOCK_N == 0 (BLOCK_N: 128 keys per K/V tile, 64 at d = 256; the
2-D descriptors span all heads, so a partial 64-row slice would read or write the next head's rows), and for
causal Nk >= Nq (every row sees a key).
FP8 (e4m3 q, k, v with descales [B, Hkv], bf16 O: flash_fp8.py's contract and numerics, which routes here): the
same schedule on e4m3 tiles; V is read as V^T [B, Hkv, D, Nk] (flash_fp8.value_layout's storage: keys contiguous,
the K-major B operand of e4m3 wgmma) in [D, BLOCK_N] tiles; O gets its own bf16 buffers; no windows.
Packed documents (flash_attn_varlen's forward): varlen_ws.py launches this kernel in its VARLEN mode.
Sliding windows: those whose right limit is 0 (causal with window (left, -1) or (left, 0), or window (left, 0)):
each tile's first key block is bounded by its first row's window (blocks before it are never loaded) and the
blocks that cut the window's left edge are masked, as the causal diagonal is; other windows are the tl kernel's.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import os
from typing import Any

import torch

from .common import LOG2E, cdiv
from .descriptors import capability_major
from .launch import KernelCall, env_key

try:  # Gluon is experimental and its API moves between Triton releases; written against Triton 3.6.
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .flash_ws_kernel import _attn_fwd_ws

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

ROWS = 64  # query rows per consumer warpgroup
# Registers per thread (setmaxnreg) of the consumer warpgroups and of the producer, by consumer count: FA3's
# splits (240 / 240 / 24 with two consumers, 160 x 3 / 32 with three) fill the 64K-register file.
CONSUMER_REGS = {2: 240, 3: 160}
PRODUCER_REGS = {2: 24, 3: 32}
# Keys per K/V tile by head dim. 64-key tiles were 5-16% slower at d = 128 (docs/kernels.md). d = 256 takes them:
# O [64, 256] fp32 is 128 of a consumer's 240 registers, and 128-key tiles need 256 KiB of shared memory for Q and
# two K/V stages; Gluon tensors are powers of two, so FA3's 80-key tiles are out. FP8 takes wider ones below.
BLOCK_N = {64: 128, 128: 128, 256: 64}
HEAD_DIMS = tuple(BLOCK_N)
# FP8 key tiles twice as wide, by (head dim, causal), where N_K is a multiple of them and at least
# FP8_WIDE_MIN_KEYS: e4m3 K and V take half the bytes, so two stages of them fit shared memory, and the step fits the
# registers by its order (flash_ws_kernel._consumer_step: P_EARLY at d = 256, PV_FIRST at d = 128). H200, GPU time:
# 0.95-0.98x the 128-key walk's time at d = 128 without a mask from N = 2048 (0.99-1.00x at 1024), 0.90-0.98x the
# 64-key one at d = 256 from N = 1024 (before P_EARLY, which took 0.93-0.99x the time of that). d = 128 causal
# (with SUM_MMA and LOOP_FIRST, without EXP_POLY, which spills there) wastes more of the diagonal: 1.13x / 1.05x the
# 128-key walk's time at N = 1024 / 2048, 0.96-0.97x at 4096 (docs/kernels.md, the FP8 forward).
FP8_WIDE_N = {(128, False): 256, (128, True): 256, (256, False): 128, (256, True): 128}
FP8_WIDE_MIN_KEYS = {(128, True): 4096}
# Default config per (head dim, causal), the measured winners (docs/kernels.md, the Gluon forward): d = 64 takes
# FA3's 192-row tiles (three consumers); d = 64 and 128 are persistent when not causal (the next tile's loads run
# under this one's epilogue: 1.14x one program per tile at d = 128, N = 1024); causal tiles are unequal, so they
# are persistent and list-scheduled (LPT) over two stages. So are d = 64's without a mask where the list schedule
# beats round-robin (ForwardPlan, list_schedule_pays), a key block charged as two of a tile's three warpgroups
# however few run it (LPT_CHAIN 2): where 192 does not divide N the first tile of each head has idle warpgroups
# (H200: 0.92x the round-robin walk's time at N = 1024, 0.99-1.00x at 2048-4096), and they load the next tile's Q
# into a second buffer while this tile runs (Q2, H200: 0.98x the time at N = 1024-2048; causal 1.01x at 1024,
# so not there). d = 64's causal tiles run their first key block through the step loops behind a P V of zeros
# (LOOP_FIRST, H200: 0.96x the time at N = 1024-4096; without a mask 1.01x at 1024, so not there). d = 256: Q [128, 256] and two K/V stages take 192 KiB of
# shared memory: no third stage, and the output's own buffers are half-width (O_HALVES: 224 KiB in all), so the
# next tile's loads run under this one's epilogue there too; persistent when not causal (H100: 1.02-1.03x the
# persistent walk storing O through Q's buffers at N = 2048-4096, 1.04x one program per tile at 2048; causal
# 1.01-1.04x; docs/kernels.md). d = 128 issues each tile's first S before the last tile's epilogue (LEAD_S, H200:
# 0.95-0.97x the time without a mask at N = 1024-16384, 0.98x causal at 1024-4096; ForwardPlan drops it where the
# tiles are not whole).
_LPT = {"PERSISTENT": 1, "STAGES": 2, "LPT": 1, "SCHED_HEADS": 4}
# lpt_heads, 16-bit: of the groups of 4, 8 and 16 heads whose K and V take at most LPT_GROUP_BYTES of L2, the
# smallest whose walk the schedule model (walk_load: its most loaded program) charges at most LPT_SLACK times the
# best one's; but one head where 4 heads' K and V take more than LPT_ONE_HEAD_BYTES and the model charges one head's
# walk at most LPT_ONE_HEAD_SLACK times the best group's (the model counts no L2 traffic, which one head's walk keeps
# least), or where no group fits. A causal walk (no window) over at most LPT_EIGHT_KEYS keys takes 8 heads where
# the model charges them within LPT_SLACK: the model sees the groups' balanced tables within 0.5% there, and 8
# heads took 0.98x the time of 4 at d = 64, N = 1024, within 1% either way elsewhere (d = 64 at 1536 and 2048,
# d = 128 at 1024, 1536 and 2048; H200). FP8: 8 heads while their K and V fit LPT_ONE_HEAD_BYTES, else 4, and 4
# with two Q buffers (FP8_Q2_DIMS). Measured in docs/kernels.md, "Persistent LPT" and the FP8 forward.
LPT_GROUP_BYTES = 32 * 2**20
LPT_ONE_HEAD_BYTES = 8 * 2**20
LPT_SLACK = 1.04
LPT_ONE_HEAD_SLACK = 1.01
LPT_EIGHT_KEYS = 2048


def _base(head_dim: int) -> dict[str, int]:
    """The keys every config reports (the byte model reads the tiles), at this head dim."""
    return {"BLOCK_N": BLOCK_N[head_dim], "SCHED_HEADS": 1}


DEFAULT_CONFIG = {
    (64, False): {**_base(64), "BLOCK_M": 192, **_LPT, "LPT_CHAIN": 2, "Q2": 1},
    (64, True): {**_base(64), "BLOCK_M": 192, **_LPT, "LOOP_FIRST": 1},
    (128, False): {**_base(128), "BLOCK_M": 128, "STAGES": 2, "PERSISTENT": 1, "LEAD_S": 1},
    (128, True): {**_base(128), "BLOCK_M": 128, **_LPT, "LEAD_S": 1},
    (256, False): {**_base(256), "BLOCK_M": 128, "STAGES": 2, "PERSISTENT": 1, "O_HALVES": 1},
    (256, True): {**_base(256), "BLOCK_M": 128, **_LPT, "O_HALVES": 1},
}
# FP8: 128-row tiles (192 rows spill), three stages over the head dim's K/V tiles or two over FP8_WIDE_N's
# (default_config adds them), a persistent walk, list-scheduled under a causal mask (docs/kernels.md, the FP8
# forward).
FP8_CONFIG = {"BLOCK_M": 128, "STAGES": 3, "PERSISTENT": 1}
# Head dims whose causal FP8 walk over the head dim's key tiles runs an eighth of its exp2s on the FMA pipe
# (EXP_POLY): d = 128 took 0.971-0.989x the time from N = 2048, d = 256 1.012-1.035x (docs/kernels.md, the FP8
# forward). Over the wide tiles it spills (26 stores at d = 128 causal) or lost (1.03x at d = 128 without a mask).
FP8_EXP_POLY_DIMS = (128,)
# Head dims whose FP8 walk over the wide key tiles sums P's rows by a matmul beside P V (SUM_MMA): d = 128 took
# 0.91-0.95x the time without a mask at N = 2048-16384 (docs/kernels.md, the FP8 forward).
FP8_SUM_MMA_DIMS = (128,)
# Head dims whose causal FP8 walk over the wide key tiles runs each tile's first key block through the step loops
# (LOOP_FIRST, which drops the build's first-block softmax copies and its spill): d = 128 took 0.958-0.966x the time
# at N = 8192-16384. Over the narrow tiles it took 1.005-1.008x, without a mask 1.003-1.030x, at d = 256
# 0.988-1.007x (docs/kernels.md, the FP8 forward).
FP8_LOOP_FIRST_DIMS = (128,)
# Head dims whose causal FP8 walk over the head dim's key tiles loads the next tile's Q into a second buffer while
# this tile runs (Q2), in groups of 4 heads (lpt_heads): d = 128 took 0.972-0.989x the time at N = 1024-3072, Q2 in
# the 8 heads of the walk before 0.979-0.999x; without a mask 0.98-1.01x (docs/kernels.md, the FP8 forward).
FP8_Q2_DIMS = (128,)
# What the list schedule charges a tile beyond its key blocks (LPT_TILE) in the causal FP8 walk over the head dim's
# key tiles, by head dim: its tile's own code (the first block, the last P V and the epilogue) is a fifth of the
# walk at d = 128, N = 2048, where TILE_COST's half block piled short tiles on some programs. 1.5 blocks took
# 0.978-0.985x the time at N = 1024, 0.988-0.997x at 1536, 0.997-1.007x at 2048-3072 (docs/kernels.md, the FP8
# forward).
FP8_TILE_COST = {128: 1.5}

# Where flash_attn's forward takes this kernel by default: the shortest sequence per (head dim, causal). Shorter
# problems stay on the tl kernel, which was as fast or faster there (docs/kernels.md, the Gluon forward).
GLUON_MIN_SEQ = {
    (64, False): 1024,
    (64, True): 1024,
    (128, False): 0,
    (128, True): 1024,
    (256, False): 1024,
    (256, True): 1024,
}
# The same for FP8 (flash_fp8's forward) against the tl FP8 kernel's best tile; d = 64 stays on the tl kernel
# (docs/kernels.md, the FP8 forward). d = 128 causal and d = 256 from the shortest lengths measured.
GLUON_FP8_MIN_SEQ = {(128, False): 0, (128, True): 1024, (256, False): 1024, (256, True): 1024}
FP8_DTYPES = (torch.float8_e4m3fn,)
# A forced config's keys and their values (None: any). PERSISTENT: one program per SM (or PROGRAMS of them, for
# tests) walks its share of the tiles, and the output gets its own shared-memory buffers (own_o) so the next
# tile's loads overlap this tile's epilogue. LPT: the persistent walk is list-scheduled (lpt_table); a causal one must
# be (round-robin left causal programs unbalanced). SCHED_HEADS: tiles are walked in groups of this many heads
# (flash_ws_parts.tile; lpt_heads picks it for LPT). O_HALVES: the output gets its own buffers of half the head
# dim's width, [64, D / 2] per warpgroup, whatever the walk: each warpgroup stores its [64, D] output as two column
# halves through its buffer, the second once the first has left it (o_cols). This fits own_o at d = 256: Q, the
# two K/V stages and two [64, 128] O buffers take 224 KiB (d = 256's default). EXP_POLY (FP8 only): an eighth of
# each step's exp2s on the FMA pipe (flash_ws_parts._exp2_eighth). LPT_CHAIN (with LPT, a number >= 0): the
# list schedule charges a key block max(a, LPT_CHAIN) / W for the a of a tile's W warpgroups that run it
# (tile_blocks_cost); 0, the default but at d = 64 without a mask, charges every block in full. LPT_TILE (with
# LPT, a number >= 0): the key blocks it charges a tile beyond its own (TILE_COST; FP8_TILE_COST where the default
# takes it). LEAD_S: a
# persistent walk over whole 128-row tiles issues each tile's first S = Q K^T before the last tile's epilogue,
# which then runs under it (flash_ws_kernel._consumer_lead; lead_s_refusal says where it cannot); it holds two Q
# buffers, tile t's Q in buffer t % 2, which the producer loads while tile t - 1 runs. Q2: those two Q buffers
# without the early S (q2_refusal says where they cannot be). LOOP_FIRST: a tile's first key block goes through
# the step loops, its step's P V one of zeros on its own V, so the consumer has no separate first-block softmax
# (flash_ws_kernel._consumer_tile; loop_first_refusal says where it cannot). SUM_MMA (FP8
# only): P's row sums (the softmax's l) by P @ ones [BLOCK_N, 8] beside each P V, not by the softmax's adds; the
# ones take 8 x BLOCK_N bytes of shared memory (flash_ws_kernel._pv_done). FAST_MASK: the causal diagonal masked
# with each score's key split into a register constant and a lane part folded into the row's limit
# (flash_ws_parts._diagonal_mask, _key_order_mask), not computed per score; fast_mask says where the default has it.
CONFIG_KEYS = {
    "kernel": None,
    "BLOCK_M": (128, 192),
    "BLOCK_N": (64, 128, 256),
    "STAGES": (2, 3, 4),
    "PERSISTENT": (0, 1),
    "SCHED_HEADS": (1, 4, 8, 16),
    "PROGRAMS": None,
    "LPT": (0, 1),
    "O_HALVES": (0, 1),
    "EXP_POLY": (0, 1),
    "LPT_CHAIN": None,
    "LPT_TILE": None,
    "LEAD_S": (0, 1),
    "SUM_MMA": (0, 1),
    "Q2": (0, 1),
    "LOOP_FIRST": (0, 1),
    "FAST_MASK": (0, 1),
}
# A sliding window narrower than this stays on the tl kernel: its tiles see at most 8 key blocks of 128, where
# the tl kernel led on the causal diagonal (docs/kernels.md, sliding windows).
GLUON_MIN_WINDOW = 1024
SMEM_LIMIT = 232448 - 1024  # an H100's opt-in shared memory per block, less the barriers


def enabled() -> bool:
    """False when FLASHBENCH_GLUON=0 or FLASHBENCH_TMA=0 (this kernel moves every tile with TMA)."""
    switches = env_key()
    on = _ENABLED.get(switches)
    if on is None:
        off = ("0", "false", "no", "off")
        on = _ENABLED[switches] = not any(
            os.environ.get(var, "1").strip().lower() in off for var in ("FLASHBENCH_GLUON", "FLASHBENCH_TMA")
        )
    return on


# enabled() by the environment's switches (launch.env_key): 0.4 us a call where reading and parsing the two
# variables takes 2.7 us, on the CPU machine.
_ENABLED: dict[tuple[Any, ...], bool] = {}


def default_config(head_dim: int, causal: bool, fp8: bool = False, n_k: int = 0) -> dict[str, Any]:
    """The config this kernel runs at a head dim (others: d = 128's) without a forced one, over n_k keys (FP8's
    wide key tiles need a multiple of theirs and, where FP8_WIDE_MIN_KEYS names one, that many; 0 is a multiple)."""
    head_dim = head_dim if head_dim in HEAD_DIMS else 128
    if fp8:
        cfg: dict[str, Any] = {**_base(head_dim), **FP8_CONFIG}
        shape = (head_dim, bool(causal))
        wide = FP8_WIDE_N.get(shape)
        if wide and n_k % wide == 0 and n_k >= FP8_WIDE_MIN_KEYS.get(shape, 0):
            cfg.update(BLOCK_N=wide, STAGES=2)
            if head_dim in FP8_SUM_MMA_DIMS:
                cfg["SUM_MMA"] = 1
            if causal and head_dim in FP8_LOOP_FIRST_DIMS:
                cfg["LOOP_FIRST"] = 1
        if causal:
            cfg["LPT"] = 1
            narrow = cfg["BLOCK_N"] == BLOCK_N[head_dim]
            if narrow and head_dim in FP8_EXP_POLY_DIMS:
                cfg["EXP_POLY"] = 1
            if narrow and head_dim in FP8_Q2_DIMS:
                cfg["Q2"] = 1
            if narrow and head_dim in FP8_TILE_COST:
                cfg["LPT_TILE"] = FP8_TILE_COST[head_dim]
        return cfg
    return dict(DEFAULT_CONFIG[(head_dim, bool(causal))])


def lpt_heads(
    cfg: dict[str, Any],
    bh: int,
    n_q: int,
    n_k: int,
    head_dim: int,
    causal: bool,
    programs: int,
    win: int = -1,
    fp8: bool = False,
) -> int:
    """The list-scheduled walk's group of heads (SCHED_HEADS) when none is forced, by the rule above LPT_SLACK:
    bh heads of n_q queries over n_k keys at head_dim in config cfg's tiles, on `programs` programs; win a window's
    left limit, -1 for none."""
    kv_bytes = 2 * n_k * head_dim * (1 if fp8 else 2)  # one head's K and V
    if fp8:
        return 8 if 8 * kv_bytes <= LPT_ONE_HEAD_BYTES and not cfg.get("Q2") else 4
    groups = [h for h in (4, 8, 16) if h * kv_bytes <= LPT_GROUP_BYTES]
    if not groups:
        return 1
    cost = walk_costs(cfg, n_q, n_k, causal, win)
    loads = [_list_schedule(cost, bh, h, programs, causal)[1] for h in groups]
    least = min(loads)
    if 4 * kv_bytes > LPT_ONE_HEAD_BYTES:
        if _list_schedule(cost, bh, 1, programs, causal)[1] <= LPT_ONE_HEAD_SLACK * least:
            return 1
    within = [h for h, load in zip(groups, loads, strict=True) if load <= LPT_SLACK * least]
    if causal and win < 0 and n_k <= LPT_EIGHT_KEYS and bh > 4 and 8 in within:
        return 8
    return within[0]


def preferred(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: tuple[int, int] | None = None
) -> bool:
    """Whether flash_attn's forward should take this kernel for these inputs (no forced config)."""
    D = q.shape[-1]
    masked = bool(causal) or window is not None
    fp8 = q.dtype in FP8_DTYPES
    min_seq = (GLUON_FP8_MIN_SEQ if fp8 else GLUON_MIN_SEQ).get((D, masked))
    if min_seq is None or q.shape[2] < min_seq or not enabled():
        return False
    if window is not None and window[0] < GLUON_MIN_WINDOW:
        return False
    cfg = default_config(D, masked, fp8, k.shape[2])
    return supported(q, k, v, causal, cfg["BLOCK_M"], window, cfg["BLOCK_N"]) is None


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """A forced config ({"kernel": "gluon-ws", ...}) with known keys and values, else ValueError."""
    for key, val in config.items():
        if key not in CONFIG_KEYS:
            raise ValueError(f"gluon-ws config: unknown key {key!r} (allowed: {sorted(CONFIG_KEYS)})")
        allowed = CONFIG_KEYS[key]
        if allowed is not None and val not in allowed:
            raise ValueError(f"gluon-ws config: {key}={val!r} must be one of {list(allowed)}")
    for key, meaning in (
        ("LPT_CHAIN", "0: the tile's warpgroups"),
        ("LPT_TILE", "key blocks beyond a tile's own"),
    ):
        val = config.get(key, 0)
        if not isinstance(val, int | float) or isinstance(val, bool) or val < 0:
            raise ValueError(f"gluon-ws config: {key}={val!r} must be a number >= 0 ({meaning})")
    programs = config.get("PROGRAMS", 0)
    if not isinstance(programs, int) or isinstance(programs, bool) or programs < 0:
        raise ValueError(f"gluon-ws config: PROGRAMS={programs!r} must be a count >= 0 (0: one per SM)")
    return config


def lead_s_refusal(cfg: dict[str, Any], n_q: int, window: bool = False, fp8: bool = False) -> str | None:
    """Why config cfg cannot run LEAD_S over n_q query rows (one line), else None: its walk must be persistent
    (round-robin or list-scheduled, causal or not), with no sliding window, over whole tiles of two warpgroups (no
    idle one; flash_ws_kernel._lead_tile), on 16-bit inputs: in FP8 it was slower without a mask and wrong under a
    causal mask (docs/kernels.md, measured and not adopted). (Its two Q buffers and the output's own, which a
    persistent walk has, must fit shared memory: smem_bytes.)"""
    if fp8:
        return "LEAD_S takes 16-bit inputs, not FP8"
    if window:
        return "LEAD_S walks no sliding window"
    if not cfg.get("PERSISTENT"):
        return "LEAD_S needs a persistent walk (PERSISTENT=1)"
    if cfg["BLOCK_M"] != 2 * ROWS:
        return f"LEAD_S needs BLOCK_M {2 * ROWS} (two consumer warpgroups)"
    if n_q % cfg["BLOCK_M"]:
        return f"LEAD_S needs whole tiles: seq_q % {cfg['BLOCK_M']} == 0"
    return None


def q2_refusal(cfg: dict[str, Any], head_dim: int, window: bool = False, fp8: bool = False) -> str | None:
    """Why config cfg cannot take two Q buffers without LEAD_S (Q2; one line), else None: a persistent walk whose
    output has its own buffers (own_o: at d = 256 O_HALVES), with no sliding window (not measured), and not beside
    LEAD_S, which holds the two buffers itself."""
    if window:
        return "Q2 walks no sliding window"
    if not cfg.get("PERSISTENT"):
        return "Q2 needs a persistent walk (PERSISTENT=1)"
    if not own_o(cfg, head_dim, fp8):
        return "Q2 needs the output's own buffers (at d = 256 O_HALVES=1)"
    if cfg.get("LEAD_S"):
        return "Q2 is LEAD_S's two Q buffers without its early S: LEAD_S=0 for Q2"
    return None


def loop_first_refusal(cfg: dict[str, Any], window: bool = False) -> str | None:
    """Why config cfg cannot run LOOP_FIRST (one line), else None: the consumers of _consumer_tile (not LEAD_S's)
    with no sliding window (not built), and not beside Q2: forced together under a causal
    mask they gave wrong rows on an H200 (docs/kernels.md), so a default LOOP_FIRST gives way to a forced Q2."""
    if window:
        return "LOOP_FIRST walks no sliding window"
    if cfg.get("LEAD_S"):
        return "LOOP_FIRST runs the walk without LEAD_S's early S: LEAD_S=0 for LOOP_FIRST"
    if cfg.get("Q2"):
        return "LOOP_FIRST with Q2 gave wrong rows under a causal mask: Q2=0 for LOOP_FIRST"
    return None


def own_o(cfg: dict[str, Any], head_dim: int, fp8: bool = False) -> bool:
    """Whether the output gets shared-memory buffers of its own (else it is stored through Q's): FP8 (e4m3 Q, bf16
    O), O_HALVES, and persistent walks, so that the next tile's Q loads during this tile's epilogue; at d = 256 only
    with O_HALVES, since full-width O would take 64 KiB more beside Q's 64 and the two K/V stages' 128: without
    it the next Q waits for the output's store."""
    return fp8 or bool(cfg.get("O_HALVES")) or (bool(cfg.get("PERSISTENT")) and head_dim != 256)


def o_cols(cfg: dict[str, Any], head_dim: int) -> int:
    """The columns of the output's buffers and of its descriptor's box: half the head dim with O_HALVES."""
    return head_dim // 2 if cfg.get("O_HALVES") else head_dim


def smem_bytes(cfg: dict[str, Any], head_dim: int, fp8: bool = False) -> int:
    """Shared memory of a config: Q (two buffers with LEAD_S or Q2; and O, own_o: o_cols wide) slices of 64 rows,
    the K/V ring (BLOCK_N: the head dim's if the config names none), FP8's ones of SUM_MMA."""
    size = 1 if fp8 else 2  # bytes per element of Q, K and V; O is 2 bytes
    o_bytes = 2 * o_cols(cfg, head_dim) if own_o(cfg, head_dim, fp8) else 0
    q_bufs = 2 if cfg.get("LEAD_S") or cfg.get("Q2") else 1  # the next tile's Q beside this one's
    q_o = cfg["BLOCK_M"] * (q_bufs * head_dim * size + o_bytes)
    block_n = cfg.get("BLOCK_N", BLOCK_N[head_dim])
    ones = 8 * block_n if fp8 and cfg.get("SUM_MMA") else 0
    return q_o + 2 * cfg["STAGES"] * block_n * head_dim * size + ones


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def supported(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    block_m: int = 128,
    window: tuple[int, int] | None = None,
    block_n: int | None = None,
) -> str | None:
    """None if the Gluon forward can run these inputs with block_m x block_n tiles (None: the head dim's BLOCK_N),
    else why not (one line). FP8: v as flash_fp8.value_layout gives it, a [B, Hkv, Nk, D] view of V^T
    [B, Hkv, D, Nk] (contiguous)."""
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    fp8 = q.dtype in FP8_DTYPES
    if fp8 and window is not None:
        return "FP8 with a sliding window (flash_fp8's tl kernel has no windows either)"
    if window is not None and (window[1] != 0 or window[0] < 0):
        return f"sliding window {window}: only a right limit of 0 (flash_v2's tl kernel takes the others)"
    causal = bool(causal) or window is not None
    # FP8 reads V^T (flash_fp8.value_layout's storage)
    tensors = {"q": q, "k": k, "v^T" if fp8 else "v": v.transpose(-1, -2) if fp8 else v}
    D = q.shape[-1]
    block_n = block_n or BLOCK_N.get(D, 128)
    why = input_refusal(tensors, causal, ROWS, block_n, HEAD_DIMS, fp8)
    return why or tile_refusal(D, block_m, block_n, fp8)


def tile_refusal(head_dim: int, block_m: int, block_n: int, fp8: bool = False) -> str | None:
    """Why block_m x block_n tiles do not fit this kernel at a head dim (one line), else None."""
    if block_m == 192 and fp8:
        return "BLOCK_M 192 with FP8 (three consumer warpgroups spill registers)"
    if block_m == 192 and head_dim != 64:
        return "BLOCK_M 192 (three consumer warpgroups) only at head dim 64 (at 128 it spills and overflows smem)"
    if block_n == 256 and not (fp8 and head_dim == 128):
        return "BLOCK_N 256 only in FP8 at head dim 128 (elsewhere the scores and O spill)"
    if block_n == 128 and head_dim == 256 and not fp8:
        return "BLOCK_N 128 at head dim 256 in 16 bits (spills, or overflows smem)"
    return None


def input_refusal(
    tensors: dict[str, torch.Tensor],
    causal: bool,
    rows: int,
    block_n: int,
    head_dims: tuple[int, ...],
    fp8: bool = False,
) -> str | None:
    """What the Gluon kernels (this forward, backward_ws's dK/dV pass) refuse in their inputs, as one line, else
    None. tensors: by name, q and k first, as the kernel reads them; rows, block_n: what seq_q and seq_k must be
    multiples of; head_dims: the kernel's; fp8: e4m3 inputs are taken (this forward's FP8 mode)."""
    why = tensor_refusal(tensors, head_dims, fp8)
    if why is not None:
        return why
    q, k = tensors["q"], tensors["k"]
    nq, nk = q.shape[2], k.shape[2]
    if nq % rows or nk % block_n:
        return f"needs seq_q % {rows} == 0 and seq_k % {block_n} == 0"
    if causal and nk < nq:
        return "causal needs seq_k >= seq_q"
    if q.shape[0] * q.shape[1] * nq >= 2**31:
        return "too many rows for 32-bit descriptor coordinates"
    return None


def tensor_refusal(
    tensors: dict[str, torch.Tensor], head_dims: tuple[int, ...], fp8: bool = False
) -> str | None:
    """What the Gluon kernels refuse in their tensors whatever their shapes (input_refusal's arguments): not on
    a Hopper GPU, dtypes, head dim, contiguity, TMA's 16-byte aligned bases; None if nothing."""
    q = tensors["q"]
    if not q.is_cuda or capability_major(q.device.index) != 9:
        return "needs a Hopper GPU (capability 9.x)"
    dtypes = (torch.float16, torch.bfloat16, *(FP8_DTYPES if fp8 else ()))
    if q.dtype not in dtypes or any(t.dtype != q.dtype for t in tensors.values()):
        names = "fp16 or bf16 (or float8_e4m3fn)" if fp8 else "fp16 or bf16"
        return f"needs {names} {', '.join(tensors)} of one dtype, not {', '.join(str(t.dtype) for t in tensors.values())}"
    D = q.shape[-1]
    if D not in head_dims:
        return f"head dim {D} ({', '.join(map(str, head_dims))} only)"
    if not all(t.is_contiguous() for t in tensors.values()):
        return f"needs contiguous {', '.join(tensors)}"
    if any(t.data_ptr() % 16 for t in tensors.values()):  # TMA's rule for a descriptor's base
        return f"needs 16-byte aligned {', '.join(tensors)} (a view at an odd offset takes the tl kernel)"
    return None


_GL_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8e4nv"}


def _descriptor(t: torch.Tensor, block: list[int]) -> Any:
    """A 2-D TMA descriptor of t viewed as [-1, t.shape[-1]], its tile `block` in the default swizzled layout."""
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, _GL_DTYPES[t.dtype]))
    return TensorDescriptor.from_tensor(t.reshape(-1, t.shape[-1]), block, layout)


def _descriptors(q, k, v, o, block_n, o_width):
    """Q, K, V, O descriptors ([64, D] tiles of Q, [64, o_width] of O (o_cols), [BLOCK_N, D] of K and
    V). FP8: V^T's [D, BLOCK_N], and
    K as 5-D boxes [BLOCK_N / 16, 2, 4, 2, D] that load each K tile with its rows in flash_ws_parts.key_order
    (row 16R + 8g + 2t + e <- key 16R + 4t + 2g + e: strides of 16, 2, 4 and 1 keys); the swizzle works on
    shared-memory addresses, so the tile lands as a [BLOCK_N, D] one would."""
    D = q.shape[-1]
    if q.dtype not in FP8_DTYPES:
        return (
            *(_descriptor(t, [rows, D]) for t, rows in ((q, ROWS), (k, block_n), (v, block_n))),
            _descriptor(o, [ROWS, o_width]),
        )
    vd = _descriptor(v.transpose(-1, -2), [D, block_n])
    keys = k.reshape(-1, D)
    kd = TensorDescriptor(
        keys,
        [keys.shape[0] // 16, 2, 4, 2, D],
        [16 * D, 2 * D, 4 * D, D, 1],
        [block_n // 16, 2, 4, 2, D],
        gl.NVMMASharedLayout(swizzle_byte_width=min(D, 128), element_bitwidth=8, rank=5),  # a row: D bytes
    )
    return _descriptor(q, [ROWS, D]), kd, vd, _descriptor(o, [ROWS, o_width])


@functools.cache
def _no_table(device: torch.device) -> torch.Tensor:
    """The kernel's schedule-table argument where there is none (ROUNDS = 0): an empty int32 tensor, made once per
    device rather than on every call."""
    return torch.empty(0, dtype=torch.int32, device=device)


# The compile-time arguments of a launch over a [B, H, N, D] batch; varlen_ws.py passes the documents instead.
NOT_VARLEN: dict[str, Any] = {
    "CU_Q": None,
    "CU_K": None,
    "NUM_DOCS": None,
    "OUT": None,
    "COUNTER": None,
    "VARLEN": False,
}

# What lpt_table charges a tile beyond its key blocks (its Q load, first score tile and epilogue), in key blocks:
# half of one. A whole block piled short tiles on a few programs (docs/kernels.md, "Persistent LPT").
TILE_COST = 0.5


def tile_blocks_cost(
    q_pos: int, block_m: int, block_n: int, n_k: int, off: int, causal: bool, win: int, chain: float
) -> float:
    """What lpt_table charges for the key blocks of the tile whose first row is q_pos (it may be < 0: the tile
    ends at the last row). Each block costs max(a, chain) / W, a the tile's W = block_m / ROWS warpgroups that run
    it: a warpgroup whose rows all lie before row 0 runs none, and under a causal mask with three warpgroups one
    stops after the last block that holds a key of its rows (SKIP_DIAG, flash_ws_kernel._consumer_tile). chain 0
    (= W) charges every block in full, whoever runs it."""
    wgs = block_m // ROWS
    chain = chain or wgs
    last = cdiv(min(n_k, q_pos + block_m + off), block_n) if causal else n_k // block_n
    first = max(q_pos + off - win, 0) // block_n if win >= 0 else 0
    ends = []
    for w in range(wgs):
        top = q_pos + (w + 1) * ROWS  # one past the warpgroup's last row
        if top <= 0:
            continue  # no row of the tile: it only keeps the barrier protocol
        end = last
        if causal and wgs == 3:
            end = max(min(last, cdiv(min(n_k, top + off), block_n)), first + 1)
        ends.append(end)
    return sum(max(sum(j < e for e in ends), chain) / wgs for j in range(first, last))


def tile_costs(
    num_m: int,
    block_m: int,
    block_n: int,
    n_q: int,
    n_k: int,
    causal: bool,
    win: int,
    chain: float,
    tile: float = TILE_COST,
) -> tuple[float, ...]:
    """What a schedule charges each query block m of a head: tile_blocks_cost + tile (LPT_TILE, else TILE_COST)."""
    return tuple(
        tile_blocks_cost(n_q - (num_m - m) * block_m, block_m, block_n, n_k, n_k - n_q, causal, win, chain)
        + tile
        for m in range(num_m)
    )


@functools.lru_cache(maxsize=32)
def _list_schedule(
    cost: tuple[float, ...], bh: int, sched_heads: int, programs: int, causal: bool
) -> tuple[tuple[tuple[int, ...], ...], float]:
    """The list schedule of bh heads' tiles (cost[m] for query block m) over the programs, in the kernel's tile
    order: each program's tiles, and its most loaded program's work."""
    rows: list[list[int]] = [[] for _ in range(programs)]
    load = [(0.0, p) for p in range(programs)]
    for t, m in enumerate(_tile_blocks(len(cost), bh, sched_heads, causal)):
        work, p = heapq.heappop(load)
        rows[p].append(t)
        heapq.heappush(load, (work + cost[m], p))
    return tuple(tuple(row) for row in rows), max(work for work, _ in load)


@functools.lru_cache(maxsize=32)
def _balanced_schedule(
    cost: tuple[float, ...], bh: int, sched_heads: int, programs: int, causal: bool
) -> tuple[tuple[tuple[int, ...], ...], float]:
    """_list_schedule's tiles, rebalanced: while the most loaded program can hand the least loaded one a tile, or
    trade one for a cheaper one of its, so that the larger of their two loads drops, the move or trade whose
    difference comes nearest half their gap is made. Each program keeps its tiles in tile order and at least one
    (_consumer_lead issues every program's first S unconditionally). Returns the rows and the most loaded
    program's work."""
    greedy, _ = _list_schedule(cost, bh, sched_heads, programs, causal)
    work = [cost[m] for m in _tile_blocks(len(cost), bh, sched_heads, causal)]
    rows = [list(row) for row in greedy]
    loads = [sum(work[t] for t in row) for row in rows]
    for _ in range(len(work)):  # each step lowers the sum of squared loads; never near this many
        a = max(range(programs), key=loads.__getitem__)
        b = min(range(programs), key=loads.__getitem__)
        gap = loads[a] - loads[b]
        mine = {work[t]: t for t in rows[a]}  # a tile of each cost the busiest program holds
        theirs = {work[u]: u for u in rows[b]}
        best = _nearest_option(mine, theirs, gap, len(rows[a]) > 1)
        if best is None:
            break
        delta, t, u = best
        rows[a].remove(t)
        bisect.insort(rows[b], t)
        if u is not None:
            rows[b].remove(u)
            bisect.insort(rows[a], u)
        loads[a] -= delta
        loads[b] += delta
    return tuple(tuple(row) for row in rows), max(loads)


def _nearest_option(
    mine: dict[float, int], theirs: dict[float, int], gap: float, can_move: bool
) -> tuple[float, int, int | None] | None:
    """Of the options in order, the moves of one of `mine` (cost: tile) where can_move, then the trades of one of
    `mine` for one of `theirs` (cost difference c - d, each dict in its order), the first whose difference lies in
    (0, gap) nearest gap / 2, as (difference, tile given, tile taken or None); None where none fits. Per tile of
    `mine` only the costs of `theirs` beside c - gap / 2 can be nearest (the difference falls as d grows), so a
    step costs a bisection per tile, not every pair: 30 ms a table of 32 heads of 128k keys where listing every
    pair took 0.5-0.7 s (a 2-core CPU), the same tables."""
    half, low, high = gap / 2, 1e-9, gap - 1e-9
    nearest = math.inf
    best: tuple[float, int, int | None] | None = None
    if can_move:
        for c, t in mine.items():
            if low < c < high and abs(c - half) < nearest:
                nearest, best = abs(c - half), (c, t, None)
    costs, tiles = list(theirs), list(theirs.values())
    by_cost = sorted(range(len(costs)), key=costs.__getitem__)
    sorted_costs = [costs[k] for k in by_cost]
    for c, t in mine.items():
        p = bisect.bisect_left(sorted_costs, c - half)
        # the neighbours (one more each side for rounding), in the dict's order so that a tie keeps the first
        for k in sorted(by_cost[max(p - 2, 0) : p + 2]):
            delta = c - costs[k]
            if low < delta < high and abs(delta - half) < nearest:
                nearest, best = abs(delta - half), (delta, t, tiles[k])
    return best


@functools.lru_cache(maxsize=8)
def _tile_blocks(num_m: int, bh: int, sched_heads: int, causal: bool) -> tuple[int, ...]:
    """The query block of each tile in the kernel's tile order (flash_ws_parts.tile); cached: the list schedule,
    its rebalancing and lpt_heads' groups read it for one shape."""
    blocks: list[int] = []
    for base in range(0, bh, sched_heads):
        heads = min(bh - base, sched_heads)
        blocks += [num_m - 1 - r // heads if causal else r // heads for r in range(num_m * heads)]
    return tuple(blocks)


@functools.lru_cache(maxsize=32)
def lpt_table(
    cost: tuple[float, ...], bh: int, sched_heads: int, programs: int, causal: bool, device: torch.device
) -> torch.Tensor:
    """The persistent programs' schedule (LPT=1) of bh heads' tiles, cost[m] the work of query block m
    (tile_costs; walk_costs of a config), int32 [programs, rounds]: row p the tiles program p walks, in order,
    padded with len(cost) * bh (past the last tile). The tiles are list-scheduled in the kernel's tile order
    (flash_ws_parts.tile: groups of sched_heads heads, the longest query block first under a causal mask): the
    next goes to the program with the least work so far, as a dynamic scheduler would hand it out, and then
    _balanced_schedule evens the programs' work. Cached per shape (one upload)."""
    rows, _ = _balanced_schedule(cost, bh, sched_heads, programs, causal)
    width = max(len(row) for row in rows)
    table = [list(row) + [len(cost) * bh] * (width - len(row)) for row in rows]
    return torch.tensor(table, dtype=torch.int32, device=device)


def list_schedule_pays(cost: tuple[float, ...], bh: int, sched_heads: int, programs: int) -> bool:
    """Without a mask, tiles costing cost[m] (tile_costs): whether the list schedule's most loaded program has less
    work than round-robin's (tile t to program t % programs, one head at a time). Where every tile costs the same
    (192 divides N, or 128-row tiles) the two are equal and the walk stays round-robin (d = 64 at N = 8192 and
    16384: round-robin 0.991-0.996x the list schedule's time, H200)."""
    _, listed = _list_schedule(cost, bh, sched_heads, programs, False)
    return listed < _robin_load(cost, bh, programs) - 1e-9


def _robin_load(cost: tuple[float, ...], bh: int, programs: int) -> float:
    """The most loaded program's work where tile t (query block t % num_m of its head) goes to program
    t % programs: the persistent walk without a table."""
    num_m = len(cost)
    return max(sum(cost[t % num_m] for t in range(p, num_m * bh, programs)) for p in range(programs))


def walk_programs(tiles: int, cfg: dict[str, Any], sm_count: int) -> int:
    """The persistent walk's programs: one per SM (PROGRAMS of them where forced), at most one per tile."""
    return min(tiles, cfg.get("PROGRAMS") or sm_count)


def walk_costs(cfg: dict[str, Any], n_q: int, n_k: int, causal: bool, win: int) -> tuple[float, ...]:
    """tile_costs of config cfg's tiles over n_q query and n_k key rows: its BLOCK_M and BLOCK_N, its LPT_CHAIN (0
    where none) and LPT_TILE (TILE_COST where none). The one reading of a config's charges: lpt_heads, the plan's
    table, list_schedule_pays and walk_load all cost its walk here."""
    block_m = cfg["BLOCK_M"]
    chain, tile = cfg.get("LPT_CHAIN", 0), cfg.get("LPT_TILE", TILE_COST)
    return tile_costs(cdiv(n_q, block_m), block_m, cfg["BLOCK_N"], n_q, n_k, causal, win, chain, tile)


def walk_load(
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    causal: bool,
    cfg: dict[str, Any],
    sm_count: int,
    win: int = -1,
) -> tuple[int, int, float, float] | None:
    """How the persistent walk of config cfg (a row's reported kernel_config) spreads its tiles, as this module's
    schedule model charges them (tile_costs: a tile's key blocks + TILE_COST): (tiles, programs, the most loaded
    program's work, the mean program's work). The walk ends with its most loaded program, so mean / most is the
    share of the programs' time the model fills with tiles. None for one program per tile (PERSISTENT=0: the
    GPU's block scheduler deals those). win: a window's left limit, -1 for none (causal is then True)."""
    if not cfg.get("PERSISTENT"):
        return None
    bh = batch * heads
    cost = walk_costs(cfg, n_q, n_k, causal, win)
    tiles = len(cost) * bh
    programs = walk_programs(tiles, cfg, sm_count)
    if cfg.get("LPT"):
        busiest = _balanced_schedule(cost, bh, cfg["SCHED_HEADS"], programs, causal)[1]
    else:
        busiest = _robin_load(cost, bh, programs)
    return tiles, programs, busiest, sum(cost) * bh / programs


# 16-bit head dims whose causal diagonal is masked by flash_ws_parts._diagonal_mask (FAST_MASK) by default, beside
# three consumers (d = 64) and packed documents: d = 128 took 0.980-0.990x the time of a key computed per score at N
# = 1024-4096 (H200), d = 256 0.997-1.010x, and FP8 d = 128 (_key_order_mask) 1.014-1.026x at N = 2048-3072
# (docs/kernels.md, the causal diagonal's mask).
FAST_MASK_DIMS = (128,)


def fast_mask(cfg: dict[str, Any], head_dim: int, fp8: bool = False, varlen: bool = False) -> bool:
    """Whether the kernel masks the causal diagonal by flash_ws_parts._diagonal_mask (FAST_MASK; forced either
    way): by default with three consumers (d = 64), over packed documents and at FAST_MASK_DIMS in 16 bits."""
    forced = cfg.get("FAST_MASK")
    if forced is not None:
        return bool(forced)
    return varlen or cfg["BLOCK_M"] // ROWS == 3 or (not fp8 and head_dim in FAST_MASK_DIMS)


def kernel_constexprs(
    cfg: dict[str, Any],
    head_dim: int,
    causal: bool,
    *,
    fp8: bool = False,
    window: bool = False,
    varlen: bool = False,
) -> dict[str, Any]:
    """The compile-time arguments of a launch of the kernel with config cfg (varlen: varlen_ws.py's packed
    documents, whose CU_Q, CU_K, NUM_DOCS and OUT are run-time arguments)."""
    num_wg = cfg["BLOCK_M"] // ROWS
    return {
        "HEAD_DIM": head_dim,
        "BLOCK_N": cfg["BLOCK_N"],
        "STAGES": cfg["STAGES"],
        "CAUSAL": bool(causal),
        "NUM_WG": num_wg,
        "SCHED_HEADS": cfg["SCHED_HEADS"],
        "SEP_O": own_o(cfg, head_dim, fp8),
        "WINDOW": window,
        "EXP_POLY": bool(cfg.get("EXP_POLY")) and fp8,
        "SUM_MMA": bool(cfg.get("SUM_MMA")) and fp8,
        "LEAD_S": bool(cfg.get("LEAD_S")) and not varlen,
        "Q2": bool(cfg.get("Q2")) and not varlen,
        "LOOP_FIRST": bool(cfg.get("LOOP_FIRST")) and not varlen,
        "FAST_MASK": fast_mask(cfg, head_dim, fp8, varlen),
        "CONSUMER_REGS": CONSUMER_REGS[num_wg],
        "PRODUCER_REGS": PRODUCER_REGS[num_wg],
        **({"VARLEN": 2 if cfg["PERSISTENT"] else 1} if varlen else NOT_VARLEN),
    }


class ForwardPlan:
    """What the Gluon forward decides for one input signature (shapes, strides, dtype, device, mask, config),
    decided once: the config, the checks, the grid, the schedule table. run() then
    allocates O and the LSE and launches (launch.KernelCall: through Triton's JIT the first time, then the
    compiled kernel). Raises ValueError where `supported` or the config refuses the inputs."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        config: dict[str, Any] | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        D = q.shape[-1]
        causal = (
            bool(causal) or window is not None
        )  # a supported window has right limit 0: the causal diagonal
        fp8 = q.dtype in FP8_DTYPES
        cfg = default_config(D, causal, fp8, k.shape[2])
        forced = check_config({key: val for key, val in (config or {}).items() if key != "kernel"})
        cfg.update(forced)
        if causal and cfg["PERSISTENT"] and not cfg.get("LPT"):
            raise ValueError("flash_ws forward: a causal persistent walk is list-scheduled (LPT=1)")
        why = supported(q, k, v, causal, cfg["BLOCK_M"], window, cfg["BLOCK_N"])
        if why:
            raise ValueError(f"flash_ws forward: {why}")
        refusals = {  # in this order: Q2 runs only without LEAD_S, LOOP_FIRST only without either
            "LEAD_S": lambda: lead_s_refusal(cfg, q.shape[2], window is not None, fp8),
            "Q2": lambda: q2_refusal(cfg, D, window is not None, fp8),
            "LOOP_FIRST": lambda: loop_first_refusal(cfg, window is not None),
        }
        for key, refusal in refusals.items():
            if cfg.get(key):  # the default's where its walk can run it; a forced one or a one-line refusal
                why = refusal()
                if why and key in forced:
                    raise ValueError(f"flash_ws forward: {why}")
                if why or (key not in forced and smem_bytes(cfg, D, fp8) > SMEM_LIMIT):
                    cfg[key] = 0
        if smem_bytes(cfg, D, fp8) > SMEM_LIMIT:
            raise ValueError(
                f"flash_ws forward: config needs {smem_bytes(cfg, D, fp8) // 1024} KiB of shared memory at head "
                f"dim {D} (at most {SMEM_LIMIT // 1024}): fewer STAGES, BLOCK_N 64 or PERSISTENT=0"
                + "".join(f" ({key}=1 holds two Q buffers)" for key in ("LEAD_S", "Q2") if cfg.get(key))
            )
        B, H, Nq, _ = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        num_m = cdiv(Nq, cfg["BLOCK_M"])
        tiles = num_m * B * H
        self.table, width = _no_table(q.device), 0  # round-robin
        if cfg["PERSISTENT"]:
            programs = walk_programs(
                tiles, cfg, _sm_count(q.device.index if q.device.index is not None else 0)
            )
            grid: tuple[int, ...] = (programs,)
            win = window[0] if window is not None else -1
            if cfg.get("LPT") and "SCHED_HEADS" not in forced:
                cfg["SCHED_HEADS"] = lpt_heads(cfg, B * H, Nq, Nk, D, causal, programs, win, fp8)
            cost = walk_costs(cfg, Nq, Nk, causal, win)  # a window is causal: win -1 without a mask
            if not causal and cfg.get("LPT") and "LPT" not in forced:
                if not list_schedule_pays(cost, B * H, cfg["SCHED_HEADS"], programs):
                    # equal tiles: round-robin (LPT_CHAIN stays in the report, so that forcing it back, LPT=0
                    # with the default's other keys, gives this config), in a forced group's tile order
                    cfg.update(LPT=0, SCHED_HEADS=forced.get("SCHED_HEADS", 1))
            if cfg.get("LPT"):
                self.table = lpt_table(cost, B * H, cfg["SCHED_HEADS"], programs, causal, q.device)
                width = self.table.shape[1]
        else:
            grid = (tiles,)
        self.fp8, self.block_n, self.o_width = fp8, cfg["BLOCK_N"], o_cols(cfg, D)
        self.o_shape, self.lse_shape = tuple(q.shape), (B, H, Nq)
        self.o_dtype = torch.bfloat16 if fp8 else q.dtype
        # run-time arguments after the four descriptors and the LSE
        self.sizes = (H, H // Hkv, Nq, Nk, num_m, B * H)
        self.tail = (window[0] if window is not None else 0,)
        self.width = width
        self.config = dict(cfg, kernel="gluon-ws")
        constexprs = kernel_constexprs(cfg, D, causal, fp8=fp8, window=window is not None)
        self.call = KernelCall(_attn_fwd_ws, grid, constexprs, {"num_warps": 4})

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sm_scale: float,
        descales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """O [B,H,Nq,D] and lse2 [B,H,Nq] fp32 of inputs with this plan's signature, and the config."""
        if self.fp8 and descales is None:
            raise ValueError("flash_ws forward: FP8 inputs need their descales")
        # size= by keyword, here and in every plan's allocation: torch.empty's parser then skips the overload that
        # takes the sizes as separate arguments (1.15 against 1.6 us a call on the CPU machine)
        o = torch.empty(size=self.o_shape, dtype=self.o_dtype, device=q.device)
        lse = torch.empty(size=self.lse_shape, dtype=torch.float32, device=q.device)
        tensors = (q, k, v, o)
        scales = descales if self.fp8 and descales is not None else (lse, lse, lse)
        rest = (lse, *self.sizes, sm_scale * LOG2E, *self.tail, *scales, self.table, self.width)
        launch(self, tensors, rest, lambda: _descriptors(q, k, v, o, self.block_n, self.o_width))
        return o, lse, self.config


def launch(plan: Any, tensors: tuple[torch.Tensor, ...], rest: tuple[Any, ...], descriptors: Any) -> None:
    """plan.call on TMA descriptors of `tensors`, then `rest`: on the first call (the JIT) the real ones
    (descriptors()), whose geometry launch.KernelCall keeps; the tensors alone after."""
    plan.call((*(tensors if plan.call.direct else descriptors()), *rest))


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None = None,
    window: tuple[int, int] | None = None,
    descales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Run the Gluon forward (a plan made for this call alone; flash_v2 and flash_fp8 keep theirs per signature).
    Returns (o [B,H,Nq,D], lse2 [B,H,Nq] fp32, config used); raises ValueError if `supported` refuses the inputs.
    FP8 (e4m3 q, k, v; v as `supported` says): descales are the q, k, v descales, fp32 [B, Hkv] contiguous
    (flash_fp8's checked ones), O is bf16 and the LSE is of the descaled scores."""
    return ForwardPlan(q, k, v, causal, config, window).run(q, k, v, sm_scale, descales)

"""Forward studies as providers: the bundled forward with a forced config, one provider per variant.

Loaded with `--kernel` by the study configs beside this file (benchmarks/README.md), so every variant is timed
as a sweep times a case (docs/measuring.md) and checked against the float64 oracle first:

    flashbench sweep --config benchmarks/studies/forward_tiles.toml     # tl tiles: FWD_SPACE, a few outside, capped
    flashbench sweep --config benchmarks/studies/gluon_forward.toml     # the Gluon forward's variants
    flashbench sweep --config benchmarks/studies/fp8_forward.toml       # FP8 tiles and the Gluon FP8 configs

Names: `fwd-BMxBN-wW-sS[-rR]` a tl tile (maxnreg R), `ws-...` a Gluon config, `fp8-...` either on e4m3 inputs.
A forced config the kernel refuses for a shape is an `unsupported` row, one that fails to compile a `crash` row,
each with the kernel's reason.
`FLASHBENCH_TMA=0 flashbench sweep ...` times the pointer path instead of tensor descriptors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from flashbench.kernels import flash_attn, last_config, value_layout
from flashbench.kernels.configs import FP8_FWD_SPACE, FWD_SPACE, config_dict
from flashbench.kernels.flash_ws import BLOCK_N, FP8_CONFIG

from flashbench.providers import Unsupported, register
from flashbench.spec.cases import Case

# tl tiles outside FWD_SPACE that were measured and not adopted (docs/kernels.md): 4-warp 128x128, 32-key
# tiles, a fourth stage, and 256-row 8-warp tiles (two warpgroups sharing the K/V tiles).
FWD_OUTSIDE = (
    (128, 64, 4, 4),
    (128, 128, 4, 2),
    (128, 32, 4, 2),
    (128, 32, 4, 3),
    (256, 64, 8, 2),
    (256, 64, 8, 3),
    (256, 32, 8, 2),
    (256, 32, 8, 3),
)
# The register cap (maxnreg 128: two 8-warp programs per SM) on the autotuner's configs for d = 64 and 128.
CAPPED = tuple((*c[:4], 128) for c in FWD_SPACE[:7])
FP8_OUTSIDE = ((128, 256, 8, 2), (64, 128, 4, 3), (128, 128, 8, 3, 168))

_GLUON = {"kernel": "gluon-ws"}
# The Gluon forward's variants (flash_ws.CONFIG_KEYS). A forced config updates the default for the case's head dim
# and mask (flash_ws.DEFAULT_CONFIG, what the study config's `triton` runs), so each variant names every key that
# default sets: rows, K/V stages, one program per tile (`-sS`) or persistent (`-p`), and for a persistent causal
# walk the list schedule (`-lpt`) over groups of one or four heads (`-hN`); but O_HALVES, on in d = 256's default,
# so that at d = 256 these run its half-width output buffers and only the `-oq` variants store O through Q's.
_ONE_PER_TILE = {"PERSISTENT": 0, "LPT": 0, "SCHED_HEADS": 1}
GLUON_VARIANTS: dict[str, dict[str, int]] = {
    **{
        f"ws-{rows}-s{stages}": {"BLOCK_M": rows, "STAGES": stages, **_ONE_PER_TILE}
        for rows in (128, 192)
        for stages in (2, 3)
    },
    **{
        f"ws-{rows}-p-s{stages}": {
            "BLOCK_M": rows,
            "STAGES": stages,
            "PERSISTENT": 1,
            "LPT": 0,
            "SCHED_HEADS": 1,
        }
        for rows in (128, 192)
        for stages in (2, 3)
    },
    **{
        f"ws-{rows}-lpt-h{heads}": {
            "BLOCK_M": rows,
            "STAGES": 2,
            "PERSISTENT": 1,
            "LPT": 1,
            "SCHED_HEADS": heads,
        }
        for rows in (128, 192)
        for heads in (1, 4, 8, 16)
    },
    # the list schedule charging a key block max(a, chain) / 3 for the a of a 192-row tile's warpgroups that run it
    # (`-cC`: LPT_CHAIN, flash_ws.tile_blocks_cost), not 1 whoever runs it
    **{
        f"ws-{rows}-lpt-h{heads}-c{chain}": {
            "BLOCK_M": rows,
            "STAGES": 2,
            "PERSISTENT": 1,
            "LPT": 1,
            "SCHED_HEADS": heads,
            "LPT_CHAIN": chain,
        }
        for rows in (192,)
        for heads in (1, 4)
        for chain in (1, 2)
    },
    # d = 256's output through Q's buffers (`-oq`: O_HALVES 0), as before its half-width buffers of its own: one
    # program per tile, persistent, list-scheduled (elsewhere these equal the variants above)
    "ws-128-s2-oq": {"BLOCK_M": 128, "STAGES": 2, **_ONE_PER_TILE, "O_HALVES": 0},
    "ws-128-p-s2-oq": {
        "BLOCK_M": 128,
        "STAGES": 2,
        "PERSISTENT": 1,
        "LPT": 0,
        "SCHED_HEADS": 1,
        "O_HALVES": 0,
    },
    "ws-128-lpt-oq": {"BLOCK_M": 128, "STAGES": 2, "PERSISTENT": 1, "LPT": 1, "O_HALVES": 0},
    # 128-row walks with each tile's epilogue under the next tile's first S (LEAD_S), where the default takes 192
    # rows (d = 64): persistent (`-p`), or list-scheduled in groups of 4 or 16 heads; 2 or 3 K/V stages (`-sS`)
    **{
        f"ws-128-{walk}-s{stages}-lead": {
            "BLOCK_M": 128,
            "STAGES": stages,
            "PERSISTENT": 1,
            "LPT": int(walk != "p"),
            "SCHED_HEADS": 1 if walk == "p" else int(walk[5:]),
            "LEAD_S": 1,
        }
        for walk in ("p", "lpt-h4", "lpt-h16")
        for stages in (2, 3)
    },
    # the shipped default with each tile's epilogue under the next tile's first S, or not (LEAD_S)
    "ws-lead": {"LEAD_S": 1},
    "ws-no-lead": {"LEAD_S": 0},
    # the shipped default with the next tile's Q loading into a second buffer while this tile runs, or one buffer
    # (Q2: d = 64's default without a mask takes two)
    "ws-q2": {"Q2": 1},
    "ws-q1": {"Q2": 0},
    # the shipped default over 64-key K/V blocks (d = 64's 192-row tiles: a finer causal diagonal, twice the steps),
    # in 2, 3 or 4 stages
    "ws-n64": {"BLOCK_N": 64},
    "ws-n64-s3": {"BLOCK_N": 64, "STAGES": 3},
    "ws-n64-s4": {"BLOCK_N": 64, "STAGES": 4},
    # the shipped default with each tile's first key block through the step loops, or through a softmax of its own
    # (LOOP_FIRST: d = 64's causal default takes the loops)
    "ws-loop-first": {"LOOP_FIRST": 1},
    "ws-no-loop-first": {"LOOP_FIRST": 0},
    # LOOP_FIRST in place of LEAD_S's early S (d = 128's default takes LEAD_S, which LOOP_FIRST runs without)
    "ws-loop-first-no-lead": {"LEAD_S": 0, "LOOP_FIRST": 1},
    # the shipped default with the causal diagonal masked by flash_ws_parts._diagonal_mask, or by each score's key
    # (FAST_MASK: d = 64's default takes the first)
    "ws-fast-mask": {"FAST_MASK": 1},
    "ws-key-mask": {"FAST_MASK": 0},
    # the shipped default's list schedule charging each tile 0, a quarter or 1 key block beyond its own (LPT_TILE;
    # flash_ws.TILE_COST: half a block)
    **{f"ws-tile-{cost}": {"LPT_TILE": cost} for cost in (0, 0.25, 1)},
}
# The Gluon FP8 forward: 128-row tiles only (192 rows spill in FP8), K/V stages, one program per tile or not, and
# under a causal mask the list-scheduled persistent walk (`-lpt-hN`: groups of N heads), over the head dim's
# narrow key tiles (NARROW: flash_ws.BLOCK_N, 128 keys at d = 128, 64 at d = 256); `-nN`: N-key tiles, two stages
# (flash_ws.FP8_WIDE_N's wide tiles: 256 at d = 128, 128 at d = 256).
NARROW = "narrow"
# 256-key tiles over two stages with P's row sums by a matmul, every exp2 on the MUFU and the first key block's own
# softmax
N256_SUM = {"BLOCK_N": 256, "STAGES": 2, "SUM_MMA": 1, "EXP_POLY": 0, "LOOP_FIRST": 0}
FP8_GLUON_VARIANTS = {
    **{
        f"fp8-ws-s{stages}{'-p' if persistent else ''}": {
            **FP8_CONFIG,
            "BLOCK_N": NARROW,
            "STAGES": stages,
            "PERSISTENT": persistent,
        }
        for stages, persistent in ((2, 0), (3, 0), (4, 0), (3, 1), (4, 1))
    },
    **{
        f"fp8-ws-s{stages}-lpt-h{heads}": {
            **FP8_CONFIG,
            "BLOCK_N": NARROW,
            "STAGES": stages,
            "PERSISTENT": 1,
            "LPT": 1,
            "SCHED_HEADS": heads,
        }
        for stages, heads in ((2, 1), (3, 1), (3, 4), (3, 8), (3, 16))
    },
    # the shipped default with an eighth of each step's exp2s on the FMA pipe, or all on the MUFU (EXP_POLY)
    "fp8-ws-exp-poly": {"EXP_POLY": 1},
    "fp8-ws-exp-mufu": {"EXP_POLY": 0},
    # the shipped default with P's row sums by a matmul beside P V, or by the softmax's adds (SUM_MMA)
    "fp8-ws-sum-mma": {"SUM_MMA": 1},
    "fp8-ws-sum-fadd": {"SUM_MMA": 0},
    # the shipped default with two Q buffers, or one (Q2: d = 128's causal walk over 128-key tiles takes two, in
    # groups of 4 heads; with one, lpt_heads gives it 8 below 4096 keys), and two Q buffers with two or four K/V
    # stages or in groups of 8 heads
    "fp8-ws-q2": {"Q2": 1},
    "fp8-ws-q1": {"Q2": 0},
    "fp8-ws-q2-s2": {"Q2": 1, "STAGES": 2},
    "fp8-ws-q2-s4": {"Q2": 1, "STAGES": 4},
    "fp8-ws-q2-h8": {"Q2": 1, "SCHED_HEADS": 8},
    # the shipped default with each tile's first key block through the step loops (without Q2: the pair is refused),
    # or through a softmax of its own (LOOP_FIRST)
    "fp8-ws-loop-first": {"LOOP_FIRST": 1, "Q2": 0},
    "fp8-ws-no-loop-first": {"LOOP_FIRST": 0},
    # the shipped default with the causal diagonal masked by flash_ws_parts._key_order_mask (FAST_MASK)
    "fp8-ws-fast-mask": {"FAST_MASK": 1},
    # the shipped default's list schedule charging each tile 1, 1.5 or 2 key blocks beyond its own (LPT_TILE;
    # flash_ws.TILE_COST: half a block)
    **{f"fp8-ws-tile-{cost}": {"LPT_TILE": cost} for cost in (1, 1.5, 2)},
    # the 256-key tiles with SUM_MMA, without EXP_POLY (with it the step spills 26 stores), with or without each
    # tile's first key block through the step loops (`-lf`: causal d = 128's default from flash_ws.FP8_WIDE_MIN_KEYS
    # keys, forced below them)
    "fp8-ws-n256-sum": N256_SUM,
    "fp8-ws-n256-sum-lf": {**N256_SUM, "LOOP_FIRST": 1},
    # without LOOP_FIRST, list-scheduled in groups of N heads (`-hN`; flash_ws.lpt_heads picks 4 from 8192 keys at
    # d = 128)
    **{f"fp8-ws-n256-sum-h{heads}": {**N256_SUM, "SCHED_HEADS": heads} for heads in (1, 8, 16)},
    **{f"fp8-ws-n{block_n}": {"BLOCK_N": block_n, "STAGES": 2} for block_n in (64, 128, 256)},
}


def tile_name(prefix: str, entry: tuple[int, ...]) -> str:
    """`fwd-128x64-w4-s2`, `-r128` with a register cap."""
    bm, bn, warps, stages = entry[:4]
    return f"{prefix}-{bm}x{bn}-w{warps}-s{stages}" + (f"-r{entry[4]}" if len(entry) > 4 else "")


@contextlib.contextmanager
def _gluon_off() -> Iterator[None]:
    """FLASHBENCH_GLUON=0 for one call: the kernels read it per call (launch.env_key), so the tl forward runs,
    autotuned, where flash_attn would take the Gluon one."""
    before = os.environ.get("FLASHBENCH_GLUON")
    os.environ["FLASHBENCH_GLUON"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["FLASHBENCH_GLUON"]
        else:
            os.environ["FLASHBENCH_GLUON"] = before


def _register(
    name: str, config: dict[str, Any] | None, dtypes: tuple[str, ...], what: str, gluon: bool = False
) -> None:
    """One forward provider calling flash_attn with `config` forced (None: with the Gluon forward off; a BLOCK_N
    of NARROW: the case's head dim's); a Gluon config runs on CUDA only (Hopper: elsewhere its refusal is the row's
    reason)."""

    def build(case: Case, device: str, stack: Any) -> Any:
        causal, scale = case.causal, case.head_dim**-0.5
        forced = config
        if forced is not None and forced.get("BLOCK_N") == NARROW:
            forced = {**forced, "BLOCK_N": BLOCK_N.get(case.head_dim, 128)}

        def call(q: Any, k: Any, v: Any, **descales: Any) -> Any:
            if config is None:
                with _gluon_off():
                    return flash_attn(q, k, v, causal=causal, sm_scale=scale)
            try:
                return flash_attn(q, k, v, causal=causal, sm_scale=scale, config=forced, **descales)
            except ValueError as exc:  # flash_ws refuses a forced config for this shape (192 rows at d = 128)
                raise Unsupported(f"{name}: {exc}") from None

        if case.dtype == "fp8":  # V in the FP8 kernels' layout, once, untimed (as the `triton` provider does)
            call.prepare = lambda q, k, v, **kw: (q, k, value_layout(v), kw)  # type: ignore[attr-defined]
        return call

    register(
        name,
        dtypes=dtypes,
        backward=False,
        gqa=True,
        devices=("cuda",) if gluon else ("cuda", "cpu"),
        builder=True,
        kernel_config=last_config,
        description=f"forward study: {what}",
    )(build)


for _entry in (*FWD_SPACE, *FWD_OUTSIDE, *CAPPED):
    _register(tile_name("fwd", _entry), config_dict(_entry), ("fp16", "bf16", "fp32"), "forced tl tile")
_register("fwd-tl", None, ("fp16", "bf16", "fp32"), "the tl forward, autotuned (FLASHBENCH_GLUON=0)")
for _name, _forced in GLUON_VARIANTS.items():
    _register(_name, {**_GLUON, **_forced}, ("fp16", "bf16"), f"Gluon forward {_forced}", gluon=True)
for _entry in (*FP8_FWD_SPACE, *FP8_OUTSIDE):
    _register(tile_name("fp8", _entry), config_dict(_entry), ("fp8",), "forced FP8 tl tile")
for _name, _forced in FP8_GLUON_VARIANTS.items():
    _register(_name, {**_GLUON, **_forced}, ("fp8",), f"Gluon FP8 forward {_forced}", gluon=True)

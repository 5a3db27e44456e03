"""The backward for Hopper, written in Gluon: warp-specialized, K and V resident per warpgroup, dQ in the same pass.

Origin: Shah et al., "FlashAttention-3" (2024), section 3 applied to the backward (FA3's hopper/ backward has the
same split of work: a producer warp streaming Q and dO by TMA, consumer warpgroups holding dK and dV, dQ added into
an fp32 buffer by TMA reduce-adds), with backward_dkdv.py's math and loop order: the program owns NUM_WG * 64 keys
of one (batch, K/V head), each consumer warpgroup 64 of them (its K and V slices stay in shared memory, its dK and
dV accumulate in fp32 registers), and walks the query blocks of every query head of the GQA group, which one
producer warp streams through a ring of STAGES shared-memory stages (Q and dO of BLOCK_M rows each by TMA, and
their rows' LSE and D, which the consumers read from there where they use them). Per query block a consumer runs
  S^T = K Q^T;  P^T = exp2(S^T * qk_scale - LSE2)          (operands in shared memory)
  dP^T = V dO^T;  dS^T = P^T * (dP^T - D)                  (D = rowsum(dO * O), backward.py's preprocess)
  dV += P^T dO,  dK += dS^T Q                              (P^T, dS^T as register A operands)
and releases the stage; at the end dK *= sm_scale, and dK, dV leave through shared memory by TMA. The consumers do
not take turns: two warpgroups running freely keep the tensor cores fed while either computes P^T and dS^T.
The programs launch one K/V head after another (a grid [key blocks, B * H_KV]), and program p starts its walk at
its p-th query block (1-3% faster than every program starting at the first; docs/kernels.md, the backward).
PERSIST (PERSISTENT_MAX_SEQ's rule): one program per SM takes those tiles in the same order from a counter
(_claim) and hands each to its partitions (_hand_out, _take); the next tile's first Q/dO stages load while this
tile's dK and dV leave, its K and V once every partition is done with this tile's (kv_free).

ONE_PASS=1 (the default): the consumers also store dS to shared memory, and a third warpgroup (_dq_partition)
computes dQ = dS K over the program's 128 keys from it and the resident K, and adds it into a zeroed fp32 dQ by
TMA reduce-adds (backward.py converts it behind the kernel, unit by unit: _dq_count): 5 block matmuls per (query
block, key block) instead of the two passes' 7. Its dQ is not bitwise deterministic (the adds land in no fixed
order); ONE_PASS=0 keeps dQ in backward_dq.py's separate pass (every output has one writer; backward.py takes it
where torch asks for deterministic algorithms). The four warpgroups' register split (ONE_PASS_REGS) is what makes
the one pass pay: docs/kernels.md, the backward. The accumulator is zeroed by the programs two waves ahead
(_zero_issue), the first rows of the grid by the preprocess: memory writes moved from a bandwidth-bound kernel under
the compute-bound one.

Scope (`supported` says why not; backward_dkdv.py and backward_dq.py serve the rest): CUDA capability 9.x,
fp16/bf16, D in {64, 128}, contiguous q, k, v, dO, Nq % BLOCK_M == 0, Nk % (NUM_WG * 64) == 0, no sliding window,
no stored P, and for causal Nk >= Nq (bottom-right: every query row sees a key).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from . import flash_ws
from .common import cdiv
from .launch import KernelCall

OFF = ("0", "false", "no", "off")

try:  # Gluon is experimental; written against Triton 3.6 (as flash_ws.py).
    from triton._C.libtriton import ir as _ir
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .flash_ws_kernel import store_rows
    from .flash_ws_parts import document_block, launch_dependents, put_tile, take_tile

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

KEYS = 64  # keys per consumer warpgroup
# The one pass with two stages of Q and dO at d = 128 and three at d = 64; TWO_PASS updates it where dQ must be
# deterministic (two stages measured best there too; docs/kernels.md, the backward).
DEFAULT_CONFIG = {
    64: {"BLOCK_M": 64, "NUM_WG": 2, "STAGES": 3, "ONE_PASS": 1},
    128: {"BLOCK_M": 64, "NUM_WG": 2, "STAGES": 2, "ONE_PASS": 1},
}
HEAD_DIMS = tuple(DEFAULT_CONFIG)  # not the forward's d = 256 (flash_ws.HEAD_DIMS)
TWO_PASS = {"ONE_PASS": 0, "STAGES": 2}
# the dQ "pass" last_bwd_config() reports for the one pass
DQ_IN_ONE_PASS = {"kernel": "gluon-ws", "ONE_PASS": 1}
CONFIG_KEYS = {
    "kernel": None,
    "BLOCK_M": (64,),
    "NUM_WG": (2,),
    "STAGES": (2, 3),
    "ONE_PASS": (0, 1),
    # ONE_PASS: the grid rows ahead whose dQ accumulator a program zeroes (_zero_issue); 0: the preprocess zeroes
    # it all. Unset: zero_ahead's pick
    "ZERO_AHEAD": None,
    # ONE_PASS: 1, dQ's accumulator converted to dQ's dtype behind the kernel, unit by unit as each unit's programs
    # end (backward._dq_convert, a dependent launch); 0: after it (torch's copy). Unset: CONVERT_MAX_SEQ's rule
    "CONVERT_BEHIND": (0, 1),
    # ONE_PASS: 1, a program per SM takes the grid's tiles in turn (_claim); 0, a program per tile. Unset:
    # PERSISTENT_MAX_SEQ's rule
    "PERSISTENT": (0, 1),
    # PERSISTENT: the programs (an int >= 1; unset: the SMs), fewer to give each more tiles (the tests)
    "PROGRAMS": None,
    # reported with the config (derived from NUM_WG and ONE_PASS), accepted back when they agree
    "BLOCK_N": (2 * KEYS,),
    "num_warps": (4 * 2 + 1, 4 * 2 + 4 + 1),
}
# setmaxnreg per thread of the two consumers and of the producer (flash_ws.py's split for two consumers).
CONSUMER_REGS = 240
PRODUCER_REGS = 24
# ONE_PASS: four warpgroups (the consumers, dQ's, the producer warp's) share the 64K registers, 512 per lane:
# the second consumer 216, dQ's 64 (the least ptxas keeps setmaxnreg for with its 32 fp32 accumulators), the
# producer's 24, and Triton gives the first consumer (the default partition) the rest, 208. Fewer for the
# consumers and ptxas serializes their wgmmas (`tools/sm90_compile.py` prints "serialized").
ONE_PASS_REGS = (216, 64)


def enabled() -> bool:
    """False when FLASHBENCH_GLUON_BWD=0, or where the Gluon forward is off (FLASHBENCH_GLUON=0, FLASHBENCH_TMA=0)."""
    return flash_ws.enabled() and os.environ.get("FLASHBENCH_GLUON_BWD", "1").strip().lower() not in OFF


# Where the backward takes this kernel by default: the shortest query length per (head dim, causal); None: never.
# The one pass ran 1.03-1.12x cuDNN's backward from N = 1024, where the two tl passes ran 0.78-1.01x
# (docs/kernels.md, the backward).
MIN_SEQ: dict[tuple[int, bool], int | None] = {
    (64, False): 1024,
    (64, True): 1024,
    (128, False): 1024,
    (128, True): 1024,
}
# Where dQ must be deterministic (torch.use_deterministic_algorithms), the two passes: the Gluon dK/dV pass only
# at d = 128 (0.91-0.97x the tl pass's time; at d = 64 the tl pass's 32-query tiles are faster).
MIN_SEQ_TWO_PASS: dict[tuple[int, bool], int | None] = {
    (64, False): None,
    (64, True): None,
    (128, False): 2048,
    (128, True): 2048,
}


def default_config(q: torch.Tensor, causal: bool) -> dict[str, Any] | None:
    """The config the backward takes by default (nothing forced) at q's shape, or None where the tl passes run:
    one pass, or the two passes where torch asks for deterministic algorithms (the one-pass dQ is a sum of TMA
    reduce-adds in no fixed order)."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    table = MIN_SEQ_TWO_PASS if deterministic else MIN_SEQ
    least = table.get((q.shape[-1], bool(causal)))
    if least is None or q.shape[2] < least or not enabled():
        return None
    return config_for(q.shape[-1], TWO_PASS if deterministic else None)


def config_for(head_dim: int, forced: dict[str, Any] | None = None) -> dict[str, Any]:
    """The default config at this head dim, updated by a forced one ({"kernel": "gluon-ws", ...}), checked."""
    cfg = dict(DEFAULT_CONFIG.get(head_dim, DEFAULT_CONFIG[128]))
    for key, val in (forced or {}).items():
        if key not in CONFIG_KEYS:
            raise ValueError(
                f"gluon-ws backward config: unknown key {key!r} (allowed: {sorted(CONFIG_KEYS)})"
            )
        allowed = CONFIG_KEYS[key]
        if key == "ZERO_AHEAD" and (isinstance(val, bool) or not isinstance(val, int) or val < 0):
            raise ValueError(f"gluon-ws backward config: ZERO_AHEAD={val!r} must be an int >= 0")
        if key == "PROGRAMS" and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise ValueError(f"gluon-ws backward config: PROGRAMS={val!r} must be an int >= 1")
        if allowed is not None and val not in allowed:
            raise ValueError(f"gluon-ws backward config: {key}={val!r} must be one of {list(allowed)}")
        if key not in ("kernel", "BLOCK_N", "num_warps"):
            cfg[key] = val
    if cfg.get("PERSISTENT") and not cfg.get("ONE_PASS"):
        raise ValueError("gluon-ws backward config: PERSISTENT=1 needs ONE_PASS=1")
    if cfg.get("PROGRAMS") and not cfg.get("PERSISTENT"):
        raise ValueError("gluon-ws backward config: PROGRAMS needs PERSISTENT=1")
    return cfg


# Where the one pass zeroes dQ's accumulator itself by default (_zero_issue), by (head dim, causal): from this key
# length (packed documents: the bucket of the longest). At d = 128 causal N = 1024 its dK/dV kernel took 1.12x the
# time, more than the preprocess saved (docs/kernels.md, the backward).
ZERO_MIN_SEQ: dict[tuple[int, bool], int] = {
    (64, False): 0,
    (64, True): 0,
    (128, False): 0,
    (128, True): 2048,
}


def zero_ahead(parts: int, units: int, sms: int, forced: int | None = None, on: bool = True) -> int:
    """_zero_issue's distance for a grid [parts, units]: the fewest grid rows whose programs fill the SMs twice,
    plus one (the programs that zero a unit's accumulator, at the end of their walks, then start two waves of the
    SMs before the unit's own), or `forced` (0: none), where `on` (else none); at most `units`: the preprocess
    zeroes the rows below it."""
    if forced is not None:
        return min(forced or units, units)
    return min(cdiv(2 * sms, parts) + 1, units) if on else units


def launch_ahead(
    cfg: dict[str, Any],
    head_dim: int,
    causal: bool,
    longest: int,
    grid: tuple[int, int],
    device: torch.device,
) -> int:
    """A launch's zeroing distance (_bwd_dkdv_ws's AHEAD) over grid [parts, units] on `device`: zero_ahead's,
    with ZERO_MIN_SEQ's rule at this key length (`longest`), or `units` (the preprocess zeroes it all) where the
    zero box does not fit (zero_box)."""
    parts, units = grid
    if not zero_box(cfg, head_dim):
        return units
    return zero_ahead(
        parts, units, _sms(device), cfg.get("ZERO_AHEAD"), zeroes_ahead(head_dim, causal, longest)
    )


def _sms(device: torch.device) -> int:
    """The SMs of `device`; off a GPU (the sm_90a compile stub) nothing launches: any count will do."""
    return flash_ws._sm_count(device.index or 0) if device.type == "cuda" else 132


def launch_grid(
    cfg: dict[str, Any], grid: tuple[int, int], device: torch.device, persist: bool
) -> tuple[int, ...]:
    """The launch's grid for the tiles' grid [parts, units]: that grid, or over a persistent walk (`persist`,
    kernel_constexprs' PERSIST) a program per SM (or PROGRAMS of them; at most one per tile)."""
    if persist:
        return (min(grid[0] * grid[1], cfg.get("PROGRAMS") or _sms(device)),)
    return grid


# Where the one pass walks its tiles persistently by default (PERSISTENT unset), by (head dim, causal), over a
# [B, H, N, D] batch: below this key length. At d = 64 the backward ran 1.005-1.029x the TFLOP/s of a program per
# tile (N = 1024 and 2048, the lengths measured); at d = 128 causal 0.96-0.98x, and without a mask a program per
# tile with fresh slices (_fresh_slices) took 0.97-0.98x the dK/dV kernel time of the persistent walk; absent: never.
# Packed documents keep a program per tile (measured at d = 128 causal: 1.045x the fwd+bwd time). docs/kernels.md,
# the backward.
PERSISTENT_MAX_SEQ: dict[tuple[int, bool], int] = {(64, False): 4096, (64, True): 4096}


def walks_persistent(cfg: dict[str, Any], head_dim: int, causal: bool, longest: int, varlen: bool) -> bool:
    """Whether the one pass takes its tiles over a persistent walk at this key length: PERSISTENT where forced,
    else PERSISTENT_MAX_SEQ's rule (never over packed documents)."""
    if not cfg.get("ONE_PASS"):
        return False
    forced = cfg.get("PERSISTENT")
    if forced is not None:
        return bool(forced)
    return not varlen and longest < PERSISTENT_MAX_SEQ.get((head_dim, bool(causal)), 0)


def zeroes_ahead(head_dim: int, causal: bool, longest: int) -> bool:
    """Whether the one pass zeroes dQ's accumulator itself by default at this key length (ZERO_MIN_SEQ)."""
    least = ZERO_MIN_SEQ.get((head_dim, bool(causal)))
    return least is not None and longest >= least


def smem_bytes(cfg: dict[str, Any], head_dim: int) -> int:
    """K and V slices of every consumer, the ring of Q and dO tiles (16-bit) with their LSE and D rows (fp32);
    ONE_PASS: two slots of dS and dQ's fp32 staging tiles, and _zero_issue's zero box where it fits."""
    return _smem_base(cfg, head_dim) + (ZERO_BOX * cfg["BLOCK_M"] if zero_box(cfg, head_dim) else 0)


# _zero_issue's zero box: [BLOCK_M, 32] fp32, bytes per row
ZERO_BOX = 4 * 32


def zero_box(cfg: dict[str, Any], head_dim: int) -> bool:
    """Whether the one pass zeroes dQ's accumulator itself (_zero_issue): its zero box fits beside the rest (not
    with three stages at d = 128); else the preprocess zeroes all of it."""
    fits = _smem_base(cfg, head_dim) + ZERO_BOX * cfg["BLOCK_M"] <= flash_ws.SMEM_LIMIT
    return bool(cfg.get("ONE_PASS")) and fits


def _smem_base(cfg: dict[str, Any], head_dim: int) -> int:
    ds = (
        2 * 2 * cfg["NUM_WG"] * KEYS * cfg["BLOCK_M"] + 4 * cfg["BLOCK_M"] * head_dim
        if cfg.get("ONE_PASS")
        else 0
    )
    stats = 2 * 4 * cfg["STAGES"] * cfg["BLOCK_M"]
    return 2 * head_dim * (2 * cfg["NUM_WG"] * KEYS + 2 * cfg["STAGES"] * cfg["BLOCK_M"]) + ds + stats


def supported(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    window: tuple[int, int] | None,
    cfg: dict[str, Any],
) -> str | None:
    """None if this kernel can run the dK/dV pass of these inputs, else why not (one line)."""
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if window is not None:
        return "sliding windows run on the tl kernel"
    why = flash_ws.input_refusal(
        {"q": q, "k": k, "v": v, "dO": do}, causal, cfg["BLOCK_M"], cfg["NUM_WG"] * KEYS, HEAD_DIMS
    )
    return why or smem_refusal(cfg, q.shape[-1])


def smem_refusal(cfg: dict[str, Any], head_dim: int) -> str | None:
    """Why `cfg` does not fit an H100's shared memory at this head dim (None: it fits)."""
    if smem_bytes(cfg, head_dim) > flash_ws.SMEM_LIMIT:
        need, limit = smem_bytes(cfg, head_dim) // 1024, flash_ws.SMEM_LIMIT // 1024
        return f"config needs {need} KiB of shared memory (at most {limit})"
    return None


if HAVE_GLUON:

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """TMA's reduce-add of a shared-memory tile into global memory (cp.reduce.async.bulk.tensor .add), as
        FlashAttention-3 accumulates dQ. Triton 3.6 has the op (tl's descriptor atomic_add) but Gluon exposes no
        call for it; this is async_copy_shared_to_global's builtin with the reduce op. tma.store_wait waits for it."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(
            _ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
        )

    @gluon.jit
    def _producer(
        descs,
        smem,
        bars,
        sched,
        docs,
        zero,  # ZERO: _zero_issue's
        grid,  # (parts, units): the program grid [key blocks, units] that tiles stand for
        BLOCK_N: gl.constexpr,
        CAUSAL: gl.constexpr,
        VARLEN: gl.constexpr,
        ZERO: gl.constexpr,  # ONE_PASS: zero a later unit's dQ accumulator (_zero_issue)
        BEHIND: gl.constexpr,  # ONE_PASS: let the conversion behind this kernel launch (launch_dependents)
        PERSIST: gl.constexpr,  # take tiles from the walk's counter (_claim) until none is left
    ):
        """One warp: per tile (a program of the grid, or PERSIST one the program claims), this consumer's K and V
        slices once, then Q, dO, LSE and D of each query block into ring stage i % STAGES once every consumer has
        released it (empty[s]). ZERO: after its walk's last load, its part of a later unit's dQ accumulator
        (_zero_issue), counted once written (_zero_count). BEHIND: first, let dQ's conversion launch behind the
        kernel (it takes SMs as the grid's last programs leave them)."""
        if BEHIND:
            launch_dependents()
        if ZERO and PERSIST:
            _zero_fill(zero)
        if PERSIST:
            tiles = grid[0] * grid[1]
            tc = 0
            it = 0
            prev = (0, -1, grid[0], grid[1])  # the tile before, whose zeroing is counted in this one (none)
            t = _claim(zero, grid)
            while t < tiles:
                _hand_out(bars, docs, t, tc)
                tile = _walk_tile(t, grid)
                it = _produce_tile(
                    descs,
                    smem,
                    bars,
                    sched,
                    docs,
                    zero,
                    tile,
                    prev,
                    tc,
                    it,
                    BLOCK_N,
                    CAUSAL,
                    VARLEN,
                    ZERO,
                    True,
                )
                prev = tile
                tc += 1
                t = _claim(zero, grid)
            _hand_out(bars, docs, tiles, tc)  # the end of the walk
            if ZERO:
                _zero_count(zero, prev)
        else:
            tile = _grid_tile()
            _produce_tile(
                descs, smem, bars, sched, docs, zero, tile, tile, 0, 0, BLOCK_N, CAUSAL, VARLEN, ZERO, False
            )

    @gluon.jit
    def _produce_tile(
        descs,
        smem,
        bars,
        sched,
        docs,
        zero,
        tile,
        prev,
        tc,
        it,
        BLOCK_N: gl.constexpr,
        CAUSAL: gl.constexpr,
        VARLEN: gl.constexpr,
        ZERO: gl.constexpr,
        PERSIST: gl.constexpr,
    ):
        """The producer's work on one tile, its tc-th, whose first query block is the ring's it-th: returns the
        ring's count after it. PERSIST: the tile's first ring stages are loaded before its K and V, which wait
        until the last tile's dK and dV have left through their buffers (kv_free); the zeroing issued at the end
        of the tile before (prev) is counted between them, once written (waiting for its writes at the end of
        that tile held this tile's first loads back)."""
        _, _, kd, vd, _, _ = descs
        k_smem, v_smem, q_smem, _, _, _, _ = smem
        kv_bar = bars[0]
        kv_free = bars[5]
        H, GROUP, N_Q, N_K = sched
        NUM_WG: gl.constexpr = k_smem.shape[0]
        STAGES: gl.constexpr = q_smem.shape[0]
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        HEAD_DIM: gl.constexpr = q_smem.shape[2]
        if VARLEN:  # [total, heads * D]: a head is a column block
            nb, kv_h, k_row, _, q_row, n_q, walk = _document(sched, docs, tile, BLOCK_N, BLOCK_M, CAUSAL)
            kv_row = k_row + nb * BLOCK_N
            kv_col = kv_h * HEAD_DIM
        else:
            nb = tile[0]
            walk = _walk(sched, tile, BLOCK_N, BLOCK_M, CAUSAL)
            kv_row = tile[1] * N_K + nb * BLOCK_N
            kv_col = 0
            q_row = 0  # _produce_block reads the rows of the documents only
            n_q = 0
        n = GROUP * walk[2]
        first = 0
        if PERSIST:
            first = gl.minimum(n, STAGES)
        for i in range(first):
            _produce_block(i, it, nb, walk, q_row, n_q, N_Q, descs, smem, bars, VARLEN)
        if PERSIST:
            if ZERO:
                _zero_count(zero, prev)
            mbarrier.wait(kv_free, (tc & 1) ^ 1)
        mbarrier.expect(kv_bar, 2 * NUM_WG * kd.block_type.nbytes)
        for w in gl.static_range(NUM_WG):
            coord = [kv_row + w * 64, kv_col]
            tma.async_copy_global_to_shared(kd, coord, kv_bar, k_smem.index(w))
            tma.async_copy_global_to_shared(vd, coord, kv_bar, v_smem.index(w))
        for i in range(first, n):
            _produce_block(i, it, nb, walk, q_row, n_q, N_Q, descs, smem, bars, VARLEN)
        if ZERO:  # its last stages loading, the consumers have steps to go
            _zero_issue(zero, sched, tile, BLOCK_M, HEAD_DIM, VARLEN, not PERSIST)
            if not PERSIST:
                _zero_count(zero, tile)
        return it + n

    @gluon.jit
    def _produce_block(i, it, nb, walk, q_row, n_q, N_Q, descs, smem, bars, VARLEN: gl.constexpr):
        """The tile's i-th query block into the ring's stage (it + i) % STAGES (_load_block)."""
        BLOCK_M: gl.constexpr = smem[2].shape[1]
        HEAD_DIM: gl.constexpr = smem[2].shape[2]
        m, stat_row = _block(i, walk, nb, N_Q, BLOCK_M)
        if VARLEN:
            coord = _packed_box(i, m, walk, q_row, BLOCK_M, HEAD_DIM)
            _load_block(it + i, coord, stat_row + q_row, n_q - m * BLOCK_M, descs, smem, bars, True)
        else:
            _load_block(it + i, (stat_row, 0), stat_row, 0, descs, smem, bars, False)

    @gluon.jit
    def _grid_tile():
        """A program of the grid [key blocks, units] as a tile: (part, unit, parts, units)."""
        return gl.program_id(0), gl.program_id(1), gl.num_programs(0), gl.num_programs(1)

    @gluon.jit
    def _walk_tile(t, grid):
        """PERSIST: the walk's t-th tile as a tile (part, unit, parts, units): the grid's programs in their order."""
        return t % grid[0], t // grid[0], grid[0], grid[1]

    @gluon.jit
    def _claim(zero, grid):
        """PERSIST: the walk's next tile, from the counter after the units' counts (ZQ[2 * units], set to 0 by the
        preprocess): the programs take tiles as they free up, in the grid's order, as the hardware hands out a
        grid's programs; only the count is shared (relaxed)."""
        return gl.atomic_add(zero[2] + 2 * grid[1], 1, sem="relaxed", scope="gpu")

    @gluon.jit
    def _hand_out(bars, docs, t, tc):
        """PERSIST: tile t, the program's tc-th, to the other partitions through slot tc % 2 (tile_full), once
        they have read the tile before it there (tile_free); every lane's store before the arrival."""
        tile_full, tile_free = bars[6], bars[7]
        slot = docs[6].index(tc % 2)
        mbarrier.wait(tile_free.index(tc % 2), ((tc // 2) & 1) ^ 1)
        put_tile(slot, t)
        gl.thread_barrier()
        mbarrier.arrive(tile_full.index(tc % 2))

    @gluon.jit
    def _take(bars, docs, tc):
        """PERSIST: the program's tc-th tile (_hand_out's, flash_ws_parts.take_tile), then its slot freed."""
        tile_full, tile_free = bars[6], bars[7]
        slot = docs[6].index(tc % 2)
        t = take_tile(tile_full.index(tc % 2), slot, tc // 2)
        mbarrier.arrive(tile_free.index(tc % 2))
        return t

    @gluon.jit
    def _walk(sched, tile, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
        """The query blocks every partition of tile (key block, batch * K/V head) walks, as (head0, lo, n_m): rows
        of query head head0 + j (Q viewed as [B * H * N_Q, D]) for the GQA group's j < GROUP, blocks lo .. lo +
        n_m - 1 of each (causal: from the first block that sees one of the tile's keys). The tiles (a grid [key
        blocks, B * H_KV], or a persistent walk in that order) start one K/V head after another."""
        H, GROUP, N_Q, N_K = sched
        nb = tile[0]
        bkv = tile[1]
        lo = 0
        if CAUSAL:
            lo = gl.maximum(nb * BLOCK_N - (N_K - N_Q), 0) // BLOCK_M
        head0 = (bkv // (H // GROUP)) * H + (bkv % (H // GROUP)) * GROUP
        return head0, lo, N_Q // BLOCK_M - lo

    @gluon.jit
    def _document(sched, docs, tile, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
        """VARLEN: tile's place in the packed batch, (nb, kv_h, k_row, n_k, q_row, n_q, walk): key block nb of the
        document whose keys are rows k_row .. k_row + n_k - 1 of the packed K and V and whose queries rows q_row
        .. q_row + n_q - 1 of Q, K/V head kv_h (the tile's unit); found on the device by common.document_block's
        walk over the keys (flash_ws_parts.document_block) at the tile's part, so a launch reads nothing on the
        host. walk as _walk's, over the document's query blocks: BLOCK_M rows from q_row, the last may run into
        the next document (causal: bottom-right by the document's lengths). Rows past cu_seqlens_k[-1] are one
        more document with no queries (their dK, dV are stored as zeros); a walk position past the last block
        gets n_k = n_q = 0."""
        H, GROUP, N_Q, N_K = sched
        CU_Q = docs[0]
        CU_K = docs[1]
        NUM_DOCS = docs[2]
        k_row, n_k, nb, q_row, n_q = document_block(CU_K, NUM_DOCS, N_K, tile[0], BLOCK_N, False, CU_Q, N_Q)
        n_q = gl.where(n_k > 0, n_q, 0)
        kv_h = tile[1]
        lo = 0
        if CAUSAL:
            lo = gl.maximum(nb * BLOCK_N - (n_k - n_q), 0) // BLOCK_M
        return nb, kv_h, k_row, n_k, q_row, n_q, (kv_h * GROUP, lo, gl.cdiv(n_q, BLOCK_M) - lo)

    @gluon.jit
    def _block(i, walk, spin, N_Q, BLOCK_M: gl.constexpr):
        """The program's i-th query block of `walk` (_walk), as (block index m, its first row): query head
        head0 + i // n_m, block lo + (i % n_m + spin) % n_m (spin: the program's key block, where its walk
        starts)."""
        head0, lo, n_m = walk
        m = lo + (i % n_m + spin) % n_m
        return m, (head0 + i // n_m) * N_Q + m * BLOCK_M

    @gluon.jit
    def _packed_box(i, m, walk, q_row, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):
        """VARLEN: the box of the program's i-th query block m (_block's) in a [total, heads * D] view of Q, dO or
        dQ's accumulator: the document's rows from q_row, query head walk[0] + i // n_m's column block."""
        return q_row + m * BLOCK_M, (walk[0] + i // walk[2]) * HEAD_DIM

    @gluon.jit
    def _load_block(i, coord, stat_row, rows_left, descs, smem, bars, VARLEN: gl.constexpr):
        """Q and dO of the program's i-th query block (its box at `coord` of Q's and dO's descriptors) by TMA, its
        LSE and D (from `stat_row` of [B * H, N_Q]) by the warp's loads, into ring stage i % STAGES once every
        consumer has released it (empty[s]). VARLEN: the rows from rows_left on are past the document (another
        document's, or past the tensor): their LSE2 is taken as +inf and D as 0, so their P^T and dS^T columns
        are exact zeros (exp2(s - inf) = 0, 0 * finite = 0) and they add nothing to dK, dV, or to the dQ rows
        of the other document (a reduce-add of zeros). The consumers read LSE and D
        from shared memory where they use them: loaded from global memory into their registers ahead of a
        matmul's wait (16 values of each per thread), they cost the consumers' loop its spills at d = 128 and
        the backward 4-13% of its time on an H100 (docs/kernels.md, the backward)."""
        qd, dod, _, _, LSE, DELTA = descs
        _, _, q_smem, do_smem, _, _, stats = smem
        _, ready, empty, _, _ = bars
        STAGES: gl.constexpr = q_smem.shape[0]
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        rows: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
        s = i % STAGES
        offs = stat_row + gl.arange(0, BLOCK_M, rows)
        if VARLEN:
            inside = gl.arange(0, BLOCK_M, rows) < rows_left
            lse = gl.load(LSE + offs, mask=inside, other=float("inf"))
            delta = gl.load(DELTA + offs, mask=inside, other=0.0)
        else:
            lse = gl.load(LSE + offs)
            delta = gl.load(DELTA + offs)
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        stats.index(s).store(lse)
        stats.index(STAGES + s).store(delta)
        gl.thread_barrier()  # every lane's stores before the arrive below
        mbarrier.expect(ready.index(s), 2 * qd.block_type.nbytes)
        tma.async_copy_global_to_shared(qd, coord, ready.index(s), q_smem.index(s))
        tma.async_copy_global_to_shared(dod, coord, ready.index(s), do_smem.index(s))

    @gluon.constexpr_function
    def _fresh_slices(head_dim, causal, varlen):
        """Whether the one pass indexes K's and V's slices anew in each step (_fresh): over a uniform batch at d =
        128 without a mask. There the held descriptors spilled ([3, 0, 7] spill loads and stores per step in the
        three matmul loops, [1, 0, 0] fresh), and fresh the dK/dV kernel took 0.966-0.985x the time; causal or at d
        = 64 it took 1.02-1.08x, and the packed fwd+bwd 1.00x (docs/kernels.md, the backward)."""
        return head_dim == 128 and not causal and not varlen

    @gluon.jit
    def _fresh(value: gl.constexpr):
        """value as an int32 made where this is called, by an asm move with side effects the compiler can neither
        hoist nor fold. A shared-memory buffer indexed by it in a loop has its wgmma descriptors made in each step
        (a few uniform adds) instead of made once and held through the loop: held, they spilled in every step of
        the one pass at d = 128 (docs/kernels.md, the backward)."""
        return gl.inline_asm_elementwise(f"mov.u32 $0, {value};", "=r", [], gl.int32, False, 1)

    @gluon.jit
    def _probs(
        st, lse, qk_scale, m, keys, cols, causal_off, key_end, CAUSAL: gl.constexpr, KEY_END: gl.constexpr
    ):
        """P^T = exp2(S^T * qk_scale - LSE2) of query block m; causal: zero where a key is after its query, on
        every block without a branch (past the diagonal it keeps every key). KEY_END (VARLEN without CAUSAL):
        zero for keys from key_end on (the next document's, where the program's last block runs into it);
        under a causal mask the diagonal does it (no query of the document sees a key past its last)."""
        pt = gl.exp2(st * qk_scale - lse[None, :])
        if CAUSAL:
            pt = gl.where((keys - m * cols.shape[0] - causal_off)[:, None] <= cols[None, :], pt, 0.0)
        if KEY_END:
            pt = gl.where((keys < key_end)[:, None], pt, 0.0)
        return pt

    @gluon.jit
    def _consumer(
        smem,
        bars,
        io,  # (dkd, dvd, qk_scale, sm_scale): descriptors of dK and dV ([B * H_KV * N_K, D], block [64, D]),
        # sm_scale * log2(e), sm_scale
        sched,
        docs,  # VARLEN: (CU_Q, CU_K, NUM_DOCS, DK, DV, doc_smem, tile slots); else the tile slots at [6]
        grid,
        WG: gl.constexpr,
        BLOCK_N: gl.constexpr,
        CAUSAL: gl.constexpr,
        ONE_PASS: gl.constexpr,
        VARLEN: gl.constexpr,
        PERSIST: gl.constexpr,
    ):
        """Consumer warpgroup WG: keys [WG * 64, WG * 64 + 64) of each tile's block (_consume_tile); PERSIST, of
        every tile the producer hands out (_take)."""
        if PERSIST:
            tc = 0
            it = 0
            t = _take(bars, docs, tc)
            while t < grid[0] * grid[1]:
                tile = _walk_tile(t, grid)
                it = _consume_tile(
                    smem, bars, io, sched, docs, tile, tc, it, WG, BLOCK_N, CAUSAL, ONE_PASS, VARLEN, True
                )
                tc += 1
                t = _take(bars, docs, tc)
        else:
            _consume_tile(
                smem, bars, io, sched, docs, _grid_tile(), 0, 0, WG, BLOCK_N, CAUSAL, ONE_PASS, VARLEN, False
            )

    @gluon.jit
    def _consume_tile(
        smem,
        bars,
        io,
        sched,
        docs,
        tile,
        tc,
        it,
        WG: gl.constexpr,
        BLOCK_N: gl.constexpr,
        CAUSAL: gl.constexpr,
        ONE_PASS: gl.constexpr,
        VARLEN: gl.constexpr,
        PERSIST: gl.constexpr,
    ):
        """Consumer warpgroup WG on one tile, the program's tc-th, whose first query block is the ring's it-th;
        returns the ring's count after it. Each query block's matmuls are waited for within its step: issuing the
        next block's S^T and dP^T behind this block's dK (software pipelining) measured slower on an H100
        (docs/kernels.md, the backward). ONE_PASS: it also stores its dS slice [BLOCK_M, 64] to slot i % 2 of
        ds_smem for the dQ warpgroup (_dq_partition). PERSIST: once its dK and dV have left K's and V's buffers,
        it frees them for the next tile's (kv_free)."""
        k_smem, v_smem, q_smem, do_smem, ds_smem, _, stats = smem
        kv_bar = bars[0]
        ready = bars[1]
        empty = bars[2]
        ds_full = bars[3]
        ds_free = bars[4]
        dkd, dvd, qk_scale, sm_scale = io
        H, GROUP, N_Q, N_K = sched
        STAGES: gl.constexpr = q_smem.shape[0]
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        HEAD_DIM: gl.constexpr = q_smem.shape[2]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16]
        )
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        key_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        two: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])

        if VARLEN:  # keys and queries counted from the document's first (k_row, q_row)
            nb, _, k_row, n_k, _, n_q, walk = _document(sched, docs, tile, BLOCK_N, BLOCK_M, CAUSAL)
            n0 = nb * BLOCK_N
            causal_off = n_k - n_q
            # The epilogue's place in the batch kept in shared memory through the loop: in registers it cost the
            # second consumer loads from local memory in every step, and found again at the end it put a round
            # trip to memory before every program's stores (docs/kernels.md, packed documents).
            DK = docs[3]
            DV = docs[4]
            doc_smem = docs[5]
            pair = gl.arange(0, 2, two)
            doc_smem.index(WG).store(gl.where(pair == 0, k_row, n_k))
        else:
            nb = tile[0]
            bkv = tile[1]
            n0 = nb * BLOCK_N
            causal_off = N_K - N_Q
            walk = _walk(sched, tile, BLOCK_N, BLOCK_M, CAUSAL)
            n_k = N_K
        KEY_END: gl.constexpr = VARLEN and not CAUSAL
        my_n0 = n0 + WG * 64
        keys = my_n0 + gl.arange(0, 64, key_s)
        k = k_smem.index(WG)
        v = v_smem.index(WG)
        zero = gl.zeros([64, BLOCK_M], gl.float32, s_layout)
        dk = gl.zeros([64, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([64, HEAD_DIM], gl.float32, acc_layout)
        cols = gl.arange(0, BLOCK_M, col_s)
        zero_cols = gl.zeros([BLOCK_M], gl.float32, col_s)
        # The one pass's order at d = 128 and at d = 64 without a mask. At d = 64 the two-pass order fits the
        # registers, and causal it measured 1.10x faster on an H100 (N = 2048-8192; non-causal 1.02-1.05x slower).
        LEAN: gl.constexpr = ONE_PASS and (HEAD_DIM == 128 or not CAUSAL)
        # The packed causal build starts S^T's accumulator at -LSE / scale, so P^T = exp2(S^T * scale): its dK/dV
        # pass 0.965x the time on one H100 and 1.00x on another (8 x 2048 tokens, d = 128), with fewer spills;
        # uniform or without a mask it lost (docs/kernels.md)
        LINIT: gl.constexpr = LEAN and CAUSAL and VARLEN
        mbarrier.wait(kv_bar, tc & 1)
        # VARLEN and CAUSAL: _block's query block, (i % n_m + nb) % n_m past lo, counted on (j) rather than
        # divided for in every step (two integer divisions by a runtime n_m): the packed causal dK/dV pass ran
        # 0.95-0.97x the time at d = 64 and 128, 8 x 2048 tokens, on an H100, the uniform one 1.01-1.04x, so that
        # keeps the division, and so does the packed pass without a mask (not timed; docs/kernels.md)
        COUNT: gl.constexpr = VARLEN and CAUSAL
        FRESH: gl.constexpr = _fresh_slices(HEAD_DIM, CAUSAL, VARLEN)
        j = nb % gl.maximum(walk[2], 1)
        for i in range(GROUP * walk[2]):
            g = it + i  # the ring's count and dS's, over the program's tiles
            if COUNT:
                m = walk[1] + j
                j = gl.where(j + 1 == walk[2], 0, j + 1)
            else:
                m = _block(i, walk, nb, N_Q, BLOCK_M)[0]
            s = g % STAGES
            q = q_smem.index(s)
            do = do_smem.index(s)
            if FRESH:
                wg = _fresh(WG)
                k_step = k_smem.index(wg)
                v_step = v_smem.index(wg)
            else:
                k_step = k
                v_step = v
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            if LINIT:  # S^T - LSE / scale from the matmul
                lse = stats.index(s).load(col_s)
                st = warpgroup_mma(
                    k_step,
                    q.permute((1, 0)),
                    zero - lse[None, :] * (1.0 / qk_scale),
                    use_acc=True,
                    is_async=True,
                )
            else:
                st = warpgroup_mma(k_step, q.permute((1, 0)), zero, use_acc=False, is_async=True)
            if LEAN:
                # One score tile in flight at a time, and dV issued once dS^T is made: at 208-216 registers
                # the two-pass order (S^T and dP^T at once, dV before dS^T) spills in the loop at d = 128.
                st = warpgroup_mma_wait(0, deps=[st])
                lse = zero_cols if LINIT else stats.index(s).load(col_s)  # LINIT: in S^T already
                pt = _probs(st, lse, qk_scale, m, keys, cols, causal_off, n_k, CAUSAL, KEY_END)
                # dP^T - D from the matmul: its accumulator starts at -D. Loaded after dP^T's wait, D's 16 values
                # came in one shared-memory load after another, each waited for by its subtraction (ptxas kept
                # one register for them), on the step's critical path.
                delta = stats.index(STAGES + s).load(col_s)
                dpt = warpgroup_mma(
                    v_step, do.permute((1, 0)), zero - delta[None, :], use_acc=True, is_async=True
                )
                dpt = warpgroup_mma_wait(0, deps=[dpt])
                dst = pt * dpt
                dv = warpgroup_mma(gl.convert_layout(pt.to(q.dtype), a_layout), do, dv, is_async=True)
            else:
                dpt = warpgroup_mma(v_step, do.permute((1, 0)), zero, use_acc=False, is_async=True)
                st = warpgroup_mma_wait(1, deps=[st])  # in order: S^T is done, dP^T may not be
                pt = _probs(
                    st, stats.index(s).load(col_s), qk_scale, m, keys, cols, causal_off, n_k, CAUSAL, KEY_END
                )
                dv = warpgroup_mma(gl.convert_layout(pt.to(q.dtype), a_layout), do, dv, is_async=True)
                dpt = warpgroup_mma_wait(1, deps=[dpt])  # dP^T is done, dV may not be
                delta = stats.index(STAGES + s).load(col_s)
                dst = pt * (dpt - delta[None, :])
            dk = warpgroup_mma(gl.convert_layout(dst.to(q.dtype), a_layout), q, dk, is_async=True)
            if ONE_PASS:  # dS to shared memory for the dQ warpgroup
                slot = g % 2
                mbarrier.wait(ds_free.index(slot), ((g // 2) & 1) ^ 1)
                ds_smem.index(slot * 2 + WG).store(gl.permute(dst.to(q.dtype), (1, 0)))
                fence_async_shared()
                mbarrier.arrive(ds_full.index(slot))
            dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
            mbarrier.arrive(empty.index(s))  # Q and dO of this block are no longer read
        # Epilogue: the slices' K and V are no longer read (ONE_PASS: once the dQ warpgroup is done with the last
        # block's dS K); dK and dV leave through them.
        if ONE_PASS:
            last = it + GROUP * walk[2] - 1
            if last >= it:
                mbarrier.wait(ds_free.index(last % 2), (last // 2) & 1)
        if VARLEN:
            # A TMA store stops only at the tensor's end: the warpgroup whose keys run past the document's last
            # (at most one per document and K/V head) stores its rows inside it through masked pointer stores
            # (none where all its keys lie past it); the others by TMA.
            kept = doc_smem.index(WG).load(two)
            k_row = gl.sum(gl.where(pair == 0, kept, 0), 0)
            n_k = gl.sum(gl.where(pair == 1, kept, 0), 0)
            col = tile[1] * HEAD_DIM
            if n_k - my_n0 >= 64:
                _store_tile(dk * sm_scale, dv, k, v, dkd, dvd, (k_row + my_n0, col))
            else:
                width = (H // GROUP) * HEAD_DIM
                keep = gl.arange(0, 64, key_s) < n_k - my_n0
                store_rows((dk * sm_scale).to(dkd.dtype), DK, k_row + my_n0, col, keep, width)
                store_rows(dv.to(dvd.dtype), DV, k_row + my_n0, col, keep, width)
        else:
            out_row = bkv * N_K + my_n0
            k.store((dk * sm_scale).to(dkd.dtype))
            v.store(dv.to(dvd.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dkd, [out_row, 0], k)
            tma.async_copy_shared_to_global(dvd, [out_row, 0], v)
            tma.store_wait(0)
        if PERSIST:  # every thread past its stores' reads of K's and V's buffers
            gl.thread_barrier()
            mbarrier.arrive(bars[5])
        return it + GROUP * walk[2]

    @gluon.jit
    def _store_tile(dk, dv, k, v, dkd, dvd, coord):
        """VARLEN: dK and dV of a warpgroup's 64 keys out through its K and V slices by TMA at coord."""
        k.store(dk.to(dkd.dtype))
        v.store(dv.to(dvd.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkd, coord, k)
        tma.async_copy_shared_to_global(dvd, coord, v)
        tma.store_wait(0)

    @gluon.jit
    def _bulk_writes_done():
        """Wait until this thread's TMA stores have written global memory (cp.async.bulk.wait_group, where
        tma.store_wait waits only for their reads of shared memory), and order them before its later accesses
        through either proxy (fence.proxy.async)."""
        gl.inline_asm_elementwise(
            "cp.async.bulk.wait_group 0;\nfence.proxy.async.global;\nmov.u32 $0, 0;",
            "=r",
            [],
            gl.int32,
            False,
            1,
        )

    @gluon.jit
    def _count_written(counter):
        """Add 1 to *counter (release) once this thread's TMA stores and reduce-adds have written global memory and
        every thread of the partition is past this point: what a program's count tells whoever acquires it."""
        _bulk_writes_done()
        gl.thread_barrier()
        gl.atomic_add(counter, 1, sem="release", scope="gpu")

    @gluon.jit
    def _zero_issue(
        zero,
        sched,
        tile,
        BLOCK_M: gl.constexpr,
        HEAD_DIM: gl.constexpr,
        VARLEN: gl.constexpr,
        FILL: gl.constexpr,
    ):
        """dQ's accumulator zeroed ZERO_AHEAD grid rows ahead of the programs that add into it, by the programs
        themselves (their producer warps' TMA stores), where the preprocess, a bandwidth-bound kernel, zeroed all
        of it. A grid row (a unit) holds the programs of one batch and K/V head (VARLEN: of one K/V head), and
        they add dQ into a region of their own: the rows of its GROUP query heads (VARLEN: every row of their
        columns). Program (p, u) zeroes part p of unit u + AHEAD's region (its 64-row boxes split evenly over the
        unit's programs) from a zero tile (FILL: written first; else _zero_fill wrote it once); _zero_count counts
        them once written, and _zero_wait holds a unit's reduce-adds until its count is whole. The units below
        AHEAD are zeroed by the preprocess. tile: (part, unit, parts, units), a program of the grid or a tile of a
        persistent walk."""
        dqd, zero_smem, ZQ, AHEAD = zero
        H, GROUP, N_Q, N_K = sched
        part, unit, parts, units = tile
        target = unit + AHEAD
        if target < units:
            if VARLEN:
                rows = N_Q
                cols = GROUP * HEAD_DIM
                row0 = 0
                col0 = target * cols
            else:
                rows = GROUP * N_Q
                cols = HEAD_DIM
                row0 = target * rows
                col0 = 0
            if FILL:
                _zero_fill(zero)
            boxes = gl.cdiv(rows, BLOCK_M)
            across = cols // 32
            for t in range(part * boxes // parts * across, (part + 1) * boxes // parts * across):
                tma.async_copy_shared_to_global(
                    dqd, [row0 + t // across * BLOCK_M, col0 + t % across * 32], zero_smem
                )

    @gluon.jit
    def _zero_fill(zero):
        """_zero_issue's zero tile, 8 rows at a time (one warp), ordered before the TMA stores that read it."""
        zero_smem = zero[1]
        ROWS: gl.constexpr = zero_smem.shape[0]
        eight: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [1, 1], [1, 0])
        for r in gl.static_range(0, ROWS, 8):
            zero_smem.slice(r, 8).store(gl.zeros([8, 32], gl.float32, eight))
        fence_async_shared()

    @gluon.jit
    def _zero_count(zero, tile):
        """_zero_issue's stores counted (ZQ[2 * its unit], release) once they have written global memory."""
        _, _, ZQ, AHEAD = zero
        target = tile[1] + AHEAD
        if (tile[1] >= 0) & (target < tile[3]):  # unit -1: no tile
            _count_written(ZQ + 2 * target)

    @gluon.jit
    def _zero_wait(zero, tile):
        """Before the program's first reduce-add: its unit's accumulator zeroed (_zero_issue), by the preprocess
        below AHEAD, else by unit u - AHEAD's programs, whose count this waits for (acquire; the preprocess sets
        the counts to 0 before the launch). The grid starts in order, so those programs started at least AHEAD -
        1 units of programs before this one (zero_ahead puts that past two waves of the SMs) and zeroed at the end
        of their walks: the wait is one read. Forced closer (ZERO_AHEAD), it may spin until they end; the programs
        it waits for have started, so it never waits on one that cannot run. A persistent walk takes its tiles in
        the grid's order, so the same holds of the tiles."""
        _, _, ZQ, AHEAD = zero
        unit = tile[1]
        if unit >= AHEAD:
            parts = tile[2]
            seen = gl.atomic_add(ZQ + 2 * unit, 0, sem="acquire", scope="gpu")
            while seen < parts:
                seen = gl.atomic_add(ZQ + 2 * unit, 0, sem="acquire", scope="gpu")
            _bulk_writes_done()  # the zeros ordered before this program's reduce-adds (the async proxy)

    @gluon.jit
    def _dq_count(zero, tile):
        """The end of the dQ warpgroup: its reduce-adds counted (ZQ[2 * unit + 1], release) once they have written
        global memory. backward._dq_convert, launched behind this kernel, converts a unit's accumulator to dQ's
        dtype once the count of its programs is whole: while the last programs of the grid run, the SMs they have
        left convert the units already done."""
        _, _, ZQ, _ = zero
        _count_written(ZQ + 2 * tile[1] + 1)

    @gluon.jit
    def _dq_partition(
        smem,
        bars,
        dqd,  # descriptor of the zeroed fp32 dQ ([B * H * N_Q, D], block [BLOCK_M, 64]) that dQ is added into
        sched,
        docs,
        sm_scale,
        zero,  # (dqd, zero tile, ZQ, AHEAD): _zero_issue's
        grid,
        BLOCK_N: gl.constexpr,
        CAUSAL: gl.constexpr,
        VARLEN: gl.constexpr,
        ZERO: gl.constexpr,  # _zero_issue zeroes the accumulator: wait for it (_zero_wait)
        BEHIND: gl.constexpr,  # count the program's reduce-adds once written (_dq_count)
        PERSIST: gl.constexpr,
    ):
        """ONE_PASS's dQ warpgroup (_dq_tile) on each tile: the program's, or PERSIST every tile the producer hands
        out (_take)."""
        if PERSIST:
            tc = 0
            it = 0
            t = _take(bars, docs, tc)
            while t < grid[0] * grid[1]:
                tile = _walk_tile(t, grid)
                it = _dq_tile(
                    smem,
                    bars,
                    dqd,
                    sched,
                    docs,
                    sm_scale,
                    zero,
                    tile,
                    tc,
                    it,
                    BLOCK_N,
                    CAUSAL,
                    VARLEN,
                    ZERO,
                    BEHIND,
                    True,
                )
                tc += 1
                t = _take(bars, docs, tc)
        else:
            _dq_tile(
                smem,
                bars,
                dqd,
                sched,
                docs,
                sm_scale,
                zero,
                _grid_tile(),
                0,
                0,
                BLOCK_N,
                CAUSAL,
                VARLEN,
                ZERO,
                BEHIND,
                False,
            )

    @gluon.jit
    def _dq_tile(
        smem,
        bars,
        dqd,
        sched,
        docs,
        sm_scale,
        zero,
        tile,
        tc,
        it,
        BLOCK_N: gl.constexpr,
        CAUSAL: gl.constexpr,
        VARLEN: gl.constexpr,
        ZERO: gl.constexpr,
        BEHIND: gl.constexpr,
        PERSIST: gl.constexpr,
    ):
        """The dQ warpgroup on one tile, the program's tc-th, whose first dS slot is the it-th: per query block i,
        once both consumers have stored their dS slices (ds_full), dQ = dS K over the tile's 128 keys (K
        resident), 64 columns at a time (32 fp32 registers); once the matmul is done, dS slot (it + i) % 2 is free
        (ds_free), and the columns leave through a staging tile by a TMA reduce-add. The consumers never wait for
        this matmul. VARLEN: dqd is over [total_q, H * D], dQ's own layout (a head is a column block, as Q's), so
        its conversion reads it in order: a box that runs past the document adds the zero rows of dS K
        (_load_block) to the next document's rows (past the tensor, TMA drops them). Returns the slots' count
        after the tile. PERSIST: once done with K, it frees K's and V's buffers for the next tile's (kv_free)."""
        k_smem, _, q_smem, _, ds_smem, dq_smem, _ = smem
        kv_bar = bars[0]
        ds_full = bars[3]
        ds_free = bars[4]
        H, GROUP, N_Q, N_K = sched
        NUM_WG: gl.constexpr = k_smem.shape[0]
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        HEAD_DIM: gl.constexpr = q_smem.shape[2]
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]
        )
        if VARLEN:
            spin, _, _, _, q_row, _, walk = _document(sched, docs, tile, BLOCK_N, BLOCK_M, CAUSAL)
        else:
            walk = _walk(sched, tile, BLOCK_N, BLOCK_M, CAUSAL)
            spin = tile[0]
        if ZERO:
            _zero_wait(zero, tile)
        acc0 = gl.zeros([BLOCK_M, 64], gl.float32, dq_layout)
        # K as the B operand of dQ = dS K, 64 columns at a time: a [64, D] tile is stored as D / 64 column
        # blocks of [64, 64] one after another (a swizzled row holds 128 bytes)
        k_cols: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], k_smem.dtype)
        FRESH: gl.constexpr = _fresh_slices(HEAD_DIM, CAUSAL, VARLEN)
        mbarrier.wait(kv_bar, tc & 1)
        for i in range(GROUP * walk[2]):
            if VARLEN:
                row, col = _packed_box(
                    i, _block(i, walk, spin, N_Q, BLOCK_M)[0], walk, q_row, BLOCK_M, HEAD_DIM
                )
            else:
                row = _block(i, walk, spin, N_Q, BLOCK_M)[1]
                col = 0
            slot = (it + i) % 2
            mbarrier.wait(ds_full.index(slot), ((it + i) // 2) & 1)
            for c in gl.static_range(HEAD_DIM // 64):
                dq = acc0
                for w in gl.static_range(NUM_WG):
                    if FRESH:
                        kw = k_smem.index(_fresh(w))
                    else:
                        kw = k_smem.index(w)
                    kc = kw._reinterpret(k_smem.dtype, [HEAD_DIM // 64, 64, 64], k_cols).index(c)
                    dq = warpgroup_mma(ds_smem.index(slot * NUM_WG + w), kc, dq, use_acc=w > 0, is_async=True)
                dq = warpgroup_mma_wait(0, deps=[dq])
                if c == HEAD_DIM // 64 - 1:
                    mbarrier.arrive(ds_free.index(slot))
                tma.store_wait(2 * (HEAD_DIM // 64 - 1))  # the last reduces from this staging tile are done
                staging = dq_smem.index(c)
                staging.store(dq * sm_scale)
                fence_async_shared()
                # the tile is two 128-byte-swizzled [BLOCK_M, 32] halves, one reduce each
                halves = staging._reinterpret(gl.float32, [2, BLOCK_M, 32], dqd.layout)
                for h in gl.static_range(2):
                    _tma_reduce_add(dqd, [row, col + c * 64 + h * 32], halves.index(h))
        if PERSIST:  # done with K (its last matmul waited for): the next tile's may load
            mbarrier.arrive(bars[5])
        if BEHIND:
            _dq_count(zero, tile)
        else:
            tma.store_wait(0)
        return it + GROUP * walk[2]

    @gluon.jit
    def _bwd_dkdv_ws(
        qd,  # Q viewed as [B * H * N_Q, D], block [BLOCK_M, D]
        dod,  # dO, the same
        kd,  # K viewed as [B * H_KV * N_K, D], block [64, D]
        vd,  # V, the same
        dkd,  # dK out, as kd
        dvd,  # dV out, as kd
        dqd,  # ONE_PASS: the zeroed fp32 dQ that dQ is added into ([B * H * N_Q, D], block [BLOCK_M, 64]); else kd
        LSE,  # [B, H, N_Q] fp32, log2-sum-exp2 from the forward
        DELTA,  # [B, H, N_Q] fp32, rowsum(dO * O)
        H,
        GROUP,  # H // H_KV
        N_Q,
        N_K,
        qk_scale,  # sm_scale * log2(e)
        sm_scale,
        ZQ,  # ONE_PASS: int32 [grid rows, 2], set to 0 by the preprocess: _zero_issue's counts, then _dq_count's
        AHEAD,  # ONE_PASS: _zero_issue's distance in grid rows (the grid's rows: the preprocess zeroes it all)
        PARTS,  # the tiles' grid [PARTS, UNITS] (the launch's, but PERSIST): key blocks (VARLEN: walk positions)
        UNITS,  # B * H_KV (VARLEN: H_KV)
        CU_Q,  # VARLEN: int32 [NUM_DOCS + 1] prefix sums of the documents' query lengths; else None
        CU_K,  # VARLEN: the same for the keys; else None
        NUM_DOCS,  # VARLEN: documents; else None
        DK,  # VARLEN: dK [total_k, H_KV, D] (the masked stores of a document's last keys); else None
        DV,  # VARLEN: dV, the same; else None
        HEAD_DIM: gl.constexpr,
        BLOCK_M: gl.constexpr,
        NUM_WG: gl.constexpr,
        STAGES: gl.constexpr,
        CAUSAL: gl.constexpr,
        ONE_PASS: gl.constexpr,  # a third warpgroup adds dQ = dS K into dqd's tensor (_dq_partition)
        ZERO: gl.constexpr,  # ONE_PASS: the programs zero dQ's accumulator AHEAD grid rows on (_zero_issue)
        BEHIND: gl.constexpr,  # ONE_PASS: dQ's conversion runs behind the kernel (_dq_count, launch_dependents)
        CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
        DQ_REGS: gl.constexpr,
        # Packed documents (varlen_ws.py): B = 1, N_Q and N_K the packed totals; Q, dO, K, V, dK, dV are 2-D
        # [total, heads * D] (a head is a column block), dQ's accumulator too, the LSE's rows [H * total_q]; a
        # program is a key block of one document (_document)
        VARLEN: gl.constexpr,
        # ONE_PASS: a program per SM (a grid [programs]) takes the tiles of the grid [PARTS, UNITS] in its order
        # from a counter (_claim), the next tile's first Q/dO stages loading while this tile's dK and dV leave
        PERSIST: gl.constexpr,
    ):
        """One program per (NUM_WG * 64 keys, batch * K/V head); VARLEN: per (key block of a document, K/V
        head). PERSIST: one per SM, for each of those tiles in turn."""
        BLOCK_N: gl.constexpr = NUM_WG * 64
        k_smem = gl.allocate_shared_memory(kd.dtype, [NUM_WG, 64, HEAD_DIM], kd.layout)
        v_smem = gl.allocate_shared_memory(vd.dtype, [NUM_WG, 64, HEAD_DIM], vd.layout)
        q_smem = gl.allocate_shared_memory(qd.dtype, [STAGES, BLOCK_M, HEAD_DIM], qd.layout)
        do_smem = gl.allocate_shared_memory(dod.dtype, [STAGES, BLOCK_M, HEAD_DIM], dod.layout)
        if ONE_PASS:  # two slots of both consumers' dS slices [BLOCK_M, 64]; dQ's fp32 staging tiles
            ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], qd.dtype)
            ds_smem = gl.allocate_shared_memory(qd.dtype, [2 * NUM_WG, BLOCK_M, 64], ds_layout)
            dq_smem = gl.allocate_shared_memory(gl.float32, [HEAD_DIM // 64, BLOCK_M, 64], dqd.layout)
            if ZERO:
                zero_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 32], dqd.layout)  # _zero_issue's
            else:
                zero_smem = dq_smem  # unused
        else:
            ds_smem = q_smem  # unused
            dq_smem = q_smem
            zero_smem = q_smem
        # LSE of ring stage s in row s, D in row STAGES + s
        stats = gl.allocate_shared_memory(
            gl.float32, [2 * STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0])
        )
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        # PERSIST: K's and V's buffers free for the next tile (both consumers' stores out of them have read them,
        # and dQ's warpgroup is done with K: no partition can wait for a phase of kv_bar two tiles on); the tile
        # handed out through two slots (tile_full: written; tile_free: read by the consumers and dQ's warpgroup)
        kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        tile_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        tile_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        slots = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        if PERSIST:
            mbarrier.init(kv_free, count=NUM_WG + 1)
            for i in gl.static_range(2):
                mbarrier.init(tile_full.index(i), count=1)
                mbarrier.init(tile_free.index(i), count=NUM_WG + 1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=NUM_WG)
        # ONE_PASS: dS slot s is stored by both consumers (ds_full[s]), read by the dQ warpgroup (ds_free[s])
        if ONE_PASS:
            ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(2):
                mbarrier.init(ds_full.index(i), count=NUM_WG)
                mbarrier.init(ds_free.index(i), count=1)
        else:
            ds_full = empty  # unused
            ds_free = empty
        fence_async_shared()
        descs = (qd, dod, kd, vd, LSE, DELTA)
        smem = (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, stats)
        bars = (kv_bar, ready, empty, ds_full, ds_free, kv_free, tile_full, tile_free)
        grid = (PARTS, UNITS)
        io = (dkd, dvd, qk_scale, sm_scale)
        sched = (H, GROUP, N_Q, N_K)
        if VARLEN:  # each consumer's (k_row, n_k) for its epilogue
            doc_smem = gl.allocate_shared_memory(gl.int32, [NUM_WG, 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            doc_smem = stats  # unused
        docs = (CU_Q, CU_K, NUM_DOCS, DK, DV, doc_smem, slots)
        zero = (dqd, zero_smem, ZQ, AHEAD)
        if ONE_PASS:  # a fourth warpgroup: dQ
            gl.warp_specialize(
                [
                    (
                        _consumer,
                        (smem, bars, io, sched, docs, grid, 0, BLOCK_N, CAUSAL, True, VARLEN, PERSIST),
                    ),
                    (
                        _consumer,
                        (smem, bars, io, sched, docs, grid, 1, BLOCK_N, CAUSAL, True, VARLEN, PERSIST),
                    ),
                    (
                        _dq_partition,
                        (
                            smem,
                            bars,
                            dqd,
                            sched,
                            docs,
                            sm_scale,
                            zero,
                            grid,
                            BLOCK_N,
                            CAUSAL,
                            VARLEN,
                            ZERO,
                            BEHIND,
                            PERSIST,
                        ),
                    ),
                    (
                        _producer,
                        (
                            descs,
                            smem,
                            bars,
                            sched,
                            docs,
                            zero,
                            grid,
                            BLOCK_N,
                            CAUSAL,
                            VARLEN,
                            ZERO,
                            BEHIND,
                            PERSIST,
                        ),
                    ),
                ],
                [4, 4, 1],
                [CONSUMER_REGS, DQ_REGS, PRODUCER_REGS],
            )
        else:  # the producer is one warp
            gl.warp_specialize(
                [
                    (
                        _consumer,
                        (smem, bars, io, sched, docs, grid, 0, BLOCK_N, CAUSAL, False, VARLEN, False),
                    ),
                    (
                        _consumer,
                        (smem, bars, io, sched, docs, grid, 1, BLOCK_N, CAUSAL, False, VARLEN, False),
                    ),
                    (
                        _producer,
                        (
                            descs,
                            smem,
                            bars,
                            sched,
                            docs,
                            zero,
                            grid,
                            BLOCK_N,
                            CAUSAL,
                            VARLEN,
                            False,
                            False,
                            False,
                        ),
                    ),
                ],
                [4, 1],
                [CONSUMER_REGS, PRODUCER_REGS],
            )


# The compile-time arguments of a launch over a [B, H, N, D] batch; varlen_ws.py passes the documents instead.
NOT_VARLEN: dict[str, Any] = {
    "CU_Q": None,
    "CU_K": None,
    "NUM_DOCS": None,
    "DK": None,
    "DV": None,
    "VARLEN": False,
}


def kernel_constexprs(
    cfg: dict[str, Any], head_dim: int, causal: bool, longest: int, varlen: bool = False
) -> dict[str, Any]:
    """The compile-time arguments of a launch with config cfg at key length `longest` (packed: the longest
    document's bucket), but VARLEN's (NOT_VARLEN, or varlen_ws's). BEHIND says whether the plan converts dQ behind
    the kernel, PERSIST whether it launches a persistent walk (launch_grid)."""
    one_pass = bool(cfg.get("ONE_PASS"))
    return {
        "HEAD_DIM": head_dim,
        "BLOCK_M": cfg["BLOCK_M"],
        "NUM_WG": cfg["NUM_WG"],
        "STAGES": cfg["STAGES"],
        "CAUSAL": bool(causal),
        "ONE_PASS": one_pass,
        "ZERO": zero_box(cfg, head_dim),
        "BEHIND": converts_behind(cfg, head_dim, causal, longest),
        "CONSUMER_REGS": ONE_PASS_REGS[0] if one_pass else CONSUMER_REGS,
        "PRODUCER_REGS": PRODUCER_REGS,
        "DQ_REGS": ONE_PASS_REGS[1],
        "PERSIST": walks_persistent(cfg, head_dim, causal, longest, varlen),
    }


# Where the one pass converts dQ behind it by default (CONVERT_BEHIND unset), by (head dim, causal): below this key
# length (packed documents: the bucket of the longest); absent, at every length. At d = 128 causal N = 16384 the
# backward took 1.005-1.035x the time with it, under a lower SM clock (the overlap draws more of the power cap),
# where N = 1024-8192 took 0.955-0.994x (docs/kernels.md, the backward).
CONVERT_MAX_SEQ: dict[tuple[int, bool], int] = {(128, True): 16384}


def converts_behind(cfg: dict[str, Any], head_dim: int, causal: bool, longest: int) -> bool:
    """Whether dQ's accumulator is converted behind the one pass (backward._dq_convert) at this key length:
    CONVERT_BEHIND where forced, else CONVERT_MAX_SEQ's rule."""
    if not cfg.get("ONE_PASS"):
        return False
    forced = cfg.get("CONVERT_BEHIND")
    if forced is not None:
        return bool(forced)
    most = CONVERT_MAX_SEQ.get((head_dim, bool(causal)))
    return most is None or longest < most


def reported_config(cfg: dict[str, Any], persist: bool | None = None) -> dict[str, Any]:
    """cfg as a row reports it: the kernel's name, the keys per program and the warps; with `persist` (the
    launch's PERSIST, the one pass), PERSISTENT as it ran."""
    warps = 4 * cfg["NUM_WG"] + (4 + 1 if cfg.get("ONE_PASS") else 1)
    ran = {"PERSISTENT": int(persist)} if persist is not None and cfg.get("ONE_PASS") else {}
    return {"kernel": "gluon-ws", **cfg, **ran, "BLOCK_N": cfg["NUM_WG"] * KEYS, "num_warps": warps}


def dq_layout() -> Any:
    """dQ leaves in [BLOCK_M, 32] fp32 boxes (128-byte rows, swizzled: the staging stores are free of bank
    conflicts; with 256-byte unswizzled rows they were 8-way and the one pass took 1.11x the time at d = 128,
    N = 8192 on an H100)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)


def dq_descriptor(acc: torch.Tensor, block: list[int]) -> Any:
    """A TMA descriptor of dQ's fp32 accumulator `acc` (2-D), its boxes `block` in dq_layout."""
    return TensorDescriptor.from_tensor(acc, block, dq_layout())


class DkdvPlan:
    """The Gluon dK/dV pass's launch plan for one input signature (`supported` passed): the grid, the
    compile-time arguments, the descriptors' layouts; run() launches (launch.KernelCall)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, causal: bool, cfg: dict[str, Any]) -> None:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        dt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
        bm, num_wg = cfg["BLOCK_M"], cfg["NUM_WG"]
        self.one_pass = bool(cfg.get("ONE_PASS"))
        self.q_block, self.kv_block = [bm, D], [KEYS, D]
        self.q_layout = gl.NVMMASharedLayout.get_default_for(self.q_block, dt)
        self.kv_layout = gl.NVMMASharedLayout.get_default_for(self.kv_block, dt)
        self.dq_block = [bm, 32]
        self.dq_layout = dq_layout()
        self.sizes = (H, H // Hkv, Nq, Nk)
        self.tiles = (cdiv(Nk, num_wg * KEYS), B * Hkv)  # [key blocks, units]
        constexprs = {**kernel_constexprs(cfg, D, causal, Nk), **NOT_VARLEN}
        grid = launch_grid(cfg, self.tiles, q.device, constexprs["PERSIST"])
        self.call = KernelCall(_bwd_dkdv_ws, grid, constexprs, {"num_warps": 4})
        self.config = reported_config(cfg, constexprs["PERSIST"])
        self.ahead = launch_ahead(cfg, D, causal, Nk, self.tiles, q.device)

    def run(
        self,
        tensors: tuple[torch.Tensor, ...],
        dq_acc: torch.Tensor | None,
        lse: torch.Tensor,
        delta: torch.Tensor,
        qk_scale: float,
        sm_scale: float,
        counts: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """tensors: q, do, k, v, dk, dv (contiguous); dq_acc: dQ's fp32 accumulator (ONE_PASS) or None, zeroed by
        the preprocess below self.ahead's units, which also set `counts` (int32 [B * H_KV, 2]) to 0. Returns the
        config as a row reports it."""
        zq = counts if counts is not None else lse  # never read without ONE_PASS
        rest = (lse, delta, *self.sizes, qk_scale, sm_scale, zq, self.ahead, *self.tiles)
        views = (*tensors, dq_acc if dq_acc is not None else tensors[2])
        descs: tuple[Any, ...] = views  # once compiled, the descriptors' tensors (launch.KernelCall)
        if not self.call.direct:
            D = self.q_block[1]
            blocks = [(self.q_block, self.q_layout)] * 2 + [(self.kv_block, self.kv_layout)] * 4
            blocks.append((self.dq_block, self.dq_layout) if self.one_pass else blocks[2])
            descs = tuple(
                TensorDescriptor.from_tensor(t.view(-1, D), block, layout)
                for t, (block, layout) in zip(views, blocks, strict=True)
            )
        self.call((*descs, *rest))
        return self.config

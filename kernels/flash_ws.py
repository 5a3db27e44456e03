"""FlashAttention-3-style forward for Hopper, written in Gluon: warp-specialized, consumer warpgroups in ping-pong.

Origin: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision" (2024),
sections 3.1-3.2: a producer warp streams K/V tiles with TMA into a ring of shared-memory stages, two or three
consumer warpgroups each own 64 rows of the query tile (BLOCK_M = 128 or 192, FA3's tiles for d = 128 and 64), and
  - inter-warpgroup ping-pong: a consumer issues its matmuls only on its turn (a ring of mbarriers, one per
    warpgroup), so one warpgroup's softmax runs while another's matmuls keep the tensor cores busy;
  - intra-warpgroup overlap: in iteration j a consumer issues S_j = Q K_j^T and then P_{j-1} V_{j-1}, and runs
    the softmax of S_j while P_{j-1} V_{j-1} is still in flight.
Triton 3.6 does not generate either schedule from a tl.dot loop (BENCHMARKS.md, session 3-4 ncu numbers), which
is why this kernel spells them out with Gluon's explicit layouts, barriers and warp_specialize.

Same contract as flash_v2._attn_fwd: q [B, H, Nq, D], k/v [B, Hkv, Nk, D], O in q's dtype, LSE2 (base-2
log-sum-exp, fp32) per row, exp2 with the scale folded in, causal aligned bottom-right, GQA by h // (H // Hkv).

Query tiles are aligned to the end of the sequence: when BLOCK_M does not divide Nq, the first tile starts
before row 0 and its warpgroups that own no row only keep the barrier protocol (no math, no store).
PERSISTENT=1 launches one program per SM; each walks tiles t = pid, pid + programs, ... (_tile's order), and
the K/V ring, the turns and the Q barriers keep counting across its tiles (`it`: key blocks so far, `tc`: tiles
so far). The output then has its own shared-memory buffers, so the next tile's Q can load during this tile's
epilogue. The walk is static round-robin: balanced for equal tiles (no mask), not for causal ones.

Scope (`supported` says why not, and flash_v2 serves the rest): CUDA capability 9.x, fp16/bf16, D in {64, 128},
contiguous inputs, Nq % 64 == 0 and Nk % BLOCK_N == 0 (the 2-D descriptors span all heads, so a partial
64-row slice would read or write the next head's rows), and for causal Nk >= Nq (every row sees a key).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from .common import LOG2E, cdiv

try:  # Gluon is experimental and its API moves between Triton releases; written against Triton 3.6.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

ROWS = 64  # query rows per consumer warpgroup
# Registers per thread (setmaxnreg) of the consumer warpgroups and of the producer, by consumer count: FA3's
# splits (240 / 240 / 24 with two consumers, 160 x 3 / 32 with three) fill the 64K-register file.
CONSUMER_REGS = {2: 240, 3: 160}
PRODUCER_REGS = {2: 24, 3: 32}
# Keys per K/V tile: 64-key tiles were 5-16% slower than 128-key ones at d = 128 on an H100
# (`python3 benchmarks/ws_quick.py speed --rounds 2`, variant "ws-n64" at commit 1a61f90).
BLOCK_N = 128
# Default config per (head dim, causal), from `python3 benchmarks/ws_quick.py speed` on an H100: d = 64 takes
# FA3's 192-row tiles (three consumers), persistent when not causal (458 vs 437-445 TFLOP/s at N = 2048); a
# causal persistent walk is unbalanced (round-robin tiles of unequal length: 197 TFLOP/s at N = 2048), so
# causal tiles are one program each. Three K/V stages were up to 14% ahead of two at d = 128.
DEFAULT_CONFIG = {
    (64, False): {"BLOCK_M": 192, "STAGES": 2, "PERSISTENT": 1, "SCHED_HEADS": 1},
    (64, True): {"BLOCK_M": 192, "STAGES": 3, "PERSISTENT": 0, "SCHED_HEADS": 1},
    (128, False): {"BLOCK_M": 128, "STAGES": 3, "PERSISTENT": 0, "SCHED_HEADS": 1},
    (128, True): {"BLOCK_M": 128, "STAGES": 3, "PERSISTENT": 0, "SCHED_HEADS": 1},
}
HEAD_DIMS = (64, 128)

# Where flash_attn's forward takes this kernel by default: the shortest sequence per (head dim, causal). Shorter
# problems stay on the tl kernel, which was as fast or faster there (ws_quick on an H100, TFLOP/s):
#   d=128 causal N=1024: 279 vs 344 (a tile sees 1-8 key blocks, too few to fill the ping-pong pipeline);
#   d=64 not causal N=1024: 396 vs 394 (a tie); d=64 causal: 254-288 vs 347-365 at N=2048, 367-385 vs 394-395
#   at 4096 (192-row tiles waste 12% of their work on the causal diagonal at 2048, the tl kernel's 64-row ones 6%).
GLUON_MIN_SEQ = {(64, False): 2048, (64, True): 8192, (128, False): 0, (128, True): 2048}
CONFIG_KEYS = {"kernel": None, "BLOCK_M": (128, 192), "STAGES": (2, 3), "PERSISTENT": (0, 1),
               "SCHED_HEADS": (1, 4, 16, 32, 64), "PROGRAMS": None}  # fmt: skip
# PERSISTENT: one program per SM (or PROGRAMS of them, for tests) walks its share of the tiles, and the output
# gets its own shared-memory buffers so the next tile's loads overlap this tile's epilogue.
# SCHED_HEADS: tiles are walked in groups of this many heads (see _tile).
SMEM_LIMIT = 232448 - 1024  # an H100's opt-in shared memory per block, less the barriers


def enabled() -> bool:
    """False when FLASHBENCH_GLUON=0 or FLASHBENCH_TMA=0 (this kernel moves every tile with TMA)."""
    off = ("0", "false", "no", "off")
    return not any(
        os.environ.get(var, "1").strip().lower() in off for var in ("FLASHBENCH_GLUON", "FLASHBENCH_TMA")
    )


def default_config(head_dim: int, causal: bool) -> dict[str, Any]:
    return dict(DEFAULT_CONFIG[(head_dim if head_dim in HEAD_DIMS else 128, bool(causal))])


def preferred(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether flash_attn's forward should take this kernel for these inputs (no forced config)."""
    D = q.shape[-1]
    if D not in HEAD_DIMS or q.shape[2] < GLUON_MIN_SEQ[(D, bool(causal))] or not enabled():
        return False
    return supported(q, k, v, causal, default_config(D, causal)["BLOCK_M"]) is None


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """A forced config ({"kernel": "gluon-ws", ...}) with known keys and values, else ValueError."""
    for key, val in config.items():
        if key not in CONFIG_KEYS:
            raise ValueError(f"gluon-ws config: unknown key {key!r} (allowed: {sorted(CONFIG_KEYS)})")
        if CONFIG_KEYS[key] is not None and val not in CONFIG_KEYS[key]:
            raise ValueError(f"gluon-ws config: {key}={val!r} must be one of {list(CONFIG_KEYS[key])}")
    programs = config.get("PROGRAMS", 0)
    if not isinstance(programs, int) or isinstance(programs, bool) or programs < 0:
        raise ValueError(f"gluon-ws config: PROGRAMS={programs!r} must be a count >= 0 (0: one per SM)")
    return config


def smem_bytes(cfg: dict[str, Any], head_dim: int) -> int:
    """Shared memory of a config: Q (and O when persistent) slices of 64 rows, and the K/V ring."""
    q_o = cfg["BLOCK_M"] * head_dim * 2 * (2 if cfg.get("PERSISTENT") else 1)
    return q_o + 2 * cfg["STAGES"] * BLOCK_N * head_dim * 2


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def supported(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_m: int = 128
) -> str | None:
    """None if the Gluon forward can run these inputs, else why not (one line)."""
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper GPU (capability 9.x)"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16, not {q.dtype}"
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        return f"head dim {D} (64 or 128 only)"
    if block_m == 192 and D != 64:
        return "BLOCK_M 192 (three consumer warpgroups) only at head dim 64 (at 128 it spills and overflows smem)"
    if not all(t.is_contiguous() for t in (q, k, v)):
        return "needs contiguous q, k, v"
    nq, nk = q.shape[2], k.shape[2]
    if nq % ROWS or nk % BLOCK_N:
        return f"needs seq_q % {ROWS} == 0 and seq_k % {BLOCK_N} == 0"
    if causal and nk < nq:
        return "causal needs seq_k >= seq_q"
    if q.shape[0] * q.shape[1] * nq >= 2**31:
        return "too many rows for 32-bit descriptor coordinates"
    return None


if HAVE_GLUON:

    @gluon.jit
    def _tile(
        t, num_m, BH, H, GROUP, N_Q, N_K, BM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
        SCHED_HEADS: gl.constexpr,
    ):  # fmt: skip
        """Tile t of the schedule: (q_pos, q_row, kv_row, n_blocks, full_blocks).

        Tiles go by groups of SCHED_HEADS heads (whose K/V stay in L2 together), and within a group by query
        block (the last, which sees the most keys under a causal mask, first), then head.
        Query tiles end at N_Q: the first may start before row 0."""
        per_group = num_m * SCHED_HEADS
        grp = t // per_group
        base = grp * SCHED_HEADS
        heads = gl.minimum(BH - base, SCHED_HEADS)
        r = t - grp * per_group
        m = r // heads
        if CAUSAL:
            m = num_m - 1 - m
        bh = base + r % heads
        kv_bh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
        q_pos = N_Q - (num_m - m) * BM
        causal_off = N_K - N_Q
        if CAUSAL:
            n_blocks = gl.cdiv(gl.minimum(N_K, q_pos + BM + causal_off), BLOCK_N)
            full_blocks = gl.minimum(gl.maximum(q_pos + causal_off + 1, 0) // BLOCK_N, n_blocks)
        else:
            n_blocks = N_K // BLOCK_N
            full_blocks = n_blocks
        return q_pos, bh * N_Q + q_pos, kv_bh * N_K, n_blocks, full_blocks

    @gluon.jit
    def _round_tile(tc):
        """The tile of this program's round tc: tiles go round-robin over the programs (t = tc * programs + pid);
        may be past the last tile in the last round."""
        pid = gl.program_id(0)
        programs = gl.num_programs(0)
        return tc * programs + pid

    @gluon.jit
    def _load_partition(
        qd, kd, vd, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, num_m, BH, H, GROUP, N_Q,
        N_K, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr,
        SCHED_HEADS: gl.constexpr,
    ):  # fmt: skip
        """Producer (one warp), per tile: the query slices once every consumer has released the last tile's
        (q_empty), then K_j and V_j into ring stage (it + j) % STAGES, each as soon as every consumer has released
        that stage's K (empty_bars[s]) or V (empty_bars[STAGES + s]) buffer. `it` counts key blocks over all
        the program's tiles, so the ring and its barrier phases run on from one tile into the next."""
        ROWS: gl.constexpr = qd.block_type.shape[0]
        BM: gl.constexpr = NUM_WG * ROWS
        it = 0
        n_tiles = num_m * BH
        for tc in range(gl.cdiv(n_tiles, gl.num_programs(0))):
            t = _round_tile(tc)
            if t < n_tiles:
                _, q_row, kv_row, n_blocks, _ = _tile(
                    t, num_m, BH, H, GROUP, N_Q, N_K, BM, BLOCK_N, CAUSAL, SCHED_HEADS
                )
                # A fresh barrier counts as having completed the phase before phase 0: the first waits are free.
                mbarrier.wait(q_empty, (tc & 1) ^ 1)
                mbarrier.expect(q_bar, NUM_WG * qd.block_type.nbytes)
                # Rows before row 0 (a first partial tile) arrive as zeros or another head's rows, and go unused.
                for i in gl.static_range(NUM_WG):
                    tma.async_copy_global_to_shared(qd, [q_row + i * ROWS, 0], q_bar, q_smem.index(i))
                for j in range(n_blocks):
                    s = (it + j) % STAGES
                    free_phase = (((it + j) // STAGES) & 1) ^ 1
                    mbarrier.wait(empty_bars.index(s), free_phase)
                    mbarrier.expect(k_bars.index(s), kd.block_type.nbytes)
                    tma.async_copy_global_to_shared(
                        kd, [kv_row + j * BLOCK_N, 0], k_bars.index(s), k_smem.index(s)
                    )
                    mbarrier.wait(empty_bars.index(STAGES + s), free_phase)
                    mbarrier.expect(v_bars.index(s), vd.block_type.nbytes)
                    tma.async_copy_global_to_shared(
                        vd, [kv_row + j * BLOCK_N, 0], v_bars.index(s), v_smem.index(s)
                    )
                it += n_blocks

    @gluon.jit
    def _softmax(s, m_i, l_i, rows, start_n, causal_off, qk_scale, MASK: gl.constexpr, BLOCK_N: gl.constexpr):
        """Online-softmax step on a fp32 score tile: (p, alpha, l, m); the scale is applied after the row max."""
        if MASK:
            cols = start_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s.type.layout))
            s = gl.where(cols[None, :] <= rows[:, None] + causal_off, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, l_i, m_new

    @gluon.jit
    def _consumer_step(
        g, start_n, acc, p, m_i, l_i, q, k_smem, v_smem, k_bars, v_bars, empty_bars, my_turn, next_turn, s_zero,
        rows, causal_off, qk_scale, MASK: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        FLIP: gl.constexpr,
    ):  # fmt: skip
        """Key block number g (counted over the program's tiles; not the tile's first): issue S_g and
        P_{g-1} V_{g-1}, softmax S_g while the second matmul runs."""
        s_idx = g % STAGES
        prev = (g - 1) % STAGES
        mbarrier.wait(my_turn, (g & 1) ^ FLIP)
        mbarrier.wait(k_bars.index(s_idx), (g // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((g - 1) // STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
        mbarrier.arrive(next_turn)
        s = warpgroup_mma_wait(1, deps=[s])  # in-order completion: S_g is done, P_{g-1} V_{g-1} may not be
        mbarrier.arrive(empty_bars.index(s_idx))  # K_g is no longer read
        p_new, alpha, l_i, m_i = _softmax(s, m_i, l_i, rows, start_n, causal_off, qk_scale, MASK, BLOCK_N)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(empty_bars.index(STAGES + prev))  # V_{g-1} is no longer read
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p = gl.convert_layout(p_new.to(q.dtype), p.type.layout)
        return acc, p, m_i, l_i

    @gluon.jit
    def _consumer(
        q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, turns, od, LSE, num_m, BH, H,
        GROUP, N_Q, N_K, qk_scale, WG: gl.constexpr, NUM_WG: gl.constexpr, HEAD_DIM: gl.constexpr,
        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, SCHED_HEADS: gl.constexpr,
        SEP_O: gl.constexpr,
    ):  # fmt: skip
        """Consumer warpgroup WG: rows [WG * 64, WG * 64 + 64) of each of the program's query tiles."""
        ROWS: gl.constexpr = od.block_type.shape[0]
        BM: gl.constexpr = NUM_WG * ROWS
        my_turn = turns.index(WG)
        next_turn = turns.index((WG + 1) % NUM_WG)
        # Turns: consumer 0's k-th matmul issue waits for the last consumer's (k-1)-th (the first is free: a
        # fresh barrier passes a wait on parity 1), consumer w's k-th waits for consumer w-1's k-th. Every
        # consumer takes one turn per key block, so k is the program's key-block count `it`.
        FLIP: gl.constexpr = 1 if WG == 0 else 0
        it = 0
        n_tiles = num_m * BH
        for tc in range(gl.cdiv(n_tiles, gl.num_programs(0))):
            t = _round_tile(tc)
            if t < n_tiles:
                q_pos, q_row, _, n_blocks, full_blocks = _tile(
                    t, num_m, BH, H, GROUP, N_Q, N_K, BM, BLOCK_N, CAUSAL, SCHED_HEADS
                )
                if q_pos + WG * ROWS < 0:  # owns no row of this tile: turns and releases only
                    for j in range(n_blocks):
                        g = it + j
                        mbarrier.wait(my_turn, (g & 1) ^ FLIP)
                        mbarrier.arrive(next_turn)
                        mbarrier.wait(k_bars.index(g % STAGES), (g // STAGES) & 1)
                        mbarrier.arrive(empty_bars.index(g % STAGES))
                        mbarrier.wait(v_bars.index(g % STAGES), (g // STAGES) & 1)
                        mbarrier.arrive(empty_bars.index(STAGES + g % STAGES))
                    mbarrier.arrive(q_empty)
                else:
                    _consumer_tile(
                        q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, my_turn,
                        next_turn, od, LSE, q_row, q_pos, n_blocks, full_blocks, N_K - N_Q, qk_scale, it, tc, WG, FLIP,
                        HEAD_DIM, BLOCK_N, STAGES, CAUSAL, SEP_O,
                    )  # fmt: skip
                it += n_blocks
        tma.store_wait(0)

    @gluon.jit
    def _consumer_tile(
        q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, my_turn, next_turn, od, LSE,
        q_row, q_pos, n_blocks, full_blocks, causal_off, qk_scale, it, tc, WG: gl.constexpr, FLIP: gl.constexpr,
        HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
        SEP_O: gl.constexpr,
    ):  # fmt: skip
        """One tile's rows of this warpgroup; its key blocks are the program's it, it + 1, ..."""
        ROWS: gl.constexpr = od.block_type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        q = q_smem.index(WG)
        rows = q_pos + WG * ROWS + gl.arange(0, ROWS, row_s)
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
        l_i = gl.full([ROWS], 0.0, gl.float32, row_s)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
        mbarrier.wait(q_bar, tc & 1)

        # Block 0: S_0 and its softmax; its P V is issued in the next step.
        mbarrier.wait(my_turn, (it & 1) ^ FLIP)
        mbarrier.wait(k_bars.index(it % STAGES), (it // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(it % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.arrive(next_turn)
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(empty_bars.index(it % STAGES))
        p_new, alpha, l_i, m_i = _softmax(s, m_i, l_i, rows, 0, causal_off, qk_scale, CAUSAL, BLOCK_N)
        p = gl.convert_layout(p_new.to(q.dtype), p_layout)

        for j in range(1, full_blocks):
            acc, p, m_i, l_i = _consumer_step(
                it + j, j * BLOCK_N, acc, p, m_i, l_i, q, k_smem, v_smem, k_bars, v_bars, empty_bars, my_turn,
                next_turn, s_zero, rows, causal_off, qk_scale, False, BLOCK_N, STAGES, FLIP,
            )  # fmt: skip
        for j in range(gl.maximum(full_blocks, 1), n_blocks):
            acc, p, m_i, l_i = _consumer_step(
                it + j, j * BLOCK_N, acc, p, m_i, l_i, q, k_smem, v_smem, k_bars, v_bars, empty_bars, my_turn,
                next_turn, s_zero, rows, causal_off, qk_scale, CAUSAL, BLOCK_N, STAGES, FLIP,
            )  # fmt: skip
        if SEP_O:
            mbarrier.arrive(q_empty)  # every S of this tile is done: the producer may load the next tile's Q

        last = it + n_blocks - 1
        mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(last % STAGES), acc, is_async=True)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(empty_bars.index(STAGES + last % STAGES))

        # Every row saw at least one key (Nk >= Nq for causal), so l > 0.
        lse = m_i + gl.log2(l_i)
        gl.store(LSE + q_row + WG * ROWS + gl.arange(0, ROWS, row_s), lse)
        out = acc / gl.convert_layout(l_i, row_o)[:, None]
        o_buf = o_smem.index(WG)  # without SEP_O, this is the warpgroup's Q buffer, no longer read
        tma.store_wait(0)  # the previous tile's output has left this buffer
        o_buf.store(out.to(od.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(od, [q_row + WG * ROWS, 0], o_buf)
        if not SEP_O:
            tma.store_wait(0)
            mbarrier.arrive(q_empty)

    @gluon.jit
    def _attn_fwd_ws(
        qd, kd, vd, od, LSE, H, GROUP, N_Q, N_K, num_m, BH, qk_scale,
        HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
        NUM_WG: gl.constexpr, SCHED_HEADS: gl.constexpr, SEP_O: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
    ):  # fmt: skip
        """One program per SM-sized share of the tiles (persistent) or per tile: the loops are the same."""
        ROWS: gl.constexpr = qd.block_type.shape[0]
        q_smem = gl.allocate_shared_memory(qd.dtype, [NUM_WG, ROWS, HEAD_DIM], qd.layout)
        if (
            SEP_O
        ):  # the output gets its own buffers, so the next tile's Q can load during this tile's epilogue
            o_smem = gl.allocate_shared_memory(od.dtype, [NUM_WG, ROWS, HEAD_DIM], od.layout)
        else:
            o_smem = q_smem
        k_smem = gl.allocate_shared_memory(kd.dtype, [STAGES, BLOCK_N, HEAD_DIM], kd.layout)
        v_smem = gl.allocate_shared_memory(vd.dtype, [STAGES, BLOCK_N, HEAD_DIM], vd.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
        turns = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        mbarrier.init(q_empty, count=NUM_WG)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
            mbarrier.init(empty_bars.index(i), count=NUM_WG)  # K of stage i: every consumer releases it
            mbarrier.init(empty_bars.index(STAGES + i), count=NUM_WG)  # V of stage i
        for i in gl.static_range(NUM_WG):
            mbarrier.init(turns.index(i), count=1)
        fence_async_shared()

        # Constexprs go through the tuples as written here (a tuple held in a variable turns them into tensors).
        # fmt: off
        if NUM_WG == 3:
            gl.warp_specialize(
                [
                    (_consumer, (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, turns, od,
                                 LSE, num_m, BH, H, GROUP, N_Q, N_K, qk_scale, 0, 3, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                                 SCHED_HEADS, SEP_O)),
                    (_consumer, (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, turns, od,
                                 LSE, num_m, BH, H, GROUP, N_Q, N_K, qk_scale, 1, 3, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                                 SCHED_HEADS, SEP_O)),
                    (_consumer, (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, turns, od,
                                 LSE, num_m, BH, H, GROUP, N_Q, N_K, qk_scale, 2, 3, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                                 SCHED_HEADS, SEP_O)),
                    (_load_partition, (qd, kd, vd, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars,
                                       num_m, BH, H, GROUP, N_Q, N_K, BLOCK_N, STAGES, 3, CAUSAL,
                                       SCHED_HEADS)),
                ],
                [4, 4, 1],
                [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
            )
        else:
            gl.warp_specialize(
                [
                    (_consumer, (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, turns, od,
                                 LSE, num_m, BH, H, GROUP, N_Q, N_K, qk_scale, 0, 2, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                                 SCHED_HEADS, SEP_O)),
                    (_consumer, (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars, turns, od,
                                 LSE, num_m, BH, H, GROUP, N_Q, N_K, qk_scale, 1, 2, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                                 SCHED_HEADS, SEP_O)),
                    (_load_partition, (qd, kd, vd, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, empty_bars,
                                       num_m, BH, H, GROUP, N_Q, N_K, BLOCK_N, STAGES, 2, CAUSAL,
                                       SCHED_HEADS)),
                ],
                [4, 1],
                [CONSUMER_REGS, PRODUCER_REGS],
            )
        # fmt: on


def _descriptors(q, k, v, o, block_n):
    D = q.shape[-1]
    dt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    rows = ROWS
    q_layout = gl.NVMMASharedLayout.get_default_for([rows, D], dt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, D], dt)
    flat = [t.view(-1, D) for t in (q, k, v, o)]
    qd = TensorDescriptor.from_tensor(flat[0], [rows, D], q_layout)
    kd = TensorDescriptor.from_tensor(flat[1], [block_n, D], kv_layout)
    vd = TensorDescriptor.from_tensor(flat[2], [block_n, D], kv_layout)
    od = TensorDescriptor.from_tensor(flat[3], [rows, D], q_layout)
    return qd, kd, vd, od


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Run the Gluon forward. Returns (o [B,H,Nq,D], lse2 [B,H,Nq] fp32, config used); raises ValueError if
    `supported` refuses the inputs."""
    D = q.shape[-1]
    cfg = default_config(D, causal)
    cfg.update(check_config({key: val for key, val in (config or {}).items() if key != "kernel"}))
    why = supported(q, k, v, causal, cfg["BLOCK_M"])
    if why:
        raise ValueError(f"flash_ws forward: {why}")
    if smem_bytes(cfg, D) > SMEM_LIMIT:
        raise ValueError(
            f"flash_ws forward: config needs {smem_bytes(cfg, D) // 1024} KiB of shared memory at head dim {D} "
            f"(at most {SMEM_LIMIT // 1024}): fewer STAGES, or PERSISTENT=0"
        )
    B, H, Nq, _ = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    qd, kd, vd, od = _descriptors(q, k, v, o, BLOCK_N)
    num_wg = cfg["BLOCK_M"] // ROWS
    num_m = cdiv(Nq, cfg["BLOCK_M"])
    tiles = num_m * B * H
    if cfg["PERSISTENT"]:
        programs = cfg.get("PROGRAMS") or _sm_count(q.device.index if q.device.index is not None else 0)
        grid = (min(tiles, programs),)
    else:
        grid = (tiles,)
    _attn_fwd_ws[grid](
        qd, kd, vd, od, lse, H, H // Hkv, Nq, Nk, num_m, B * H, sm_scale * LOG2E,
        HEAD_DIM=D, BLOCK_N=BLOCK_N, STAGES=cfg["STAGES"], CAUSAL=bool(causal), NUM_WG=num_wg,
        SCHED_HEADS=cfg["SCHED_HEADS"], SEP_O=bool(cfg["PERSISTENT"]), CONSUMER_REGS=CONSUMER_REGS[num_wg],
        PRODUCER_REGS=PRODUCER_REGS[num_wg], num_warps=4,
    )  # fmt: skip
    return o, lse, dict(cfg, kernel="gluon-ws")

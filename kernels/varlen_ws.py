"""flash_attn_varlen on Hopper: flash_ws's Gluon forward and backward_ws's Gluon backward over packed documents
(their VARLEN modes).

    q     [total_q, H, D]     contiguous; read through a 2-D descriptor over [total_q, H * D], head h the
    k, v  [total_k, Hkv, D]   column block h * D ([64, D] boxes of Q and O, [BLOCK_N, D] of K and V)
    o     [total_q, H, D]     written the same way; LSE2 [1, H, total_q] fp32 (varlen.py's layout)

The tiles are walked as common.document_block walks blocks: document_walk(total_q, docs, BLOCK_M) positions,
each document's tiles in a row, its last (the most keys under a causal mask) first, every head's tile of a
position before the next position; a tile finds its document on the device from the prefix sums
(flash_ws_parts.document_tile), so a launch reads nothing on the host and replays under a CUDA graph. A
document's tiles end at its last row; its keys start at its first key row, with causal masks aligned bottom-right
by its own lengths. With PERSISTENT=0 (d = 64 and 256 without a mask), a program per walk position (the hardware
hands the programs to the SMs in that order). Causal, and d = 128 without a mask (PERSISTENT=1), one program per
SM, and each takes the walk's next tile when it is done with its last (an atomic counter,
flash_ws_parts._load_walk): the longest tiles of a document first and the programs ending together, as the
uniform forward's list-scheduled walk does from a table made on the host, which would need the lengths there.
The plan's counter is zeroed again by the launch's last program, so launches of one plan must not run at the
same time on two streams.

Where a box crosses a document's end:
  - Q rows before the document (its first tile when BLOCK_M does not divide its length) are loaded and computed
    but never stored; a warpgroup whose 64 rows all lie before it only keeps the barrier protocol.
  - K/V rows past the document's last key (its last key block) belong to the next document: their scores are
    masked by key position (the causal diagonal does it under a causal mask).
  - O: a TMA store cannot stop at a document's start, so the warpgroup whose rows start in the previous document
    stores through a masked pointer store (at most one per document and head); every other warpgroup stores with
    TMA. A per-document bound would need a descriptor per document, built on the device.
Rows that see no key (a document with fewer keys than queries under a causal mask, no keys, or rows past
cu_seqlens_q[-1]) output 0 with LSE2 = +inf, as the tl kernel does.

No sliding windows and no FP8 (the tl kernel takes windows).

The backward (BackwardPlan): backward_ws's one pass in its VARLEN mode, a program per (key block of 128 keys of
one document, K/V head), found on the device by common.document_block's walk over the keys (in document order:
under a causal mask a document's first key block, which sees the most queries, first). It walks the document's
query blocks of 64 rows from its first query (causal: bottom-right by the document's lengths) for every query
head of its GQA group. Where a box crosses a document's end:
  - K/V rows past the document's last key (its last key block): masked by key position in P^T (the causal
    diagonal does it under a causal mask), so their dS^T rows are zero and add nothing to dQ; their dK, dV rows
    are never stored: the warpgroup whose 64 keys run past the document's end stores its rows inside it through
    masked pointer stores (at most one per document and K/V head; none where all 64 lie past it), the others
    by TMA. TMA's clipping would not do: it stops at the tensor's end, and the next rows are the next
    document's, which another program writes.
  - Q/dO rows past the document's last query (its last query block): their LSE2 is read as +inf and D as 0, so
    their P^T and dS^T columns are exact zeros (exp2(-inf) = 0; 0 * (finite - 0) = 0) and they add nothing to
    dK and dV; dQ's TMA reduce-add of that box adds the zero rows of dS K to the next document's dQ rows (or the
    next head's first rows, or nothing past the tensor): values unchanged (x + 0 = x; only a -0.0 sum could turn
    +0.0).
dQ is added into a zeroed fp32 [total_q, H, D] (the preprocess zeroes it and computes D, one launch), then
converted to the input dtype in that layout: not bitwise repeatable, as the uniform one pass.
"""

from __future__ import annotations

from typing import Any

import torch

from . import backward_ws, flash_ws
from .backward import DqConvert, DqScratch, _bwd_preprocess
from .common import LOG2E, cdiv, document_walk
from .launch import KernelCall

_NAME = "flash_ws varlen forward"
# The config per (head dim, causal): 128-row tiles (192, d = 64's uniform default, waste more rows in each
# document's first tile), the uniform kernel's K/V tiles (flash_ws.BLOCK_N). The persistent walk (PERSISTENT=1:
# programs take the next tile as they free up, the next tile's Q loading under this one's epilogue), two stages,
# causal and at d = 128 without a mask: causal, the list-scheduled uniform walk it stands in for led one program per
# tile by 9-19% at d = 128 N = 1k-4k (docs/kernels.md, persistent LPT); without a mask it led one program per tile
# with three stages by 1.04-1.20x over packed documents (docs/kernels.md, packed documents). Elsewhere without a
# mask (not timed) one program per tile, three stages (two at d = 256, whose stages fill shared memory).
_WALK = {"PERSISTENT": 1, "STAGES": 2}
DEFAULT_CONFIG = {
    (d, causal): {
        "BLOCK_N": flash_ws.BLOCK_N[d],
        "SCHED_HEADS": 1,
        "BLOCK_M": 128,
        "STAGES": 2 if d == 256 else 3,
        "PERSISTENT": 0,
        **(_WALK if causal or d == 128 else {}),
    }
    for d in flash_ws.HEAD_DIMS
    for causal in (False, True)
}


# Where flash_attn_varlen's forward takes this kernel by default: the shortest longest-document per (head dim,
# masked), as flash_ws.GLUON_MIN_SEQ for flash_attn. d = 128 from 512, the shortest timed (1.15-1.33x the tl kernel
# at documents of 512, 1024 and 256-4096); d = 64's 128-row tiles trailed the tl kernel (0.73-0.97x) and d = 256 is not
# timed, so they keep it (docs/kernels.md, packed documents); a forced {"kernel": "gluon-ws"} runs it anywhere.
MIN_SEQ: dict[tuple[int, bool], int] = {(128, False): 512, (128, True): 512}


def default_config(head_dim: int, causal: bool) -> dict[str, Any]:
    """The config this kernel runs at a head dim (others: d = 128's) and mask without a forced one."""
    return dict(DEFAULT_CONFIG[(head_dim if head_dim in flash_ws.HEAD_DIMS else 128, bool(causal))])


def supported(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: tuple[int, int] | None,
    block_m: int = 128,
    block_n: int | None = None,
) -> str | None:
    """None if the Gluon forward runs these packed documents with block_m x block_n tiles, else why not."""
    if not flash_ws.HAVE_GLUON:
        return "this Triton has no Gluon"
    if window is not None:
        return f"sliding window {window} over packed documents (the tl kernel takes it)"
    why = flash_ws.tensor_refusal({"q": q, "k": k, "v": v}, flash_ws.HEAD_DIMS)
    if why is not None:
        return why
    D = q.shape[-1]
    block_n = block_n or flash_ws.BLOCK_N[D]
    if q.shape[0] < flash_ws.ROWS or k.shape[0] < block_n:  # a TMA box no longer than its tensor
        return f"needs at least {flash_ws.ROWS} query rows and {block_n} key rows in all"
    if q.shape[1] * q.shape[0] >= 2**31:
        return "too many rows for 32-bit LSE offsets"
    return flash_ws.tile_refusal(D, block_m, block_n)


def preferred(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    window: tuple[int, int] | None,
    longest: int,
) -> bool:
    """Whether flash_attn_varlen's forward takes this kernel (no forced config): MIN_SEQ's length for the head
    dim and mask, on the longest document (max(max_seqlen_q, max_seqlen_k))."""
    min_seq = MIN_SEQ.get((q.shape[-1], bool(causal) or window is not None))
    if min_seq is None or longest < min_seq or not flash_ws.enabled():
        return False
    cfg = default_config(q.shape[-1], causal)
    return supported(q, k, v, window, cfg["BLOCK_M"], cfg["BLOCK_N"]) is None


class VarlenPlan:
    """What the Gluon forward decides for one packed input signature (shapes, strides, dtype, device, document
    count, mask, config), decided once. Raises ValueError where `supported` or the config refuses the inputs."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        docs: int,
        causal: bool,
        config: dict[str, Any] | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        D = q.shape[-1]
        cfg = default_config(D, causal)
        cfg.update(
            flash_ws.check_config({key: val for key, val in (config or {}).items() if key != "kernel"})
        )
        if cfg.get("LPT"):
            raise ValueError(
                f"{_NAME}: no list-scheduled walk (LPT=1): the document lengths are on the device"
            )
        if cfg["SCHED_HEADS"] != 1:
            raise ValueError(f"{_NAME}: tiles are walked one head at a time (SCHED_HEADS=1)")
        if cfg.get("LEAD_S"):
            raise ValueError(f"{_NAME}: no early first S (LEAD_S=1): a document's tiles are not whole")
        if cfg.get("Q2"):
            raise ValueError(f"{_NAME}: no second Q buffer (Q2=1): not built for packed documents")
        if cfg.get("LOOP_FIRST"):
            raise ValueError(
                f"{_NAME}: a first block of its own (LOOP_FIRST=0): not built for packed documents"
            )
        why = supported(q, k, v, window, cfg["BLOCK_M"], cfg["BLOCK_N"])
        if why:
            raise ValueError(f"{_NAME}: {why}")
        if flash_ws.smem_bytes(cfg, D) > flash_ws.SMEM_LIMIT:
            raise ValueError(
                f"{_NAME}: config needs {flash_ws.smem_bytes(cfg, D) // 1024} KiB of shared memory at head dim {D} "
                f"(at most {flash_ws.SMEM_LIMIT // 1024}): fewer STAGES or PERSISTENT=0"
            )
        (Tq, H, _), (Tk, Hkv) = q.shape, k.shape[:2]
        walk = document_walk(Tq, docs, cfg["BLOCK_M"])
        tiles = walk * H
        self.counter: torch.Tensor | None = None
        if cfg["PERSISTENT"]:
            index = q.device.index if q.device.index is not None else 0
            grid = (min(tiles, cfg.get("PROGRAMS") or flash_ws._sm_count(index)),)
            # the walk's next tile and the programs done; the kernel's last program zeroes them again
            self.counter = torch.zeros(2, dtype=torch.int32, device=q.device)
        else:
            grid = (tiles,)
        self.block_n, self.docs, self.o_width = cfg["BLOCK_N"], docs, flash_ws.o_cols(cfg, D)
        self.o_shape, self.lse_shape = tuple(q.shape), (1, H, Tq)
        self.table = flash_ws._no_table(q.device)
        # run-time arguments after the four descriptors and the LSE: H, GROUP, N_Q, N_K, num_m, BH
        self.sizes = (H, H // Hkv, Tq, Tk, walk, H)
        self.config = dict(cfg, kernel="gluon-ws")
        constexprs = flash_ws.kernel_constexprs(cfg, D, causal, varlen=True)
        self.call = KernelCall(flash_ws._attn_fwd_ws, grid, constexprs, {"num_warps": 4})

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        sm_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """O [total_q, H, D] and lse2 [1, H, total_q] fp32 of inputs with this plan's signature, and the config."""
        o = torch.empty(size=self.o_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(size=self.lse_shape, dtype=torch.float32, device=q.device)
        tensors = (q, k, v, o)
        # WIN_LEFT, the FP8 descales (unused), no schedule table, then the documents (and the walk's counter)
        counter = cu_k if self.counter is None else self.counter
        scales = (sm_scale * LOG2E, 0, lse, lse, lse)
        rest = (lse, *self.sizes, *scales, self.table, 0, cu_q, cu_k, self.docs, o, counter)
        # [total, heads, D] viewed as [total, heads * D], boxes [rows, D]: one head's columns (O's: [64, o_cols],
        # O_HALVES' half of them)
        rows = (flash_ws.ROWS, self.block_n, self.block_n, flash_ws.ROWS)
        cols = (q.shape[-1],) * 3 + (self.o_width,)
        flash_ws.launch(
            self,
            tensors,
            rest,
            lambda: tuple(
                flash_ws._descriptor(t.view(t.shape[0], -1), [n, c])
                for t, n, c in zip(tensors, rows, cols, strict=True)
            ),
        )
        return o, lse, self.config


# Where flash_attn_varlen's backward takes backward_ws's kernel (BackwardPlan) by default: the shortest
# longest-document per (head dim, causal), as backward_ws.MIN_SEQ for flash_attn. From 512, the shortest timed: the
# backward 1.11-1.66x the tl passes' at documents of 512, 1024 and 256-4096, but for d = 128 causal at 512, a tie,
# where the tl passes (deterministic) stay (docs/kernels.md, packed documents).
BWD_MIN_SEQ: dict[tuple[int, bool], int] = {
    (64, False): 512,
    (64, True): 512,
    (128, False): 512,
    (128, True): 1024,
}


def backward_supported(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    window: tuple[int, int] | None,
    cfg: dict[str, Any],
) -> str | None:
    """None if the Gluon backward runs these packed documents with config cfg (backward_ws.config_for's), else why
    not (one line)."""
    if not backward_ws.HAVE_GLUON:
        return "this Triton has no Gluon"
    if window is not None:
        return f"sliding window {window} over packed documents (the tl kernels take it)"
    if not cfg.get("ONE_PASS"):
        return "one pass only over packed documents (ONE_PASS=1)"
    why = flash_ws.tensor_refusal({"q": q, "k": k, "v": v, "dO": do}, backward_ws.HEAD_DIMS)
    if why is not None:
        return why
    if q.shape[0] < cfg["BLOCK_M"] or k.shape[0] < backward_ws.KEYS:  # a TMA box no longer than its tensor
        return f"needs at least {cfg['BLOCK_M']} query rows and {backward_ws.KEYS} key rows in all"
    if q.shape[1] * q.shape[0] >= 2**31:
        return "too many rows for 32-bit descriptor coordinates"
    return backward_ws.smem_refusal(cfg, q.shape[-1])


def backward_preferred(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    window: tuple[int, int] | None,
    longest: int,
) -> bool:
    """Whether flash_attn_varlen's backward takes the Gluon kernel (nothing forced): BWD_MIN_SEQ's length for the
    head dim and mask, on the longest document; never where torch asks for deterministic algorithms."""
    least = BWD_MIN_SEQ.get((q.shape[-1], bool(causal)))
    if least is None or longest < least or not backward_ws.enabled():
        return False
    if torch.are_deterministic_algorithms_enabled():
        return False
    return backward_supported(q, k, v, do, window, backward_ws.config_for(q.shape[-1])) is None


class BackwardPlan:
    """The Gluon backward's launches for one packed input signature: the preprocess (D, dQ's zeroed fp32
    accumulator) and backward_ws's one pass in its VARLEN mode. Raises ValueError where the config or
    `backward_supported` refuses the inputs."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        do: torch.Tensor,
        docs: int,
        causal: bool,
        config: dict[str, Any] | None,
        window: tuple[int, int] | None = None,
        longest: int = 0,
    ) -> None:
        """longest: the longest document's length bucket (backward_ws.ZERO_MIN_SEQ)."""
        D = q.shape[-1]
        cfg = backward_ws.config_for(D, config)
        why = backward_supported(q, k, v, do, window, cfg)
        if why:
            raise ValueError(f"gluon-ws varlen backward: {why}")
        (Tq, H, _), (Tk, Hkv) = q.shape, k.shape[:2]
        block_n = cfg["NUM_WG"] * backward_ws.KEYS
        self.blocks = ([cfg["BLOCK_M"], D], [backward_ws.KEYS, D], [cfg["BLOCK_M"], 32])
        self.sizes, self.docs = (H, H // Hkv, Tq, Tk), docs
        # D, dQ's accumulator [total_q, H, D] and its two counts per unit (a K/V head): zeroed, added
        self.scratch = DqScratch((Tq, H, D), (1, H, Tq), Hkv)
        self.pre = KernelCall(
            _bwd_preprocess, (cdiv(Tq, 64), H), {"HEAD_DIM": D, "BLOCK_M": 64, "ZERO_DQ": True}, {}
        )
        constexprs = {**backward_ws.kernel_constexprs(cfg, D, causal, longest, varlen=True), "VARLEN": True}
        self.tiles = grid = (document_walk(Tk, docs, block_n), Hkv)  # [walk positions, K/V heads]
        launch = backward_ws.launch_grid(cfg, grid, q.device, constexprs["PERSIST"])
        self.call = KernelCall(backward_ws._bwd_dkdv_ws, launch, constexprs, {"num_warps": 4})
        self.config = backward_ws.reported_config(cfg, constexprs["PERSIST"])
        self.ahead = backward_ws.launch_ahead(cfg, D, causal, longest, grid, q.device)
        # dQ converted behind the pass, a unit per K/V head: its GQA group's columns of [total_q, H * D]
        G = H // Hkv
        self.convert = DqConvert(Tq, G * D, H * D, G * D, Hkv, D, grid[0]) if constexprs["BEHIND"] else None

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        do: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        sm_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """dq, dk, dv ([total, heads, D] contiguous) of inputs with this plan's signature, and the config; lse: the
        forward's [1, H, total_q] LSE2."""
        H, _, Tq, _ = self.sizes
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        # before the pass, as backward.py's: the conversion behind it starts while it runs
        dq = torch.empty_like(q, memory_format=torch.contiguous_format) if self.convert is not None else None
        dq_acc, delta, zq = self.scratch.make(q.device)
        strides = (0, o.stride(1), o.stride(0), 0, do.stride(1), do.stride(0))
        # dQ's accumulator [total_q, H, D]: the preprocess zeroes the K/V heads below the dK/dV kernel's distance
        acc = (0, dq_acc.stride(1), dq_acc.stride(0), self.sizes[1], self.ahead)
        self.pre((o, do, delta, dq_acc, zq, *strides, H, Tq, *acc))
        # [total, heads, D] as [total, heads * D] (a head is a column block), dQ's accumulator too
        views = tuple(t.view(t.shape[0], -1) for t in (q, do, k, v, dk, dv, dq_acc))
        rest = (
            lse,
            delta,
            *self.sizes,
            sm_scale * LOG2E,
            sm_scale,
            zq,
            self.ahead,
            *self.tiles,
            cu_q,
            cu_k,
            self.docs,
            dk,
            dv,
        )
        flash_ws.launch(self, views, rest, lambda: self._descriptors(views))
        if self.convert is not None and dq is not None:
            self.convert(dq_acc, dq, zq)
            return dq, dk, dv, self.config
        return dq_acc.to(dtype=q.dtype), dk, dv, self.config

    def _descriptors(self, views: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        q_block, kv_block, dq_block = self.blocks
        rows = (q_block, q_block, kv_block, kv_block, kv_block, kv_block)
        descs = tuple(flash_ws._descriptor(t, block) for t, block in zip(views, rows, strict=False))
        return (*descs, backward_ws.dq_descriptor(views[-1], dq_block))

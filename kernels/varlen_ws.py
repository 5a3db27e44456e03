"""flash_attn_varlen's forward on Hopper: flash_ws's Gluon kernel over packed documents (its VARLEN mode).

    q     [total_q, H, D]     contiguous; read through a 2-D descriptor over [total_q, H * D], head h the
    k, v  [total_k, Hkv, D]   column block h * D ([64, D] boxes of Q and O, [BLOCK_N, D] of K and V)
    o     [total_q, H, D]     written the same way; LSE2 [1, H, total_q] fp32 (varlen.py's layout)

The tiles are walked as common.document_block walks blocks: document_walk(total_q, docs, BLOCK_M) positions per
head, heads outermost, each document's tiles in a row, its last (the most keys under a causal mask) first; a tile
finds its document on the device from the prefix sums (flash_ws_parts.document_tile), so a launch reads nothing
on the host and replays under a CUDA graph. A document's tiles end at its last row; its keys start at its first
key row, with causal masks aligned bottom-right by its own lengths. Not causal, a program per walk position (the
hardware hands the programs to the SMs in that order). Causal (PERSISTENT=1), one program per SM, and each takes
the walk's next tile when it is done with its last (an atomic counter, flash_ws_parts._load_walk): the longest
tiles of a document first and the programs ending together, as the uniform forward's list-scheduled walk does
from a table made on the host, which would need the lengths there. The plan's counter is zeroed again by the
launch's last program, so launches of one plan must not run at the same time on two streams.

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
"""

from __future__ import annotations

from typing import Any

import torch

from . import flash_ws
from .common import LOG2E, document_walk
from .launch import KernelCall

_NAME = "flash_ws varlen forward"
# The config per (head dim, causal): 128-row tiles (192, d = 64's uniform default, waste more rows in each
# document's first tile), the uniform kernel's K/V tiles (flash_ws.BLOCK_N). Not causal, one program per tile with
# three stages, as the uniform forward at d = 128 (two at d = 256, whose stages fill shared memory). Causal, the
# persistent walk (PERSISTENT=1: programs take the next tile as they free up, the next tile's Q loading under
# this one's epilogue), two stages: the list-scheduled uniform walk it stands in for led one program per tile by
# 9-19% at d = 128 N = 1k-4k (docs/kernels.md, persistent LPT).
_WALK = {"PERSISTENT": 1, "STAGES": 2}
DEFAULT_CONFIG = {
    (d, causal): {
        "BLOCK_N": flash_ws.BLOCK_N[d],
        "SCHED_HEADS": 1,
        "BLOCK_M": 128,
        "STAGES": 2 if d == 256 else 3,
        "PERSISTENT": 0,
        **(_WALK if causal else {}),
    }
    for d in flash_ws.HEAD_DIMS
    for causal in (False, True)
}


# Where flash_attn_varlen's forward takes this kernel by default: the shortest longest-document per (head dim,
# masked), as flash_ws.GLUON_MIN_SEQ for flash_attn. Empty until the kernel is timed against the tl one
# (docs/kernels.md, packed documents): a forced {"kernel": "gluon-ws"} runs it.
MIN_SEQ: dict[tuple[int, bool], int] = {}


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
        self.block_n, self.docs = cfg["BLOCK_N"], docs
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
        o = torch.empty(self.o_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device)
        tensors = (q, k, v, o)
        # WIN_LEFT, the FP8 descales (unused), no schedule table, then the documents (and the walk's counter)
        counter = cu_k if self.counter is None else self.counter
        scales = (sm_scale * LOG2E, 0, lse, lse, lse)
        rest = (lse, *self.sizes, *scales, self.table, 0, cu_q, cu_k, self.docs, o, counter)
        # [total, heads, D] viewed as [total, heads * D], boxes [rows, D]: one head's columns
        rows = (flash_ws.ROWS, self.block_n, self.block_n, flash_ws.ROWS)
        flash_ws.launch(
            self,
            tensors,
            rest,
            lambda: tuple(
                flash_ws._descriptor(t.view(t.shape[0], -1), [n, t.shape[-1]])
                for t, n in zip(tensors, rows, strict=True)
            ),
        )
        return o, lse, self.config

"""MLA decode on Hopper in Gluon: FlashMLA's split of the work between two warpgroups, on kernels/decode.py's
split-KV partials and combine.

Origin: FlashMLA (deepseek-ai/FlashMLA, csrc/sm90/decode/dense): 64 query rows per CTA and two warpgroups that
take the 64-key blocks in turns ("seesaw"): each computes the whole S of its own block, O's 512 columns are split
in halves between them, and each P V reads its own block's P from registers and the other's from shared memory,
where Q's rotary columns were (they live in registers); TMA into two cache buffers; the softmax max passed between
the warpgroups in shared memory. Written here for Gluon (Triton 3.6) with a producer warp and mbarriers;
mla_ws_kernel.py's docstring has the schedule. Where a sequence's rows fit one program (SPLIT_ROWS), the grid runs
mla_split_kernel.py's instead: both warpgroups on each block while the next one loads.

    q                 [B, H, Nq, 576]   (D = 512 latent + 64 rotary; H * Nq rows, 64 per program)
    contiguous cache  [B, 1, capacity, 576], cache_seqlens [B] int32 (default: all capacity)
    paged cache       [pages, 1, PAGE, 576] (a pool), block_table [B, capacity / PAGE] int32; PAGE a multiple
                      of BLOCK_N = 64 (FlashMLA's pages are 64), so a cache tile is one TMA box in one page
    output            [B, H, Nq, 512]

Grid (row blocks, key splits, B); the splits are flash_mla_decode's (whole 64-key blocks of each sequence's own
length). One split writes the output; several write decode.py's partials (normalised fp32 [B, splits, ROWS, 512],
then log2-sum-exp [B, splits, ROWS]) and a second kernel, _mla_combine (decode._combine), merges them.

Why it should beat the tl kernel (docs/kernels.md, the MLA decode kernel): S is computed once (Triton lays the
chain out with both warpgroups along M, each computing all of S), P reaches P V without a layout conversion, and
each warpgroup holds a [64, 256] accumulator (128 registers), not [64, 512] over eight warps.

flash_mla_decode's default from MIN_CAPACITY's cache capacity per Nq on contiguous caches, on paged ones from
MIN_CAPACITY_PAGED's (the table's pages times the page); config={"kernel": "gluon-ws"} forces it.

Cautions: as flash_mla_decode's (kernels/mla.py). The cache or pool must be contiguous with 16-byte aligned bases
(TMA); keys past a sequence's length in its last tile are read but masked, and zeroed in V.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import flash_ws
from .common import interpreting
from .decode import _combine, _scratch, combine_chunk
from .descriptors import capability_major
from .launch import KernelCall, PlanCache

try:  # Gluon is experimental and its API moves between Triton releases; written against Triton 3.6.
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .mla_split_kernel import _mla_decode_split
    from .mla_ws_kernel import _mla_decode_ws

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

NAME = "flash_mla_decode (gluon-ws)"
KERNEL = "gluon-ws"
HEAD_DIM = 576
HEAD_DIM_V = 512
BLOCK_M = 64  # query rows per program: both consumer warpgroups' M
BLOCK_N = 64  # keys per cache tile (block): each consumer's S covers its own, the blocks taken in turns
CONSUMER_REGS = 240  # setmaxnreg, as flash_ws's two consumers and a producer warp
PRODUCER_REGS = 24
# Rows per _mla_combine program, at most: 4 rows of 512 let a step read 4 splits (decode.combine_chunk), where 16
# rows read one at a time, each load waited for before the next is issued (28 against 5 us at 32k keys, 15 splits,
# batch 4, Nq = 1 on an H100). Fewer where that reads every split in one step (combine_rows): 5-8 splits take 2
# rows, 9-16 one, 0.94-0.95x the call's time at 16 splits (docs/kernels.md, the Gluon MLA kernel).
COMBINE_ROWS = 4
# Where flash_mla_decode takes this kernel without a forced config: the smallest cache capacity per Nq, the shortest
# timed (1.28-1.32x the tl kernel at 1024 keys, 1.30-1.53x at 4096 and 32768; docs/kernels.md, the Gluon MLA kernel).
MIN_CAPACITY: dict[int, int] = {1: 1024, 2: 1024}
# The same for paged caches of 64-token pages: 1.48-1.76x the tl kernel at 1024-32768 keys, Nq 1 and 2, the
# shortest timed 1024 (docs/benchmarks.md, MLA decode).
MIN_CAPACITY_PAGED: dict[int, int] = {1: 1024, 2: 1024}
# The split combine as a programmatic dependent launch (PDL, sm90+): the kernel's programs let it start at once
# and each combine program waits (griddepcontrol.wait) for the kernel's end, so its launch and start run under the
# kernel's last programs (FlashMLA launches its combine so): 0.99-1.00x the time at Nq = 1 with 16 heads, 0.98-0.99x
# with 64 and 128 at 4096 keys (docs/kernels.md, the Gluon MLA kernel). Not under the interpreter (no PTX).
PDL = True
# Grids of one row block (H * Nq <= SPLIT_ROWS) run mla_split_kernel.py's schedule, both consumers on each block, not
# the seesaw: with no other row block sharing its tiles, a program's seesaw loads and computes in turns
# (docs/kernels.md, the Gluon MLA kernel). 0 turns it off; read when an input signature's plan is made (_PLANS).
SPLIT_ROWS = BLOCK_M
_GL_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def capacity(kv: torch.Tensor, table: torch.Tensor | None) -> int:
    """Keys the cache holds per sequence: the contiguous cache's length, or the table's pages times the page."""
    return kv.shape[2] if table is None else table.shape[1] * kv.shape[2]


def preferred(q: torch.Tensor, kv: torch.Tensor, table: torch.Tensor | None, head_dim_v: int) -> bool:
    """Whether flash_mla_decode takes this kernel without a forced config: from MIN_CAPACITY's (paged:
    MIN_CAPACITY_PAGED's) cache capacity for Nq, on inputs it takes (refusal), unless FLASHBENCH_GLUON=0 or
    FLASHBENCH_TMA=0 turns Gluon off."""
    least = (MIN_CAPACITY if table is None else MIN_CAPACITY_PAGED).get(q.shape[2])
    if least is None or capacity(kv, table) < least or not flash_ws.enabled():
        return False
    return refusal(q, kv, table, head_dim_v) is None


def refusal(q: torch.Tensor, kv: torch.Tensor, table: torch.Tensor | None, head_dim_v: int) -> str | None:
    """Why this kernel does not take inputs flash_mla_decode has checked (one line), else None."""
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if table is not None and kv.shape[2] % BLOCK_N:
        return f"page size {kv.shape[2]} (pages must be a multiple of {BLOCK_N} tokens, the cache tile)"
    if q.shape[-1] != HEAD_DIM or head_dim_v != HEAD_DIM_V:
        return f"head dims {q.shape[-1]} / {head_dim_v} (only {HEAD_DIM} / {HEAD_DIM_V})"
    if q.dtype not in _GL_DTYPES:
        return f"dtype {q.dtype} (fp16 or bf16 only)"
    if not on_hopper(q.device):
        return "needs a Hopper GPU (capability 9.x)"
    if not kv.is_contiguous():
        return "needs a contiguous kv_cache"
    if q.data_ptr() % 16 or kv.data_ptr() % 16:
        return "needs 16-byte aligned q and kv_cache (TMA)"
    if max(q.shape[0] * q.shape[1] * q.shape[2], kv.shape[0] * kv.shape[2]) >= 2**31:
        return "too many q or cache rows for 32-bit TMA coordinates"
    return None


def on_hopper(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.x."""
    return device.type == "cuda" and capability_major(device.index) == 9


def grid(batch: int, rows: int, splits: int) -> tuple[int, int, int]:
    """(row blocks, splits, batch): 64 query rows per program."""
    return -(-rows // BLOCK_M), splits, batch


def partials_size(batch: int, rows: int, splits: int) -> int:
    """fp32 elements of the partials and their lse: [B, splits, rows, 512] then [B, splits, rows]."""
    return batch * splits * rows * (HEAD_DIM_V + 1)


@triton.jit
def _mla_combine(
    Out,  # [B, H, Nq, D_V] output
    Part,  # fp32 partials [B, splits, ROWS, D_V]
    Lse,  # fp32 their log2-sum-exps [B, splits, ROWS]
    splits,
    ROWS: tl.constexpr,  # H * Nq
    D_V: tl.constexpr,
    COMBINE_ROWS: tl.constexpr,
    S_CHUNK: tl.constexpr,
    PDL: tl.constexpr,  # launched behind the kernel as a programmatic dependent launch: wait for its end first
):
    """Rows [pid0 * COMBINE_ROWS, +COMBINE_ROWS) of sequence pid1: decode._combine over this launch's partials."""
    # Every partial is written once the grid this launch depends on has ended (and its memory is flushed).
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], tl.int32, False, 1)
    b = tl.program_id(1)
    first_part = b.to(tl.int64) * splits * ROWS
    _combine(Out=Out, Part=Part, Lse=Lse, first_part=first_part,
             first_row=tl.program_id(0) * COMBINE_ROWS, out_base=b.to(tl.int64) * ROWS * D_V, splits=splits,
             ROWS=ROWS, HEAD_DIM=D_V, ROWS_P2=COMBINE_ROWS, S_CHUNK=S_CHUNK)  # fmt: skip


def combine_rows(splits: int) -> int:
    """Rows per _mla_combine program for `splits` splits: the most, up to COMBINE_ROWS, whose partials of every
    split one step reads (decode.combine_chunk), else 1."""
    rows = COMBINE_ROWS
    while rows > 1 and combine_chunk(splits, rows, HEAD_DIM_V) < splits:
        rows //= 2
    return rows


def _combine_call(batch: int, rows: int, splits: int) -> KernelCall:
    """_mla_combine's launch for `batch` sequences of `rows` rows and `splits` splits; its run-time arguments are
    (out, part, lse, splits)."""
    per = combine_rows(splits)
    constexprs = {
        "ROWS": rows,
        "D_V": HEAD_DIM_V,
        "COMBINE_ROWS": per,
        "S_CHUNK": combine_chunk(splits, per, HEAD_DIM_V),
        "PDL": _pdl(),
    }
    options = {"num_warps": 4, "launch_pdl": True} if constexprs["PDL"] else {"num_warps": 4}
    return KernelCall(_mla_combine, (-(-rows // per), batch), constexprs, options)


def _pdl() -> bool:
    """Whether the combine is a programmatic dependent launch (PDL): on the GPU, not under the interpreter."""
    return PDL and not interpreting()


def combine(out: torch.Tensor, part: torch.Tensor, lse: torch.Tensor, rows: int, splits: int) -> None:
    """out [B, H, Nq, 512] from the partial outputs `part` [B, splits, rows, 512] and their log2-sum-exps `lse`
    [B, splits, rows] (fp32, contiguous) of `splits` splits."""
    _combine_call(out.shape[0], rows, splits)((out, part, lse, splits))


def workspace(device: torch.device, batch: int, rows: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial outputs [B, splits, rows, 512], their lse [B, splits, rows]): views of decode.py's workspace."""
    flat = _scratch(device, 1, partials_size(batch, rows, splits))[1]
    # as_strided: one op a view where a slice and a view are two (2.4 against 4.9 us for both, on the CPU machine)
    n, offset = splits * rows, flat.storage_offset()
    part = flat.as_strided(
        (batch, splits, rows, HEAD_DIM_V), (n * HEAD_DIM_V, rows * HEAD_DIM_V, HEAD_DIM_V, 1)
    )
    lse = flat.as_strided((batch, splits, rows), (n, rows, 1), offset + batch * n * HEAD_DIM_V)
    return part, lse


def _descriptor(view: torch.Tensor, rows: int, cols: int = 0) -> Any:
    """A TMA descriptor of a column block of a [-1, 576] view, its boxes [rows, cols] (0: the block's columns)."""
    block = [rows, cols or view.shape[1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, _GL_DTYPES[view.dtype]))
    return TensorDescriptor.from_tensor(view, block, layout)


def _columns(t: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The latent [n, 512] and rotary [n, 64] column blocks of a contiguous tensor of n rows of 576, as views (the
    descriptors' bases); as_strided: one op a view where a view and a slice are two."""
    offset = t.storage_offset()
    return t.as_strided((n, HEAD_DIM_V), (HEAD_DIM, 1)), t.as_strided(
        (n, HEAD_DIM - HEAD_DIM_V), (HEAD_DIM, 1), offset + HEAD_DIM_V
    )


class _Plan:
    """One input signature's launches: the kernel's (KernelCall: the JIT once, then the compiled kernel) and, with
    several splits, the combine's; nothing of a call's tensors is kept."""

    __slots__ = ("call", "combine")

    def __init__(self, call: KernelCall, combine: KernelCall | None) -> None:
        self.call, self.combine = call, combine


def split_schedule(rows: int) -> bool:
    """Whether a sequence of `rows` query rows (H * Nq) runs mla_split_kernel.py's schedule (SPLIT_ROWS)."""
    return rows <= SPLIT_ROWS


def _plan(batch: int, rows: int, splits: int, constexprs: dict[str, Any]) -> _Plan:
    kernel = _mla_decode_split if split_schedule(rows) else _mla_decode_ws
    call = KernelCall(kernel, grid(batch, rows, splits), constexprs, {"num_warps": 4})
    return _Plan(call, None if constexprs["DIRECT"] else _combine_call(batch, rows, splits))


# Launch plans by input signature (mla_decode_ws's key), the oldest dropped first past PlanCache's size.
_PLANS = PlanCache(_plan)


def mla_decode_ws(
    q: torch.Tensor,
    kv: torch.Tensor,
    lens: torch.Tensor | None,
    table: torch.Tensor | None,
    causal: bool,
    qk_scale: float,
    splits: int,
) -> torch.Tensor:
    """out [B, H, Nq, 512] of inputs flash_mla_decode has checked and `refusal` has taken (qk_scale: sm_scale *
    log2(e)); table: the block table of a paged kv; splits: the key splits per sequence."""
    B, H, Nq, _ = q.shape
    rows, keys = H * Nq, capacity(kv, table)
    paged = table is not None
    q = q if q.is_contiguous() else q.contiguous()
    out = torch.empty((B, H, Nq, HEAD_DIM_V), dtype=q.dtype, device=q.device)
    # Out stands in for an unused Table: a pointer of the same alignment leaves the contiguous build as it was
    pages = out if table is None else table.contiguous()
    direct = splits == 1
    # What the compiled kernels specialize on, less what is fixed here or by `refusal`: q, kv, out and the
    # workspace are 16-byte aligned, kv and (above) q contiguous, the dims 576 / 512.
    key = (
        q.dtype,
        q.device.index,
        B,
        rows,
        Nq,
        keys,
        splits,
        lens is not None,
        0 if lens is None else lens.data_ptr() % 16,
        causal,
        (kv.shape[0], kv.shape[2], pages.data_ptr() % 16) if paged else None,  # pool pages, page, table
    )
    plan = _PLANS.plans.get(key)
    if plan is None:
        constexprs = {
            "D_V": HEAD_DIM_V,
            "PAGED": paged,
            "PAGE": kv.shape[2] if paged else 1,
            "HAS_SEQLENS": lens is not None,
            "CAUSAL": causal,
            "DIRECT": direct,
            "CONSUMER_REGS": CONSUMER_REGS,
            "PRODUCER_REGS": PRODUCER_REGS,
            "PDL": _pdl() and not direct,
        }
        plan = _PLANS.get(key, B, rows, splits, constexprs)
    # each read through two descriptors, of its latent and its rotary columns (the views' bases are the TMA bases)
    tensors = (*_columns(q, B * rows), *_columns(kv, kv.shape[0] * kv.shape[2]))
    part, lse = (out, out) if direct else workspace(q.device, B, rows, splits)
    lens_or_out = out if lens is None else lens
    rest = (lens_or_out, out, part, lse, qk_scale, keys, splits, rows, Nq, pages, kv.shape[0], kv)
    call = plan.call
    if call.direct:
        call((*tensors, *rest))
    else:
        # a cache tile's latent columns go in two halves, each back to the producer on its own
        boxes = ((BLOCK_M, 0), (BLOCK_M, 0), (BLOCK_N, HEAD_DIM_V // 2), (BLOCK_N, 0))
        call((*(_descriptor(t, *box) for t, box in zip(tensors, boxes, strict=True)), *rest))
    if plan.combine is not None:
        plan.combine((out, part, lse, splits))
    return out

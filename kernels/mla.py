"""Multi-head latent attention (MLA) decode, DeepSeek-V2/V3's absorbed form, split over the keys.

Origin: DeepSeek-V2 (DeepSeek-AI, 2024), section 2.1: with W_UK absorbed into the query and W_UV into the output
projection, every query head attends over one shared latent cache c_KV (512 dims) plus one shared decoupled
rotary key (64 dims): k = [c_KV, k_rope] (576 dims), v = c_KV. FlashMLA (deepseek-ai/FlashMLA) serves this decode
on Hopper with 64 query rows per CTA and a split-KV combine; this is the same plan in Triton's block language,
on kernels/decode.py's split, combine and launch machinery.

    q                 [B, H, Nq, D_V + D_ROPE]   (576 = 512 + 64 for DeepSeek-V3)
    contiguous cache  [B, 1, Nmax, D_V + D_ROPE], cache_seqlens [B] int32 (default: all Nmax)
    paged cache       [pages, 1, PAGE, D_V + D_ROPE] (a pool), block_table [B, max_pages] int32
    output            [B, H, Nq, D_V] = softmax(q k^T * scale) v, k = the cache row, v = its first D_V dims

Loop order: one kernel, _mla_decode, one program per (query-row block, key split s, sequence b). The H * Nq query
rows of a sequence (row r = h * Nq + i: query head h, query i) all read the one latent head, so they form the M
dimension of the tiles: BLOCK_M = 64 rows per program, and the H * Nq / 64 row blocks of one split are adjacent in
the grid (axis 0), so they stream the same keys at about the same time and the second reads them from L2. Per
block of BLOCK_N keys the program loads the cache tile once, as two tiles (Triton's blocks are powers of two):
the latent [BLOCK_N, D_V] and the rotary part [BLOCK_N, D_ROPE]; S = q_lat c^T + q_rope k_rope^T, then the online
softmax (exp2, log2(e) in the scale), then acc += P c with the same latent tile as V. With one split it writes the
output; otherwise its normalised fp32 partial and log2-sum-exp per row, and the last split program of a row block
combines them (kernels/decode.py's _combine, COMBINE_ROWS rows at a time to bound its registers).

Why MLA decode can be compute-bound: each cache token (576 x 2 bytes in bf16) meets H * Nq query rows, each
2 * (576 + 512) FLOPs, about 1.9 * H * Nq FLOP per byte: 242 at H = 128, Nq = 1, against an H100's ridge of
~300 (989 TFLOP/s over 3.35 TB/s); at Nq = 2 the roofline says compute-bound (flashbench/models: mla).

Tensor cores (Hopper): S is computed by the two warpgroups on half the keys each, P V on half of the 512 output
columns each. Triton lays out a dot whose result feeds another dot with all warps along M (warpsPerCTA [8, 1]):
with 64 rows both warpgroups would compute all of S (72 HGMMA.64x16x16 a pass of 32 keys, not 36), and every
wgmma reads its Q operand from shared memory, so the duplicate costs shared-memory bandwidth the cache tile needs.
So the loop keeps S's dots out of that chain: the latent and rotary dots each start from zero (Triton would merge
`s += dot(...)` into one chain), and S reaches P only through the branch that masks a block's invisible keys (Triton
does not follow a value into a branch). S is then [4, 2]; P goes through shared memory to P V's layout.

Registers (Hopper, the reason for the tile): the fp32 accumulator is BLOCK_M x D_V; at 64 x 512 over 8 warps that
is 128 registers per thread, plus S (64 x BLOCK_N fp32: 8-16) and the Q operand if Triton keeps it in registers.
BLOCK_M = 128 would need 256 for the accumulator alone; fewer warps likewise. The cache tile is 36 KB of shared
memory per stage at BLOCK_N = 32 (72 KB at 64), and Q 72 KB if staged there: GPU_CONFIG and CANDIDATE_CONFIGS.

Cautions (as flash_decode's; its module docstring says why):
  - validate=True reads cache_seqlens and block_table on the host (one device sync); in a timed loop validate
    once, then pass validate=False.
  - Causal masks are aligned bottom-right: query i sees key j iff j <= L_b - Nq + i; a row that sees no key writes
    0, never NaN.
  - P is cast to the cache dtype before P @ V; acc, m, l, the partials stay fp32; fp32 inputs use IEEE dots.
  - Sequence and page bases are int64.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from . import mla_ws
from .common import LOG2E, dot, interpreting
from .decode import (
    DECODE_DTYPES,
    _check_cache_layout,
    _check_data,
    _check_device,
    _check_index_tensors,
    _check_scale,
    _combine,
    _forced_config,
    _launch,
    _pow2,
    _scratch,
    _splits,
    _store_partial,
    combine_chunk,
    last_launch,
)
from .decode import _refuse as _refuse_as
from .mla_ws import KERNEL as GLUON_KERNEL

NAME = "flash_mla_decode"

MLA_HEAD_DIM = 576  # DeepSeek-V2/V3: 512 latent + 64 rotary dims
MLA_HEAD_DIM_V = 512
MAX_QUERIES = 4  # query tokens per sequence (speculative decoding's few); the rows are H * Nq
# D_V and D_ROPE are constexpr: any powers of two (D_ROPE may be 0), so the CPU tests run scaled-down latents.
MAX_HEAD_DIM_V = 512
BLOCK_M = 64  # query rows per tile: one wgmma M per warpgroup on Hopper
# Rows the kernel's own combine holds per step: 16 x 512 fp32 over 8 warps is 32 registers per thread. 4 rows (4
# splits a step, as mla_ws.COMBINE_ROWS's separate combine kernel) took 1.01-1.04x the call's time on an H100 at
# 4k and 32k keys, Nq = 1 (docs/kernels.md).
COMBINE_ROWS = 16
# The tile on CUDA: keys per step, warps, stages; the default as timed on an H100 (docs/benchmarks.md, "MLA decode").
# Shared memory at 576 dims in bf16 (tools/sm90_compile.py, Triton 3.6): Q 72 KB, a cache tile of 72 KB per stage at
# BLOCK_N 64, and P's 8 KB on its way to P V, of an H100's 227 KB: (64, 8, 2) 224 KB, pipelined, a 64 x 32 S per
# warpgroup; (64, 8, 1) 144 KB, unpipelined, not timed. 32-key tiles lost (docs/kernels.md, measured and not
# adopted).
GPU_CONFIG: dict[str, int] = {"BLOCK_N": 64, "num_warps": 8, "num_stages": 2}
CANDIDATE_CONFIGS: tuple[dict[str, int], ...] = (
    GPU_CONFIG,
    {"BLOCK_N": 64, "num_warps": 8, "num_stages": 1},
)
INTERPRET_CONFIG: dict[str, int] = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}

# What the most recent launch ran with: (num_splits, tile config, BLOCK_M, row blocks); last_mla_config().
_LAST_LAUNCH: list[Any] = [None]
# the Gluon kernel's tile and schedule (mla_ws.split_schedule: "split" where the rows fit one program, else
# "seesaw"), as _LAST_LAUNCH keeps it
_GLUON_TILES = {
    split: {"kernel": GLUON_KERNEL, "BLOCK_N": mla_ws.BLOCK_N, "schedule": "split" if split else "seesaw"}
    for split in (True, False)
}


@triton.jit
def _opaque(x):
    """x unchanged, through an op Triton cannot see into (a register move that ptxas drops): the loop's use."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _mla_decode(
    Q,  # [B, H, Nq, D_V + D_ROPE] queries, contiguous
    KV,  # the latent cache: contiguous [B, 1, Nmax, D_V + D_ROPE], or paged [pages, 1, PAGE, D_V + D_ROPE]
    Seqlens,  # [B] int32 keys per sequence (read when HAS_SEQLENS)
    Table,  # [B, capacity / PAGE] int32 page table, contiguous (read when PAGED)
    Out,  # [B, H, Nq, D_V] output, contiguous
    Part,  # fp32 workspace (not DIRECT): partial outputs [B, 1, splits, ROWS, D_V], then lse [B, 1, splits, ROWS]
    Counter,  # [B * row blocks] int32 split counters, zero on entry and on exit (not DIRECT)
    qk_scale,  # sm_scale * log2(e)
    capacity,  # keys the cache holds per sequence: Nmax, or max_pages * PAGE
    splits,  # key splits per sequence
    ROWS,  # H * Nq query rows per sequence
    Nq,  # queries per sequence
    stride_kb,  # cache strides: sequence (contiguous) or page (paged), token
    stride_kn,
    D_V: tl.constexpr,  # latent dims: V and the output
    D_ROPE: tl.constexpr,  # rotary dims after the latent (0: none)
    BLOCK_M: tl.constexpr,  # query rows per tile, a power of two >= 16
    BLOCK_N: tl.constexpr,  # keys per step
    PAGE: tl.constexpr,  # tokens per page (PAGED)
    PAGED: tl.constexpr,
    HAS_SEQLENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: normalise and write Out, no partials, no combine
    IEEE: tl.constexpr,  # fp32 inputs: IEEE dots, not TF32
    COMBINE_ROWS: tl.constexpr,  # the combine's rows per step (a power of two dividing BLOCK_M)
    S_CHUNK: tl.constexpr,  # the combine's splits per step
    WAIT_PV: tl.constexpr,  # finish each step's P V before the next S (compiled only: inline PTX)
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2)
    D = D_V + D_ROPE
    L = capacity
    if HAS_SEQLENS:
        L = tl.minimum(tl.load(Seqlens + b), capacity)
    # This split's keys [lo, hi): whole blocks of this sequence's own length (as flash_decode splits).
    per = tl.cdiv(tl.cdiv(L, BLOCK_N), splits) * BLOCK_N
    lo = pid_s * per
    hi = tl.minimum(lo + per, L)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = h * Nq + i: query head h, query i
    row_ok = rows < ROWS
    offs_v = tl.arange(0, D_V)
    q_base = b.to(tl.int64) * ROWS * D
    q_rows = Q + q_base + rows[:, None] * D
    q_lat = tl.load(q_rows + offs_v[None, :], mask=row_ok[:, None], other=0.0)
    if D_ROPE > 0:
        offs_r = D_V + tl.arange(0, D_ROPE)
        q_rope = tl.load(q_rows + offs_r[None, :], mask=row_ok[:, None], other=0.0)
    # Last key each row sees within this split (bottom-right causal alignment).
    # ... and the keys below unmasked_hi every row sees: a block under it needs no mask.
    if CAUSAL:
        last = tl.minimum(L - Nq + rows % Nq, hi - 1)
        unmasked_hi = tl.minimum(L - Nq + 1, hi)
    else:
        last = tl.zeros([BLOCK_M], dtype=tl.int32) + (hi - 1)
        unmasked_hi = hi
    if PAGED:
        pages = Table + b.to(tl.int64) * (capacity // PAGE)
        seq = KV
    else:
        seq = KV + b.to(tl.int64) * stride_kb

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_V], dtype=tl.float32)
    s_zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        if WAIT_PV:
            # P V's A operand (P) is in registers that ptxas gives the next step's S accumulators; with P V left
            # running across the back edge, as Triton's pipeliner leaves it, ptxas then serialises every wgmma
            # (its warning C7515). A use of acc here makes Triton wait for P V before the next S.
            acc = _opaque(acc)
        offs_n = start + tl.arange(0, BLOCK_N)
        key_ok = offs_n < hi
        if PAGED:
            page = tl.load(pages + offs_n // PAGE, mask=key_ok, other=0).to(tl.int64)
            kv_rows = seq + page * stride_kb + (offs_n % PAGE) * stride_kn
        else:  # int64: a token stride times a long context can pass 2^31
            kv_rows = seq + offs_n.to(tl.int64) * stride_kn
        # The latent tile is K's first D_V dims and all of V: loaded once, used by both dots.
        c = tl.load(kv_rows[:, None] + offs_v[None, :], mask=key_ok[:, None], other=0.0)
        # Two dots from zero, each scaled, then the mask in a branch: S stays out of the P V dot's chain (the module
        # docstring, "Tensor cores"), so each warpgroup computes half of its keys.
        s = dot(q_lat, tl.trans(c), s_zero, IEEE) * qk_scale
        if D_ROPE > 0:
            k_rope = tl.load(kv_rows[:, None] + offs_r[None, :], mask=key_ok[:, None], other=0.0)
            s += dot(q_rope, tl.trans(k_rope), s_zero, IEEE) * qk_scale
        if start + BLOCK_N > unmasked_hi:
            s = tl.where(offs_n[None, :] <= last[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = dot(p.to(c.dtype), c, acc * alpha[:, None], IEEE)
        m_i = m_new

    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    out_base = b.to(tl.int64) * ROWS * D_V
    if DIRECT:
        o_ptrs = Out + out_base + rows[:, None] * D_V + offs_v[None, :]
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        # Release the partials, then the last split program of this row block combines them (acquire) and puts
        # the counter back to 0 for the next launch (kernels/decode.py's protocol).
        Lse, first_part = _store_partial(
            Part, o, m_i, l_i, seen, b, pid_s, rows, row_ok, offs_v, splits, ROWS, D_V
        )
        counter = Counter + b * tl.num_programs(0) + pid_m
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
            for r0 in tl.static_range(0, BLOCK_M, COMBINE_ROWS):
                _combine(Out=Out, Part=Part, Lse=Lse, first_part=first_part, first_row=pid_m * BLOCK_M + r0,
                         out_base=out_base, splits=splits, ROWS=ROWS, HEAD_DIM=D_V, ROWS_P2=COMBINE_ROWS,
                         S_CHUNK=S_CHUNK)  # fmt: skip
            tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


def _refuse(message: str) -> None:
    _refuse_as(message, NAME)


def _check_tensors(q: Any, kv: Any, lens: Any, table: Any, head_dim_v: Any) -> None:
    """Shapes, dtypes, devices, layouts: no device data read."""
    for label, t in (("q", q), ("kv_cache", kv)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _refuse(f"{label} must be a 4-D torch.Tensor, got {getattr(t, 'shape', type(t).__name__)}")
    _check_index_tensors(lens, table, NAME)
    if q.dtype != kv.dtype:
        _refuse(f"q and kv_cache dtypes differ ({q.dtype}, {kv.dtype})")
    if q.dtype not in DECODE_DTYPES:
        _refuse(f"dtype {q.dtype} unsupported (fp16, bf16, fp32 are)")
    dev = q.device  # the message built only on failure, as flash_decode's: str(device) costs ~0.5 us a tensor
    if not (kv.device == dev and (lens is None or lens.device == dev)) or (
        table is not None and table.device != dev
    ):
        devices = sorted({str(t.device) for t in (q, kv, lens, table) if t is not None})
        _refuse(f"inputs are on different devices ({', '.join(devices)})")
    _check_device(q, NAME)
    B, H, Nq, D = q.shape
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int):
        _refuse(f"head_dim_v must be an int, got {head_dim_v!r}")
    rope = D - head_dim_v
    if not 16 <= head_dim_v <= MAX_HEAD_DIM_V or head_dim_v & (head_dim_v - 1):
        _refuse(f"head_dim_v {head_dim_v} must be a power of two in 16..{MAX_HEAD_DIM_V}")
    if rope < 0 or (rope and (rope < 16 or rope & (rope - 1))):
        _refuse(f"q's head dim {D} minus head_dim_v {head_dim_v} must be 0 or a power of two >= 16")
    if kv.shape[1] != 1:
        _refuse(f"the latent cache has one head (kv_cache.shape[1] == 1), got {kv.shape[1]}")
    if kv.shape[3] != D:
        _refuse(f"head dim differs between q ({D}) and kv_cache ({kv.shape[3]})")
    if min(*q.shape, *kv.shape) < 1:
        _refuse(f"empty input (q {tuple(q.shape)}, kv_cache {tuple(kv.shape)})")
    if Nq > MAX_QUERIES:
        _refuse(f"at most {MAX_QUERIES} query tokens per sequence, got {Nq}")
    if kv.stride(3) != 1:
        _refuse("kv_cache needs a unit stride in its last dimension")
    _check_cache_layout(B, kv, lens, table, "kv_cache", NAME)


def last_mla_config() -> dict[str, Any] | None:
    """The split count and tile of the most recent flash_mla_decode launch in this process, or None before any."""
    return last_launch(_LAST_LAUNCH)


def flash_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    causal: bool = True,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    head_dim_v: int = MLA_HEAD_DIM_V,
    *,
    validate: bool = True,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """MLA decode in the absorbed form: q [B, H, Nq, D] over one latent cache; out [B, H, Nq, head_dim_v].

    kv_cache: [B, 1, Nmax, D], or with block_table [B, max_blocks] int32 a page pool [num_blocks, 1, block_size, D];
    k is a cache row's D dims, v its first head_dim_v (D = 576, head_dim_v = 512 for DeepSeek-V3; the rest, D -
    head_dim_v, is 0 or a power of two). cache_seqlens, causal, num_splits, validate: as flash_decode's
    (kernels/decode.py). sm_scale: default D^-0.5 (DeepSeek passes its own: the scale of the unabsorbed head dim).
    config: force {"BLOCK_N", "num_warps", "num_stages"} (default GPU_CONFIG; CANDIDATE_CONFIGS lists others), or
    {"kernel": "gluon-ws"}: kernels/mla_ws.py's Gluon kernel on Hopper (refused where it does not apply).
    Raises KernelUnsupported (a ValueError) naming what it refuses.
    """
    _check_tensors(q, kv_cache, cache_seqlens, block_table, head_dim_v)
    if not isinstance(causal, bool):
        _refuse(f"causal must be a bool, got {causal!r}")
    kv, paged = kv_cache, block_table is not None
    B, H, Nq, D = q.shape
    page = kv.shape[2] if paged else 1
    capacity = block_table.shape[1] * page if block_table is not None else kv.shape[2]
    scale = _check_scale(1.0 / math.sqrt(D) if sm_scale is None else sm_scale, NAME)
    if validate:
        _check_data(cache_seqlens, block_table, capacity, kv.shape[0], page, name=NAME)
    rows = H * Nq
    if (isinstance(config, dict) and config.get("kernel") == GLUON_KERNEL) or (
        config is None and mla_ws.preferred(q, kv, block_table, head_dim_v)
    ):
        return _gluon(q, kv, cache_seqlens, block_table, causal, scale, num_splits, head_dim_v, config)
    cfg = _forced_config(INTERPRET_CONFIG if interpreting() else GPU_CONFIG, config, (16, 32, 64, 128), NAME)
    block_m = min(BLOCK_M, max(16, _pow2(rows)))
    row_blocks = -(-rows // block_m)
    num_splits = _splits(num_splits, B * row_blocks, capacity, cfg["BLOCK_N"], q.device, NAME)

    q = q if q.is_contiguous() else q.contiguous()
    out = torch.empty((B, H, Nq, head_dim_v), dtype=q.dtype, device=q.device)
    direct = num_splits == 1
    if direct:  # no partials: Out stands in for the unused pointers
        counters = part = out
    else:  # partial outputs [B, 1, splits, rows, D_V], then their lse [B, 1, splits, rows]
        counters, part = _scratch(q.device, B * row_blocks, B * num_splits * rows * (head_dim_v + 1))
    combine_rows = min(COMBINE_ROWS, block_m)
    s_chunk = combine_chunk(num_splits, combine_rows, head_dim_v)
    table = out if block_table is None else block_table.contiguous()
    args = (  # _mla_decode's arguments in order: 7 tensors, the float scale, then integers and constexprs
        q, kv, out if cache_seqlens is None else cache_seqlens, table, out, part, counters,
        float(scale) * LOG2E,
        capacity, num_splits, rows, Nq, kv.stride(0), kv.stride(2),
        head_dim_v, D - head_dim_v, block_m, cfg["BLOCK_N"], page, paged, cache_seqlens is not None, causal,
        direct, q.dtype == torch.float32, combine_rows, s_chunk, not interpreting(),
    )  # fmt: skip
    _LAST_LAUNCH[0] = (num_splits, cfg, block_m, row_blocks)
    try:
        _launch((row_blocks, num_splits, B), args, 7, cfg["num_warps"], cfg["num_stages"], kernel=_mla_decode)
    except OutOfResources as exc:  # a forced config too large for this GPU
        _refuse(f"config {cfg} does not fit this GPU: {exc}")
    return out


def _gluon(
    q: torch.Tensor,
    kv: torch.Tensor,
    lens: torch.Tensor | None,
    table: torch.Tensor | None,
    causal: bool,
    scale: float,
    num_splits: int | None,
    head_dim_v: int,
    config: dict[str, Any] | None,
) -> torch.Tensor:
    """flash_mla_decode through kernels/mla_ws.py's Gluon kernel: forced by config (checked here), or the default
    where mla_ws.preferred took the input (its refusal already ran)."""
    if config is not None:
        if set(config) != {"kernel"}:
            _refuse(f"config {config!r}: the Gluon kernel takes no tile keys (its tile is fixed: mla_ws.py)")
        why = mla_ws.refusal(q, kv, table, head_dim_v)
        if why is not None:
            _refuse(f"the Gluon kernel does not take this input: {why}")
    B, H, Nq, _ = q.shape
    rows, capacity = H * Nq, mla_ws.capacity(kv, table)
    row_blocks = mla_ws.grid(B, rows, 1)[0]
    num_splits = _splits(num_splits, B * row_blocks, capacity, mla_ws.BLOCK_N, q.device, NAME)
    _LAST_LAUNCH[0] = (num_splits, _GLUON_TILES[mla_ws.split_schedule(rows)], mla_ws.BLOCK_M, row_blocks)
    return mla_ws.mla_decode_ws(q, kv, lens, table, causal, scale * LOG2E, num_splits)

"""HBM (DRAM) traffic of one attention call, per implementation family and mode. Pure: numbers in, bytes out.

Every model returns a Traffic: named parts, each with bytes read and bytes written, so a report can say where
the bytes go. Tensors are [B, H, N, d]; K and V have Hkv heads (GQA); e = bytes per element of the input dtype
(e = 1, FP8 e4m3: the forward writes a bf16 O, traffic.out_bytes; only the compulsory and flash forwards take it).

compulsory_traffic(): the floor for ANY exact attention: each input read once, each output written once.
    MLA's absorbed form (head_dim_v, Case.latent): V is the first head_dim_v dims of the one latent K cache, so
    the floor reads that cache once (d * e bytes per token: 1152 B at 576 dims in bf16), and O has head_dim_v dims.
    fwd: read Q, K, V; write O.  bwd: read Q, K, V, O, dO, LSE; write dQ, dK, dV.  fwd+bwd: both, with the
    forward also writing the LSE the backward reads. No kernel can move fewer DRAM bytes than this.

Families (hbm_traffic):
  naive      the PyTorch eager path, op by op, as the sweep's naive provider runs it:
                 s = (q @ k.transpose(-2, -1)) * scale; [causal: s = s.masked_fill(~mask, -inf)]
                 p = torch.softmax(s.float(), dim=-1).to(q.dtype); o = p @ v
             Every op reads its inputs from and writes its output to DRAM. Per attention-matrix element
             (fp16/bf16) the forward moves 2 (S) + 4 (scale) + 6 (.float) + 8 (softmax) + 6 (.to) + 2 (P@V)
             = 28 bytes and the autograd backward 48 bytes; fp32 inputs: 24 and 48 (the casts are no-ops).
             The backward's softmax step is two passes on CUDA: ATen's softmax_backward_cuda_out first
             computes `tmp = grad * output` (8 bytes read, 4 written per element, fp32), then its kernel
             reads tmp and the output and writes dS (8 + 4; the kernel's second read of a row of tmp, after
             the row's sum, is assumed to hit L2: one row is 4 N bytes). Not yet checked with Nsight Compute:
             `python3 tools/ncu_bytes.py drive --impls naive,sdpa-math --modes bwd --kernels` lists the
             measured DRAM bytes per kernel beside these parts.
             The N x N intermediates are assumed to miss L2 (true once B*H*N*N*e exceeds the L2 size).
  sdpa-math  torch >= 2.5's math backend: fp16/bf16 are upcast to fp32 (unless
             torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)), q and k are each scaled by
             sqrt(scale), S is fp32, and _safe_softmax adds eq(-inf) / all / where passes over it.
  flash      fused kernels (FlashAttention-2 loop order: outer loop over query blocks, inner over K/V blocks;
             SDPA flash / efficient / cuDNN, the bundled Triton kernel). With l2_reuse=True: each tensor
             read or written once (compulsory traffic, plus the backward's Delta = rowsum(dO * O) pre-pass).
             With l2_reuse=False: K and V re-read once per query block (block_m rows) in the forward and the
             dQ pass; Q, dO, LSE and Delta re-read once per K/V block (block_n) in the dK/dV pass. Causal
             and sliding-window kernels skip fully masked blocks, so only the visited blocks are counted.
  stored-p   the bundled stored_p.py: the forward writes P (the visited tiles, e per element; a statistics
             sweep then a P sweep over K); the backward is flash's with P read (not recomputed) in both the
             dK/dV and the dQ pass.
  flash-v1   the bundled flash_v1.py, FlashAttention-1's loop order (paper Algorithm 1): outer loop over K/V
             blocks, inner over query blocks, so the fp32 O accumulator, m and l are read and written once
             per K/V block; the backward is flash's (recompute).
  decode     the bundled split-KV decode (kernels/decode.py, Flash-Decoding), forward only: Q read, K and V read
             once per KV head (the query heads of a group share one pass), O written (an MLA case, kernels/mla.py:
             the one latent cache read once, its tile serving as K and as V; O of head_dim_v dims); with s > 1 key splits
             (Blocks.splits, the row's kernel_config num_splits) every split also writes its normalised fp32
             partial output and log-sum-exp per query row, and the combine reads them back:
             2 * s * B * H * Nq * (d + 1) * 4 bytes. A paged cache moves the same bytes: the kernel reads a page's
             rows up to the sequence's length, and a row (d * e = 256 B at d = 128 in bf16) is whole 32-byte
             sectors; the page table (4 bytes per page: 64 KiB of K and V per entry at page 16, Hkv 8, d 128,
             bf16) and the lengths are left out. Counters (one int32 per group) likewise.
Ragged batches (`seqlens_k`: each sequence's valid keys): every family's traffic is summed sequence by sequence
(each a batch of one with its own key count), so K and V count the valid keys only.
Packed documents (`documents`: a packed training batch's lengths, spec/cases.py): the tiled families' traffic is
summed document by document, each a batch of one with seq_q = seq_k = L (blocks outside a document are never
visited); naive and sdpa-math run one dense [T, T] score matrix over the T packed tokens under an explicit
block-diagonal mask (providers/torch_baselines.py), so they are modelled as one sequence of T with a mask.
The flash backward is the bundled kernel's (backward.py): a Delta pre-pass; a dK/dV pass per K/V block of
each K/V head streaming Q, dO, LSE, Delta of every query head in its GQA group; then either a dQ pass per query
block streaming K, V (two passes), or, where the row's kernel_config says ONE_PASS (the bundled Gluon backward,
as FlashAttention-2's and -3's CUDA backwards), dQ added into a zeroed fp32 buffer from the dK/dV pass (an fp32
tile read and written per K/V block without L2 reuse; once with it) and converted after. Rows without a
kernel_config (sdpa-flash) get the two-pass figure, an approximation for them.

Why the naive count is not 003's "4 N^2": that document counts S written, S read, P written, P read once
each in fp16 (8 bytes per element). PyTorch's eager path also writes the scaled copy and, with the fp32
softmax, the upcast and downcast copies: 28 bytes per element in fp16, 3.5x more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from flashbench.models.flops import Alignment
from flashbench.models.traffic import (  # noqa: F401  (Part, Blocks, Shape and the row counts: io_model's API)
    FP32,
    Blocks,
    Part,
    Shape,
    Traffic,
    kv_rows_per_head,
    q_rows_per_head,
    tile_elements_per_head,
)

FAMILIES = ("naive", "sdpa-math", "flash", "stored-p", "flash-v1")  # every mode
# Families that attend packed documents as one dense [T, T] matrix under an explicit mask (module docstring).
DENSE_MASKED = ("naive", "sdpa-math")
DECODE = "decode"  # forward only: the split-KV decode kernel (module docstring)
MODES = ("fwd", "bwd", "fwd+bwd")
ComputeDtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]


def per_sequence(one: Callable[[int], Traffic], seqlens_k: Sequence[int]) -> Traffic:
    """The traffic of a ragged batch: `one(seq_k)` (a batch of one) summed over the sequences, part by part."""
    totals: dict[str, list[int]] = {}
    for n in seqlens_k:
        for p in one(n).parts:
            got = totals.setdefault(p.name, [0, 0])
            got[0] += p.read
            got[1] += p.write
    return Traffic(tuple(Part(name, r, w) for name, (r, w) in totals.items()))


def compulsory_traffic(
    batch: int,
    heads: int,
    kv_heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    elem_bytes: int,
    mode: str,
    seqlens_k: Sequence[int] | None = None,
    documents: Sequence[int] | None = None,
    kv_elem_bytes: int = 0,
    head_dim_v: int = 0,
) -> Traffic:
    """The floor for any exact attention: inputs read once, outputs written once (see module docstring).
    seqlens_k: each sequence's valid keys (a ragged KV cache), len == batch. documents: packed documents'
    lengths (instead of batch, seq_q, seq_k): the tokens they hold. kv_elem_bytes: bytes per K/V element of a
    cache stored in its own dtype (an FP8 KV cache: 1; its scales, 8 bytes per sequence and KV head, are left
    out); 0: elem_bytes. head_dim_v: MLA's V dims."""
    kw: dict[str, Any] = dict(kv_elem_bytes=kv_elem_bytes, head_dim_v=head_dim_v)
    if documents is not None:
        total = sum(documents)
        return compulsory_traffic(1, heads, kv_heads, total, total, head_dim, elem_bytes, mode, **kw)
    if seqlens_k is not None:
        _check_lengths(batch, seqlens_k)
        shape = (heads, kv_heads, seq_q)
        return per_sequence(
            lambda n: compulsory_traffic(1, *shape, n, head_dim, elem_bytes, mode, **kw),
            seqlens_k,
        )
    s = Shape(batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes, False, **kw)
    if s.latent:
        if mode != "fwd":
            raise ValueError("an MLA case (head_dim_v) is modelled forward only")
        return Traffic(
            (Part("read Q, the latent cache (K; V within it)", s.q + s.cache, 0), Part("write O", 0, s.o))
        )
    lse = s.rows * FP32
    fwd = Traffic((Part("read Q, K, V", s.q + 2 * s.kv, 0), Part("write O", 0, s.o)))
    bwd = Traffic(
        (
            Part("read Q, K, V, O, dO, LSE", 2 * s.q + 2 * s.kv + s.q + lse, 0),
            Part("write dQ, dK, dV", 0, s.q + 2 * s.kv),
        )
    )
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return bwd
    if mode == "fwd+bwd":
        return (fwd + Traffic((Part("write LSE", 0, lse),))).prefixed("fwd: ") + bwd.prefixed("bwd: ")
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


# ---------------------------------------------------------------------------------------------- naive


def _naive_fwd(s: Shape) -> Traffic:
    e, E, mask = s.elem_bytes, s.matrix, s.seq_q * s.seq_k
    parts = []
    if s.expanded:
        parts.append(Part("repeat_interleave K, V (GQA)", 2 * s.kv, 2 * s.kv_exp))
    parts.append(Part("S = Q K^T", s.q + s.kv_exp, E * e))
    parts.append(Part("S * scale", E * e, E * e))
    if s.masked:
        parts.append(Part(f"build {_mask_name(s)} mask (bool)", mask, 2 * mask))
        parts.append(Part("masked_fill", E * e + mask, E * e))
    if e < FP32:
        parts.append(Part("S.float()", E * e, E * FP32))
    parts.append(Part("softmax (fp32)", E * FP32, E * FP32))
    if e < FP32:
        parts.append(Part("P.to(dtype)", E * FP32, E * e))
    parts.append(Part("O = P V", E * e + s.kv_exp, s.q))
    return Traffic(tuple(parts))


def _naive_bwd(s: Shape) -> Traffic:
    e, E, mask = s.elem_bytes, s.matrix, s.seq_q * s.seq_k
    parts = [
        Part("dP = dO V^T", s.q + s.kv_exp, E * e),
        Part("dV = P^T dO", E * e + s.q, s.kv_exp),
    ]
    if e < FP32:
        parts.append(Part("dP.float()", E * e, E * FP32))
    parts.append(_softmax_bwd_temporary(s))
    parts.append(Part("softmax backward (fp32)", 2 * E * FP32, E * FP32))
    if e < FP32:
        parts.append(Part("dS.to(dtype)", E * FP32, E * e))
    if s.masked:
        parts.append(Part("masked_fill backward", E * e + mask, E * e))
    parts.append(Part("dS * scale", E * e, E * e))
    parts.append(Part("dQ = dS K", E * e + s.kv_exp, s.q))
    parts.append(Part("dK = dS^T Q", E * e + s.q, s.kv_exp))
    if s.expanded:
        parts.append(Part("sum dK, dV over the group (GQA)", 2 * s.kv_exp, 2 * s.kv))
    return Traffic(tuple(parts))


def _mask_name(s: Shape) -> str:
    return "window" if s.window is not None else "causal"


def _softmax_bwd_temporary(s: Shape) -> Part:
    """CUDA's softmax backward starts with `tmp = grad * output` in fp32 (a pass of its own)."""
    return Part("softmax backward: tmp = grad * output (fp32)", 2 * s.matrix * FP32, s.matrix * FP32)


def _sdpa_math_fwd(s: Shape) -> Traffic:
    e, E, mask = s.elem_bytes, s.matrix, s.seq_q * s.seq_k
    up = FP32 // e if e < FP32 else 1  # bytes factor of the fp32 copies
    q32, kv32, kvx32 = s.q * up, s.kv * up, s.kv_exp * up
    parts = []
    if e < FP32:
        parts.append(Part("q, k, v .float()", s.q + 2 * s.kv, q32 + 2 * kv32))
    parts.append(Part("q, k * sqrt(scale)", q32 + kv32, q32 + kv32))
    if s.expanded:
        parts.append(Part("repeat_interleave K, V (GQA)", 2 * kv32, 2 * kvx32))
    parts.append(Part("S = Q K^T (fp32)", q32 + kvx32, E * FP32))
    if s.masked:
        parts.append(Part(f"build {_mask_name(s)} mask (bool -> fp32)", 2 * mask, 2 * mask + mask * FP32))
        parts.append(Part("S += mask", E * FP32 + mask * FP32, E * FP32))
    parts.append(Part("_safe_softmax: softmax", E * FP32, E * FP32))
    parts.append(Part("_safe_softmax: eq(-inf), all", E * FP32 + E, E + s.rows))
    parts.append(Part("_safe_softmax: where", E * FP32 + s.rows, E * FP32))
    parts.append(Part("O = P V (fp32)", E * FP32 + kvx32, q32))
    if e < FP32:
        parts.append(Part("O.to(dtype)", q32, s.q))
    return Traffic(tuple(parts))


def _sdpa_math_bwd(s: Shape) -> Traffic:
    e, E = s.elem_bytes, s.matrix
    up = FP32 // e if e < FP32 else 1
    q32, kv32, kvx32 = s.q * up, s.kv * up, s.kv_exp * up
    parts = []
    if e < FP32:
        parts.append(Part("dO.float()", s.q, q32))
    parts.append(Part("dP = dO V^T", q32 + kvx32, E * FP32))
    parts.append(Part("dV = P^T dO", E * FP32 + q32, kvx32))
    parts.append(Part("where backward", E * FP32 + s.rows, E * FP32))
    parts.append(_softmax_bwd_temporary(s))
    parts.append(Part("softmax backward", 2 * E * FP32, E * FP32))
    parts.append(Part("dQ = dS K, dK = dS^T Q", 2 * E * FP32 + q32 + kvx32, q32 + kvx32))
    if s.expanded:
        parts.append(Part("sum dK, dV over the group (GQA)", 2 * kvx32, 2 * kv32))
    parts.append(Part("dq, dk * sqrt(scale)", q32 + kv32, q32 + kv32))
    if e < FP32:
        parts.append(Part("dq, dk, dv .to(dtype)", q32 + 2 * kv32, s.q + 2 * s.kv))
    return Traffic(tuple(parts))


# ---------------------------------------------------------------------------------------------- tiled


def _flash_fwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    lse = s.rows * FP32
    if l2_reuse:
        kv_read = s.kv + s.v
        name = "read K, V (once)"
    else:  # K's rows, then V's (MLA: V's head dim)
        rows = s.bh * kv_rows_per_head(s, b.fwd_m, b.fwd_n)
        kv_read = rows * (s.head_dim + s.value_dim) * s.elem_bytes
        name = f"read K, V (once per {b.fwd_m}-row query block)"
    return Traffic((Part("read Q", s.q, 0), Part(name, kv_read, 0), Part("write O, LSE", 0, s.o + lse)))


def _delta_prepass(s: Shape) -> Part:
    return Part("Delta = rowsum(dO * O)", 2 * s.q, s.rows * FP32)


def _flash_bwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    stats = 2 * s.rows * FP32  # LSE and Delta
    if b.bwd_one_pass:
        return _flash_bwd_one_pass(s, b, l2_reuse)
    if l2_reuse:
        parts = [
            _delta_prepass(s),
            Part("read Q, K, V, dO, LSE, Delta", 2 * s.q + 2 * s.kv + stats, 0),
            Part("write dQ, dK, dV", 0, s.q + 2 * s.kv),
        ]
        return Traffic(tuple(parts))
    q_rows = s.bh * q_rows_per_head(s, b.bwd_m, b.bwd_n)
    kv_rows = s.bh * kv_rows_per_head(s, b.bwd_m, b.bwd_n)
    parts = [
        _delta_prepass(s),
        Part("dK/dV pass: read K, V", 2 * s.kv, 0),
        _streamed_per_kv_block(s, b, q_rows),
        Part("dK/dV pass: write dK, dV", 0, 2 * s.kv),
        Part("dQ pass: read Q, dO, LSE, Delta", 2 * s.q + stats, 0),
        Part(f"dQ pass: read K, V (once per {b.bwd_m}-row query block)", 2 * kv_rows * s.row_bytes(), 0),
        Part("dQ pass: write dQ", 0, s.q),
    ]
    return Traffic(tuple(parts))


def _streamed_per_kv_block(s: Shape, b: Blocks, q_rows: int) -> Part:
    return Part(
        f"dK/dV pass: read Q, dO, LSE, Delta (once per {b.bwd_n}-row K/V block)",
        q_rows * (2 * s.row_bytes() + 2 * FP32),
        0,
    )


def _flash_bwd_one_pass(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    """The one-pass backward (the bundled Gluon kernel's ONE_PASS, FlashAttention-2's and -3's): the dK/dV pass also
    adds its dQ = dS K into a zeroed fp32 buffer, which is then converted to the input dtype."""
    dq32 = s.rows * s.head_dim * FP32
    zero, convert = Part("dQ: zero the fp32 buffer", 0, dq32), Part("dQ: convert the fp32 buffer", dq32, s.q)
    if l2_reuse:
        return Traffic(
            (
                _delta_prepass(s),
                zero,
                Part("read Q, K, V, dO, LSE, Delta", 2 * s.q + 2 * s.kv + s.rows * 2 * FP32, 0),
                Part("dQ: fp32 adds (L2 keeps the sums; each line read and written back once)", dq32, dq32),
                Part("write dK, dV", 0, 2 * s.kv),
                convert,
            )
        )
    q_rows = s.bh * q_rows_per_head(s, b.bwd_m, b.bwd_n)
    added = q_rows * s.head_dim * FP32
    return Traffic(
        (
            _delta_prepass(s),
            zero,
            Part("read K, V", 2 * s.kv, 0),
            _streamed_per_kv_block(s, b, q_rows),
            Part(f"dQ: fp32 adds, read and written (once per {b.bwd_n}-row K/V block)", added, added),
            Part("write dK, dV", 0, 2 * s.kv),
            convert,
        )
    )


def _stored_p_fwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    p = s.bh * tile_elements_per_head(s, b.fwd_m, b.fwd_n) * s.elem_bytes
    extra = [Part("write P (visited tiles)", 0, p)]
    if not l2_reuse:  # the statistics sweep reads K once more per query block
        extra.append(
            Part(
                "statistics sweep: re-read K", s.bh * kv_rows_per_head(s, b.fwd_m, b.fwd_n) * s.row_bytes(), 0
            )
        )
    return _flash_fwd(s, b, l2_reuse) + Traffic(tuple(extra))


def _stored_p_bwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    tiles = s.bh * tile_elements_per_head(s, b.bwd_m, b.bwd_n) * s.elem_bytes
    return _flash_bwd(s, b, l2_reuse) + Traffic((Part("read P in the dK/dV and the dQ pass", 2 * tiles, 0),))


def _v1_fwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    visits = s.bh * q_rows_per_head(s, b.fwd_m, b.fwd_n)  # query rows touched, summed over K/V blocks
    acc = s.head_dim * FP32 + 2 * FP32  # one row of the fp32 O accumulator, m and l
    q_read = s.q if l2_reuse else visits * s.row_bytes()
    return Traffic(
        (
            Part("init O_acc, m, l (fp32)", 0, s.rows * acc),
            Part("read K, V", 2 * s.kv, 0),
            Part("read Q" + ("" if l2_reuse else " (once per K/V block)"), q_read, 0),
            Part("read + write O_acc, m, l (once per K/V block)", visits * acc, visits * acc),
            Part(
                "epilogue: read O_acc, l; write O, LSE",
                s.rows * (s.head_dim * FP32 + FP32),
                s.q + s.rows * FP32,
            ),
        )
    )


def _decode_fwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    cache = "read the latent cache (once: K, and V within it)" if s.latent else "read K, V (once per KV head)"
    parts = [
        Part("read Q", s.q, 0),
        Part(cache, s.cache, 0),
        Part("write O", 0, s.o),
    ]
    if b.splits > 1:
        partials = b.splits * s.rows * (s.value_dim + 1) * FP32
        parts.append(
            Part(f"split partials, {b.splits} splits (fp32 O, LSE): write, combine read", partials, partials)
        )
    return Traffic(tuple(parts))


def _no_backward(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    raise ValueError("the decode family is forward only")


def _check_lengths(batch: int, seqlens_k: Sequence[int]) -> None:
    if len(seqlens_k) != batch or any(n < 0 for n in seqlens_k):
        raise ValueError(f"seqlens_k must hold {batch} lengths >= 0, got {list(seqlens_k)}")


_MODELS = {
    "naive": (lambda s, b, r: _naive_fwd(s), lambda s, b, r: _naive_bwd(s)),
    "sdpa-math": (lambda s, b, r: _sdpa_math_fwd(s), lambda s, b, r: _sdpa_math_bwd(s)),
    "flash": (_flash_fwd, _flash_bwd),
    "stored-p": (_stored_p_fwd, _stored_p_bwd),
    "flash-v1": (_v1_fwd, _flash_bwd),  # the bundled v1 shares v2's recompute backward
    DECODE: (_decode_fwd, _no_backward),
}


def hbm_traffic(
    family: str,
    batch: int,
    heads: int,
    kv_heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    elem_bytes: int,
    causal: bool,
    mode: str,
    *,
    l2_reuse: bool = True,
    blocks: Blocks | None = None,
    alignment: Alignment = "bottom-right",
    seqlens_k: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    documents: Sequence[int] | None = None,
    kv_elem_bytes: int = 0,
    head_dim_v: int = 0,
) -> Traffic:
    """DRAM traffic of one call of `family` in `mode` (see the module docstring for each family); head_dim_v:
    MLA's V dims (the decode and flash families count them; the others count V at head_dim).
    seqlens_k: each sequence's valid keys (a ragged KV cache), len == batch: summed sequence by sequence.
    window: a sliding window (left, right): tiled families visit only the blocks some row's window reaches.
    documents: packed documents' lengths (instead of batch, seq_q, seq_k; module docstring).
    kv_elem_bytes: bytes per K/V element of a cache in its own dtype (compulsory_traffic); 0: elem_bytes."""
    if family not in _MODELS:
        raise ValueError(f"unknown byte-model family {family!r}; expected one of {(*FAMILIES, DECODE)}")
    kw: dict[str, Any] = dict(
        l2_reuse=l2_reuse,
        blocks=blocks,
        alignment=alignment,
        window=window,
        kv_elem_bytes=kv_elem_bytes,
        head_dim_v=head_dim_v,
    )
    if documents is not None:
        if family in DENSE_MASKED:  # the whole [T, T] matrix, masked (a window is part of that mask)
            total = sum(documents)
            dense = (1, heads, kv_heads, total, total, head_dim, elem_bytes, True, mode)
            return hbm_traffic(family, *dense, **{**kw, "window": None})
        return per_sequence(
            lambda n: hbm_traffic(family, 1, heads, kv_heads, n, n, head_dim, elem_bytes, causal, mode, **kw),
            documents,
        )
    if seqlens_k is not None:
        _check_lengths(batch, seqlens_k)
        return per_sequence(
            lambda n: hbm_traffic(
                family, 1, heads, kv_heads, seq_q, n, head_dim, elem_bytes, causal, mode, **kw
            ),
            seqlens_k,
        )
    s = Shape(
        batch,
        heads,
        kv_heads,
        seq_q,
        seq_k,
        head_dim,
        elem_bytes,
        causal,
        alignment,
        window,
        kv_elem_bytes,
        head_dim_v,
    )
    b = blocks or Blocks()
    fwd, bwd = _MODELS[family]
    if mode == "fwd":
        return fwd(s, b, l2_reuse)
    if mode == "bwd":
        return bwd(s, b, l2_reuse)
    if mode == "fwd+bwd":
        return fwd(s, b, l2_reuse).prefixed("fwd: ") + bwd(s, b, l2_reuse).prefixed("bwd: ")
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def hbm_bytes(family: str, *args: object, **kw: object) -> int:
    """hbm_traffic(...).total: DRAM bytes read + written."""
    return hbm_traffic(family, *args, **kw).total  # type: ignore[arg-type]


def compute_dtype(family: str, dtype: str) -> str:
    """The matmul precision a family runs in, i.e. which peak TFLOP/s ceiling applies.

    naive: cuBLAS in the input dtype (fp32 stays fp32: torch's allow_tf32 is off by default).
    sdpa-math: fp32 (torch >= 2.5 upcasts fp16/bf16 by default). Triton kernels: tl.dot on fp32 uses tf32.
    """
    if family == "sdpa-math":
        return "fp32"
    if dtype == "fp32":
        return "fp32" if family == "naive" else "tf32"
    return dtype

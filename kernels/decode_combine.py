"""The split-KV combine of flash_decode (kernels/decode.py): the last program of a (sequence, KV head, row block)
to finish its split merges the group's normalised partial outputs by their log2-sum-exps."""

import triton
import triton.language as tl


@triton.jit
def _combine(
    Out,  # [B, Hq, Nq, D] output
    Part,  # fp32 workspace: normalised partial outputs [B, Hkv, splits, ROWS, D], then their log2-sum-exps
    Lse,  # [B, Hkv, splits, ROWS] part of Part
    first_part,  # index of (this sequence, KV head, split 0, row 0) in [B, Hkv, splits, ROWS]
    first_row,  # this tile's first row
    out_base,  # int64 offset of Out[b, h * G, 0, 0]
    splits,
    ROWS: tl.constexpr,  # G * Nq rows per KV head (unused rows are masked)
    HEAD_DIM: tl.constexpr,
    ROWS_P2: tl.constexpr,  # rows this tile combines, a power of two
    S_CHUNK: tl.constexpr,  # splits per step
):
    """Out rows = sum_s exp2(lse_s - max) * O_s / sum_s exp2(lse_s - max), over the splits of this tile."""
    rows = first_row + tl.arange(0, ROWS_P2)
    row_ok = rows < ROWS
    offs_s = tl.arange(0, S_CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    top = tl.zeros([ROWS_P2], dtype=tl.float32) - float("inf")  # running max lse per row
    acc = tl.zeros([ROWS_P2, HEAD_DIM], dtype=tl.float32)
    total = tl.zeros([ROWS_P2], dtype=tl.float32)
    # One pass, lse and partials loaded together (one round trip when splits <= S_CHUNK); every split wrote
    # its rows (0 and -inf when it saw no key).
    for c in range(0, splits, S_CHUNK):
        idx = first_part + (c + offs_s)[:, None] * ROWS + rows[None, :]  # [S_CHUNK, ROWS_P2]
        ok = ((c + offs_s) < splits)[:, None] & row_ok[None, :]
        lse = tl.load(Lse + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(Part + idx[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=ok[:, :, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        new = tl.maximum(top, tl.max(lse, 0))
        safe = tl.where(new == float("-inf"), 0.0, new)  # no split saw a key yet: weights 0, not NaN
        w = tl.exp2(lse - safe[None, :])
        rescale = tl.exp2(top - safe)
        acc = acc * rescale[:, None] + tl.sum(w[:, :, None] * o, 0)
        total = total * rescale + tl.sum(w, 0)
        top = new
    out = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    o_ptrs = Out + out_base + rows[:, None] * HEAD_DIM + offs_d[None, :]  # row r = g * Nq + i: contiguous
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])

"""The byte model's vocabulary: itemised DRAM traffic (Part, Traffic), a case's shape, a tiled kernel's tiles, and
the rows a tiled loop visits. Pure: numbers in, numbers out (io_model.py builds every family's traffic from these).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flashbench.spec import window as mask_rule
from flashbench.spec.window import Alignment

FP32 = 4


def out_bytes(elem_bytes: int) -> int:
    """Bytes per output element: the input's, except 1-byte (FP8 e4m3) inputs, whose attention writes bf16 (the
    bundled FP8 forward's and FlashAttention-3's contract)."""
    return 2 if elem_bytes == 1 else elem_bytes


@dataclass(frozen=True)
class Part:
    name: str
    read: int
    write: int


@dataclass(frozen=True)
class Traffic:
    """DRAM bytes of one call, itemised."""

    parts: tuple[Part, ...] = field(default_factory=tuple)

    @property
    def read(self) -> int:
        return sum(p.read for p in self.parts)

    @property
    def write(self) -> int:
        return sum(p.write for p in self.parts)

    @property
    def total(self) -> int:
        return self.read + self.write

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.parts + other.parts)

    def prefixed(self, prefix: str) -> Traffic:
        return Traffic(tuple(Part(f"{prefix}{p.name}", p.read, p.write) for p in self.parts))

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {p.name: {"read": p.read, "write": p.write} for p in self.parts}


def one_pass_backward(config: Mapping[str, Any] | None) -> bool:
    """Whether a kernel_config (Row.kernel_config) says its backward added dQ from the dK/dV kernel (one pass,
    kernels/backward_ws.py's ONE_PASS: {"bwd": {"dq": {"kernel": "gluon-ws", "ONE_PASS": 1}}}) rather than in a
    dQ pass of its own."""
    bwd = config.get("bwd") if isinstance(config, Mapping) else None
    dq = bwd.get("dq") if isinstance(bwd, Mapping) else None
    return isinstance(dq, Mapping) and dq.get("ONE_PASS") == 1


@dataclass(frozen=True)
class Blocks:
    """Tile sizes of a tiled kernel (rows of Q per block = m, rows of K/V per block = n).

    Defaults are FlashAttention-2's usual choices for d = 128 on sm80/sm90; pass the kernel's own
    (Row.kernel_config) where it reports them.
    """

    fwd_m: int = 128
    fwd_n: int = 64
    bwd_m: int = 64
    bwd_n: int = 128
    splits: int = 1  # key splits per sequence of a split-KV decode kernel (the decode family)
    bwd_one_pass: bool = False  # the backward adds dQ into an fp32 buffer from its dK/dV pass (no dQ pass)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> Blocks | None:
        """The tiles a kernel reported (Row.kernel_config: BLOCK_M, BLOCK_N in any case; num_splits; under "bwd",
        the dK/dV pass's {"dkdv": {BLOCK_M, BLOCK_N}}: query rows streamed, keys resident; one_pass_backward),
        else None."""
        if not config:
            return None
        cfg = {str(k).lower(): v for k, v in config.items()}
        m, n, splits = cfg.get("block_m"), cfg.get("block_n"), cfg.get("num_splits", 1)
        if not (isinstance(m, int) and isinstance(n, int) and m > 0 and n > 0):
            return None
        blocks = cls(fwd_m=m, fwd_n=n, splits=splits if isinstance(splits, int) and splits > 0 else 1)
        bwd = cfg.get("bwd")
        dkdv = bwd.get("dkdv") if isinstance(bwd, Mapping) else None
        if isinstance(dkdv, Mapping):
            bm, bn = dkdv.get("BLOCK_M"), dkdv.get("BLOCK_N")
            if isinstance(bm, int) and isinstance(bn, int) and bm > 0 and bn > 0:
                blocks = replace(blocks, bwd_m=bm, bwd_n=bn, bwd_one_pass=one_pass_backward(config))
        return blocks


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    elem_bytes: int
    causal: bool
    alignment: Alignment = "bottom-right"
    window: tuple[int, int] | None = None  # a sliding window (left, right), spec/window.py
    # bytes per stored K/V element where the cache has its own dtype (an FP8 KV cache: 1); 0: elem_bytes
    kv_elem_bytes: int = 0
    # MLA's absorbed form: V is the first head_dim_v dims of the latent K (0: V of head_dim)
    head_dim_v: int = 0

    def __post_init__(self) -> None:
        dims = (self.batch, self.heads, self.kv_heads, self.seq_q, self.seq_k, self.head_dim, self.elem_bytes)
        if any(d < 0 for d in dims):
            raise ValueError("shape dimensions must be >= 0")
        if self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def q(self) -> int:  # bytes of Q, O, dQ, dO
        return self.bh * self.seq_q * self.head_dim * self.elem_bytes

    @property
    def o(self) -> int:  # bytes of the forward's O (bf16 for FP8 inputs: out_bytes), V's head dim
        return self.bh * self.seq_q * self.value_dim * out_bytes(self.elem_bytes)

    @property
    def kv_elem(self) -> int:  # bytes per K/V element
        return self.kv_elem_bytes or self.elem_bytes

    @property
    def kv(self) -> int:  # bytes of one of K, V, dK, dV (kv heads)
        return self.batch * self.kv_heads * self.seq_k * self.head_dim * self.kv_elem

    @property
    def latent(self) -> bool:  # MLA: V lies within the K cache (one latent cache)
        return self.head_dim_v > 0

    @property
    def value_dim(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def v(self) -> int:  # bytes of V as a tensor of its own (MLA: the latent's first head_dim_v dims)
        return self.batch * self.kv_heads * self.seq_k * self.value_dim * self.kv_elem

    @property
    def cache(self) -> int:  # bytes of K and V as stored: MLA's one latent cache, else K and V
        return self.kv if self.latent else self.kv + self.v

    @property
    def kv_exp(self) -> int:  # one of K, V expanded to all query heads (MLA: not expanded, read as one head)
        return self.kv if self.latent else self.bh * self.seq_k * self.head_dim * self.kv_elem

    @property
    def expanded(
        self,
    ) -> bool:  # eager GQA copies K and V per query head; MLA folds the heads into query rows
        return self.kv_heads != self.heads and not self.latent

    @property
    def rows(self) -> int:  # softmax rows: B * H * Nq
        return self.bh * self.seq_q

    @property
    def matrix(self) -> int:  # elements of all heads' attention matrices
        return self.bh * self.seq_q * self.seq_k

    def row_bytes(self) -> int:  # one row of Q / O / dO
        return self.head_dim * self.elem_bytes

    @property
    def masked(self) -> bool:
        return mask_rule.masked(self.causal, self.window)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def key_span(s: Shape, first_row: int, last_row: int) -> tuple[int, int]:
    """Keys [lo, hi) seen by some query row of [first_row, last_row] (hi <= lo: none): spec/window.py's rule."""
    return mask_rule.key_span(first_row, last_row, s.seq_q, s.seq_k, s.causal, s.window, s.alignment)


def row_span(s: Shape, first_key: int, last_key: int) -> tuple[int, int]:
    """Query rows [lo, hi) that see some key of [first_key, last_key] (hi <= lo: none): spec/window.py's rule."""
    return mask_rule.row_span(first_key, last_key, s.seq_q, s.seq_k, s.causal, s.window, s.alignment)


def _visited_keys(s: Shape, start: int, rows: int, block_n: int) -> int:
    """Keys in the K/V blocks a query block [start, start + rows) visits (blocks aligned to block_n)."""
    lo, hi = key_span(s, start, start + rows - 1)
    if hi <= lo:
        return 0
    first = (lo // block_n) * block_n
    return min(s.seq_k, first + _cdiv(hi - first, block_n) * block_n) - first


def kv_rows_per_head(s: Shape, block_m: int, block_n: int) -> int:
    """K (or V) rows loaded by one head's query-block loop: once per query block, visited K/V blocks only."""
    return sum(
        _visited_keys(s, start, min(block_m, s.seq_q - start), block_n)
        for start in range(0, s.seq_q, block_m)
    )


def q_rows_per_head(s: Shape, block_m: int, block_n: int) -> int:
    """Q (or dO) rows loaded by one head's K/V-block loop: once per K/V block, visited query blocks only."""
    total = 0
    for start in range(0, s.seq_k, block_n):
        lo, hi = row_span(s, start, min(start + block_n, s.seq_k) - 1)
        if hi > lo:
            total += min(s.seq_q, _cdiv(hi, block_m) * block_m) - (lo // block_m) * block_m
    return total


def tile_elements_per_head(s: Shape, block_m: int, block_n: int) -> int:
    """Score elements in the visited tiles of one head (what a stored-P kernel writes)."""
    total = 0
    for start in range(0, s.seq_q, block_m):
        rows = min(block_m, s.seq_q - start)
        total += rows * _visited_keys(s, start, rows, block_n)
    return total

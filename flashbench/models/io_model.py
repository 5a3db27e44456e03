"""HBM (DRAM) traffic of one attention call, per implementation family and mode. Pure: numbers in, bytes out.

Every model returns a Traffic: named parts, each with bytes read and bytes written, so a report can say where
the bytes go. Tensors are [B, H, N, d]; K and V have Hkv heads (GQA); e = bytes per element of the input dtype.

compulsory_traffic(): the floor for ANY exact attention: each input read once, each output written once.
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
             `python3 benchmarks/ncu_bytes.py drive --impls naive,sdpa-math --modes bwd --kernels` lists the
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
             kernels skip fully masked blocks, so only the visited blocks are counted.
  stored-p   the bundled stored_p.py: the forward writes P (the visited tiles, e per element; a statistics
             sweep then a P sweep over K); the backward is flash's with P read (not recomputed) in both the
             dK/dV and the dQ pass.
  flash-v1   the bundled flash_v1.py, FlashAttention-1's loop order (paper Algorithm 1): outer loop over K/V
             blocks, inner over query blocks, so the fp32 O accumulator, m and l are read and written once
             per K/V block; the backward is flash's (recompute).
The flash backward is the bundled kernel's (backward.py): a Delta pre-pass; a dK/dV pass per K/V block of
each K/V head streaming Q, dO, LSE, Delta of every query head in its GQA group; a dQ pass per query block
streaming K, V. FlashAttention-2's CUDA backward instead accumulates dQ with fp32 atomics (traffic that L2
mostly absorbs), so for sdpa-flash the no-L2 backward figure is an approximation.

Why the naive count is not 003's "4 N^2": that document counts S written, S read, P written, P read once
each in fp16 (8 bytes per element). PyTorch's eager path also writes the scaled copy and, with the fp32
softmax, the upcast and downcast copies: 28 bytes per element in fp16, 3.5x more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flashbench.models.flops import Alignment

FAMILIES = ("naive", "sdpa-math", "flash", "stored-p", "flash-v1")
MODES = ("fwd", "bwd", "fwd+bwd")
FP32 = 4
ComputeDtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]


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

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> Blocks | None:
        """The forward tiles a kernel reported (Row.kernel_config: BLOCK_M, BLOCK_N in any case), else None."""
        if not config:
            return None
        cfg = {str(k).lower(): v for k, v in config.items()}
        m, n = cfg.get("block_m"), cfg.get("block_n")
        if isinstance(m, int) and isinstance(n, int) and m > 0 and n > 0:
            return cls(fwd_m=m, fwd_n=n)
        return None


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
    def kv(self) -> int:  # bytes of one of K, V, dK, dV (kv heads)
        return self.batch * self.kv_heads * self.seq_k * self.head_dim * self.elem_bytes

    @property
    def kv_exp(self) -> int:  # one of K, V expanded to all query heads
        return self.bh * self.seq_k * self.head_dim * self.elem_bytes

    @property
    def rows(self) -> int:  # softmax rows: B * H * Nq
        return self.bh * self.seq_q

    @property
    def matrix(self) -> int:  # elements of all heads' attention matrices
        return self.bh * self.seq_q * self.seq_k

    def row_bytes(self) -> int:  # one row of Q / O / dO
        return self.head_dim * self.elem_bytes

    def offset(self) -> int:
        return self.seq_k - self.seq_q if self.alignment == "bottom-right" else 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _keys_visible(s: Shape, last_row: int) -> int:
    """Keys visible to query row `last_row` (0 when fully masked)."""
    if not s.causal:
        return s.seq_k
    return max(0, min(s.seq_k, last_row + s.offset() + 1))


def kv_rows_per_head(s: Shape, block_m: int, block_n: int) -> int:
    """K (or V) rows loaded by one head's query-block loop: once per query block, visited K/V blocks only."""
    total = 0
    for start in range(0, s.seq_q, block_m):
        keys = _keys_visible(s, min(start + block_m, s.seq_q) - 1)
        total += min(s.seq_k, _cdiv(keys, block_n) * block_n)
    return total


def q_rows_per_head(s: Shape, block_m: int, block_n: int) -> int:
    """Q (or dO) rows loaded by one head's K/V-block loop: once per K/V block, visited query blocks only."""
    total = 0
    for start in range(0, s.seq_k, block_n):
        if not s.causal:
            total += s.seq_q
            continue
        first_row = max(0, start - s.offset())  # first query row that sees key `start`
        if first_row >= s.seq_q:
            continue
        total += s.seq_q - (first_row // block_m) * block_m
    return total


def tile_elements_per_head(s: Shape, block_m: int, block_n: int) -> int:
    """Score elements in the visited tiles of one head (what a stored-P kernel writes)."""
    total = 0
    for start in range(0, s.seq_q, block_m):
        rows = min(block_m, s.seq_q - start)
        keys = _keys_visible(s, start + rows - 1)
        total += rows * min(s.seq_k, _cdiv(keys, block_n) * block_n)
    return total


def compulsory_traffic(
    batch: int,
    heads: int,
    kv_heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    elem_bytes: int,
    mode: str,
) -> Traffic:
    """The floor for any exact attention: inputs read once, outputs written once (see module docstring)."""
    s = Shape(batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes, False)
    lse = s.rows * FP32
    fwd = Traffic((Part("read Q, K, V", s.q + 2 * s.kv, 0), Part("write O", 0, s.q)))
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
    if s.kv_heads != s.heads:
        parts.append(Part("repeat_interleave K, V (GQA)", 2 * s.kv, 2 * s.kv_exp))
    parts.append(Part("S = Q K^T", s.q + s.kv_exp, E * e))
    parts.append(Part("S * scale", E * e, E * e))
    if s.causal:
        parts.append(Part("build causal mask (bool)", mask, 2 * mask))
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
    if s.causal:
        parts.append(Part("masked_fill backward", E * e + mask, E * e))
    parts.append(Part("dS * scale", E * e, E * e))
    parts.append(Part("dQ = dS K", E * e + s.kv_exp, s.q))
    parts.append(Part("dK = dS^T Q", E * e + s.q, s.kv_exp))
    if s.kv_heads != s.heads:
        parts.append(Part("sum dK, dV over the group (GQA)", 2 * s.kv_exp, 2 * s.kv))
    return Traffic(tuple(parts))


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
    if s.kv_heads != s.heads:
        parts.append(Part("repeat_interleave K, V (GQA)", 2 * kv32, 2 * kvx32))
    parts.append(Part("S = Q K^T (fp32)", q32 + kvx32, E * FP32))
    if s.causal:
        parts.append(Part("build causal mask (bool -> fp32)", 2 * mask, 2 * mask + mask * FP32))
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
    if s.kv_heads != s.heads:
        parts.append(Part("sum dK, dV over the group (GQA)", 2 * kvx32, 2 * kv32))
    parts.append(Part("dq, dk * sqrt(scale)", q32 + kv32, q32 + kv32))
    if e < FP32:
        parts.append(Part("dq, dk, dv .to(dtype)", q32 + 2 * kv32, s.q + 2 * s.kv))
    return Traffic(tuple(parts))


# ---------------------------------------------------------------------------------------------- tiled


def _flash_fwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    lse = s.rows * FP32
    if l2_reuse:
        kv_read = 2 * s.kv
        name = "read K, V (once)"
    else:
        kv_read = 2 * s.bh * kv_rows_per_head(s, b.fwd_m, b.fwd_n) * s.row_bytes()
        name = f"read K, V (once per {b.fwd_m}-row query block)"
    return Traffic((Part("read Q", s.q, 0), Part(name, kv_read, 0), Part("write O, LSE", 0, s.q + lse)))


def _delta_prepass(s: Shape) -> Part:
    return Part("Delta = rowsum(dO * O)", 2 * s.q, s.rows * FP32)


def _flash_bwd(s: Shape, b: Blocks, l2_reuse: bool) -> Traffic:
    stats = 2 * s.rows * FP32  # LSE and Delta
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
        Part(
            f"dK/dV pass: read Q, dO, LSE, Delta (once per {b.bwd_n}-row K/V block)",
            q_rows * (2 * s.row_bytes() + 2 * FP32),
            0,
        ),
        Part("dK/dV pass: write dK, dV", 0, 2 * s.kv),
        Part("dQ pass: read Q, dO, LSE, Delta", 2 * s.q + stats, 0),
        Part(f"dQ pass: read K, V (once per {b.bwd_m}-row query block)", 2 * kv_rows * s.row_bytes(), 0),
        Part("dQ pass: write dQ", 0, s.q),
    ]
    return Traffic(tuple(parts))


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


_MODELS = {
    "naive": (lambda s, b, r: _naive_fwd(s), lambda s, b, r: _naive_bwd(s)),
    "sdpa-math": (lambda s, b, r: _sdpa_math_fwd(s), lambda s, b, r: _sdpa_math_bwd(s)),
    "flash": (_flash_fwd, _flash_bwd),
    "stored-p": (_stored_p_fwd, _stored_p_bwd),
    "flash-v1": (_v1_fwd, _flash_bwd),  # the bundled v1 shares v2's recompute backward
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
) -> Traffic:
    """DRAM traffic of one call of `family` in `mode` (see the module docstring for each family)."""
    if family not in _MODELS:
        raise ValueError(f"unknown byte-model family {family!r}; expected one of {FAMILIES}")
    s = Shape(batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes, causal, alignment)
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


def family_for_provider(provider: str) -> str:
    """Byte-model family of a provider name (a best guess from the name; a provider may declare its own)."""
    name = provider.lower()
    if "math" in name:
        return "sdpa-math"
    if "stored" in name:
        return "stored-p"
    if "v1" in name:
        return "flash-v1"
    if any(tag in name for tag in ("naive", "eager", "standard", "manual")):
        return "naive"
    return "flash"


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

"""The frozen Case record: one benchmark point, and the key for resume, joins and the gate.

The training shape (seq_q = seq_k, one contiguous K/V per sequence) and the serving shape (seq_q new query tokens
per sequence over a KV cache of seq_k tokens, contiguous or paged, every sequence as long as the cache or
ragged) are both Cases, and so is a packed training batch (documents of different lengths one after another,
each attending only to itself). The serving and packing fields come last, with defaults that mean "the training
shape", so that a training case's key is the one it always had: Case.key appends such a field only when it is not
the default.

`seqlens` names the law of per-sequence lengths, one meaning per shape (lengths()):
    training shape (min_seq > 0)   documents packed into batch * seq tokens, lengths drawn in [min_seq, seq]
    serving shape (min_seq = 0)    each sequence's KV length, drawn in [ceil(seq_k / 2), seq_k]
"uniform" is every sequence at full length (no draw) in both.
"""

from __future__ import annotations

import math
import random
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Literal

from flashbench.spec.window import Window, parse_window

Mode = Literal["fwd", "bwd", "fwd+bwd"]
MODES: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd")
# "fp8" is float8_e4m3fn inputs with per-(batch, K/V head) descales and a bf16 output, forward only
# (engine/fp8.py makes them; a provider takes it only when it declares it).
DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp8")
DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}
KV_LAYOUTS: tuple[str, ...] = ("contiguous", "paged")
# The laws of per-sequence lengths (draw_length): "uniform" = all full length, "random" = uniform integers in a
# range, "lognormal" = a log-normal truncated to the range (most documents short, a long tail).
SEQLENS: tuple[str, ...] = ("uniform", "random", "lognormal")
# A KV cache stored in another dtype than q: "" (the default) keeps it in the case's dtype; "fp8" stores K and V
# in float8_e4m3fn with per-(sequence, KV head) float32 scales (engine/fp8.py), under fp16 or bf16 queries.
KV_DTYPES: tuple[str, ...] = ("", "fp8")


@dataclass(frozen=True, order=True)
class Case:
    """One point of a sweep. Tensors are [batch, heads, seq, head_dim]; K/V have kv_heads heads (GQA).

    Causal masks are aligned bottom-right when seq_q != seq_k (flash-attn's convention): query i
    attends to keys j <= i + (seq_k - seq_q); with per-sequence lengths L_b, j <= i + (L_b - seq_q): the
    queries are the last seq_q tokens of each sequence.

    Serving fields: kv_layout "paged" stores K/V as a pool of page_size-token pages reached through a block
    table (page_size is 0 for "contiguous"); seqlens "random" gives each sequence its own valid length,
    kv_lengths() (seed is 0 for "uniform", where every sequence holds seq_k tokens).

    Packed fields: min_seq > 0 makes the case a packed training batch (seq_q = seq_k = N): batch * N tokens cut
    into documents whose lengths follow `seqlens` in [min_seq, N] (documents()); the tensors are [batch * N, H, D]
    with cu_seqlens (engine/packed.py), and each document attends only to itself (causal and windows align
    within it). 0 for every other case.

    window: a sliding window "left,right" in flash-attn's window_size convention (spec/window.py); the plan
    writes it canonically (causal folds in as right = 0).

    head_dim_v: multi-head latent attention (MLA, DeepSeek-V2/V3) in its absorbed form when not 0: K is one latent
    cache of head_dim dims per token (kv_heads = 1: 576 = 512 latent + 64 rotary for DeepSeek-V3), V is its first
    head_dim_v dims (512), the same storage, and the output has head_dim_v dims. 0: V has head_dim dims of its
    own, every other case. Providers receive v as a view of k (engine/measure.py, engine/kv_cache.py).
    """

    provider: str
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str  # "fp16" | "bf16" | "fp32" | "fp8"
    causal: bool
    mode: str  # "fwd" | "bwd" | "fwd+bwd"
    kv_layout: str = "contiguous"  # "contiguous" | "paged"
    page_size: int = 0  # tokens per page when paged, else 0
    seqlens: str = "uniform"  # "uniform" | "random"
    seed: int = 0  # the draw of the random lengths (0 when uniform)
    window: str = ""  # a sliding window "left,right" (spec/window.py), "" for none
    min_seq: int = 0  # a packed batch's shortest document drawn (tokens); 0: not packed
    kv_dtype: str = ""  # the KV cache's dtype when not the case's: "fp8" (e4m3 with scales), "" for the same
    head_dim_v: int = 0  # MLA's latent V dims (the first head_dim_v of K's), 0 for a V of its own

    @property
    def key(self) -> str:
        """Stable string key: identical across runs, machines and flashbench versions.

        A serving field, a window or a latent V adds a part only when it is not the default ("|paged16",
        "|random-s0", "|win4096,0", "|min256", "|kvfp8", "|latent512"), so the key of every case without them, and
        of every baseline recorded before these fields existed, is unchanged.
        """
        key = (
            f"{self.provider}|b{self.batch}|h{self.heads}|kv{self.kv_heads}|q{self.seq_q}|k{self.seq_k}"
            f"|d{self.head_dim}|{self.dtype}|{'causal' if self.causal else 'full'}|{self.mode}"
        )
        if self.kv_layout != "contiguous":
            key += f"|{self.kv_layout}{self.page_size}"
        if self.seqlens != "uniform":
            key += f"|{self.seqlens}-s{self.seed}"
        if self.window:
            key += f"|win{self.window}"
        if self.min_seq:
            key += f"|min{self.min_seq}"
        if self.kv_dtype:
            key += f"|kv{self.kv_dtype}"
        if self.head_dim_v:
            key += f"|latent{self.head_dim_v}"
        return key

    @property
    def shape_key(self) -> str:
        """The key without the provider: cases that compare like for like share it."""
        return self.key.split("|", 1)[1]

    @property
    def window_size(self) -> Window | None:
        """The sliding window as (left, right), or None (spec/window.py)."""
        return parse_window(self.window) if self.window else None

    @property
    def latent(self) -> bool:
        """MLA's absorbed form: V is the first head_dim_v dims of the one latent K cache (class docstring)."""
        return self.head_dim_v > 0

    @property
    def value_dim(self) -> int:
        """V's and the output's head dim: head_dim_v for an MLA case, else head_dim."""
        return self.head_dim_v or self.head_dim

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_elem_bytes(self) -> int:
        """Bytes per stored K or V element: the KV dtype's, else the case's."""
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def paged(self) -> bool:
        return self.kv_layout == "paged"

    @property
    def packed(self) -> bool:
        """A packed training batch: documents of drawn lengths (documents())."""
        return self.min_seq > 0

    @property
    def ragged(self) -> bool:
        """A serving case whose sequences hold different numbers of keys (kv_lengths())."""
        return self.seqlens != "uniform" and not self.packed

    @property
    def serving(self) -> bool:
        """A case that needs a KV-cache input beyond q, k, v: a page table, per-sequence lengths or the scales of
        an FP8 cache."""
        return self.paged or self.ragged or bool(self.kv_dtype)

    def kv_lengths(self) -> tuple[int, ...]:
        """The valid keys of each sequence (see kv_lengths())."""
        return kv_lengths(self.batch, self.seq_q, self.seq_k, self.seqlens, self.seed)

    def documents(self) -> tuple[int, ...] | None:
        """A packed case's document lengths (see documents()), None for any other case."""
        if not self.packed:
            return None
        return documents(self.batch * self.seq_k, self.min_seq, self.seq_k, self.seqlens, self.seed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


CASE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Case))
# The serving fields' defaults: a row or baseline written before they existed reads as a training case.
CASE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Case) if f.default is not MISSING}


def kv_lengths(
    batch: int, seq_q: int, seq_k: int, seqlens: str = "uniform", seed: int = 0
) -> tuple[int, ...]:
    """Valid keys per sequence. "uniform": every sequence holds seq_k. "random" / "lognormal": each length is
    drawn by that law (draw_length) from [max(1, ceil(seq_k / 2)), seq_k], deterministically from (seed, batch,
    seq_q, seq_k).

    Why [N/2, N] and not [1, N]: the cache length stays the axis a decode sweep reads (the mean length is 3/4 N,
    so the KV bytes stay within 25% of the uniform case at the same N and batch), a batch of one is not left
    with a handful of keys, and a 2x spread of lengths is what a split-KV kernel has to balance. The draw is
    Python's random.Random seeded with a string (SHA-512 of it): the same lengths on every machine and version.
    """
    if seqlens == "uniform":
        return (seq_k,) * batch
    _check_law(seqlens)
    rng = random.Random(f"flashbench-seqlens|{seed}|{batch}|{seq_q}|{seq_k}")
    low = max(1, -(-seq_k // 2))
    return tuple(draw_length(rng, seqlens, low, seq_k) for _ in range(batch))


def documents(tokens: int, low: int, high: int, seqlens: str, seed: int = 0) -> tuple[int, ...]:
    """A packed batch's document lengths: drawn by the law `seqlens` in [low, high] until they fill `tokens`, the
    last one cut to fit (so it alone may be shorter than `low`); "uniform": documents of `high` (the last cut).
    Deterministic from (law, seed, tokens, low, high), the same on every machine, as kv_lengths()."""
    if not 1 <= low <= high or tokens < 1:
        raise ValueError(f"documents need 1 <= min {low} <= max {high} and tokens >= 1, not {tokens}")
    if seqlens != "uniform":
        _check_law(seqlens)
    rng = random.Random(f"flashbench-documents|{seqlens}|{seed}|{tokens}|{low}|{high}")
    out: list[int] = []
    left = tokens
    while left > 0:
        n = high if seqlens == "uniform" else draw_length(rng, seqlens, low, high)
        out.append(min(n, left))
        left -= out[-1]
    return tuple(out)


def draw_length(rng: random.Random, law: str, low: int, high: int) -> int:
    """One length in [low, high] by `law`: "random" uniform integers; "lognormal" exp(Normal(mu, sigma)) with the
    median at the range's geometric mean sqrt(low * high) and sigma = ln(high / low) / 4 (the range spans
    +-2 sigma), redrawn when it falls outside (4.6% of draws), rounded to the nearest integer."""
    if law == "random" or low == high:
        return rng.randint(low, high)
    mu, sigma = (math.log(low) + math.log(high)) / 2, (math.log(high) - math.log(low)) / 4
    while True:
        n = round(rng.lognormvariate(mu, sigma))
        if low <= n <= high:
            return n


def _check_law(seqlens: str) -> None:
    if seqlens not in SEQLENS or seqlens == "uniform":
        raise ValueError(f"unknown seqlens {seqlens!r}; expected one of {SEQLENS}")


def mask_label(causal: bool) -> str:
    """The mask as every output names it ("causal" / "non-causal"); Case.key keeps its stable 'full'."""
    return "causal" if causal else "non-causal"

"""The frozen Case record: one benchmark point, and the key for resume, joins and the gate."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Mode = Literal["fwd", "bwd", "fwd+bwd"]
MODES: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd")
DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32")
DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4}


@dataclass(frozen=True, order=True)
class Case:
    """One point of a sweep. Tensors are [batch, heads, seq, head_dim]; K/V have kv_heads heads (GQA).

    Causal masks are aligned bottom-right when seq_q != seq_k (flash-attn's convention): query i
    attends to keys j <= i + (seq_k - seq_q).
    """

    provider: str
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str  # "fp16" | "bf16" | "fp32"
    causal: bool
    mode: str  # "fwd" | "bwd" | "fwd+bwd"

    @property
    def key(self) -> str:
        """Stable string key: identical across runs, machines and flashbench versions."""
        return (
            f"{self.provider}|b{self.batch}|h{self.heads}|kv{self.kv_heads}|q{self.seq_q}|k{self.seq_k}"
            f"|d{self.head_dim}|{self.dtype}|{'causal' if self.causal else 'full'}|{self.mode}"
        )

    @property
    def shape_key(self) -> str:
        """The key without the provider: cases that compare like for like share it."""
        return self.key.split("|", 1)[1]

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


CASE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Case))


def mask_label(causal: bool) -> str:
    """The mask as every output names it ("causal" / "non-causal"); Case.key keeps its stable 'full'."""
    return "causal" if causal else "non-causal"

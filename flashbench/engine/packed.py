"""The inputs of a packed training case (spec/cases.py: documents of drawn lengths one after another), in
flash-attn's varlen layout, which the provider protocol passes on (providers/registry.py):

    q            [total, H, D]; k, v [total, Hkv, D]   total = batch * N tokens, Case.documents() in order
    cu_seqlens   int32 [documents + 1]: document i holds rows [cu_seqlens[i], cu_seqlens[i + 1])
    max_seqlen   the longest document (an int)

Queries and keys share the lengths (self-attention within each document). Made once per case, untimed.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from flashbench.spec.cases import Case


def keywords(case: Case, device: Any) -> dict[str, Any]:
    """The call's cu_seqlens and max_seqlen for a packed `case` (module docstring)."""
    import torch

    lengths = case.documents() or ()
    cu = torch.tensor([0, *accumulate(lengths)], dtype=torch.int32, device=device)
    return {"cu_seqlens": cu, "max_seqlen": max(lengths)}


def split(t: Any, lengths: tuple[int, ...]) -> list[Any]:
    """A packed [total, heads, D] tensor as one [1, heads, L, D] view per document (what the oracle reads)."""
    out, row = [], 0
    for n in lengths:
        out.append(t[row : row + n].transpose(0, 1).unsqueeze(0))
        row += n
    return out

"""FLOP counts for attention, with the convention stated.

Convention (flash-attn's benchmarks, DESIGN.md):
- forward  = 4 * B * H * d * pairs, where pairs = the number of unmasked (query, key) pairs.
  QK^T costs 2*d per pair and PV another 2*d; softmax's exp/max/sum are not counted (they run on the
  special-function and FP32 units, not the tensor cores, and every kernel must do them alike).
- backward = 2.5x forward: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q is 4 matmuls = 2x forward,
  plus recomputing S = Q K^T from the saved log-sum-exp = 0.5x forward. The recompute share is therefore
  0.5 / 2.5 = 20% of the backward as credited here and 0.5 / 3.5 = 14.3% of fwd+bwd. The source documents'
  "25% of backward / 16.7% of the total" counts the recompute against a 2x backward (0.5 / 2.0, and
  0.5 / 3.0 of a fwd+bwd without recompute): both views are returned by recompute_share(). A share is not
  an overhead: the measured recompute overhead (recompute backward time / stored-P backward time - 1) compares
  with 2.5 / 2.0 - 1 = 25% credited, or with what the bundled kernels execute: 7 / 5 block matmuls - 1 = 40%
  for the two-pass recompute backward, 5 / 5 - 1 = 0% for the one-pass (the Hopper default at d = 64 / 128,
  which recomputes S once; only its exp2 is extra) (recompute_overhead_references()).
- fwd+bwd  = 3.5x forward.

Ragged batches (a KV cache whose sequences hold different numbers of keys, `seqlens_k`): the pairs are summed
sequence by sequence, each with its own key count and the queries as its last seq_q tokens.

Packed documents (`documents`: each document's length, a packed training batch): each document attends only to
itself, so the pairs are summed document by document, each a square seq_q = seq_k = L with its own mask.

Sliding windows (flash-attn's window_size, spec/window.py) count their unmasked pairs exactly too: a causal
window of W keys before each query at seq_q = seq_k = N keeps (W + 1) N - W (W + 1) / 2 pairs (W < N).

MLA's absorbed form (DeepSeek-V2/V3; Case.head_dim_v): q k^T has the latent-plus-rotary head dim d (576) and P v
the value dim dv (512), so a pair costs 2 * (d + dv) FLOPs, 2176 per query head, not 4 d: forward =
2 * B * H * (d + dv) * pairs (head_dim_v=0 means dv = d, the 4 d above).

Causal pairs are counted exactly, not as the 0.5x shortcut: for seq_q = seq_k = N they are
N (N + 1) / 2, so the shortcut undercounts by N/2 pairs (a 1/N relative error, 6% at N = 16).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The mask rule and its pair count live in the mask module (spec/window.py); the FLOP model counts with them.
from flashbench.spec.window import Alignment, unmasked_pairs

MODE_MULTIPLIER: dict[str, float] = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
RECOMPUTE_MULTIPLIER = 0.5  # the credited backward's share for recomputing S = Q K^T
# Block matmuls per visited (query block, key block) tile of the bundled backwards (kernels/backward.py), each
# 2 * block_m * block_n * d FLOPs, i.e. 0.5x a forward over the whole matrix:
#   recompute: dK/dV pass S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q; dQ pass S, dP, dQ += dS K  -> 7
#   recompute in one pass (Gluon, Hopper; kernel_config ONE_PASS): S, dP, dV, dK, dQ                     -> 5
#   stored P (P read in both passes): dK/dV pass dP, dV, dK; dQ pass dP, dQ                              -> 5
BWD_BLOCK_MATMULS: dict[str, int] = {"recompute": 7, "recompute-one-pass": 5, "stored-p": 5}


def forward_flops(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    causal: bool,
    alignment: Alignment = "bottom-right",
    seqlens_k: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    documents: Sequence[int] | None = None,
    head_dim_v: int = 0,
) -> int:
    """2 * B * H * (d + dv) * unmasked pairs (4 d per pair when dv = d). GQA does not change it: every query head
    does its own matmuls. seqlens_k: each sequence's keys (a ragged batch; len == batch), instead of seq_k for
    all. window: a sliding window (left, right) (unmasked_pairs).
    documents: a packed batch's document lengths (instead of batch, seq_q and seq_k): their own pairs only.
    head_dim_v: V's head dim (MLA), 0 = head_dim."""
    per_pair = 2 * heads * (head_dim + (head_dim_v or head_dim))
    if documents is not None:
        return per_pair * sum(unmasked_pairs(n, n, causal, alignment, window) for n in documents)
    if seqlens_k is None:
        return batch * per_pair * unmasked_pairs(seq_q, seq_k, causal, alignment, window)
    if len(seqlens_k) != batch:
        raise ValueError(f"seqlens_k holds {len(seqlens_k)} lengths for a batch of {batch}")
    pairs = sum(unmasked_pairs(seq_q, n, causal, alignment, window) for n in seqlens_k)
    return per_pair * pairs


def attention_flops(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    causal: bool,
    mode: str,
    alignment: Alignment = "bottom-right",
    seqlens_k: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    documents: Sequence[int] | None = None,
    head_dim_v: int = 0,
) -> float:
    """FLOPs credited to one call in `mode` ("fwd", "bwd", "fwd+bwd") under the stated convention; a sliding
    window counts its unmasked pairs, as causal does, and packed documents their own pairs; head_dim_v: MLA's V
    dims (forward_flops)."""
    try:
        mult = MODE_MULTIPLIER[mode]
    except KeyError:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODE_MULTIPLIER)}") from None
    return mult * forward_flops(
        batch, heads, seq_q, seq_k, head_dim, causal, alignment, seqlens_k, window, documents, head_dim_v
    )


def case_flops(case: Any) -> float:
    """attention_flops of a sweep case (spec/cases.Case: its shape, mask, mode, and ragged lengths or packed
    documents if any)."""
    return attention_flops(
        case.batch,
        case.heads,
        case.seq_q,
        case.seq_k,
        case.head_dim,
        case.causal,
        case.mode,
        seqlens_k=case.kv_lengths() if case.ragged else None,
        window=case.window_size,
        documents=case.documents(),
        head_dim_v=case.head_dim_v,
    )


@dataclass(frozen=True)
class Reference:
    """A reference value for a measured quantity, with what it is (a figure draws it as a labelled line)."""

    value: float
    label: str  # what the value is and how it is counted
    name: str = ""  # a short name for a table header


def recompute_overhead_references() -> tuple[Reference, ...]:
    """What (recompute backward time / stored-P backward time - 1) would be if time followed FLOPs.

    Credited: the convention's 2.5x forward for a recompute backward over the 2.0x a backward that reads P
    needs. Executed: what the bundled pair runs, 7 against 5 block matmuls for the two-pass recompute backward
    (Q K^T is recomputed in both the dK/dV and the dQ pass), 5 against 5 for the one-pass (S recomputed once,
    as the stored-P passes compute dP twice). Not 0.5 / 2.5 = 20%: that is the recompute's share of a backward,
    not the overhead over one without it.
    """
    bwd = MODE_MULTIPLIER["bwd"]
    stored = bwd - RECOMPUTE_MULTIPLIER
    read_p = BWD_BLOCK_MATMULS["stored-p"]
    executed = [
        Reference(
            BWD_BLOCK_MATMULS[kind] / read_p - 1.0,
            f"executed by the bundled {what} backward: {BWD_BLOCK_MATMULS[kind]} / {read_p} block matmuls - 1 = "
            f"{BWD_BLOCK_MATMULS[kind] / read_p - 1:.0%}",
            f"executed FLOPs ({what})",
        )
        for kind, what in (("recompute", "two-pass"), ("recompute-one-pass", "one-pass"))
    ]
    credited = Reference(
        bwd / stored - 1.0,
        f"credited FLOPs: {bwd}x / {stored}x forward - 1 = {bwd / stored - 1:.0%}",
        "credited FLOPs",
    )
    return (credited, *executed)


def recompute_share() -> dict[str, float]:
    """The recompute's share of the work under each way of counting (see the module docstring)."""
    return {
        "of_backward_credited_2.5x": 0.5 / 2.5,
        "of_fwd_bwd_credited_3.5x": 0.5 / 3.5,
        "over_stored_p_backward_2x": 0.5 / 2.0,
        "of_fwd_bwd_without_recompute_3x": 0.5 / 3.0,
    }

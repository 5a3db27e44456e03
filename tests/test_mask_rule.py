"""One mask rule (spec/window.py): the models' spans and pair counts, the oracle's mask and the torch baselines'
masks all come from it, so they agree on which keys each query sees (causal, windows, seq_q != seq_k)."""

from __future__ import annotations

import itertools

import pytest

from flashbench.spec import window as mask_rule
from flashbench.spec.cases import Case

SHAPES = [(1, 1), (5, 5), (3, 9), (9, 3), (7, 12)]
MASKS = [(False, None), (True, None), (False, (2, 0)), (True, (3, -1)), (False, (1, 2)), (False, (-1, 1))]


def _seen(seq_q: int, seq_k: int, causal: bool, window) -> list[list[int]]:
    return [
        [j for j in range(seq_k) if mask_rule.visible(i, j, seq_q, seq_k, causal, window)]
        for i in range(seq_q)
    ]


@pytest.mark.parametrize(("seq_q", "seq_k"), SHAPES)
@pytest.mark.parametrize(("causal", "window"), MASKS)
def test_spans_and_pair_counts_are_those_of_the_visible_pairs(seq_q, seq_k, causal, window):
    """Counted one pair at a time from visible(): the FLOP model's pairs, the byte model's key span of every block
    of rows and row span of every block of keys, and the keyless rows the plan refuses."""
    seen = _seen(seq_q, seq_k, causal, window)
    assert mask_rule.unmasked_pairs(seq_q, seq_k, causal, window=window) == sum(map(len, seen))
    assert mask_rule.keyless_queries(seq_q, seq_k, causal, window) == sum(1 for keys in seen if not keys)
    for first, last in itertools.combinations_with_replacement(range(seq_q), 2):
        keys = [j for i in range(first, last + 1) for j in seen[i]]
        lo, hi = mask_rule.key_span(first, last, seq_q, seq_k, causal, window)
        assert (lo, hi) == (min(keys), max(keys) + 1) if keys else hi <= lo
    for first, last in itertools.combinations_with_replacement(range(seq_k), 2):
        rows = [i for i in range(seq_q) if any(first <= j <= last for j in seen[i])]
        lo, hi = mask_rule.row_span(first, last, seq_q, seq_k, causal, window)
        assert (lo, hi) == (min(rows), max(rows) + 1) if rows else hi <= lo


@pytest.mark.parametrize(
    ("seq_q", "seq_k", "causal", "window"), [(4, 12, True, None), (12, 12, False, (3, 1))]
)
def test_the_naive_baseline_masks_as_the_oracle_does(seq_q, seq_k, causal, window):
    """The naive provider's explicit mask (causal bottom-right with fewer queries than keys; a two-sided window)
    gives the float64 oracle's output."""
    torch = pytest.importorskip("torch")
    from contextlib import ExitStack

    from flashbench.engine.correctness import reference
    from flashbench.providers import builtin, registry

    builtin.load()
    text = mask_rule.window_text(window)
    case = Case("naive", 1, 2, 2, seq_q, seq_k, 16, "fp32", causal, "fwd", window=text)
    q, k, v = (torch.randn(1, 2, n, 16, dtype=torch.float64) for n in (seq_q, seq_k, seq_k))
    with ExitStack() as stack:
        naive = registry.get("naive").build(case, "cpu", stack)
        out = naive(q.float(), k.float(), v.float())
    ref = reference(q, k, v, causal=causal, window=window)["out"]
    assert torch.allclose(out.double(), ref, atol=1e-5)

"""The attention mask, in one place: which keys each query sees (causal, a sliding window, seq_q vs seq_k aligned
bottom-right), and what follows from it: the visible pairs (`visible`, elementwise on ints or tensors: the oracle's
mask, the torch baselines' explicit masks and FlexAttention's mask_mod), the key span of a block of queries and the
query span of a block of keys (`key_span`, `row_span`: the byte model's visited tiles), the unmasked pairs
(`unmasked_pairs`: the FLOP model), and the cases the rule leaves undefined (`keyless_queries`). Pure: no torch.
A new mask kind (a document mask for packed batches) is a new rule here, then its kernels.

Convention (flash-attn's `window_size`, aligned bottom-right like flashbench's causal mask): query i sits at key
position p = i + seq_k - seq_q and sees keys j with p - left <= j <= p + right; -1 = no limit on that side. A
causal mask is right = 0, so causal with (left, -1) or (left, 0) is the same window, and causal with right > 0
contradicts itself (`effective` refuses it). A row whose window holds no key (p + right < 0, which needs
seq_q > seq_k + right) sees nothing: the oracle gives it output 0 and no gradient. A sweep refuses such a case
(keyless_queries; spec/plan.check_defined) rather than time it: providers do not agree on it (the naive
provider's softmax gives NaN, SDPA's math backend 0), so its rows would read as kernel bugs.

Text form (`--window L,R`, a Case's `window` field): "L,R" with L, R whole numbers >= -1, e.g. "4096,0"; "" (or
"none", "-1,-1") is no window. A sweep takes several, separated by ';' or as a TOML list.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from flashbench.errors import FlashbenchError

Window = tuple[int, int]
# Where query i sits among the keys: bottom-right at key i + seq_k - seq_q (flash-attn >= 2.1, flashbench's
# kernels, the oracle), top-left at key i (PyTorch's is_causal for seq_q != seq_k; the FLOP model can count it).
Alignment = Literal["bottom-right", "top-left"]
_PAIR = re.compile(r"^\s*([+-]?\d+)\s*,\s*([+-]?\d+)\s*$")
_NONE = ("", "none", "off", "full")


def parse_window(value: Any) -> Window | None:
    """One window from "L,R" (or [L, R]); None for no window. FlashbenchError (one line) on anything else."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(type(v) is int for v in value):
        value = f"{value[0]},{value[1]}"
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in _NONE:
        return None
    match = _PAIR.match(text) if text is not None else None
    if match is None:
        raise FlashbenchError(
            f"window: {value!r} is not L,R (two whole numbers >= -1, e.g. 4096,0; -1 = no limit)"
        )
    left, right = int(match[1]), int(match[2])
    if left < -1 or right < -1:
        raise FlashbenchError(f"window: {value!r}: each side must be >= -1 (-1 = no limit)")
    return None if (left, right) == (-1, -1) else (left, right)


def parse_windows(value: Any) -> tuple[str, ...]:
    """Several windows ("L,R;L,R", a TOML list of "L,R" strings or [L, R] pairs, or one [L, R]) as canonical
    strings ("" for no window), in the order given, without repeats."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(type(v) is int for v in value):
        items: list[Any] = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = str(value).split(";")
    if not items:
        raise FlashbenchError("window: empty value")
    return tuple(dict.fromkeys(window_text(parse_window(item)) for item in items))


def window_text(window: Window | None) -> str:
    """The canonical text of a window: "L,R", or "" for none."""
    return "" if window is None else f"{window[0]},{window[1]}"


def effective(causal: bool, window: Window | None) -> Window | None:
    """The window a case computes: causal folded in as right = 0, None when nothing beyond causal is masked.
    ValueError when causal meets a window whose right side is > 0 (they contradict)."""
    if window is None:
        return None
    left, right = window
    if causal:
        if right > 0:
            raise ValueError(f"causal means window right = 0, not {right} (window {left},{right})")
        right = 0
        if left == -1:
            return None
    return left, right


def bounds(causal: bool, window: Window | None) -> Window:
    """(left, right): the keys before and after its position that a query sees, -1 = no limit; causal is right = 0
    (a window whose right > 0 contradicts causal: `effective` refuses it, and here it counts as causal)."""
    left, right = window if window is not None else (-1, -1)
    return left, 0 if causal else right


def masked(causal: bool, window: Window | None) -> bool:
    """Whether any (query, key) pair is masked out by the rule (beyond what seq_q, seq_k hold)."""
    return causal or window is not None


def offset(seq_q: Any, seq_k: Any, alignment: Alignment = "bottom-right") -> Any:
    """The key position of query 0 (ints, or a tensor of per-sequence key counts)."""
    return seq_k - seq_q if alignment == "bottom-right" else 0


def keyless_queries(seq_q: int, seq_k: int, causal: bool, window: Window | None) -> int:
    """How many of seq_q queries over seq_k keys see no key at all: the first seq_q - seq_k - right, where the
    mask bounds the right side (causal: right = 0); 0 without such a bound or for a contradictory window."""
    try:
        effective(causal, window)
    except ValueError:
        return 0  # the plan marks it unsupported
    right = bounds(causal, window)[1]
    return max(0, seq_q - seq_k - right) if right >= 0 else 0


def visible(rows: Any, cols: Any, seq_q: Any, seq_k: Any, causal: bool, window: Window | None) -> Any:
    """Whether query `rows` see key `cols` (ints, or broadcasting tensors; seq_k may be a tensor of per-sequence
    key counts): the oracle's mask, the baselines' bool masks and mask_mods. True (a plain bool) when nothing is
    masked; ValueError for a window that contradicts causal."""
    effective(causal, window)
    left, right = bounds(causal, window)
    pos = rows + offset(seq_q, seq_k)
    if right >= 0 and left >= 0:
        return (cols <= pos + right) & (cols >= pos - left)
    if right >= 0:
        return cols <= pos + right
    if left >= 0:
        return cols >= pos - left
    return True


def document_visible(doc: Any, rows: Any, cols: Any, causal: bool, window: Window | None) -> Any:
    """The document mask of a packed batch (spec/cases.py): token `rows` sees token `cols` iff both lie in one
    document (doc: each token's document index, a tensor) and the case's mask lets it within that document.
    A document's queries are its keys, so positions inside it differ as the packed indices do (offset 0)."""
    return (doc[rows] == doc[cols]) & visible(rows, cols, 0, 0, causal, window)


def key_span(
    first_row: int,
    last_row: int,
    seq_q: int,
    seq_k: int,
    causal: bool,
    window: Window | None,
    alignment: Alignment = "bottom-right",
) -> tuple[int, int]:
    """Keys [lo, hi) seen by some query row of [first_row, last_row] (hi <= lo: none)."""
    left, right = bounds(causal, window)
    at = offset(seq_q, seq_k, alignment)
    hi = seq_k if right < 0 else max(0, min(seq_k, last_row + at + right + 1))
    lo = 0 if left < 0 else max(0, min(seq_k, first_row + at - left))
    return lo, hi


def row_span(
    first_key: int,
    last_key: int,
    seq_q: int,
    seq_k: int,
    causal: bool,
    window: Window | None,
    alignment: Alignment = "bottom-right",
) -> tuple[int, int]:
    """Query rows [lo, hi) that see some key of [first_key, last_key] (hi <= lo: none)."""
    left, right = bounds(causal, window)
    at = offset(seq_q, seq_k, alignment)
    lo = 0 if right < 0 else max(0, min(seq_q, first_key - at - right))
    hi = seq_q if left < 0 else max(0, min(seq_q, last_key - at + left + 1))
    return lo, hi


def unmasked_pairs(
    seq_q: int,
    seq_k: int,
    causal: bool,
    alignment: Alignment = "bottom-right",
    window: Window | None = None,
) -> int:
    """Number of (query, key) pairs that the mask keeps, for one batch element and one head (the FLOP model's
    pairs: models/flops.py), in closed form."""
    if seq_q < 0 or seq_k < 0:
        raise ValueError("sequence lengths must be >= 0")
    at = offset(seq_q, seq_k, alignment)
    left, right = bounds(causal, window)
    # Row i keeps clamp(p + right + 1, 0, seq_k) - clamp(p - left, 0, seq_k) keys (never negative): the keys at
    # or before p + right minus those before p - left, each summed over the rows in closed form.
    keep = _clamped_ramp(seq_q, seq_k, at + right) if right >= 0 else seq_q * seq_k
    if left >= 0:
        keep -= _clamped_ramp(seq_q, seq_k, at - left - 1)
    return keep


def _clamped_ramp(seq_q: int, seq_k: int, at: int) -> int:
    """sum over rows i < seq_q of clamp(i + at + 1, 0, seq_k): the keys at or before i + at."""
    # Three ranges of rows: those that keep nothing, those on the ramp, those that keep all seq_k keys.
    first_ramp = max(0, -at)  # first row with at least one key
    first_full = max(0, min(seq_q, seq_k - at - 1))  # first row that keeps all keys
    first_full = max(first_full, first_ramp)
    ramp_rows = first_full - first_ramp
    # keys kept on the ramp: (first_ramp + at + 1) ... (first_full - 1 + at + 1)
    lo = first_ramp + at + 1
    hi = first_full + at
    ramp = (lo + hi) * ramp_rows // 2 if ramp_rows > 0 else 0
    full = max(0, seq_q - first_full) * seq_k
    return ramp + full

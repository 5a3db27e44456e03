"""Sliding-window (local) attention: the window's convention, its text form, and the mask it makes. Pure: no torch.

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
from typing import Any

from flashbench.errors import FlashbenchError

Window = tuple[int, int]
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


def keyless_queries(seq_q: int, seq_k: int, causal: bool, window: Window | None) -> int:
    """How many of seq_q queries over seq_k keys see no key at all: the first seq_q - seq_k - right, where the
    mask bounds the right side (causal: right = 0); 0 without such a bound or for a contradictory window."""
    try:
        bounds = effective(causal, window)
    except ValueError:
        return 0  # the plan marks it unsupported
    right = bounds[1] if bounds is not None else (0 if causal else -1)
    return max(0, seq_q - seq_k - right) if right >= 0 else 0


def visible(rows: Any, cols: Any, seq_q: int, seq_k: int, causal: bool, window: Window | None) -> Any:
    """Whether query `rows` see key `cols` (ints, or broadcasting tensors: the oracle's and the baselines' mask);
    True (a plain bool) when nothing is masked."""
    left, right = effective(causal, window) or (-1, 0 if causal else -1)
    pos = rows + (seq_k - seq_q)
    if right >= 0 and left >= 0:
        return (cols <= pos + right) & (cols >= pos - left)
    if right >= 0:
        return cols <= pos + right
    if left >= 0:
        return cols >= pos - left
    return True

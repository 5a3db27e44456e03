"""The small pieces every part of the verdict is written with: a block (one paragraph or list, in the colour the
HTML page gives it) and how a ratio and a share are printed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Block:
    """One paragraph or list of the verdict. kind: "text", "pass", "fail" or "warn" (the HTML's colour)."""

    kind: str
    markdown: str


def x(value: float) -> str:
    """A time ratio as the verdict prints it: 1.07×."""
    return f"{value:.2f}×"


def pct(value: float) -> str:
    """A relative value (0.055) as a share: 5.5%."""
    return f"{100 * value:.1f}%"


def span(values: Any, fmt: str) -> str:
    """The range of `values` in one format: "3070–3081", or one number where both ends print the same."""
    lo, hi = float(min(values)), float(max(values))
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}–{format(hi, fmt)}"

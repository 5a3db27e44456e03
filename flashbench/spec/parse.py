"""Parsing what a sweep option takes, from the CLI's text, a TOML value or a Python value; pure, no torch.

Range syntax (the same for --seq, --seq-q, --batch, --heads, --kv-heads, --head-dim, --page-size):
    512..32768        doubling from the first value up to the last, inclusive: 512, 1024, ..., 32768
    1024..8192:1024   an arithmetic step: 1024, 2048, ..., 8192
    1000,3000         a list; items may themselves be ranges: 64,128..512
Every bad value is a one-line FlashbenchError (exit code 2).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from flashbench.errors import FlashbenchError
from flashbench.spec.cases import DTYPES, MODES

DEVICES = ("cuda", "cpu")
# Aliases people type for dtypes; the canonical names are cases.DTYPES.
_DTYPE_ALIASES = {
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "e4m3": "fp8",
    "float8_e4m3fn": "fp8",
}
_INT = re.compile(r"^[+-]?\d+$")
_MAX_RANGE_ITEMS = 10_000  # a range that expands past this is a typo, not a sweep


def _int(text: str, what: str) -> int:
    text = text.strip().replace("_", "")
    if not _INT.match(text):
        raise FlashbenchError(f"{what}: {text!r} is not a whole number")
    value = int(text)
    if value <= 0:
        raise FlashbenchError(f"{what}: {value} must be a positive number")
    return value


def parse_range(text: str | int | list[Any] | tuple[Any, ...], what: str = "range") -> list[int]:
    """Expand range syntax into a sorted list of distinct positive ints (see the module docstring)."""
    if isinstance(text, bool):
        raise FlashbenchError(f"{what}: {text!r} is not a number or range")
    if isinstance(text, int):
        return parse_range(str(text), what)
    if isinstance(text, (list, tuple)):
        return parse_range(",".join(str(t) for t in text), what)
    if not isinstance(text, str) or not text.strip():
        raise FlashbenchError(f"{what}: empty value (expected e.g. 512..32768, 1024..8192:1024 or 1000,3000)")
    values: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise FlashbenchError(f"{what}: empty item in {text!r}")
        if ".." not in item:
            values.add(_int(item, what))
            continue
        lo_text, _, rest = item.partition("..")
        hi_text, colon, step_text = rest.partition(":")
        lo, hi = _int(lo_text, what), _int(hi_text, what)
        if hi < lo:
            raise FlashbenchError(f"{what}: range {item!r} is reversed ({lo} > {hi})")
        if colon:
            step = _int(step_text, what)
            if (hi - lo) // step + 1 > _MAX_RANGE_ITEMS:
                raise FlashbenchError(f"{what}: range {item!r} has more than {_MAX_RANGE_ITEMS} values")
            values.update(range(lo, hi + 1, step))
        else:
            value = lo
            while value <= hi:  # doubling: powers of two when lo is one
                values.add(value)
                value *= 2
    return sorted(values)


def parse_choices(text: str | list[Any] | tuple[Any, ...], allowed: tuple[str, ...], what: str) -> list[str]:
    items = [str(t) for t in text] if isinstance(text, (list, tuple)) else str(text).split(",")
    out: list[str] = []
    for raw in items:
        item = raw.strip().lower()
        if what == "dtype":
            item = _DTYPE_ALIASES.get(item, item)
        if not item:
            raise FlashbenchError(f"{what}: empty item in {text!r}")
        if item not in allowed:
            raise FlashbenchError(f"unknown {what} {raw.strip()!r}{suggest(raw.strip(), allowed)}")
        if item not in out:
            out.append(item)
    if not out:
        raise FlashbenchError(f"{what}: empty value")
    return out


def parse_dtypes(text: str | list[Any]) -> list[str]:
    return parse_choices(text, DTYPES, "dtype")


def parse_modes(text: str | list[Any]) -> list[str]:
    return parse_choices(text, MODES, "mode")


def parse_causal(text: str | bool | list[Any]) -> list[bool]:
    """true | false | both (also yes/no/1/0, or a TOML bool / list of bools)."""
    if isinstance(text, bool):
        return [text]
    if isinstance(text, (list, tuple)):
        return sorted({v for t in text for v in parse_causal(t)})
    word = str(text).strip().lower()
    if word in ("both", "all"):
        return [False, True]
    if word in ("true", "yes", "1", "causal", "on"):
        return [True]
    if word in ("false", "no", "0", "full", "off"):
        return [False]
    raise FlashbenchError(f"causal: {text!r} must be true, false or both")


def parse_device(text: str) -> str:
    """cuda | cpu; anything else is a one-line error (exit 2), never a worker that cannot start."""
    return parse_choices(text, DEVICES, "device")[0]


def parse_names(text: str | list[Any]) -> list[str]:
    """A comma list of provider names ("all" is kept as is and expanded by the plan)."""
    items = [str(t) for t in text] if isinstance(text, (list, tuple)) else str(text).split(",")
    names = [i.strip() for i in items if i.strip()]
    if not names:
        raise FlashbenchError("providers: empty list")
    return list(dict.fromkeys(names))


def parse_decode_shape(text: str) -> tuple[int, int, int, int, int | None]:
    """A decode probe's shape "B,H,HKV,N[,PAGE]" (benchmarks/decode_speed.py, tools/decode_timeline.py): batch,
    query heads, KV heads (dividing the query heads), keys per sequence, and the page size of a paged cache (None:
    contiguous)."""
    what = "decode shape B,H,HKV,N[,PAGE]"
    parts = str(text).split(",")
    if len(parts) not in (4, 5):
        raise FlashbenchError(f"{what}: {text!r} has {len(parts)} fields, not 4 or 5")
    b, h, hkv, n, *page = (_int(part, what) for part in parts)
    if h % hkv:
        raise FlashbenchError(f"{what}: {hkv} KV heads do not divide {h} query heads in {text!r}")
    return b, h, hkv, n, page[0] if page else None


def suggest(word: str, choices: Any) -> str:
    """'; did you mean X?' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (choose from: {', '.join(sorted(choices))})"


def page_sizes(value: Any) -> list[int]:
    """Page sizes in tokens: powers of two (every paged KV cache in use pages by powers of two)."""
    sizes = parse_range(value, "page-size")
    for size in sizes:
        if size & (size - 1):
            raise FlashbenchError(f"page-size: {size} is not a power of two (e.g. 16, 64, 256)")
    return sizes


def one(value: Any, what: str) -> int:
    values = parse_range(value, what)
    if len(values) != 1:
        raise FlashbenchError(f"{what}: expected one number, got {value!r}")
    return values[0]


def number(value: Any, what: str, allow_zero: bool = False) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise FlashbenchError(f"{what}: {value!r} is not a number") from None
    if out < 0 or (out == 0 and not allow_zero) or out != out:
        raise FlashbenchError(f"{what}: {value!r} must be a positive number")
    return out


def whole(value: Any, what: str) -> int:
    """A whole number >= 0 (a seed; 0 host loops switch that measurement off)."""
    text = str(value).strip()
    if isinstance(value, bool) or not _INT.match(text) or int(text) < 0:
        raise FlashbenchError(f"{what}: {value!r} must be a whole number >= 0")
    return int(text)


def switch(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "1", "on"):
        return True
    if word in ("false", "no", "0", "off"):
        return False
    raise FlashbenchError(f"{what}: {value!r} must be true or false")


def split_choices(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma list of choices, lower-cased; a one-line error naming what is not understood."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise FlashbenchError(
            f"{what}: {', '.join(bad) or 'nothing'} not understood; expected {', '.join(allowed)}"
        )
    return items

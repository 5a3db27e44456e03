"""Sweep definitions: range parsing, TOML presets and CLI overrides -> one SweepSpec.

Range syntax (the same for --seq, --seq-q, --batch, --heads, --kv-heads, --head-dim, --page-size):
    512..32768        doubling from the first value up to the last, inclusive: 512, 1024, ..., 32768
    1024..8192:1024   an arithmetic step: 1024, 2048, ..., 8192
    1000,3000         a list; items may themselves be ranges: 64,128..512
A preset is a TOML file in configs/sweeps/ (`--preset NAME`) or anywhere (`--config FILE`); flags given on the
command line override its keys. Every bad value is a one-line FlashbenchError (exit code 2).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from flashbench.configfiles import config_path, read_toml
from flashbench.errors import FlashbenchError
from flashbench.spec.cases import DTYPES, KV_LAYOUTS, MODES, SEQLENS
from flashbench.spec.window import parse_windows

DEVICES = ("cuda", "cpu")
# The order cases run in: "provider" (each provider's cases together, the default) or "case" (per shape, every
# provider back to back, the direction alternating from shape to shape). See SweepSpec.order.
ORDERS = ("provider", "case")
L2_FLUSHES = ("read", "write")  # engine/timing.py L2Flusher
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


def _parse_choices(text: str | list[Any] | tuple[Any, ...], allowed: tuple[str, ...], what: str) -> list[str]:
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
    return _parse_choices(text, DTYPES, "dtype")


def parse_modes(text: str | list[Any]) -> list[str]:
    return _parse_choices(text, MODES, "mode")


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
    return _parse_choices(text, DEVICES, "device")[0]


def parse_names(text: str | list[Any]) -> list[str]:
    """A comma list of provider names ("all" is kept as is and expanded by the plan)."""
    items = [str(t) for t in text] if isinstance(text, (list, tuple)) else str(text).split(",")
    names = [i.strip() for i in items if i.strip()]
    if not names:
        raise FlashbenchError("providers: empty list")
    return list(dict.fromkeys(names))


def suggest(word: str, choices: Any) -> str:
    """'; did you mean X?' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (choose from: {', '.join(sorted(choices))})"


@dataclass(frozen=True)
class SweepSpec:
    """Everything a sweep needs to know: what to run and how to measure it."""

    name: str = "custom"  # the preset's name (used in the default run directory)
    providers: tuple[str, ...] = ("all",)
    seq: tuple[int, ...] = (1024,)  # N: keys per sequence (the KV cache length of a decode case)
    seq_q: tuple[int, ...] | None = None  # query tokens per sequence; None: = seq (the training shape)
    batch: tuple[int, ...] | None = None  # None: derived from tokens
    tokens: int | None = 16384  # batch = max(1, tokens // seq) (the FlashAttention benchmarks' convention)
    heads: tuple[int, ...] = (16,)
    hidden: int | None = None  # model width: heads = hidden // head_dim for each head dim (replaces heads)
    kv_heads: tuple[int, ...] | None = None  # None: = heads (no GQA)
    head_dim: tuple[int, ...] = (128,)
    dtype: tuple[str, ...] = ("bf16",)
    causal: tuple[bool, ...] = (False, True)
    mode: tuple[str, ...] = ("fwd",)
    # --- the serving shape (spec/cases.py): KV-cache layout, page size, per-sequence lengths ---
    kv_layout: tuple[str, ...] = ("contiguous",)
    page_size: tuple[int, ...] = (16,)  # tokens per page of a paged cache (powers of two)
    seqlens: tuple[str, ...] = ("uniform",)  # "random": ragged lengths in [N/2, N] (cases.kv_lengths)
    seed: int = 0  # the draw of the random lengths
    window: tuple[str, ...] = ("",)  # sliding windows "left,right" (spec/window.py); "" = none
    device: str = "cuda"
    # "case" interleaves the providers shape by shape, so that side-by-side ratios are taken at like GPU
    # temperatures and clocks: run provider-major, the first provider's cases heat the GPU for minutes (an H100
    # power-capped from 1980 to 1740 MHz) while the later ones start cool (H100, speed preset: the bundled kernel's cases
    # started at 47-65 C and ran at ~1750 MHz, cuDNN's that followed at 42-46 C).
    order: str = "provider"
    # --- measurement: the one regime every GPU preset shares (engine/timing.py; docs/measuring.md) ---
    # Steady warm-up: the case runs back to back, at least warmup_ms, until the median SM clock of the last
    # settle_window_ms differs from the window before by at most settle_pct, or warmup_max_ms has passed.
    warmup_ms: float = 500.0
    warmup_max_ms: float = 3000.0
    settle_window_ms: float = 250.0
    settle_pct: float = 1.0
    rep_ms: float = 200.0  # time budget for the samples while the SM clock holds still
    # while it moves (a power cap's controller steps it by 5-15% every few tens of ms), sampling goes on in
    # rep_ms chunks up to rep_max_ms, so that the median spans its swings rather than one phase of them
    rep_max_ms: float = 2000.0
    min_samples: int = 20
    max_samples: int = 1000
    # hold the GPU with a spin kernel while each sample is enqueued, so host launch gaps are not timed
    block_launches: bool = True
    # how the L2 is emptied before each sample: "read" (sum a buffer of 2x the L2: clean lines, dropped for
    # free) or "write" (zero it, as do_bench does: every line dirty, and the timed call pays their write-back,
    # ~9 us of a 53 us decode call on an H100: benchmarks/l2_flush.py)
    l2_flush: str = "read"
    # what a caller's loop pays (engine/timing.py, step 6): host_loops loops of back-to-back calls, each about
    # host_loop_ms long (0 loops: not measured); a row whose loop time exceeds its GPU time by more than
    # host_bound_pct percent is marked host-bound
    host_loops: int = 5
    host_loop_ms: float = 50.0
    host_bound_pct: float = 10.0
    timeout_s: float = 300.0  # per case, compile included
    cuda_graph: bool = False
    ncu: bool = False
    kernels: tuple[str, ...] = ()  # user kernel files (--kernel)
    description: str = ""
    # ref_flops_limit: the float64 reference checks as many (batch, kv-head group) slices as fit in this budget
    ref_flops_limit: float | None = None  # None: 2e13 on cuda, 2e9 on cpu
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSpec:
        names = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in data.items():
            if k in names:
                kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)


# TOML / override keys -> how to parse them. Keys may be written with '-' or '_'.
_PARSERS: dict[str, Any] = {
    "providers": lambda v: tuple(parse_names(v)),
    "seq": lambda v: tuple(parse_range(v, "seq")),
    "seq_q": lambda v: None if v is None else tuple(parse_range(v, "seq-q")),
    "kv_layout": lambda v: tuple(_parse_choices(v, KV_LAYOUTS, "kv-layout")),
    "page_size": lambda v: tuple(_page_sizes(v)),
    "seqlens": lambda v: tuple(_parse_choices(v, SEQLENS, "seqlens")),
    "seed": lambda v: _seed(v),
    "window": lambda v: parse_windows(v),
    "batch": lambda v: None if v is None else tuple(parse_range(v, "batch")),
    "tokens": lambda v: None if v is None else _single(v, "tokens"),
    "heads": lambda v: tuple(parse_range(v, "heads")),
    "hidden": lambda v: None if v is None else _single(v, "hidden"),
    "kv_heads": lambda v: None if v is None else tuple(parse_range(v, "kv-heads")),
    "head_dim": lambda v: tuple(parse_range(v, "head-dim")),
    "dtype": lambda v: tuple(parse_dtypes(v)),
    "causal": lambda v: tuple(parse_causal(v)),
    "mode": lambda v: tuple(parse_modes(v)),
    "device": parse_device,
    "order": lambda v: _parse_choices(v, ORDERS, "order")[0],
    "warmup_ms": lambda v: _float(v, "warmup_ms", allow_zero=True),
    "warmup_max_ms": lambda v: _float(v, "warmup_max_ms", allow_zero=True),
    "settle_window_ms": lambda v: _float(v, "settle_window_ms"),
    "settle_pct": lambda v: _float(v, "settle_pct"),
    "rep_ms": lambda v: _float(v, "rep_ms"),
    "rep_max_ms": lambda v: _float(v, "rep_max_ms"),
    "block_launches": lambda v: _bool(v, "block_launches"),
    "l2_flush": lambda v: _parse_choices(v, L2_FLUSHES, "l2_flush")[0],
    "host_loops": lambda v: _count(v, "host_loops"),
    "host_loop_ms": lambda v: _float(v, "host_loop_ms"),
    "host_bound_pct": lambda v: _float(v, "host_bound_pct", allow_zero=True),
    "min_samples": lambda v: _single(v, "min_samples"),
    "max_samples": lambda v: _single(v, "max_samples"),
    "timeout_s": lambda v: _float(v, "timeout"),
    "timeout": lambda v: _float(v, "timeout"),
    "cuda_graph": lambda v: _bool(v, "cuda_graph"),
    "ncu": lambda v: _bool(v, "ncu"),
    "kernels": lambda v: tuple(str(p) for p in ([v] if isinstance(v, str) else v)),
    "description": str,
    "name": str,
    "ref_flops_limit": lambda v: None if v is None else _float(v, "ref_flops_limit"),
}
_RENAME = {"timeout": "timeout_s"}


def _page_sizes(value: Any) -> list[int]:
    """Page sizes in tokens: powers of two (every paged KV cache in use pages by powers of two)."""
    sizes = parse_range(value, "page-size")
    for size in sizes:
        if size & (size - 1):
            raise FlashbenchError(f"page-size: {size} is not a power of two (e.g. 16, 64, 256)")
    return sizes


def _seed(value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not _INT.match(text) or int(text) < 0:
        raise FlashbenchError(f"seed: {value!r} must be a whole number >= 0")
    return int(text)


def _single(value: Any, what: str) -> int:
    values = parse_range(value, what)
    if len(values) != 1:
        raise FlashbenchError(f"{what}: expected one number, got {value!r}")
    return values[0]


def _float(value: Any, what: str, allow_zero: bool = False) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise FlashbenchError(f"{what}: {value!r} is not a number") from None
    if out < 0 or (out == 0 and not allow_zero) or out != out:
        raise FlashbenchError(f"{what}: {value!r} must be a positive number")
    return out


def _count(value: Any, what: str) -> int:
    """A whole number >= 0 (0 switches the measurement off)."""
    if isinstance(value, bool) or not (isinstance(value, int) or str(value).strip().isdigit()):
        raise FlashbenchError(f"{what}: {value!r} must be a whole number >= 0")
    return int(value)


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "1", "on"):
        return True
    if word in ("false", "no", "0", "off"):
        return False
    raise FlashbenchError(f"{what}: {value!r} must be true or false")


def _apply(spec: SweepSpec, values: dict[str, Any], where: str) -> SweepSpec:
    changes: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = raw_key.replace("-", "_")
        if key not in _PARSERS:
            raise FlashbenchError(f"{where}: unknown key {raw_key!r}{suggest(key, _PARSERS)}")
        changes[_RENAME.get(key, key)] = _PARSERS[key](value)
    # --batch and --tokens exclude each other: the later one given wins.
    if changes.get("batch") is not None:
        changes.setdefault("tokens", None)
        if changes["tokens"] is not None:
            raise FlashbenchError(f"{where}: give either batch or tokens, not both")
    elif changes.get("tokens") is not None:
        changes["batch"] = None
    # --heads and --hidden exclude each other the same way.
    if changes.get("hidden") is not None and "heads" in changes:
        raise FlashbenchError(f"{where}: give either heads or hidden, not both")
    if "heads" in changes:
        changes["hidden"] = None
    return replace(spec, **changes)


def preset_names() -> list[str]:
    folder = config_path("sweeps")
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []


def preset_file(name: str) -> Path:
    names = preset_names()
    if name not in names:
        raise FlashbenchError(f"unknown preset {name!r}{suggest(name, names)}")
    return config_path("sweeps", f"{name}.toml")


def read_preset(path: str | Path) -> dict[str, Any]:
    """A preset file as a flat dict: [sweep] and [measure] tables merged, top-level keys kept."""
    data = read_toml(path)
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in ("sweep", "measure"):
                raise FlashbenchError(f"{path}: unknown table [{key}] (expected [sweep] and [measure])")
            flat.update(value)
        else:
            flat[key] = value
    return flat


def load_spec(
    preset: str | None = None,
    config: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    base: SweepSpec | None = None,
) -> SweepSpec:
    """Build a SweepSpec: base (or built-in defaults) <- preset or config file <- overrides (flags).

    `overrides` holds only the flags the user gave (None values are ignored).
    """
    if preset and config:
        raise FlashbenchError("give either --preset or --config, not both")
    spec = base or SweepSpec()
    if preset or config:
        path = preset_file(preset) if preset else Path(config)  # type: ignore[arg-type]
        values = read_preset(path)
        values.setdefault("name", preset or Path(path).stem)
        spec = _apply(spec, values, str(path))
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if given:
        spec = _apply(spec, given, "option")
    validate(spec)
    return spec


def validate(spec: SweepSpec) -> None:
    if spec.batch is None and spec.tokens is None:
        raise FlashbenchError("give batch (--batch) or tokens per batch (--tokens)")
    if spec.hidden is not None:
        for d in spec.head_dim:
            if spec.hidden % d:
                raise FlashbenchError(
                    f"hidden ({spec.hidden}) must be a multiple of every head dim (not {d})"
                )
    kv = spec.kv_heads or ()
    for h in {h for d in spec.head_dim for h in heads_for(spec, d)}:
        for k in kv:
            if k > h or h % k:
                raise FlashbenchError(f"heads ({h}) must be a multiple of kv-heads ({k})")
    if spec.min_samples < 1 or spec.max_samples < spec.min_samples:
        raise FlashbenchError("min_samples must be >= 1 and <= max_samples")
    if spec.warmup_max_ms < spec.warmup_ms:
        raise FlashbenchError("warmup_max_ms must be >= warmup_ms (the warm-up's bound and its minimum)")
    if spec.rep_max_ms < spec.rep_ms:
        raise FlashbenchError("rep_max_ms must be >= rep_ms (the samples' bound and their budget)")
    if spec.cuda_graph and spec.device == "cpu":
        raise FlashbenchError("--cuda-graph needs --device cuda")


def heads_for(spec: SweepSpec, head_dim: int) -> tuple[int, ...]:
    """The query-head counts swept at one head dim: --heads as given, or hidden // head_dim."""
    return (spec.hidden // head_dim,) if spec.hidden is not None else spec.heads


def split_choices(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma list of choices, lower-cased; a one-line error naming what is not understood."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise FlashbenchError(
            f"{what}: {', '.join(bad) or 'nothing'} not understood; expected {', '.join(allowed)}"
        )
    return items

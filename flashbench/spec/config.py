"""Sweep definitions: each option written once, TOML presets and overrides -> one SweepSpec.

Every option a sweep takes is a SweepSpec field whose metadata (an Option) says what it means (its help), how its
value is parsed (spec/parse.py; range syntax there), and under which CLI flag it is given; `flashbench sweep`'s
options (cli/sweep.py) and `flashbench.sweep`'s keywords (api.py) are made from these, with the few run options
(RUN_OPTIONS: preset, out, resume...) that are not part of the spec. Not given (None) means: the preset's value.
A preset is a TOML file in configs/sweeps/ (`--preset NAME`) or anywhere (`--config FILE`); flags given on the
command line override its keys. Every bad value is a one-line FlashbenchError (exit code 2).
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from flashbench.configfiles import config_path, read_toml
from flashbench.errors import FlashbenchError
from flashbench.spec.cases import KV_DTYPES, KV_LAYOUTS, SEQLENS
from flashbench.spec.options import CACHE, SHAPE, Option, ints, maybe, spec_field
from flashbench.spec.parse import (
    number,
    one,
    page_sizes,
    parse_causal,
    parse_choices,
    parse_device,
    parse_dtypes,
    parse_modes,
    parse_names,
    suggest,
    switch,
    whole,
)
from flashbench.spec.window import parse_windows

# The order cases run in: "provider" (each provider's cases together, the default) or "case" (per shape, every
# provider back to back, the direction alternating from shape to shape). See SweepSpec.order.
ORDERS = ("provider", "case")
L2_FLUSHES = ("read", "write")  # engine/timing.py L2Flusher
# --kv-dtype's words: "same" is the Case's "" (the cache in the case's dtype)
KV_CACHE_DTYPES: tuple[str, ...] = ("same", *KV_DTYPES[1:])


@dataclass(frozen=True)
class SweepSpec:
    """Everything a sweep needs to know: what to run and how to measure it (each field's Option: its help)."""

    name: str = spec_field("custom", "the sweep's name (the default run directory's suffix)", str)
    providers: tuple[str, ...] = spec_field(
        ("all",),
        "comma list, or 'all' (see `flashbench list providers`)",
        lambda v: tuple(parse_names(v)),
        flag="--providers",
    )
    seq: tuple[int, ...] = spec_field(
        (1024,),
        "sequence lengths N (tokens): 512..32768, 1024..8192:1024, 1000,3000",
        ints("seq"),
        flag="--seq",
        panel=SHAPE,
    )
    seq_q: tuple[int, ...] | None = spec_field(
        None,
        "query tokens per sequence (decode: 1); default = --seq, the training shape",
        maybe(ints("seq-q")),
        flag="--seq-q",
        panel=SHAPE,
    )
    batch: tuple[int, ...] | None = spec_field(
        None, "batch sizes (instead of --tokens)", maybe(ints("batch")), flag="--batch", panel=SHAPE
    )
    # (the FlashAttention benchmarks' convention)
    tokens: int | None = spec_field(
        16384,
        "tokens per batch: batch = max(1, T // N)",
        maybe(lambda v: one(v, "tokens")),
        flag="--tokens",
        cli=int,
        panel=SHAPE,
    )
    heads: tuple[int, ...] = spec_field((16,), "query heads", ints("heads"), flag="--heads", panel=SHAPE)
    hidden: int | None = spec_field(
        None,
        "model width: heads = hidden // head_dim per head dim (instead of --heads)",
        maybe(lambda v: one(v, "hidden")),
        flag="--hidden",
        cli=int,
        panel=SHAPE,
    )
    kv_heads: tuple[int, ...] | None = spec_field(
        None,
        "key/value heads (GQA); default = heads",
        maybe(ints("kv-heads")),
        flag="--kv-heads",
        panel=SHAPE,
    )
    head_dim: tuple[int, ...] = spec_field(
        (128,), "head dimensions d, e.g. 64,128", ints("head-dim"), flag="--head-dim", panel=SHAPE
    )
    head_dim_v: tuple[int, ...] | None = spec_field(
        None,
        "MLA (absorbed form): V = the first head_dim_v dims of one latent K head, e.g. 512 with --head-dim 576 "
        "--kv-heads 1; default: V has head_dim dims of its own",
        maybe(ints("head-dim-v")),
        flag="--head-dim-v",
        panel=SHAPE,
    )
    dtype: tuple[str, ...] = spec_field(
        ("bf16",),
        "fp16,bf16,fp32,fp8 (fp8: float8_e4m3fn inputs, forward only)",
        lambda v: tuple(parse_dtypes(v)),
        flag="--dtype",
        panel=SHAPE,
    )
    causal: tuple[bool, ...] = spec_field(
        (False, True),
        "true | false | both (a bare --causal: true)",
        lambda v: tuple(parse_causal(v)),
        flag="--causal",
        panel=SHAPE,
    )
    mode: tuple[str, ...] = spec_field(
        ("fwd",), "fwd,bwd,fwd+bwd", lambda v: tuple(parse_modes(v)), flag="--mode", panel=SHAPE
    )
    # --- the serving shape (spec/cases.py): KV-cache layout, page size, per-sequence lengths ---
    kv_layout: tuple[str, ...] = spec_field(
        ("contiguous",),
        "KV cache: contiguous | paged | contiguous,paged",
        lambda v: tuple(parse_choices(v, KV_LAYOUTS, "kv-layout")),
        flag="--kv-layout",
        panel=CACHE,
    )
    page_size: tuple[int, ...] = spec_field(
        (16,),
        "tokens per page of a paged KV cache (powers of two; 16)",
        lambda v: tuple(page_sizes(v)),
        flag="--page-size",
        panel=CACHE,
    )
    seqlens: tuple[str, ...] = spec_field(
        ("uniform",),
        "lengths per sequence: uniform (all N) | random (uniform draw) | lognormal; training shape: documents "
        "packed into the batch's tokens, drawn in [--min-seq, N]; with --seq-q or paged: KV lengths in [N/2, N]",
        lambda v: tuple(parse_choices(v, SEQLENS, "seqlens")),
        flag="--seqlens",
        panel=SHAPE,
    )
    kv_dtype: tuple[str, ...] = spec_field(
        ("same",),
        "KV cache storage: same (the --dtype) | fp8 (float8_e4m3fn, per-(sequence, KV head) scales) | same,fp8",
        lambda v: tuple(parse_choices(v, KV_CACHE_DTYPES, "kv-dtype")),
        flag="--kv-dtype",
        panel=CACHE,
    )
    seed: int = spec_field(
        0,
        "the draw of --seqlens random / lognormal (default 0)",
        lambda v: whole(v, "seed"),
        flag="--seed",
        cli=int,
        panel=SHAPE,
    )
    min_seq: int | None = spec_field(
        None,
        "packed documents' shortest drawn length in tokens (default N // 16, at least 1)",
        maybe(lambda v: one(v, "min-seq")),
        flag="--min-seq",
        cli=int,
        panel=SHAPE,
    )
    window: tuple[str, ...] = spec_field(
        ("",),
        "sliding window L,R in keys before,after each query (-1: no limit; causal: R = 0), e.g. 4096,0; "
        "several: '-1,-1;4096,0' (-1,-1 = none)",
        parse_windows,
        flag="--window",
        panel=SHAPE,
    )
    device: str = spec_field(
        "cuda", "cuda | cpu (cpu: Triton interpreter, CPU times)", parse_device, flag="--device"
    )
    # "case" interleaves the providers shape by shape, so that side-by-side ratios are taken at like GPU
    # temperatures and clocks: run provider-major, the first provider's cases heat the GPU for minutes (an H100
    # power-capped from 1980 to 1740 MHz) while the later ones start cool (H100, speed preset: the bundled kernel's cases
    # started at 47-65 C and ran at ~1750 MHz, cuDNN's that followed at 42-46 C).
    order: str = spec_field(
        "provider",
        "provider (each provider's cases together) | case (per shape, all providers back to back)",
        lambda v: parse_choices(v, ORDERS, "order")[0],
        flag="--order",
    )
    # --- measurement: the one regime every GPU preset shares (engine/timing.py; docs/measuring.md) ---
    # Steady warm-up: the case runs back to back, at least warmup_ms, until the median SM clock of the last
    # settle_window_ms differs from the window before by at most settle_pct, or warmup_max_ms has passed.
    warmup_ms: float = spec_field(
        500.0, "the warm-up's minimum in ms", lambda v: number(v, "warmup_ms", allow_zero=True)
    )
    warmup_max_ms: float = spec_field(
        3000.0,
        "the warm-up's bound in ms, settled or not",
        lambda v: number(v, "warmup_max_ms", allow_zero=True),
    )
    settle_window_ms: float = spec_field(
        250.0,
        "ms of SM clock readings compared with the window before",
        lambda v: number(v, "settle_window_ms"),
    )
    settle_pct: float = spec_field(
        1.0,
        "settled: the two windows' median SM clocks within this many percent",
        lambda v: number(v, "settle_pct"),
    )
    rep_ms: float = spec_field(
        200.0,
        "time budget in ms for the samples while the SM clock holds still",
        lambda v: number(v, "rep_ms"),
    )
    # while it moves (a power cap's controller steps it by 5-15% every few tens of ms), sampling goes on in
    # rep_ms chunks up to rep_max_ms, so that the median spans its swings rather than one phase of them
    rep_max_ms: float = spec_field(
        2000.0, "the samples' bound in ms while the SM clock moves", lambda v: number(v, "rep_max_ms")
    )
    min_samples: int = spec_field(20, "samples per case, at least", lambda v: one(v, "min_samples"))
    max_samples: int = spec_field(1000, "samples per case, at most", lambda v: one(v, "max_samples"))
    block_launches: bool = spec_field(
        True,
        "hold the GPU with a spin kernel while each sample is enqueued, so host launch gaps are not timed",
        lambda v: switch(v, "block_launches"),
    )
    # "read" drops clean lines for free; "write" (do_bench's) leaves every line dirty, and the timed call pays
    # their write-back, ~9 us of a 53 us decode call on an H100: benchmarks/l2_flush.py
    l2_flush: str = spec_field(
        "read",
        "how the L2 is emptied before each sample: read (sum a buffer of 2x the L2) | write (zero it)",
        lambda v: parse_choices(v, L2_FLUSHES, "l2_flush")[0],
    )
    # what a caller's loop pays (engine/timing.py, step 6)
    host_loops: int = spec_field(
        5, "loops of back-to-back calls timed per case (0: not measured)", lambda v: whole(v, "host_loops")
    )
    host_loop_ms: float = spec_field(
        50.0, "ms per loop of back-to-back calls", lambda v: number(v, "host_loop_ms")
    )
    host_bound_pct: float = spec_field(
        10.0,
        "a row whose loop time exceeds its GPU time by more than this many percent is host-bound",
        lambda v: number(v, "host_bound_pct", allow_zero=True),
    )
    timeout_s: float = spec_field(
        300.0,
        "per-case timeout in seconds, compile included",
        lambda v: number(v, "timeout"),
        flag="--timeout",
        cli=float,
        name="timeout",
    )
    cuda_graph: bool = spec_field(
        False,
        "time CUDA-graph replays",
        lambda v: switch(v, "cuda_graph"),
        flag="--cuda-graph/--no-cuda-graph",
        cli=bool,
    )
    ncu: bool = spec_field(
        False,
        "also record DRAM bytes with Nsight Compute",
        lambda v: switch(v, "ncu"),
        flag="--ncu/--no-ncu",
        cli=bool,
    )
    kernels: tuple[str, ...] = spec_field(
        (),
        "a Python file registering providers (repeatable)",
        lambda v: tuple(str(p) for p in ([v] if isinstance(v, (str, Path)) else v)),
        flag="--kernel",
        cli=list[Path],
    )
    description: str = spec_field(
        "", "what the sweep is for (a preset's line in `flashbench list presets`)", str
    )
    ref_flops_limit: float | None = spec_field(
        None,
        "the float64 reference checks as many (batch, kv-head group) slices as fit in this many FLOPs "
        "(default: 2e13 on cuda, 2e9 on cpu)",
        maybe(lambda v: number(v, "ref_flops_limit")),
    )
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


# The spec's options, in field order, each knowing its field; its name is the field's unless it gives its own.
SPEC_OPTIONS: tuple[Option, ...] = tuple(
    replace(f.metadata["option"], name=f.metadata["option"].name or f.name, field=f.name)
    for f in fields(SweepSpec)
    if "option" in f.metadata
)
SPEC_TYPES: dict[str, Any] = typing.get_type_hints(SweepSpec)  # each field's type, resolved
# TOML keys and library keywords -> their option; a key may be written with '-' or '_', a renamed field by
# either name (timeout, timeout_s).
_BY_KEY: dict[str, Option] = {
    **{o.field: o for o in SPEC_OPTIONS if o.field},
    **{o.name: o for o in SPEC_OPTIONS},
}


def _apply(spec: SweepSpec, values: dict[str, Any], where: str) -> SweepSpec:
    changes: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = raw_key.replace("-", "_")
        option = _BY_KEY.get(key)
        if option is None or option.field is None or option.parse is None:
            raise FlashbenchError(f"{where}: unknown key {raw_key!r}{suggest(key, _BY_KEY)}")
        changes[option.field] = option.parse(value)
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
    if spec.min_seq is not None:
        if spec.seq_q is not None:
            raise FlashbenchError(
                "--min-seq is for packed documents (the training shape): with --seq-q, --seqlens draws KV "
                "lengths in [N/2, N]"
            )
        over = [n for n in spec.seq if n < spec.min_seq]
        if over:
            raise FlashbenchError(
                f"--min-seq {spec.min_seq} is above --seq {over[0]}: documents are drawn in [min-seq, seq]"
            )
    if spec.cuda_graph and spec.device == "cpu":
        raise FlashbenchError("--cuda-graph needs --device cuda")


def heads_for(spec: SweepSpec, head_dim: int) -> tuple[int, ...]:
    """The query-head counts swept at one head dim: --heads as given, or hidden // head_dim."""
    return (spec.hidden // head_dim,) if spec.hidden is not None else spec.heads

"""The provider registry: one decorator, one typed record per attention implementation.

A provider is an attention implementation that flashbench can time. It declares what it supports, so the
plan can write "unsupported: <why>" rows instead of crashing, and how to check it is installed.

Two ways to register, through the same decorator (the bundled kernels, the torch baselines and a user's
`--kernel file.py` all use it):

    @register("my-attn", dtypes=("fp16", "bf16"), head_dims=(64, 128), backward=True)
    def my_attn(q, k, v, causal=False, sm_scale=None):   # q [B, H, Nq, D], k/v [B, Hkv, Nk, D]
        ...                                              # -> out [B, H, Nq, D]

    @register("my-attn-2", builder=True)
    def build(case, device, stack):                      # once per case, untimed
        ...                                              # set-up (masks, compile, contexts on `stack`)
        return lambda q, k, v: ...                       # the timed call

Serving (decode) cases: a provider that declares kv_layouts=("contiguous", "paged") and/or ragged=True is
called on paged or ragged cases as call(q, k, v, cache_seqlens=..., block_table=...) (keyword arguments, only
those the case has): k, v are then flash_decode's cache (kernels/decode.py): a contiguous [B, Hkv, N, D] cache
with cache_seqlens int32 [B] valid keys per sequence, or a page pool [pages, Hkv, page_size, D] with
block_table int32 [B, ceil(N / page_size)] (cache_seqlens always given with it). A call on a training-shaped
case (contiguous, every sequence N long) gets q, k, v only, whatever it declares. A provider that needs the cache
in another layout may give its call a `prepare(q, k, v, **cache) -> (q, k, v, cache)` attribute: it runs once,
untimed, and the samples then time the call on what it returned.

FP8 cases (dtype "fp8", forward only): a provider that declares "fp8" among its dtypes is called as
call(q, k, v, q_descale=..., k_descale=..., v_descale=...) with float8_e4m3fn q, k, v quantized from bf16
per (batch, K/V head) and fp32 descales [B, Hkv] (flashbench.engine.fp8, FlashAttention-3's convention); it
returns the bf16 output. Its `prepare` (above) sees the descales among the keywords.

Packed training batches (spec/cases.py: --seqlens random|lognormal on the training shape): a provider that
declares packed=True is called on them as call(q, k, v, cu_seqlens=..., max_seqlen=...) with q [total, H, D],
k and v [total, Hkv, D] (total = batch * N tokens, the documents one after another) and cu_seqlens int32
[documents + 1] their prefix sums (engine/packed.py, flash-attn's varlen convention; queries and keys share
them); it returns out [total, H, D]. Every document attends only to itself, causal and windows within it.
FP8 KV caches (`--kv-dtype fp8`, Case.kv_dtype): a provider that declares kv_dtypes=("fp8",) is called with q in
fp16 or bf16 and k, v (contiguous or paged, as above) in float8_e4m3fn, plus k_scale=, v_scale= float32 [B, Hkv]
(per (sequence, KV head) amax scales, engine/fp8.quantize): a stored value times its scale is the real value,
and the output has q's dtype (flash_decode's convention). Every other provider's FP8-cache cases are
`unsupported` rows: dequantizing the cache first is other work (twice the bytes read), not the same call.

MLA cases (Case.head_dim_v > 0, DeepSeek's absorbed form, forward only): q [B, H, Nq, D], k the one latent head
[B, 1, N, D] (or its page pool [pages, 1, page_size, D]) and v a view of k's first head_dim_v dims; the call returns
[B, H, Nq, head_dim_v]. A provider takes them only when it declares latent="also" (ordinary cases too) or
latent="only" (an MLA kernel, which takes nothing else).

Sliding windows (`--window L,R`, spec/window.py): a provider that declares window=True is called with
window=(left, right) as a keyword on the cases that have one (a builder reads case.window_size); every other
provider's windowed cases are `unsupported` rows saying so.

What the rest of flashbench knows of a provider it reads here, from the declaration (docs/providers.md):
memory_family (the family the memory and byte models take it for; every row carries it), baseline (its rank
among the default speedup references), ratio_vs (the reference the gate holds its in-run ratio against), colour
(its fixed colour in every report) and package (the distribution whose version the environment records). Adding a
built-in provider is its registration plus its docs page. The built-in providers register when
flashbench.providers.builtin is imported; this module knows none of them.

This module imports no torch: the parent process reads the registry without touching CUDA.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flashbench.errors import FlashbenchError
from flashbench.models.memory import FAMILIES
from flashbench.spec.cases import DTYPES, KV_DTYPES, KV_LAYOUTS, Case
from flashbench.spec.window import effective

# What a provider takes unless it declares otherwise: FP8 only by declaration, since its call then gets the
# e4m3 inputs and q_descale=, k_descale=, v_descale= (module docstring).
DEFAULT_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32")
# Whether a provider takes MLA cases (module docstring): not at all, besides the ordinary ones, or only them.
LATENT: tuple[str, ...] = ("no", "also", "only")

# The model families (flashbench.models.memory and io_model: how a provider's peak memory and DRAM bytes grow).
MEMORY_FAMILIES = FAMILIES
# What a provider is modelled as unless it declares otherwise: a fused kernel (FlashAttention's O(N) memory).
DEFAULT_FAMILY = "flash"
# The query dtypes an FP8 KV cache is read under (flash_decode's, kernels/decode.py).
KV_FP8_Q_DTYPES: tuple[str, ...] = ("fp16", "bf16")


class Unsupported(Exception):
    """Raised by a provider (at build or first call) that refuses a case; becomes an `unsupported` row."""


@dataclass(frozen=True)
class ProviderInfo:
    """What a provider declares, plus whether it is usable here. Plain data: travels as JSON."""

    name: str
    description: str = ""
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    head_dims: tuple[int, ...] | None = None  # None: any head dim
    causal: bool = True
    backward: bool = True
    gqa: bool = False
    devices: tuple[str, ...] = ("cuda",)
    memory_family: str | None = DEFAULT_FAMILY  # one of MEMORY_FAMILIES; None: not modelled
    # Extra q-sized buffers (input dtype) the backward allocates beyond O, dQ, dK, dV and the row statistics,
    # e.g. an fp32 dQ accumulator counts 2 in bf16: models.memory's bwd_workspace_q.
    bwd_workspace_q: float = 0.0
    layout: str = "bhnd"  # "bhnd" or "bnhd": the memory layout the inputs are allocated in
    # --- the serving shape (module docstring): KV-cache layouts, per-sequence lengths, query tokens ---
    kv_layouts: tuple[str, ...] = ("contiguous",)
    ragged: bool = False  # takes cache_seqlens (a batch of sequences of different lengths)
    max_seq_q: int | None = None  # a decode kernel's limit on query tokens per sequence (None: any)
    window: bool = False  # takes a sliding window: called with window=(left, right) (module docstring)
    packed: bool = False  # takes packed documents: called with cu_seqlens=, max_seqlen= (module docstring)
    kv_dtypes: tuple[str, ...] = ()  # KV caches stored in another dtype than q: "fp8" (module docstring)
    latent: str = "no"  # MLA cases (Case.head_dim_v): "no", "also" or "only" (module docstring)
    # --- what the analysis, the report and the gate read (module docstring) ---
    baseline: int | None = None  # rank among the default speedup references (lowest first); None: never one
    ratio_vs: str | None = (
        None  # the gate holds this provider / ratio_vs, per shape, against the baseline run
    )
    colour: str | None = None  # "#rrggbb" in every figure; None: a stable hash of the name picks one
    package: str | None = None  # the distribution whose version the environment record lists
    source: str = "builtin"  # "builtin", "bundled" or the user kernel file's path
    available: bool = True
    reason: str = ""  # why it is unavailable

    def supports(self, case: Case, device: str) -> str | None:
        """None when the provider declares support for `case` on `device`, else the reason it does not."""
        if device not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)} only"
        if case.dtype == "fp8" and case.mode != "fwd":
            return (
                "fp8 is timed forward only: its inputs are quantized constants and no FP8 backward is defined"
            )
        if case.window:
            try:
                effective(case.causal, case.window_size)
            except ValueError as exc:
                return str(exc)
            if not self.window:
                return f"{self.name} takes no sliding window (window {case.window})"
        if case.latent:
            if case.kv_heads != 1 or not 0 < case.head_dim_v <= case.head_dim or case.mode != "fwd":
                return (
                    "an MLA case is a forward over one latent KV head (kv_heads 1) with head_dim_v <= head_dim, "
                    f"not kv_heads {case.kv_heads}, head_dim_v {case.head_dim_v}, {case.mode}"
                )
            if self.latent == "no":
                return f"{self.name} takes no MLA latent cache (V as the first {case.head_dim_v} dims of K)"
        elif self.latent == "only":
            return f"{self.name} is an MLA kernel: it takes MLA cases only (--head-dim-v)"
        if case.dtype not in self.dtypes:
            if case.dtype == "fp8":
                return f"{self.name} has no FP8 (e4m3 with descales) path; it is not run on upcast inputs"
            return f"{self.name} does not support {case.dtype} (supports {', '.join(self.dtypes)})"
        if self.head_dims is not None and case.head_dim not in self.head_dims:
            dims = ", ".join(str(d) for d in self.head_dims)
            return f"{self.name} does not support head_dim {case.head_dim} (supports {dims})"
        if case.causal and not self.causal:
            return f"{self.name} has no causal mask"
        if case.mode != "fwd" and not self.backward:
            return f"{self.name} has no backward pass"
        if case.kv_heads != case.heads and not self.gqa:
            return f"{self.name} does not support GQA (kv_heads != heads)"
        if case.packed and not self.packed:
            return f"{self.name} takes no packed documents (--seqlens {case.seqlens} on the training shape)"
        if case.packed and case.dtype == "fp8":
            return "packed documents have no fp8 path"
        if case.packed and case.latent:
            return "packed documents have no MLA path (an MLA case is a decode over a latent KV cache)"
        if case.serving and case.mode != "fwd":
            return "a paged, ragged or FP8 KV cache is read by the forward only (decode has no backward)"
        if case.kv_layout not in self.kv_layouts:
            return f"{self.name} takes no {case.kv_layout} KV cache (takes {', '.join(self.kv_layouts)})"
        if case.ragged and not self.ragged:
            return f"{self.name} takes no per-sequence KV lengths (--seqlens {case.seqlens}): uniform only"
        if case.kv_dtype and case.dtype not in KV_FP8_Q_DTYPES:
            return f"an {case.kv_dtype} KV cache is read under fp16 or bf16 queries, not {case.dtype}"
        if case.kv_dtype and case.kv_dtype not in self.kv_dtypes:
            return (
                f"{self.name} takes no {case.kv_dtype} (e4m3 with scales) KV cache; it is not run on a "
                "dequantized copy"
            )
        if self.max_seq_q is not None and case.seq_q > self.max_seq_q:
            return (
                f"{self.name} is a decode kernel: at most {self.max_seq_q} query tokens per sequence, "
                f"not {case.seq_q}"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProviderInfo:
        kw = dict(data)
        for key in ("dtypes", "devices", "head_dims", "kv_layouts", "kv_dtypes"):
            if kw.get(key) is not None:
                kw[key] = tuple(kw[key])
        return cls(**kw)


Builder = Callable[[Case, str, Any], Callable[..., Any]]


@dataclass
class Provider:
    """A registered provider: its declaration plus the code that builds the timed call."""

    info: ProviderInfo
    build: Builder  # build(case, device, stack: contextlib.ExitStack) -> call(q, k, v) -> out
    requires: Callable[[], str | None] | None = None  # None when usable, else why not (may import)
    kernel_config: Callable[[], dict[str, Any] | None] | None = None  # config used by the last call
    head_dims_from: Callable[[], Iterable[int]] | None = None  # resolved in the worker (may import)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.info.name

    def resolved_info(self) -> ProviderInfo:
        """The declaration with availability and lazily-declared head dims resolved (may import torch)."""
        info = self.info
        reason = None
        try:
            reason = self.requires() if self.requires else None
        except Exception as exc:  # a broken install is "unavailable", not a crash of the whole sweep
            reason = f"{type(exc).__name__}: {exc}"
        if reason:
            return _replace(info, available=False, reason=str(reason).strip().splitlines()[0][:300])
        if self.head_dims_from is not None:
            try:
                dims = tuple(sorted(int(d) for d in self.head_dims_from()))
                info = _replace(info, head_dims=dims)
            except Exception as exc:
                return _replace(info, available=False, reason=f"{type(exc).__name__}: {exc}"[:300])
        return info


def _replace(info: ProviderInfo, **kw: Any) -> ProviderInfo:
    data = info.to_dict()
    data.update(kw)
    return ProviderInfo.from_dict(data)


_REGISTRY: dict[str, Provider] = {}
_CURRENT_SOURCE = ["builtin"]


def register(
    name: str,
    *,
    dtypes: Iterable[str] = DEFAULT_DTYPES,
    head_dims: Iterable[int] | None = None,
    causal: bool = True,
    backward: bool = True,
    gqa: bool = False,
    devices: Iterable[str] = ("cuda", "cpu"),
    memory_family: str | None = DEFAULT_FAMILY,
    bwd_workspace_q: float = 0.0,
    layout: str = "bhnd",
    kv_layouts: Iterable[str] = ("contiguous",),
    ragged: bool = False,
    max_seq_q: int | None = None,
    window: bool = False,
    packed: bool = False,
    kv_dtypes: Iterable[str] = (),
    latent: str = "no",
    baseline: int | None = None,
    ratio_vs: str | None = None,
    colour: str | None = None,
    package: str | None = None,
    description: str = "",
    builder: bool = False,
    requires: Callable[[], str | None] | None = None,
    kernel_config: Callable[[], dict[str, Any] | None] | None = None,
    head_dims_from: Callable[[], Iterable[int]] | None = None,
    source: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an attention provider (see the module docstring). Returns the function unchanged."""
    dtypes = tuple(dtypes)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise FlashbenchError(f"provider {name!r}: unknown dtype(s) {bad} (known: {', '.join(DTYPES)})")
    if memory_family is not None and memory_family not in MEMORY_FAMILIES:
        raise FlashbenchError(f"provider {name!r}: memory_family must be one of {MEMORY_FAMILIES}")
    if colour is not None and not re.fullmatch(r"#[0-9a-fA-F]{6}", colour):
        raise FlashbenchError(f"provider {name!r}: colour must be '#rrggbb', got {colour!r}")
    if layout not in ("bhnd", "bnhd"):
        raise FlashbenchError(f"provider {name!r}: layout must be 'bhnd' or 'bnhd'")
    kv_layouts = tuple(kv_layouts)
    if any(k not in KV_DTYPES[1:] for k in kv_dtypes):
        raise FlashbenchError(f"provider {name!r}: kv_dtypes must be among {KV_DTYPES[1:]}")
    if not kv_layouts or any(k not in KV_LAYOUTS for k in kv_layouts):
        raise FlashbenchError(f"provider {name!r}: kv_layouts must be among {KV_LAYOUTS}")
    if latent not in LATENT:
        raise FlashbenchError(f"provider {name!r}: latent must be one of {LATENT}")
    if not name or "|" in name or "," in name or name.strip() != name:
        raise FlashbenchError(f"provider name {name!r} must be non-empty, without '|', ',' or spaces")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        origin = source or _CURRENT_SOURCE[0]
        if name in _REGISTRY and _REGISTRY[name].info.source != origin:
            raise FlashbenchError(
                f"provider {name!r} from {origin} clashes with one from {_REGISTRY[name].info.source}"
            )
        info = ProviderInfo(
            name=name,
            description=description or (fn.__doc__ or "").strip().split("\n")[0],
            dtypes=dtypes,
            head_dims=None if head_dims is None else tuple(sorted(head_dims)),
            causal=causal,
            backward=backward,
            gqa=gqa,
            devices=tuple(devices),
            memory_family=memory_family,
            bwd_workspace_q=float(bwd_workspace_q),
            layout=layout,
            kv_layouts=kv_layouts,
            ragged=ragged,
            max_seq_q=max_seq_q,
            window=window,
            packed=packed,
            kv_dtypes=tuple(kv_dtypes),
            latent=latent,
            baseline=baseline,
            ratio_vs=ratio_vs,
            colour=colour,
            package=package,
            source=origin,
        )
        build = fn if builder else _function_builder(fn)
        _REGISTRY[name] = Provider(info, build, requires, kernel_config, head_dims_from)
        return fn

    return decorate


def _function_builder(fn: Callable[..., Any]) -> Builder:
    """Adapt a plain fn(q, k, v, causal=..., sm_scale=...[, cache_seqlens=..., block_table=...]) to the builder
    form (the cache keywords reach it on the serving cases it declares it takes)."""

    def build(case: Case, device: str, stack: Any) -> Callable[..., Any]:
        causal = case.causal
        scale = case.head_dim**-0.5
        masks = {"window": case.window_size} if case.window else {}
        return lambda q, k, v, **cache: fn(q, k, v, causal=causal, sm_scale=scale, **masks, **cache)

    return build


def load_kernel_file(path: str | Path) -> list[str]:
    """Execute a user kernel file; return the names of the providers it registered."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FlashbenchError(f"kernel file not found: {path}")
    before = set(_REGISTRY)
    module_name = f"flashbench_user_kernel_{abs(hash(str(path))):x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise FlashbenchError(f"kernel file {path} cannot be imported (not a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    _CURRENT_SOURCE[0] = str(path)
    try:
        spec.loader.exec_module(module)
    except FlashbenchError:
        raise
    except Exception as exc:
        raise FlashbenchError(f"kernel file {path}: {type(exc).__name__}: {exc}") from None
    finally:
        _CURRENT_SOURCE[0] = "builtin"
    added = [n for n in _REGISTRY if n not in before]
    if not added:
        raise FlashbenchError(
            f"kernel file {path} registered no provider (decorate a function with flashbench.providers.register)"
        )
    return added


def get(name: str) -> Provider:
    try:
        return _REGISTRY[name]
    except KeyError:
        from flashbench.spec.parse import suggest

        raise FlashbenchError(f"unknown provider {name!r}{suggest(name, _REGISTRY)}") from None


def names() -> list[str]:
    return list(_REGISTRY)


def providers() -> list[Provider]:
    return list(_REGISTRY.values())


def family_of(name: str) -> str | None:
    """The model family a registered provider declares; DEFAULT_FAMILY for a name not registered here (a user
    kernel's row read in a process that never ran its file)."""
    provider = _REGISTRY.get(name)
    return provider.info.memory_family if provider is not None else DEFAULT_FAMILY

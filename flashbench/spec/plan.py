"""Spec -> Cases. Cases a provider declares it cannot run are marked `unsupported` (or `unavailable`), and
cases the memory model says cannot fit in the device's memory (the GPU's; with --device cpu, the host's) are
marked `predicted-oom`, before any worker runs them.

Order: provider, dtype, head_dim, heads, kv_heads, head_dim_v, causal, mode, KV layout / page size / lengths,
window, query tokens, then sequence length ascending, so that an OOM at one N lets the runner skip the larger N of the same provider
and shape.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flashbench.errors import FlashbenchError, plural
from flashbench.models.memory import FAMILIES, predicted_peak_bytes
from flashbench.providers.registry import ProviderInfo
from flashbench.results.rows import PREDICTED_OOM, UNAVAILABLE, UNSUPPORTED
from flashbench.spec.cases import Case
from flashbench.spec.config import SweepSpec, heads_for
from flashbench.spec.parse import suggest
from flashbench.spec.window import bounds, effective, keyless_queries, parse_window, window_text

GIB = 2**30


@dataclass(frozen=True)
class PlannedCase:
    case: Case
    status: str | None = None  # None: to be run; else the final status decided up front
    reason: str = ""
    predicted_mem_bytes: int | None = None
    family: str | None = ""  # the provider's declared model family (Row.family; "": not given)


def batch_for(spec: SweepSpec, seq: int) -> list[int]:
    """The batch sizes at one sequence length: --batch as given, or max(1, tokens // seq)."""
    if spec.batch is not None:
        return list(spec.batch)
    assert spec.tokens is not None
    return [max(1, spec.tokens // seq)]


def resolve_providers(requested: tuple[str, ...] | list[str], known: list[str]) -> list[str]:
    """Expand "all" and check every name; an unknown name is a one-line error with a close match."""
    out: list[str] = []
    for name in requested:
        if name == "all":
            out.extend(n for n in known if n not in out)
            continue
        if name not in known:
            raise FlashbenchError(f"unknown provider {name!r}{suggest(name, known)}")
        if name not in out:
            out.append(name)
    return out


def serving_variants(spec: SweepSpec) -> list[dict[str, Any]]:
    """The KV-cache fields (kv_layout, page_size, seqlens, seed, kv_dtype) of the spec's cases: page size and seed
    only where they apply (0 elsewhere), each combination once."""
    layouts = [(lay, p if lay == "paged" else 0) for lay in spec.kv_layout for p in spec.page_size]
    lens = [(s, spec.seed if s != "uniform" else 0) for s in spec.seqlens]
    stores = ["" if kv == "same" else kv for kv in spec.kv_dtype]
    combos = dict.fromkeys((lay, p, s, seed, kv) for lay, p in layouts for s, seed in lens for kv in stores)
    return [
        dict(kv_layout=lay, page_size=p, seqlens=s, seed=seed, kv_dtype=kv) for lay, p, s, seed, kv in combos
    ]


def min_seq_for(spec: SweepSpec, cache: dict[str, Any], seq: int) -> int:
    """A case's min_seq (spec/cases.py): on the training shape (no --seq-q, a contiguous cache) a non-uniform
    --seqlens packs documents, the shortest drawn at --min-seq (default N // 16, at least 1); 0 elsewhere, where
    --seqlens draws KV lengths."""
    if cache["seqlens"] == "uniform" or spec.seq_q is not None or cache["kv_layout"] != "contiguous":
        return 0
    return spec.min_seq if spec.min_seq is not None else max(1, seq // 16)


def case_window(causal: bool, text: str) -> str:
    """A case's window in canonical form: causal folded in as right = 0, "" when it masks nothing beyond causal;
    a window that contradicts causal (right > 0) stays as given and the plan marks it unsupported."""
    try:
        return window_text(effective(causal, parse_window(text)))
    except ValueError:
        return text


def expand(spec: SweepSpec, providers: list[str]) -> list[Case]:
    """Every case of the spec (order: the module docstring; sequence length innermost, ascending)."""
    head_shapes = [  # heads follow the head dim (--hidden), kv heads the heads (none given: no GQA)
        dict(head_dim=d, heads=h, kv_heads=kv, head_dim_v=dv)
        for d in spec.head_dim
        for h in heads_for(spec, d)
        for kv in spec.kv_heads or (h,)
        for dv in spec.head_dim_v or (0,)
    ]
    lengths = [dict(seq_k=n, batch=b) for n in spec.seq for b in batch_for(spec, n)]  # batch follows N
    axes = (
        providers,
        spec.dtype,
        head_shapes,
        spec.causal,
        spec.mode,
        serving_variants(spec),
        spec.window,
        spec.seq_q or (None,),
        lengths,
    )
    cases = [
        Case(
            provider=provider,
            dtype=dtype,
            causal=causal,
            mode=mode,
            seq_q=seq_q or length["seq_k"],
            window=case_window(causal, window),
            min_seq=min_seq_for(spec, cache, length["seq_k"]),
            **head,
            **cache,
            **length,
        )
        for provider, dtype, head, causal, mode, cache, window, seq_q, length in itertools.product(*axes)
    ]
    return interleave(cases) if spec.order == "case" else cases


def interleave(cases: list[Case]) -> list[Case]:
    """Provider-major cases regrouped shape by shape (shapes in the first provider's order), each shape's
    providers in the given order on even shapes and reversed on odd ones: no provider always runs first after
    another's heavy case, and every provider's lengths still ascend (the OOM / timeout skips rely on that)."""
    shapes: dict[str, list[Case]] = {}
    for case in cases:
        shapes.setdefault(case.shape_key, []).append(case)
    return [
        case for j, group in enumerate(shapes.values()) for case in (group if j % 2 == 0 else group[::-1])
    ]


def check_defined(spec: SweepSpec) -> None:
    """Refuse (exit 2) a spec with a case where some query sees no key: more query tokens than the keys its mask
    lets the first of them see (seq_q > seq_k with a causal mask or a window's right bound; with ragged lengths,
    the shortest sequence's). Such a row has no attention to average; spec/window.py says why it is refused."""
    for case in expand(spec, ["-"]):
        if case.packed:  # every document's queries are its keys: each query sees at least itself
            continue
        shortest = _shortest(case)
        keyless = keyless_queries(case.seq_q, shortest, case.causal, case.window_size)
        if not keyless:
            continue
        right = bounds(case.causal, case.window_size)[1]
        mask = f"window {case.window}" if case.window else "causal"
        keys = f"seq {case.seq_k}" + (
            f" (its shortest sequence: {plural(shortest, 'key')})" if case.ragged else ""
        )
        fix = "a window whose right side reaches them (-1: no bound)" if case.window else "use --causal false"
        raise FlashbenchError(
            f"seq-q {case.seq_q} over {keys}, {mask}: {keyless} of the {case.seq_q} queries would see no key "
            f"(masks align bottom-right: query i sits at key i + seq - seq-q); with this mask seq-q may be at "
            f"most {shortest + right}, or {fix}"
        )


def _shortest(case: Case) -> int:
    """The fewest keys any sequence of the case holds. Past a million ragged sequences, the bound of their draw
    (ceil(N / 2), cases.kv_lengths) stands in for drawing them all: a million draws reach it anyway."""
    if not case.ragged:
        return case.seq_k
    if case.batch > 1_000_000:
        return max(1, -(-case.seq_k // 2))
    return min(case.kv_lengths())


def input_bytes(case: Case) -> int:
    """Bytes of the inputs the worker allocates: q, k, v (and dO in the backward modes); for a paged case also
    the page pool beside the contiguous cache it is copied from (engine/measure.py), and the page table."""
    q = case.batch * case.heads * case.seq_q * case.head_dim
    caches = 1 if case.latent else 2  # MLA: V is a view of the one latent cache
    kv = caches * case.batch * case.kv_heads * case.seq_k * case.head_dim
    do = q if case.mode != "fwd" else 0
    pool = 0
    if case.paged and case.page_size > 0:
        per_sequence = -(-case.seq_k // case.page_size)
        if case.ragged and case.batch <= 1_000_000:
            pages = sum(-(-n // case.page_size) for n in case.kv_lengths())
        else:  # every sequence at N, or (past a million ragged ones) at most N: no tuple of a billion lengths
            pages = case.batch * per_sequence
        pool = caches * pages * case.page_size * case.kv_heads * case.head_dim
    return (q + kv + do + pool) * case.elem_bytes


def predicted_mem_bytes(
    case: Case, family: str | None, bwd_workspace_q: float = 0.0, device: str = "cuda"
) -> int | None:
    """The memory model's bytes above the inputs, or None (no family, or no model installed)."""
    if family is None:
        return None
    if family not in FAMILIES:
        return None
    try:
        return int(
            predicted_peak_bytes(
                family,
                case.batch,
                case.heads,
                case.kv_heads,
                case.seq_q,
                case.seq_k,
                case.head_dim,
                case.elem_bytes,
                case.causal,
                case.mode,
                bwd_workspace_q=bwd_workspace_q,
                device=device,
                documents=case.documents(),
                head_dim_v=case.head_dim_v,
            )
        )
    except Exception:
        return None


def plan(
    spec: SweepSpec,
    infos: Mapping[str, ProviderInfo],
    memory_bytes: int | None = None,
) -> list[PlannedCase]:
    """Cases for `spec`, each either to run or already decided (unavailable / unsupported / predicted-oom).

    `infos` are the providers as the worker described them (availability resolved on that machine).
    `memory_bytes` is the device's total memory: the GPU's, or the host's for a CPU sweep (None: no predicted-oom
    marking). A case whose inputs alone exceed it is predicted-oom even where no memory model covers its provider.
    """
    names = resolve_providers(spec.providers, list(infos))
    if len(names) == 1 and spec.providers != ("all",):
        _check_forced(spec, infos[names[0]])
    planned: list[PlannedCase] = []
    for case in expand(spec, names):
        info = infos[case.provider]
        predicted = predicted_mem_bytes(case, info.memory_family, info.bwd_workspace_q, spec.device)
        if not info.available:
            planned.append(PlannedCase(case, UNAVAILABLE, info.reason, predicted, info.memory_family))
            continue
        why = info.supports(case, spec.device)
        if why:
            planned.append(PlannedCase(case, UNSUPPORTED, why, predicted, info.memory_family))
            continue
        need = input_bytes(case) + (predicted or 0)
        if memory_bytes and need > memory_bytes:
            where = "on the GPU" if spec.device == "cuda" else "of host memory"
            above = f"predicted {predicted / GIB:.3g} GiB above " if predicted is not None else ""
            reason = (
                f"{above}{input_bytes(case) / GIB:.3g} GiB of inputs ({need} bytes) > "
                f"{memory_bytes / GIB:.1f} GiB {where}"
            )
            planned.append(PlannedCase(case, PREDICTED_OOM, reason, predicted, info.memory_family))
            continue
        planned.append(PlannedCase(case, None, "", predicted, info.memory_family))
    return planned


def _check_forced(spec: SweepSpec, info: ProviderInfo) -> None:
    """A single provider the user named must support what the user asked for: else a one-line error."""
    if not info.available:
        return  # rows say "unavailable" with the reason
    for d, dtype, causal, mode, cache, nq, window, dv in itertools.product(
        spec.head_dim,
        spec.dtype,
        spec.causal,
        spec.mode,
        serving_variants(spec),
        spec.seq_q or (128,),
        spec.window,
        spec.head_dim_v or (0,),
    ):
        heads = heads_for(spec, d)[0]
        case = Case(
            provider=info.name,
            batch=1,
            heads=heads,
            kv_heads=1 if dv else heads,
            head_dim_v=dv,
            seq_q=nq,
            seq_k=128,
            head_dim=d,
            dtype=dtype,
            causal=causal,
            mode=mode,
            window=case_window(causal, window),
            min_seq=min_seq_for(spec, cache, 128),
            **cache,
        )
        why = info.supports(case, spec.device)
        if why:
            raise FlashbenchError(why)
    all_heads = {h for d in spec.head_dim for h in heads_for(spec, d)}
    if spec.kv_heads and any(k != h for k in spec.kv_heads for h in all_heads) and not info.gqa:
        raise FlashbenchError(f"{info.name} does not support GQA (kv_heads != heads)")

"""The torch baselines on packed training cases (documents one after another: spec/cases.py, engine/packed.py;
the call protocol in providers/registry.py): q [T, H, D], k and v [T, Hkv, D], cu_seqlens int32 [docs + 1].

    flex        FlexAttention with a document block mask (spec/window.document_visible): blocks that hold no pair
                of one document are skipped. The mask is built once per case, untimed, from Case.documents().
    sdpa-*      scaled_dot_product_attention over nested jagged tensors ([docs, H, j, D] views of the packed
                tensors: torch.nested.nested_tensor_from_jagged), the case's backend forced; the int64 offsets are
                made once, untimed. Where torch refuses (a backend, GQA, a mask it does not take) the case is an
                `unsupported` row with torch's first line.
    naive,      one dense [T, T] score matrix over the packed tokens with an explicit bool document mask (built
    sdpa-math   once, untimed): every pair is computed, the useful ones are a fraction. Past DENSE_MAX_TOKENS the
                case is unsupported (the matrix alone is H T^2 fp32 values: 4 GiB at T = 8192, H = 16).
    flash-attn  flash_attn_varlen_func, flash-attn's own packed layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flashbench.providers.registry import Unsupported
from flashbench.spec.cases import Case
from flashbench.spec.window import document_visible

DENSE_MAX_TOKENS = 8192  # naive and sdpa-math on packed documents (module docstring)


def as_batch(t: Any) -> Any:
    """[T, H, D] as a [1, H, T, D] view."""
    return t.transpose(0, 1).unsqueeze(0)


def as_packed(t: Any) -> Any:
    """[1, H, T, D] as a [T, H, D] view."""
    return t.squeeze(0).transpose(0, 1)


def _document_ids(case: Case, device: Any) -> Any:
    import torch

    lengths = case.documents() or ()
    return torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    )


def document_mask(case: Case, device: Any) -> Any:
    """The case's document mask as a bool [T, T] tensor, True = attend."""
    import torch

    tokens = torch.arange(case.batch * case.seq_k, device=device)
    return document_visible(
        _document_ids(case, device), tokens[:, None], tokens[None, :], case.causal, case.window_size
    )


def dense(case: Case, name: str, attend: Callable[[Any, Any, Any], Any]) -> Callable[..., Any]:
    """`attend(q, k, v)` on [1, H, T, D] views of the packed tensors (its mask made by the caller), for the
    references that materialize the whole matrix; unsupported past DENSE_MAX_TOKENS."""
    tokens = case.batch * case.seq_k
    if tokens > DENSE_MAX_TOKENS:
        raise Unsupported(
            f"{name} on packed documents computes the whole [T, T] matrix under a mask: at most "
            f"{DENSE_MAX_TOKENS} tokens, not {tokens}"
        )

    def call(q: Any, k: Any, v: Any, **_packing: Any) -> Any:
        return as_packed(attend(as_batch(q), as_batch(k), as_batch(v)))

    return call


def flex_documents(case: Case, device: str, compiled: Any, gqa: bool, scale: float) -> Callable[..., Any]:
    """The `flex` provider's call on a packed case: one [1, H, T, D] batch under a document block mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc, causal, window = _document_ids(case, device), case.causal, case.window_size
    tokens = case.batch * case.seq_k

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return document_visible(doc, q_idx, kv_idx, causal, window)

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=tokens, KV_LEN=tokens, device=device)

    def flex(q: Any, k: Any, v: Any, **_packing: Any) -> Any:
        out = compiled(
            as_batch(q), as_batch(k), as_batch(v), block_mask=block_mask, scale=scale, enable_gqa=gqa
        )
        return as_packed(out)

    return flex


def nested_sdpa(case: Case, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """An SDPA provider's call on a packed case: nested jagged tensors over the documents (module docstring);
    `kwargs` are the provider's (scale, enable_gqa), the backend already forced by the caller."""
    import torch
    import torch.nn.functional as F

    if case.window:
        raise Unsupported("SDPA over nested jagged tensors takes no sliding window")
    lengths = case.documents() or ()
    shortest, longest = min(lengths), max(lengths)  # given: no device sync per call
    causal = case.causal

    def jagged(t: Any, offsets: Any) -> Any:  # [T, H, D] -> [docs, H, j, D]
        nested = torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=shortest, max_seqlen=longest)
        return nested.transpose(1, 2)

    def call(q: Any, k: Any, v: Any, offsets: Any) -> Any:
        try:
            out = F.scaled_dot_product_attention(
                jagged(q, offsets), jagged(k, offsets), jagged(v, offsets), is_causal=causal, **kwargs
            )
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise Unsupported(f"torch's SDPA over nested jagged tensors refuses this case: {why}") from None
        return out.transpose(1, 2).values()

    def prepare(q: Any, k: Any, v: Any, cu_seqlens: Any, max_seqlen: int) -> Any:
        return q, k, v, {"offsets": cu_seqlens.long()}

    call.prepare = prepare  # type: ignore[attr-defined]
    return call


def flash_attn_varlen(case: Case) -> Callable[..., Any]:
    """flash-attn's flash_attn_varlen_func on a packed case (the same layout and window convention)."""
    from flash_attn import flash_attn_varlen_func

    causal, scale = case.causal, case.head_dim**-0.5
    masks = {"window_size": case.window_size} if case.window else {}

    def call(q: Any, k: Any, v: Any, cu_seqlens: Any, max_seqlen: int) -> Any:
        return flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            softmax_scale=scale,
            causal=causal,
            **masks,
        )

    return call

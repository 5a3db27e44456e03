"""The torch baselines on serving cases (a ragged or paged KV cache; spec/cases.py, engine/kv_cache.py).

FlexAttention: per-sequence lengths are a block mask built from the lengths (key j of sequence b is kept iff
j < L_b and, causal, j <= L_b - Nq + i), whose block sparsity skips the blocks past each length. A paged cache is
torch's own paged attention (torch.nn.attention.experimental._paged_attention.PagedAttention): the pool as one
[1, Hkv, pages * page_size, D] cache, the page table and its inverse set from the case's block table, and the
logical block mask converted to physical pages (its key blocks are one page: PagedAttention requires it). Both
are made once per case, untimed (the call's `prepare`, providers/registry.py).

flash-attn's flash_attn_with_kvcache takes cache_seqlens and a block table itself; its pages are
[pages, page_size, Hkv, D] (flash-attn 2 requires page_size % 256 == 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flashbench.providers.registry import Unsupported
from flashbench.spec.cases import Case
from flashbench.spec.window import visible

FLASH_ATTN_PAGE_MULTIPLE = 256  # flash-attn 2's paged KV cache: "block size must be divisible by 256"


def _length_mask(case: Case, lengths: Any) -> Callable[..., Any]:
    """mask_mod keeping key j of sequence b iff j < L_b and the case's mask lets query i see it over L_b keys
    (spec/window.py; causal: j <= L_b - Nq + i)."""
    nq, causal, window = case.seq_q, case.causal, case.window_size

    def mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (kv_idx < lengths[b]) & visible(q_idx, kv_idx, nq, lengths[b], causal, window)

    return mask


def flex_kv_cache(
    case: Case, device: str, compiled: Any, gqa: bool, scale: float, check_compiled: Any
) -> Callable[..., Any]:
    """The `flex` provider's call for a serving case (module docstring)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    lengths = torch.tensor(case.kv_lengths(), dtype=torch.int32, device=device)
    mask_mod = _length_mask(case, lengths)
    state: dict[str, Any] = {}
    if not case.paged:
        state["mask"] = create_block_mask(
            mask_mod, B=case.batch, H=None, Q_LEN=case.seq_q, KV_LEN=case.seq_k, device=device
        )

    def flex(q: Any, k: Any, v: Any, **_cache: Any) -> Any:
        return compiled(q, k, v, block_mask=state["mask"], scale=scale, enable_gqa=gqa)

    def prepare(q: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any = None) -> Any:
        if block_table is None:
            return q, k, v, {}
        try:
            from torch.nn.attention.experimental._paged_attention import PagedAttention
        except ImportError as exc:
            raise Unsupported(f"this torch has no FlexAttention paged attention ({exc})") from None
        pages, kv_heads, page, _ = k.shape
        paged = PagedAttention(pages, page, case.batch, device=device)
        for b, n in enumerate(case.kv_lengths()):
            count = -(-n // page)
            slots = block_table[b, :count].long()
            paged.page_table[b, :count] = slots
            paged.physical_to_logical[b, slots] = torch.arange(count, device=k.device)
        keys = -(-max(case.kv_lengths()) // page) * page
        logical = create_block_mask(
            mask_mod,
            B=case.batch,
            H=None,
            Q_LEN=case.seq_q,
            KV_LEN=keys,
            device=device,
            BLOCK_SIZE=(128, page),
        )
        state["mask"] = paged.convert_logical_block_mask(logical)

        def flat(pool: Any) -> Any:  # [pages, Hkv, page, D] -> [1, Hkv, pages * page, D] (MLA: V's own D)
            return pool.permute(1, 0, 2, 3).reshape(1, kv_heads, pages * page, pool.shape[-1])

        return q, flat(k), flat(v), {}

    flex.prepare = prepare  # type: ignore[attr-defined]
    flex.check_compiled = check_compiled  # type: ignore[attr-defined]
    return flex


def flash_attn_kv_cache(case: Case, to_bnhd: Callable[[Any], Any]) -> Callable[..., Any]:
    """flash-attn's flash_attn_with_kvcache on any case it takes (q, k, v arrive [B, N, H, D]-contiguous)."""
    from flash_attn import flash_attn_with_kvcache

    if case.paged and case.page_size % FLASH_ATTN_PAGE_MULTIPLE:
        raise Unsupported(
            f"flash-attn's paged KV cache needs pages of a multiple of {FLASH_ATTN_PAGE_MULTIPLE} tokens, "
            f"not {case.page_size}"
        )
    causal, scale = case.causal, case.head_dim**-0.5

    def call(q: Any, k: Any, v: Any, cache_seqlens: Any = None, block_table: Any = None) -> Any:
        out = flash_attn_with_kvcache(
            to_bnhd(q),
            k,
            v,
            cache_seqlens=cache_seqlens,
            block_table=block_table,
            softmax_scale=scale,
            causal=causal,
        )
        return to_bnhd(out)

    def prepare(q: Any, k: Any, v: Any, cache_seqlens: Any = None, block_table: Any = None) -> Any:
        # contiguous: [B, Hkv, N, D] views of [B, N, Hkv, D] storage; pages: [pages, Hkv, page, D] -> [.., page, Hkv, D]
        k, v = (t.transpose(1, 2) if block_table is None else t.transpose(1, 2).contiguous() for t in (k, v))
        cache = {"cache_seqlens": cache_seqlens, "block_table": block_table}
        return q, k, v, {key: value for key, value in cache.items() if value is not None}

    call.prepare = prepare  # type: ignore[attr-defined]
    return call


# --- MLA (Case.latent): the latent cache as one KV head; v a view of its first head_dim_v dims -------------------


def sdpa_latent(case: Case, sdpa: Callable[..., Any], scale: float, device: str) -> Callable[..., Any]:
    """SDPA on an MLA case: MQA over the latent dims, the H query heads folded into H * Nq query rows of one head
    over k [B, 1, N, D] and v [B, 1, N, Dv] (a serving engine's form: nothing is expanded per head, where
    enable_gqa or an expand would make the math backend's fp32 copy of K 128 heads wide). Row r = h * Nq + i is
    query i; with Nq > 1 a causal mask is an explicit [H * Nq, N] bool mask (bottom-right per query), made once."""
    import torch

    if case.window:
        raise Unsupported("sdpa: a sliding window over an MLA case is not built here")
    heads, nq, nk = case.heads, case.seq_q, case.seq_k
    kw: dict[str, Any] = {"scale": scale}
    if case.causal and nq > 1:  # one query (the last token) sees every key: no mask
        rows = torch.arange(heads * nq, device=device)[:, None] % nq
        kw["attn_mask"] = visible(rows, torch.arange(nk, device=device)[None, :], nq, nk, True, None)

    def call(q: Any, k: Any, v: Any) -> Any:
        batch = q.shape[0]
        out = sdpa(q.reshape(batch, 1, heads * nq, q.shape[3]), k, v, **kw)  # [B, 1, H * Nq, Dv]
        return out.view(batch, heads, nq, v.shape[3])

    return call


FLASH_MLA_PAGE = 64  # FlashMLA's paged cache: blocks of 64 tokens only


def flash_mla_kv_cache(case: Case) -> Callable[..., Any]:
    """FlashMLA's flash_mla_with_kvcache (deepseek-ai/FlashMLA; import-guarded, untested here) on an MLA case.

    It takes q [B, Nq, H, D], a page pool [pages, 64, 1, D] (ours is [pages, 1, 64, D]: with one head the same
    memory), block_table, cache_seqlens and its tile-scheduler metadata (made once per case, untimed, as a serving
    engine makes it once per step for every layer). A contiguous cache is read as pages of 64 in order.
    """
    import torch
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata

    if case.paged and case.page_size != FLASH_MLA_PAGE:
        raise Unsupported(
            f"FlashMLA's paged cache has pages of {FLASH_MLA_PAGE} tokens, not {case.page_size}"
        )
    if not case.paged and case.seq_k % FLASH_MLA_PAGE:
        raise Unsupported(f"FlashMLA reads a contiguous cache as pages of {FLASH_MLA_PAGE}: N % 64 must be 0")
    rows, dv, causal, scale = case.heads * case.seq_q, case.head_dim_v, case.causal, case.head_dim**-0.5

    def call(q: Any, k: Any, v: Any, **cache: Any) -> Any:
        out, _ = flash_mla_with_kvcache(
            q.transpose(1, 2), k, cache["block_table"], cache["cache_seqlens"], dv, *cache["metadata"],
            softmax_scale=scale, causal=causal,
        )  # fmt: skip
        return out.transpose(1, 2)

    def prepare(q: Any, k: Any, v: Any, cache_seqlens: Any = None, block_table: Any = None) -> Any:
        batch, dim = q.shape[0], q.shape[3]
        if block_table is None:  # [B, 1, N, D] -> pages of 64 in order
            per = case.seq_k // FLASH_MLA_PAGE
            block_table = torch.arange(batch * per, dtype=torch.int32, device=q.device).view(batch, per)
            k = k.reshape(batch * per, 1, FLASH_MLA_PAGE, dim)
        if cache_seqlens is None:
            cache_seqlens = torch.full((batch,), case.seq_k, dtype=torch.int32, device=q.device)
        metadata = get_mla_metadata(cache_seqlens, rows, 1)
        pool = k.transpose(1, 2)  # [pages, 64, 1, D]
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, Nq, H, D] storage
        return (
            q,
            pool,
            None,
            {"cache_seqlens": cache_seqlens, "block_table": block_table, "metadata": metadata},
        )

    call.prepare = prepare  # type: ignore[attr-defined]
    return call

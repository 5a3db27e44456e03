"""The KV-cache inputs of a serving case (spec/cases.py): per-sequence lengths and a paged pool.

Layout (flash_decode's, kernels/decode.py, and the provider protocol's, providers/registry.py):
    cache_seqlens  int32 [B]: sequence b's valid keys, Case.kv_lengths()
    page pool      k, v [pages, Hkv, page_size, D]: sequence b's tokens [p * page_size, (p + 1) * page_size) are in
                   page block_table[b, p]; the pages of all sequences are shuffled over the pool (a serving
                   engine's pool after some traffic), and the last page of a sequence is filled up to its length
                   (the rest zero)
    block_table    int32 [B, ceil(N / page_size)]: entries past a sequence's pages are 0 (a valid page, never read)
    FP8 cache      (--kv-dtype fp8) k, v in float8_e4m3fn, contiguous or paged as above, with k_scale, v_scale
                   float32 [B, Hkv] (quantize(): per-(sequence, KV head) amax scaling)
An MLA case (Case.latent) has one latent cache: K is paged, and V is a view of the pool's first head_dim_v dims.
The pool is built by copying from the contiguous cache [B, Hkv, N, D] the worker draws (the same numbers, so the
float64 reference reads that cache). Everything is made once per case, untimed.
"""

from __future__ import annotations

import zlib
from typing import Any

from flashbench.spec.cases import Case


def build(case: Case, k: Any, v: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(k, v, cache keywords) of the call for `case`: the contiguous k, v [B, Hkv, N, D] with cache_seqlens, or
    the page pool with cache_seqlens and block_table. A training-shaped case gets k, v and no keywords."""
    import torch

    if not case.serving:
        return k, v, {}
    lengths = case.kv_lengths()
    cache = {"cache_seqlens": torch.tensor(lengths, dtype=torch.int32, device=k.device)}
    if not case.paged:
        return k, v, cache
    seed = zlib.crc32(case.shape_key.encode())
    if case.latent:  # MLA: one pool of the latent cache; V stays a view of its first head_dim_v dims
        k_pool, _, table = page(k, None, lengths, case.page_size, seed=seed)
        return k_pool, k_pool[..., : case.head_dim_v], {**cache, "block_table": table}
    k_pool, v_pool, table = page(k, v, lengths, case.page_size, seed=seed)
    return k_pool, v_pool, {**cache, "block_table": table}


def probe_inputs(
    batch: int,
    heads: int,
    kv_heads: int,
    keys: int,
    page_size: int | None,
    kv_dtype: str,
    device: Any = "cuda",
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(q, k, v, flash_decode's cache keywords) of a decode probe's shape (spec.parse.parse_decode_shape: the tools
    that look inside one flash_decode call): bf16 q [B, H, 1, 128] and a full-length bf16 cache of `keys` keys drawn
    from a seeded generator, in e4m3 with its scales as the sweep draws it (quantize) where kv_dtype is "fp8",
    paged in pages of `page_size` tokens (page) where one is given."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, heads, 1, 128, device=device, dtype=torch.bfloat16, generator=gen)
    k, v = (
        torch.randn(batch, kv_heads, keys, 128, device=device, dtype=torch.bfloat16, generator=gen)
        for _ in range(2)
    )
    cache: dict[str, Any] = {"cache_seqlens": torch.full((batch,), keys, dtype=torch.int32, device=device)}
    if kv_dtype == "fp8":
        k, v, scales = quantize(k, v)
        cache |= scales
    if page_size:
        k, v, table = page(k, v, (keys,) * batch, page_size)
        cache["block_table"] = table.to(device)
    return q, k, v, cache


def quantize(k: Any, v: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(k8, v8, {"k_scale", "v_scale"}): an FP8 cache made from the contiguous k, v [B, Hkv, N, D] with one
    amax scale per (sequence, KV head) (engine/fp8.quantize: float32 [B, Hkv], stored value x scale = real value).
    The amax runs over the whole capacity; with ragged lengths the slots past a length are drawn like the rest."""
    from flashbench.engine import fp8

    (k8, k_scale), (v8, v_scale) = fp8.quantize(k, k.shape[1]), fp8.quantize(v, v.shape[1])
    return k8, v8, {"k_scale": k_scale, "v_scale": v_scale}


def page(k: Any, v: Any, lengths: tuple[int, ...], page_size: int, seed: int = 0) -> tuple[Any, Any, Any]:
    """(k_pool, v_pool, block_table) holding the first lengths[b] tokens of each sequence of the contiguous
    k, v [B, Hkv, N, D] (any strides) in pages of `page_size` tokens, in shuffled pool order (module docstring);
    v None: k's pool alone (v_pool None)."""
    import torch

    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page size {page_size} is not a power of two")
    if k.dtype == torch.float8_e4m3fn:  # an e4m3 cache is paged as its bytes (no fp8 indexing kernels needed)
        v_bytes = None if v is None else v.view(torch.uint8)
        k_pool, v_pool, table = page(k.view(torch.uint8), v_bytes, lengths, page_size, seed)
        return k_pool.view(k.dtype), None if v_pool is None else v_pool.view(v.dtype), table
    batch, kv_heads, capacity, dim = k.shape
    pages = [-(-n // page_size) for n in lengths]
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed)).tolist()
    k_pool = torch.zeros(sum(pages), kv_heads, page_size, dim, dtype=k.dtype, device=k.device)
    v_pool = None if v is None else torch.zeros_like(k_pool)
    table = torch.zeros(batch, -(-capacity // page_size), dtype=torch.int32)
    first = 0
    for b, (n, count) in enumerate(zip(lengths, pages, strict=True)):
        slots = order[first : first + count]
        first += count
        table[b, :count] = torch.tensor(slots, dtype=torch.int32)
        index = torch.tensor(slots, device=k.device)
        pairs = [(k, k_pool)] if v_pool is None else [(k, k_pool), (v, v_pool)]
        for src, pool in pairs:
            tokens = torch.zeros(kv_heads, count * page_size, dim, dtype=k.dtype, device=k.device)
            tokens[:, :n] = src[b, :, :n]
            pool[index] = tokens.view(kv_heads, count, page_size, dim).transpose(0, 1)
    return k_pool, v_pool, table.to(k.device)


def unpage(pool: Any, table: Any, lengths: tuple[int, ...], capacity: int) -> Any:
    """The contiguous [B, Hkv, capacity, D] cache a page pool holds (zeros past each length): page()'s inverse."""
    import torch

    page_size = pool.shape[2]
    out = torch.zeros(
        len(lengths), pool.shape[1], capacity, pool.shape[3], dtype=pool.dtype, device=pool.device
    )
    for b, n in enumerate(lengths):
        count = -(-n // page_size)
        pages = pool[table[b, :count].long()]  # [count, Hkv, page, D]
        out[b, :, :n] = pages.transpose(0, 1).reshape(pool.shape[1], count * page_size, -1)[:, :n]
    return out

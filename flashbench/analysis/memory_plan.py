"""The memory planner behind `flashbench memory`: attention's memory per head, layer and model for a model preset
(configs/models.toml), standard attention's N x N matrices against FlashAttention's statistics, and the KV cache a
serving engine holds for `batch` sequences at that context (contiguous, and paged with the last page of each
sequence half empty on average: models.memory.kv_cache_expected_bytes). No GPU needed."""

from __future__ import annotations

import difflib
from typing import Any

from flashbench.configfiles import config_path, read_toml
from flashbench.errors import FlashbenchError
from flashbench.models import memory
from flashbench.spec.cases import DTYPE_BYTES


def _model_presets() -> dict[str, Any]:
    return read_toml(config_path("models.toml"))


def build_memory(
    model: str,
    seqs: list[int],
    dtype: str = "fp16",
    batch: int = 1,
    checkpointing: bool = False,
    page_size: int = 16,
) -> dict[str, Any]:
    """The memory planner's figures per sequence length for a model preset of configs/models.toml."""
    presets = _model_presets()
    key = model.strip().lower()
    cfg = presets.get(key) or next((c for c in presets.values() if key in c.get("aliases", [])), None)
    if cfg is None:
        close = difflib.get_close_matches(key, list(presets), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise FlashbenchError(f"unknown model {model!r}{hint} (known: {', '.join(presets)})")
    shape = {k: cfg[k] for k in ("layers", "heads", "kv_heads", "head_dim", "hidden")}
    rows = []
    for n in seqs:
        plan = memory.plan_model_memory(
            **shape, seq=n, elem_bytes=DTYPE_BYTES[dtype], batch=batch, checkpointing=checkpointing
        )
        kv = (cfg["layers"], cfg["kv_heads"], cfg["head_dim"], DTYPE_BYTES[dtype])
        contiguous = memory.kv_cache_bytes(*kv, [n] * batch)
        paged = memory.kv_cache_expected_bytes(*kv, n, batch, page_size)
        rows.append(
            {
                "seq": n,
                **plan,
                "kv_cache_contiguous": contiguous,
                "kv_cache_paged": paged,
                "kv_cache_paged_unused": paged - contiguous,
            }
        )
    out: dict[str, Any] = {
        "model": key,
        "name": cfg.get("name", key),
        "source": cfg.get("source", ""),
        **shape,
        "dtype": dtype,
        "batch": batch,
        "checkpointing": checkpointing,
        "page_size": page_size,
        "rows": rows,
    }
    return out

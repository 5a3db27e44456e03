"""Slices of a sweep: `--shard i/n` (many machines) and `--gpus` (one worker per GPU of a host).

The partition rule, the same for both: the distinct shapes (Case.shape_key: the case without its provider)
are sorted by (dtype, head_dim, heads, kv_heads, causal, mode, seq_q, seq_k, batch) and dealt round robin, the
j-th shape (0-based) to slice j % n. Every provider of a shape lands in the same slice, so the comparisons
inside a slice are like for like, and neighbouring sequence lengths go to different slices, which evens out the
work. The rule reads only the cases, never Python's hash(): it gives the same slices on every machine and in
every process. Shard indices are 1-based (`--shard 1/4` .. `--shard 4/4`).

`sweep_id` is a digest of the resolved spec, the resolved providers and the flashbench version: every shard of
one sweep records the same one in env.json, and `flashbench merge` refuses runs whose ids differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from flashbench.errors import FlashbenchError
from flashbench.results.env import format_shard, parse_shard
from flashbench.spec.cases import Case

__all__ = ["format_shard", "parse_gpus", "parse_shard", "select", "slice_of_shapes", "split", "sweep_id"]

T = TypeVar("T")


def _shape_order(case: Case) -> tuple[Any, ...]:
    return (
        case.dtype,
        case.head_dim,
        case.heads,
        case.kv_heads,
        case.causal,
        case.mode,
        case.seq_q,
        case.seq_k,
        case.batch,
    )


def slice_of_shapes(cases: Sequence[Case], count: int) -> dict[str, int]:
    """shape_key -> its 0-based slice among `count` (the rule in the module docstring)."""
    shapes: dict[str, Case] = {}
    for case in cases:
        shapes.setdefault(case.shape_key, case)
    ordered = sorted(shapes.values(), key=_shape_order)
    return {case.shape_key: j % count for j, case in enumerate(ordered)}


def split(items: Sequence[T], count: int, case_of: Any = lambda item: item.case) -> list[list[T]]:
    """`items` (planned cases, in their order) dealt into `count` slices by shape; each keeps the order."""
    slices: list[list[T]] = [[] for _ in range(count)]
    where = slice_of_shapes([case_of(item) for item in items], count)
    for item in items:
        slices[where[case_of(item).shape_key]].append(item)
    return slices


def select(items: Sequence[T], shard: tuple[int, int], case_of: Any = lambda item: item.case) -> list[T]:
    """The items of shard (i, n), 1-based i."""
    index, count = shard
    return split(items, count, case_of)[index - 1]


def sweep_id(spec: dict[str, Any], providers: Sequence[str], version: str) -> str:
    """A stable digest naming one sweep: identical for every shard of it, on any machine."""
    payload = json.dumps(
        {"spec": spec, "providers": list(providers), "flashbench": version},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def parse_gpus(value: str | Sequence[int] | None, device: str, present: int) -> list[str] | None:
    """--gpus "all" | "0,1" -> device indices as CUDA_VISIBLE_DEVICES strings; None stays None.

    With device "cpu" there is nothing to pin: each listed index is one CPU worker (how CI tests the
    multi-worker path); "all" needs --device cuda. `present` is the number of GPUs NVML sees.
    """
    if value is None:
        return None
    text = value if isinstance(value, str) else ",".join(str(v) for v in value)
    text = text.strip().lower()
    if text == "all":
        if device != "cuda":
            raise FlashbenchError(
                "--gpus all needs --device cuda (with --device cpu list indices: --gpus 0,1)"
            )
        if present < 1:
            raise FlashbenchError("--gpus all: no GPU found")
        return [str(i) for i in range(present)]
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t.isdigit() for t in items):
        raise FlashbenchError(f"--gpus {value!r}: expected 'all' or device indices like 0,1")
    if len(set(items)) != len(items):
        raise FlashbenchError(f"--gpus {value!r}: a device is listed twice")
    indices = [str(int(t)) for t in items]
    if device == "cuda":
        missing = [i for i in indices if int(i) >= present]
        if missing:
            raise FlashbenchError(
                f"--gpus {value!r}: no GPU {', '.join(missing)} here ({present} found, indices 0..{present - 1})"
            )
    return indices

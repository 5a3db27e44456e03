"""Slices of a sweep: `--shard i/n` (many machines), and the order in which `--gpus` (one worker per GPU of a host)
hands out shapes.

The partition rule: the planned cases are grouped by shape (Case.shape_key: the case without
its provider), and each shape gets a predicted cost: the seconds its cases take to measure, from the sweep's
measurement settings (warm-up, sample budget and bound, host loops), the float64 check's blocks of rows, and each
call's time at the roofline of a reference GPU (the FLOP and byte models over the H100 SXM's datasheet roofs;
`case_cost_s`). The shapes, costliest first (ties in
(dtype, head_dim, heads, kv_heads, causal, mode, seq_q, seq_k, batch) order), each go to the slice with the least
predicted work so far (the first such slice on a tie): the longest-processing-time rule, so that the slices finish
together. Every provider of a shape lands in the same slice, so the comparisons inside a slice are like for like.
The rule reads only the sweep (its cases and settings), never the GPU it runs on nor Python's hash(): it gives the
same slices on every machine and in every process. Shard indices are 1-based (`--shard 1/4` .. `--shard 4/4`).
`--gpus` hands the shapes out in the same costliest-first order, each to whichever GPU finishes first
(runner.Deal): on one host the GPUs need no agreement made in advance, and a miss of the predicted costs costs no
balance.

`sweep_id` is a digest of the resolved spec, the resolved providers and the flashbench version: every shard of
one sweep records the same one in env.json, and `flashbench merge` refuses runs whose ids differ.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from flashbench.engine import correctness, timing
from flashbench.errors import FlashbenchError
from flashbench.gpu import hardware
from flashbench.models.flops import case_flops
from flashbench.models.io_model import compulsory_traffic
from flashbench.results.env import format_shard, parse_shard
from flashbench.spec.cases import Case
from flashbench.spec.config import SweepSpec

__all__ = [
    "by_shape",
    "case_cost_s",
    "costliest_first",
    "format_shard",
    "parse_gpus",
    "parse_shard",
    "select",
    "slice_of_shapes",
    "split",
    "sweep_id",
    "visible_gpus",
]

# The GPU whose datasheet roofs price a call for the partition: a fixed one, so that every machine deals alike.
COST_GPU = "h100-sxm"
# The float64 check's time per block of query rows (correctness.reference_blocks), the reference and its
# low-precision run together, without (False) and with (True) the gradients: a block is a few dozen eager PyTorch
# calls, host-bound at the sizes a sweep checks, so a check costs its blocks, not its FLOPs. Measured on an H100
# host (Python 3.12, torch 2.11): each case's time outside its compile, warm-up and samples, regressed on its
# blocks over the 120 measured cases of `flashbench sweep --preset speed --head-dim 64,128`, gave 2.2-3.3 ms and
# 6.6-7.3 ms a block (runs on 1, 2 and 4 GPUs), the rest 1.2 s a case; a case of 512 blocks (B = 16, H = 32,
# N = 1024) checks its gradients for 3.4 s, longer than its warm-up and samples together.
REF_BLOCK_S = {False: 2.2e-3, True: 6.7e-3}

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


def case_cost_s(case: Case, settings: Mapping[str, Any] | None = None) -> float:
    """The predicted seconds of measuring `case` under the sweep's measurement `settings` (a SweepSpec's fields by
    name; SweepSpec's defaults for those absent), compile time left out: what measure.measure_case does, step by
    step (engine/timing.py), with one call's time its bound at the COST_GPU's datasheet roofs (FLOPs over the
    peak of its dtype, or the compulsory bytes over the bandwidth):
        the first call and the untimed memory run (2 calls)
        the float64 check: its blocks of query rows (correctness.reference_blocks) at REF_BLOCK_S each
        the estimate (3 calls) and the steady warm-up's minimum (warmup_ms, or 3 calls if longer)
        the samples at their bound: they run until the SM clock holds, which a long call under a power cap
            does not, so up to rep_max_ms or max_samples calls (but at least rep_ms or min_samples calls)
        the host loops: a probe (3 calls), then host_loops rounds of a held batch (HELD_CALLS calls at most)
            and a loop of host_loop_ms (at least 3 calls, at most 1000), and the energy phase (ENERGY_MS)."""
    got = settings or {}

    def setting(name: str) -> Any:
        return got.get(name, getattr(SweepSpec, name))

    call = _call_s(case)
    floor = max(float(setting("rep_ms")) / 1e3, int(setting("min_samples")) * call)
    bound = min(float(setting("rep_max_ms")) / 1e3, int(setting("max_samples")) * call)
    samples = max(floor, bound)
    warm = 3 * call + max(float(setting("warmup_ms")) / 1e3, 3 * call)
    host = 0.0
    loops = int(setting("host_loops"))
    if loops > 0:
        calls = max(3, min(1000, int(float(setting("host_loop_ms")) / 1e3 / max(call, 1e-9))))
        host = 3 * call + loops * (calls + min(timing.HELD_CALLS, calls)) * call + timing.ENERGY_MS / 1e3
    return (
        2 * call + _check_s(case, setting("ref_flops_limit"), str(setting("device"))) + warm + samples + host
    )


def _call_s(case: Case) -> float:
    """One call of `case` at its roofline bound on the COST_GPU."""
    gpu = _cost_gpu()
    nbytes = compulsory_traffic(
        case.batch,
        case.heads,
        case.kv_heads,
        case.seq_q,
        case.seq_k,
        case.head_dim,
        case.elem_bytes,
        case.mode,
        case.kv_lengths() if case.ragged else None,
        case.documents(),
        kv_elem_bytes=case.kv_elem_bytes,
        head_dim_v=case.head_dim_v,
    ).total
    peak = gpu.peak_flops(case.dtype) or gpu.peak_flops("fp32") or 1.0
    return max(case_flops(case) / peak, nbytes / (gpu.bw_bytes_s or 1.0))


def _check_s(case: Case, flops_limit: float | None, device: str) -> float:
    """The float64 check's host time: the blocks of query rows of the slices it checks, at REF_BLOCK_S each."""
    grads = case.mode != "fwd"
    limit = flops_limit or correctness.DEFAULT_FLOPS_LIMIT.get(device, 2e9)
    blocks = correctness.reference_blocks(case, correctness.checked_slices(case, grads, limit))
    return blocks * REF_BLOCK_S[grads]


@functools.cache
def _cost_gpu() -> hardware.GpuSpec:
    return hardware.lookup(COST_GPU)


def costliest_first(
    cases: Sequence[Case], settings: Mapping[str, Any] | None = None
) -> list[tuple[str, float]]:
    """(shape_key, predicted seconds) per shape of `cases`, costliest first (the rule in the module docstring)."""
    cost: dict[str, float] = {}
    first: dict[str, Case] = {}
    for case in cases:
        first.setdefault(case.shape_key, case)
        cost[case.shape_key] = cost.get(case.shape_key, 0.0) + case_cost_s(case, settings)
    ordered = sorted(first.values(), key=lambda c: (-cost[c.shape_key], _shape_order(c)))
    return [(case.shape_key, cost[case.shape_key]) for case in ordered]


def slice_of_shapes(
    cases: Sequence[Case], count: int, settings: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """shape_key -> its 0-based slice among `count` (the rule in the module docstring)."""
    load = [0.0] * count
    where: dict[str, int] = {}
    for key, cost in costliest_first(cases, settings):
        j = min(range(count), key=lambda i: (load[i], i))
        where[key] = j
        load[j] += cost
    return where


def by_shape(
    items: Sequence[T], case_of: Any = lambda item: item.case, settings: Mapping[str, Any] | None = None
) -> list[list[T]]:
    """`items` (planned cases) grouped by shape, each group in the items' order, the costliest shape first: the
    order in which --gpus hands shapes to whichever GPU is free (runner.Deal)."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(case_of(item).shape_key, []).append(item)
    return [groups[key] for key, _ in costliest_first([case_of(item) for item in items], settings)]


def split(
    items: Sequence[T],
    count: int,
    case_of: Any = lambda item: item.case,
    settings: Mapping[str, Any] | None = None,
) -> list[list[T]]:
    """`items` (planned cases, in their order) dealt into `count` slices by shape; each keeps the order."""
    slices: list[list[T]] = [[] for _ in range(count)]
    where = slice_of_shapes([case_of(item) for item in items], count, settings)
    for item in items:
        slices[where[case_of(item).shape_key]].append(item)
    return slices


def select(
    items: Sequence[T],
    shard: tuple[int, int],
    case_of: Any = lambda item: item.case,
    settings: Mapping[str, Any] | None = None,
) -> list[T]:
    """The items of shard (i, n), 1-based i."""
    index, count = shard
    return split(items, count, case_of, settings)[index - 1]


def sweep_id(spec: dict[str, Any], providers: Sequence[str], version: str) -> str:
    """A stable digest naming one sweep: identical for every shard of it, on any machine."""
    payload = json.dumps(
        {"spec": spec, "providers": list(providers), "flashbench": version},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def visible_gpus(environ: Mapping[str, str], present: int) -> list[str]:
    """The GPUs this process may use, as CUDA numbers them: CUDA_VISIBLE_DEVICES's entries (an index, a GPU-
    or MIG- UUID) where it is set, else NVML's `present` indices. Like CUDA, the list ends at the first entry
    that names no device (empty, negative, or an index NVML does not have)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [str(i) for i in range(present)]
    entries: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-") or (entry.isdigit() and int(entry) >= present):
            break
        entries.append(entry)
    return entries


def parse_gpus(
    value: str | Sequence[int] | None,
    device: str,
    present: int,
    environ: Mapping[str, str] | None = None,
) -> list[str] | None:
    """--gpus "all" | "0,1" -> each worker's CUDA_VISIBLE_DEVICES entry; None stays None.

    `present` is the number of GPUs NVML sees, `environ` this process's environment (os.environ by default):
    visible_gpus() of the two are the GPUs this process may use. "all" is every one of them, and an index
    counts in that list, the way CUDA numbers devices: under CUDA_VISIBLE_DEVICES=2,3, --gpus 0,1 runs on the GPUs
    NVML calls 2 and 3, and each worker gets that entry (an index or a UUID) as its CUDA_VISIBLE_DEVICES.
    With device "cpu" there is nothing to pin: each listed index is one CPU worker (how CI tests the
    multi-worker path); "all" needs --device cuda.
    """
    if value is None:
        return None
    environ = os.environ if environ is None else environ
    visible = visible_gpus(environ, present)
    note = (
        ""
        if "CUDA_VISIBLE_DEVICES" not in environ
        else f" with CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']}"
    )
    text = value if isinstance(value, str) else ",".join(str(v) for v in value)
    text = text.strip().lower()
    if text == "all":
        if device != "cuda":
            raise FlashbenchError(
                "--gpus all needs --device cuda (with --device cpu list indices: --gpus 0,1)"
            )
        if not visible:
            raise FlashbenchError(f"--gpus all: no GPU found{note}")
        return list(visible)
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t.isdigit() for t in items):
        raise FlashbenchError(f"--gpus {value!r}: expected 'all' or device indices like 0,1")
    if len(set(int(t) for t in items)) != len(items):
        raise FlashbenchError(f"--gpus {value!r}: a device is listed twice")
    indices = [int(t) for t in items]
    if device != "cuda":
        return [str(i) for i in indices]
    missing = [str(i) for i in indices if i >= len(visible)]
    if missing:
        count = len(visible)
        raise FlashbenchError(
            f"--gpus {value!r}: no GPU {', '.join(missing)} here ({count} found{note}, "
            f"indices 0..{count - 1})"
        )
    return [visible[i] for i in indices]

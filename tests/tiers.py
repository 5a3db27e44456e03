"""The test suite's two tiers, and the shards benchmarks/gpu_tests.sh splits it into.

Smoke (the default, `python3 -m pytest -q`): every kernel path the bundled kernels ship (each dtype, causal or not,
GQA, odd lengths, windows, FP8, decode contiguous and paged, the forward and both backwards) at the shapes where the
Gluon dispatch and the default configs change, small enough that one H100 finishes it in minutes, its time being
Triton compiles. Full (`--full` or FLASHBENCH_FULL_TESTS=1): also the exhaustive matrix (every forced config of the
Gluon kernels against every shape and dtype, the measuring variants at large shapes, every autotuner candidate).

A test joins the full tier with `@pytest.mark.full`; a parametrized one keeps some of its cases in the smoke tier
with `@smoke(predicate)`, where predicate(**params) is True for the cases the smoke tier runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

FULL_ENV = "FLASHBENCH_FULL_TESTS"

# A sweep that runs the bundled kernels with --device cpu goes through Triton's interpreter: the CPU machines' path
# (Triton 3.9). On the GPU machine (Triton 3.6) the interpreter fails on the bundled forward (InterpreterError:
# TypeError('only 0-dimensional arrays can be converted to Python scalars'), H100), and the kernels' CUDA tests
# run there instead.
interpreter_sweep = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a --device cpu sweep of the bundled kernels: the CPU machines' path"
)


def smoke(predicate: Callable[..., bool]) -> Callable[[Any], Any]:
    """Keep the parametrized cases for which predicate(**params) holds in the smoke tier; mark the rest `full`."""

    def mark(fn: Any) -> Any:
        fn.smoke_tier = predicate
        return fn

    return mark


def full_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--full")) or os.environ.get(FULL_ENV, "").strip().lower() in (
        "1",
        "true",
        "yes",
    )


def in_full_tier(item: pytest.Item) -> bool:
    """Whether `item` runs only in the full tier: marked `full`, or outside its test's smoke predicate."""
    if item.get_closest_marker("full") is not None:
        return True
    predicate = getattr(getattr(item, "function", None), "smoke_tier", None)
    callspec = getattr(item, "callspec", None)
    return predicate is not None and callspec is not None and not predicate(**callspec.params)


# Parameters that select a different compiled kernel (a constexpr, a dtype, a config, a head dim, a kernel): tests of
# one module that agree on these share their Triton compiles, so a shard keeps them together. Everything else
# (lengths, seeds, batch and heads) only changes the launch.
COMPILE_PARAMS = (
    "kernel",
    "fn",
    "dtype",
    "causal",
    "d",
    "config",
    "mode",
    "paged",
    "page",
    "layout",
    "outliers",
)


def _stable(value: Any) -> str:
    """A parameter's value as every process spells it: a function by its name (its repr holds an address)."""
    name = getattr(value, "__qualname__", None)
    return name if callable(value) and isinstance(name, str) else repr(value)


def compile_group(item: pytest.Item) -> tuple[str, ...]:
    """The shard group of a test: its module and the values of its compile-selecting parameters."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return (
        item.nodeid.split("::", 1)[0],
        *(f"{p}={_stable(params[p])}" for p in COMPILE_PARAMS if p in params),
    )


def cost(item: pytest.Item, full: bool) -> int:
    """A test's share of a shard's time, roughly: a GPU test compiles and checks a large shape (10), the rest are
    mostly quick (1), and a test of the tier not run costs nothing."""
    if not full and in_full_tier(item):
        return 0
    return 10 if item.get_closest_marker("gpu") else 1


def shard(items: list[pytest.Item], index: int, count: int, full: bool) -> list[pytest.Item]:
    """The items of shard `index` of `count`: whole compile groups, the costliest first onto the shard with the least
    cost so far. Every process computes the same split from the same collection."""
    groups: dict[tuple[str, ...], list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(compile_group(item), []).append(item)

    def weight(group: list[pytest.Item]) -> int:
        return sum(cost(item, full) for item in group)

    loads = [0] * count
    mine: set[tuple[str, ...]] = set()
    for key, group in sorted(groups.items(), key=lambda kv: (-weight(kv[1]), kv[0])):
        target = min(range(count), key=lambda s: (loads[s], s))
        loads[target] += weight(group)
        if target == index:
            mine.add(key)
    return [item for item in items if compile_group(item) in mine]

"""The test tiers and the GPU machine's shards (tests/tiers.py): which tests the smoke tier keeps, and a split that
gives every test to exactly one shard, with the tests that share Triton compiles in the same one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import tiers


@dataclass
class FakeCallSpec:
    params: dict[str, Any]


@dataclass
class FakeItem:
    """What tiers.py reads of a pytest.Item: its node id, parameters, test function and markers."""

    nodeid: str
    params: dict[str, Any] = field(default_factory=dict)
    function: Any = None
    markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.callspec = FakeCallSpec(self.params) if self.params else None

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None

    def __hash__(self) -> int:
        return hash(self.nodeid)


def kernel_items() -> list[FakeItem]:
    @tiers.smoke(lambda kernel, **_: kernel == "v2")
    def test_fn() -> None: ...

    items = []
    for module in ("tests/test_a.py", "tests/test_b.py"):
        for kernel in ("v2", "v1", "stored_p"):
            for dtype in ("fp16", "bf16"):
                for n in (1, 17, 4096):
                    params = {"kernel": kernel, "dtype": dtype, "n": n}
                    items.append(
                        FakeItem(f"{module}::test_fn[{kernel}-{dtype}-{n}]", params, test_fn, ("gpu",))
                    )
    items += [FakeItem(f"tests/test_c.py::test_{i}") for i in range(30)]
    items.append(FakeItem("tests/test_c.py::test_big", markers=("full",)))
    return items


def test_smoke_predicate_and_full_marker_pick_the_full_tier():
    items = {item.nodeid: item for item in kernel_items()}
    assert not tiers.in_full_tier(items["tests/test_a.py::test_fn[v2-bf16-17]"])
    assert tiers.in_full_tier(items["tests/test_a.py::test_fn[v1-bf16-17]"])
    assert tiers.in_full_tier(items["tests/test_c.py::test_big"])
    assert not tiers.in_full_tier(items["tests/test_c.py::test_3"])


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_shards_split_every_test_once_and_keep_compile_groups_together(count, full):
    items = kernel_items()
    shards = [tiers.shard(items, i, count, full) for i in range(count)]
    ids = [item.nodeid for s in shards for item in s]
    assert sorted(ids) == sorted(item.nodeid for item in items)  # each test in exactly one shard
    where = {item.nodeid: i for i, s in enumerate(shards) for item in s}
    for item in items:  # tests that differ only in a length (n) share their kernels: one shard
        if item.params:
            same = [
                other
                for other in items
                if other.params and tiers.compile_group(other) == tiers.compile_group(item)
            ]
            assert len(same) == 3 and {where[o.nodeid] for o in same} == {where[item.nodeid]}
    # balanced: no shard more than the costliest group above the least loaded (greedy, costliest group first)
    groups: dict[tuple[str, ...], int] = {}
    for item in items:
        groups[tiers.compile_group(item)] = groups.get(tiers.compile_group(item), 0) + tiers.cost(item, full)
    loads = [sum(tiers.cost(item, full) for item in s) for s in shards]
    assert max(loads) - min(loads) <= max(groups.values())
    assert sum(loads) == sum(groups.values()) > 0


def test_compile_groups_are_spelled_alike_in_every_process():
    """Each shard process computes the split on its own: a group key must not hold an object's address (the repr of
    a function parameter does: tests/test_kernels_api.py parametrizes over the entry points)."""
    item = FakeItem("tests/test_a.py::test_fn[f]", {"fn": print, "dtype": "fp16", "config": {"BLOCK_M": 64}})
    assert tiers.compile_group(item) == (
        "tests/test_a.py",
        "fn=print",
        "dtype='fp16'",
        "config={'BLOCK_M': 64}",
    )

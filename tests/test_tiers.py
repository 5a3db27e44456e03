"""The test tiers and the GPU machine's shards (tests/tiers.py): which tests the smoke tier keeps, and a split that
gives every test to exactly one shard, with the tests that share Triton compiles in the same one."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
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


def _pytest(tmp_path: Path, name: str, source: str, *args: str) -> tuple[str, int, Path]:
    """pytest run on the test file `name` (its `source`) in tmp_path with this suite's conftest (its hooks) and
    FLASHBENCH_TEST_FAILURES set: (its output, its exit status, the failures file's path)."""
    (tmp_path / name).write_text(source)
    failures = tmp_path / "failures.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "FLASHBENCH_TEST_FAILURES": str(failures),
        "FLASHBENCH_TEST_JOBS": "0",
    }
    env.pop("FLASHBENCH_TEST_SHARD", None)
    command = [sys.executable, "-m", "pytest", *args, "-p", "conftest", "-p", "no:cacheprovider", name]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr, done.returncode, failures


def test_a_failing_test_leaves_its_traceback_in_the_failures_file_as_it_fails(tmp_path):
    """benchmarks/gpu_tests.sh points FLASHBENCH_TEST_FAILURES at a file per shard: written by conftest's hook when
    a test fails, not in pytest's final summary, which a shard killed at its time limit never prints."""
    source = (
        "def test_passes():\n    assert 1 + 1 == 2\n\n\n"
        "def test_fails():\n    observed = 41\n    assert observed == 42, 'the reason it failed'\n"
    )
    out, status, failures = _pytest(tmp_path, "test_two.py", source, "-q")
    assert status == 1, out
    text = failures.read_text()
    assert "test_two.py::test_fails (call)" in text and "the reason it failed" in text and "41 == 42" in text
    assert "test_passes" not in text


def test_a_sigint_inside_a_cli_call_skips_that_test_and_stops_the_session(tmp_path):
    """gpu_tests.sh's time limit sends SIGINT; one landing inside flashbench's main() becomes exit 130, so the test
    in progress would fail on it and pytest would run on: it is reported skipped (not judged) and nothing after it
    runs."""
    source = (
        "import os, signal\n"
        "from flashbench.cli.app import main\n\n\n"
        "def test_cut(monkeypatch):\n"
        "    import flashbench.cli.app as app\n"
        "    def interrupted(*_a, **_k):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    monkeypatch.setattr(app, '_command', lambda: interrupted)\n"
        "    assert main(['list', 'gpus']) == 0\n\n\n"
        "def test_after():\n    assert False, 'ran after the cut'\n"
    )
    out, _, failures = _pytest(tmp_path, "test_cut.py", source, "-v", "-rs")
    assert "test_cut.py::test_cut SKIPPED" in out and "interrupted (SIGINT), not judged" in out, out
    assert "test_after" not in out and not failures.exists(), out

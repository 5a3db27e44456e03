"""Test set-up shared by every test module.

On a machine without CUDA the Triton kernels run through Triton's interpreter, which must be switched on
before triton is first imported; on a GPU machine the same tests run on CUDA.

Tiers (tests/tiers.py): the smoke tier by default; `--full` or FLASHBENCH_FULL_TESTS=1 adds the exhaustive matrix.
FLASHBENCH_TEST_SHARD=i/n keeps the i-th of n shards (benchmarks/gpu_tests.sh runs n side by side).
FLASHBENCH_TEST_FAILURES=FILE appends each failing test's traceback to FILE as it fails.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiers
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _test_home() -> Path:
    """flashbench's folder for the tests: FLASHBENCH_TEST_HOME, else ${XDG_CACHE_HOME:-~/.cache}/flashbench-tests.

    Kept between runs, so the autotune picks of the tests that turn the autotuner on are timed once (Triton keeps
    its compiled kernels in its own cache, ~/.triton/cache, between runs too). Never the user's own
    FLASHBENCH_HOME: a pick timed while several test processes share one GPU (benchmarks/gpu_tests.sh) would be
    cached there and used by later benchmarks. Tests that need an empty folder make their own (tmp_path)."""
    home = os.environ.get("FLASHBENCH_TEST_HOME")
    if not home:
        home = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashbench-tests")
    Path(home).mkdir(parents=True, exist_ok=True)
    return Path(home)


os.environ["FLASHBENCH_HOME"] = str(_test_home())
# Kernels run their default config (one compile per shape class, not one per autotune candidate) unless a test
# turns the autotuner on (tests/test_autotune.py and the autotuner tests of the kernel files do).
os.environ.setdefault("FLASHBENCH_AUTOTUNE", "0")
# Nor the compile-once step (engine/precompile.py, tested on its own in test_precompile.py): every CUDA sweep of a
# test would start its record process and a pool of compile processes, 16 xdist workers' worth at once.
os.environ.setdefault("FLASHBENCH_PRECOMPILE", "0")

# Each xdist worker (PYTEST_XDIST_WORKER_COUNT of them) takes its share of the cores for torch's CPU work (the
# float64 and low-precision references): 16 workers of 16 intra-op threads each on 16 cores spent minutes in
# thread contention on a GPU machine.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

# The device the kernel tests run on: CUDA where present, else the CPU through the interpreter.
DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help=f"also run the exhaustive kernel matrix (tests/tiers.py; or {tiers.FULL_ENV}=1)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`python3 -m pytest -q` runs on every core where pytest-xdist is installed (the dev extras install it): the
    suite's time is Triton compiles on a GPU machine and the interpreter on a CPU, both one core per process.
    Each worker takes whole compile groups (tiers.compile_group, as xdist_group marks with --dist loadgroup), so a
    kernel variant compiles in one process. FLASHBENCH_TEST_JOBS sets the count (0: one process); `-n`, a
    FLASHBENCH_TEST_SHARD, --collect-only and --pdb keep pytest as asked."""
    jobs = os.environ.get("FLASHBENCH_TEST_JOBS", "auto").strip()
    option = config.option
    if (
        not config.pluginmanager.hasplugin("xdist")
        or os.environ.get("PYTEST_XDIST_WORKER")
        or os.environ.get("FLASHBENCH_TEST_SHARD")
        or getattr(option, "numprocesses", None) is not None
        or option.collectonly
        or getattr(option, "usepdb", False)
        or jobs in ("0", "1")
    ):
        return
    option.numprocesses = "auto" if jobs == "auto" else int(jobs)
    option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    full = tiers.full_requested(config)
    shard = os.environ.get("FLASHBENCH_TEST_SHARD")
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        kept = tiers.shard(items, index, count, full)
        mine = set(kept)
        config.hook.pytest_deselected(items=[item for item in items if item not in mine])
        items[:] = kept
    skip_full = pytest.mark.skip(reason=f"full tier: run with --full or {tiers.FULL_ENV}=1 (tests/tiers.py)")
    skip_gpu = pytest.mark.skip(reason="needs CUDA (runs on the GPU machine)")
    grouped = config.getoption("dist", "no") == "loadgroup"
    for item in items:
        # Every smoke predicate runs on every machine, so a CPU run catches one that a GPU case's params break.
        full_only = not full and tiers.in_full_tier(item)
        if not HAS_CUDA and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        elif full_only:
            item.add_marker(skip_full)
        if grouped:  # xdist sends a group to one worker: its compiles (and module fixtures) happen once
            item.add_marker(pytest.mark.xdist_group("|".join(tiers.compile_group(item))))


# SIGINTs this process received: benchmarks/gpu_tests.sh's time limit sends one so that pytest stops and prints
# its summary. One that lands inside a flashbench main() becomes its exit 130 (the CLI's Ctrl-C), so the test
# fails on that exit code and pytest goes on to the next: such a test is reported skipped (not judged) and the
# session stops after it.
_SIGINTS: list[int] = []


def _on_sigint(signum: int, frame: object) -> None:
    _SIGINTS.append(signum)
    raise KeyboardInterrupt  # as Python's own handler


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if not _SIGINTS:
        return
    report = outcome.get_result()
    if report.failed:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: interrupted (SIGINT), not judged")
    item.session.shouldstop = "interrupted (SIGINT)"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """FLASHBENCH_TEST_FAILURES=FILE: each failing test's traceback is appended to FILE as it fails. pytest prints
    them only in its final summary, which a shard killed at its time limit (benchmarks/gpu_tests.sh) never reaches:
    its log names what failed, this file says why."""
    path = os.environ.get("FLASHBENCH_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the kernel test modules (`pytestmark = pytest.mark.usefixtures("poisoned_outputs")`): every floating
    tensor made with torch.empty / empty_like (outputs, LSE, gradients, partials, workspaces) starts as NaN, so
    an element a kernel forgets to write fails the check; kernels run their default config (no autotuning on
    CUDA) unless a test turns the autotuner back on."""
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE", "0")
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(real_empty_like(*a, **kw)))

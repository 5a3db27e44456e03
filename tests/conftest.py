"""Test set-up shared by every test module.

On a machine without CUDA the Triton kernels run through Triton's interpreter, which must be switched on
before triton is first imported; on a GPU machine the same tests run on CUDA.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests never read or write the user's flashbench folder (autotune picks, calibration): a pick timed while
# several test processes share one GPU (benchmarks/gpu_tests.sh) would be cached and used by later benchmarks.
os.environ["FLASHBENCH_HOME"] = tempfile.mkdtemp(prefix="flashbench-tests-")
# Kernels run their default config (one compile per shape class, not one per autotune candidate) unless a test
# turns the autotuner on (tests/test_autotune.py and the autotuner tests of the kernel files do).
os.environ.setdefault("FLASHBENCH_AUTOTUNE", "0")

# The device the kernel tests run on: CUDA where present, else the CPU through the interpreter.
DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # FLASHBENCH_TEST_SHARD=i/n keeps every n-th test from the i-th (0-based): n pytest processes side by side
    # spread the kernel suite's Triton compiles over a GPU machine's cores (benchmarks/gpu_tests.sh).
    shard = os.environ.get("FLASHBENCH_TEST_SHARD")
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        config.hook.pytest_deselected(items=[item for j, item in enumerate(items) if j % count != index])
        items[:] = [item for j, item in enumerate(items) if j % count == index]
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (runs on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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

"""Workers import flashbench from where their parent did, and a worker that cannot start is one clear line.

Real subprocesses: a `flashbench sweep --device cpu` started the way a console script starts (the script's
folder first on sys.path), from a folder holding something named `flashbench`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import flashbench
from flashbench.engine import runner, worker
from flashbench.errors import EXIT_WORKER, FlashbenchError
from flashbench.results.rows import read_rows

ROOT = str(Path(flashbench.__file__).resolve().parent.parent)
SWEEP = ["sweep", "--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
SWEEP += ["--seq", "16", "--providers", "naive", "--causal", "false", "--mode", "fwd"]


def _launcher(tmp_path: Path) -> Path:
    """A console-script-like launcher in its own folder, importing this checkout's flashbench."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "flashbench_cli.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {ROOT!r})\n"
        "from flashbench.cli.app import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    return script


def _run(
    tmp_path: Path, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(_launcher(tmp_path)), *SWEEP, *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("shadow", ["package", "checkout"])
def test_sweep_from_a_folder_holding_a_flashbench_checkout_imports_the_parents_package(tmp_path, shadow):
    work = tmp_path / "work"
    fake = work / "flashbench"
    fake.mkdir(parents=True)
    if shadow == "package":  # a package that fails on import
        (fake / "__init__.py").write_text("raise ImportError('the shadowing flashbench was imported')\n")
    else:  # a fresh clone: flashbench/ holds pyproject.toml and the real package one level down
        (fake / "pyproject.toml").write_text("[project]\nname = 'flashbench'\n")
        (fake / "flashbench").mkdir()
        (fake / "flashbench" / "__init__.py").write_text("")
    out = tmp_path / "run"
    run = _run(tmp_path, work, "--out", str(out))
    assert run.returncode == 0, run.stderr
    rows = read_rows(out)
    assert [r.status for r in rows] == ["ok"], [r.reason for r in rows]


def test_a_worker_that_cannot_start_is_one_line_naming_the_cause_with_exit_4(tmp_path):
    decoy = tmp_path / "decoy"
    (decoy / "torch").mkdir(parents=True)
    (decoy / "torch" / "__init__.py").write_text("raise ImportError('this torch is a decoy')\n")
    env = {**os.environ, "PYTHONPATH": str(decoy)}  # the torch-free parent never imports it; the worker does
    run = _run(tmp_path, tmp_path, "--out", str(tmp_path / "run"), env=env)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == EXIT_WORKER == 4, run.stderr
    assert len(lines) == 1, lines  # no traceback
    assert lines[0].startswith("flashbench: error: the worker process could not start")
    assert "ImportError: this torch is a decoy" in lines[0]


def test_worker_environment_leads_with_the_parents_package_only_where_needed(monkeypatch, tmp_path):
    root = Path(ROOT)
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(root)])
    env = worker.environment({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [ROOT, "/elsewhere"]
    monkeypatch.setattr(
        sys, "path", [str(tmp_path)]
    )  # found by an installed package's finder: not on sys.path
    assert worker.environment({}) == {}
    assert worker.command("--describe")[:4] == [sys.executable, "-P", "-m", "flashbench.engine.worker"]


def test_a_worker_that_dies_while_starting_is_one_line_with_exit_4(monkeypatch):
    def dies(*args: str) -> list[str]:
        return [sys.executable, "-c", "import flashbench.nonexistent_module_for_this_test"]

    monkeypatch.setattr(worker, "command", dies)
    with pytest.raises(FlashbenchError) as caught:
        runner.describe("cpu", ())
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_WORKER and "\n" not in message
    assert message.startswith("the worker process could not start (it exited with code 1)")
    assert "ModuleNotFoundError: No module named 'flashbench.nonexistent_module_for_this_test'" in message


@pytest.mark.gpu
def test_a_cpu_sweep_on_a_gpu_machine_runs_without_the_gpu(tmp_path):
    kernel = tmp_path / "sees_cuda.py"
    kernel.write_text(
        "import torch\nfrom flashbench.providers import register\n\n\n"
        "@register('sees-cuda', devices=('cpu',))\n"
        "def sees_cuda(q, k, v, causal=False, sm_scale=None):\n"
        "    assert not torch.cuda.is_available(), 'a --device cpu worker saw a GPU'\n"
        "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)\n"
    )
    out = tmp_path / "run"
    args = [*SWEEP[: SWEEP.index("--providers")], "--providers", "sees-cuda", "--causal", "false"]
    run = subprocess.run(
        [sys.executable, str(_launcher(tmp_path)), *args, "--mode", "fwd", "--kernel", str(kernel), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert [(r.status, r.reason) for r in read_rows(out)] == [("ok", "")]

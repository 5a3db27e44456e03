"""The environment record written beside every run (env.json) and printed by `flashbench env`.

Collected without importing torch in this process: package versions from their metadata, GPUs and the
driver from NVML (or nvidia-smi), and what torch itself reports (CUDA, cuDNN, the device) from a worker.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import flashbench
from flashbench.errors import FlashbenchError
from flashbench.gpu import hardware, nvml
from flashbench.results.env import Environment


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_info() -> dict[str, Any]:
    """The git commit of the flashbench checkout (empty where flashbench is not a git checkout)."""
    root = Path(flashbench.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return {"git_sha": "", "git_dirty": None}
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"git_sha": sha.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "", "git_dirty": None}


def nvml_gpus() -> list[dict[str, Any]]:
    try:
        return list(nvml.all_gpus() or [])
    except Exception:
        return []


def nvidia_smi_gpus() -> list[str]:
    """`nvidia-smi -L` lines ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)"), [] without the tool or a GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def gpu_present() -> tuple[bool, list[dict[str, Any]]]:
    """Is there an NVIDIA GPU? Decided by NVML or nvidia-smi, never by initializing CUDA here."""
    gpus = nvml_gpus()
    if gpus:
        return True, gpus
    lines = nvidia_smi_gpus()
    return bool(lines), [{"nvidia_smi": line} for line in lines]


def collect(device: str = "cuda", worker_facts: dict[str, Any] | None = None) -> Environment:
    """The environment record. `worker_facts` is the worker's ready message "facts" (torch's own view)."""
    facts = dict(worker_facts or {})
    _, gpus = gpu_present() if device == "cuda" else (False, nvml_gpus())
    driver = next((g.get("driver") or g.get("driver_version") for g in gpus if isinstance(g, dict)), None)
    cudnn = facts.get("cudnn")
    return Environment(
        flashbench=flashbench.__version__,
        **git_info(),
        python=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        hostname=socket.gethostname(),
        started=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        argv=list(sys.argv),
        device=device,
        gpus=gpus,
        driver=driver,
        torch=facts.get("torch") or _version("torch"),
        cuda=facts.get("cuda"),
        cudnn=str(cudnn) if cudnn is not None else None,
        triton=facts.get("triton") or _version("triton"),
        gpu=str(facts.get("gpu") or ""),
        worker=facts,
        packages={p: _version(p) for p in ("flash-attn", "flash_attn_3", "nvidia-ml-py", "pandas")},
        calibration=_calibration(facts.get("gpu") or next((g.get("name") for g in gpus), None)),
    )


def _calibration(gpu_name: str | None) -> dict[str, Any] | None:
    """This GPU's `flashbench calibrate` result, copied into the run so a report built elsewhere shows the
    measured ceiling of the machine that ran it (None: no GPU, an unknown model, or never calibrated)."""
    if not gpu_name:
        return None
    try:
        spec = hardware.match_nvml_name(gpu_name)
        return hardware.load_calibration(spec) if spec is not None else None
    except FlashbenchError as exc:  # a corrupt calibration file must not stop a sweep: say so in the record
        return {"error": str(exc)}

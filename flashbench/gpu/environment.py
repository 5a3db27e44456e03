"""The environment record written beside every run (env.json) and printed by `flashbench env`.

Collected without importing torch in this process: package versions from their metadata, GPUs and the
driver from NVML (or nvidia-smi), and what torch itself reports (CUDA, cuDNN, the device) from a worker.

The code's fingerprint names what ran by its content, not by a commit: a git sha says nothing about uncommitted
edits, new files, or a copied tree without .git (git then names whatever checkout encloses the copy). It is a
digest over the Python files of the installed flashbench and flashbench.kernels (the files Python imports, so
an editable install and a wheel of the same source agree) and over each `--kernel` file. configs/ is left out:
it holds thresholds and presets, which the run's spec records, not code. Where flashbench runs from a git
checkout with changes, `git_diff` is a digest of `git diff HEAD` plus the untracked source files, which names the
uncommitted change itself.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flashbench
from flashbench.errors import FlashbenchError
from flashbench.gpu import hardware, nvml
from flashbench.providers import builtin
from flashbench.results.env import Environment


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


FINGERPRINT_CHARS = 16  # 64 bits of sha256: two different trees share a fingerprint with odds of 1 in 1.8e19
CODE_PACKAGES = ("flashbench", "flashbench.kernels")
NOT_CODE = ("flashbench/configs/",)  # a wheel installs configs/ inside the package: data, not code
# Untracked files that count as source in the diff digest (a stray log or result file does not).
SOURCE_SUFFIXES = (".py", ".toml", ".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp")


def _digest(parts: Sequence[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, content in parts:
        h.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()[:FINGERPRINT_CHARS]


def package_files(
    packages: Sequence[str] = CODE_PACKAGES, not_code: tuple[str, ...] = NOT_CODE
) -> dict[str, Path]:
    """The installed flashbench code: 'flashbench/...' and 'flashbench/kernels/...' names -> the files imported."""
    files: dict[str, Path] = {}
    for package in packages:
        spec = importlib.util.find_spec(
            package
        )  # locates the folder without importing it (kernels import torch)
        for root in (spec.submodule_search_locations or []) if spec else []:
            prefix = package.replace(".", "/")
            for path in sorted(Path(root).rglob("*.py")):
                name = f"{prefix}/{path.relative_to(root).as_posix()}"
                if "__pycache__" not in path.parts and not name.startswith(not_code):
                    files.setdefault(name, path)
    return files


def file_digest(path: str | Path) -> str:
    """One file's content digest ("unreadable: ..." where it cannot be read)."""
    try:
        return _digest([("", Path(path).read_bytes())])
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"


def code_fingerprint(
    kernel_files: Sequence[str | Path] = (), files: dict[str, Path] | None = None
) -> tuple[str, dict[str, str]]:
    """(fingerprint, its parts): the digest of the installed flashbench and kernels, plus each user kernel file.

    A kernel file is named by its file name, not its path: the same file run from two folders is the same code.
    `files`: the package files to digest (default: package_files()).
    """
    files = package_files() if files is None else files
    parts = {"flashbench": _digest([(name, files[name].read_bytes()) for name in sorted(files)])}
    for path in kernel_files:
        parts[f"kernel {Path(path).name}"] = file_digest(path)
    return _digest([(k, v.encode()) for k, v in sorted(parts.items())]), parts


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=20)


def git_info(root: Path | None = None) -> dict[str, Any]:
    """The git commit of the flashbench checkout, whether it has changes (new files count) and their digest.

    Empty where `root` (default: the folder above the flashbench package) is not itself the top of a git checkout:
    a copied tree inside another repository, or a wheel in site-packages, must not name that repository's commit.
    """
    root = (root or Path(flashbench.__file__).parent.parent).resolve()
    none: dict[str, Any] = {"git_sha": "", "git_dirty": None, "git_diff": ""}
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != root:
            return none
        sha = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain")  # untracked files too, minus what .gitignore ignores
        if sha.returncode != 0 or status.returncode != 0:
            return none
        dirty = bool(status.stdout.strip())
        return {
            "git_sha": sha.stdout.decode().strip(),
            "git_dirty": dirty,
            "git_diff": _diff_digest(root) if dirty else "",
        }
    except (OSError, subprocess.SubprocessError):
        return none


def _diff_digest(root: Path) -> str:
    """Digest of `git diff HEAD` (binary) plus the untracked source files, by name and content."""
    diff = _git(root, "diff", "HEAD", "--binary")
    listed = _git(root, "ls-files", "--others", "--exclude-standard", "-z")
    parts = [("diff", diff.stdout)]
    for name in sorted(n for n in listed.stdout.decode().split("\0") if n.endswith(SOURCE_SUFFIXES)):
        try:
            parts.append((name, (root / name).read_bytes()))
        except OSError:
            continue
    return _digest(parts)


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


def collect(
    device: str = "cuda",
    worker_facts: dict[str, Any] | None = None,
    kernel_files: Sequence[str | Path] = (),
) -> Environment:
    """The environment record. `worker_facts` is the worker's ready message "facts" (torch's own view);
    `kernel_files` the user's `--kernel` files, which the code fingerprint covers."""
    facts = dict(worker_facts or {})
    fingerprint, parts = code_fingerprint(kernel_files)
    _, gpus = gpu_present() if device == "cuda" else (False, nvml_gpus())
    driver = next((g.get("driver") or g.get("driver_version") for g in gpus if isinstance(g, dict)), None)
    cudnn = facts.get("cudnn")
    return Environment(
        flashbench=flashbench.__version__,
        **git_info(),
        fingerprint=fingerprint,
        fingerprint_parts=parts,
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
        packages={p: _version(p) for p in builtin.packages()},
        # a CPU run measured the CPU: the GPU beside it (NVML still lists it) lends it no ceiling
        calibration=_calibration(facts.get("gpu") or next((g.get("name") for g in gpus), None))
        if device == "cuda"
        else None,
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

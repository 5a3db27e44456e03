"""The worker process: owns CUDA, runs cases sent by the runner, answers in JSON lines.

    python -P -m flashbench.engine.worker --device cuda|cpu [--kernel FILE]... [--describe] [--parent-pid PID]

It is started by command() with environment(): the parent's interpreter with -P (the current folder is not put
on sys.path, so a folder there named `flashbench`, such as a fresh clone, cannot shadow the package) and, where
the parent imported flashbench from a sys.path entry that a fresh interpreter would not have (the current
folder, a script's folder, an entry added at run time), that entry on PYTHONPATH: the worker imports flashbench
from where its parent did.

Protocol (one JSON object per line; stdout carries only these, everything else the process or a provider
prints goes to stderr, which the runner keeps a tail of):
    worker -> runner  {"op": "ready", "pid": 123, "facts": {...}, "providers": [ProviderInfo, ...]}
                      {"op": "ready", "error": "...", "exit_code": 2|3|4}     (then exits: a bad kernel
                       file, no usable GPU, a worker that cannot run at all, e.g. torch fails to import)
    runner -> worker  {"op": "run", "id": 7, "case": {Case fields}, "opts": {Options fields}}
    worker -> runner  {"op": "phase", "id": 7, "phase": "build|compile|check|memory|timing"}
                      {"op": "result", "id": 7, "row": {Row fields}, "fatal": false}
    runner -> worker  {"op": "exit"}            (or EOF on stdin)
After a "fatal" result (illegal memory access and the like: the CUDA context is unusable) the worker exits.
A worker that dies (segfault) or stops answering (hang) is the runner's business: it records crash/timeout.

`--ncu-case JSON` runs one case for Nsight Compute: compile and warm up unprofiled, then one call of the
mode between cudaProfilerStart/Stop (run under `ncu --profile-from-start off`).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import platform
import signal
import site
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import flashbench
from flashbench.errors import EXIT_NO_GPU, EXIT_WORKER, FlashbenchError

MODULE = "flashbench.engine.worker"


def command(*args: str, module: str = MODULE) -> list[str]:
    """The command line that starts a worker (or another of flashbench's child processes, `module`): this process's
    interpreter, -P, the module, `args`."""
    return [sys.executable, "-P", "-m", module, *args]


def spawn(cmd: list[str], env: Mapping[str, str], stderr: Any) -> subprocess.Popen[str]:
    """Start a child that speaks the JSON-lines protocol on its stdin and stdout, in a session of its own so that
    kill_group reaches the subprocesses it starts (Triton's compiles)."""
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        env=dict(env),
        text=True,
        encoding="utf-8",
        bufsize=1,
    )


def kill_group(proc: subprocess.Popen[str], wait_s: float | None = None) -> None:
    """SIGKILL a spawned child's whole process group, then wait for it (at most wait_s seconds, if given)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` with PYTHONPATH led by package_root() where a fresh interpreter needs it to find this flashbench."""
    env = dict(base)
    root = package_root()
    if root is not None:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
        env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env


def package_root() -> str | None:
    """The sys.path entry this process imported flashbench from, if a fresh `python -P` would lack it.

    None where it would find the same package anyway: an installed or editable package (site-packages, or the
    editable install's finder: then the folder is not on sys.path at all), or an entry of PYTHONPATH.
    """
    root = Path(flashbench.__file__).resolve().parent.parent
    on_path = {Path(p or os.getcwd()).resolve() for p in sys.path}  # "" is the current folder
    inherited = {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    sites = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in on_path or root in inherited or root in sites:
        return None
    return str(root)


def _protocol_stream() -> IO[str]:
    """A private copy of stdout for the protocol; fd 1 then points at stderr (stray prints, C libraries)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    return proto


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: SIGKILL this worker when the runner dies (kill -9 of the sweep must not leave it running)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


def _send(stream: IO[str], msg: dict[str, Any]) -> None:
    stream.write(json.dumps(msg, separators=(",", ":"), default=str) + "\n")
    stream.flush()


def device_facts(device: str) -> dict[str, Any]:
    """What this process sees: versions, and the device's name, memory, L2 and SM count."""
    import torch

    facts: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "pid": os.getpid(),
    }
    try:
        import triton

        facts["triton"] = triton.__version__
    except Exception as exc:
        facts["triton"] = f"unavailable: {type(exc).__name__}"
    if device == "cpu":
        facts.update(
            gpu="cpu",
            name=platform.processor() or platform.machine(),
            threads=torch.get_num_threads(),
            triton_interpret=os.environ.get("TRITON_INTERPRET", ""),
        )
        return facts
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
    torch.cuda.init()
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    facts.update(
        gpu=props.name,
        name=props.name,
        capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        total_memory_bytes=int(total),
        free_memory_bytes=int(free),
        l2_cache_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        device_count=torch.cuda.device_count(),
    )
    pci = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    if all(isinstance(p, int) for p in pci):
        facts["pci"] = pci
    return facts


def _nvml_index(facts: dict[str, Any]) -> int:
    """NVML's index of the GPU this worker measures on (its CUDA device): the one at the PCI address torch
    reports (facts' "pci"), so that the clocks, power and throttle reasons of its rows are that GPU's whatever
    CUDA_VISIBLE_DEVICES holds (an index, a UUID) and however CUDA orders the devices; where NVML does not
    answer, the first CUDA_VISIBLE_DEVICES entry when it is a plain number, else 0 (nvml.index_of)."""
    from flashbench.gpu import nvml

    return nvml.index_of(facts.get("pci"))


# The parent process imports this module (runner builds the worker's command line from it) and must stay free of
# torch: everything that leads to torch (measure, the providers) is imported inside the functions the worker runs.
def _load_providers(kernels: list[str]) -> None:
    from flashbench.providers import builtin, user

    builtin.load()
    user.load(kernels)


def serve(args: argparse.Namespace, proto: IO[str]) -> int:
    from flashbench.engine.measure import Context, Options, measure_case
    from flashbench.providers import registry
    from flashbench.spec.cases import Case

    try:
        _load_providers(args.kernel)
    except FlashbenchError as exc:
        _send(proto, {"op": "ready", "error": str(exc), "exit_code": exc.exit_code})
        return 2
    try:
        facts = device_facts(args.device)
    except Exception as exc:
        no_gpu = args.device == "cuda" and not isinstance(exc, ImportError)
        error = f"{type(exc).__name__}: {exc}"
        if not no_gpu:
            error = f"the worker process could not start: {error} (python: {sys.executable})"
        _send(proto, {"op": "ready", "error": error, "exit_code": EXIT_NO_GPU if no_gpu else EXIT_WORKER})
        return 3
    if args.device == "cuda":
        from flashbench.engine import build_lock

        build_lock.install()  # no two processes of this host compile one kernel build
    ctx = Context(device=args.device, gpu=str(facts.get("gpu", "")), nvml_index=_nvml_index(facts))
    if args.device == "cuda":
        facts["nvml_index"] = ctx.nvml_index
    infos = [ctx.info(name).to_dict() for name in registry.names()]
    _send(proto, {"op": "ready", "pid": os.getpid(), "facts": facts, "providers": infos})
    if args.describe:
        return 0
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0  # EOF: the runner is gone or done
        msg = json.loads(line)
        if msg.get("op") == "exit":
            return 0
        if msg.get("op") != "run":
            continue
        case_id = msg.get("id")

        def phase(name: str, case_id: Any = case_id) -> None:
            _send(proto, {"op": "phase", "id": case_id, "phase": name})

        ctx.phase = phase
        case = Case.from_dict(msg["case"])
        row, fatal = measure_case(case, Options.from_dict(msg.get("opts", {})), ctx)
        _send(proto, {"op": "result", "id": case_id, "row": row.to_dict(), "fatal": fatal})
        if fatal:
            return 1


def ncu_case(args: argparse.Namespace) -> int:
    """One case for Nsight Compute: unprofiled compile + warm-up, then one profiled call of the mode."""
    import torch

    from flashbench.engine.measure import prepare
    from flashbench.spec.cases import Case

    _load_providers(args.kernel)
    case = Case.from_dict(json.loads(args.ncu_case))
    with contextlib.ExitStack() as stack:
        prepared = prepare(case, "cuda", stack)
        call, setup = prepared.timed()
        for _ in range(2):
            if setup:
                setup()
            call()
        if setup:
            setup()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -P -m {MODULE}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--kernel", action="append", default=[])
    parser.add_argument("--describe", action="store_true", help="print the ready message and exit")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--ncu-case", default=None, help="a Case as JSON: run it once for Nsight Compute")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    faulthandler.enable()  # a segfault prints the Python stack to stderr: the runner keeps its tail
    if args.ncu_case:
        return ncu_case(args)
    proto = _protocol_stream()
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    code = serve(args, proto)
    sys.stdout.flush()
    sys.stderr.flush()
    # Every answer is sent and flushed (_send): skip the interpreter's and CUDA's teardown, which the runner's
    # close() would wait out (seconds at the end of a sweep, on its critical path). An --ncu-case run above exits
    # normally: the profiler may read its results as the CUDA context is torn down.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

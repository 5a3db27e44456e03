"""The pre-compile's processes (engine/precompile.py runs them): record the kernel builds of cases, compile builds.

    python -P -m flashbench.engine.compile_worker record [--kernel FILE]...   stdin: one JSON list of cases, then EOF
    python -P -m flashbench.engine.compile_worker compile [--kernel FILE]...  stdin: one build a line

Both answer in JSON lines on a private copy of stdout (worker.py's protocol stream; everything else goes to stderr).

record: with Triton's `jit_cache_hook` answering "skip" (knobs.runtime.jit_cache_hook returning True), every launch
that would compile returns before compiling or running: each case's first call (measure.prepare, then the full
forward and backward a worker's first call makes, on the case's own inputs) reaches each kernel it would launch,
with the arguments it would launch with, and the hook records the build: the kernel (module, qualname) and
Triton's specialization data (the signature, constants, attributes, options and target that key the compile).
The autotuner records every candidate a worker would compile (kernels/launch.py RECORD_ONLY), or only the pick the
autotune cache already holds. One answer a case: {"case": key, "builds": [...], "error": str|null}.

compile: `JITFunction.preload(specialization data)`, Triton's own way to compile a recorded build, compiles the
same source with the same options the runtime would, into the Triton cache (TRITON_CACHE_DIR), where a worker's
first launch of that build then finds it. Each build under its lock (engine/build_lock.py): a build whose lock
another process holds (a worker compiling it) is left to that process. The compile processes run at a lower CPU
priority (nice 10) than the workers measuring beside them. One answer a build:
{"id": ..., "compile_s": ..., "error": str|null, "elsewhere": bool (another process held its lock)}.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import json
import os
import sys
import time
from typing import IO, Any

from flashbench.engine import build_lock
from flashbench.engine.worker import _die_with_parent, _load_providers, _protocol_stream, _send


def _kernel_of(module: str, qualname: str) -> Any:
    """The @triton.jit function `module`:`qualname` (a module a --kernel file registered is in sys.modules)."""
    mod = sys.modules.get(module) or importlib.import_module(module)
    return functools.reduce(getattr, qualname.split("."), mod)


def record(stdin: IO[str], proto: IO[str]) -> None:
    import torch
    from triton import knobs

    from flashbench.engine.measure import prepare
    from flashbench.kernels import launch
    from flashbench.spec.cases import Case

    # The sweep starts this process as it starts its first worker, before it has planned the cases: its start-up
    # (imports, the CUDA context) overlaps theirs, and the cases arrive when the plan is made.
    torch.cuda.init()
    cases = json.loads(stdin.read())
    builds: list[dict[str, Any]] = []

    def hook(**kw: Any) -> bool:
        module, qualname, spec = build_lock.identity(kw)
        builds.append({"module": module, "qualname": qualname, "spec": spec})
        return True  # skip: no compile, no launch

    launch.RECORD_ONLY = True
    knobs.runtime.jit_cache_hook = hook
    for data in cases:
        case = Case.from_dict(data)
        error = None
        try:
            with contextlib.ExitStack() as stack:
                prepare(case, "cuda", stack).full()
        except Exception as exc:  # the builds recorded before it still count; the worker compiles the rest
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        gc.collect()
        torch.cuda.empty_cache()
        _send(proto, {"case": case.key, "builds": builds, "error": error})
        builds = []


def compile_builds(stdin: IO[str], proto: IO[str]) -> None:
    for line in stdin:
        build = json.loads(line)
        lock = build_lock.BuildLock(build_lock.path_for(build["module"], build["qualname"], build["spec"]))
        if not lock.try_acquire():  # a worker is compiling it: no second compile
            _send(proto, {"id": build["id"], "compile_s": 0.0, "error": None, "elsewhere": True})
            continue
        started = time.perf_counter()
        error = None
        try:
            _kernel_of(build["module"], build["qualname"]).preload(build["spec"])
        except Exception as exc:  # a build that does not compile here compiles (or fails) in its worker
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        finally:
            lock.release()
        _send(proto, {"id": build["id"], "compile_s": time.perf_counter() - started, "error": error})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m flashbench.engine.compile_worker")
    parser.add_argument("mode", choices=("record", "compile"))
    parser.add_argument("--kernel", action="append", default=[])
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    proto = _protocol_stream()
    _die_with_parent(args.parent_pid)  # a sweep that dies takes its compile step with it
    _load_providers(args.kernel)
    if args.mode == "record":
        record(sys.stdin, proto)
    else:
        os.nice(10)  # the workers measuring beside this process come first
        compile_builds(sys.stdin, proto)
    return 0


if __name__ == "__main__":
    sys.exit(main())

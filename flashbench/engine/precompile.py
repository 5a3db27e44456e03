"""Compile once per host: the distinct kernel builds of a CUDA sweep's planned cases are compiled once, in parallel
on the host's CPU cores, into the Triton cache the workers read, while the workers measure.

start() runs the step in a thread of this process, beside the workers; its two steps run in processes of their own
(engine/compile_worker.py; this process never imports torch):
  1. record: one process on the sweep's first GPU (started by begin() with the workers, before the sweep is
     planned, so that its start-up overlaps theirs) runs each case's first call with Triton's JIT told to record,
     not compile nor launch, every build it meets: the kernel and Triton's specialization data (signature,
     constants, options, target), the autotuner's candidates included (or only the pick the autotune cache holds).
     That GPU's worker starts when the record ends (no sample shares a GPU with it); the others start at once.
  2. compile: the distinct builds (the same kernel with the same specialization data is one build, whichever
     cases and shapes meet it) are dealt, one at a time as processes come free, to `jobs` processes (one per CPU
     core less one per worker, by default, at nice 10): each compiles a build with Triton's own
     `JITFunction.preload`, the same source and options the runtime compiles, under the build's lock
     (engine/build_lock.py). No build goes to two processes.
A worker takes the same lock around each of its own compiles: where the step is compiling a build the worker needs,
the worker waits, then finds it in the cache; where a worker already holds a build's lock, the step leaves that
build to it (`elsewhere`). So no build is compiled twice on the host, and a build the step did not plan or failed
is compiled by the worker that needs it, as without this step. compile_ms, kept out of the samples as always, is
the first call's compiles, waits (compile_wait_ms) and tuning.

Which cases: those the sweep will run whose provider is a bundled kernel (ProviderInfo.source "bundled"). Others
compile in their workers: SDPA's kernels ship compiled, FlexAttention's go through torch.compile's own cache, and a
user's kernel file may do anything on its first call. Off (with the reason recorded) under --device cpu (the
interpreter compiles nothing), with FLASHBENCH_PRECOMPILE=0, or with nothing to compile.
FLASHBENCH_PRECOMPILE_JOBS=N sets the number of compile processes.

The record (env.json's `precompile`): wall_s (the whole step), record_s, compile_wall_s, jobs, cases, builds
(distinct), compiled, failed, elsewhere, compile_s_sum (the processes' compile time added up), overlapped (the
step ran beside the workers), workers_waited_s (per worker, the time its first calls waited for a build compiled
by another process), and `skipped` with its reason where the step did not run.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flashbench.engine import worker as worker_process
from flashbench.spec.cases import Case

MODULE = "flashbench.engine.compile_worker"
ENV_SWITCH = "FLASHBENCH_PRECOMPILE"
ENV_JOBS = "FLASHBENCH_PRECOMPILE_JOBS"
_ERRORS_KEPT = 5  # the first few failures, in the record, to say why


@dataclass
class Record:
    """What the pre-compile step did, as env.json keeps it."""

    wall_s: float = 0.0
    record_s: float = 0.0
    compile_wall_s: float = 0.0
    jobs: int = 0
    cases: int = 0
    builds: int = 0
    compiled: int = 0
    failed: int = 0
    compile_s_sum: float = 0.0
    elsewhere: int = 0
    overlapped: bool = False
    workers_waited_s: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("wall_s", "record_s", "compile_wall_s", "compile_s_sum"):
            out[key] = round(out[key], 3)
        return out


def off_reason(device: str) -> str | None:
    """Why the step never runs on `device` in this environment, whatever the cases (None: it may)."""
    if device != "cuda":
        return "--device cpu: the Triton interpreter compiles nothing"
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV_SWITCH}=0"
    return None


def skip_reason(device: str, cases: Sequence[Case]) -> str | None:
    """Why the step does not run for these cases on `device` (None: it runs)."""
    return off_reason(device) or (None if cases else "no case of a bundled kernel to run")


def jobs_for(builds: int, workers: int = 0) -> int:
    """Compile processes: FLASHBENCH_PRECOMPILE_JOBS, else one per CPU core this process may use less one per
    worker measuring beside them; never more than there are builds."""
    text = os.environ.get(ENV_JOBS, "").strip()
    if text.isdigit() and int(text) > 0:
        wanted = int(text)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        wanted = cores - workers
    return max(1, min(wanted, builds))


def distinct(recorded: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per build (the kernel and its specialization data), in the order first met, each with an "id"."""
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for build in recorded:
        key = (build["module"], build["qualname"], build["spec"])
        if key not in seen:
            seen[key] = {**build, "id": len(seen)}
    return list(seen.values())


def command(mode: str, kernels: Sequence[str]) -> list[str]:
    cmd = worker_process.command(mode, "--parent-pid", str(os.getpid()), module=MODULE)
    for path in kernels:
        cmd += ["--kernel", path]
    return cmd


def _start(cmd: list[str], visible: str | None) -> subprocess.Popen[str]:
    env = worker_process.environment(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return worker_process.spawn(cmd, env, subprocess.DEVNULL)


def _answers(proc: subprocess.Popen[str]) -> queue.Queue[dict[str, Any] | None]:
    """A queue fed with the process's JSON answers by a reader thread (None at end of output)."""
    answers: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                answers.put(json.loads(line))
            except json.JSONDecodeError:
                continue
        answers.put(None)

    threading.Thread(target=read, daemon=True).start()
    return answers


def record_builds(
    cases: Sequence[Case],
    kernels: Sequence[str],
    visible: str | None,
    timeout_s: float,
    rec: Record,
    step: Step,
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Step 1: per case (its key), the builds its first call would compile (a case that fails records what it
    met), in the record process begin() started, or in one started now."""
    proc = step.record_proc or step.spawn(command("record", kernels), visible)
    answers = _answers(proc)
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps([c.to_dict() for c in cases]))
        proc.stdin.close()
    except OSError:
        pass
    builds: list[tuple[str, list[dict[str, Any]]]] = []
    try:
        for _ in cases:
            try:
                answer = answers.get(timeout=timeout_s)
            except queue.Empty:
                rec.errors.append(f"record: no answer within {timeout_s:g} s")
                break
            if answer is None:
                rec.errors.append(f"record: the process ended early (exit {proc.wait()})")
                break
            builds.append((str(answer.get("case")), answer.get("builds", [])))
            if answer.get("error") and len(rec.errors) < _ERRORS_KEPT:
                rec.errors.append(f"record {answer.get('case')}: {answer['error']}")
    finally:
        worker_process.kill_group(proc)
    return builds


def compile_pool(
    builds: Sequence[dict[str, Any]],
    jobs: int,
    timeout_s: float,
    start: Callable[[], subprocess.Popen[str]],
    rec: Record,
    stopped: threading.Event | None = None,
    ended: Callable[[int], None] | None = None,
) -> None:
    """Step 2: `builds` compiled by `jobs` processes made by `start()`, each build sent to exactly one of them as
    it comes free. A build that fails, or whose process dies or passes `timeout_s`, is counted failed (a process
    killed for it is replaced); one whose lock another process holds is counted `elsewhere`. Once `stopped` is
    set no build is sent. `ended(id)` is called as each build sent is done with, whichever way."""
    todo: queue.Queue[dict[str, Any]] = queue.Queue()
    for build in builds:
        todo.put(build)
    lock = threading.Lock()

    def note(error: str | None, seconds: float) -> None:
        with lock:
            rec.compile_s_sum += seconds
            if error is None:
                rec.compiled += 1
                return
            rec.failed += 1
            if len(rec.errors) < _ERRORS_KEPT:
                rec.errors.append(error)

    def serve() -> None:
        proc: subprocess.Popen[str] | None = None
        answers: queue.Queue[dict[str, Any] | None] | None = None
        try:
            while stopped is None or not stopped.is_set():
                try:
                    build = todo.get_nowait()
                except queue.Empty:
                    return
                if proc is None or proc.poll() is not None:
                    proc = start()
                    answers = _answers(proc)
                assert answers is not None and proc.stdin is not None
                started = time.monotonic()
                try:
                    proc.stdin.write(json.dumps(build) + "\n")
                    proc.stdin.flush()
                except OSError:
                    pass  # it died: the read below says so
                answer = _next_answer(answers, build["id"], timeout_s)
                if ended is not None:
                    ended(build["id"])
                if answer is None or isinstance(answer, str):
                    worker_process.kill_group(proc)
                    proc = None
                    why = answer or f"the compile process ended (build {build['qualname']})"
                    note(why, time.monotonic() - started)
                    continue
                if answer.get("elsewhere"):
                    with lock:
                        rec.elsewhere += 1
                    continue
                error = answer.get("error")
                note(f"{build['qualname']}: {error}" if error else None, float(answer.get("compile_s", 0.0)))
        finally:
            if proc is not None:
                try:
                    assert proc.stdin is not None
                    proc.stdin.close()
                    proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                worker_process.kill_group(proc)

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _next_answer(
    answers: queue.Queue[dict[str, Any] | None], build_id: int, timeout_s: float
) -> dict[str, Any] | str | None:
    """The answer for `build_id`; a string saying why there is none (timeout); None when the process ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return f"no answer within {timeout_s:g} s (build {build_id}); process killed"
        try:
            answer = answers.get(timeout=remaining)
        except queue.Empty:
            continue
        if answer is None:
            return None
        if answer.get("id") == build_id:
            return answer


class Step:
    """The step under way in a thread of this process, beside the workers (start())."""

    def __init__(self, rec: Record) -> None:
        self.rec = rec
        self.recorded = (
            threading.Event()
        )  # the record process is done (its GPU is free), or the step is skipped
        self.stopped = threading.Event()
        self._procs: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.record_proc: subprocess.Popen[str] | None = None  # begin()'s, waiting for the cases
        self.over = threading.Event()  # nothing more to compile: skipped, stopped or done
        self._cases: set[str] = set()  # the keys of the cases the step compiles for
        self._needs: dict[str, set[int]] = {}  # per recorded case, the ids of its builds
        self._ended: set[int] = set()  # builds compiled, failed or left to a worker

    def ready(self, case: Case) -> bool:
        """Whether `case`'s first call would find no build of the step still to compile: true for a case the step
        does not compile for and once the step is over, false while its builds are recorded or compiled."""
        if self.over.is_set():
            return True
        with self._lock:
            if case.key not in self._cases:
                return True
            needs = self._needs.get(case.key)
            return needs is not None and needs <= self._ended

    def _recorded(self, per_case: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
        """The distinct builds of the record (`distinct`), each case's needs noted for ready()."""
        builds = distinct(b for _, met in per_case for b in met)
        ids = {(b["module"], b["qualname"], b["spec"]): b["id"] for b in builds}
        with self._lock:
            for key, met in per_case:
                self._needs[key] = {ids[(b["module"], b["qualname"], b["spec"])] for b in met}
        return builds

    def _ended_one(self, build_id: int) -> None:
        with self._lock:
            self._ended.add(build_id)

    def spawn(self, cmd: list[str], visible: str | None) -> subprocess.Popen[str]:
        proc = _start(cmd, visible)
        with self._lock:
            self._procs.append(proc)
        if self.stopped.is_set():
            worker_process.kill_group(proc)
        return proc

    def stop(self) -> None:
        """Kill the step's processes (the sweep stops); join() then returns what it did so far."""
        self.stopped.set()
        self.over.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            worker_process.kill_group(proc)

    def join(self) -> Record:
        if self._thread is not None:
            self._thread.join()
        return self.rec


def begin(device: str, kernels: Sequence[str], visible: str | None) -> Step:
    """The step before its cases are known: where it can run on `device`, its record process is started now, so
    that its start-up (imports, CUDA context) overlaps the workers' while the sweep plans; start() then sends it
    the cases (or kills it where the step is skipped)."""
    step = Step(Record())
    if off_reason(device) is None:
        step.record_proc = step.spawn(command("record", kernels), visible)
    return step


def start(
    cases: Sequence[Case],
    *,
    device: str,
    kernels: Sequence[str],
    visible: str | None,
    timeout_s: float,
    workers: int = 0,
    step: Step | None = None,
) -> Step:
    """Record, then compile, the builds of `cases` (the bundled kernels' cases the sweep will run) in a thread of
    this process, beside `workers` workers measuring (they keep a CPU core each); the running step (`step`, where
    begin() made it)."""
    started = time.monotonic()
    step = step or Step(Record())
    step.rec = Record(cases=len(cases), overlapped=workers > 0)
    rec = step.rec
    rec.skipped = skip_reason(device, cases)
    if rec.skipped is not None:
        if step.record_proc is not None:
            worker_process.kill_group(step.record_proc)
        step.recorded.set()
        step.over.set()
        return step
    step._cases = {case.key for case in cases}

    def work() -> None:
        try:
            try:
                builds = step._recorded(record_builds(cases, kernels, visible, timeout_s, rec, step))
            finally:
                step.recorded.set()
            rec.record_s = time.monotonic() - started
            rec.builds = len(builds)
            if builds and not step.stopped.is_set():
                rec.jobs = jobs_for(len(builds), workers)
                began = time.monotonic()
                compile_pool(
                    builds,
                    rec.jobs,
                    timeout_s,
                    lambda: step.spawn(command("compile", kernels), visible),
                    rec,
                    step.stopped,
                    step._ended_one,
                )
                rec.compile_wall_s = time.monotonic() - began
            rec.wall_s = time.monotonic() - started
        finally:
            step.over.set()

    step._thread = threading.Thread(target=work, name="flashbench-precompile", daemon=True)
    step._thread.start()
    return step


def run(
    cases: Sequence[Case],
    *,
    device: str,
    kernels: Sequence[str],
    visible: str | None,
    timeout_s: float,
) -> Record:
    """The step with nothing beside it: start(), then wait for it; the record."""
    return start(cases, device=device, kernels=kernels, visible=visible, timeout_s=timeout_s).join()

"""The runner: schedules planned cases over worker processes and turns whatever happens into rows.

The parent process (this module) never imports torch: CUDA lives in `python -P -m flashbench.engine.worker`
subprocesses (protocol in worker.py; worker.command and worker.environment make them import flashbench from
where this process did). A worker that cannot start at all is a one-line error with exit code 4. Per case:
    ok / wrong / oom / unsupported / crash(provider raised)   the worker's answer
    crash   the worker died (segfault, abort, illegal memory access...): stderr tail in the reason
    timeout no answer within the per-case timeout: the worker's process group is killed
    skipped a smaller N of the same provider and shape ran out of memory
After a crash or timeout a fresh worker starts for the next case. Every row is appended and fsync'ed as the
case ends, so Ctrl-C or kill -9 loses no finished row and `--resume` picks up where the run stopped.
With --gpus, parallel.run_parallel runs one such loop per GPU in threads of this process (each worker pinned
with CUDA_VISIBLE_DEVICES, all providers of a shape on one GPU); this process stays the only writer of rows.jsonl.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Any

from flashbench.engine import timing
from flashbench.engine import worker as worker_process
from flashbench.errors import EXIT_USAGE, EXIT_WORKER, FlashbenchError
from flashbench.models.memory import reported_workspace_bytes
from flashbench.results.env import ENV_FILE
from flashbench.results.paths import check_writable_dir, make_dir
from flashbench.results.rows import (
    CRASH,
    OOM,
    RETRY_STATUSES,
    ROWS_FILE,
    SKIPPED,
    TIMEOUT,
    Row,
    append_row,
    read_rows,
)
from flashbench.spec.cases import Case
from flashbench.spec.plan import PlannedCase

STARTUP_TIMEOUT_S = 180.0  # import torch + CUDA init (+ user kernel files) on a cold machine
_TAIL_BYTES = 6000
_TAIL_LINES = 30
# The last line of a Python traceback ("ModuleNotFoundError: No module named 'x'") or a fatal signal
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b|Fatal Python error)")


class WorkerError(Exception):
    """The worker died or stopped answering."""

    def __init__(self, status: str, reason: str, phase: str) -> None:
        super().__init__(reason)
        self.status, self.reason, self.phase = status, reason, phase


class Worker:
    """One worker subprocess (worker.command()), in its own session (Ctrl-C and kills are ours to send)."""

    def __init__(
        self,
        device: str,
        kernels: tuple[str, ...],
        log_path: Path | None,
        describe: bool = False,
        visible: str | None = None,
    ):
        env = worker_process.environment(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if visible is not None:  # --gpus: pin this worker to one device (other CUDA/NCCL settings untouched)
            env["CUDA_VISIBLE_DEVICES"] = visible
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"  # must be set before the worker imports triton
            # and no GPU in sight: a CPU sweep on a GPU machine runs what it runs on a CPU machine (the
            # bundled kernels through the interpreter, whatever they would pick on the GPU)
            env["CUDA_VISIBLE_DEVICES"] = ""
        cmd = worker_process.command("--device", device, "--parent-pid", str(os.getpid()))
        for path in kernels:
            cmd += ["--kernel", path]
        if describe:
            cmd.append("--describe")
        if log_path is None:
            import tempfile

            self._log: IO[bytes] = tempfile.TemporaryFile()
        else:
            self._log = open(log_path, "a+b")  # noqa: SIM115  (closed in close())
        self.proc = worker_process.spawn(cmd, env, self._log)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.facts: dict[str, Any] = {}
        self.providers: list[dict[str, Any]] = []
        self.ready = False  # wait_ready() has read its ready message
        self._next_id = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._messages.put(json.loads(line))
            except json.JSONDecodeError:
                continue  # not ours (the protocol stream carries only JSON)
        self._messages.put(None)

    def _log_offset(self) -> int:
        return os.fstat(self._log.fileno()).st_size

    def stderr_tail(self, since: int = 0) -> str:
        """The last lines the worker wrote to stderr since byte offset `since`."""
        size = os.fstat(self._log.fileno()).st_size
        start = max(since, size - _TAIL_BYTES)
        text = os.pread(self._log.fileno(), size - start, start).decode("utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return "\n".join(lines[-_TAIL_LINES:])

    def _next(self, deadline: float) -> dict[str, Any] | None:
        """The next message; None at EOF; raises TimeoutError past the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return self._messages.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError from None

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "closed its output"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        try:
            msg = self._next(time.monotonic() + timeout)
        except TimeoutError:
            self.kill()
            cause = _headline(self.stderr_tail()) or "no output"
            raise FlashbenchError(
                f"the worker process did not start within {timeout:.0f} s ({cause})", exit_code=EXIT_WORKER
            ) from None
        if msg is None:
            how, cause = self._death(), _headline(self.stderr_tail()) or "no output"
            raise FlashbenchError(
                f"the worker process could not start (it {how}): {cause} (python: {sys.executable})",
                exit_code=EXIT_WORKER,
            )
        if msg.get("error"):
            self.close()
            raise FlashbenchError(str(msg["error"]), exit_code=int(msg.get("exit_code", EXIT_USAGE)))
        self.facts = msg.get("facts", {})
        self.providers = msg.get("providers", [])
        self.ready = True

    def run(self, case: Case, opts: dict[str, Any], timeout: float) -> tuple[dict[str, Any], bool]:
        """Send one case; return (row dict, fatal) or raise WorkerError (crash / timeout)."""
        self._next_id += 1
        case_id = self._next_id
        since = self._log_offset()
        phase = "start"
        assert self.proc.stdin is not None
        try:
            msg = {"op": "run", "id": case_id, "case": case.to_dict(), "opts": opts}
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it is dead: the read below sees EOF and reports how it died
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._next(deadline)
            except TimeoutError:
                self.kill()
                tail = self.stderr_tail(since)
                reason = f"no result after {timeout:g} s (phase: {phase}); worker killed"
                raise WorkerError(
                    TIMEOUT, reason + (f"; stderr tail:\n{tail}" if tail else ""), phase
                ) from None
            if reply is None:
                how = self._death()
                tail = self.stderr_tail(since)
                reason = f"worker {how} during {phase}" + (f" ({_headline(tail)})" if tail else "")
                raise WorkerError(CRASH, reason + (f"; stderr tail:\n{tail}" if tail else ""), phase)
            if reply.get("id") != case_id:
                continue
            if reply.get("op") == "phase":
                phase = str(reply.get("phase"))
            elif reply.get("op") == "result":
                return reply["row"], bool(reply.get("fatal"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (its compile subprocesses too)."""
        worker_process.kill_group(self.proc, wait_s=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, AssertionError):
                pass
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._log.close()


def _headline(tail: str) -> str:
    """The line of a stderr tail that says what went wrong: a traceback's last exception line, a fatal error."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line[:300]
    for line in lines:
        if "rror" in line or "Fatal" in line or "Abort" in line or "fault" in line:
            return line[:300]
    return lines[-1][:300] if lines else ""


class Shared:
    """What the threads of a multi-GPU run share: the rows-file lock, a stop flag and the live workers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._workers: list[Worker] = []

    def add(self, worker: Worker) -> None:
        with self.lock:
            self._workers.append(worker)

    def stop_all(self) -> None:
        """Stop every thread after its current case, killing the workers so none waits out a long case."""
        self.stop.set()
        with self.lock:
            workers = list(self._workers)
        for worker in workers:
            worker.kill()


def describe(device: str, kernels: tuple[str, ...]) -> Worker:
    """Start a worker, wait for its description (facts, providers), and stop it."""
    worker = Worker(device, kernels, None, describe=True)
    try:
        worker.wait_ready()
    finally:
        worker.close()
    return worker


# --- the run directory ------------------------------------------------------------------------------------


def prepare_run_dir(run_dir: Path, resume: bool, force: bool) -> None:
    """Refuse to overwrite a run without --force; with --resume keep it (and repair a torn last line)."""
    check_writable_dir(run_dir, "--out")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if force and not resume:
            for name in (ROWS_FILE, ENV_FILE):
                (run_dir / name).unlink(missing_ok=True)
        elif not resume:
            raise FlashbenchError(
                f"run directory {run_dir} is not empty: add --resume to continue it or --force to start over"
            )
    make_dir(run_dir, "--out")
    repair_torn_tail(run_dir / ROWS_FILE)


def repair_torn_tail(path: Path) -> None:
    """Cut a half-written last line (kill -9 mid-append), so the next append starts on a fresh line."""
    if not path.is_file():
        return
    with path.open("rb+") as fh:
        data = fh.read()
        if not data or data.endswith(b"\n"):
            return
        fh.truncate(data.rfind(b"\n") + 1)
        fh.flush()
        os.fsync(fh.fileno())


def finished_rows(run_dir: Path) -> dict[str, Row]:
    """Rows already on disk whose answer is final (crash/timeout are retried by --resume)."""
    if not (run_dir / ROWS_FILE).is_file():
        return {}
    return {r.key: r for r in read_rows(run_dir) if r.status not in RETRY_STATUSES}


# --- the loop ---------------------------------------------------------------------------------------------


def _shape(case: Case) -> tuple[Any, ...]:
    """What an OOM at one N carries over to larger N: everything but the lengths and the batch (a paged cache's
    OOM says nothing about a contiguous one, nor one query token's about sixteen, nor one window's about
    another)."""
    fixed = (case.provider, case.heads, case.kv_heads, case.head_dim, case.dtype, case.causal, case.mode)
    serving = (
        case.kv_layout,
        case.page_size,
        case.seqlens,
        case.seed,
        case.window,
        case.min_seq,
        case.kv_dtype,
    )
    return (*fixed, case.seq_q if case.seq_q != case.seq_k else None, *serving)


class _Skips:
    """After an OOM (or a timeout) at N, larger N of the same provider and shape, with no fewer tokens, are
    skipped: they need at least as much memory (time). A timeout is retried by --resume, and so are the
    cases it caused to be skipped."""

    def __init__(self) -> None:
        self.first: dict[tuple[Any, ...], Row] = {}

    def note(self, row: Row) -> None:
        if row.status in (OOM, TIMEOUT):
            known = self.first.get(_shape(row.case))
            if known is None or row.seq_k < known.seq_k:
                self.first[_shape(row.case)] = row

    def reason(self, case: Case) -> str | None:
        cause = self.first.get(_shape(case))
        if cause is None or case.seq_k <= cause.seq_k or case.batch * case.seq_q < cause.batch * cause.seq_q:
            return None
        what = "ran out of memory" if cause.status == OOM else "timed out"
        return f"{case.provider} {what} at N={cause.seq_k} (batch {cause.batch}) for this shape"


def _predicted_mem(item: PlannedCase, data: dict[str, Any]) -> int | None:
    """The plan's memory prediction, plus what the row's kernel_config says the kernel allocated beyond its
    provider's declared workspace (memory.reported_workspace_bytes)."""
    if item.predicted_mem_bytes is None:
        return None
    c = item.case
    extra = reported_workspace_bytes(data.get("kernel_config"), c.batch, c.heads, c.seq_q, c.head_dim, c.mode)
    return item.predicted_mem_bytes + extra


def run_cases(
    planned: list[PlannedCase] | Deal,
    run_dir: Path,
    *,
    device: str,
    kernels: tuple[str, ...],
    opts: dict[str, Any],
    timeout_s: float,
    worker: Worker | None,
    gpu: str = "",
    on_row: Callable[[Row, bool], None] | None = None,
    ncu: Callable[[Case], dict[str, Any]] | None = None,
    done: dict[str, Row] | None = None,
    visible: str | None = None,
    shared: Shared | None = None,
    ready: Callable[[Case], bool] | None = None,
) -> list[Row]:
    """Run every planned case not already final in run_dir; append a row per case; return the rows of the cases
    this loop took (`planned` a list: all of them, in its order).

    `planned` a Deal, and `done` (finished_rows, read once by the caller), `visible` (the device this worker is
    pinned to) and `shared` (the rows-file lock and stop flag) are run_parallel's: one call per GPU, in threads,
    all taking from the one Deal. `ready` (the compile-once step's, precompile.Step.ready) picks the order: see
    Deal.
    """
    deal = planned if isinstance(planned, Deal) else Deal.in_order(planned)
    taken: list[str] = []
    done = finished_rows(run_dir) if done is None else dict(done)
    gpu_index = int(visible) if visible is not None and visible.isdigit() else None
    lock = shared.lock if shared is not None else contextlib.nullcontext()

    def emit(row: Row, resumed: bool) -> None:
        with lock:  # only this (parent) process writes rows.jsonl; threads take turns
            if not resumed:
                append_row(run_dir, row)
            if on_row:
                on_row(row, resumed)

    # skipped rows stand only while their cause does (a retried timeout may now pass)
    earlier_skips = {k: r for k, r in done.items() if r.status == SKIPPED}
    for key in earlier_skips:
        del done[key]
    skips = deal.skips
    for row in done.values():
        skips.note(row)
    try:
        for item in deal.cases(ready):
            if shared is not None and shared.stop.is_set():
                break
            case = item.case
            taken.append(case.key)
            if case.key in done:
                emit(done[case.key], True)
                continue
            skip = skips.reason(case) if item.status is None else None
            if skip and case.key in earlier_skips:
                done[case.key] = earlier_skips[case.key]
                emit(done[case.key], True)
                continue
            common = {
                "device": device,
                "gpu": gpu,
                "predicted_mem_bytes": item.predicted_mem_bytes,
                "family": item.family,
            }
            if item.status is not None:
                row = Row.for_case(case, item.status, reason=item.reason, timestamp=time.time(), **common)
            elif skip:
                row = Row.for_case(case, SKIPPED, reason=skip, timestamp=time.time(), **common)
            else:
                if worker is None or not worker.alive():
                    if worker is not None:
                        worker.close()
                    worker = Worker(device, kernels, None, visible=visible)
                    if shared is not None:
                        shared.add(worker)
                if not worker.ready:  # new, or started by the caller before the plan
                    worker.wait_ready()
                    gpu = str(worker.facts.get("gpu", gpu))
                    common["gpu"] = gpu
                    if visible is not None and isinstance(worker.facts.get("nvml_index"), int):
                        gpu_index = worker.facts["nvml_index"]  # NVML's own, for a UUID entry too
                try:
                    data, fatal = worker.run(case, opts, timeout_s)
                    row = Row.from_dict({**data, "predicted_mem_bytes": _predicted_mem(item, data)})
                    if fatal:
                        worker.close()
                        worker = None
                except WorkerError as exc:
                    assert worker is not None  # raised by worker.run, before the fatal branch could drop it
                    worker.close()
                    worker = None
                    if shared is not None and shared.stop.is_set():
                        break  # killed because the run stops (Ctrl-C, another GPU failed): not a crash
                    row = Row.for_case(case, exc.status, reason=exc.reason, timestamp=time.time(), **common)
                if ncu is not None and row.status == "ok":
                    for key, value in ncu(case).items():
                        setattr(row, key, value)
            row.gpu_index = gpu_index
            emit(row, False)
            skips.note(row)
            done[case.key] = row
    finally:
        if worker is not None:
            worker.close()
    keys = [p.case.key for p in planned] if isinstance(planned, list) else taken
    return [done[key] for key in keys if key in done]


class Deal:
    """The shapes a run's loops take one at a time: a group is a run of planned cases of one shape (one case under
    --order provider, a shape's providers back to back under --order case; under --gpus every case of a shape).
    Each loop (run_cases) asks for its next group when it has finished the one before; under --gpus every GPU's
    loop takes from one Deal (parallel.run_parallel), so a GPU that finishes early takes more and the GPUs end
    together however far the predicted costs miss. `ready` (the compile-once step's, precompile.Step.ready): a
    group whose cases would wait for kernel builds still compiling elsewhere goes after the first group that would
    not, so the GPU measures while the builds compile; where none is ready, the first goes (it waits, or compiles
    its own builds); once the step is over every group is ready and the groups go in order. Deferred groups keep
    their order. The OOM/timeout skips (`skips`) are the Deal's: one GPU's OOM at N skips a larger N on another."""

    def __init__(self, groups: list[list[PlannedCase]]) -> None:
        self._groups = list(groups)
        self._lock = threading.Lock()
        self.skips = _Skips()

    @classmethod
    def in_order(cls, planned: list[PlannedCase]) -> Deal:
        """`planned` in its order, a group per run of consecutive cases of one shape."""
        return cls(
            [list(group) for _, group in itertools.groupby(planned, key=lambda item: item.case.shape_key)]
        )

    def take(self, ready: Callable[[Case], bool] | None) -> list[PlannedCase] | None:
        """The next group (None once every group is taken)."""
        with self._lock:
            if not self._groups:
                return None
            pick = 0
            if ready is not None:
                pick = next(
                    (i for i, group in enumerate(self._groups) if all(ready(p.case) for p in group)), 0
                )
            return self._groups.pop(pick)

    def cases(self, ready: Callable[[Case], bool] | None) -> Iterator[PlannedCase]:
        while (group := self.take(ready)) is not None:
            yield from group


def options(spec: Any) -> dict[str, Any]:
    """The measurement options a worker needs, from a SweepSpec."""
    keys = (*(f.name for f in fields(timing.Regime)), "cuda_graph", "ref_flops_limit")
    data = asdict(spec)
    return {k: data[k] for k in keys}

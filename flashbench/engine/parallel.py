"""--gpus: one worker per GPU of this host, each running runner.run_cases in a thread of this process, all taking
shapes from one runner.Deal (costliest first, each to whichever GPU is free); the rows-file lock, the stop flag
and the live workers are shared."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashbench.engine import shard
from flashbench.engine.runner import Deal, Shared, Worker, finished_rows, run_cases
from flashbench.results.rows import Row
from flashbench.spec.cases import Case
from flashbench.spec.plan import PlannedCase


def run_parallel(
    planned: list[PlannedCase],
    run_dir: Path,
    *,
    devices: list[str],
    device: str,
    kernels: tuple[str, ...],
    opts: dict[str, Any],
    timeout_s: float,
    worker: Worker | None,
    others: list[Worker] | None = None,
    gpu: str = "",
    on_row: Callable[[Row, bool], None] | None = None,
    ncu: Callable[[Case], dict[str, Any]] | None = None,
    first_after: threading.Event | None = None,
    ready: Callable[[Case], bool] | None = None,
) -> list[Row]:
    """--gpus: one worker per entry of `devices` (its CUDA_VISIBLE_DEVICES), each running run_cases in a thread of
    this process over the shapes it takes from one Deal: the shapes costliest first (shard.by_shape, all providers
    of a shape on one device), each taken by the first GPU to finish its last one.

    `worker`, when given, must already be pinned to devices[0]; it starts taking shapes once `first_after` is set
    where given (devices[0] is busy with something no sample may share: the compile-once step's record).
    `others`, when given, are the workers of devices[1:], started (ready or not) and pinned in that order.
    `ready` defers shapes whose builds still compile (runner.Deal). Rows from every thread are appended by this
    process under one lock. A failure in one thread stops the others.
    """
    done = finished_rows(run_dir)
    deal = Deal(shard.by_shape(planned, settings=opts))
    shared = Shared()
    started: list[Worker | None] = [worker, *(others or [])]
    started += [None] * (len(devices) - len(started))
    for w in started:
        if w is not None:
            shared.add(w)
    results: list[list[Row]] = [[] for _ in devices]
    errors: list[BaseException] = []

    def work(j: int) -> None:
        try:
            if j == 0 and first_after is not None:
                while not first_after.wait(0.2) and not shared.stop.is_set():
                    pass
            results[j] = run_cases(
                deal,
                run_dir,
                device=device,
                kernels=kernels,
                opts=opts,
                timeout_s=timeout_s,
                worker=started[j],
                gpu=gpu,
                on_row=on_row,
                ncu=ncu,
                done=done,
                visible=devices[j],
                shared=shared,
                ready=ready,
            )
        except BaseException as exc:  # re-raised in the parent thread below
            errors.append(exc)
            shared.stop_all()

    threads = [
        threading.Thread(target=work, args=(j,), name=f"flashbench-device-{dev}", daemon=True)
        for j, dev in enumerate(devices)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)  # a timed join keeps Ctrl-C deliverable to this thread
    except BaseException:
        shared.stop_all()
        for thread in threads:
            thread.join(60)
        raise
    if errors:
        raise errors[0]
    by_key = {row.key: row for rows in results for row in rows}
    return [by_key[p.case.key] for p in planned if p.case.key in by_key]

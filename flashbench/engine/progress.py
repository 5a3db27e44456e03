"""Sweep progress on stderr: a rich bar with ETA on a terminal, one plain line per case otherwise (CI logs)."""

from __future__ import annotations

import sys
from typing import Any

from flashbench.results.rows import OK, Row
from flashbench.spec.cases import mask_label


def describe_case(row: Row) -> str:
    return (
        f"{row.provider} b{row.batch} h{row.heads}"
        + (f"/kv{row.kv_heads}" if row.kv_heads != row.heads else "")
        + f" d{row.head_dim} {row.dtype} {mask_label(row.causal)}"
        + (f" window {row.window}" if row.window else "")
        + f" {row.mode} N={row.seq_k}"
    )


def describe_outcome(row: Row) -> str:
    if row.status == OK and row.median_ms is not None:
        unit = "CPU ms" if row.device == "cpu" else "ms"
        speed = f", {row.tflops:.1f} TFLOP/s" if row.tflops is not None and row.device != "cpu" else ""
        return f"ok {row.median_ms:.4g} {unit}{speed}"
    first = (row.reason or "").strip().splitlines()[0] if row.reason else ""
    return f"{row.status}: {first[:120]}" if first else row.status


class Progress:
    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.enabled, self.count = total, enabled, 0
        self._bar: Any = None
        self._task: Any = None
        if not enabled:
            return
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=console,
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=total)

    def note(self, message: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def advance(self, row: Row, resumed: bool) -> None:
        self.count += 1
        if not self.enabled:
            return
        text = f"{describe_case(row)}: {'done before' if resumed else describe_outcome(row)}"
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=text[:80])
            if not resumed and row.status != OK:
                self._bar.console.print(f"  {text}")
        elif not resumed:
            width = len(str(self.total))
            print(f"[{self.count:>{width}}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()

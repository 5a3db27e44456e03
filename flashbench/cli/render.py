"""Terminal tables shared by the commands: the console's width, name columns that are never cut, and the
sweep's result tables.

Names (providers, case keys) are what users type back into flags, so a table never truncates them: the name
column does not wrap and is as wide as its longest name; every other column folds instead when the terminal
is narrow. Off a terminal (CI logs, pipes) tables are 200 columns wide unless $COLUMNS says otherwise.

A sweep's table shows each group's headline unit: TFLOP/s for training cases, GB/s for serving cases (a decode
does ~H/Hkv FLOP per byte: its 3-10 TFLOP/s say nothing, its bytes/s against the bandwidth say everything), CPU
ms on the CPU. A cell is marked * where the GPU throttled and † where the row is host-bound (an eager loop pays
more per call than the GPU works).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from flashbench.results.rows import OK, Row
from flashbench.spec.cases import mask_label

LOG_WIDTH = 200  # off a terminal: wide enough that case keys and tables do not fold in CI logs


def console(*, stderr: bool = False) -> Console:
    """A rich Console: the terminal's width; off a terminal $COLUMNS when set, else LOG_WIDTH."""
    probe = Console(stderr=stderr, highlight=False)
    if probe.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return probe  # rich reads $COLUMNS itself
    return Console(stderr=stderr, highlight=False, width=LOG_WIDTH)


def name_column(table: Table, header: str, names: Iterable[str]) -> None:
    """The column of names: never wrapped, never shorter than its longest name."""
    widest = max((len(n) for n in names), default=0)
    table.add_column(header, no_wrap=True, min_width=max(widest, len(header)))


def folding_column(table: Table, header: str, **kw: Any) -> None:
    """Any other column: folds its text when the terminal is too narrow for the table."""
    table.add_column(header, overflow="fold", **kw)


# A status in a cell of the sweep's table, in few letters.
SHORT = {
    "wrong": "WRONG",
    "oom": "oom",
    "predicted-oom": "pred-oom",
    "unsupported": "unsup",
    "unavailable": "n/a",
    "crash": "crash",
    "timeout": "timeout",
    "skipped": "skip",
}


def serving_row(row: Row) -> bool:
    """A serving case (analysis.serving.serving_mask's rule on one Row): judged on GB/s."""
    return row.seq_q != row.seq_k or row.kv_layout != "contiguous" or row.case.ragged


def gb_s(row: Row) -> float | None:
    """The row's achieved GB/s: its provider's modelled DRAM bytes (analysis.modelled.provider_bytes, the report's
    number) over the median time; None where the model refuses the shape."""
    from flashbench.analysis.modelled import provider_bytes

    if not row.median_ms:
        return None
    try:
        return provider_bytes(row.case, row.family, row.kernel_config) / (row.median_ms * 1e-3) / 1e9
    except (ValueError, TypeError, ZeroDivisionError):
        return None


def _cell(row: Row, unit: str) -> str:
    if row.status != OK:
        return SHORT.get(row.status, row.status)
    mark = ("*" if row.throttled else "") + ("†" if row.host_bound else "")
    if unit == "CPU ms":
        return f"{row.median_ms:.3g}{mark}"
    if unit == "GB/s":
        value = gb_s(row)
        return f"{value:.0f}{mark}" if value is not None else f"{row.median_ms:.3g} ms{mark}"
    return f"{row.tflops:.1f}{mark}" if row.tflops is not None else f"{row.median_ms:.3g} ms{mark}"


def render_tables(rows: list[Row], tokens: int | None = None) -> None:
    """One table per shape group: providers x N (the KV length), TFLOP/s or GB/s (median) or the status."""
    out = console()
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for row in rows:
        # a serving case's table: its query tokens, KV layout and lengths (training: seq_q = N, none of these)
        serving = " ".join(row.case.key.split("|")[10:])
        nq = f" Nq={row.seq_q}" if row.seq_q != row.seq_k else ""
        groups[(row.dtype, row.head_dim, row.heads, row.kv_heads, row.causal, row.mode, nq, serving)].append(
            row
        )
    units = set()
    for (dtype, d, h, kv, causal, mode, nq, serving), members in groups.items():
        cpu = all(r.device == "cpu" for r in members)
        unit = "CPU ms" if cpu else ("GB/s" if all(serving_row(r) for r in members) else "TFLOP/s")
        units.add(unit)
        seqs = sorted({r.seq_k for r in members})
        gqa = f"/kv{kv}" if kv != h else ""
        title = f"{dtype} d={d} H={h}{gqa} {mask_label(causal)} {mode}{nq}" + (
            f" {serving}" if serving else ""
        )
        table = Table(title=title, title_justify="left")
        by_provider: dict[str, dict[int, Row]] = defaultdict(dict)
        for r in members:
            by_provider[r.provider][r.seq_k] = r
        name_column(table, f"{unit} (median)", by_provider)
        for n in seqs:
            folding_column(table, f"N={n}", justify="right")
        for provider, cells in by_provider.items():
            table.add_row(provider, *(_cell(cells[n], unit) if n in cells else "" for n in seqs))
        out.print(table)
    if not rows:
        return
    batch = f"; batch = max(1, {tokens} // N)" if tokens else ""
    if units == {"CPU ms"}:
        out.print(f"CPU ms: median time per call on the CPU{batch}")
        return
    notes = []
    if "TFLOP/s" in units:
        notes.append("FLOPs: forward 4*B*H*d*(unmasked pairs), bwd 2.5x, fwd+bwd 3.5x")
    if "GB/s" in units:
        notes.append(
            "GB/s: the byte model's DRAM bytes (the KV cache read once per KV head) / median time; N = KV length"
        )
    notes.append("* = GPU throttled during the case")
    if any(r.host_bound for r in rows):
        notes.append("† = host-bound (an eager loop pays more per call than the GPU works)")
    out.print("; ".join(notes) + batch)


def word_table(
    title: str, headers: list[str], rows: list[list[str]], width: int, right: Iterable[int] = ()
) -> Table:
    """A table of plain cells that fits `width` columns where its words can: column 0 (names) never wraps,
    every other cell wraps between words and never inside one, and no box (a boxed table's dividers cost
    an 80-column terminal its last column). `right`: the columns to right-justify (numbers)."""
    table = Table(title=title, title_justify="left", box=None, header_style="bold underline")
    cells = [[Text.from_markup(cell).plain for cell in row] for row in [headers, *rows]]
    lows = [max(len(word) for row in cells for word in row[j].split() or [""]) for j in range(len(headers))]
    lows[0] = max(len(row[0]) for row in cells)
    highs = [max(len(" ".join(row[j].split())) for row in cells) for j in range(len(headers))]
    widths = fitted_widths(lows, highs, width - 2 * len(headers))  # 2: a column's padding, one each side
    righted = set(right)
    for j, header in enumerate(headers):
        table.add_column(
            header,
            no_wrap=j == 0,
            overflow="fold",
            width=widths[j],
            justify="right" if j in righted else "left",
        )
    for row in rows:
        table.add_row(*row)
    return table


def fitted_widths(lows: list[int], highs: list[int], room: int) -> list[int]:
    """Column widths in `room` characters, column 0 (the names) at its low whatever the room.

    The others: at least their low (a column's longest word, so that a cell wraps between words, never inside
    one) and at most their high (its longest cell), the room left over the lows given in proportion to how much
    more each could use. Where even the lows do not fit, the others share what the names leave, in proportion
    to their lows, at least 1 each: the last resort folds words, and the names stay whole.
    """
    spare = room - sum(lows)
    if spare < 0:
        rest, total = max(room - lows[0], len(lows) - 1), sum(lows[1:]) or 1
        return [lows[0], *(max(1, rest * low // total) for low in lows[1:])]
    wants = [high - low for low, high in zip(lows, highs, strict=True)]
    if not any(wants):
        return list(lows)
    if spare >= sum(wants):
        return list(highs)
    widths = [low + spare * want // sum(wants) for low, want in zip(lows, wants, strict=True)]
    for j in sorted(range(len(widths)), key=lambda j: wants[j], reverse=True)[: room - sum(widths)]:
        widths[j] += 1  # the rounding's remainder, to the columns that want the most
    return widths

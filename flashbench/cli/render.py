"""Terminal tables shared by the commands: the console's width, and name columns that are never cut.

Names (providers, case keys) are what users type back into flags, so a table never truncates them: the name
column does not wrap and is as wide as its longest name; every other column folds instead when the terminal
is narrow. Off a terminal (CI logs, pipes) tables are 200 columns wide unless $COLUMNS says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

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
    for j, header in enumerate(headers):
        justify = "right" if j in set(right) else "left"
        table.add_column(header, no_wrap=j == 0, overflow="fold", width=widths[j], justify=justify)
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

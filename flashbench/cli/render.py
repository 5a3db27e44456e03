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

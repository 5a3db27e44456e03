"""`flashbench merge`: the shards of one sweep (`sweep --shard i/n`) as one run directory."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer

from flashbench.errors import plural


def merge_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories of `flashbench sweep --shard i/n`.")],
    out: Annotated[Path, typer.Option("--out", help="The merged run directory (env.json + rows.jsonl).")],
    force: Annotated[bool, typer.Option("--force", help="Replace the results in a non-empty --out.")] = False,
) -> None:
    """Combine shard runs of one sweep; refuses runs of other sweeps or flashbench versions."""
    from flashbench.results.merge import merge

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = merge([str(r) for r in runs], out, force=force)
    for warning in caught:
        print(f"flashbench: warning: {warning.message}", file=sys.stderr)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result.env.status_counts.items()))
    present = len(result.env.shards_present)
    print(
        f"merged {present}/{result.env.shard_count} shards: {plural(len(result.rows), 'case')} ({counts}) "
        f"in {result.run_dir}"
    )


def register(app: typer.Typer) -> None:
    app.command("merge")(merge_command)

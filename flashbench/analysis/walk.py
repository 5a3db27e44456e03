"""How the bundled Gluon forward's persistent walk fills the SMs, row by row.

One program per SM walks the tiles (query blocks of a head): round-robin, or from the host's list schedule (LPT).
The walk ends when its most loaded program does, so a tile count that does not divide into the programs, or tiles
of unequal cost (a causal mask, a part-empty first tile) leave SMs idle at the end, however fast each tile runs.
This reads each row's reported kernel_config through the kernel's own schedule model (flash_ws.walk_load: a tile
costs its key blocks plus half of one, TILE_COST), so the numbers are the model's, not a measurement: tiles,
programs, rounds (tiles per program) and the mean program's work over the most loaded one's, the share of the
programs' time the model fills (1.0: every program ends together).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flashbench.analysis.summary import case_words
from flashbench.spec.window import parse_window

if TYPE_CHECKING:
    import pandas as pd

WALK_RULE = (
    "The bundled Gluon forward's persistent walk (one program per SM, over the tiles: a head's query blocks) ends "
    "with its most loaded program. filled = the mean program's work / the most loaded one's, in the kernel's own "
    "schedule model (flash_ws.walk_load: a tile costs its key blocks plus half of one): the share of the SMs' time "
    "the walk holds work, a modelled ceiling no faster tile lifts. Below 1: a tile count the programs do not divide "
    "(15.5 rounds leave half the SMs idle for the last one) or tiles of unequal cost (a causal mask, a part-empty "
    "first tile). Round-robin deals tile t to program t % programs; list-scheduled, the host hands each tile "
    "to the least loaded program, one group of heads after another (under a causal mask, its longest tiles first), "
    "then trades tiles between the most and the least loaded programs while that evens them."
)

WALK_FORMATS = {"rounds": ".2f", "filled": ".3f", "TFLOP/s": ".1f"}


def walk_table(frame: pd.DataFrame, sm_count: int | None) -> pd.DataFrame:
    """Per ok forward row of a persistent Gluon walk (kernel_config "gluon-ws", PERSISTENT 1; not a packed batch,
    not a serving row): the case, its walk, tiles, programs, rounds, filled (WALK_RULE) and TFLOP/s, the least
    filled first. Empty without the SM count, or where the kernels cannot be imported (no Triton)."""
    import pandas as pd

    rows = frame[frame["ok"] & frame["mode"].eq("fwd") & ~frame["serving"] & frame["min_seq"].fillna(0).eq(0)]
    rows = rows[rows["kernel_config"].str.contains('"gluon-ws"', regex=False)]
    if not sm_count or rows.empty:
        return pd.DataFrame()
    try:
        from flashbench.kernels.flash_ws import walk_load
    except ImportError:  # the report of a run can be built where Triton is not installed
        return pd.DataFrame()
    out = []
    for row in rows.to_dict("records"):
        cfg: dict[str, Any] = json.loads(row["kernel_config"])
        window = parse_window(row["window"])
        try:
            load = walk_load(
                int(row["batch"]),
                int(row["heads"]),
                int(row["seq_q"]),
                int(row["seq_k"]),
                bool(row["causal"]) or window is not None,
                cfg,
                sm_count,
                window[0] if window is not None else -1,
            )
        except (KeyError, TypeError, ValueError):  # a config this model cannot read (no tile keys): no line
            continue
        if load is None:
            continue
        tiles, programs, busiest, mean = load
        out.append(
            {
                "provider": row["provider"],
                "case": f"{row['dtype']} {case_words(row)}"
                + (f" · {row['variant']}" if row["variant"] else ""),
                "walk": f"list-scheduled, {_heads(cfg['SCHED_HEADS'])}" if cfg.get("LPT") else "round-robin",
                "tiles": tiles,
                "programs": programs,
                "rounds": tiles / programs,
                "filled": mean / busiest,
                "TFLOP/s": row["tflops"],
            }
        )
    if not out:
        return pd.DataFrame()
    return pd.DataFrame(out).sort_values("filled", kind="stable").reset_index(drop=True)


def _heads(group: int) -> str:
    """The list schedule's group of heads (SCHED_HEADS), in words."""
    return "one head" if group == 1 else f"groups of {group} heads"


def sm_count_of(env: Any, gpu_spec: Any) -> int | None:
    """The SMs the run's kernels saw: the worker's own count (torch's multi_processor_count), else the spec
    table's for the GPU."""
    count = (getattr(env, "worker", None) or {}).get("sm_count")
    if count:
        return int(count)
    return getattr(gpu_spec, "sm_count", None)

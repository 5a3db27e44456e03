"""What a caller's loop pays beside what the GPU works: host time, the eager loop's time per call, host-bound
cases, and the energy per call, from the rows' own fields (engine/timing.py measures them; docs/measuring.md).

Three times per call, as NVBench reports them: the GPU time (median_ms: the samples, behind a spin kernel so host
launch gaps do not count), the host (CPU) time to enqueue one call (host_ms), and the per-call time of
back-to-back calls with one sync and no spin kernel (loop_ms: what a user's eager loop pays). A row whose loop
time exceeds the GPU's work in the loop (loop_gpu_ms: calls held back to back, no flush; older rows: median_ms;
the frame's gpu_in_loop_ms) by more than the sweep's margin says host_bound; these numbers only read that flag and
the times, they never re-decide it. Rows written before these were measured have none: nothing is said of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashbench.analysis.summary import case_words

if TYPE_CHECKING:
    import pandas as pd

MAX_WHERE = 3  # host-bound cases named per provider before "… N more"


@dataclass(frozen=True)
class HostLine:
    """One provider's host-time story: how many of its measured cases were host-bound, where, and the case
    whose eager loop paid the most over its GPU time."""

    provider: str
    measured: int  # ok rows with a loop time
    host_bound: int
    where: tuple[str, ...]  # the host-bound cases in words, smallest first
    worst_at: str  # the case with the largest loop / GPU time
    worst_loop_ms: float
    worst_gpu_ms: float  # the GPU's work per call in that loop (gpu_in_loop_ms)
    worst_host_ms: float  # host time to enqueue one call in that case (NaN where not recorded)
    timed_as: str  # "eager", "CUDA graph", or both

    @property
    def worst_ratio(self) -> float:
        return self.worst_loop_ms / self.worst_gpu_ms


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok rows that carry a loop time."""
    return frame[frame["ok"] & frame["loop_ms"].notna() & frame["median_ms"].notna()]


def host_lines(frame: pd.DataFrame) -> list[HostLine]:
    """Per provider with measured rows, in first-seen order: HostLine."""
    rows = measured(frame)
    out = []
    for provider, grp in rows.groupby("provider", sort=False):
        worst = grp.loc[grp["loop_over_gpu"].idxmax()]
        bound = grp[grp["host_bound"].eq(True)].sort_values(["mode", "seq_k", "head_dim"])
        out.append(
            HostLine(
                provider=str(provider),
                measured=len(grp),
                host_bound=len(bound),
                where=tuple(f"{r['mode']} {case_words(r)}" for r in bound.to_dict("records")),
                worst_at=f"{worst['mode']} {case_words(worst)}",
                worst_loop_ms=float(worst["loop_ms"]),
                worst_gpu_ms=float(worst["gpu_in_loop_ms"]),
                worst_host_ms=float(worst["host_ms"]),
                timed_as=" + ".join(sorted(set(grp["timed_as"]))),
            )
        )
    return out


def host_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Every measured row: the case, how it was timed, GPU time (the samples' and in the loop), host and loop
    time, loop / GPU in the loop, host-bound, the joules per call and the work per joule; host-bound rows first,
    then the largest loop / GPU."""
    rows = measured(frame)
    out = rows.assign(case=[f"{r['mode']} {case_words(r)}" for r in rows.to_dict("records")])
    cols = {
        "provider": "provider",
        "case": "case",
        "timed_as": "timed as",
        "median_ms": "GPU ms",
        "gpu_in_loop_ms": "GPU ms in the loop",
        "host_ms": "host ms",
        "loop_ms": "loop ms",
        "loop_over_gpu": "loop / GPU",
        "host_bound": "host-bound",
        "energy_j": "J per call",
        "tflop_per_j": "TFLOP/J",
        "tokens_per_j": "tokens/J",
    }
    out = out.sort_values(["host_bound", "loop_over_gpu"], ascending=False, key=_bound_first)
    out = out[list(cols)].rename(columns=cols)
    if rows["serving"].all():
        out = out.drop(columns="TFLOP/J")
    elif not rows["serving"].any():
        out = out.drop(columns="tokens/J")
    return out.reset_index(drop=True)


def _bound_first(col: pd.Series) -> pd.Series:
    return col.eq(True) if col.name == "host_bound" else col

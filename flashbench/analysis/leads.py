"""Who leads each group of cases, by how much, and whether that lead is more than noise and clocks.

Per group of cases (dtype, mode, head dim, mask, serving variant or window): the fastest provider, its margin over
the runner-up (the geometric mean and the range over N of the runner-up's median time / the fastest's), the
noise and SM clocks that margin is judged against (TIE_RULE: a margin inside them is a tie, not a win), the best
% of roofline (of the read bandwidth for a serving group) and the energy per unit of work where measured.
Computed from the tidy frame (analysis.runs); flashbench.report.verdict words it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashbench.analysis.clocks import case_clocks
from flashbench.analysis.serving import case_variants
from flashbench.analysis.summary import MODE_ORDER, n_label, roof_view
from flashbench.spec.cases import mask_label

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Lead:
    """One group of cases (dtype, mode, head dim, mask, variant): the fastest provider and its margin.

    ratios: (N label, runner-up's median time / the fastest's) per shape both measured ok, in N order;
    above 1 the fastest was ahead at that N, below 1 the runner-up was. noise and clock_gap: TIE_RULE's terms.
    """

    dtype: str
    mode: str
    head_dim: int
    causal: bool
    providers: tuple[str, ...]  # providers with ok rows in the group, fastest first
    fastest: str
    runner_up: str | None
    ratios: tuple[tuple[str, float], ...]
    best_pct: float | None = None  # the highest % of roofline in the group (serving: of a bandwidth roof)
    best_pct_provider: str = ""
    best_pct_at: str = ""
    best_pct_bound: str = ""
    variant: str = ""  # a serving cache ("32/8 heads · paged16"), a window ("window 4096,0")
    best_pct_of: str = "roofline"  # what best_pct is a share of: "roofline", "calibrated read BW", ...
    noise: float = float("nan")  # the median over shapes of both rows' p20-p80 half-widths, relative
    fastest_clock: float = float("nan")  # median SM clock (MHz) of the fastest's rows on the shared shapes
    runner_clock: float = float("nan")  # the same for the runner-up
    energy: tuple[tuple[str, float], ...] = ()  # (provider, median TFLOP/J or tokens/J) where measured
    energy_unit: str = ""  # "TFLOP/J" or "tokens/J"

    @property
    def group(self) -> str:
        group = f"{self.mode} · d={self.head_dim} · {mask_label(self.causal)}"
        return f"{group} · {self.variant}" if self.variant else group

    @property
    def geomean(self) -> float:
        return _geomean(r for _, r in self.ratios)

    @property
    def low(self) -> tuple[str, float]:
        return min(self.ratios, key=lambda x: x[1])

    @property
    def high(self) -> tuple[str, float]:
        return max(self.ratios, key=lambda x: x[1])

    @property
    def behind_at(self) -> list[str]:
        """The N at which the runner-up was faster."""
        return [n for n, r in self.ratios if r < 1.0]

    @property
    def clock_gap(self) -> float:
        """How much higher the fastest's SM clock was than the runner-up's (relative; 0 where it was not higher
        or a clock is unknown): a lead that a higher clock alone could give is no lead of the code."""
        gap = self.fastest_clock / self.runner_clock - 1.0
        return max(gap, 0.0) if gap == gap else 0.0

    @property
    def tied(self) -> bool:
        """TIE_RULE: the margin lies within the timing noise plus the clock advantage."""
        if self.runner_up is None or not self.ratios:
            return False
        noise = self.noise if self.noise == self.noise else 0.0
        return self.geomean - 1.0 <= noise + self.clock_gap


TIE_RULE = (
    "tied: the geometric-mean margin (runner-up's median time / the fastest's - 1) is no larger than the "
    "timing noise (per shape, the two rows' p20-p80 half-widths relative to their medians, added; the median "
    "over the shapes) plus how much higher the fastest's median SM clock was than the runner-up's"
)


def _geomean(values: Any) -> float:
    vals = [float(v) for v in values if v == v and v > 0]
    return statistics.geometric_mean(vals) if vals else float("nan")


def _shape_order(frame: pd.DataFrame) -> list[str]:
    """Shape keys in N order (key length, then query length, then batch)."""
    cols = ["seq_k", "seq_q", "batch", "heads", "shape_key"]
    shapes = frame[cols].drop_duplicates("shape_key").sort_values(cols[:-1])
    return list(shapes["shape_key"])


def leads(frame: pd.DataFrame) -> list[Lead]:
    """The fastest provider per (dtype, mode, head dim, mask, variant), with its margin over the closest
    competitor, the noise and clocks that margin is judged against (TIE_RULE), the best % of roofline (of the
    read bandwidth for serving groups) and the energy per unit of work where the rows carry it.

    For every pair of providers, the geometric mean over the shapes both measured ok of one's time over the
    other's. The fastest is the provider whose worst such margin is the largest (it beats every other by at
    least that); the runner-up is the provider that margin is against.
    """
    ok = frame[frame["ok"] & frame["median_ms"].notna()].copy()
    view = roof_view(ok) if len(ok) else None
    out: list[Lead] = []
    ok["variant"] = case_variants(ok)
    ok["clock_mhz"] = case_clocks(ok)["clock_mhz"] if len(ok) else []
    ok["half_width"] = (ok["p80_ms"] - ok["p20_ms"]) / (2 * ok["median_ms"])
    keys = ["dtype", "mode", "head_dim", "causal", "variant"]
    for (dtype, mode, d, causal, variant), grp in ok.groupby(keys, sort=False):
        times = grp.pivot_table(index="shape_key", columns="provider", values="median_ms", aggfunc="first")
        times = times.reindex(_shape_order(grp))
        names = list(dict.fromkeys(grp["provider"]))
        margin: dict[str, tuple[float, str | None]] = {}
        for p in names:
            worst: tuple[float, str | None] = (math.inf, None)
            for q in names:
                if q == p:
                    continue
                both = times[[p, q]].dropna()
                if len(both):
                    worst = min(worst, (_geomean(both[q] / both[p]), q))
            margin[p] = worst
        fastest = max(names, key=lambda p: (margin[p][0], times[p].notna().sum()))
        runner = margin[fastest][1]
        ratios: tuple[tuple[str, float], ...] = ()
        noise = clock_a = clock_b = float("nan")
        if runner is not None:
            both = times[[fastest, runner]].dropna()
            labels = grp.drop_duplicates("shape_key").set_index("shape_key")
            ratios = tuple(
                (_shape_label(labels, key, grp), float(both.at[key, runner] / both.at[key, fastest]))
                for key in both.index
            )
            noise, clock_a, clock_b = _noise_and_clocks(grp, fastest, runner, list(both.index))
        order = sorted(names, key=lambda p: -margin[p][0] if p != fastest else -math.inf)
        serving = bool(grp["serving"].any()) if "serving" in grp else False
        best = _best_bandwidth(grp) if serving else (*_best_pct(grp, view), "roofline")
        unit, column = ("tokens/J", "tokens_per_j") if serving else ("TFLOP/J", "tflop_per_j")
        energy: tuple[tuple[str, float], ...] = ()
        if column in grp and grp[column].notna().any():
            energy = tuple((p, float(grp.loc[grp["provider"] == p, column].median())) for p in order)
        out.append(
            Lead(
                dtype,
                mode,
                int(d),
                bool(causal),
                tuple(order),
                fastest,
                runner,
                ratios,
                *best[:4],
                variant=variant,
                best_pct_of=best[4],
                noise=noise,
                fastest_clock=clock_a,
                runner_clock=clock_b,
                energy=tuple((p, e) for p, e in energy if e == e),
                energy_unit=unit,
            )
        )
    return sorted(
        out, key=lambda x: (x.dtype, MODE_ORDER.get(x.mode, 9), x.mode, x.head_dim, x.causal, x.variant)
    )


def _noise_and_clocks(grp: pd.DataFrame, a: str, b: str, shapes: list[str]) -> tuple[float, float, float]:
    """TIE_RULE's terms for providers a and b on their shared shapes: the median of the summed p20-p80
    half-widths, and each provider's median SM clock (NaN where the rows recorded none)."""
    rows = grp[grp["shape_key"].isin(shapes)].set_index(["provider", "shape_key"])
    widths = [rows.at[(a, k), "half_width"] + rows.at[(b, k), "half_width"] for k in shapes]
    widths = [w for w in widths if w == w]
    clock_a, clock_b = (rows.loc[p, "clock_mhz"].dropna() for p in (a, b))
    return (
        float(statistics.median(widths)) if widths else float("nan"),
        float(clock_a.median()) if len(clock_a) else float("nan"),
        float(clock_b.median()) if len(clock_b) else float("nan"),
    )


def _shape_label(labels: pd.DataFrame, key: str, grp: pd.DataFrame) -> str:
    """N of one shape; with the batch too where the group has two shapes of one N."""
    row = labels.loc[key]
    label = n_label(int(row["seq_q"]), int(row["seq_k"]))
    same_n = grp[(grp["seq_q"] == row["seq_q"]) & (grp["seq_k"] == row["seq_k"])]["shape_key"].nunique()
    return f"{label} (batch {int(row['batch'])})" if same_n > 1 else label


def _best_pct(grp: pd.DataFrame, view: pd.DataFrame | None) -> tuple[float | None, str, str, str]:
    if view is None:
        return None, "", "", ""
    pct = view.loc[grp.index, "roof_pct"].dropna()
    if pct.empty:
        return None, "", "", ""
    i = pct.idxmax()
    row = grp.loc[i]
    return (
        float(pct[i]),
        str(row["provider"]),
        n_label(int(row["seq_q"]), int(row["seq_k"])),
        str(view.at[i, "roof_bound"]),
    )


def _best_bandwidth(grp: pd.DataFrame) -> tuple[float | None, str, str, str, str]:
    """A serving group's best share of a bandwidth roof: of the calibrated read bandwidth where the run has
    one (the roof of a read-mostly decode), else of the datasheet's."""
    for col, what in (("pct_of_read_bw", "calibrated read BW"), ("pct_of_datasheet_bw", "datasheet BW")):
        if col not in grp:
            continue
        pct = grp[col].dropna()
        if len(pct):
            i = pct.idxmax()
            row = grp.loc[i]
            at = f"{n_label(int(row['seq_q']), int(row['seq_k']))} batch {int(row['batch'])}"
            return float(pct[i]), str(row["provider"]), at, f"{row['achieved_gb_s']:.0f} GB/s", what
    return None, "", "", "", "roofline"

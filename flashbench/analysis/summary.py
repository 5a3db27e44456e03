"""What a run says, computed from its rows: the verdict the report leads with.

Per group of cases (dtype, mode, head dim, mask) who is fastest and by how much over the runner-up (the
geometric mean and the range over N of the runner-up's median time / the fastest's), the best % of roofline
and its bound, the speedups over the reference provider, the failures that matter, and a description of what
actually ran (the clocks behind the numbers: analysis.clocks). Nothing here formats HTML or markdown
(flashbench.report.verdict words these); every number is a pure function of the tidy frame (analysis.runs).

Rules that hold everywhere here:
- a provider that is not installed (status "unavailable") is neither a case nor a provider: its rows leave
  before anything is counted;
- shapes are compared on their shape key (batch, heads, seq_q, seq_k, ...): nothing assumes seq_q == seq_k;
- "bound" and "% of roofline" are models.roofline's one rule (roof_view below), never redefined here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashbench.analysis.runs import best_per_provider as best
from flashbench.analysis.runs import speedups
from flashbench.results.rows import (
    CRASH,
    OOM,
    PREDICTED_OOM,
    SKIPPED,
    TIMEOUT,
    UNAVAILABLE,
    UNSUPPORTED,
    WRONG,
)
from flashbench.spec.cases import mask_label

if TYPE_CHECKING:
    import pandas as pd


# Failures a reader must see: the case ran and gave no trustworthy speed.
MATTERING = (WRONG, CRASH, TIMEOUT, OOM)
# Refused or not attempted: listed with their reasons, not alarming.
NOT_RUN = (UNSUPPORTED, PREDICTED_OOM, SKIPPED)
ABOVE_ROOFLINE = "above roofline"  # an ok row faster than physics allows: a measurement or model error
MODE_ORDER = {"fwd": 0, "bwd": 1, "fwd+bwd": 2}


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The run without the rows of providers that are not installed (status unavailable)."""
    return frame[frame["status"] != UNAVAILABLE]


def not_installed(frame: pd.DataFrame) -> list[str]:
    """Providers whose every row says unavailable, in first-seen order."""
    names = dict.fromkeys(frame["provider"])
    present = set(measured(frame)["provider"])
    return [p for p in names if p not in present]


def n_label(seq_q: int, seq_k: int) -> str:
    """N as the axes write it (1k, 16k); a query length other than the key length as Nq×Nk (decode: 1×8k)."""

    def short(n: int) -> str:
        return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)

    return short(seq_q) if seq_q == seq_k else f"{short(seq_q)}×{short(seq_k)}"


# ------------------------------------------------------------------------------------------- bound


def roof_view(frame: pd.DataFrame) -> pd.DataFrame:
    """Per row: models.roofline.BOUND_RULE's intensity (roof_ai), bound (roof_bound) and % of roofline
    (roof_pct), as analysis.modelled.add_roofline computed them (ai_provider, bound, pct_of_roofline): the one
    definition, read here and never recomputed. roof_bound is "" where the run has no roof (a CPU run)."""
    import pandas as pd

    bound = frame["bound"].fillna("").astype(str)
    return pd.DataFrame(
        {
            "roof_ai": frame["ai_provider"].astype(float),
            "roof_bound": bound.where(bound != "nan", ""),
            "roof_pct": frame["pct_of_roofline"].astype(float),
        },
        index=frame.index,
    )


# ------------------------------------------------------------------------------------------ leaders


@dataclass(frozen=True)
class Lead:
    """One group of cases (dtype, mode, head dim, mask): the fastest provider and its margin.

    ratios: (N label, runner-up's median time / the fastest's) per shape both measured ok, in N order;
    above 1 the fastest was ahead at that N, below 1 the runner-up was.
    """

    dtype: str
    mode: str
    head_dim: int
    causal: bool
    providers: tuple[str, ...]  # providers with ok rows in the group, fastest first
    fastest: str
    runner_up: str | None
    ratios: tuple[tuple[str, float], ...]
    best_pct: float | None = None  # the highest % of roofline in the group
    best_pct_provider: str = ""
    best_pct_at: str = ""
    best_pct_bound: str = ""
    variant: str = ""  # a serving cache ("32/8 heads · paged16"), a window ("window 4096,0")

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


def _geomean(values: Any) -> float:
    vals = [float(v) for v in values if v == v and v > 0]
    return statistics.geometric_mean(vals) if vals else float("nan")


def _shape_order(frame: pd.DataFrame) -> list[str]:
    """Shape keys in N order (key length, then query length, then batch)."""
    cols = ["seq_k", "seq_q", "batch", "heads", "shape_key"]
    shapes = frame[cols].drop_duplicates("shape_key").sort_values(cols[:-1])
    return list(shapes["shape_key"])


def leads(frame: pd.DataFrame) -> list[Lead]:
    """The fastest provider per (dtype, mode, head dim, mask), with its margin over the closest competitor.

    For every pair of providers, the geometric mean over the shapes both measured ok of one's time over the
    other's. The fastest is the provider whose worst such margin is the largest (it beats every other by at
    least that); the runner-up is the provider that margin is against.
    """
    ok = frame[frame["ok"] & frame["median_ms"].notna()].copy()
    view = roof_view(ok) if len(ok) else None
    out: list[Lead] = []
    ok["variant"] = case_variants(ok)
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
        if runner is not None:
            both = times[[fastest, runner]].dropna()
            labels = grp.drop_duplicates("shape_key").set_index("shape_key")
            ratios = tuple(
                (_shape_label(labels, key, grp), float(both.at[key, runner] / both.at[key, fastest]))
                for key in both.index
            )
        order = sorted(names, key=lambda p: -margin[p][0] if p != fastest else -math.inf)
        best = _best_pct(grp, view)
        lead = Lead(dtype, mode, int(d), bool(causal), tuple(order), fastest, runner, ratios, *best, variant)
        out.append(lead)
    return sorted(
        out, key=lambda x: (x.dtype, MODE_ORDER.get(x.mode, 9), x.mode, x.head_dim, x.causal, x.variant)
    )


def case_variants(frame: pd.DataFrame) -> pd.Series:
    """Per row, the variant its lead is judged within: the serving cache (cache_variants) and the sliding window,
    so a windowed case is never ranked with a full one."""
    variant = cache_variants(frame)
    if "window" not in frame:
        return variant
    window = frame["window"].fillna("").astype(str)
    words = ("window " + window).where(window != "", "")
    return variant.str.cat(words, sep=" · ").str.strip(" ·")


def cache_variants(frame: pd.DataFrame) -> pd.Series:
    """Per row, the serving variant its lead is judged within: "" for a training sweep; for a run with serving
    rows (seq_q != seq_k, a paged cache or ragged lengths) the heads over KV heads, the cache layout and the
    lengths, so GQA and MHA, contiguous and paged caches are never one group."""
    import pandas as pd

    layout = frame["kv_layout"] if "kv_layout" in frame else pd.Series("contiguous", index=frame.index)
    page = frame["page_size"] if "page_size" in frame else pd.Series(0, index=frame.index)
    lengths = frame["seqlens"] if "seqlens" in frame else pd.Series("uniform", index=frame.index)
    serving = (frame["seq_q"] != frame["seq_k"]) | (layout != "contiguous") | (lengths != "uniform")
    if not serving.any():
        return pd.Series("", index=frame.index)
    words = (
        frame["heads"].astype(int).astype(str) + "/" + frame["kv_heads"].astype(int).astype(str) + " heads"
    )
    words = words + layout.where(layout == "contiguous", "paged" + page.astype(int).astype(str)).radd(" · ")
    return words + lengths.where(lengths == "uniform", " · ragged").where(lengths != "uniform", "")


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


def reference_speedups(frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per mode and provider: the speedup over `reference` (its median time / the provider's, same shape),
    geometric mean over the cases both measured ok and the range, with the group and N of each end."""
    import pandas as pd

    sp = speedups(measured(frame), reference)
    sp = sp[sp["provider"] != reference]
    rows = []
    for (mode, provider), g in sp.groupby(["mode", "provider"], sort=False):
        lo, hi = g.loc[g["speedup"].idxmin()], g.loc[g["speedup"].idxmax()]
        rows.append(
            {
                "mode": mode,
                "provider": provider,
                "cases": len(g),
                "geomean": _geomean(g["speedup"]),
                "min": float(lo["speedup"]),
                "min_at": case_words(lo),
                "max": float(hi["speedup"]),
                "max_at": case_words(hi),
            }
        )
    out = pd.DataFrame(rows)
    if len(out):
        out = out.sort_values(["mode", "geomean"], key=_mode_then_desc).reset_index(drop=True)
    return out


def _mode_then_desc(col: pd.Series) -> pd.Series:
    return col.map(lambda m: MODE_ORDER.get(m, 9)) if col.name == "mode" else -col


def case_words(row: Any) -> str:
    return f"N={n_label(int(row['seq_q']), int(row['seq_k']))} d={row['head_dim']} {mask_label(bool(row['causal']))}"


def best_per_provider(frame: pd.DataFrame) -> pd.DataFrame:
    """analysis.runs.best_per_provider (its % of roofline is the one rule's), columns named for reading;
    without a roofline (CPU runs) that column leaves."""
    out = best(frame)
    if out.empty:
        return out
    out = out.rename(
        columns={
            "time_label": "time",
            "max_tflops": "max TFLOP/s",
            "median_pct_of_roofline": "median % of roofline",
        }
    )
    return out.drop(columns="median % of roofline") if out["median % of roofline"].isna().all() else out


# --------------------------------------------------------------------------------------- failures


def failures_that_matter(frame: pd.DataFrame) -> pd.DataFrame:
    """Cases that ran and gave no trustworthy speed (MATTERING, and ok rows above the roofline), per status and
    provider: how many, at which N, and the first reason."""
    import pandas as pd

    bad = frame[frame["status"].isin(MATTERING) | frame["above_roofline"]].copy()
    bad.loc[bad["above_roofline"], "status"] = ABOVE_ROOFLINE
    bad.loc[bad["above_roofline"], "reason"] = bad.loc[bad["above_roofline"], "roofline_error"]
    rows = []
    for (status, provider), g in bad.groupby(["status", "provider"], sort=False):
        cases = [f"{case_words(r)} {r['mode']}" for r in g.to_dict("records")]
        rows.append(
            {
                "status": status,
                "provider": provider,
                "cases": len(g),
                "where": "; ".join(cases[:4]) + (f"; … {len(cases) - 4} more" if len(cases) > 4 else ""),
                "reason": str(g["reason"].iloc[0]).replace("\n", " ")[:200],
            }
        )
    return pd.DataFrame(rows, columns=["status", "provider", "cases", "where", "reason"])


def not_run_counts(frame: pd.DataFrame) -> dict[str, int]:
    """Cases refused or not attempted (NOT_RUN), by status."""
    counts = frame["status"].value_counts()
    return {s: int(counts[s]) for s in NOT_RUN if counts.get(s, 0)}


# ---------------------------------------------------------------------------------- what ran


def _span(values: list[int]) -> str:
    vals = sorted(set(values))
    if len(vals) <= 3:
        return ", ".join(n_label(v, v) for v in vals)
    return f"{n_label(vals[0], vals[0])}–{n_label(vals[-1], vals[-1])} ({len(vals)} sizes)"


def description(frame: pd.DataFrame) -> list[str]:
    """What actually ran, from the rows (never the preset's text): providers, dtypes, sizes, heads, masks,
    modes. One phrase per item; the not-installed providers are named, not counted."""
    df = measured(frame)
    if df.empty:
        return ["no provider was installed"]
    names = list(dict.fromkeys(df["provider"]))
    out = [f"{len(names)} provider{'s' * (len(names) != 1)} ({', '.join(names)})"]
    out.append(" / ".join(dict.fromkeys(df["dtype"])))
    seq_q, seq_k = df["seq_q"].astype(int), df["seq_k"].astype(int)
    if (seq_q == seq_k).all():
        out.append(f"N = {_span(list(seq_q))}")
    else:
        out.append(f"Nq = {_span(list(seq_q))} over Nk = {_span(list(seq_k))}")
    tokens = (df["batch"] * df["seq_q"]).unique()
    batches = sorted(df["batch"].astype(int).unique())
    if len(batches) > 1 and len(tokens) == 1:
        out.append(
            f"batch × N = {n_label(int(tokens[0]), int(tokens[0]))} tokens (batch {batches[-1]}…{batches[0]})"
        )
    else:
        out.append("batch " + ", ".join(str(b) for b in batches))
    dims = sorted(df["head_dim"].astype(int).unique())
    hidden = (df["heads"] * df["head_dim"]).unique()
    if len(hidden) == 1 and len(dims) > 1:
        out.append(f"d = {', '.join(map(str, dims))} at heads × d = {int(hidden[0])}")
    else:
        heads = sorted(df["heads"].astype(int).unique())
        out.append(f"d = {', '.join(map(str, dims))}, heads {', '.join(map(str, heads))}")
    if (df["kv_heads"] != df["heads"]).any():  # GQA somewhere: every KV-head count that ran
        out.append("kv heads " + ", ".join(str(k) for k in sorted(df["kv_heads"].astype(int).unique())))
    out.append(" and ".join(mask_label(c) for c in sorted(df["causal"].unique(), reverse=True)))
    out.append(", ".join(sorted(dict.fromkeys(df["mode"]), key=lambda m: MODE_ORDER.get(m, 9))))
    return out

"""What a run says, computed from its rows: the parts of the verdict the report leads with besides the leads
(analysis.leads): the speedups over the reference provider, the best per provider, the failures that matter,
and a description of what actually ran. Nothing here formats HTML or markdown (flashbench.report.verdict words
these); every number is a pure function of the tidy frame (analysis.runs).

Rules that hold everywhere here:
- a provider that is not installed (status "unavailable") is neither a case nor a provider: its rows leave
  before anything is counted;
- shapes are compared on their shape key (batch, heads, seq_q, seq_k, ...): nothing assumes seq_q == seq_k;
- "bound" and "% of roofline" are analysis.modelled.ROOF_RULE's one roof per case (roof_view below), never
  redefined here.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

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


def speedups(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per ok case: speedup = baseline's median time / this provider's, on the same shape key."""
    ok = frame[frame["ok"]]
    base = ok[ok["provider"] == baseline][["shape_key", "median_ms"]].rename(
        columns={"median_ms": "baseline_ms"}
    )
    out = ok.merge(base, on="shape_key", how="inner")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    out["baseline_provider"] = baseline
    return out


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
    """Per row: analysis.modelled.ROOF_RULE's intensity (roof_ai: the case's compulsory one), bound (roof_bound)
    and % of roofline (roof_pct), as analysis.modelled.add_roofline computed them: the one definition, read here
    and never recomputed. roof_bound is "" where the run has no roof (a CPU run)."""
    import pandas as pd

    bound = frame["bound"].fillna("").astype(str)
    return pd.DataFrame(
        {
            "roof_ai": frame["ai_compulsory"].astype(float),
            "roof_bound": bound.where(bound != "nan", ""),
            "roof_pct": frame["pct_of_roofline"].astype(float),
        },
        index=frame.index,
    )


def _geomean(values: Any) -> float:
    vals = [float(v) for v in values if v == v and v > 0]
    return statistics.geometric_mean(vals) if vals else float("nan")


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


def shorten(text: Any, width: int) -> str:
    """At most `width` characters, cut at a word boundary with an ellipsis: never mid-word."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + " …"


def case_words(row: Any) -> str:
    return f"N={n_label(int(row['seq_q']), int(row['seq_k']))} d={row['head_dim']} {mask_label(bool(row['causal']))}"


def _best(frame: pd.DataFrame) -> pd.DataFrame:
    """Per provider, dtype and mode of the training rows (serving rows: analysis.serving.best_bandwidth): the
    highest TFLOP/s, where it was reached, the median % of roofline (ROOF_RULE), how the calls were timed, and
    where the rows carry them the median TFLOP per joule and the host-bound cases. Sorted by dtype, mode, then
    the highest TFLOP/s first."""
    import pandas as pd

    ok = frame[frame["ok"] & frame["tflops"].notna() & ~frame["serving"]]
    rows = []
    for (provider, dtype, mode), grp in ok.groupby(["provider", "dtype", "mode"], sort=False):
        top = grp.loc[grp["tflops"].idxmax()]
        pct = grp["pct_of_roofline"].dropna()
        energy = grp["tflop_per_j"].dropna()
        rows.append(
            {
                "provider": provider,
                "dtype": dtype,
                "mode": mode,
                "time_label": top["time_label"],
                "timed_as": " + ".join(sorted(set(grp["timed_as"]))),
                "cases": len(grp),
                "max_tflops": float(top["tflops"]),
                "at": f"N={top['seq_q']} d={top['head_dim']} {mask_label(top['causal'])}",
                "median_pct_of_roofline": float(pct.median()) if len(pct) else float("nan"),
                "median_tflop_per_j": float(energy.median()) if len(energy) else float("nan"),
                "host_bound_cases": host_bound_cases(grp),
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["_mode"] = out["mode"].map(lambda m: MODE_ORDER.get(m, 9))
    out = out.sort_values(["dtype", "_mode", "max_tflops"], ascending=[True, True, False])
    return out.drop(columns="_mode").reset_index(drop=True)


def best_per_provider(frame: pd.DataFrame) -> pd.DataFrame:
    """_best (its % of roofline is ROOF_RULE's), columns named for reading; a column the run has no value for (no
    roofline on a CPU run, no energy or host time in an older run) leaves."""
    out = _best(frame)
    if out.empty:
        return out
    return drop_empty(out.rename(columns=BEST_COLUMNS), OPTIONAL_BEST)


def host_bound_cases(rows: pd.DataFrame) -> str:
    """ "3 of 5": how many of the rows that carry a loop time are host-bound; "" where none carries one."""
    measured = rows["loop_ms"].notna()
    return f"{int(rows['host_bound'].eq(True).sum())} of {int(measured.sum())}" if measured.any() else ""


def drop_empty(table: pd.DataFrame, optional: tuple[str, ...]) -> pd.DataFrame:
    """`table` without those `optional` columns that hold no value in any row (NaN or "")."""
    empty = [c for c in optional if table[c].replace("", float("nan")).isna().all()]
    return table.drop(columns=empty).reset_index(drop=True)


BEST_COLUMNS = {
    "time_label": "time",
    "timed_as": "timed as",
    "max_tflops": "max TFLOP/s",
    "median_pct_of_roofline": "median % of roofline",
    "median_tflop_per_j": "median TFLOP/J",
    "host_bound_cases": "host-bound",
}
OPTIONAL_BEST = ("median % of roofline", "median TFLOP/J", "host-bound")
# How the best tables print their numbers: one precision per column, never a mixture of decimals.
BEST_FORMATS = {"max TFLOP/s": ".1f", "median % of roofline": ".1f", "median TFLOP/J": ".3f"}


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
                "reason": shorten(g["reason"].iloc[0], 200),
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

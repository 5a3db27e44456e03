"""Serving rows (decode: a few new tokens over a KV cache) and the variants cases are judged within.

A serving row is a case with a query length other than its key length (seq_q new tokens over a cache of seq_k
keys), or a paged or ragged cache. It moves its KV cache once and does ~H/Hkv FLOP per byte, two orders of
magnitude under any GPU's ridge, so it is judged on bytes/s against the bandwidth roofs, and its x-axis is the
KV length (with the batch where that changes too), never N = seq_q = 1.

Pure pandas on the tidy frame (analysis.runs.measurements): no plotting, no wording beyond the variant labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashbench.spec.cases import CASE_DEFAULTS, CASE_FIELDS, Case

if TYPE_CHECKING:
    import pandas as pd


def serving_mask(frame: pd.DataFrame) -> pd.Series:
    """Per row: True for a serving case (seq_q != seq_k, a paged cache, or ragged lengths)."""
    import pandas as pd

    layout = frame["kv_layout"] if "kv_layout" in frame else pd.Series("contiguous", index=frame.index)
    lengths = frame["seqlens"] if "seqlens" in frame else pd.Series("uniform", index=frame.index)
    store = frame["kv_dtype"].fillna("") if "kv_dtype" in frame else pd.Series("", index=frame.index)
    ragged = (lengths != "uniform") & ~packed_mask(frame)  # packed documents are a training case
    return (frame["seq_q"] != frame["seq_k"]) | (layout != "contiguous") | ragged | (store != "")


def packed_mask(frame: pd.DataFrame) -> pd.Series:
    """Per row: True for a packed training batch (Case.min_seq > 0: documents of drawn lengths)."""
    import pandas as pd

    min_seq = frame["min_seq"] if "min_seq" in frame else pd.Series(0, index=frame.index)
    return min_seq.fillna(0).astype(int) > 0


def documents_text(case: Case) -> str:
    """What a packed case's lengths were: "packed random [256, 4096] s0: 8 docs, mean 2048"; "" otherwise."""
    lengths = case.documents()
    if not lengths:
        return ""
    mean = sum(lengths) / len(lengths)
    return (
        f"packed {case.seqlens} [{case.min_seq}, {case.seq_k}] s{case.seed}: "
        f"{len(lengths)} docs, mean {mean:.0f}"
    )


def cache_variants(frame: pd.DataFrame) -> pd.Series:
    """Per row, the serving variant its lead is judged within: "" for a training sweep; for a run with serving
    rows the heads over KV heads, the cache layout, the lengths and an FP8 cache, so GQA and MHA, contiguous and
    paged, bf16 and FP8 caches are never one group."""
    import pandas as pd

    layout = frame["kv_layout"] if "kv_layout" in frame else pd.Series("contiguous", index=frame.index)
    page = frame["page_size"] if "page_size" in frame else pd.Series(0, index=frame.index)
    lengths = frame["seqlens"] if "seqlens" in frame else pd.Series("uniform", index=frame.index)
    if not serving_mask(frame).any():
        return pd.Series("", index=frame.index)
    words = (
        frame["heads"].astype(int).astype(str) + "/" + frame["kv_heads"].astype(int).astype(str) + " heads"
    )
    words = words + layout.where(layout == "contiguous", "paged" + page.astype(int).astype(str)).radd(" · ")
    store = frame["kv_dtype"].fillna("") if "kv_dtype" in frame else pd.Series("", index=frame.index)
    words = words + lengths.where(lengths == "uniform", " · ragged").where(lengths != "uniform", "")
    return words + store.where(store == "", " · " + store + " KV")


def case_variants(frame: pd.DataFrame) -> pd.Series:
    """Per row, the variant its lead and its figure panel are judged within: the serving cache (cache_variants)
    and the sliding window, so a windowed case is never ranked with a full one, and packed documents (their law,
    range, count and mean length), so a packed batch is never ranked with a uniform one."""
    import pandas as pd

    variant = cache_variants(frame)
    if packed_mask(frame).any():  # packed documents are never ranked with uniform batches
        docs = [
            documents_text(Case(**{name: row.get(name, CASE_DEFAULTS.get(name)) for name in CASE_FIELDS}))
            for row in frame.to_dict("records")
        ]
        variant = variant.str.cat(pd.Series(docs, index=frame.index), sep=" · ").str.strip(" ·")
    if "window" not in frame:
        return variant
    window = frame["window"].fillna("").astype(str)
    words = ("window " + window).where(window != "", "")
    return variant.str.cat(words, sep=" · ").str.strip(" ·")


def best_bandwidth(frame: pd.DataFrame) -> pd.DataFrame:
    """Per provider, dtype and serving variant: the highest GB/s, where (KV length and batch), the median % of
    the calibrated read bandwidth and of the datasheet's, and where the rows carry them the median tokens per
    joule and the host-bound cases. Sorted by dtype and variant, then the highest GB/s first."""
    import pandas as pd

    # here, not at the top: summary imports runs, which imports this module for its serving columns
    from flashbench.analysis.summary import drop_empty, host_bound_cases, n_label

    ok = frame[frame["ok"] & frame["serving"] & frame["achieved_gb_s"].notna()]
    rows = []
    for (provider, dtype, variant), grp in ok.groupby(["provider", "dtype", "variant"], sort=False):
        top = grp.loc[grp["achieved_gb_s"].idxmax()]
        rows.append(
            {
                "provider": provider,
                "dtype": dtype,
                "KV cache": variant,
                "timed as": " + ".join(sorted(set(grp["timed_as"]))),
                "cases": len(grp),
                "max GB/s": float(top["achieved_gb_s"]),
                "at": f"N={n_label(int(top['seq_q']), int(top['seq_k']))} batch {int(top['batch'])}",
                "median % of read BW": float(grp["pct_of_read_bw"].median()),
                "median % of datasheet BW": float(grp["pct_of_datasheet_bw"].median()),
                "median tokens/J": float(grp["tokens_per_j"].median()),
                "host-bound": host_bound_cases(grp),
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out = out.sort_values(["dtype", "KV cache", "max GB/s"], ascending=[True, True, False])
    return drop_empty(
        out, ("median % of read BW", "median % of datasheet BW", "median tokens/J", "host-bound")
    )


BANDWIDTH_FORMATS = {
    "max GB/s": ".0f",
    "median % of read BW": ".1f",
    "median % of datasheet BW": ".1f",
    "median tokens/J": ".4g",
}


def above_read_bw(frame: pd.DataFrame, l2_bytes: float | None) -> pd.DataFrame:
    """The ok serving rows faster than the calibrated read bandwidth, with what explains each: the KV cache fits
    in the L2 (its compulsory bytes under the L2's size: the cache served part of the reads), else the
    calibration's read is one kernel's rate (torch.sum over 1 GiB), a lower bound of what the memory delivers,
    not its ceiling; pct_of_datasheet_bw says how far under the datasheet roof the row still is."""
    over = frame[frame["ok"] & frame["serving"] & (frame["pct_of_read_bw"] > 100.0)]
    cols = ["provider", "variant", "seq_k", "batch", "achieved_gb_s", "pct_of_read_bw", "pct_of_datasheet_bw"]
    out = over[[*cols, "model_bytes_compulsory"]].copy()
    fits = out["model_bytes_compulsory"] <= (l2_bytes or 0)
    out["why"] = fits.map(lambda f: "fits in L2" if f else "calibrated read is a lower bound")
    return out.reset_index(drop=True)

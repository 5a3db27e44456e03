"""Two runs side by side, case by case: time ratios, newly failing cases, the gate's verdicts, and the
labels a comparison across GPU models carries (each side on its own GPU's roofline, no gate verdict).

Reads the tidy frames of analysis.load_run(); the report (HTML and markdown) shows what these return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashbench.analysis.runs import CASE_COLUMNS, Run
from flashbench.results.rows import OK

if TYPE_CHECKING:
    import pandas as pd


def compare_runs(current: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Two runs case by case (joined on the case key): ratio = current median time / baseline median time.

    A ratio above 1 is a slowdown. Cases in only one run are left out; a case that is ok in the baseline and
    not ok now appears with change "newly failing" and no ratio.
    """
    cols = [
        "key",
        "provider",
        "shape_key",
        *CASE_COLUMNS[1:],
        "panel",
        "serving",
        "status",
        "median_ms",
        "tflops",
    ]
    side = ["status", "median_ms", "tflops", "pct_of_roofline"]
    joined = current[[*cols, "pct_of_roofline"]].merge(
        baseline[["key", *side]], on="key", suffixes=("", "_baseline")
    )
    joined["ratio"] = joined["median_ms"] / joined["median_ms_baseline"]
    joined["change"] = ""
    joined.loc[(joined["status_baseline"] == OK) & (joined["status"] != OK), "change"] = "newly failing"
    joined.loc[(joined["status_baseline"] != OK) & (joined["status"] == OK), "change"] = "newly ok"
    return joined


def same_gpu(a: Run, b: Run) -> bool:
    """Whether two runs ran on the same GPU model (by name; two CPU runs count as the same)."""
    from flashbench.gpu.hardware import normalize_name

    return normalize_name(a.gpu_name) == normalize_name(b.gpu_name)


def same_run(a: Run, b: Run) -> str:
    """Why two runs are one and the same, in words ("" when they are not): the same directory, or every case with
    the same raw samples. A comparison of a run with itself can only say 1.00x."""
    if a.path.resolve() == b.path.resolve():
        return "the same directory"
    cols = ["key", "status", "samples_ms"]
    left = a.frame[cols].assign(samples_ms=a.frame["samples_ms"].map(_samples))
    right = b.frame[cols].assign(samples_ms=b.frame["samples_ms"].map(_samples))
    if (
        len(left)
        and left.sort_values("key").to_numpy().tolist() == right.sort_values("key").to_numpy().tolist()
    ):
        return "every case has the same raw samples"
    return ""


def _samples(value: Any) -> tuple[float, ...]:
    return tuple(value) if isinstance(value, list) else ()


# Shown instead of the gate's verdict when the two runs come from different GPU models.
NO_GATE_ACROSS_GPUS = (
    "No gate verdict: the runs are from different GPUs, so a slower case is a slower machine, not a "
    "regression (run `flashbench gate` between runs of one GPU model)."
)


def cross_gpu_note(current: Run, baseline: Run) -> str:
    """The one line a cross-GPU comparison carries everywhere it is shown; "" for two runs of one GPU model."""
    if same_gpu(current, baseline):
        return ""
    return (
        f"different GPUs: ratios compare machines, not code (this run: {current.gpu_name}; "
        f"{baseline.name}: {baseline.gpu_name}). Each side's % of roofline is against its own GPU's roofline: a speedup with the same % of roofline on both sides is the faster GPU, not a better kernel."
    )


def side_by_side(joined: pd.DataFrame, current_label: str, baseline_label: str) -> pd.DataFrame:
    """compare_runs() as one row per case with both sides' time, TFLOP/s and % of own roofline, by label."""
    cols = {
        "provider": "provider",
        "seq_q": "seq_q",
        "head_dim": "head_dim",
        "dtype": "dtype",
        "causal": "causal",
        "mode": "mode",
        "median_ms": f"{current_label} ms",
        "tflops": f"{current_label} TFLOP/s",
        "pct_of_roofline": f"{current_label} % of roofline",
        "median_ms_baseline": f"{baseline_label} ms",
        "tflops_baseline": f"{baseline_label} TFLOP/s",
        "pct_of_roofline_baseline": f"{baseline_label} % of roofline",
        "ratio": "ratio",
    }
    return joined[list(cols)].rename(columns=cols).reset_index(drop=True)


def add_verdicts(joined: pd.DataFrame, gate_result: Any) -> pd.DataFrame:
    """compare_runs() with the gate's verdict per case (regression, improvement, ...), where the gate ran."""
    verdicts = {c.key: c.verdict for c in getattr(gate_result, "cases", [])}
    return joined.assign(verdict=joined["key"].map(verdicts).fillna(""))


def compare_summary(joined: pd.DataFrame, roofline: bool = False) -> pd.DataFrame:
    """Per provider: median ratio over the cases both runs measured, the worst ratio, and the newly failing.

    roofline: also the median % of roofline of each side (each against its own GPU), for cross-GPU comparisons.
    """
    import pandas as pd

    rows = []
    for provider, grp in joined.groupby("provider", sort=False):
        ratios = grp["ratio"].dropna()
        rows.append(
            {
                "provider": provider,
                "cases": int(len(ratios)),
                "median_ratio": float(ratios.median()) if len(ratios) else float("nan"),
                "worst_ratio": float(ratios.max()) if len(ratios) else float("nan"),
                "best_ratio": float(ratios.min()) if len(ratios) else float("nan"),
                "newly_failing": int((grp["change"] == "newly failing").sum()),
                **({"regressions": int((grp["verdict"] == "regression").sum())} if "verdict" in grp else {}),
            }
        )
        if roofline:
            both = grp[grp["ratio"].notna()]
            for col in ("pct_of_roofline", "pct_of_roofline_baseline"):
                pct = both[col].dropna() if col in both else both["ratio"].iloc[:0]
                rows[-1][f"median_{col}"] = float(pct.median()) if len(pct) else float("nan")
    return pd.DataFrame(rows)

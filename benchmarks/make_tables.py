"""Markdown tables for BENCHMARKS.md from a committed sweep run and a GPU session's evidence folder.

    python benchmarks/make_tables.py results/examples/h200-default                    # sweep tables only
    python benchmarks/make_tables.py results/examples/h200-default \
        --evidence benchmarks/h200-2026-11-22                                          # + fidelity, ncu, ...

Prints markdown to stdout; numbers only, no prose. Reads nothing but the given files (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

import flashbench
from flashbench.models import io_model

GB = 1e9
GIB = 2**30


def fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{nd}f}"


def table(header: list[str], rows: list[list[str]], right_from: int = 1) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def causal_name(c: bool) -> str:
    return "causal" if c else "non-causal"


# ------------------------------------------------------------------------------------------------ the sweep


def tflops_tables(df: pd.DataFrame) -> str:
    out = []
    seqs = sorted(df.seq_q.unique())
    providers = list(dict.fromkeys(df.provider))  # sweep order
    for d in sorted(df.head_dim.unique()):
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                sub = df[(df.head_dim == d) & (df.causal == causal) & (df["mode"] == mode)]
                rows = []
                for p in providers:
                    cells = []
                    for n in seqs:
                        r = sub[(sub.provider == p) & (sub.seq_q == n)]
                        if r.empty or r.iloc[0].status != "ok":
                            cells.append("n/a")
                        else:
                            mark = "*" if r.iloc[0].throttled else ""
                            cells.append(fmt(r.iloc[0].tflops) + mark)
                    rows.append([p, *cells])
                out.append(f"**d={d}, {causal_name(causal)}, {mode}** (TFLOP/s, median)\n")
                out.append(table(["provider", *[f"N={n}" for n in seqs]], rows))
                out.append("")
    return "\n".join(out)


def compile_table(df: pd.DataFrame) -> str:
    ok = df[df.status == "ok"].sort_values("timestamp")
    rows = []
    for p, g in ok.groupby("provider", sort=False):
        c = g.compile_ms / 1000
        rows.append(
            [
                p,
                str(len(g)),
                fmt(c.sum()),
                fmt(c.iloc[0], 2),
                fmt(c.iloc[1:].median(), 2),
                fmt(c.max(), 2),
                str(int((c > 3).sum())),
            ]
        )
    total = ok.compile_ms.sum() / 1000
    rows.append(["**all**", str(len(ok)), fmt(total), "", "", "", ""])
    return table(
        [
            "provider",
            "ok cases",
            "sum compile s",
            "first case s",
            "median other cases s",
            "max s",
            "cases > 3 s",
        ],
        rows,
    )


def throttle_summary(df: pd.DataFrame) -> str:
    ok = df[df.status == "ok"]
    reasons: dict[int, int] = {}
    clocks = []
    for _, r in ok.iterrows():
        for side in ("nvml_before", "nvml_after"):
            n = r[side]
            if not n:
                continue
            reasons[n["clock_event_reasons"]] = reasons.get(n["clock_event_reasons"], 0) + 1
            if n.get("throttled"):
                clocks.append(n["sm_clock_mhz"])
    per = ok.groupby("provider", sort=False).throttled.sum().astype(int)
    rows = [[p, str(v), str(int((ok.provider == p).sum()))] for p, v in per.items()]
    head = (
        f"- ok rows flagged throttled: {int(ok.throttled.sum())} of {len(ok)}\n"
        f"- NVML clock-event reason values seen (before/after readings): "
        + ", ".join(f"0x{k:x}: {v}" for k, v in sorted(reasons.items()))
        + f"\n- SM clock at the throttled readings: {min(clocks)}-{max(clocks)} MHz "
        f"({len(clocks)} readings)\n"
    )
    return head + "\n" + table(["provider", "throttled rows", "ok rows"], rows)


def memory_tables(df: pd.DataFrame) -> str:
    ok = df[df.status == "ok"].copy()
    n = ok.seq_q.max()
    sel = ["naive", "sdpa-math", "sdpa-flash", "triton", "triton-stored-p", "flex"]
    big = ok[(ok.seq_q == n) & ok.provider.isin(sel)]
    rows = []
    for (d, causal, mode), g in big.groupby(["head_dim", "causal", "mode"]):
        cells = []
        for p in sel:
            r = g[g.provider == p]
            cells.append(fmt(r.iloc[0].peak_mem_bytes / GIB, 3) if len(r) else "n/a")
        tr = g[g.provider == "triton"].peak_mem_bytes.iloc[0]
        nv = g[g.provider == "naive"].peak_mem_bytes.iloc[0]
        rows.append([str(d), causal_name(causal), mode, *cells, fmt(nv / tr, 0) + "x"])
    t1 = table(["d", "mask", "mode", *sel, "naive / triton"], rows, right_from=3)

    ok["ratio"] = ok.peak_mem_bytes / ok.predicted_mem_bytes
    rows = []
    for (p, mode), g in ok.groupby(["provider", "mode"], sort=False):
        rows.append([p, mode, fmt(g.ratio.min(), 3), fmt(g.ratio.median(), 3), fmt(g.ratio.max(), 3)])
    t2 = table(["provider", "mode", "min", "median", "max"], rows, right_from=2)
    return (
        f"Peak memory at N={n} (GiB, torch.cuda.max_memory_allocated during the timed call):\n\n{t1}\n\n"
        f"Measured peak / predicted_mem_bytes, over all 24 shapes of each (provider, mode):\n\n{t2}"
    )


def _val(df: pd.DataFrame, p: str, d: int, causal: bool, mode: str, n: int, col: str) -> float:
    r = df[
        (df.provider == p)
        & (df.head_dim == d)
        & (df.causal == causal)
        & (df["mode"] == mode)
        & (df.seq_q == n)
        & (df.status == "ok")
    ]
    return float(r.iloc[0][col]) if len(r) else float("nan")


def ratio_tables(df: pd.DataFrame, num: str = "triton", refs=("sdpa-flash", "sdpa-cudnn")) -> str:
    seqs = sorted(df.seq_q.unique())
    out = []
    for ref in refs:
        rows = []
        for d in (128, 64):
            for mode in ("fwd", "fwd+bwd"):
                for causal in (False, True):
                    cells = [
                        fmt(
                            _val(df, num, d, causal, mode, n, "tflops")
                            / _val(df, ref, d, causal, mode, n, "tflops"),
                            2,
                        )
                        for n in seqs
                    ]
                    rows.append([str(d), mode, causal_name(causal), *cells])
        out.append(f"**{num} / {ref}** (TFLOP/s ratio; >1 = {num} faster)\n")
        out.append(table(["d", "mode", "mask", *[f"N={n}" for n in seqs]], rows, right_from=3))
        out.append("")
    return "\n".join(out)


def recompute_table(df: pd.DataFrame) -> str:
    seqs = sorted(df.seq_q.unique())
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            for n in seqs:
                a = _val(df, "triton", d, causal, "fwd+bwd", n, "median_ms")
                b = _val(df, "triton-stored-p", d, causal, "fwd+bwd", n, "median_ms")
                fa = _val(df, "triton", d, causal, "fwd", n, "median_ms")
                fb = _val(df, "triton-stored-p", d, causal, "fwd", n, "median_ms")
                ma = _val(df, "triton", d, causal, "fwd+bwd", n, "peak_mem_bytes")
                mb = _val(df, "triton-stored-p", d, causal, "fwd+bwd", n, "peak_mem_bytes")
                rows.append(
                    [
                        str(d),
                        causal_name(causal),
                        str(n),
                        fmt(fa, 3),
                        fmt(fb, 3),
                        fmt(a, 3),
                        fmt(b, 3),
                        fmt(b / a, 2),
                        fmt((b - fb) / (a - fa), 2),
                        fmt(ma / GIB, 3),
                        fmt(mb / GIB, 3),
                    ]
                )
    return table(
        [
            "d",
            "mask",
            "N",
            "triton fwd ms",
            "stored-P fwd ms",
            "triton fwd+bwd ms",
            "stored-P fwd+bwd ms",
            "stored-P / triton (fwd+bwd)",
            "(fwd+bwd - fwd) stored-P / triton",
            "triton peak GiB",
            "stored-P peak GiB",
        ],
        rows,
        right_from=2,
    )


def loop_order_table(df: pd.DataFrame) -> str:
    seqs = sorted(df.seq_q.unique())
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                cells = [
                    fmt(
                        _val(df, "triton-v1", d, causal, mode, n, "tflops")
                        / _val(df, "triton", d, causal, mode, n, "tflops"),
                        2,
                    )
                    for n in seqs
                ]
                rows.append([str(d), causal_name(causal), mode, *cells])
    return table(["d", "mask", "mode", *[f"N={n}" for n in seqs]], rows, right_from=3)


# ------------------------------------------------------------------------------------------ evidence files


def fidelity_table(path: Path) -> str:
    data = json.loads(path.read_text())
    rows = []
    for p in data["points"]:
        prov, *_, mask, mode = p["case"].split("|")
        rows.append(
            [
                prov,
                "causal" if mask == "causal" else "non-causal",
                mode,
                " / ".join(fmt(x, 4) for x in p["flashbench_median_ms"]),
                " / ".join(str(x) for x in p["flashbench_samples"]),
                fmt(p["do_bench_median_ms"], 4),
                f"{p['diff_pct']:+.2f}",
                "yes" if p["within_tolerance"] else "NO",
            ]
        )
    return table(
        [
            "provider",
            "mask",
            "mode",
            "flashbench median ms (2 runs)",
            "samples",
            "do_bench median ms",
            "diff %",
            f"within {data['tolerance_pct']:g}%",
        ],
        rows,
        right_from=3,
    )


def _model_split(impl: str, meta: dict[str, Any], n: int, mode: str) -> tuple[int, int]:
    fam = {"naive": "naive", "sdpa-flash": "flash", "bundled": "flash"}[impl]
    e = {"fp16": 2, "bf16": 2, "fp32": 4}[meta["dtype"]]
    t = io_model.hbm_traffic(
        fam, meta["batch"], meta["heads"], meta["heads"], n, n, meta["head_dim"], e, meta["causal"], mode
    )
    return t.read, t.write


def ncu_tables(path: Path) -> str:
    data = json.loads(path.read_text())
    meta = data["meta"]
    rows = []
    for r in data["results"]:
        mr, mw = r["measured"]["read_bytes"], r["measured"]["write_bytes"]
        model = r["model"]
        pr, pw = _model_split(r["impl"], meta, r["seq"], r["mode"])
        assert pr + pw == model["model"], (r["impl"], r["seq"])
        rows.append(
            [
                r["impl"],
                str(r["seq"]),
                fmt(model["compulsory"] / GB, 4),
                fmt(pr / GB, 4),
                fmt(mr / GB, 4),
                fmt(pw / GB, 4),
                fmt(mw / GB, 4),
                fmt(model["model"] / GB, 4),
                fmt((mr + mw) / GB, 4),
                fmt(r["ratio_measured_over_model"], 3),
                fmt(mr / pr, 3),
                fmt(model["model_no_l2"] / GB, 3),
                fmt(r["measured"]["gpu_time_s"] * 1e3, 3),
            ]
        )
    t1 = table(
        [
            "impl",
            "N",
            "compulsory GB",
            "model read GB",
            "ncu read GB",
            "model write GB",
            "ncu write GB",
            "model total GB",
            "ncu total GB",
            "total ncu/model",
            "read ncu/model",
            "model, no L2 reuse GB",
            "gpu time ms",
        ],
        rows,
        right_from=2,
    )
    # Per-kernel view of the smallest naive case: where the missing write bytes are.
    naive = min((r for r in data["results"] if r["impl"] == "naive"), key=lambda r: r["seq"])
    krows = []
    for k in naive["measured"]["kernels"]:
        name = k["kernel"]
        short = name if len(name) < 48 else name[:45] + "..."
        krows.append(
            [
                "`" + short.replace("|", "/") + "`",
                fmt(k["dram__bytes_read.sum"] / 1e6, 1),
                fmt(k["dram__bytes_write.sum"] / 1e6, 1),
                fmt(k["gpu__time_duration.sum"] * 1e6, 1),
            ]
        )
    t2 = table(["kernel (in call order)", "read MB", "write MB", "time us"], krows)
    return f"{t1}\n\nnaive, N={naive['seq']}, per kernel:\n\n{t2}"


def calibrate_table(path: Path, env_path: Path) -> str:
    from flashbench.gpu import hardware

    cal = json.loads(path.read_text())
    facts = json.loads(env_path.read_text())["gpus"][0]
    spec = hardware.match_nvml_name(facts["name"])
    ds = hardware.datasheet_ceiling(spec)
    nv = hardware.nvml_ceiling(spec, facts)
    rows = [
        [
            "copy bandwidth (GB/s, read+write)",
            fmt(cal["copy_bw_gb_s"], 0),
            fmt(ds.bw_bytes_s / 1e9, 0),
            fmt(cal["copy_bw_gb_s"] * 1e9 / ds.bw_bytes_s * 100, 0) + "%",
            fmt(nv.bw_bytes_s / 1e9, 0),
        ]
    ]
    for dt, tf in cal["matmul_tflops"].items():
        d_tf = ds.flops_s[dt] / 1e12
        rows.append(
            [
                f"matmul {dt} 8192^3 (TFLOP/s)",
                fmt(tf, 1),
                fmt(d_tf, 1),
                fmt(tf / d_tf * 100, 0) + "%",
                fmt(nv.flops_s[dt] / 1e12, 1),
            ]
        )
    return table(
        ["ceiling", "measured", "datasheet (gpus.toml)", "measured / datasheet", "NVML-derived"], rows
    )


def kernel_quick_table(path: Path, df: pd.DataFrame) -> str:
    """d=128 only: same shapes as the sweep (16 heads). kernel_quick's d=64 used 32 heads, the sweep 16."""
    data = [r for r in json.loads(path.read_text()) if r["d"] == 128 and "tflops" in r]
    seqs = sorted({r["n"] for r in data})
    groups = list(dict.fromkeys((r["provider"], r["causal"], r["mode"]) for r in data))
    rows = []
    for prov, causal, mode in groups:
        cells = []
        for n in seqs:
            hit = [
                r for r in data if (r["provider"], r["causal"], r["mode"], r["n"]) == (prov, causal, mode, n)
            ]
            if not hit:
                cells.append("not run")
                continue
            quick = hit[0]["tflops"]
            sweep = _val(df, prov, 128, causal, mode, n, "tflops")
            cells.append(f"{fmt(quick)} / {fmt(sweep)} ({(quick / sweep - 1) * 100:+.1f}%)")
        rows.append([prov, causal_name(causal), mode, *cells])
    return table(
        ["provider", "mask", "mode", *[f"N={n}: quick / sweep TFLOP/s" for n in seqs]], rows, right_from=3
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument(
        "--evidence", type=Path, help="folder with fidelity.json, ncu_bytes.json, calibrate.json, ..."
    )
    args = ap.parse_args()
    df = flashbench.load(args.run_dir)
    env = json.loads((args.run_dir / "env.json").read_text())
    sections = [
        (
            "Sweep",
            f"wall_s {env['wall_s']}, compile_s_total {env['compile_s_total']}, {env['status_counts']}",
        ),
        ("TFLOP/s", tflops_tables(df)),
        ("Compile time (first-call time of each case, s)", compile_table(df)),
        ("Throttle flags", throttle_summary(df)),
        ("Memory", memory_tables(df)),
        ("Ratios", ratio_tables(df)),
        ("Recompute vs stored P", recompute_table(df)),
        ("Loop order: triton-v1 / triton (TFLOP/s)", loop_order_table(df)),
    ]
    ev = args.evidence
    if ev is not None:
        sections += [
            ("Fidelity", fidelity_table(ev / "fidelity.json")),
            ("Nsight Compute bytes", ncu_tables(ev / "ncu_bytes.json")),
            ("Calibration", calibrate_table(ev / "calibrate.json", args.run_dir / "env.json")),
            ("kernel_quick vs sweep (d=128)", kernel_quick_table(ev / "kernel_quick.json", df)),
        ]
    for title, body in sections:
        print(f"### {title}\n\n{body}\n")


if __name__ == "__main__":
    main()

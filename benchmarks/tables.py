"""The markdown tables of docs/benchmarks.md, printed from run directories (no GPU needed).

    python benchmarks/tables.py speed RUN [RUN ...]     # a `--preset speed` sweep: the bundled kernel vs SDPA
    python benchmarks/tables.py recompute RUN           # a `--preset recompute` sweep: recompute vs stored P
    python benchmarks/tables.py providers RUN [--seq N] # any sweep: TFLOP/s of every provider at one N
    python benchmarks/tables.py decode RUN              # a `--preset decode` sweep: GB/s of the bundled decode
    python benchmarks/tables.py fp8 RUN                 # a `--preset fp8` sweep: the FP8 forward vs bf16
    python benchmarks/tables.py decode-fp8 RUN [RUN ...] # `--preset decode-fp8`: e4m3 vs bf16 cache (+ e4m3 variants)
    python benchmarks/tables.py window RUN              # a `--preset window` sweep: a window against no window
    python benchmarks/tables.py host RUN                # any sweep with triton and sdpa-cudnn: host, loop, GPU time
    python benchmarks/tables.py varlen RUN              # a `--preset varlen` sweep: packed documents vs uniform
    python benchmarks/tables.py floor RUN               # a decode sweep under --cuda-graph: time over the floor
    python benchmarks/tables.py mla RUN                 # a `--preset mla` sweep: the bundled MLA decode's roofs
    python benchmarks/tables.py mla-heads RUN [--before RUN]  # `--preset mla --heads ...`: by head count

Every ratio is between medians measured in the same run. With several runs, `speed` takes the TFLOP/s from the
first and prints each run's ratios side by side (run-to-run spread).
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

import flashbench
from flashbench.analysis.runs import load_run

KEY = ["head_dim", "causal", "mode", "seq_q"]


def ok_rows(run: str) -> pd.DataFrame:
    df = flashbench.load(run)
    return df[df.status == "ok"]


def kernel_name(config: object) -> str:
    """Which bundled forward ran, from the row's kernel_config, its query rows x keys per tile: "tl 64x128", "Gluon
    192x128 persistent" (round-robin) or "Gluon 128x128 persistent LPT" (list-scheduled, flash_ws.lpt_table)."""
    if not isinstance(config, dict):
        return ""
    tile = f"{config.get('BLOCK_M')}x{config.get('BLOCK_N')}"
    if config.get("kernel") == "gluon-ws":
        walk = " persistent LPT" if config.get("LPT") else " persistent"
        return f"Gluon {tile}" + (walk if config.get("PERSISTENT") else "")
    return f"tl {tile}"


def backward_name(config: object) -> str:
    """Which bundled backward ran, from the row's kernel_config["bwd"]: "Gluon one pass", "Gluon dK/dV + tl dQ"
    or "tl" (both passes)."""
    bwd = config.get("bwd") if isinstance(config, dict) else None
    dkdv = bwd.get("dkdv") if isinstance(bwd, dict) else None
    if not isinstance(dkdv, dict):
        return ""
    if dkdv.get("kernel") != "gluon-ws":
        return "tl"
    return "Gluon one pass" if dkdv.get("ONE_PASS") else "Gluon dK/dV + tl dQ"


def kernels_cell(mode: str, config: object) -> str:
    """The forward that ran (fwd), the backward (bwd), or both (fwd+bwd: "forward; backward")."""
    names = {"fwd": [kernel_name(config)], "bwd": [backward_name(config)]}
    return "; ".join(names.get(mode, [kernel_name(config), backward_name(config)]))


def ratio(a: float, b: float) -> str:
    return "-" if pd.isna(a) or pd.isna(b) else f"{a / b:.2f}"


def tflops_cell(x: float) -> str:
    return "-" if pd.isna(x) else f"{x:.0f}"


def speed(runs: list[str]) -> None:
    """The bundled forward against the SDPA backends, TFLOP/s of the first run; x flash and x cuDNN per run (a / b),
    and x cuDNN per clock: the bundled kernel's work per SM cycle over cuDNN's (x cuDNN times cuDNN's row's SM clock
    over the bundled row's), which a power cap that holds one kernel at a lower clock does not move."""
    frames = [ok_rows(r) for r in runs]
    providers = ["triton", "sdpa-flash", "sdpa-cudnn"]  # a provider the run lacks: NaN, printed "nan"

    def pivot(frame: pd.DataFrame, values: str) -> pd.DataFrame:
        return frame.pivot_table(index=KEY, columns="provider", values=values).reindex(columns=providers)

    pivots = [pivot(f, "tflops") for f in frames]
    clocks = [pivot(f, "sm_clock_mhz") for f in frames]
    first = frames[0][frames[0].provider == "triton"].set_index(KEY)
    print(
        "| mode | d | causal | N | triton | sdpa-flash | sdpa-cudnn | x flash | x cuDNN | per clock | kernels |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    order = pivots[0].sort_index(level=["mode", "head_dim", "causal", "seq_q"])  # fwd before fwd+bwd
    for key, r in order.iterrows():
        d, causal, mode, n = key
        x_flash = " / ".join(ratio(p.loc[key, "triton"], p.loc[key, "sdpa-flash"]) for p in pivots)
        x_cudnn = " / ".join(ratio(p.loc[key, "triton"], p.loc[key, "sdpa-cudnn"]) for p in pivots)
        per_clock = " / ".join(
            ratio(
                p.loc[key, "triton"] * c.loc[key, "sdpa-cudnn"],
                p.loc[key, "sdpa-cudnn"] * c.loc[key, "triton"],
            )
            for p, c in zip(pivots, clocks, strict=True)
        )
        kernels = kernels_cell(mode, first.loc[key, "kernel_config"])
        cells = " | ".join(tflops_cell(r[p]) for p in providers)
        print(
            f"| {mode} | {d} | {'yes' if causal else 'no'} | {n} | {cells} | {x_flash} | {x_cudnn} | {per_clock} "
            f"| {kernels} |"
        )


def recompute(run: str) -> None:
    df = ok_rows(run)
    index = ["head_dim", "causal", "seq_q"]
    ms = df.pivot_table(index=index, columns="provider", values="median_ms")
    mem = df.pivot_table(index=index, columns="provider", values="peak_mem_bytes")
    tflops = df.pivot_table(index=index, columns="provider", values="tflops")
    print(
        "| d | causal | N | recompute ms | stored-P ms | recompute / stored-P | recompute GiB | stored-P GiB "
        "| recompute TFLOP/s | x sdpa-flash | x sdpa-cudnn |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, r in ms.iterrows():
        m, t = mem.loc[key] / 2**30, tflops.loc[key]
        print(
            f"| {key[0]} | {'yes' if key[1] else 'no'} | {key[2]} | {r['triton']:.3f} | {r['triton-stored-p']:.3f} "
            f"| {r['triton'] / r['triton-stored-p']:.2f} | {m['triton']:.2f} | {m['triton-stored-p']:.2f} "
            f"| {t['triton']:.0f} | {t['triton'] / t['sdpa-flash']:.2f} | {t['triton'] / t['sdpa-cudnn']:.2f} |"
        )


def providers(run: str, seq: int) -> None:
    all_rows = flashbench.load(run)
    df = all_rows[(all_rows.status == "ok") & (all_rows.seq_q == seq)]
    columns = [(m, d, c) for m in ("fwd", "fwd+bwd") for d in (64, 128) for c in (False, True)]
    heads = [f"{m} d={d} {'causal' if c else 'full'}" for m, d, c in columns]
    print("| provider | " + " | ".join(heads) + " | peak GiB (fwd+bwd d=128 full) |")
    print("| --- |" + " ---: |" * (len(columns) + 1))
    for provider in dict.fromkeys(all_rows.provider):  # sweep order
        mine = df[df.provider == provider].set_index(["mode", "head_dim", "causal"])
        cells = [f"{mine.loc[c, 'tflops']:.0f}" if c in mine.index else "n/a" for c in columns]
        peak = ("fwd+bwd", 128, False)
        gib = f"{mine.loc[peak, 'peak_mem_bytes'] / 2**30:.2f}" if peak in mine.index else "n/a"
        print(f"| {provider} | " + " | ".join(cells) + f" | {gib} |")


def _config(config: object) -> dict:
    """A row's kernel_config as a dict (the analysis frame keeps it as JSON text)."""
    if isinstance(config, str) and config:
        return json.loads(config)
    return config if isinstance(config, dict) else {}


def kv_megabytes(batch: int, seq: int, kv_heads: int, head_dim: int, kv_dtype: str) -> float:
    """A decode case's K and V cache in MB: 2 bytes per element, 1 for an e4m3 cache (`--kv-dtype fp8`)."""
    return 2 * batch * seq * kv_heads * head_dim * (1 if kv_dtype == "fp8" else 2) / 1e6


def decode(run: str) -> None:
    """The bundled decode kernel per cache shape: its time, GB/s (the decode byte model's bytes over the median)
    and % of the calibrated read bandwidth, beside the fastest other provider on the same case, and paged
    against contiguous."""
    frame = load_run(run).frame
    df = frame[frame.ok]
    shape = ["kv_heads", "seq_k", "batch"]
    mine = df[df.provider == "triton-decode"].set_index([*shape, "kv_layout"])
    others = df[df.provider != "triton-decode"]
    print(
        "| H / Hkv | N | batch | KV MB | layout | triton-decode us | GB/s | % of read BW | splits "
        "| fastest other | its us | x fastest other | x sdpa-cudnn |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for key, r in mine.sort_index().iterrows():
        hkv, n, b, layout = key
        kv_mb = kv_megabytes(b, n, hkv, r["head_dim"], r["kv_dtype"])
        same = others[(others.kv_heads == hkv) & (others.seq_k == n) & (others.kv_layout == layout)]
        best = same.loc[same.median_ms.idxmin()] if len(same) else None
        cudnn = same[same.provider == "sdpa-cudnn"]
        us = r["median_ms"] * 1e3
        print(
            f"| {r['heads']} / {hkv} | {n} | {b} | {kv_mb:.0f} | {layout} | {us:.1f} | {r['achieved_gb_s']:.0f} "
            f"| {r['pct_of_read_bw']:.0f} | {_config(r['kernel_config']).get('num_splits', '')} "
            + (
                f"| {best['provider']} | {best['median_ms'] * 1e3:.1f} | {best['median_ms'] / r['median_ms']:.2f} "
                if best is not None
                else "| - | - | - "
            )
            + (f"| {cudnn.median_ms.iloc[0] / r['median_ms']:.2f} |" if len(cudnn) else "| - |")
        )


def fp8(run: str) -> None:
    """The bundled forward in fp8 against bf16 (and the other providers' rows), TFLOP/s from one run. Per clock: fp8's
    work per SM cycle over bf16's (the time ratio times the rows' SM clocks, bf16's over fp8's), which a power cap
    that holds one dtype's rows at a lower clock does not move."""
    df = ok_rows(run)
    index = ["head_dim", "causal", "seq_q"]
    tf = df.pivot_table(index=index, columns=["provider", "dtype"], values="tflops")
    clock = df.pivot_table(index=index, columns=["provider", "dtype"], values="sm_clock_mhz")
    mine = df[(df.provider == "triton") & (df.dtype == "fp8")].set_index(index)
    others = [c for c in tf.columns if c[0] != "triton"]

    def num(x: object) -> str:
        return "n/a" if x is None or x != x else f"{x:.0f}"

    def known(*xs: object) -> bool:
        return all(num(x) != "n/a" for x in xs)

    print(
        "| d | causal | N | triton bf16 | triton fp8 | fp8 / bf16 | per clock | SM MHz bf16 / fp8 | fp8 tile "
        "| fp8 rel. err (budget) |" + "".join(f" {p} {t} |" for p, t in others)
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |" + " ---: |" * len(others))
    for key, r in tf.sort_index().iterrows():
        bf16, f8 = r.get(("triton", "bf16")), r.get(("triton", "fp8"))
        mhz = clock.loc[key] if key in clock.index else {}
        mhz_bf16, mhz_f8 = mhz.get(("triton", "bf16")), mhz.get(("triton", "fp8"))
        ratio = f"{f8 / bf16:.2f}" if known(bf16, f8) else "n/a"
        per_clock = f"{f8 / bf16 * mhz_bf16 / mhz_f8:.2f}" if known(bf16, f8, mhz_bf16, mhz_f8) else "n/a"
        e = mine.loc[key] if key in mine.index else None
        tile = kernel_name(_config(e["kernel_config"])) if e is not None else ""
        checked = e is not None and e["rel_err"] == e["rel_err"]
        err = f"{e['rel_err']:.2%} ({e['err_budget']:.2%})" if checked else ""
        d, causal, n = key
        print(
            f"| {d} | {'yes' if causal else 'no'} | {n} | {num(bf16)} | {num(f8)} | {ratio} | {per_clock} "
            f"| {num(mhz_bf16)} / {num(mhz_f8)} | {tile} | {err} |"
            + "".join(f" {num(r[c])} |" for c in others)
        )


def decode_fp8(runs: list[str]) -> None:
    """The bundled decode over an e4m3 cache against a bf16 one, per cache shape, from the first run's rows; each
    further run (its e4m3 rows, e.g. under FLASHBENCH_TRITON_CONFIG) adds its time and ratio to bf16 beside."""
    shape = ["heads", "kv_heads", "seq_k", "batch", "kv_layout"]
    frames = [load_run(run).frame for run in runs]
    frames = [df[df.ok & (df.provider == "triton-decode")].set_index([*shape, "kv_dtype"]) for df in frames]
    first = frames[0]
    extra = "".join(f" run {i} e4m3 us | run {i} bf16 / e4m3 |" for i in range(2, len(runs) + 1))
    print(
        "| H / Hkv | N | batch | layout | bf16 us | bf16 % of read BW | e4m3 us | e4m3 GB/s | e4m3 % of read BW "
        "| bf16 time / e4m3 time | e4m3 warps, splits |" + extra
    )
    print(
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        + " ---: | ---: |" * (len(runs) - 1)
    )
    for key in sorted({k[:-1] for k in first.index if k[-1] == "fp8"}):
        if (*key, "") not in first.index:
            continue
        bf16, f8 = first.loc[(*key, "")], first.loc[(*key, "fp8")]
        cfg = _config(f8["kernel_config"])
        cells = [
            f"{bf16.median_ms * 1e3:.1f}", f"{bf16.pct_of_read_bw:.0f}", f"{f8.median_ms * 1e3:.1f}",
            f"{f8.achieved_gb_s:.0f}", f"{f8.pct_of_read_bw:.0f}", f"{bf16.median_ms / f8.median_ms:.2f}",
            f"{cfg.get('num_warps', '')}, {cfg.get('num_splits', '')}",
        ]  # fmt: skip
        for other in frames[1:]:
            row = other.loc[(*key, "fp8")] if (*key, "fp8") in other.index else None
            cells += (
                ["-", "-"]
                if row is None
                else [f"{row.median_ms * 1e3:.1f}", f"{bf16.median_ms / row.median_ms:.2f}"]
            )
        h, hkv, n, b, layout = key
        layout += str(bf16.page_size) if layout == "paged" else ""
        print(f"| {h} / {hkv} | {n} | {b} | {layout} | " + " | ".join(cells) + " |")


def window(run: str) -> None:
    """Per provider and mode: the time without a window and with each window, the speed-up the window gives
    (against the ratio of unmasked pairs), and the bundled kernel's time over each other provider's."""
    df = ok_rows(run)
    df = df.assign(window=df.window.replace("", "none"))
    ms = df.pivot_table(index=["mode", "seq_q", "window"], columns="provider", values="median_ms")
    flops = df.groupby(["mode", "seq_q", "window"]).flops.first()
    others = [p for p in ms.columns if p != "triton"]
    print(
        "| mode | N | window | pairs x fewer | "
        + " | ".join(f"{p} ms | {p} x faster" for p in ms.columns)
        + "".join(f" | triton / {p} time" for p in others)
        + " | forward kernel |"
    )
    print(
        "| --- | ---: | --- | ---: |"
        + " ---: | ---: |" * len(ms.columns)
        + " ---: |" * len(others)
        + " --- |"
    )
    for (mode, n, win), row in ms.iterrows():
        if win == "none":
            continue
        base = ms.loc[(mode, n, "none")]
        fewer = flops[(mode, n, "none")] / flops[(mode, n, win)]
        cells = " | ".join(f"{row[p]:.3f} | {base[p] / row[p]:.2f}" for p in ms.columns)
        vs = "".join(f" | {row['triton'] / row[p]:.2f}" for p in others)
        configs = df[(df.provider == "triton") & (df["mode"] == mode) & (df.window == win)].kernel_config
        kernel = kernel_name(_config(configs.iloc[0])) if len(configs) else ""
        print(f"| {mode} | {n} | {win} | {fewer:.2f} | {cells}{vs} | {kernel} |")


def host(run: str, other: str = "sdpa-cudnn") -> None:
    """What a training loop pays, bundled kernel beside `other`: host enqueue, eager-loop and GPU time per call
    (us), the loop over the GPU time, and the loop ratio (what an eager loop gains by the bundled call)."""
    df = ok_rows(run)
    df = df[df.provider.isin(["triton", other]) & df.loop_ms.notna()]
    us = lambda x: "-" if pd.isna(x) else f"{x * 1e3:.0f}"  # noqa: E731
    print(
        f"| mode | d | causal | N | triton host | loop | GPU | loop/GPU | {other} host | loop | GPU | loop/GPU | loop x {other} |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (mode, d, causal, n), g in df.groupby(["mode", "head_dim", "causal", "seq_q"], sort=True):
        rows = {r.provider: r for r in g.itertuples()}
        if "triton" not in rows or other not in rows:
            continue
        a, b = rows["triton"], rows[other]
        cells = []
        for r in (a, b):
            gpu = r.loop_gpu_ms if not pd.isna(r.loop_gpu_ms) else r.median_ms
            cells += [us(r.host_ms), us(r.loop_ms), us(gpu), ratio(r.loop_ms, gpu)]
        print(
            f"| {mode} | {d} | {'yes' if causal else 'no'} | {n} | {' | '.join(cells)} | {ratio(b.loop_ms, a.loop_ms)} |"
        )


def layout_cell(kv_layout: str, page_size: int) -> str:
    """A decode case's cache layout as the tables name it: "contiguous", or "paged16" (its page size)."""
    return f"paged{page_size}" if kv_layout == "paged" else kv_layout


def mla_rows(run: str):
    """(the run, its ok rows of the bundled MLA decode, triton-mla)."""
    loaded = load_run(run)
    return loaded, loaded.frame[loaded.frame.ok & (loaded.frame.provider == "triton-mla")]


def floor(run: str) -> None:
    """A decode sweep's time over the floor (decode.md, "Time over the floor"), per cache shape: the bundled
    decode's median and its time over the floor over a contiguous cache and over a paged one, then each other
    provider's over a contiguous cache."""
    frame = load_run(run).frame
    df = frame[frame.ok]
    shape = ["heads", "kv_heads", "seq_k", "batch"]
    columns = [("triton-decode", "contiguous"), ("triton-decode", "paged")]
    columns += [(p, "contiguous") for p in dict.fromkeys(df.provider) if p != "triton-decode"]
    cells = df.set_index([*shape, "provider", "kv_layout"])
    pages = df[df.kv_layout == "paged"].page_size
    paged = layout_cell("paged", pages.iloc[0]) if len(pages) else "paged"
    heads = [f"{p if layout == 'contiguous' else paged} us | x floor" for p, layout in columns]
    print("| H / Hkv | N | batch | KV MB | " + " | ".join(heads) + " |")
    print("| --- | ---: | ---: | ---: |" + " ---: | ---: |" * len(columns))
    for key, g in df.groupby(shape, sort=True):
        h, hkv, n, b = key
        kv_mb = kv_megabytes(b, n, hkv, g.head_dim.iloc[0], g.kv_dtype.iloc[0])
        row = []
        for p, layout in columns:
            r = cells.loc[(*key, p, layout)] if (*key, p, layout) in cells.index else None
            row += ["-", "-"] if r is None else [f"{r['median_ms'] * 1e3:.1f}", f"{r['time_over_floor']:.2f}"]
        print(f"| {h} / {hkv} | {n} | {b} | {kv_mb:.0f} | " + " | ".join(row) + " |")


def mla(run: str) -> None:
    """The bundled MLA decode (triton-mla) per case: its kernel and splits, its median, GB/s and % of the
    calibrated read bandwidth (the byte model's bytes), TFLOP/s and % of the calibrated matmul rate of its dtype,
    and the bound the roofline model names."""
    loaded, df = mla_rows(run)
    matmul = (loaded.env.calibration or {}).get("matmul_tflops", {})
    dtype = df.dtype.iloc[0] if len(df) else "bf16"
    print(
        "| Nq | N | batch | layout | kernel | splits | us | GB/s | % of read BW | TFLOP/s "
        f"| % of {dtype} matmul | bound |"
    )
    print("| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in df.sort_values(["seq_q", "kv_layout", "seq_k"]).itertuples():
        cfg = _config(r.kernel_config)
        rate = matmul.get(r.dtype)
        print(
            f"| {r.seq_q} | {r.seq_k} | {r.batch} | {layout_cell(r.kv_layout, r.page_size)} "
            f"| {'Gluon' if cfg.get('kernel') == 'gluon-ws' else 'tl'} | {cfg.get('num_splits', '')} "
            f"| {r.median_ms * 1e3:.1f} | {r.achieved_gb_s:.0f} | {r.pct_of_read_bw:.0f} | {r.tflops:.0f} "
            f"| {f'{100 * r.tflops / rate:.0f}' if rate else '-'} | {r.bound.removesuffix('-bound')} |"
        )


def mla_heads(run: str, before: str | None = None) -> None:
    """The bundled MLA decode by head count: its schedule (one row block per sequence: the split consumers, else
    the seesaw) and splits, the model's intensity, its median beside `before`'s (another run of the same cases),
    the latent cache alone over the median and over the calibrated read bandwidth, the byte model's % of it, and
    what an eager loop pays per call over the GPU time."""
    _, df = mla_rows(run)
    shape = ["heads", "seq_q", "seq_k", "batch", "kv_layout"]
    then = mla_rows(before)[1].set_index(shape).median_ms if before else pd.Series(dtype=float)
    print(
        "| heads | Nq | N | batch | layout | schedule | splits | FLOP/B | us | before us | x | cache GB/s "
        "| cache % of read BW | % of read BW (model) | loop / GPU |"
    )
    print(
        "| ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for r in df.sort_values(shape).itertuples():
        cfg = _config(r.kernel_config)
        was = then.get(tuple(getattr(r, c) for c in shape), float("nan"))
        cache_gb_s = r.batch * r.seq_k * r.head_dim * 2 / (r.median_ms * 1e-3) / 1e9  # one latent row of bf16
        print(
            f"| {r.heads} | {r.seq_q} | {r.seq_k} | {r.batch} | {layout_cell(r.kv_layout, r.page_size)} "
            f"| {'split' if cfg.get('row_blocks') == 1 else 'seesaw'} | {cfg.get('num_splits', '')} "
            f"| {r.ai_compulsory:.0f} | {r.median_ms * 1e3:.1f} | {'-' if pd.isna(was) else f'{was * 1e3:.1f}'} "
            f"| {ratio(r.median_ms, was)} | {cache_gb_s:.0f} | {100 * cache_gb_s / r.read_bw_gb_s:.0f} "
            f"| {r.pct_of_read_bw:.0f} | {r.loop_over_gpu:.2f} |"
        )


def varlen(run: str) -> None:
    """A `--preset varlen` sweep: each provider's TFLOP/s over the packed documents (each document's own pairs)
    beside its TFLOP/s on the uniform batch of the same tokens, packed over uniform, and the bundled kernel's packed
    TFLOP/s over this provider's (the issue's comparison: FlexAttention's document mask, the best SDPA path)."""
    df = ok_rows(run)
    uniform = df[df.seqlens == "uniform"]
    packed = df[df.seqlens != "uniform"]
    tflops = uniform.set_index(["mode", "provider"]).tflops
    bundled = packed[packed.provider == "triton"].set_index("mode").tflops
    batch, n = uniform.batch.iloc[0], uniform.seq_k.iloc[0]
    print(
        f"| mode | provider | packed TFLOP/s | uniform {batch} x {n} TFLOP/s | packed / uniform "
        "| bundled packed / this |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    order = {p: i for i, p in enumerate(dict.fromkeys(df.provider))}  # the run's order
    for r in packed.sort_values(
        ["mode", "provider"], key=lambda c: c.map(order) if c.name == "provider" else c
    ).itertuples():
        u = tflops.get((r.mode, r.provider), float("nan"))
        print(
            f"| {r.mode} | {r.provider} | {tflops_cell(r.tflops)} | {tflops_cell(u)} | {ratio(r.tflops, u)} "
            f"| {ratio(bundled.get(r.mode, float('nan')), r.tflops)} |"
        )


# The tables of one run directory, by name.
ONE_RUN = {
    "recompute": recompute,
    "decode": decode,
    "fp8": fp8,
    "window": window,
    "host": host,
    "varlen": varlen,
    "floor": floor,
    "mla": mla,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="table", required=True)
    sub.add_parser("speed").add_argument("runs", nargs="+")
    p = sub.add_parser("providers")
    p.add_argument("run")
    p.add_argument("--seq", type=int, default=16384)
    sub.add_parser("decode-fp8").add_argument("runs", nargs="+")
    p = sub.add_parser("mla-heads")
    p.add_argument("run")
    p.add_argument("--before", help="another run of the same cases: its median beside this run's")
    for name in ONE_RUN:
        sub.add_parser(name).add_argument("run")
    args = ap.parse_args()
    if args.table in ONE_RUN:
        ONE_RUN[args.table](args.run)
    elif args.table == "speed":
        speed(args.runs)
    elif args.table == "decode-fp8":
        decode_fp8(args.runs)
    elif args.table == "mla-heads":
        mla_heads(args.run, args.before)
    else:
        providers(args.run, args.seq)


if __name__ == "__main__":
    main()

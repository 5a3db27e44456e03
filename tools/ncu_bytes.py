"""Nsight Compute check of the byte model: measured DRAM bytes per attention call vs flashbench.models.io_model.

    python3 tools/ncu_bytes.py drive [--impls naive,sdpa-math,sdpa-flash,bundled] [--seq 1024,4096,8192]
                                          [--batch 1] [--heads 16] [--head-dim 128] [--dtype bf16]
                                          [--modes fwd,bwd] [--causal] [--cache-control all|none]
                                          [--kernels]
    python3 tools/ncu_bytes.py parse LOG.csv      # sum an existing `ncu --csv` log per metric

The naive backward's softmax step (io_model: CUDA's `tmp = grad * output` pass, then the softmax backward
kernel) is checked with
    python3 tools/ncu_bytes.py drive --impls naive,sdpa-math --modes bwd --seq 4096,8192 --kernels
which prints each profiled kernel's DRAM bytes beside the model's parts, in launch order.

`drive` runs, for every (impl, N, mode), one profiled process under
    ncu --profile-from-start off --clock-control none --cache-control all --csv --print-units base
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum python3 ncu_bytes.py one ...
The child warms up (Triton compile + autotune happen there, unprofiled), then brackets exactly one call with
cudaProfilerStart/Stop, so only that call's kernels are measured. The parser sums bytes over all kernels of
the call and prints model vs measured side by side; results go to $OUT (if set, else results/ncu_bytes/) as
ncu_bytes.json and ncu_bytes.csv, with each case's raw ncu log.

--cache-control all (ncu's default) flushes L2 before each kernel: bytes that one kernel leaves in L2 for the
next (the naive path's S at small N) are not credited, which is what the naive model assumes; the last
kernel's dirty L2 lines written back after it ends are not counted. Run again with `--cache-control none` to
see what inter-kernel L2 reuse saves. Within one kernel (K/V re-reads of a tiled kernel) L2 works as usual,
so measured flash bytes should sit between the compulsory and the no-L2 model.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
IMPL_FAMILY = {
    "naive": "naive",
    "sdpa-math": "sdpa-math",
    "sdpa-flash": "flash",
    "bundled": "flash",
    "bundled-stored-p": "stored-p",
    "bundled-v1": "flash-v1",
}
CONFIG_MARK = "FBCONFIG "  # print_config's line prefix
OFF_THRESHOLD = 0.25  # a case where the model is off by more than 25% is flagged for an explanation
_SCALE = {
    "byte": 1,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "nsecond": 1e-9,
    "usecond": 1e-6,
    "msecond": 1e-3,
    "second": 1.0,
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
}


# ------------------------------------------------------------------------------------------ the child


def _naive(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """Exactly the code io_model's "naive" family models."""
    import torch

    scale = q.shape[-1] ** -0.5
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return p @ v


def _impl(name: str) -> Any:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "naive":
        return _naive
    if name in ("sdpa-math", "sdpa-flash"):
        backend = SDPBackend.MATH if name == "sdpa-math" else SDPBackend.FLASH_ATTENTION

        def sdpa(q: Any, k: Any, v: Any, causal: bool) -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return sdpa
    from flashbench import kernels

    fn = {
        "bundled": kernels.flash_attn,
        "bundled-stored-p": kernels.flash_attn_stored_p,
        "bundled-v1": kernels.flash_attn_v1,
    }[name]
    return lambda q, k, v, causal: fn(q, k, v, causal=causal)


def child(args: argparse.Namespace) -> None:
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    n, bwd = args.seq, args.mode == "bwd"
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=bwd) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=dtype)
    fn = _impl(args.impl)
    for _ in range(3):  # compile, autotune, allocator warm-up: all outside the profiled region
        out = fn(q, k, v, args.causal)
        if bwd:
            out.backward(do)
            q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()
    if bwd:
        out = fn(q, k, v, args.causal)
        torch.cuda.synchronize()
    torch.cuda.profiler.start()
    if bwd:
        out.backward(do)
    else:
        out = fn(q, k, v, args.causal)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    config: dict[str, Any] = {}
    if args.impl.startswith("bundled"):
        from flashbench.kernels.backward import last_bwd_config

        from flashbench import kernels

        config = {"fwd": kernels.last_config(), "bwd": last_bwd_config()}
    print_config(config)


def print_config(config: Any) -> None:
    """The profiled child's report of the config its kernels ran, one stdout line the driver reads (read_config)."""
    print(CONFIG_MARK + json.dumps(config, default=str), flush=True)


def read_config(stdout: str) -> Any:
    """The config a profiled child printed (print_config), or None where it printed none."""
    lines = [line[len(CONFIG_MARK) :] for line in stdout.splitlines() if line.startswith(CONFIG_MARK)]
    return json.loads(lines[-1]) if lines else None


# ------------------------------------------------------------------------------------------ parsing


def parse_ncu_csv(text: str) -> dict[str, Any]:
    """Sum each metric over all profiled kernels of an `ncu --csv` log; also per-kernel totals."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    totals = {m: 0.0 for m in METRICS}
    kernels: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        metric = row.get("Metric Name")
        if metric not in totals:
            continue
        raw = (row.get("Metric Value") or "0").replace(",", "")
        unit = (row.get("Metric Unit") or "").strip().lower()
        value = float(raw) * _SCALE.get(unit, 1.0)
        if metric == "gpu__time_duration.sum" and unit in ("", "byte"):
            value *= 1e-9  # base unit is ns
        totals[metric] += value
        kid = row.get("ID", "?")
        entry = kernels.setdefault(kid, {"kernel": row.get("Kernel Name", ""), **{m: 0.0 for m in METRICS}})
        entry[metric] += value
    return {
        "read_bytes": int(totals["dram__bytes_read.sum"]),
        "write_bytes": int(totals["dram__bytes_write.sum"]),
        "gpu_time_s": totals["gpu__time_duration.sum"],
        "kernels": list(kernels.values()),
    }


# ------------------------------------------------------------------------------------------ the driver


def _blocks(config: dict[str, Any]) -> Any:
    from flashbench.models.io_model import Blocks

    base = Blocks()
    fwd = config.get("fwd") or {}
    bwd = config.get("bwd") or {}
    dkdv, dq = bwd.get("dkdv") or {}, bwd.get("dq") or {}
    return Blocks(
        fwd_m=int(fwd.get("BLOCK_M", base.fwd_m)),
        fwd_n=int(fwd.get("BLOCK_N", base.fwd_n)),
        bwd_m=int(dq.get("BLOCK_M", base.bwd_m)),
        bwd_n=int(dkdv.get("BLOCK_N", base.bwd_n)),
    )


def model_bytes(
    impl: str, args: argparse.Namespace, n: int, mode: str, config: dict[str, Any]
) -> dict[str, int]:
    from flashbench.models import io_model

    e = {"fp16": 2, "bf16": 2, "fp32": 4}[args.dtype]
    shape = (args.batch, args.heads, args.heads, n, n, args.head_dim, e, args.causal, mode)
    fam = IMPL_FAMILY[impl]
    blocks = _blocks(config)
    return {
        "compulsory": io_model.compulsory_traffic(*shape[:7], mode).total,
        "model": io_model.hbm_traffic(fam, *shape, l2_reuse=True, blocks=blocks).total,
        "model_no_l2": io_model.hbm_traffic(fam, *shape, l2_reuse=False, blocks=blocks).total,
    }


def drive(args: argparse.Namespace) -> int:
    out_dir = Path(os.environ.get("OUT") or "results/ncu_bytes")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for impl in args.impls.split(","):
        for n in (int(x) for x in args.seq.split(",")):
            for mode in args.modes.split(","):
                tag = f"{impl}_N{n}_{mode}"
                log = out_dir / f"{tag}.ncu.csv"
                cmd = [
                    args.ncu,
                    "--profile-from-start",
                    "off",
                    "--clock-control",
                    "none",
                    "--cache-control",
                    args.cache_control,
                    "--metrics",
                    ",".join(METRICS),
                    "--csv",
                    "--print-units",
                    "base",
                    "--log-file",
                    str(log),
                    sys.executable,
                    __file__,
                    "one",
                    "--impl",
                    impl,
                    "--seq",
                    str(n),
                    "--mode",
                    mode,
                    "--batch",
                    str(args.batch),
                    "--heads",
                    str(args.heads),
                    "--head-dim",
                    str(args.head_dim),
                    "--dtype",
                    args.dtype,
                ] + (["--causal"] if args.causal else [])
                t0 = time.time()
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                entry: dict[str, Any] = {"impl": impl, "family": IMPL_FAMILY[impl], "seq": n, "mode": mode}
                if proc.returncode != 0 or not log.is_file():
                    entry["error"] = (proc.stderr or proc.stdout)[-600:]
                    print(f"{tag}: FAILED ({proc.returncode})\n{entry['error']}", file=sys.stderr)
                    results.append(entry)
                    continue
                config = read_config(proc.stdout) or {}
                measured = parse_ncu_csv(log.read_text(errors="replace"))
                model = model_bytes(impl, args, n, mode, config)
                total = measured["read_bytes"] + measured["write_bytes"]
                entry.update(measured=measured, model=model, config=config, wall_s=round(time.time() - t0, 1))
                entry["measured_bytes"] = total
                entry["ratio_measured_over_model"] = total / model["model"] if model["model"] else None
                entry["off_by_more_than_25pct"] = abs(entry["ratio_measured_over_model"] - 1) > OFF_THRESHOLD
                print(
                    f"{tag}: measured {total / 1e9:.3f} GB, model {model['model'] / 1e9:.3f} GB",
                    file=sys.stderr,
                )
                results.append(entry)
    meta = {
        "batch": args.batch,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "causal": args.causal,
        "cache_control": args.cache_control,
        "metrics": METRICS,
    }
    (out_dir / "ncu_bytes.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2, default=str)
    )
    _write_csv(out_dir / "ncu_bytes.csv", results)
    _print_table(results, meta)
    if args.kernels:
        _print_kernels(results, args)
    return 0 if all("error" not in r for r in results) else 1


def _print_kernels(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Per case: the measured kernels (launch order) and the model's parts, bytes read / written in MB."""
    from flashbench.models import io_model

    e = {"fp16": 2, "bf16": 2, "fp32": 4}[args.dtype]
    for r in results:
        if "error" in r:
            continue
        print(f"\n{r['impl']} N={r['seq']} {r['mode']}: measured kernels | model parts (MB read / written)")
        for k in r["measured"]["kernels"]:
            read, write = k["dram__bytes_read.sum"] / 1e6, k["dram__bytes_write.sum"] / 1e6
            print(f"  ncu    {read:10.1f} {write:10.1f}  {k['kernel'][:90]}")
        shape = (
            args.batch,
            args.heads,
            args.heads,
            r["seq"],
            r["seq"],
            args.head_dim,
            e,
            args.causal,
            r["mode"],
        )
        for part in io_model.hbm_traffic(r["family"], *shape, blocks=_blocks(r.get("config") or {})).parts:
            print(f"  model  {part.read / 1e6:10.1f} {part.write / 1e6:10.1f}  {part.name}")


def _write_csv(path: Path, results: list[dict[str, Any]]) -> None:
    cols = [
        "impl",
        "family",
        "seq",
        "mode",
        "measured_read",
        "measured_write",
        "measured_total",
        "model",
        "model_no_l2",
        "compulsory",
        "ratio",
        "gpu_time_ms",
        "kernels",
        "error",
    ]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in results:
            m, mo = r.get("measured") or {}, r.get("model") or {}
            w.writerow(
                [
                    r["impl"],
                    r["family"],
                    r["seq"],
                    r["mode"],
                    m.get("read_bytes"),
                    m.get("write_bytes"),
                    r.get("measured_bytes"),
                    mo.get("model"),
                    mo.get("model_no_l2"),
                    mo.get("compulsory"),
                    r.get("ratio_measured_over_model"),
                    (m.get("gpu_time_s") or 0) * 1e3,
                    len(m.get("kernels", [])),
                    r.get("error", ""),
                ]
            )


def _print_table(results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    print(
        f"\nDRAM bytes per call, ncu vs flashbench model (B={meta['batch']} H={meta['heads']} "
        f"d={meta['head_dim']} {meta['dtype']} {'causal' if meta['causal'] else 'full'}, "
        f"--cache-control {meta['cache_control']})"
    )
    head = (
        f"{'impl':17s} {'N':>6s} {'mode':4s} {'measured GB':>12s} {'model GB':>10s} {'no-L2 GB':>10s} "
        f"{'floor GB':>9s} {'meas/model':>10s} {'kernels':>7s} {'ms':>8s}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['impl']:17s} {r['seq']:>6d} {r['mode']:4s} FAILED")
            continue
        m, mo = r["measured"], r["model"]
        flag = "  <-- off >25%" if r["off_by_more_than_25pct"] else ""
        print(
            f"{r['impl']:17s} {r['seq']:>6d} {r['mode']:4s} {r['measured_bytes'] / 1e9:12.4f} "
            f"{mo['model'] / 1e9:10.4f} {mo['model_no_l2'] / 1e9:10.4f} {mo['compulsory'] / 1e9:9.4f} "
            f"{r['ratio_measured_over_model']:10.2f} {len(m['kernels']):7d} {m['gpu_time_s'] * 1e3:8.3f}{flag}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("drive", "one"):
        p = sub.add_parser(name)
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--heads", type=int, default=16)
        p.add_argument("--head-dim", type=int, default=128)
        p.add_argument("--dtype", default="bf16", choices=("fp16", "bf16", "fp32"))
        p.add_argument("--causal", action="store_true")
        if name == "drive":
            p.add_argument("--impls", default="naive,sdpa-math,sdpa-flash,bundled")
            p.add_argument("--seq", default="1024,4096,8192")
            p.add_argument("--modes", default="fwd,bwd")
            p.add_argument("--cache-control", default="all", choices=("all", "none"))
            p.add_argument("--ncu", default="ncu")
            p.add_argument("--timeout", type=int, default=300)
            p.add_argument(
                "--kernels", action="store_true", help="also list each kernel beside the model's parts"
            )
        else:
            p.add_argument("--impl", required=True, choices=sorted(IMPL_FAMILY))
            p.add_argument("--seq", type=int, required=True)
            p.add_argument("--mode", default="fwd", choices=("fwd", "bwd"))
    pp = sub.add_parser("parse")
    pp.add_argument("log")
    args = ap.parse_args(argv)
    if args.cmd == "one":
        child(args)
        return 0
    if args.cmd == "parse":
        print(json.dumps(parse_ncu_csv(Path(args.log).read_text(errors="replace")), indent=2))
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())

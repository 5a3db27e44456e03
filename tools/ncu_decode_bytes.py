"""Nsight Compute check of the split-KV decode byte model: DRAM bytes of one flash_decode call vs the decode family
of flashbench.models.io_model (Q, K and V over the valid lengths once per KV head, O, and 2 x the fp32 split
partials), on a few decode shapes, contiguous, paged and ragged, with the heuristic's split count and forced ones.

    python3 tools/ncu_decode_bytes.py drive [--shapes all|NAME,...] [--splits auto,1,32]
    python3 tools/ncu_decode_bytes.py one --shape NAME --splits auto      # the profiled child

Each (shape, splits) runs one child under
    ncu --profile-from-start off --clock-control none --cache-control all --csv --print-units base
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
which builds the inputs the sweep builds (flashbench.engine.kv_cache: shuffled pages, seeded ragged lengths),
calls flash_decode twice unprofiled (compile; the cached launch), then once between cudaProfilerStart/Stop.
The table prints measured and modelled bytes and their ratio; |ratio - 1| > 15% is flagged. Results go to $OUT
(else results/ncu_decode_bytes/) as ncu_decode_bytes.json with each case's raw ncu log.

What to expect (why a case may differ): the split partials are written and read back inside the one kernel (the
last program of a group combines), so they mostly stay in L2: measured bytes may sit below the model by up to
the partials' share (the model counts them as DRAM traffic, an upper bound: the column `partials` shows it);
--cache-control all flushes L2 before the kernel, so K and V are read from DRAM once; the page table, the
lengths and the counters (< 0.01% of the bytes) are not modelled.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ncu_bytes import METRICS, parse_ncu_csv, print_config, read_config  # noqa: E402  (the same ncu log parser)

# name: (batch, heads, kv_heads, seq_q, N, layout, page_size, seqlens); bf16, d = 128, causal
SHAPES: dict[str, tuple[int, int, int, int, int, str, int, str]] = {
    "gqa-b1-32k": (1, 32, 8, 1, 32768, "contiguous", 0, "uniform"),
    "gqa-b4-8k": (4, 32, 8, 1, 8192, "contiguous", 0, "uniform"),
    "mha-b8-8k": (8, 32, 32, 1, 8192, "contiguous", 0, "uniform"),
    "gqa-b4-8k-paged16": (4, 32, 8, 1, 8192, "paged", 16, "uniform"),
    "gqa-b16-16k-ragged-paged64": (16, 32, 8, 1, 16384, "paged", 64, "random"),
    "gqa-b2-4k-nq4": (2, 32, 8, 4, 4096, "contiguous", 0, "uniform"),
}
OFF = 0.15


def _case(name: str) -> Any:
    from flashbench.spec.cases import Case

    b, h, kv, nq, n, layout, page, lens = SHAPES[name]
    return Case("triton-decode", b, h, kv, nq, n, 128, "bf16", True, "fwd", layout, page, lens, 0)


def child(args: argparse.Namespace) -> None:
    import torch
    from flashbench.kernels.decode import flash_decode, last_decode_config

    from flashbench.engine import kv_cache

    case = _case(args.shape)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(
        case.batch, case.heads, case.seq_q, 128, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    k, v = (
        torch.randn(
            case.batch, case.kv_heads, case.seq_k, 128, device="cuda", dtype=torch.bfloat16, generator=gen
        )
        for _ in range(2)
    )
    k, v, cache = kv_cache.build(case, k, v)
    splits = None if args.splits == "auto" else int(args.splits)
    lens, table = cache.get("cache_seqlens"), cache.get("block_table")
    for validate in (True, False):  # compile and check, then the cached launch: both unprofiled
        flash_decode(q, k, v, lens, table, causal=True, num_splits=splits, validate=validate)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    flash_decode(q, k, v, lens, table, causal=True, num_splits=splits, validate=False)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print_config(last_decode_config())


def model(name: str, config: dict[str, Any]) -> dict[str, int]:
    from flashbench.models import io_model

    c = _case(name)
    lens = c.kv_lengths() if c.ragged else None
    blocks = io_model.Blocks.from_config(config)
    shape = (c.batch, c.heads, c.kv_heads, c.seq_q, c.seq_k, 128, 2, True, "fwd")
    t = io_model.hbm_traffic("decode", *shape, blocks=blocks, seqlens_k=lens)
    partials = sum(p.read + p.write for p in t.parts if p.name.startswith("split partials"))
    return {"read": t.read, "write": t.write, "total": t.total, "partials": partials}


def drive(args: argparse.Namespace) -> int:
    out_dir = Path(os.environ.get("OUT") or "results/ncu_decode_bytes")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(SHAPES) if args.shapes == "all" else args.shapes.split(",")
    results = []
    for name in names:
        for splits in args.splits.split(","):
            log = out_dir / f"{name}_s{splits}.ncu.csv"
            cmd = [
                args.ncu,
                "--profile-from-start",
                "off",
                "--clock-control",
                "none",
                "--cache-control",
                "all",
            ]
            cmd += ["--metrics", ",".join(METRICS), "--csv", "--print-units", "base", "--log-file", str(log)]
            cmd += [sys.executable, __file__, "one", "--shape", name, "--splits", splits]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            entry: dict[str, Any] = {"shape": name, "splits_asked": splits}
            config = read_config(proc.stdout)
            if proc.returncode != 0 or not log.is_file() or config is None:
                entry["error"] = (proc.stderr or proc.stdout)[-600:]
                print(
                    f"{name} splits={splits}: FAILED ({proc.returncode})\n{entry['error']}", file=sys.stderr
                )
                results.append(entry)
                continue
            measured = parse_ncu_csv(log.read_text())
            entry.update(config=config, measured=measured)
            entry["model"] = model(name, entry["config"])
            entry["ratio"] = (measured["read_bytes"] + measured["write_bytes"]) / entry["model"]["total"]
            results.append(entry)
    (out_dir / "ncu_decode_bytes.json").write_text(json.dumps(results, indent=2, default=str))
    print(
        f"{'shape':28s} {'splits':>6s} {'measured MB':>12s} {'model MB':>9s} {'partials MB':>11s} {'ratio':>6s}"
    )
    bad = 0
    for e in results:
        if "error" in e:
            print(f"{e['shape']:28s} {e['splits_asked']:>6s} FAILED")
            bad += 1
            continue
        total = (e["measured"]["read_bytes"] + e["measured"]["write_bytes"]) / 1e6
        off = abs(e["ratio"] - 1) > OFF
        bad += off
        print(
            f"{e['shape']:28s} {e['config']['num_splits']:>6d} {total:12.2f} {e['model']['total'] / 1e6:9.2f} "
            f"{e['model']['partials'] / 1e6:11.3f} {e['ratio']:6.3f}" + ("  <- off by > 15%" if off else "")
        )
    print(f"results: {out_dir / 'ncu_decode_bytes.json'}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drive")
    d.add_argument("--shapes", default="all", help=f"all or a comma list of {', '.join(SHAPES)}")
    d.add_argument("--splits", default="auto,1,32", help="split counts: auto (the heuristic) and forced ones")
    d.add_argument("--ncu", default="ncu")
    d.add_argument("--timeout", type=float, default=300.0)
    o = sub.add_parser("one")
    o.add_argument("--shape", required=True, choices=list(SHAPES))
    o.add_argument("--splits", default="auto")
    args = parser.parse_args(argv)
    if args.cmd == "one":
        child(args)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())

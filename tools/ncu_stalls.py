"""Where a kernel's warps wait: Nsight Compute's warp stall samples by reason and by SASS instruction, and the
shared-memory wavefronts each instruction costs beyond its ideal (bank conflicts).

    python3 tools/ncu_stalls.py decode --shape 16,32,8,8192 [--shape ...] [--kv-dtype fp8] [--top 25]
    python3 tools/ncu_stalls.py summary FILE.csv[.gz] [--top 25]

`decode` (on the GPU machine) profiles one flash_decode call per shape (B,H,HKV,N[,PAGE]; bf16 q, d = 128,
causal, Nq = 1; the cache as the sweep draws it, e4m3 with one scale per (sequence, KV head) under --kv-dtype fp8)
with `ncu --set full --import-source no --clock-control none`: two unprofiled calls (compile, cached launch), then
one between cudaProfilerStart/Stop. It keeps, per shape, in $OUT (else results/ncu_stalls/): the details page
(`ncu -i REP --page details`), the source page as gzipped CSV (`--page source --csv --print-source sass`) and
this tool's summary of it; the report itself is deleted (tens of MB). `summary` reads such a source page anywhere.

The summary: the stall samples summed over the source page's `stall_*` columns (all samples, issued or not: a
sample of a warp that issued is `selected`), each reason's share; the instructions with the most samples, with
their main reason; the hottest code (the instructions executed the same number of times that hold the most samples:
a loop's body) and its samples by opcode; the code by execution count (each group's runs of lines and their
samples: a warp-specialized kernel's loops, tile code and program code apart); and the shared-memory instructions
whose wavefronts pass their ideal (`L1 Wavefronts Shared` over `... Ideal`: a bank conflict replays the access),
with the total excess.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ncu_bytes import print_config, read_config  # noqa: E402  (the profiled child's config line)

SOURCE = "Source"
SAMPLES = "Warp Stall Sampling (All Samples)"
WAVEFRONTS, IDEAL = "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"
EXECUTED = "Instructions Executed"


def read_source_page(path: str | Path) -> list[dict[str, str]]:
    """The instruction rows of an ncu source page in CSV (plain or .gz): one dict per SASS line."""
    raw = Path(path).read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    lines = list(csv.reader(io.StringIO(text)))
    start = next((i for i, row in enumerate(lines) if SOURCE in row and SAMPLES in row), None)
    if start is None:
        raise ValueError(f"{path}: no source-page header (columns {SOURCE!r} and {SAMPLES!r})")
    header = lines[start]
    return [dict(zip(header, row, strict=False)) for row in lines[start + 1 :] if len(row) == len(header)]


def _int(text: str | None) -> int:
    try:
        return int(float(text or 0))
    except ValueError:
        return 0


def summarize(rows: list[dict[str, str]], top: int = 25) -> dict[str, Any]:
    """Stall reasons (samples, share), the `top` instructions by samples, and shared-memory excess wavefronts."""
    reasons = [key for key in rows[0] if key.startswith("stall_") and "Not Issued" not in key] if rows else []
    totals: collections.Counter[str] = collections.Counter()
    for row in rows:
        for key in reasons:
            totals[key[len("stall_") :]] += _int(row.get(key))
    samples = sum(totals.values())
    hot = []
    for index, row in enumerate(rows):
        count = _int(row.get(SAMPLES))
        if count:
            main = max(reasons, key=lambda key: _int(row.get(key)))[len("stall_") :] if reasons else ""
            hot.append({"line": index, "sass": row.get(SOURCE, "").strip(), "samples": count, "reason": main})
    hot.sort(key=lambda item: -item["samples"])
    shared = [
        {"line": i, "sass": row.get(SOURCE, "").strip(), "wavefronts": _int(row.get(WAVEFRONTS)),
         "ideal": _int(row.get(IDEAL)), "executed": _int(row.get(EXECUTED))}
        for i, row in enumerate(rows)
        if _int(row.get(WAVEFRONTS)) > _int(row.get(IDEAL))
    ]  # fmt: skip
    wavefronts = sum(_int(row.get(WAVEFRONTS)) for row in rows)
    excess = sum(item["wavefronts"] - item["ideal"] for item in shared)
    groups = code_groups(rows)
    return {
        "samples": samples,
        "reasons": {name: count for name, count in totals.most_common() if count},
        "top": hot[:top],
        "hottest": hottest_block(groups),
        "groups": groups,
        "shared_wavefronts": wavefronts,
        "shared_excess": excess,
        "shared_conflicted": shared,
    }


def opcode(sass: str) -> str:
    """A SASS line's opcode without its predicate and modifiers: `@!P0  BRA 0x...` -> BRA."""
    words = [word for word in sass.split() if not word.startswith("@")]
    return words[0].split(".")[0] if words else ""


def code_groups(rows: list[dict[str, str]], top: int = 8) -> list[dict[str, Any]]:
    """The code by execution count: the instructions executed the same number of times (a loop's straight-line
    body, a tile's or a program's code; in a warp-specialized kernel each partition's), the `top` groups with the
    most stall samples, most first. Each: its execution count, samples, instructions, its runs of consecutive
    source-page lines (first, last, samples), and its samples by opcode, most first."""
    groups: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
    for index, row in enumerate(rows):
        groups[_int(row.get(EXECUTED))].append(index)
    out = []
    for executed, lines in groups.items():
        opcodes: collections.Counter[str] = collections.Counter()
        runs: list[list[int]] = []
        for index in lines:
            samples = _int(rows[index].get(SAMPLES))
            opcodes[opcode(rows[index].get(SOURCE, ""))] += samples
            if runs and runs[-1][1] == index - 1:
                runs[-1][1] = index
                runs[-1][2] += samples
            else:
                runs.append([index, index, samples])
        out.append(
            {
                "executed": executed,
                "samples": sum(opcodes.values()),
                "instructions": len(lines),
                "runs": [tuple(run) for run in runs],
                "opcodes": {name: count for name, count in opcodes.most_common() if count},
            }
        )
    out.sort(key=lambda group: -group["samples"])
    return out[:top]


def hottest_block(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The hottest code (the first of code_groups'): its execution count, its samples and its samples by opcode."""
    if not groups:
        return {"executed": 0, "samples": 0, "opcodes": {}}
    return {key: groups[0][key] for key in ("executed", "samples", "opcodes")}


def render(summary: dict[str, Any]) -> str:
    samples = max(1, summary["samples"])
    out = [f"warp stall samples: {summary['samples']}"]
    out += [
        f"  {name:20s} {count:8d} {100 * count / samples:5.1f}%" for name, count in summary["reasons"].items()
    ]
    out.append(
        "instructions with the most samples (line in the source page, SASS, samples, share, main reason):"
    )
    out += [
        f"  #{item['line']:<5d} {item['sass'][:64]:64s} {item['samples']:6d} {100 * item['samples'] / samples:5.1f}%"
        f"  {item['reason']}"
        for item in summary["top"]
    ]
    hot = summary["hottest"]
    out.append(
        f"the hottest code, the instructions executed {hot['executed']} times each: {hot['samples']} samples"
        f" ({100 * hot['samples'] / samples:.1f}%), by opcode:"
    )
    out += [
        f"  {name:20s} {count:8d} {100 * count / max(1, hot['samples']):5.1f}%"
        for name, count in list(hot["opcodes"].items())[:12]
    ]
    out.append(
        "the code by execution count (instructions executed as often; runs of source-page lines with their samples):"
    )
    for group in summary["groups"]:
        runs = ", ".join(f"{first}-{last} {count}" for first, last, count in group["runs"][:12])
        more = f" and {len(group['runs']) - 12} more" if len(group["runs"]) > 12 else ""
        top_ops = ", ".join(f"{name} {count}" for name, count in list(group["opcodes"].items())[:4])
        out.append(
            f"  {group['executed']:>9d}x: {group['samples']:6d} samples ({100 * group['samples'] / samples:4.1f}%),"
            f" {group['instructions']} instructions; lines {runs}{more}; {top_ops}"
        )
    share = 100 * summary["shared_excess"] / max(1, summary["shared_wavefronts"])
    out.append(
        f"shared memory: {summary['shared_wavefronts']} wavefronts, {summary['shared_excess']} beyond the ideal"
        f" ({share:.1f}%), from {len(summary['shared_conflicted'])} instructions:"
    )
    out += [
        f"  #{item['line']:<5d} {item['sass'][:64]:64s} {item['wavefronts'] / max(1, item['ideal']):4.1f}x the ideal"
        for item in sorted(summary["shared_conflicted"], key=lambda it: it["ideal"] - it["wavefronts"])[:12]
    ]
    return "\n".join(out)


def child(args: argparse.Namespace) -> None:
    """One flash_decode case: two unprofiled calls, then one between cudaProfilerStart/Stop."""
    import torch
    from flashbench.kernels.decode import flash_decode, last_decode_config

    from flashbench.engine import kv_cache
    from flashbench.spec.parse import parse_decode_shape

    q, k, v, kw = kv_cache.probe_inputs(*parse_decode_shape(args.shape), args.kv_dtype)
    for validate in (True, False):
        flash_decode(q, k, v, validate=validate, **kw)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    flash_decode(q, k, v, validate=False, **kw)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print_config(last_decode_config())


def drive(args: argparse.Namespace) -> int:
    out_dir = Path(os.environ.get("OUT") or "results/ncu_stalls")
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for shape in args.shape:
        stem = out_dir / f"decode-{args.kv_dtype}-{shape.replace(',', '-')}"
        report = stem.with_suffix(".ncu-rep")
        cmd = [args.ncu, "--profile-from-start", "off", "--clock-control", "none", "--set", "full"]
        cmd += ["--import-source", "no", "-f", "-o", str(report)]
        cmd += [sys.executable, __file__, "one", "--shape", shape, "--kv-dtype", args.kv_dtype]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        config = read_config(proc.stdout)
        if proc.returncode != 0 or not report.is_file() or config is None:
            print(
                f"{shape}: FAILED ({proc.returncode})\n{(proc.stderr or proc.stdout)[-600:]}", file=sys.stderr
            )
            failed += 1
            continue
        pages = {}
        for page, extra in (("details", []), ("source", ["--csv", "--print-source", "sass"])):
            done = subprocess.run(
                [args.ncu, "-i", str(report), "--page", page, *extra],
                capture_output=True,
                text=True,
                timeout=300,
            )
            pages[page] = done.stdout
        report.unlink()
        stem.with_suffix(".details.txt").write_text(pages["details"])
        stem.with_suffix(".source.csv.gz").write_bytes(gzip.compress(pages["source"].encode()))
        text = f"{shape} {args.kv_dtype} {json.dumps(config)}\n" + render(
            summarize(read_source_page(stem.with_suffix(".source.csv.gz")), args.top)
        )
        stem.with_suffix(".summary.txt").write_text(text + "\n")
        print(text, flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="profile flash_decode calls under ncu (GPU machine)")
    d.add_argument("--shape", action="append", required=True, metavar="B,H,HKV,N[,PAGE]")
    d.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    d.add_argument("--top", type=int, default=25)
    d.add_argument("--ncu", default="ncu")
    d.add_argument("--timeout", type=float, default=300.0)
    o = sub.add_parser("one", help="the profiled child of `decode`")
    o.add_argument("--shape", required=True)
    o.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    s = sub.add_parser("summary", help="summarize an ncu source page (CSV, plain or .gz)")
    s.add_argument("file")
    s.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if args.command == "summary":
        try:
            print(render(summarize(read_source_page(args.file), args.top)))
        except (OSError, ValueError) as err:
            print(f"ncu_stalls: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "one":
        child(args)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())

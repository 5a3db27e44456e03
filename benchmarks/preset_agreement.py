"""Preset agreement: the same cases measured by `flashbench sweep` under two presets, twice each, must agree.

    python benchmarks/preset_agreement.py     # on a GPU; writes $OUT/agreement.json (and the runs) when OUT is set

Runs `flashbench sweep --preset quick` and `--preset speed`, restricted by flags to the same cases (the
bundled `triton` forward and `sdpa-cudnn`, bf16, d = 128, 16k tokens, N = 1024 and 8192, causal both), in the
order quick, speed, quick, speed, each in a fresh worker. Per case the four medians' spread (max / min - 1)
must stay within 3% (exit code 1 otherwise). Before the presets shared one regime, the bundled d = 128
N = 8192 forward read 692 TFLOP/s in `quick` and 624 in `speed` on one H100 within the hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from flashbench.results.rows import read_rows

TOLERANCE_PCT = 3.0
RUNS = [("quick", 1), ("speed", 1), ("quick", 2), ("speed", 2)]
CASES = ["--providers", "triton,sdpa-cudnn", "--seq", "1024,8192", "--head-dim", "128", "--dtype", "bf16"]
CASES += ["--tokens", "16384", "--causal", "both", "--mode", "fwd"]


def main() -> int:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    table: dict[str, dict[str, dict]] = {}
    for preset, i in RUNS:
        run_dir = out_dir / "runs" / f"{preset}-{i}"
        cmd = [sys.executable, "-m", "flashbench", "sweep", "--preset", preset, *CASES, "--out", str(run_dir)]
        print("$", " ".join(cmd[1:]), flush=True)
        done = subprocess.run([*cmd, "--force"], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 2
        for row in read_rows(run_dir):
            table.setdefault(row.key, {})[f"{preset}-{i}"] = {
                "status": row.status,
                "median_ms": row.median_ms,
                "tflops": row.tflops,
                "sm_clock_mhz": row.sm_clock_mhz,
                "warmup_s": row.warmup_s,
                "warmup_settled": row.warmup_settled,
                "host_time_included": row.host_time_included,
                "throttle_reasons": row.throttle_reasons,
            }
    results = []
    names = [f"{p}-{i}" for p, i in RUNS]
    print(f"{'case':44s} " + " ".join(f"{n:>16s}" for n in names) + "  spread")
    for key, by_run in table.items():
        medians = [by_run[n]["median_ms"] for n in names if by_run.get(n, {}).get("status") == "ok"]
        spread = (max(medians) / min(medians) - 1) * 100 if len(medians) == len(names) else None
        results.append({"case": key, "runs": by_run, "spread_pct": spread})
        cells = []
        for n in names:
            r = by_run.get(n, {})
            ok = r.get("status") == "ok"
            cells.append(
                f"{r['tflops']:6.1f} @{r['sm_clock_mhz'] or 0:5.0f}MHz" if ok else f"{r.get('status')!s:>16s}"
            )
        print(
            f"{key:44s} " + " ".join(f"{c:>16s}" for c in cells) + (f"  {spread:5.2f}%" if spread else "  -")
        )
    bad = [r for r in results if r["spread_pct"] is None or r["spread_pct"] > TOLERANCE_PCT]
    payload = {"tolerance_pct": TOLERANCE_PCT, "runs": names, "flags": CASES, "cases": results}
    (out_dir / "agreement.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"{len(results)} cases, {len(bad)} spread beyond {TOLERANCE_PCT}% (TFLOP/s @ median SM clock)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""How the L2 flush before each sample changes the time of the call after it: write flush vs read flush.

    python3 benchmarks/l2_flush.py            # on a GPU; writes $OUT/l2_flush.json when OUT is set

A flush that writes its buffer (torch's zero_, as triton.testing.do_bench does) leaves every L2 line dirty;
the timed call that follows evicts them and pays for their write-back to HBM (up to the L2's size: 50 MB on an
H100, ~16 us at 3 TB/s). A flush that reads its buffer leaves clean lines, dropped for free. For a long
compute-bound call the difference is noise; for a memory-bound call of tens of microseconds (decode over a KV
cache) it is a large part of the time. Every case below is measured in the sweep's regime (measure_case) under
each flush:
    write    zero a buffer of 2x the L2 (the flush flashbench used before)
    read     sum a buffer of 2x the L2
    read4x   sum a buffer of 4x the L2 (does a larger read evict more?)
    none     no flush (a KV cache larger than the L2 is mostly cold anyway)
and a pure read of 134 MB (torch.sum over bf16) as the control: its time under "read" is what HBM allows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from flashbench.engine import timing
from flashbench.engine.measure import Context, Options, measure_case
from flashbench.gpu import nvml
from flashbench.providers import builtin
from flashbench.spec.cases import Case


def decode(provider: str, batch: int, kv_heads: int, n: int) -> Case:
    return Case(provider, batch, 32, kv_heads, 1, n, 128, "bf16", True, "fwd")


CASES = [
    *(
        decode(p, b, kv, n)
        for b, kv, n in ((1, 8, 8192), (4, 8, 8192), (1, 8, 32768), (4, 32, 8192))
        for p in ("triton-decode", "sdpa-cudnn")
    ),
    *(
        Case(p, b, 16, 16, n, n, 128, "bf16", causal, "fwd")
        for b, n, causal in ((16, 1024, True), (2, 8192, False))
        for p in ("triton", "sdpa-cudnn")
    ),
]
MODES = {"write": ("write", 2), "read": ("read", 2), "read4x": ("read", 4), "none": None}


def flusher(mode: str) -> Any:
    spec = MODES[mode]
    if spec is None:
        return lambda: None
    return timing.L2Flusher(torch.cuda.current_device(), spec[0], spec[1])


def control(mode: str, opts: Options, ctx: Context) -> dict[str, Any]:
    """torch.sum over 134 MB of bf16: a pure HBM read."""
    x = torch.randn(134 * 2**20 // 2 // 1024, 1024, device="cuda", dtype=torch.bfloat16)
    sink = torch.zeros((), device="cuda", dtype=torch.float32)
    took = timing.measure_cuda(
        lambda: torch.sum(x.view(-1), dim=0, dtype=torch.float32, out=sink),
        flush=flusher(mode),
        regime=opts,
        sampler=nvml.ClockSampler(lambda: nvml.sample(0)),
    )
    median = sorted(took.samples_ms)[len(took.samples_ms) // 2]
    return {
        "median_ms": median,
        "gb_s": x.numel() * 2 / median / 1e6,
        "sm_clock_mhz": nvml.window_summary(took.window).get("sm_clock_mhz"),
    }


def main() -> int:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    if not torch.cuda.is_available():
        print("l2_flush: needs a CUDA GPU", file=sys.stderr)
        return 3
    builtin.load()
    opts = Options()
    points: list[dict[str, Any]] = []
    for mode in MODES:
        ctx = Context(device="cuda", gpu=torch.cuda.get_device_name())
        points.append({"case": "torch.sum 134 MB bf16", "mode": mode, **control(mode, opts, ctx)})
        ctx.flusher = flusher(mode)
        for case in CASES:
            row = measure_case(case, opts, ctx)[0]
            points.append(
                {
                    "case": case.key,
                    "mode": mode,
                    "status": row.status,
                    "reason": row.reason,
                    "median_ms": row.median_ms,
                    "sm_clock_mhz": row.sm_clock_mhz,
                }
            )
            print(
                f"{mode:7s} {case.key:64s} {row.status:6s} {row.median_ms or float('nan'):9.4f} ms "
                f"{row.sm_clock_mhz} MHz",
                flush=True,
            )
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "l2_flush.json").write_text(
        json.dumps(
            {"gpu": torch.cuda.get_device_name(), "regime": dataclasses.asdict(opts), "points": points},
            indent=2,
        )
        + "\n"
    )
    by = {(p["case"], p["mode"]): p for p in points}
    cases = list(dict.fromkeys(p["case"] for p in points))
    print(f"\n{'case':64s} " + " ".join(f"{m:>9s}" for m in MODES) + "   (median us)")
    for key in cases:
        cells = [by.get((key, m), {}).get("median_ms") for m in MODES]
        print(f"{key:64s} " + " ".join(f"{c * 1e3:9.1f}" if c else f"{'-':>9s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

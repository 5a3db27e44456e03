"""Fidelity: flashbench's median against triton.testing.do_bench's of the very same call, in one process.

    python benchmarks/fidelity.py            # on a GPU; writes $OUT/fidelity.json when OUT is set

Cases: bf16, d = 128, 16k tokens (16 heads): the bundled `triton` forward and `sdpa-cudnn` at N = 8192
non-causal (batch 2) and at N = 1024 causal (batch 16). Per case, in this order:
    flashbench   measure_case in the sweep's regime (steady warm-up, launch blocking, samples for 200 ms, or
                 up to 2 s while the SM clock moves) but with do_bench's L2 flush, a write (l2_flush="write"):
                 the comparison judges the timing, not the choice of flush
    do_bench     triton.testing.do_bench(call, warmup=1000, rep=2000, return_mode="median") of the same
                 callable: warm and long enough to be taken at the GPU's sustained clock, like flashbench's
    default      do_bench with its defaults (25 ms warm-up, 100 ms of samples): shown, not judged; it starts
                 from the clock the GPU recovered while the case was built, and catches one phase of a power
                 cap's swings
    unblocked    measure_case with block_launches=False (samples enqueued back to back, host gaps possible)
    flashbench   measure_case again
    read flush   measure_case in the sweep's own regime (the L2 emptied by a read): shown, not judged; the
                 write flush's dirty lines cost the call after it their write-back, and a write draws more
                 power, so under a power cap the read-flushed samples also run at a higher clock
The SM clock NVML read during each is printed beside it. The two flashbench medians' mean is compared with
do_bench's: agreement within 3% is the criterion (exit code 1 otherwise). The unblocked run shows what launch
blocking changes (median, p20-p80 spread, min): for a short case the host's launch time can exceed the GPU's,
and then gaps fall inside the events.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.testing

from flashbench.engine.measure import Context, Options, measure_case, prepare
from flashbench.gpu import nvml
from flashbench.providers import builtin
from flashbench.results.rows import Row
from flashbench.spec.cases import Case

TOLERANCE_PCT = 3.0
CASES = [
    Case(provider, batch, 16, 16, n, n, 128, "bf16", causal, "fwd")
    for batch, n, causal in ((2, 8192, False), (16, 1024, True))
    for provider in ("triton", "sdpa-cudnn")
]


def do_bench(case: Case, **knobs: Any) -> dict[str, Any]:
    """do_bench's median of the case's timed call, with the SM clock NVML read while it ran."""
    with contextlib.ExitStack() as stack:
        prepared = prepare(case, "cuda", stack)
        call, setup = prepared.timed()
        assert setup is None, "do_bench cannot run an untimed setup per sample (bwd-only mode)"
        call()  # compile / plan outside the measurement, as flashbench does
        torch.cuda.synchronize()
        sampler = nvml.ClockSampler(lambda: nvml.sample(0))
        sampler.start()
        sampler.mark()
        try:
            median = float(triton.testing.do_bench(call, return_mode="median", **knobs))
        finally:
            window = nvml.window_summary(sampler.stop())
    return {"median_ms": median, "sm_clock_mhz": window.get("sm_clock_mhz"), **knobs}


def shape(row: Row) -> dict[str, Any]:
    samples = row.samples_ms or [float("nan")]
    return {
        "status": row.status,
        "reason": row.reason,
        "median_ms": row.median_ms,
        "spread_pct": (row.p80_ms - row.p20_ms) / row.median_ms * 100 if row.median_ms else None,
        "min_ms": min(samples),
        "samples": len(row.samples_ms),
        "sm_clock_mhz": row.sm_clock_mhz,
        "warmup_s": row.warmup_s,
        "warmup_settled": row.warmup_settled,
        "host_time_included": row.host_time_included,
        "throttle_reasons": row.throttle_reasons,
    }


def main() -> int:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    if not torch.cuda.is_available():
        print("fidelity: needs a CUDA GPU", file=sys.stderr)
        return 3
    builtin.load()
    ctx = Context(device="cuda", gpu=torch.cuda.get_device_name())
    sweep = Options()  # the sweep's regime (SweepSpec's defaults: the L2 emptied by a read)
    opts = dataclasses.replace(sweep, l2_flush="write")  # the judged runs: do_bench's flush, a write
    unblocked = dataclasses.replace(opts, block_launches=False)
    points = []
    for case in CASES:
        first = shape(measure_case(case, opts, ctx)[0])
        ok = first["status"] == "ok"
        reference = do_bench(case, warmup=1000, rep=2000) if ok else None
        default = do_bench(case) if ok else None
        loose = shape(measure_case(case, unblocked, ctx)[0])
        second = shape(measure_case(case, opts, ctx)[0])
        read = shape(measure_case(case, sweep, ctx)[0])
        point: dict[str, Any] = {
            "case": case.key,
            "flashbench": [first, second],
            "do_bench": reference,
            "do_bench_default": default,
            "unblocked": loose,
            "sweep_read_flush": read,
        }
        if reference and first["status"] == second["status"] == "ok":
            ours = statistics.mean([first["median_ms"], second["median_ms"]])
            diff = (ours - reference["median_ms"]) / reference["median_ms"] * 100
            point.update(flashbench_ms=ours, diff_pct=diff, within_tolerance=abs(diff) <= TOLERANCE_PCT)
        points.append(point)
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "gpu": ctx.gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "regime": dataclasses.asdict(opts),
        "tolerance_pct": TOLERANCE_PCT,
        "points": points,
    }
    (out_dir / "fidelity.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(
        f"{'case':52s} {'flashbench':>16s} {'do_bench':>16s} {'diff':>6s} {'do_bench default':>16s} | "
        "unblocked median, p20-p80, min | blocked p20-p80, min | read flush (the sweep's)"
    )
    for p in points:
        a, b, loose = p["flashbench"][0], p["flashbench"][1], p["unblocked"]
        if "diff_pct" not in p:
            print(f"{p['case']:52s} {a['status']}: {a['reason'][:60]}")
            continue
        ref, default = p["do_bench"], p["do_bench_default"]
        clock = statistics.mean([a["sm_clock_mhz"] or 0, b["sm_clock_mhz"] or 0])
        print(
            f"{p['case']:52s} {p['flashbench_ms']:7.4f} @{clock:5.0f}MHz {ref['median_ms']:7.4f} "
            f"@{ref['sm_clock_mhz'] or 0:5.0f}MHz {p['diff_pct']:+5.1f}% {default['median_ms']:7.4f} "
            f"@{default['sm_clock_mhz'] or 0:5.0f}MHz | {loose['median_ms']:.4f} {loose['spread_pct']:4.1f}% "
            f"{loose['min_ms']:.4f} | {a['spread_pct']:4.1f}% {a['min_ms']:.4f} | "
            f"{p['sweep_read_flush']['median_ms'] or float('nan'):.4f} @{p['sweep_read_flush']['sm_clock_mhz'] or 0:5.0f}MHz"
        )
    compared = [p for p in points if "diff_pct" in p]
    bad = [p for p in compared if not p["within_tolerance"]]
    print(
        f"{len(compared)} cases compared, {len(bad)} outside +-{TOLERANCE_PCT}%; wrote {out_dir / 'fidelity.json'}"
    )
    return 1 if bad or not compared else 0


if __name__ == "__main__":
    sys.exit(main())

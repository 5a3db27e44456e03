"""Fidelity check: flashbench's median vs triton.testing.do_bench(fn, return_mode="median") of the same call.

    python benchmarks/fidelity.py            # on a GPU; writes $OUT/fidelity.json when OUT is set

For sdpa-flash and sdpa-cudnn at bf16, d = 128, N = 8192 (16k tokens: batch 2, 16 heads), causal and not,
fwd and fwd+bwd, in one process: flashbench's measurement (measure_case: L2 flush, warm-up by time, events per
sample, median of >= 10 samples) is taken before and after a plain do_bench of the very same callable, and the
two flashbench medians' mean is compared with do_bench's median. Agreement within 3% is the criterion.
Exit code 1 if any point is off by more than that (docs/measuring.md has the H200 result).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import triton.testing

from flashbench.engine.measure import Context, Options, measure_case, prepare
from flashbench.providers import registry
from flashbench.spec.cases import Case

TOLERANCE_PCT = 3.0


def do_bench_median(case: Case) -> float:
    with contextlib.ExitStack() as stack:
        prepared = prepare(case, "cuda", stack)
        call, setup = prepared.timed()
        assert setup is None, "do_bench cannot run an untimed setup per sample (bwd-only mode)"
        call()  # compile / plan outside the measurement, as flashbench does
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(call, return_mode="median"))


def main() -> int:
    if not torch.cuda.is_available():
        print("fidelity: needs a CUDA GPU", file=sys.stderr)
        return 3
    registry.load_builtins()
    ctx = Context(device="cuda", gpu=torch.cuda.get_device_name())
    opts = Options()  # the sweep's defaults: warmup 50 ms, 100 ms of samples, >= 10 samples
    results = []
    print(
        f"{'provider':11s} {'causal':6s} {'mode':8s} {'flashbench ms':>13s} {'do_bench ms':>11s} {'diff %':>7s}"
    )
    for provider in ("sdpa-flash", "sdpa-cudnn"):
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                case = Case(provider, 2, 16, 16, 8192, 8192, 128, "bf16", causal, mode)
                first, _ = measure_case(case, opts, ctx)
                reference = do_bench_median(case) if first.status == "ok" else None
                second, _ = measure_case(case, opts, ctx)
                entry = {
                    "case": case.key,
                    "status": [first.status, second.status],
                    "reason": first.reason or second.reason,
                    "flashbench_median_ms": [first.median_ms, second.median_ms],
                    "flashbench_samples": [len(first.samples_ms), len(second.samples_ms)],
                    "do_bench_median_ms": reference,
                    "nvml": [first.nvml_before, second.nvml_after],
                }
                if first.status == second.status == "ok" and reference:
                    ours = (first.median_ms + second.median_ms) / 2
                    diff = (ours - reference) / reference * 100
                    entry.update(
                        flashbench_ms=ours, diff_pct=diff, within_tolerance=abs(diff) <= TOLERANCE_PCT
                    )
                    print(
                        f"{provider:11s} {causal!s:6s} {mode:8s} {ours:13.4f} {reference:11.4f} {diff:+7.2f}"
                    )
                else:
                    print(f"{provider:11s} {causal!s:6s} {mode:8s} {first.status}: {first.reason[:80]}")
                results.append(entry)
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "gpu": ctx.gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "tolerance_pct": TOLERANCE_PCT,
        "points": results,
    }
    (out_dir / "fidelity.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    compared = [r for r in results if "diff_pct" in r]
    bad = [r for r in compared if not r["within_tolerance"]]
    print(
        f"{len(compared)} points compared, {len(bad)} outside +-{TOLERANCE_PCT}%; wrote {out_dir / 'fidelity.json'}"
    )
    return 1 if bad or not compared else 0


if __name__ == "__main__":
    sys.exit(main())

"""A/B of a scheduling choice in the bundled FA2 forward, side by side in one process on one GPU:
heavy-first, the causal grid walks query blocks from the last (the ones that see the most keys) so the light
blocks fill the grid's tail (kernels/common.py CAUSAL_HEAVY_FIRST).

benchmarks/h100-2026-11-22/schedule_ab.json was made by this script at commit bd015db, which also tried the order
in the dQ pass and the dQ pass on a second stream beside dK/dV (its "bwd" rows): neither gained, both were
taken out, and this script now measures the forward only.

The config is forced (the autotuner would tune each order separately); the two orders are timed in rotation,
three rounds, median of the do_bench medians. bf16, 16k tokens per batch, hidden 2048, as issue 7's sweep.

    python3 benchmarks/schedule_ab.py            # writes $OUT/schedule_ab.json when OUT is set
"""

from __future__ import annotations

import itertools
import json
import os
import statistics

import torch
import triton
from flashbench.kernels import common, flash_attn

from flashbench.models.flops import attention_flops

FWD = {64: (64, 128, 4, 2), 128: (128, 64, 4, 2)}


def cfg(t):
    return dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), t, strict=True))


def measure_shape(d: int, n: int) -> list[dict]:
    b, h = max(1, 16384 // n), 2048 // d
    q, k, v = (torch.randn((b, h, n, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def fwd():
        return flash_attn(q, k, v, causal=True, config=cfg(FWD[d]))

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3):
        for heavy, ts in times.items():
            common.CAUSAL_HEAVY_FIRST = heavy
            fwd()
            torch.cuda.synchronize()
            ts.append(triton.testing.do_bench(fwd, warmup=25, rep=100, return_mode="median"))
    rows = []
    for heavy, ts in times.items():
        ms = statistics.median(ts)
        row = dict(d=d, n=n, causal=True, kind="fwd", heavy_first=heavy, ms=ms)
        row["tflops"] = attention_flops(b, h, n, n, d, True, "fwd") / ms / 1e9
        rows.append(row)
        print(f"d={d} N={n} causal fwd heavy_first={heavy!s:5} {ms:.3f} ms {row['tflops']:.0f} TFLOP/s "
              f"rounds {[round(t, 3) for t in ts]}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    rows = []
    for d, n in itertools.product((64, 128), (4096, 16384)):
        rows += measure_shape(d, n)
    common.CAUSAL_HEAVY_FIRST = True
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "schedule_ab.json"), "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

"""A/B of two scheduling choices in the bundled kernels, side by side in one process on one GPU:

  - heavy-first: causal grids walk query blocks from the last (the ones that see the most keys) so the light
    blocks fill the grid's tail (kernels/common.py CAUSAL_HEAVY_FIRST), in the forward and the dQ pass;
  - concurrent dQ: the dQ pass on a second stream beside the dK/dV pass (kernels/backward.py CONCURRENT_DQ).

Configs are forced (the autotuner would tune each variant separately); variants are timed in rotation, three
rounds, median of the do_bench medians. bf16, 16k tokens per batch, hidden 2048, as issue 7's sweep.

    python3 benchmarks/schedule_ab.py            # writes $OUT/schedule_ab.json when OUT is set
"""

from __future__ import annotations

import itertools
import json
import os
import statistics

import torch
import triton
from flashbench.kernels import backward, common, flash_attn
from flashbench.kernels.flash_v2 import attention_forward

from flashbench.models.flops import attention_flops

FWD = {64: (64, 128, 4, 2), 128: (128, 64, 4, 2)}
DKDV = {64: (32, 128, 4, 4), 128: (64, 128, 8, 3)}
DQ = {64: (128, 64, 8, 3), 128: (128, 64, 8, 2)}


def cfg(t):
    return dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), t, strict=True))


def measure_shape(d: int, n: int, causal: bool) -> list[dict]:
    b, h = max(1, 16384 // n), 2048 // d
    q, k, v, do = (torch.randn((b, h, n, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = d**-0.5
    o, lse, _ = attention_forward(q, k, v, causal, scale, cfg(FWD[d]))

    def fwd():
        return flash_attn(q, k, v, causal=causal, config=cfg(FWD[d]))

    def bwd():
        return backward.attention_backward(q, k, v, o, lse, do, None, causal, scale, cfg(DKDV[d]), cfg(DQ[d]))

    variants = [("fwd", heavy, None, fwd) for heavy in ((False, True) if causal else ())]
    variants += [
        ("bwd", heavy, conc, bwd)
        for heavy, conc in itertools.product((False, True) if causal else (True,), (False, True))
    ]
    times: list[list[float]] = [[] for _ in variants]
    for _ in range(3):
        for (_, heavy, conc, fn), ts in zip(variants, times, strict=True):
            common.CAUSAL_HEAVY_FIRST = heavy
            backward.CONCURRENT_DQ = bool(conc)
            fn()
            torch.cuda.synchronize()
            ts.append(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    rows = []
    for (kind, heavy, conc, _), ts in zip(variants, times, strict=True):
        ms = statistics.median(ts)
        row = dict(d=d, n=n, causal=causal, kind=kind, heavy_first=heavy, concurrent_dq=conc, ms=ms)
        row["tflops"] = attention_flops(b, h, n, n, d, causal, kind) / ms / 1e9
        rows.append(row)
        print(
            f"d={d} N={n} causal={causal!s:5} {kind} heavy_first={heavy!s:5} concurrent_dq={conc!s:5} "
            f"{ms:.3f} ms {row['tflops']:.0f} TFLOP/s  rounds {[round(t, 3) for t in ts]}",
            flush=True,
        )
    return rows


def main() -> None:
    rows = []
    for d, n, causal in itertools.product((64, 128), (4096, 16384), (True, False)):
        rows += measure_shape(d, n, causal)
    common.CAUSAL_HEAVY_FIRST, backward.CONCURRENT_DQ = True, True
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "schedule_ab.json"), "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

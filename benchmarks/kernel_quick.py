"""Quick side-by-side of the bundled Triton kernels and the SDPA backends on one GPU (one process).

Not the benchmark of record (that is `flashbench sweep`): a fast check, in one call, that the bundled kernels
compile, autotune and land in the right range. 16k tokens per batch, hidden 2048 (heads = 2048 / d), bf16.

    python3 benchmarks/kernel_quick.py            # writes $OUT/kernel_quick.json when OUT is set
"""

from __future__ import annotations

import json
import os
import time

import torch
import triton
from flashbench.kernels import flash_attn, flash_attn_v1, last_config
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashbench.models.flops import attention_flops


def sdpa_with(backend):
    def fn(q, k, v, causal):
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=causal)

    return fn


PROVIDERS = {
    "triton": lambda q, k, v, causal: flash_attn(q, k, v, causal=causal),
    "triton-v1": lambda q, k, v, causal: flash_attn_v1(q, k, v, causal=causal),
    "sdpa-flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": sdpa_with(SDPBackend.CUDNN_ATTENTION),
}


def make_call(fn, mode, q, k, v, do, causal):
    if mode == "fwd":
        return lambda: fn(q, k, v, causal)
    return lambda: torch.autograd.backward(fn(q, k, v, causal), do)


def main() -> None:
    rows = []
    for d in (64, 128):
        heads = 2048 // d
        for causal in (False, True):
            for n in (2048, 8192, 16384):
                batch = max(1, 16384 // n)
                shape = (batch, heads, n, d)
                q, k, v = (
                    torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)
                )
                do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                for name, fn in PROVIDERS.items():
                    if name == "triton-v1" and n > 4096:
                        continue
                    for mode in ("fwd", "fwd+bwd"):
                        if mode == "fwd+bwd" and name == "triton-v1":
                            continue
                        call = make_call(fn, mode, q, k, v, do, causal)
                        t0 = time.perf_counter()
                        try:
                            call()
                            torch.cuda.synchronize()
                        except Exception as exc:  # noqa: BLE001 - recorded, not hidden
                            rows.append(
                                dict(provider=name, d=d, causal=causal, n=n, mode=mode, error=str(exc)[:200])
                            )
                            continue
                        first_s = time.perf_counter() - t0
                        ms = triton.testing.do_bench(call, warmup=100, rep=300, return_mode="median")
                        flops = attention_flops(batch, heads, n, n, d, causal, mode)
                        cfg = last_config() if name.startswith("triton") else None
                        rows.append(
                            dict(
                                provider=name,
                                d=d,
                                causal=causal,
                                n=n,
                                mode=mode,
                                ms=ms,
                                tflops=flops / ms / 1e9,
                                first_call_s=first_s,
                                config=cfg,
                            )
                        )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "kernel_quick.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    # Short table last: TFLOP/s per provider.
    print(f"{'d':>4} {'causal':>6} {'N':>6} {'mode':>8} " + " ".join(f"{p:>11}" for p in PROVIDERS))
    keys = sorted({(r["d"], r["causal"], r["n"], r["mode"]) for r in rows})
    for key in keys:
        cells = []
        for p in PROVIDERS:
            hit = [r for r in rows if (r["d"], r["causal"], r["n"], r["mode"]) == key and r["provider"] == p]
            cells.append(
                f"{hit[0]['tflops']:11.1f}" if hit and "tflops" in hit[0] else f"{'err' if hit else '-':>11}"
            )
        print(f"{key[0]:>4} {str(key[1]):>6} {key[2]:>6} {key[3]:>8} " + " ".join(cells))
    for r in rows:
        if "error" in r:
            print("ERROR", r)


if __name__ == "__main__":
    main()

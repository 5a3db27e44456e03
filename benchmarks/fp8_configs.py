"""Config study for the bundled FP8 forwards on one GPU, beside the bundled bf16 forward: the tl kernel
(kernels/flash_fp8.py) and the Gluon kernel's FP8 mode (kernels/flash_ws.py, forced with {"kernel": "gluon-ws"}).

The evidence behind kernels/configs.py's FP8_FWD_SPACE and flash_ws.FP8_CONFIG, not the benchmark of record (that is `flashbench sweep
--preset fp8`, docs/benchmarks.md). Shapes: 16k tokens per batch, hidden 2048 (heads = 2048 / d), non-causal
unless --causal; inputs quantized from bf16 per (batch, K/V head), V in the kernel's layout (value_layout).

    python3 benchmarks/fp8_configs.py [--dims 128] [--seqs 4096,8192,16384] [--causal]
    python3 benchmarks/fp8_configs.py --no-space --extra 64,128,4,3 --gluon   # one tl config beside Gluon's

Each tl config of the space (unless --no-space), plus a few outside it (--extra), and with --gluon the Gluon
kernel's configs (GLUON: K/V stages 2-4, one program per tile or persistent) is timed as the autotuner does
(flashbench.engine.timing.time_cuda: L2 flushed, 50 ms of warm-up, 100 ms of samples, the median) after one
checked call; the bf16 bundled forward (its default kernel) in the same
process. Prints TFLOP/s per config and shape and the best config per shape; writes $OUT/fp8_configs.json. A
config that does not compile or run is printed with its error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics

import torch
from flashbench.kernels import flash_attn, last_config, value_layout
from flashbench.kernels.configs import FP8_FWD_SPACE, config_dict

from flashbench.engine import fp8
from flashbench.engine.timing import L2Flusher, time_cuda
from flashbench.models.flops import attention_flops

EXTRA = ((128, 256, 8, 2), (64, 128, 4, 3), (128, 128, 8, 3, 168))
# 192-row tiles spill registers in FP8 (flash_ws.FP8_CONFIG), so every Gluon config has 128 rows.
GLUON = tuple(
    {"kernel": "gluon-ws", "STAGES": stages, "PERSISTENT": persistent}
    for stages, persistent in ((2, 0), (3, 0), (4, 0), (3, 1), (4, 1))
)


def config_name(cfg: dict) -> str:
    if cfg.get("kernel") == "gluon-ws":
        return f"gluon s{cfg['STAGES']}{' persistent' if cfg['PERSISTENT'] else ''}"
    name = "x".join(str(cfg[key]) for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
    return name + (f" r{cfg['maxnreg']}" if "maxnreg" in cfg else "")


def study(d: int, n: int, causal: bool, configs: list[dict]) -> dict:
    """TFLOP/s of the bf16 forward and of every FP8 config (or its error) at one shape."""
    b, h = max(1, 16384 // n), 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "qkv")
    (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, h) for t in (q, k, v))
    scales = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    vt = value_layout(v8)
    flops = attention_flops(b, h, n, n, d, causal, "fwd")
    flush = L2Flusher("cuda")
    ms = statistics.median(time_cuda(functools.partial(flash_attn, q, k, v, causal=causal), flush=flush))
    row = {"d": d, "N": n, "batch": b, "heads": h, "bf16": flops / ms / 1e9, "bf16_config": last_config()}
    ref = flash_attn(q8, k8, v8, causal=causal, **scales)
    for cfg in configs:
        name = config_name(cfg)
        call = functools.partial(flash_attn, q8, k8, vt, causal=causal, config=cfg, **scales)
        try:
            torch.testing.assert_close(call(), ref, atol=0.05, rtol=0.05)  # every config: the same output
            row[name] = flops / statistics.median(time_cuda(call, flush=flush)) / 1e9
        except Exception as exc:  # a config that does not fit: recorded, not hidden
            row[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--seqs", default="4096,8192,16384")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--extra", default=";".join(",".join(map(str, c)) for c in EXTRA))
    ap.add_argument("--no-space", action="store_true", help="time only --extra of the tl configs")
    ap.add_argument("--gluon", action="store_true", help="also the Gluon kernel's FP8 configs (GLUON)")
    args = ap.parse_args()
    extra = [tuple(int(x) for x in c.split(",")) for c in args.extra.split(";") if c]
    configs = [config_dict(c) for c in (*(() if args.no_space else FP8_FWD_SPACE), *extra)]
    configs += list(GLUON) if args.gluon else []
    results = []
    for d in (int(x) for x in args.dims.split(",")):
        for n in (int(x) for x in args.seqs.split(",")):
            row = study(d, n, args.causal, configs)
            results.append(row)
            timed = {key: val for key, val in row.items() if isinstance(val, float) and key != "bf16"}
            best = max(timed, key=timed.get) if timed else "none"
            print(
                f"d={d} N={n} B={row['batch']} H={row['heads']}: bf16 {row['bf16']:.0f} TFLOP/s", flush=True
            )
            for key, val in row.items():
                if key not in ("d", "N", "batch", "heads", "bf16", "bf16_config"):
                    text = (
                        f"{val:.0f} TFLOP/s, x{val / row['bf16']:.2f} bf16" if isinstance(val, float) else val
                    )
                    print(f"  fp8 {key}: {text}{'  <- best' if key == best else ''}", flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "fp8_configs.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)


if __name__ == "__main__":
    main()

"""The Gluon warp-specialized forward (kernels/flash_ws.py) side by side with the Triton forward and SDPA.

Not the benchmark of record (that is `flashbench sweep`): an A/B of forward variants in one process, on the
speed preset's shapes (16k tokens per batch, hidden 2048 so heads = 2048 / d, bf16). Rounds rotate the order of
the providers (reversed every other round); each timing is flashbench.engine.timing.time_cuda (L2 flushed, 50 ms
warm-up, 100 ms of samples); the table gives the median over rounds of each round's median.

    python3 benchmarks/ws_quick.py check             # correctness of every variant against fp32 math
    python3 benchmarks/ws_quick.py speed [--rounds 3] [--seqs 1024,2048,...] [--dims 64,128] [--causal yes]
        [--variants '{"name": {config}}']   # more forced configs beside VARIANTS (flash_ws.CONFIG_KEYS)
Writes $OUT/ws_quick.json when OUT is set.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

import torch
from flashbench.kernels import flash_ws
from flashbench.kernels.flash_v2 import attention_forward as triton_forward
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashbench.engine.timing import L2Flusher, time_cuda
from flashbench.models.flops import attention_flops

VARIANTS = {  # "ws" is flash_ws's default for the head dim; "ws3" three consumer warpgroups (d = 64 only)
    "ws": {},
    "ws2": {"BLOCK_M": 128},
    "ws-s2": {"BLOCK_M": 128, "STAGES": 2},
    "ws3": {"BLOCK_M": 192},
    "ws3-s2": {"BLOCK_M": 192, "STAGES": 2},
    # persistent: one program per SM walks tiles; the output has its own buffers (fewer K/V stages at d = 128)
    "ws2p": {"BLOCK_M": 128, "PERSISTENT": 1, "STAGES": 2},
    "ws3p": {"BLOCK_M": 192, "PERSISTENT": 1, "STAGES": 2},
    "ws3p-s3": {"BLOCK_M": 192, "PERSISTENT": 1, "STAGES": 3},
}


def reference(q, k, v, causal):
    """fp32 math attention, its output and base-2 LSE (bottom-right causal, GQA by repeat)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    s = q.float() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1) * 1.4426950408889634


def check() -> int:
    torch.manual_seed(0)
    failures = 0
    shapes = [
        (2, 4, 256, 256, 128, 4),
        (1, 8, 1024, 1024, 64, 8),
        (2, 8, 384, 640, 128, 2),
        (1, 2, 128, 128, 64, 2),
        (2, 4, 320, 512, 64, 2),  # 192-row tiles: the first starts before row 0
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for b, h, nq, nk, d, hkv in shapes:
            for causal in (False, True):
                q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype)
                k = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype)
                v = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype)
                ref_o, ref_lse = reference(q, k, v, causal)
                for name, cfg in VARIANTS.items():
                    if flash_ws.supported(q, k, v, causal, cfg.get("BLOCK_M", 128)):
                        continue
                    o, lse, _ = flash_ws.attention_forward(q, k, v, causal, d**-0.5, cfg)
                    torch.cuda.synchronize()
                    err_o = (o.float() - ref_o).abs().max().item()
                    err_l = (lse - ref_lse).abs().max().item()
                    ok = err_o < 2e-2 and err_l < 1e-3
                    failures += not ok
                    shape = f"{str(dtype)[6:]:8s} b{b} h{h}/{hkv} nq{nq} nk{nk} d{d} causal={int(causal)}"
                    errors = f"max|do|={err_o:.2e} max|dlse|={err_l:.2e}"
                    print(f"{'ok ' if ok else 'BAD'} {name:8s} {shape} {errors}", flush=True)
    print(f"{failures} failures")
    return 1 if failures else 0


def providers(causal: bool):
    def ws(cfg):
        return lambda q, k, v: flash_ws.attention_forward(q, k, v, causal, q.shape[-1] ** -0.5, cfg)

    def sdpa_with(backend):
        def fn(q, k, v):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)

        return fn

    def tl_forward(q, k, v):
        """flash_v2's autotuned tl kernel (not the Gluon one flash_attn may prefer)."""
        os.environ["FLASHBENCH_GLUON"] = "0"
        try:
            return triton_forward(q, k, v, causal, q.shape[-1] ** -0.5)
        finally:
            del os.environ["FLASHBENCH_GLUON"]

    out = {
        "triton": tl_forward,
        "flash_attn": lambda q, k, v: triton_forward(q, k, v, causal, q.shape[-1] ** -0.5),
    }
    out.update({name: ws(cfg) for name, cfg in VARIANTS.items()})
    out["sdpa-flash"] = sdpa_with(SDPBackend.FLASH_ATTENTION)
    out["sdpa-cudnn"] = sdpa_with(SDPBackend.CUDNN_ATTENTION)
    return out


def speed(
    rounds: int,
    seqs: list[int],
    dims: list[int],
    names: list[str] | None,
    masks: tuple[bool, ...] = (False, True),
) -> list[dict]:
    flush = L2Flusher("cuda")
    rows = []
    for d in dims:
        heads = 2048 // d
        for causal in masks:
            for n in seqs:
                batch = max(1, 16384 // n)
                q, k, v = (
                    torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)
                )
                provs = {p: f for p, f in providers(causal).items() if not names or p in names}
                for p, f in list(provs.items()):  # compile and autotune outside the timed rounds
                    try:
                        f(q, k, v)
                    except ValueError as exc:  # a variant flash_ws refuses here (ws3 at d = 128)
                        print(f"  {p}: {exc}", flush=True)
                        del provs[p]
                torch.cuda.synchronize()
                times: dict[str, list[float]] = {p: [] for p in provs}
                order = list(provs)
                for r in range(rounds):
                    for p in order if r % 2 == 0 else order[::-1]:
                        call = functools.partial(provs[p], q, k, v)
                        times[p].append(statistics.median(time_cuda(call, flush=flush)))
                flops = attention_flops(batch, heads, n, n, d, causal=causal, mode="fwd")
                row = {"d": d, "causal": causal, "n": n, "batch": batch}
                for p, ts in times.items():
                    ms = statistics.median(ts)
                    row[p] = {"ms": ms, "tflops": flops / ms / 1e9, "rounds_ms": ts}
                rows.append(row)
                cells = " ".join(f"{p}={row[p]['tflops']:.0f}" for p in provs)
                print(f"d={d} causal={int(causal)} N={n}: {cells}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["check", "speed"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--providers", default="")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--variants", default="{}", help="JSON {name: config}: forced configs added to VARIANTS")
    a = ap.parse_args()
    VARIANTS.update(json.loads(a.variants))
    if a.what == "check":
        return check()
    seqs, dims = [int(s) for s in a.seqs.split(",")], [int(s) for s in a.dims.split(",")]
    masks = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    names = [p for p in a.providers.split(",") if p] + list(json.loads(a.variants))
    rows = speed(a.rounds, seqs, dims, names if a.providers else None, masks)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "ws_quick.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

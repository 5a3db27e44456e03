"""flash_attn_varlen on packed documents beside the same kernel on a uniform batch of the same useful FLOPs and
FlexAttention's document mask (bf16, one GPU, timed as the sweep times a case: engine/timing.measure_cuda, the
steady warm-up until the SM clock settles, the L2 evicted before each sample, launch blocking, CUDA events, the
median). Default shape: 16k tokens packed from documents of 256-4096 tokens, d = 128.

Documents: lengths uniform in [--min-len, --max-len] (seeded), drawn until they fill --tokens, the last one cut
to fit. Useful FLOPs count each document's own (q, k) pairs: forward 4 * H * D * pairs, fwd+bwd 3.5x that. The
uniform batch: flash_attn at N = --uniform-n with as many sequences as give the same useful pairs (rounded).
Each result is first checked against float64 attention per document (correctness' budget).

    python3 benchmarks/varlen_speed.py [--causal 1] [--dims 128] [--tokens 16384]   # JSON to $OUT/varlen_speed.json
    python3 benchmarks/varlen_speed.py --configs '[{"kernel": "gluon-ws", "PERSISTENT": 0, "STAGES": 3}]'
    python3 benchmarks/varlen_speed.py --configs '[{"fwd": {"kernel": "gluon-ws"}, "bwd": {"kernel": "gluon-ws"}}]'

--configs: forced configs timed beside the default, each a forward config (flash_attn_varlen's config=, e.g. the
Gluon forward's one program per tile against its persistent walk) or {"fwd": ..., "bwd": ...}, the forward's and
the backward's (bwd_config=: the Gluon backward); --flex 0 leaves FlexAttention out; --modes fwd times the
forward alone. --rounds R times every (provider, mode) R times, in turns (a drift of the clock falls on all of
them alike), and reports the median round (the rounds' times and SM clocks are in the JSON).

The benchmark of record is `flashbench sweep --preset varlen` (its uniform batch: 4 x 4096); this script times
forced configs beside the default and a uniform batch of the documents' own useful FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import torch
from flashbench.kernels import flash_attn, flash_attn_varlen

from flashbench.engine import correctness
from flashbench.engine.blocking import make_blocker
from flashbench.engine.timing import L2Flusher, measure_cuda
from flashbench.gpu import nvml
from flashbench.spec.window import unmasked_pairs


def lengths(tokens: int, low: int, high: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while sum(out) < tokens:
        out.append(int(torch.randint(low, high + 1, (1,), generator=gen)))
    out[-1] -= sum(out) - tokens
    return out


def pairs(n: int, causal: bool) -> int:
    return unmasked_pairs(n, n, causal)


_TIMER: dict[str, Any] = {}


def timed(call, leaves: list[torch.Tensor], backward: bool) -> tuple[float, float | None]:
    """Median ms of the forward (no autograd graph), or of forward + backward (gradient of a fixed dO; the leaves'
    gradients dropped before each sample, untimed), in the sweep's regime (engine/timing.measure_cuda: the L2
    evicted by a read, a steady warm-up until the SM clock settles, samples until it holds, launch blocking);
    and the SM clock's median while the samples ran (None without NVML)."""
    if not _TIMER:
        device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        index = nvml.index_of((props.pci_domain_id, props.pci_bus_id, props.pci_device_id))
        _TIMER.update(
            flush=L2Flusher(device, "read"), blocker=make_blocker()[0], sampler=nvml.clock_sampler(index)
        )
    if backward:
        do = torch.randn_like(call())

        def drop_grads() -> None:
            for t in leaves:
                t.grad = None

        took = measure_cuda(lambda: call().backward(do), setup=drop_grads, **_TIMER)
    else:
        with torch.no_grad():
            took = measure_cuda(call, **_TIMER)
    clock = nvml.window_summary(took.window).get("sm_clock_mhz")
    return statistics.median(took.samples_ms), clock


def check(out: torch.Tensor, q, k, v, docs: list[int], causal: bool) -> None:
    tally, row = correctness.ErrorTally(), 0
    for n in docs:
        part = [t[row : row + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        got = {"out": out[row : row + n].transpose(0, 1).unsqueeze(0)}
        ref = correctness.reference(*part, causal=causal)
        low = correctness.reference(*part, causal=causal, dtype=q.dtype)
        tally.add(got, {"out": ref["out"]}, {"out": low["out"]})
        row += n
    verdict = tally.verdict(q.dtype)
    assert verdict.ok, verdict.reason


def providers(a: argparse.Namespace, d: int, docs: list[int], causal: bool) -> dict[str, tuple]:
    """name -> (call, its differentiable inputs, its useful (q, k) pairs), at head dim d."""
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    useful = sum(pairs(n, causal) for n in docs)
    q, k, v = (
        torch.randn(a.tokens, a.heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    batch = max(1, round(useful / pairs(a.uniform_n, causal)))
    uq, uk, uv = (
        torch.randn(batch, a.heads, a.uniform_n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )

    def varlen():
        return flash_attn_varlen(q, k, v, cu, cu, max(docs), max(docs), causal=causal)

    check(varlen().detach(), q.detach(), k.detach(), v.detach(), docs, causal)
    calls = {"varlen": (varlen, [q, k, v], useful)}
    for config in json.loads(a.configs):
        fwd, bwd = (
            (config.get("fwd"), config.get("bwd")) if {"fwd", "bwd"} & config.keys() else (config, None)
        )

        def forced(fwd=fwd, bwd=bwd):
            most = max(docs)
            return flash_attn_varlen(q, k, v, cu, cu, most, most, causal=causal, config=fwd, bwd_config=bwd)

        check(forced().detach(), q.detach(), k.detach(), v.detach(), docs, causal)
        calls[f"varlen {json.dumps(config)}"] = (forced, [q, k, v], useful)
    calls |= {
        f"uniform {batch}x{a.uniform_n}": (
            lambda: flash_attn(uq, uk, uv, causal=causal),
            [uq, uk, uv],
            batch * pairs(a.uniform_n, causal),
        ),
    }
    if not a.flex:
        return calls
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(
            torch.arange(len(docs), device="cuda"), torch.tensor(docs, device="cuda")
        )

        def mask(b, h, i, j):
            return (doc[i] == doc[j]) & (j <= i) if causal else doc[i] == doc[j]

        block = create_block_mask(mask, None, None, a.tokens, a.tokens, device="cuda")
        flex = torch.compile(flex_attention)
        fq, fk, fv = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        calls["flex document mask"] = (
            lambda: flex(fq, fk, fv, block_mask=block)[0].transpose(0, 1),
            [q, k, v],
            useful,
        )
    except Exception as exc:  # noqa: BLE001  (reported, not fatal: the other rows still mean something)
        print(f"flex: not run ({type(exc).__name__}: {exc})")
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--min-len", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dims", default="128", help="head dims, comma-separated")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--uniform-n", type=int, default=2048)
    ap.add_argument(
        "--configs",
        default="[]",
        help='JSON list of forced configs timed beside the default: forward configs or {"fwd": ..., "bwd": ...}',
    )
    ap.add_argument("--modes", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both, comma-separated")
    ap.add_argument(
        "--flex", type=int, default=1, help="0: leave FlexAttention out (its compile takes a minute)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="times per (provider, mode), taken in turns")
    a = ap.parse_args()
    causal, docs = bool(a.causal), lengths(a.tokens, a.min_len, a.max_len, a.seed)
    print(f"{len(docs)} documents, mean {sum(docs) / len(docs):.0f}, causal={causal}: {docs}")
    rows = []
    for d in (int(x) for x in a.dims.split(",")):
        cases = [
            (name, mode, factor, call, leaves, work)
            for name, (call, leaves, work) in providers(a, d, docs, causal).items()
            for mode, factor in (("fwd", 1.0), ("fwd+bwd", 3.5))
            if mode in a.modes.split(",")
        ]
        rounds: list[list[float]] = [[] for _ in cases]
        clocks: list[list[float | None]] = [[] for _ in cases]
        for _ in range(a.rounds):
            for times, mhz, (_, mode, _, call, leaves, _) in zip(rounds, clocks, cases, strict=True):
                ms, clock = timed(call, leaves, mode != "fwd")
                times.append(ms)
                mhz.append(clock)
        for times, mhz, (name, mode, factor, _, _, work) in zip(rounds, clocks, cases, strict=True):
            ms = statistics.median(times)
            tflops = factor * 4 * a.heads * d * work / ms / 1e9
            rows.append(
                {
                    "d": d,
                    "provider": name,
                    "mode": mode,
                    "ms": round(ms, 4),
                    "tflops": round(tflops, 1),
                    "ms_rounds": [round(t, 4) for t in times],
                    "sm_mhz_rounds": mhz,
                }
            )
            spread = f"(rounds {min(times):.3f}-{max(times):.3f})" if len(times) > 1 else ""
            clock = statistics.median(c for c in mhz if c) if any(mhz) else None
            at = f" at {clock:.0f} MHz" if clock else ""
            print(f"d={d} {name:>24} {mode:>8}: {ms:8.3f} ms {tflops:7.1f} TFLOP/s (useful) {spread}{at}")
    out = os.environ.get("OUT", "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "varlen_speed.json"), "w") as f:
        json.dump({"documents": docs, "causal": causal, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

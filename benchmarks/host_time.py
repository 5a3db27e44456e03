"""What a training loop pays per call: host enqueue time, eager-loop time and GPU time, bundled kernels beside
SDPA cuDNN, in one process (the table of docs/benchmarks.md "Host time").

Three numbers per call, as flashbench's rows carry them (docs/measuring.md):
  host    perf_counter around each of the first 8 of `--calls` calls enqueued back to back after a sync: the
          median (us), while the launch queue is too short for an enqueue to wait for the GPU; the providers'
          loops take turns, so both see the same host
  loop    the per-call time of those calls, from before the first to after one synchronize: the median of
          `--loops` loops (us): what an eager loop pays
  gpu     triton.testing.do_bench's median (us): GPU time with the host's gaps mostly hidden
and, with --graph, the per-call time of CUDA-graph replays back to back. Per shape, the bundled call's enqueue
median over the other provider's, with its 95% percentile-bootstrap interval (the gate's, over each provider's
enqueues), and what the interval allows: "at most" theirs, "above", or "cannot tell" (rows: host_ratio,
host_ratio_ci, host_verdict).

    python3 benchmarks/host_time.py                           # the issue's shapes: bf16, d = 128, 16k tokens
    python3 benchmarks/host_time.py --dims 64,128 --seqs 512,1024,2048,4096 --modes fwd,fwd+bwd --graph
    python3 benchmarks/host_time.py --profile fwd+bwd --seqs 1024 --causal 1   # cProfile of the bundled call
    python3 benchmarks/host_time.py --breakdown --seqs 1024,2048 --causal 1    # each piece of a step, GPU held
    python3 benchmarks/host_time.py --decode                  # flash_decode beside SDPA at batch 1..
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import triton
from flashbench.kernels import flash_attn, flash_decode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashbench.analysis.gate_rule import median_ratio_ci
from flashbench.engine.timing import capture_cuda_graph


def host_and_loop(
    fns: dict[str, Callable[[], Any]], calls: int, loops: int
) -> dict[str, tuple[list[float], float]]:
    """Per provider (each loop's first enqueues in us, loop us per call: the median over the loops). The
    providers' loops take turns (A B A B ...), so that a drift of the host's speed, which moves a step's enqueue
    by up to 2x between runs, falls on both alike."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    enq: dict[str, list[float]] = {name: [] for name in fns}
    per_loop: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(loops):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(calls):
                # a loop's first calls: the launch queue is still short, no enqueue waits for the GPU
                if i < 8:
                    a = time.perf_counter()
                    fn()
                    enq[name].append(time.perf_counter() - a)
                else:
                    fn()
            torch.cuda.synchronize()
            per_loop[name].append((time.perf_counter() - t0) / calls)
    return {name: ([x * 1e6 for x in enq[name]], statistics.median(per_loop[name]) * 1e6) for name in fns}


def host_ratio(bundled: list[float], other: list[float], key: str) -> dict[str, Any]:
    """The bundled enqueue's median over the other provider's, with the 95% percentile-bootstrap interval the
    gate uses (gate_rule.median_ratio_ci), and what it allows one to say: "at most" (the interval's top <= 1),
    "above" (its bottom > 1) or "cannot tell"."""
    point, low, high = median_ratio_ci([bundled], [other], confidence=0.95, resamples=2000, seed=0, key=key)
    said = "at most" if high <= 1.0 else "above" if low > 1.0 else "cannot tell"
    return {"host_ratio": point, "host_ratio_ci": [low, high], "host_verdict": said}


def graph_us(fn: Callable[[], Any], calls: int) -> float | None:
    try:
        g = capture_cuda_graph(fn)
    except Exception as exc:  # a path that does not capture: say so, do not stop the table
        print(f"  graph capture failed: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        return None
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def training_calls(n: int, d: int, causal: bool, mode: str, tokens: int, hidden: int) -> dict[str, Callable]:
    b, h = max(1, tokens // n), hidden // d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def cudnn(*x: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(*x, is_causal=causal)

    def bundled(*x: torch.Tensor) -> torch.Tensor:
        return flash_attn(*x, causal=causal)

    if mode == "fwd":
        return {"triton": lambda: bundled(q, k, v), "sdpa-cudnn": lambda: cudnn(q, k, v)}
    return {
        "triton": lambda: torch.autograd.grad(bundled(*leaves), leaves, do),
        "sdpa-cudnn": lambda: torch.autograd.grad(cudnn(*leaves), leaves, do),
    }


def decode_calls(n: int, batch: int) -> dict[str, Callable]:
    h, hkv, d = 32, 8, 128
    q = torch.randn(batch, h, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kr, vr = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))

    def cudnn() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, kr, vr)

    return {"triton-decode": lambda: flash_decode(q, k, v), "sdpa-cudnn": cudnn}


def held_us(fn: Callable[[Any], Any], setup: Callable[[], Any] | None = None, calls: int = 20) -> float:
    """Host us per call of `fn` while the GPU is held by torch.cuda._sleep, so that no enqueue waits for it: the
    median over 5 batches of each batch's median. `setup` makes each call's argument outside the timed region."""
    medians = []
    for _ in range(5):
        items = [setup() if setup else None for _ in range(calls)]
        torch.cuda.synchronize()
        torch.cuda._sleep(300_000_000)  # ~0.2 s of GPU cycles: longer than the batch takes to enqueue
        times = []
        for item in items:
            t0 = time.perf_counter_ns()
            fn(item)
            times.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
        medians.append(statistics.median(times) / 1e3)
    return statistics.median(medians)


def breakdown(n: int, d: int, causal: bool, tokens: int, hidden: int) -> list[str]:
    """Host us per call of the pieces of a training step's attention, the bundled kernel beside cuDNN, the GPU held
    (held_us); then where a bundled step's host time goes: its forward, the autograd engine's hand-over to the
    thread that runs CUDA backward nodes, the backward, and the hand-back."""
    from flashbench.kernels import flash_v2
    from flashbench.kernels.backward import attention_backward
    from flashbench.kernels.flash_v2 import attention_forward

    b, h = max(1, tokens // n), hidden // d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)
    scale = d**-0.5
    o, lse, _ = attention_forward(q, k, v, causal, scale)
    calls = training_calls(n, d, causal, "fwd", tokens, hidden)
    x = torch.randn(8, device="cuda", requires_grad=True)
    gx = torch.ones(8, device="cuda")

    def cudnn(*t: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(*t, is_causal=causal)

    def step_on_caller(forward: Callable[[], torch.Tensor]) -> Any:
        with torch.autograd.set_multithreading_enabled(False):
            return torch.autograd.grad(forward(), leaves, do)

    pieces: dict[str, Callable[[Any], Any]] = {
        "torch.empty bf16 [B,H,N,D]": lambda _: torch.empty(q.shape, dtype=q.dtype, device="cuda"),
        "torch.zeros fp32 [B,H,N,D]": lambda _: torch.zeros(q.shape, dtype=torch.float32, device="cuda"),
        "autograd.grad of one C++ op (8 floats)": lambda _: torch.autograd.grad(x.mul(2), (x,), gx),
        "bundled fwd, no grad": lambda _: calls["triton"](),
        "attention_forward (checked inputs)": lambda _: attention_forward(q, k, v, causal, scale),
        "bundled fwd, grad recorded": lambda _: flash_attn(*leaves, causal=causal),
        "attention_backward (saved tensors)": lambda _: attention_backward(
            q, k, v, o, lse, do, None, causal, scale
        ),
        "bundled step (fwd + autograd.grad)": lambda _: torch.autograd.grad(
            flash_attn(*leaves, causal=causal), leaves, do
        ),
        "cuDNN fwd, no grad": lambda _: calls["sdpa-cudnn"](),
        "cuDNN fwd, grad recorded": lambda _: cudnn(*leaves),
        "cuDNN step (fwd + autograd.grad)": lambda _: torch.autograd.grad(cudnn(*leaves), leaves, do),
        # The engine runs CUDA backward nodes on its device thread unless multithreading is off: then on the
        # caller's, so these two steps tell the hand-over's cost from the nodes' own.
        "bundled step, backward on the caller's thread": lambda _: step_on_caller(
            lambda: flash_attn(*leaves, causal=causal)
        ),
        "cuDNN step, backward on the caller's thread": lambda _: step_on_caller(lambda: cudnn(*leaves)),
    }
    lines = []
    for name, fn in pieces.items():
        for _ in range(3):
            fn(None)
        lines.append(f"{name:42} {held_us(fn):7.1f} us host")
        print(lines[-1], flush=True)
    for name, make in (
        ("bundled", lambda: flash_attn(*leaves, causal=causal)),
        ("cuDNN", lambda: cudnn(*leaves)),
    ):
        us = held_us(lambda out: torch.autograd.grad(out, leaves, do), setup=make, calls=12)
        lines.append(f"{name + ' autograd.grad of a recorded fwd':42} {us:7.1f} us host")
        print(lines[-1], flush=True)

    marks: dict[str, int] = {}
    backward = flash_v2.RecomputeAttention.backward

    def timed_backward(ctx: Any, grad: torch.Tensor) -> Any:
        marks["in"] = time.perf_counter_ns()
        out = backward(ctx, grad)
        marks["out"] = time.perf_counter_ns()
        return out

    flash_v2.RecomputeAttention.backward = staticmethod(timed_backward)  # type: ignore[method-assign]
    names = ("forward", "engine -> backward", "backward", "backward -> return")
    try:
        for threads in (True, False):
            with torch.autograd.set_multithreading_enabled(threads):
                spans = step_spans(leaves, do, causal, marks)
            where = "the engine's device thread" if threads else "the caller's thread"
            lines.append(
                f"bundled step, backward on {where}, medians: "
                + ", ".join(
                    f"{nm} {statistics.median(s[i] for s in spans):.1f}" for i, nm in enumerate(names)
                )
                + " us"
            )
            print(lines[-1], flush=True)
    finally:
        flash_v2.RecomputeAttention.backward = backward  # type: ignore[method-assign]
    return lines


def step_spans(
    leaves: list[torch.Tensor], do: torch.Tensor, causal: bool, marks: dict[str, int]
) -> list[tuple[float, ...]]:
    """(forward, engine -> backward, backward, backward -> return) us of 100 bundled steps, the GPU held; `marks`
    is filled by the timed backward."""
    spans: list[tuple[float, ...]] = []
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(300_000_000)
        for _ in range(20):
            t0 = time.perf_counter_ns()
            out = flash_attn(*leaves, causal=causal)
            t1 = time.perf_counter_ns()
            torch.autograd.grad(out, leaves, do)
            t2 = time.perf_counter_ns()
            spans.append(
                tuple(
                    (b - a) / 1e3
                    for a, b in (
                        (t0, t1),
                        (t1, marks["in"]),
                        (marks["in"], marks["out"]),
                        (marks["out"], t2),
                    )
                )
            )
        torch.cuda.synchronize()
    return spans


def profile(fn: Callable[[], Any], calls: int) -> str:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", default="512,1024,2048,4096")
    p.add_argument("--dims", default="128")
    p.add_argument("--causal", default="1,0", help="1, 0 or both as 1,0")
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--loops", type=int, default=7)
    p.add_argument("--graph", action="store_true", help="also time CUDA-graph replays")
    p.add_argument("--decode", action="store_true", help="flash_decode at batch 1 and 8 over --seqs keys")
    p.add_argument("--profile", default="", help="cProfile the bundled call of this mode instead")
    p.add_argument("--breakdown", action="store_true", help="host time of each piece of a step instead")
    p.add_argument(
        "--out",
        default=os.environ.get("OUT", "results"),
        help="rows go to OUT/host_time.jsonl (--breakdown: OUT/host_breakdown.txt)",
    )
    a = p.parse_args()
    seqs = [int(x) for x in a.seqs.split(",")]
    dims = [int(x) for x in a.dims.split(",")]
    causals = [bool(int(x)) for x in a.causal.split(",")]
    rows: list[dict[str, Any]] = []
    if a.breakdown:
        lines = []
        for d in dims:
            for n in seqs:
                for causal in causals:
                    lines.append(f"### host breakdown d={d} N={n} causal={causal}")
                    print(lines[-1])
                    lines += breakdown(n, d, causal, a.tokens, a.hidden)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "host_breakdown.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        return
    if a.profile:
        for d in dims:
            for n in seqs:
                for causal in causals:
                    fn = training_calls(n, d, causal, a.profile, a.tokens, a.hidden)["triton"]
                    print(f"### cProfile: triton {a.profile} d={d} N={n} causal={causal}, 200 calls")
                    print(profile(fn, 200))
        return
    shapes: list[tuple[str, dict[str, Any], dict[str, Callable]]] = []
    if a.decode:
        for n in seqs:
            for batch in (1, 8):
                shapes.append((f"decode N={n} B={batch}", {"seq": n, "batch": batch}, decode_calls(n, batch)))
    else:
        for mode in a.modes.split(","):
            for d in dims:
                for n in seqs:
                    for causal in causals:
                        what = f"{mode} d={d} N={n} {'causal' if causal else 'full'}"
                        case = {"mode": mode, "head_dim": d, "seq": n, "causal": causal}
                        shapes.append((what, case, training_calls(n, d, causal, mode, a.tokens, a.hidden)))
    header = f"{'case':32} {'provider':14} {'host':>7} {'loop':>7} {'gpu':>7} {'graph':>7}  (us per call)"
    lines = [header]
    verdicts: dict[str, list[str]] = {}
    for what, case, calls in shapes:
        host_loop = host_and_loop(calls, a.calls, a.loops)
        names = list(calls)
        for name, fn in calls.items():
            enqueues, loop = host_loop[name]
            host = statistics.median(enqueues)
            gpu = triton.testing.do_bench(fn, warmup=100, rep=300, return_mode="median") * 1e3
            graph = graph_us(fn, a.calls) if a.graph else None
            row = {
                **case,
                "provider": name,
                "host_us": host,
                "loop_us": loop,
                "gpu_us": gpu,
                "graph_us": graph,
            }
            g = f"{graph:7.0f}" if graph is not None else "      -"
            lines.append(f"{what:32} {name:14} {host:7.0f} {loop:7.0f} {gpu:7.0f} {g}")
            # the bundled call's enqueue over this provider's (the bundled one comes first)
            if name != names[0]:
                row |= host_ratio(host_loop[names[0]][0], enqueues, f"{what}|{name}")
                low, high = row["host_ratio_ci"]
                lines[-1] += f"  host {names[0]} / {name} {row['host_ratio']:.2f} [{low:.2f}, {high:.2f}]"
                verdicts.setdefault(f"{case.get('mode', 'decode')}: {row['host_verdict']}", []).append(what)
            rows.append(row)
            print(lines[-1], flush=True)
        del calls
        torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "host_time.jsonl"), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    lines += [f"bundled enqueue / the other's, {k} (95%): {len(v)} shapes" for k, v in verdicts.items()]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

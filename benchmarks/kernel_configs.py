"""Config study for the bundled FA2 kernel on one GPU: which (BLOCK_M, BLOCK_N, warps, stages), TMA on or off,
a register cap or not, for the forward and for each backward pass, beside the SDPA backends.

This is the evidence behind the config spaces in kernels/configs.py, not the benchmark of record (that is
`flashbench sweep`, docs/benchmarks.md). Shapes are the speed preset's: bf16, 16k tokens per batch, hidden 2048
(heads = 2048 / d).

    python3 benchmarks/kernel_configs.py run --jobs 12     # compile in parallel, then time in one process
    python3 benchmarks/kernel_configs.py warm --jobs 12    # compile only (fills Triton's cache for a sweep)
    TRITON_INTERPRET=1 python benchmarks/kernel_configs.py time --smoke   # CPU: tiny shapes, checks the script

`run` first starts `--jobs` processes that only compile (each launches its share of the kernels once, which
fills Triton's on-disk cache), then times everything in this process as the autotuner does
(flashbench.engine.timing.time_cuda: L2 flushed, 50 ms of warm-up, 100 ms of samples, the median), every binary
loaded from the cache. Writes $OUT/kernel_configs.json and prints the
best configs per shape. A config that does not compile or run is recorded with its error, not hidden.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from flashbench.kernels import backward_dkdv, backward_dq, flash_attn, flash_v2
from flashbench.kernels.backward import attention_backward
from flashbench.kernels.configs import FWD_SPACE
from flashbench.kernels.flash_v2 import attention_forward
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashbench.engine.timing import L2Flusher, time_cuda
from flashbench.models.flops import attention_flops

HIDDEN, TOKENS = 2048, 16384
SEQS = (2048, 8192)
HEAD_DIMS = (64, 128)
DEVICE = "cuda"
FWD = [  # (BLOCK_M, BLOCK_N, warps, stages)
    (128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 2),
    (128, 128, 8, 3), (128, 128, 4, 2), (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2), (64, 32, 4, 2),
    # one warpgroup per 128 query rows: 4 warps x 128 rows, or two warpgroups sharing K/V tiles (8 x 256)
    (128, 32, 4, 2), (256, 64, 8, 2), (256, 64, 8, 3), (256, 32, 8, 2), (256, 32, 8, 3),
]  # fmt: skip
# Forward variants side by side per config (TMA on): keys merged into the forced config. "maxnreg" caps the
# registers per thread (two 8-warp programs per SM at 128). Variants measured and removed since (per-program
# descriptors, P V overlapped with the next block's softmax "OV", Triton's warp specialization "WS", Q in
# registers, lazy rescaling "LR") are in docs/kernels.md, measured and not adopted.
FWD_VARIANT_CONFIGS = [c[:4] for c in FWD_SPACE[:7]]  # the autotuner's configs for d = 64 and 128
FWD_VARIANTS = [{}, {"maxnreg": 128}]
JIT = {"dkdv": backward_dkdv._bwd_dkdv, "dq": backward_dq._bwd_dq}  # whose compiled kernels give regs, spills
ROUNDS = 3  # --rounds: the variants of one shape are timed in rotation this many times (median of medians)

KINDS = ("fwd", "dkdv", "dq", "sdpa", "variants")  # --kinds narrows the study
TMA_MODES = (1, 0)  # --tma narrows it
DKDV = [  # BLOCK_M query rows streamed, BLOCK_N keys resident
    (32, 128, 8, 3), (32, 128, 4, 3), (32, 128, 4, 4), (32, 128, 4, 5), (64, 128, 8, 2), (64, 128, 8, 3),
    (64, 64, 4, 3), (32, 64, 4, 3), (32, 32, 4, 2),
]  # fmt: skip
DQ = [  # BLOCK_M query rows resident, BLOCK_N keys streamed
    (128, 32, 8, 3), (128, 32, 4, 3), (128, 32, 4, 4), (128, 32, 4, 5), (128, 64, 8, 2), (128, 64, 8, 3),
    (64, 64, 4, 3), (64, 32, 4, 3), (32, 32, 4, 2),
]  # fmt: skip
BASE_DKDV, BASE_DQ = DKDV[0], DQ[0]  # the other pass's config while one pass is varied


def cfg(t: tuple[int, int, int, int], **extra: int) -> dict[str, int]:
    bm, bn, w, s = t
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, **extra}


def shapes():
    return itertools.product(HEAD_DIMS, (False, True), SEQS)


def tensors(d: int, n: int):
    heads, batch = HIDDEN // d, max(1, TOKENS // n)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, do = (
        torch.randn((batch, heads, n, d), device=DEVICE, dtype=dtype, generator=gen) for _ in range(4)
    )
    return batch, heads, q, k, v, do


def items() -> list[dict[str, Any]]:
    """Every measurement of the study, in a fixed order (the compile workers take every j-th)."""
    out: list[dict[str, Any]] = []
    for d, causal, n in shapes():
        base = {"d": d, "causal": causal, "n": n}
        for tma in TMA_MODES:
            out += [{**base, "kind": "fwd", "tma": tma, "config": cfg(c)} for c in FWD]
            out += [{**base, "kind": "dkdv", "tma": tma, "config": cfg(c)} for c in DKDV]
            out += [{**base, "kind": "dq", "tma": tma, "config": cfg(c)} for c in DQ]
        out += [
            {**base, "kind": "fwd", "study": "variants", "tma": 1, "variant": v, "config": cfg(c)}
            for c in FWD_VARIANT_CONFIGS
            for v in FWD_VARIANTS
        ]
        for name in ("sdpa-flash", "sdpa-cudnn") if DEVICE == "cuda" else ():
            out += [
                {**base, "kind": mode, "provider": name, "tma": 0, "config": None}
                for mode in ("fwd", "fwd+bwd")
            ]
    return [it for it in out if it.get("study", "sdpa" if "provider" in it else it["kind"]) in KINDS]


def runner(item: dict[str, Any], data) -> Any:
    """A zero-argument callable for one item (its first call compiles)."""
    batch, heads, q, k, v, do = data
    causal, scale = item["causal"], q.shape[-1] ** -0.5
    flags = item.get("variant", {})

    def apply() -> None:
        """The item's TMA mode, set again before every call: a shape's items run in rotation."""
        os.environ["FLASHBENCH_TMA"] = str(item["tma"])

    apply()
    if "provider" in item:
        backend = (
            SDPBackend.FLASH_ATTENTION if item["provider"] == "sdpa-flash" else SDPBackend.CUDNN_ATTENTION
        )
        leaves = [t.detach().requires_grad_(item["kind"] != "fwd") for t in (q, k, v)]

        def call():
            with sdpa_kernel(backend):
                o = sdpa(*leaves, is_causal=causal)
            if item["kind"] != "fwd":
                torch.autograd.backward(o, do)

        return call
    if item["kind"] == "fwd":

        def fwd():
            apply()
            return flash_attn(q, k, v, causal=causal, config={**item["config"], **flags})

        return fwd
    o, lse, _ = attention_forward(q, k, v, causal, scale, cfg(FWD[1]))
    dkdv = item["config"] if item["kind"] == "dkdv" else cfg(BASE_DKDV)
    dq = item["config"] if item["kind"] == "dq" else cfg(BASE_DQ)

    def bwd():
        apply()
        return attention_backward(q, k, v, o, lse, do, None, causal, scale, dkdv, dq)

    return bwd


def compile_part(part: int, parts: int) -> None:
    todo = [it for j, it in enumerate(items()) if j % parts == part and "provider" not in it]
    cache: dict[tuple[int, int], Any] = {}
    for it in todo:
        key = (it["d"], it["n"])
        if key not in cache:
            cache.clear()
            cache[key] = tensors(it["d"], it["n"])
        try:
            runner(it, cache[key])()
        except Exception:  # noqa: BLE001 - the timing pass records the error
            pass
    sync()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (Triton interpreter)"


def _variant_name(variant: dict[str, int]) -> str:
    return "+".join(f"{name.lower()}={value}" for name, value in variant.items()) or "plain"


def _compiled(jit_fn: Any) -> list[Any]:
    """The kernels `jit_fn` has loaded in this process (to read their registers and spills)."""
    out = []
    for caches in getattr(jit_fn, "device_caches", {}).values():
        cache = caches[0] if isinstance(caches, tuple) else {}
        out += [k for k in cache.values() if hasattr(k, "metadata")]
    return out


def time_all(out_path: str | None) -> list[dict[str, Any]]:
    """Time every item; the items of one shape are timed in rotation, ROUNDS times (median of the medians),
    so that clock drift under the power cap reaches every variant alike."""
    rows: list[dict[str, Any]] = []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for it in items():
        groups.setdefault((it["d"], it["causal"], it["n"]), []).append(it)
    for (d, causal, n), group in groups.items():
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        data = tensors(d, n)
        batch, heads = data[0], data[1]
        ready: list[tuple[dict[str, Any], Any]] = []  # (row, call)
        for it in group:
            row = {k: v for k, v in it.items()}
            rows.append(row)
            try:
                call = runner(it, data)
                jit_fn = JIT.get(it["kind"], flash_v2._attn_fwd)
                before = set(map(id, _compiled(jit_fn)))
                t0 = time.perf_counter()
                out = call()
                sync()
                row["first_s"] = round(time.perf_counter() - t0, 3)
                new = [k for k in _compiled(jit_fn) if id(k) not in before]
                if new and "provider" not in it:
                    row["regs"], row["spills"] = (
                        getattr(new[0], "n_regs", None),
                        getattr(new[0], "n_spills", None),
                    )
                if it.get("study") == "variants":
                    row["max_err"] = _max_err(out, data, causal, it["kind"])
            except Exception as exc:  # noqa: BLE001 - recorded
                row["error"] = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                    if str(exc)
                    else type(exc).__name__
                )
                continue
            ready.append((row, call))
        flush = L2Flusher("cuda") if DEVICE == "cuda" else None
        for _ in range(ROUNDS if DEVICE == "cuda" else 1):
            for row, call in ready:
                if flush is not None:
                    ms = statistics.median(time_cuda(call, flush=flush))
                else:  # smoke test: one timed call
                    t0 = time.perf_counter()
                    call()
                    ms = (time.perf_counter() - t0) * 1e3
                row.setdefault("rounds_ms", []).append(ms)
        for row, _ in ready:
            row["ms"] = statistics.median(row["rounds_ms"])
            mode = {"fwd": "fwd", "fwd+bwd": "fwd+bwd"}.get(row["kind"], "bwd")
            row["tflops"] = attention_flops(batch, heads, n, n, d, causal, mode) / row["ms"] / 1e9
    if out_path:
        with open(out_path, "w") as fh:
            json.dump({"device": device_name(), "rounds": ROUNDS, "rows": rows}, fh, indent=1)
    return rows


def _max_err(out: Any, data, causal: bool, kind: str) -> float:
    """Largest absolute difference from cuDNN's output or gradients (dq, dk, dv; on CPU: fp32 SDPA's)."""
    q, k, v, do = data[2:6]
    lowp = DEVICE == "cuda"
    leaves = [(t if lowp else t.float()).detach().requires_grad_(kind != "fwd") for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION if lowp else SDPBackend.MATH):
        want = sdpa(*leaves, is_causal=causal)
    if kind != "fwd":
        want = torch.autograd.grad(want, leaves, do if lowp else do.float())
        return max((a.float() - b.float()).abs().max().item() for a, b in zip(out, want, strict=True))
    return (out.float() - want.float()).abs().max().item()


def summary(rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if "ms" in r]
    print(f"device: {device_name()}; {len(ok)} of {len(rows)} items measured")
    for d, causal, n in shapes():
        sel = [r for r in ok if (r["d"], r["causal"], r["n"]) == (d, causal, n)]
        base = {(r["provider"], r["kind"]): r for r in sel if "provider" in r}
        line = f"d={d} causal={causal!s:5} N={n}:"
        for (prov, kind), r in sorted(base.items()):
            line += f" {prov} {kind} {r['ms']:.3f} ms ({r['tflops']:.0f});"
        print(line)
        best_ms = {}
        for kind in ("fwd", "dkdv", "dq"):
            cand = sorted(
                (r for r in sel if r["kind"] == kind and "provider" not in r), key=lambda r: r["ms"]
            )
            for r in cand[:4]:
                regs = f" [{r.get('regs')} regs, {r.get('spills')} B spilled]" if "regs" in r else ""
                print(f"    {kind:5} tma={r['tma']} {r['config']} {r['ms']:.3f} ms{regs}")
            for tma in (1, 0):
                t = [r for r in cand if r["tma"] == tma]
                if t:
                    print(f"    {kind:5} best with tma={tma}: {t[0]['ms']:.3f} ms {t[0]['config']}")
            best_ms[kind] = cand[0]["ms"] if cand else float("nan")
        fwd = best_ms["fwd"]
        flash_ms, cudnn_ms = (
            base.get((p, "fwd"), {}).get("ms", float("nan")) for p in ("sdpa-flash", "sdpa-cudnn")
        )
        print(
            f"    triton best fwd {fwd:.3f} ms; sdpa-flash/triton fwd = {flash_ms / fwd:.2f}; "
            f"sdpa-cudnn/triton fwd = {cudnn_ms / fwd:.2f}"
        )
    var = [r for r in ok if r.get("study") == "variants"]
    if var:
        print("forward variants, TFLOP/s per variant [regs/spill bytes], max error vs cuDNN:")
    for d, causal, n in shapes():
        per: dict[tuple, dict] = {}
        for r in var:
            if (r["d"], r["causal"], r["n"]) == (d, causal, n):
                per.setdefault((r["kind"], *r["config"].values()), {})[_variant_name(r["variant"])] = r
        for c, pr in sorted(per.items()):
            cells = " ".join(
                f"{k}:{r['tflops']:.0f}[{r.get('regs')}/{r.get('spills')}]" for k, r in sorted(pr.items())
            )
            err = max(r["max_err"] for r in pr.values())
            print(f"    d={d} causal={causal!s:5} N={n:5} {c}: {cells} err<={err:.1e}")
        shape_fwd = [r for r in ok if r["kind"] == "fwd" and (r["d"], r["causal"], r["n"]) == (d, causal, n)]
        base = {r["provider"]: r["tflops"] for r in shape_fwd if "provider" in r}
        best: dict[str, dict] = {}
        for r in var:
            name = _variant_name(r["variant"])
            if r["kind"] != "fwd" or (r["d"], r["causal"], r["n"]) != (d, causal, n):
                continue
            if r["tflops"] > best.get(name, {}).get("tflops", 0):
                best[name] = r
        if best:
            cells = " | ".join(
                f"{name} {r['tflops']:.0f} {tuple(r['config'].values())} "
                f"({r['tflops'] / base.get('sdpa-flash', float('nan')):.2f}x flash, "
                f"{r['tflops'] / base.get('sdpa-cudnn', float('nan')):.2f}x cuDNN)"
                for name, r in sorted(best.items())
            )
            print(f"  best d={d} causal={causal!s:5} N={n:5}: {cells}")
    for r in rows:
        if "error" in r:
            print("ERROR", {k: r[k] for k in ("kind", "d", "causal", "n", "tma", "config")}, r["error"])


def main() -> None:
    global HIDDEN, TOKENS, SEQS, HEAD_DIMS, DEVICE, KINDS, TMA_MODES, ROUNDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["run", "warm", "compile", "time"])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument(
        "--smoke", action="store_true", help="CPU interpreter, tiny shapes: checks the script only"
    )
    ap.add_argument("--kinds", default=",".join(KINDS), help="which of fwd,dkdv,dq,sdpa to study")
    ap.add_argument("--seqs", default=",".join(map(str, SEQS)), help="sequence lengths, e.g. 2048,8192")
    ap.add_argument("--tma", default="1,0", help="TMA modes of the plain fwd/dkdv/dq configs: 1,0 or 1")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="timing rounds in rotation per shape")
    args = ap.parse_args()
    ROUNDS = args.rounds
    KINDS = tuple(args.kinds.split(","))
    TMA_MODES = tuple(int(x) for x in args.tma.split(","))
    SEQS = tuple(int(x) for x in args.seqs.split(","))
    if args.smoke:
        HIDDEN, TOKENS, SEQS, HEAD_DIMS, DEVICE = 64, 64, (64,), (32,), "cpu"
    if args.what == "compile":
        compile_part(args.part, args.jobs)
        return
    if args.what in ("run", "warm"):
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "compile",
                    "--jobs",
                    str(args.jobs),
                    "--part",
                    str(j),
                    "--kinds",
                    args.kinds,
                    "--seqs",
                    args.seqs,
                    "--tma",
                    args.tma,
                ]
            )
            for j in range(args.jobs)
        ]
        for p in procs:
            p.wait()
        print(f"compiled in {time.perf_counter() - t0:.0f} s", flush=True)
        if args.what == "warm":
            return
    out = os.environ.get("OUT")
    rows = time_all(os.path.join(out, "kernel_configs.json") if out else None)
    summary(rows)


if __name__ == "__main__":
    main()

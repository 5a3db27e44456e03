"""Nsight Compute: where the forward's cycles go (tensor pipe, MUFU, FMA/ALU, issue slots, stalls) for the
bundled kernel beside SDPA flash and cuDNN, at one of the speed preset's shapes (bf16, hidden 2048 so
heads = 2048 / d, 16k tokens per batch; default d = 128, N = 8192).

    python3 tools/ncu_pipes.py drive [--ncu ncu] [--causal] [--dim D] [--seq N] [--providers P,...] [--bwd] [--fp8]
    python3 tools/ncu_pipes.py parse DIR                       # table from the saved raw CSVs

--fp8 profiles the bundled forward on e4m3 inputs, quantized and laid out as the sweep's FP8 cases are (providers
triton and gluon@...). gluon@KEY=V/KEY=V forces any flash_ws keys over its defaults (gluon@BLOCK_N=128/STAGES=3).
--bwd profiles the backward instead (the forward runs unprofiled first): triton is the bundled backward as the
sweep runs it (preprocess, the kernel, dQ's conversion), sdpa-cudnn / sdpa-flash torch.autograd.grad through
that SDPA backend; the MemoryWorkloadAnalysis section is added (DRAM bytes per second, L2 sector use and hit
rate: dQ's adds go through L2).
A provider is triton (flash_attn as the sweep runs it), triton@BM.BN.W.S (that forced tl config), gluon@BM
(flash_ws forced, BLOCK_M 128 or 192), sdpa-flash or sdpa-cudnn.
Each child warms up (Triton compile and autotune happen there, unprofiled), then brackets one forward call
with cudaProfilerStart/Stop. ncu runs with --page raw and the SpeedOfLight, ComputeWorkloadAnalysis and
WarpStateStats sections; the raw CSV of each provider is saved to $OUT (or results/ncu_pipes/).
Besides the metrics of SHOW, each kernel gets two lines: its SMs' active cycles, least and most, over their mean
(how evenly the grid's work spread: a persistent walk ends with its busiest SM; the d = 64 causal walk's uneven
schedule table read 0.695 .. 1.133 here, cuDNN 0.970 .. 1.033), and its warps' most frequent stall reasons per
issued instruction.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

PROVIDERS = ("triton", "sdpa-flash", "sdpa-cudnn")
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "WarpStateStats", "Occupancy", "LaunchStats")
# Raw metric name fragments worth a column (first match per fragment, in this order).
SHOW = (
    "gpu__time_duration.sum",
    "gpc__cycles_elapsed.avg.per_second",
    "dram__bytes.sum.per_second",
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__inst_executed_pipe_tensor",
    "sm__pipe_tensor",
    "sm__inst_executed_pipe_xu",
    "sm__pipe_fma_cycles_active",
    "sm__pipe_alu_cycles_active",
    "sm__inst_executed_pipe_alu",
    "smsp__issue_active.avg.pct",
    "sm__warps_active.avg.pct_of_peak",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_registers",
    "launch__grid_size",
)


def one(
    provider: str, causal: bool, dim: int = 128, seq: int = 8192, bwd: bool = False, fp8: bool = False
) -> None:
    import torch
    from flashbench.kernels import flash_attn
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    shape = (max(1, 16384 // seq), 2048 // dim, seq, dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    descales: dict[str, Any] = {}
    if fp8:
        if bwd or not provider.startswith(("triton", "gluon")):
            raise SystemExit(
                f"ncu_pipes: --fp8 profiles the bundled forward (triton, gluon@...), not {provider!r}"
            )
        q, k, v, descales = fp8_inputs(q, k, v)
    if bwd:
        call = backward_call(provider, q, k, v, causal)
    elif provider.startswith(("gluon", "triton")):
        config = gluon_config(provider) if provider.startswith("gluon") else tl_config(provider)
        call = lambda: flash_attn(q, k, v, causal=causal, config=config, **descales)  # noqa: E731
    else:
        backend = sdpa_backend(provider)

        def call():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def tl_config(provider: str) -> dict[str, Any] | None:
    """The forced tl config of triton@BM.BN.W.S; None for triton (flash_attn's own pick)."""
    if "@" not in provider:
        return None
    block_m, block_n, warps, stages = (int(x) for x in provider.split("@")[1].split("."))
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}


def gluon_config(provider: str) -> dict[str, Any]:
    """The forced Gluon config of gluon@BM (BLOCK_M) or gluon@KEY=V/KEY=V (any flash_ws keys, integers), over its
    defaults."""
    spec = provider.partition("@")[2]
    if "=" in spec:
        return {
            "kernel": "gluon-ws",
            **{key: int(val) for key, val in (p.split("=") for p in spec.split("/"))},
        }
    return {"kernel": "gluon-ws", "BLOCK_M": int(spec) if spec else 128}


def fp8_inputs(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """e4m3 q, k, v with their descales as the sweep's FP8 cases pass them (per K/V head; V in the FP8
    kernel's layout, laid out once outside the profiled call)."""
    from flashbench.kernels import value_layout

    from flashbench.engine.fp8 import quantize

    heads = q.shape[1]
    (q8, qd), (k8, kd), (v8, vd) = (quantize(t, heads) for t in (q, k, v))
    return q8, k8, value_layout(v8), {"q_descale": qd, "k_descale": kd, "v_descale": vd}


def sdpa_backend(provider: str) -> Any:
    """SDPA's backend for sdpa-flash or sdpa-cudnn."""
    from torch.nn.attention import SDPBackend

    backends = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
    if provider not in backends:
        raise SystemExit(f"ncu_pipes: unknown provider {provider!r}")
    return backends[provider]


def backward_call(provider: str, q: Any, k: Any, v: Any, causal: bool) -> Any:
    """The backward of `provider` (triton, sdpa-flash or sdpa-cudnn) at these inputs (its forward run once here,
    unprofiled)."""
    import torch
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    do = torch.randn_like(q)
    if provider == "triton":
        from flashbench.kernels.backward import attention_backward
        from flashbench.kernels.flash_v2 import attention_forward

        scale = q.shape[-1] ** -0.5
        o, lse, _ = attention_forward(q, k, v, causal, scale)
        return lambda: attention_backward(q, k, v, o, lse, do, None, causal, scale)  # noqa: E731
    backend = sdpa_backend(provider)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        out = sdpa(qr, kr, vr, is_causal=causal)
    return lambda: torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True)  # noqa: E731


def drive(
    ncu: str,
    causal: bool,
    providers: tuple[str, ...] = PROVIDERS,
    dim: int = 128,
    seq: int = 8192,
    bwd: bool = False,
    fp8: bool = False,
) -> None:
    out = Path(os.environ.get("OUT") or "results/ncu_pipes")
    out.mkdir(parents=True, exist_ok=True)
    for provider in providers:
        cmd = [ncu, "--profile-from-start", "off", "--csv", "--page", "raw", "--print-units", "base"]
        for section in SECTIONS + (("MemoryWorkloadAnalysis",) if bwd else ()):
            cmd += ["--section", section]
        cmd += [sys.executable, __file__, "one", provider, "--dim", str(dim), "--seq", str(seq)]
        cmd += ["--causal"] if causal else []
        cmd += ["--bwd"] if bwd else []
        cmd += ["--fp8"] if fp8 else []
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        name = re.sub(r"[^\w.=-]", "_", provider)  # gluon@BLOCK_N=128/STAGES=3 -> gluon_BLOCK_N=128_STAGES=3
        (out / f"{name}.ncu.csv").write_text(res.stdout)
        if res.returncode:
            print(
                f"{provider}: ncu exit {res.returncode}: {res.stderr.strip().splitlines()[-1:]}", flush=True
            )
    parse(out)


STALLS = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def sm_spread(row: dict[str, str]) -> tuple[float, float] | None:
    """The SMs' active cycles, least and most, over their mean (None where the row lacks them)."""
    try:
        low, mean, high = (_number(row[f"sm__cycles_active.{k}"]) for k in ("min", "avg", "max"))
    except (KeyError, ValueError):
        return None
    return low / mean, high / mean


def top_stalls(row: dict[str, str], top: int = 5) -> list[tuple[str, float]]:
    """The `top` stall reasons by warps stalled per issued instruction, most first ("selected", the issuing warp
    itself, left out)."""
    head, tail = STALLS
    found = []
    for name, value in row.items():
        if name and name.startswith(head) and name.endswith(tail):
            reason = name[len(head) : -len(tail)]
            try:
                found.append((reason, _number(value)))
            except ValueError:
                continue
    found = [item for item in found if item[0] != "selected"]
    return sorted(found, key=lambda item: -item[1])[:top]


def read_rows(path: Path) -> list[dict[str, str]] | None:
    """The kernels' rows of a raw ncu CSV (its units row dropped), or None where it holds no ncu table."""
    text = path.read_text()
    start = text.find('"ID"')
    if start < 0:
        return None
    return [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("ID", "").isdigit()]


def parse(folder: Path) -> None:
    for path in sorted(folder.glob("*.ncu.csv")):
        rows = read_rows(path)
        if rows is None:
            print(f"{path.name}: no ncu table")
            continue
        print(f"== {path.name.removesuffix('.ncu.csv')}: {len(rows)} kernel(s)")
        for r in rows:
            print(f"   kernel {r.get('Kernel Name', '?')[:70]}")
            for frag in SHOW:
                for name, value in r.items():
                    if name and name.startswith(frag):
                        print(f"      {name:75} {value}")
            spread = sm_spread(r)
            if spread:
                print(f"      SM active cycles over their mean: {spread[0]:.3f} .. {spread[1]:.3f}")
            stalls = top_stalls(r)
            if stalls:
                print(
                    "      stalls per issue: "
                    + ", ".join(f"{reason} {value:.2f}" for reason, value in stalls)
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["drive", "one", "parse"])
    ap.add_argument("arg", nargs="?")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--bwd", action="store_true", help="profile the backward (the forward runs unprofiled)")
    ap.add_argument(
        "--fp8", action="store_true", help="the bundled forward on e4m3 inputs (triton, gluon@...)"
    )
    args = ap.parse_args()
    if args.what == "one":
        one(args.arg, args.causal, args.dim, args.seq, args.bwd, args.fp8)
    elif args.what == "drive":
        drive(args.ncu, args.causal, tuple(args.providers.split(",")), args.dim, args.seq, args.bwd, args.fp8)
    else:
        parse(Path(args.arg))


if __name__ == "__main__":
    main()

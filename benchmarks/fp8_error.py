"""The FP8 forward's error (docs/kernels.md's FP8 table): the bundled kernel, FA3's P quantization with and
without the 2^8 shift, and bf16, against float64.

    python3 benchmarks/fp8_error.py [--seqs 1024,4096] [--dims 64,128] [--seeds 2]

Runs on a GPU, or on the CPU through Triton's interpreter (set here when there is no CUDA; its e4m3 dots are
exact). Inputs: bf16 normal q, k, v [1, 2, N, D] (one K/V head) and "outliers": channels 1, 7, D/2 and D-3 of q
and k times 20; quantized per (batch, K/V head) with amax / 448 (flashbench.engine.fp8). Non-causal. Each
column is the output's relative Frobenius error ||o - ref|| / ||ref||, the mean over seeds:
  kernel     the FP8 kernel against float64 of the dequantized inputs (the kernel's own error);
  shift 8    an emulation of the kernel in torch (64-key blocks, running max, fp32) with P * 2^8 in e4m3 (shipped);
  shift 0    the same emulation with P in [0, 1] in e4m3 (FlashAttention-3's choice);
  kernel/bf16  the FP8 kernel against float64 of the bf16 originals (adds the inputs' e4m3 rounding);
  bf16       the bundled bf16 kernel on CUDA (PyTorch's bf16 attention on the CPU, whose interpreter cannot run a
             bf16 dot) against float64 of the bf16 originals.
"""

from __future__ import annotations

import argparse
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (by flashbench.kernels)

from flashbench.kernels import flash_attn  # noqa: E402

from flashbench.engine import correctness, fp8  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(n: int, d: int, seed: int, outliers: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((1, heads, n, d), generator=gen) for heads in (2, 1, 1))
    if outliers:
        for t in (q, k):
            t[..., [1, 7, d // 2, d - 3]] *= 20.0
    return tuple(t.to(DEVICE, torch.bfloat16) for t in (q, k, v))


def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shift: float, block: int = 64) -> torch.Tensor:
    """The FP8 kernel's loop in torch, fp32, on the dequantized inputs (non-causal): running max, P * 2^shift
    rounded to e4m3 for P V, the sum of the fp32 P; bf16 output."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, N, N]; K/V heads broadcast (one here)
    m = torch.full(s.shape[:-1], float("-inf"), device=s.device)
    total = torch.zeros_like(m)
    acc = torch.zeros(*s.shape[:-1], v.shape[-1], device=s.device)
    for j in range(0, s.shape[-1], block):
        sj = s[..., j : j + block]
        m_new = torch.maximum(m, sj.amax(-1))
        p = torch.exp(sj - m_new[..., None]) * 2.0**shift
        alpha = torch.exp(m - m_new)
        total = total * alpha + p.sum(-1)
        pq = p.to(torch.float8_e4m3fn).float()
        acc = acc * alpha[..., None] + pq @ v[..., j : j + block, :]
        m = m_new
    return (acc / total[..., None]).to(torch.bfloat16)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


def errors(n: int, d: int, seed: int, outliers: bool) -> dict[str, float]:
    q, k, v = inputs(n, d, seed, outliers)
    (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, 1) for t in (q, k, v))
    real = [fp8.dequantize(t, s) for t, s in ((q8, qd), (k8, kd), (v8, vd))]
    ref_deq = correctness.reference(*real, causal=False)["out"]
    ref_bf16 = correctness.reference(q, k, v, causal=False)["out"]
    out = flash_attn(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    if DEVICE == "cuda":
        bf16 = flash_attn(q, k, v)
    else:
        bf16 = correctness.reference(q, k, v, causal=False, dtype=torch.bfloat16)["out"]
    return {
        "kernel": rel(out, ref_deq),
        "shift 8": rel(emulate(*real, shift=8.0), ref_deq),
        "shift 0": rel(emulate(*real, shift=0.0), ref_deq),
        "kernel/bf16": rel(out, ref_bf16),
        "bf16": rel(bf16, ref_bf16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", default="1024,4096")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    columns = ["kernel", "shift 8", "shift 0", "kernel/bf16", "bf16"]
    print(f"device: {DEVICE}; relative error of the output against float64 (mean of {args.seeds} seeds)")
    print("| inputs | d | N | " + " | ".join(columns) + " | shift 0 / shift 8 |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in columns) + " | ---: |")
    for outliers in (False, True):
        for d in (int(x) for x in args.dims.split(",")):
            for n in (int(x) for x in args.seqs.split(",")):
                runs = [errors(n, d, seed, outliers) for seed in range(args.seeds)]
                mean = {c: sum(r[c] for r in runs) / len(runs) for c in columns}
                cells = " | ".join(f"{100 * mean[c]:.2f}%" for c in columns)
                kind = "outliers x20" if outliers else "normal"
                print(
                    f"| {kind} | {d} | {n} | {cells} | {mean['shift 0'] / mean['shift 8']:.2f} |", flush=True
                )


if __name__ == "__main__":
    main()

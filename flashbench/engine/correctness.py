"""Correctness per case: relative error against a float64 reference, with flash-attn's error budget.

    err(provider, ref64) <= 2 * err(torch low-precision attention, ref64) + eps[dtype]

err is the relative Frobenius error ||x - ref|| / ||ref||, computed for the output and, in the backward
modes, for dq, dk and dv (each against its own budget). The "torch low-precision attention" is plain
PyTorch attention in the case's dtype (matmuls in the dtype, softmax in fp32, P cast back to the dtype).

The reference runs on the case's device, one (batch, kv-head group) slice at a time and one block of query
rows at a time, so it fits in memory at any N. Its cost grows as B*H*N^2: beyond `flops_limit` only a spread
of slices is checked (the row's `ref` says how many); if a single slice costs more than the limit the check is
skipped and `ref` says why. NaN/Inf anywhere in the full output or gradients is always caught.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flashbench.models.flops import attention_flops
from flashbench.spec.cases import Case

# eps per dtype. fp32 allows TF32 tensor-core math (10-bit mantissa, relative error ~1e-3), which Triton's
# tl.dot and the fused fp32 kernels use by default; fp16/bf16 budgets come from the 2x rule.
EPS = {"fp16": 1e-4, "bf16": 1e-4, "fp32": 3e-3}
DEFAULT_FLOPS_LIMIT = {"cuda": 2e13, "cpu": 2e9}
_BLOCK_ELEMS = 2**25  # query rows per block: a float64 S block stays <= 256 MiB


@dataclass
class CheckResult:
    ok: bool
    rel_err: float | None
    err_budget: float | None
    ref: str
    reason: str = ""


def _dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def non_finite(tensors: dict[str, Any]) -> str | None:
    import torch

    for name, t in tensors.items():
        if t is None:
            return f"{name} is missing"
        if not bool(torch.isfinite(t).all()):
            return f"{name} contains NaN/Inf"
    return None


def _attend(q: Any, k: Any, v: Any, do: Any, causal: bool, scale: float, mm: Any, sm: Any) -> dict[str, Any]:
    """Attention (and its gradients if do is given) for one kv-head group.

    q [g, Nq, D], k/v [Nk, D], do [g, Nq, D] or None. Matmuls in `mm`, softmax and dS in `sm`,
    dk/dv accumulated in float64 (reference) or float32 (low precision).
    """
    import torch

    g, nq, d = q.shape
    nk = k.shape[0]
    acc = torch.float64 if mm == torch.float64 else torch.float32
    qm, km, vm = q.to(mm), k.to(mm), v.to(mm)
    out = torch.empty(g, nq, d, dtype=mm, device=q.device)
    grads = do is not None
    if grads:
        dq = torch.empty(g, nq, d, dtype=mm, device=q.device)
        dk = torch.zeros(nk, d, dtype=acc, device=q.device)
        dv = torch.zeros(nk, d, dtype=acc, device=q.device)
    block = max(1, min(nq, _BLOCK_ELEMS // max(nk, 1)))
    cols = torch.arange(nk, device=q.device)[None, :]
    for h in range(g):
        for r0 in range(0, nq, block):
            r1 = min(nq, r0 + block)
            s = (qm[h, r0:r1] @ km.T).to(sm) * scale  # [rows, Nk]
            if causal:
                rows = torch.arange(r0, r1, device=q.device)[:, None] + (nk - nq)  # bottom-right
                s.masked_fill_(cols > rows, float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num_(0.0)  # a row with no keys outputs 0
            pm = p.to(mm)
            ob = pm @ vm
            out[h, r0:r1] = ob
            if grads:
                dob = do[h, r0:r1].to(mm)
                dp = (dob @ vm.T).to(sm)
                delta = (dob.to(sm) * ob.to(sm)).sum(-1, keepdim=True)
                ds = (p * (dp - delta)).to(mm)
                dv += (pm.T @ dob).to(acc)
                dq[h, r0:r1] = (ds @ km) * scale
                dk += (ds.T @ qm[h, r0:r1]).to(acc) * scale
    result = {"out": out}
    if grads:
        result.update(dq=dq, dk=dk, dv=dv)
    return result


def _slices(batch: int, kv_heads: int, count: int) -> list[tuple[int, int]]:
    """`count` (batch, kv-head) pairs spread evenly over all of them, first and last included."""
    total = batch * kv_heads
    if count >= total:
        picks = list(range(total))
    elif count == 1:
        picks = [0]
    else:
        picks = sorted({round(i * (total - 1) / (count - 1)) for i in range(count)})
    return [(p // kv_heads, p % kv_heads) for p in picks]


def check(
    case: Case,
    inputs: dict[str, Any],
    results: dict[str, Any],
    device: str,
    flops_limit: float | None = None,
) -> CheckResult:
    """Compare `results` (out, and dq/dk/dv in the backward modes) with the float64 reference.

    inputs: q [B, H, Nq, D], k, v [B, Hkv, Nk, D], and do [B, H, Nq, D] in the backward modes.
    """
    import torch

    bad = non_finite(results)
    if bad:
        return CheckResult(False, None, None, "not compared", bad)
    limit = flops_limit or DEFAULT_FLOPS_LIMIT.get(device, 2e9)
    grads = "dq" in results
    g = case.heads // case.kv_heads
    # reference (float64) + low-precision run, per slice
    mult = 2 * (3.5 if grads else 1.0)
    # the reference computes every (q, k) pair and masks afterwards: cost it as non-causal
    per_slice = mult * attention_flops(1, g, case.seq_q, case.seq_k, case.head_dim, False, "fwd")
    total = case.batch * case.kv_heads
    if per_slice > limit:
        return CheckResult(
            True,
            None,
            None,
            f"skipped: one kv-head group's float64 reference costs {per_slice / 1e12:.1f} TFLOP "
            f"> the limit of {limit / 1e12:.1f} TFLOP",
        )
    count = max(1, min(total, int(limit // max(per_slice, 1.0))))
    scale = case.head_dim**-0.5
    lowp = _dtype(case.dtype)
    names = ["out", "dq", "dk", "dv"] if grads else ["out"]
    sq = {n: [0.0, 0.0, 0.0] for n in names}  # ||x - ref||^2, ||lowp - ref||^2, ||ref||^2
    q, k, v, do = inputs["q"], inputs["k"], inputs["v"], inputs.get("do")
    with torch.no_grad():
        for b, j in _slices(case.batch, case.kv_heads, count):
            hs = slice(j * g, (j + 1) * g)
            args = (q[b, hs], k[b, j], v[b, j], do[b, hs] if grads else None)
            wide = tuple(a.double() if a is not None else None for a in args)
            ref = _attend(*wide, case.causal, scale, torch.float64, torch.float64)
            low = _attend(*args, case.causal, scale, lowp, torch.float32)
            got = {"out": results["out"][b, hs]}
            if grads:
                got.update(dq=results["dq"][b, hs], dk=results["dk"][b, j], dv=results["dv"][b, j])
            for n in names:
                r = ref[n]
                sq[n][0] += float((got[n].double() - r).pow(2).sum())
                sq[n][1] += float((low[n].double() - r).pow(2).sum())
                sq[n][2] += float(r.pow(2).sum())
            del ref, low
    worst: tuple[float, float, float, str] | None = None  # (ratio, err, budget, name)
    parts = []
    for n in names:
        denom = math.sqrt(sq[n][2]) or 1.0
        err = math.sqrt(sq[n][0]) / denom
        budget = 2 * math.sqrt(sq[n][1]) / denom + EPS[case.dtype]
        parts.append(f"{n} {err:.2e}/{budget:.2e}")
        ratio = err / budget
        if worst is None or ratio > worst[0]:
            worst = (ratio, err, budget, n)
    assert worst is not None
    checked = "all" if count >= total else f"{count} of {total}"
    ref = f"float64 on {device}, {checked} (batch, kv-head) slices; err/budget: {', '.join(parts)}"
    ok = worst[0] <= 1.0
    reason = "" if ok else f"{worst[3]} error {worst[1]:.2e} exceeds the budget {worst[2]:.2e}"
    return CheckResult(ok, worst[1], worst[2], ref, reason)

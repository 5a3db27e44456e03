"""One oracle: the float64 attention reference and the error budget, shared by the sweep and the kernel tests,
so that a kernel cannot pass its tests and be "wrong" in a sweep.

    ref = reference(q, k, v, causal=True, do=do)                   # float64: out, lse (+ dq, dk, dv with do)
    low = reference(q, k, v, causal=True, do=do, dtype=q.dtype)    # PyTorch's attention in the low precision
    verdict = compare({"out": o, "dq": dq, "dk": dk, "dv": dv}, ref, low, q.dtype)
    assert verdict.ok, verdict.reason
or, the same in one call: verdict = verify({"out": o, ...}, q, k, v, causal=True, do=do).

The budget (flash-attn's rule), for every tensor x compared (out, and dq, dk, dv in the backward modes):
    err(x, ref64) <= 2 * err(torch low precision, ref64) + EPS[dtype]
err is the relative Frobenius error ||x - ref|| / ||ref|| (absolute where ref is all 0: dq when every row sees
one key). EPS, one table: fp16 1e-4 and bf16 1e-3, about a quarter of each format's unit roundoff (2^-11,
2^-8): the margin where torch's own error is close to 0; fp32 3e-3, because TF32 tensor-core math (10-bit
mantissa, relative error ~1e-3; Triton's tl.dot default) is accepted for fp32 inputs.

The reference's conventions: q [B, H, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv] (Dv = D but for MLA's
absorbed form, where v is the first Dv dims of the latent k and the output has Dv), H a multiple of Hkv (query head h reads
K/V head h // (H / Hkv)); sm_scale defaults to D^-0.5; causal masks are aligned bottom-right (query i sees key
j <= i + Nk - Nq); `window` (left, right) is a sliding window in flash-attn's window_size convention, aligned
the same way (spec/window.py: query i sees keys i + Nk - Nq - left <= j <= i + Nk - Nq + right, -1 = no limit);
`seqlens_k` [B] gives each batch element's valid keys (keys at or past it are padding and get zero gradients),
and a causal mask or a window then aligns to that length: the queries are the last Nq tokens of a
sequence that long, a decode step over a KV cache. Rows that see no key give out 0, lse -inf and zero
gradients. lse is the natural log-sum-exp of the scaled scores of each row.
"Low precision" (dtype given): matmuls in that dtype, scores scaled and soft-maxed in fp32, P and dS cast back
to it, dK and dV summed in fp32: PyTorch's eager attention. For "fp8" (e4m3 inputs, forward only; q, k, v are
then the real values the e4m3 inputs stand for, engine/fp8.dequantize) it is FlashAttention-3's numerics
emulated in fp32: the row's exp(s - max) times 2^8 quantized to e4m3 for P V, divided by 2^8 times its fp32 sum,
the output rounded to bf16 (kernels/flash_fp8.py does the same with the running max).

FP8's EPS is bf16's (1e-3), the format of its output: the rule's 2x of the emulation carries the e4m3 P
quantization (the emulation's error is 1.4-2.5% of float64 on random inputs, 0.2% with outlier channels, whose
attention is nearly one-hot). Measured: the bundled FP8 forward's error over the emulation's, 0.89-1.00 over
tests/test_fp8.py's shapes on the CPU interpreter (the two differ by the running max and the summation order).

An FP8 KV cache (Case.kv_dtype "fp8": q in fp16/bf16, K and V stored in e4m3 with float32 scales): the
reference reads the real values the cache stands for (stored value x scale), "low precision" is torch in q's
dtype over them, and EPS[q's dtype] gains KV_FP8_EPS = 2^-4, the error of rounding one more operand to e4m3, so
that a provider whose FP8 tensor-core path rounds q and P to e4m3 (as vLLM's and FlashInfer's FP8 decode may) is
not called wrong. The derivation: e4m3 keeps 3 mantissa bits, so rounding to nearest moves an element by at most
half an ulp, a relative error of at most u = 2^-4 (at a mantissa of 1.0), spread evenly over [-u, u] on random
data, rms u / sqrt(3). Rounding P: o_i = sum_j p_ij v_j picks up sum_j p_ij e_ij v_j, whose norm over o_i's is
that rms (both sums run over the same independent terms). Rounding q: each score s_ij moves by about
u / sqrt(3) x |s_ij|, and o_i by that over the softmax, u / sqrt(3) relative at unit-variance scores. Both:
sqrt(2/3) u = 0.051 of the output's norm; the budget's 2^-4 = 0.0625 leaves a fifth over it. The bundled
decode converts every stored value exactly and applies the scales in fp32: its tests hold it to the rule
without KV_FP8_EPS (tests/test_decode_fp8.py).

The reference works one (batch, K/V head) slice and one block of query rows at a time, so it fits in memory
at any N, and allocates with zeros/full, never torch.empty (which the kernel tests fill with NaN). The sweep's check() holds a case to the same budget; its cost grows as B*H*N^2, so beyond
`flops_limit` only a spread of slices is checked (the row's `ref` says how many); if a single slice costs more
than the limit the check is skipped and `ref` says why. NaN/Inf anywhere in the full results is always caught.
A packed case (documents one after another, [total, H, D] tensors: engine/packed.py) is checked document by
document, each its own batch of one with its own causal mask or window: every document, on as many K/V heads
(spread evenly) as fit in the limit together; if one K/V head of every document does not fit, the check is
skipped and `ref` says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flashbench.models.flops import attention_flops
from flashbench.spec.cases import Case
from flashbench.spec.window import masked, visible

EPS = {"fp16": 1e-4, "bf16": 1e-3, "fp32": 3e-3, "fp8": 1e-3}
KV_FP8_EPS = 2.0**-4  # an FP8 KV cache's extra budget: one more e4m3 rounding (module docstring)
DEFAULT_FLOPS_LIMIT = {"cuda": 2e13, "cpu": 2e9}
_BLOCK_ELEMS = 2**25  # query rows per block: a float64 S block stays <= 256 MiB


def _torch_dtype(dtype: Any) -> Any:
    import torch

    names = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
    names["fp8"] = torch.float8_e4m3fn
    return names[dtype] if isinstance(dtype, str) else dtype


def dtype_name(dtype: Any) -> str:
    """ "fp16", "bf16", "fp32" or "fp8" for a torch dtype or one of those names (EPS's keys)."""
    import torch

    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8"}
    name = dtype if isinstance(dtype, str) else names.get(dtype)
    if name not in EPS:
        raise ValueError(f"no error budget for dtype {dtype!r} (budgets: {', '.join(EPS)})")
    return name


# ---------------------------------------------------------------------------------------------- reference
def reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    sm_scale: float | None = None,
    do: Any = None,
    seqlens_k: Any = None,
    dtype: Any = None,
    window: Any = None,
) -> dict[str, Any]:
    """Attention {"out", "lse"} and, given `do`, its gradients {"dq", "dk", "dv"} (see the module docstring).

    dtype None: the float64 reference; a low-precision dtype (torch dtype or "bf16"): PyTorch's attention in it.
    """
    import torch

    low = None if dtype is None else _torch_dtype(dtype)
    fp8 = low == torch.float8_e4m3fn  # FA3's numerics, emulated in fp32 (module docstring)
    if fp8 and do is not None:
        raise ValueError("the fp8 reference is forward only")
    mm = torch.float64 if low is None else torch.float32 if fp8 else low  # matmuls
    sm = torch.float64 if low is None else torch.float32  # scores, softmax, dP, dS
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    dv = v.shape[3]  # d, or V's own (MLA's absorbed form: v is the first dv dims of the latent k)
    if h % hkv or k.shape[:3] != v.shape[:3] or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    group, scale = h // hkv, d**-0.5 if sm_scale is None else sm_scale
    lengths = [nk] * b if seqlens_k is None else [int(n) for n in seqlens_k]
    if len(lengths) != b or not all(0 <= n <= nk for n in lengths):
        raise ValueError(f"seqlens_k must hold {b} lengths in [0, {nk}], got {lengths}")
    out = torch.zeros(b, h, nq, dv, dtype=mm, device=q.device)
    lse = torch.full((b, h, nq), float("-inf"), dtype=sm, device=q.device)
    grads = None
    if do is not None:
        grads = {
            "dq": torch.zeros(b, h, nq, d, dtype=mm, device=q.device),
            "dk": torch.zeros(b, hkv, nk, d, dtype=mm, device=q.device),
            "dv": torch.zeros(b, hkv, nk, dv, dtype=mm, device=q.device),
        }
    with torch.no_grad():
        for bi, length in enumerate(lengths):
            for j in range(hkv):
                heads = slice(j * group, (j + 1) * group)
                part = _attend(
                    q=q[bi, heads].detach().to(mm),
                    k=k[bi, j, :length].detach().to(mm),
                    v=v[bi, j, :length].detach().to(mm),
                    do=None if do is None else do[bi, heads].detach().to(mm),
                    causal=causal,
                    window=window,
                    scale=scale,
                    sm=sm,
                    fp8=fp8,
                )
                out[bi, heads], lse[bi, heads] = part["out"], part["lse"]
                if grads is not None:
                    grads["dq"][bi, heads] = part["dq"]
                    grads["dk"][bi, j, :length] = part["dk"]
                    grads["dv"][bi, j, :length] = part["dv"]
    return {"out": out, "lse": lse, **(grads or {})}


def _attend(
    *, q: Any, k: Any, v: Any, do: Any, causal: bool, window: Any, scale: float, sm: Any, fp8: bool = False
) -> dict[str, Any]:
    """One K/V head's group of query heads: q [g, Nq, D] and do (or None) in the matmul dtype, k [Nk, D], v
    [Nk, Dv]."""
    import torch

    g, nq, d = q.shape
    nk = k.shape[0]
    acc = torch.float64 if sm == torch.float64 else torch.float32  # dK, dV summed over rows and heads
    out = torch.zeros(g, nq, v.shape[1], dtype=q.dtype, device=q.device)
    lse = torch.full((g, nq), float("-inf"), dtype=sm, device=q.device)
    dq = torch.zeros_like(q) if do is not None else None
    dk = torch.zeros(nk, d, dtype=acc, device=q.device)
    dv = torch.zeros(nk, v.shape[1], dtype=acc, device=q.device)
    block = block_rows(nq, nk)
    cols = torch.arange(nk, device=q.device)[None, :]
    for head in range(g if nk else 0):
        for r0 in range(0, nq, block):
            r1 = min(nq, r0 + block)
            s = (q[head, r0:r1] @ k.T).to(sm) * scale  # [rows, Nk]
            if masked(causal, window):  # bottom-right: query i sits at key position i + Nk - Nq
                rows = torch.arange(r0, r1, device=q.device)[:, None]
                s.masked_fill_(~visible(rows, cols, nq, nk, causal, window), float("-inf"))
            lse[head, r0:r1] = torch.logsumexp(s, dim=-1)
            p = torch.softmax(s, dim=-1).nan_to_num_(0.0)  # a row that sees no key: P = 0, out 0
            if fp8:
                out[head, r0:r1] = _fp8_pv(p, s, lse[head, r0:r1], v)
                continue
            pm = p.to(q.dtype)
            out[head, r0:r1] = pm @ v
            if do is None:
                continue
            dob = do[head, r0:r1]
            dp = (dob @ v.T).to(sm)
            ds = (p * (dp - (dp * p).sum(-1, keepdim=True))).to(q.dtype)  # softmax backward
            dv += (pm.T @ dob).to(acc)
            dq[head, r0:r1] = (ds @ k) * scale  # type: ignore[index]
            dk += (ds.T @ q[head, r0:r1]).to(acc) * scale
    result = {"out": out, "lse": lse}
    if dq is not None:  # made above exactly when do is given
        result.update(dq=dq, dk=dk.to(q.dtype), dv=dv.to(q.dtype))
    return result


def _fp8_pv(p: Any, s: Any, lse: Any, v: Any) -> Any:
    """P V with FA3's e4m3 P: exp(s - max) = p * sum (in [0, 1]) times 2^8 in e4m3, over 2^8 * sum; bf16 out."""
    import torch

    total = torch.exp(lse - s.amax(-1))[:, None]  # sum_j exp(s_j - max): the row's l
    total = torch.where(torch.isfinite(total), total, torch.ones_like(total))  # rows that see no key
    pq = (p * (total * 256.0)).to(torch.float8_e4m3fn).to(v.dtype)
    return ((pq @ v) / (total * 256.0)).to(torch.bfloat16).to(v.dtype)


# ---------------------------------------------------------------------------------------------- the budget
@dataclass(frozen=True)
class Verdict:
    """The budget applied to every compared tensor: ok, and per name (relative error, budget)."""

    ok: bool
    errors: dict[str, tuple[float, float]]
    reason: str = ""

    @property
    def worst(self) -> str:
        """The tensor nearest to (or furthest over) its budget."""
        return max(self.errors, key=lambda n: self.errors[n][0] / self.errors[n][1], default="")

    @property
    def rel_err(self) -> float | None:
        return self.errors[self.worst][0] if self.errors else None

    @property
    def err_budget(self) -> float | None:
        return self.errors[self.worst][1] if self.errors else None

    def describe(self) -> str:
        """ "out 1.2e-03/4.5e-03, dq ...": each tensor's error over its budget."""
        return ", ".join(f"{n} {e:.2e}/{b:.2e}" for n, (e, b) in self.errors.items())


class ErrorTally:
    """Squared errors summed over pieces of one case (the sweep's slices), then one verdict for the whole."""

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}  # ||x - ref||^2, ||low - ref||^2, ||ref||^2
        self._bad = ""

    def add(self, outputs: dict[str, Any], reference: dict[str, Any], low_precision: dict[str, Any]) -> None:
        import torch

        for name, got in outputs.items():
            ref, low = reference[name].double(), low_precision[name].double()
            if tuple(got.shape) != tuple(ref.shape):
                self._bad = self._bad or f"{name} has shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
                continue
            got = got.detach().double()
            finite = torch.isfinite(ref)  # lse is -inf on rows that see no key: got must say so too
            if not bool(torch.isfinite(got[finite]).all()) or not torch.equal(got[~finite], ref[~finite]):
                self._bad = self._bad or f"{name} contains NaN/Inf"
                continue
            sums = self._sums.setdefault(name, [0.0, 0.0, 0.0])
            sums[0] += float((got[finite] - ref[finite]).pow(2).sum())
            sums[1] += float((low[finite] - ref[finite]).pow(2).sum())
            sums[2] += float(ref[finite].pow(2).sum())

    def verdict(self, dtype: Any, extra_eps: float = 0.0) -> Verdict:
        """The budget err <= 2 * err(low precision) + EPS[dtype] + extra_eps (KV_FP8_EPS for an FP8 cache)."""
        eps = EPS[dtype_name(dtype)] + extra_eps
        errors = {}
        for name, (diff, base, norm) in self._sums.items():
            denom = math.sqrt(norm) or 1.0
            errors[name] = (math.sqrt(diff) / denom, 2.0 * math.sqrt(base) / denom + eps)
        if self._bad:
            return Verdict(False, errors, self._bad)
        over = [n for n, (err, budget) in errors.items() if not err <= budget]
        if not over:
            return Verdict(True, errors)
        worst = max(over, key=lambda n: errors[n][0] / errors[n][1])
        err, budget = errors[worst]
        return Verdict(False, errors, f"{worst} error {err:.2e} exceeds the budget {budget:.2e}")


def compare(
    outputs: dict[str, Any], reference: dict[str, Any], low_precision: dict[str, Any], dtype: Any
) -> Verdict:
    """Hold every tensor in `outputs` to the budget against `reference` (float64) and `low_precision`."""
    tally = ErrorTally()
    tally.add(outputs, reference, low_precision)
    return tally.verdict(dtype)


def verify(
    outputs: dict[str, Any],
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    sm_scale: float | None = None,
    do: Any = None,
    seqlens_k: Any = None,
    window: Any = None,
    dtype: Any = None,
) -> Verdict:
    """reference() in float64 and in `dtype` (default q's), then compare(): the whole check for one kernel call.
    FP8: q, k, v are the dequantized inputs (engine/fp8.dequantize) and dtype "fp8"."""
    kw = dict(causal=causal, sm_scale=sm_scale, do=do, seqlens_k=seqlens_k, window=window)
    low = q.dtype if dtype is None else dtype
    return compare(outputs, reference(q, k, v, **kw), reference(q, k, v, **kw, dtype=low), low)


# ---------------------------------------------------------------------------------------------- the sweep
@dataclass
class CheckResult:
    ok: bool
    rel_err: float | None
    err_budget: float | None
    ref: str
    reason: str = ""


def non_finite(tensors: dict[str, Any]) -> str | None:
    import torch

    for name, t in tensors.items():
        if t is None:
            return f"{name} is missing"
        if not bool(torch.isfinite(t).all()):
            return f"{name} contains NaN/Inf"
    return None


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


def slice_flops(case: Case, grads: bool) -> float:
    """The FLOPs of the float64 reference and the low-precision run on one (batch, kv-head) slice of `case`
    (with its gradients where `grads`): every (q, k) pair is computed, then masked."""
    return (
        2
        * (3.5 if grads else 1.0)
        * attention_flops(
            1,
            case.heads // case.kv_heads,
            case.seq_q,
            case.seq_k,
            case.head_dim,
            False,
            "fwd",
            head_dim_v=case.head_dim_v,
        )
    )


def checked_slices(case: Case, grads: bool, limit: float) -> int:
    """How many (batch, kv-head) slices check() holds to the reference within `limit` FLOPs (0: the check is
    skipped, one slice costs more)."""
    per_slice = slice_flops(case, grads)
    if per_slice > limit:
        return 0
    return max(1, min(case.batch * case.kv_heads, int(limit // max(per_slice, 1.0))))


def reference_blocks(case: Case, slices: int) -> int:
    """The blocks of query rows the reference works through on `slices` slices of `case` (each block one pass of
    _attend's loop: a handful of eager PyTorch calls, whatever its size)."""
    return slices * (case.heads // case.kv_heads) * math.ceil(case.seq_q / block_rows(case.seq_q, case.seq_k))


def block_rows(nq: int, nk: int) -> int:
    """The query rows of one block of the reference: as many as keep its float64 S block within _BLOCK_ELEMS."""
    return max(1, min(nq, _BLOCK_ELEMS // max(nk, 1)))


def check(
    case: Case,
    inputs: dict[str, Any],
    results: dict[str, Any],
    device: str,
    flops_limit: float | None = None,
) -> CheckResult:
    """A sweep case's results (out, and dq/dk/dv in the backward modes) held to the budget (module docstring).

    inputs: q [B, H, Nq, D], k, v [B, Hkv, Nk, D], do [B, H, Nq, D] in the backward modes, and seqlens_k (each
    sequence's valid keys, a ragged KV cache; None or absent: all Nk).
    """
    bad = non_finite(results)
    if bad:
        return CheckResult(False, None, None, "not compared", bad)
    limit = flops_limit or DEFAULT_FLOPS_LIMIT.get(device, 2e9)
    if case.packed:
        return _check_documents(case, inputs, results, device, limit)
    grads = "dq" in results
    g = case.heads // case.kv_heads
    per_slice = slice_flops(case, grads)
    total = case.batch * case.kv_heads
    count = checked_slices(case, grads, limit)
    if not count:
        return CheckResult(
            True,
            None,
            None,
            f"skipped: one kv-head group's float64 reference costs {per_slice / 1e12:.1f} TFLOP "
            f"> the limit of {limit / 1e12:.1f} TFLOP",
        )
    scale = case.head_dim**-0.5
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    lengths = inputs.get("seqlens_k")
    tally = ErrorTally()
    for b, j in _slices(case.batch, case.kv_heads, count):
        heads, one = slice(j * g, (j + 1) * g), slice(b, b + 1)
        qs, ks, vs = q[one, heads], k[one, j : j + 1], v[one, j : j + 1]
        kw = dict(
            causal=case.causal,
            sm_scale=scale,
            do=inputs["do"][one, heads] if grads else None,
            window=case.window_size,
        )
        if lengths is not None:
            kw["seqlens_k"] = [lengths[b]]
        got = {"out": results["out"][one, heads]}
        if grads:
            got.update(
                dq=results["dq"][one, heads],
                dk=results["dk"][one, j : j + 1],
                dv=results["dv"][one, j : j + 1],
            )
        tally.add(got, reference(qs, ks, vs, **kw), reference(qs, ks, vs, **kw, dtype=case.dtype))
    verdict = tally.verdict(case.dtype, KV_FP8_EPS if case.kv_dtype == "fp8" else 0.0)
    checked = "all" if count >= total else f"{count} of {total}"
    ref = f"float64 on {device}, {checked} (batch, kv-head) slices; err/budget: {verdict.describe()}"
    return CheckResult(verdict.ok, verdict.rel_err, verdict.err_budget, ref, verdict.reason)


def _check_documents(
    case: Case, inputs: dict[str, Any], results: dict[str, Any], device: str, limit: float
) -> CheckResult:
    """check() of a packed case: every document on the K/V heads that fit in `limit` (module docstring)."""
    from flashbench.engine.packed import split

    lengths = case.documents() or ()
    grads = "dq" in results
    g = case.heads // case.kv_heads
    one_head = sum(
        2 * (3.5 if grads else 1.0) * attention_flops(1, g, n, n, case.head_dim, False, "fwd")
        for n in lengths
    )
    if one_head > limit:
        return CheckResult(
            True,
            None,
            None,
            f"skipped: one kv-head group of every document costs {one_head / 1e12:.1f} TFLOP in float64 "
            f"> the limit of {limit / 1e12:.1f} TFLOP",
        )
    count = max(1, min(case.kv_heads, int(limit // one_head)))
    heads_checked = sorted({j for _, j in _slices(1, case.kv_heads, count)})
    names = ["q", "k", "v", *(["do"] if grads else [])]
    parts = {name: split(inputs[name], lengths) for name in names}
    got_parts = {name: split(t, lengths) for name, t in results.items()}
    tally = ErrorTally()
    for i in range(len(lengths)):
        for j in heads_checked:
            heads = slice(j * g, (j + 1) * g)
            q, k, v = parts["q"][i][:, heads], parts["k"][i][:, j : j + 1], parts["v"][i][:, j : j + 1]
            kw = dict(
                causal=case.causal,
                sm_scale=case.head_dim**-0.5,
                do=parts["do"][i][:, heads] if grads else None,
                window=case.window_size,
            )
            got = {
                name: t[i][:, heads] if name in ("out", "dq") else t[i][:, j : j + 1]
                for name, t in got_parts.items()
            }
            tally.add(got, reference(q, k, v, **kw), reference(q, k, v, **kw, dtype=case.dtype))
    verdict = tally.verdict(case.dtype)
    checked = "all" if count >= case.kv_heads else f"{count} of {case.kv_heads}"
    ref = (
        f"float64 on {device}, all {len(lengths)} documents x {checked} kv heads; "
        f"err/budget: {verdict.describe()}"
    )
    return CheckResult(verdict.ok, verdict.rel_err, verdict.err_budget, ref, verdict.reason)

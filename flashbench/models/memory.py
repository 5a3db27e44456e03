"""Predicted peak GPU memory of one attention call, above its inputs. Pure: numbers in, bytes out.

What is predicted: the peak of bytes allocated during one call, minus the inputs q, k, v (and dO for a
backward), i.e. ``torch.cuda.max_memory_allocated() - bytes(q, k, v[, dO])`` measured from a clean start.
For "bwd" and "fwd+bwd" the forward's output and the tensors it saved for the backward count: they are
allocated above the inputs while the backward runs. The sweep uses this to skip predicted OOMs and puts the
prediction beside the measured peak (Row.predicted_mem_bytes / Row.peak_mem_bytes).

Notation: E = B*H*Nq*Nk elements of the attention matrices of all heads, R = B*H*Nq softmax rows,
e = bytes per element of the input dtype.

naive: the reference code below (the sweep's naive provider is this code, except that with GQA it folds the
  query heads of a group into rows instead of repeating K and V; GQA was not measured)

    k, v = k.repeat_interleave(H // Hkv, 1), ...   # only with GQA: O(N*d) copies
    s = (q @ k.transpose(-2, -1)) * scale          # [B,H,Nq,Nk] in the input dtype
    if causal: s = s.masked_fill(~mask, -inf)      # mask: one bool [Nq, Nk], shared by all heads
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    o = p @ v

  forward, no autograd: the peak is inside softmax, where s (e), s.float() (4) and its fp32 result (4) live
  together: (e + 8) E for fp16/bf16; O does not exist yet, and when it is written only s (e) and P (e) are
  left, so the peak is max((e + 8) E, 2e E + O). For fp32 .float() and .to() are no-ops: s (4) and P (4) are
  still alive when O is written, 8 E + O. Measured on an H200 (bf16, torch 2.11, tests/measured/h200-default):
  10.000 E plus the causal mask, at every N from 512 to 16384 (O would have added 0.8-50% of E there).
  with autograd: softmax saves its fp32 output P32 and `p @ v` saves P. The backward's peak is in the softmax
  backward, after `p @ v`'s backward has released P and the .to()'s backward has turned dP into fp32: P32 (4)
  + dP32 (4) + the result dS32 (4), and on CUDA also softmax_backward's fp32 temporary `grad * output` (4:
  ATen's softmax_backward_cuda_out computes `tmp = grad * output` before its kernel): 16 E on CUDA (measured
  16.0-16.3 E with O and dV beside it on the H200), 12 E on the CPU (measured 12.2-12.3 E with O and dV in a
  process's peak RSS, tests/test_memory_vs_measured.py). The same counts hold for fp32 inputs (dP is fp32
  from the start). The 34.36 GB "per head per layer" of the source documents is one of these E-sized buffers at
  e = 2, N = 128K: PyTorch's eager path holds eight of them at its peak (in fp16 bytes), not one.

sdpa-math: torch's math backend (`_scaled_dot_product_attention_math`), which materialises the same matrices
  but in fp32 and on fp32 copies of its inputs (io_model's sdpa-math byte family lists the ops). T32: one
  q-sized fp32 tensor; K32: one fp32 K/V-sized tensor (expanded to all query heads with GQA); R = B*H*Nq.
  forward, no autograd: the fp32 copies of q, k, v (fp16/bf16 inputs only) and q scaled by sqrt(scale)
  live through the call; the peak is in _safe_softmax: 9 E (S and its softmax in fp32, the eq(-inf) bool
  matrix) + R (its all() over rows) + the causal mask converted to an fp32 additive mask (4 Nq Nk).
  with autograd: the backward's peak is again the softmax backward (16 E on CUDA, 12 E on the CPU, as for
  naive), beside the scaled q and scaled k saved for the Q K^T matmul's backward, O in the input dtype, and
  dV in fp32 (it waits for the upcast's backward, which runs last): T32 + 2 K32 + O.
  Measured on the H200 (bf16, tests/measured/h200-default): forward 9 E + 4 T32 + R (+ 4 Nq Nk causal),
  fwd+bwd 16 E + 2 T32 + 2 K32 + O, exactly, at every N from 512 to 16384. fp32 inputs and GQA: not measured.

flash (FlashAttention-2, SDPA flash / efficient / cuDNN, FlexAttention, the bundled kernel): O(N). Forward:
  O (e per element) + log-sum-exp (fp32 per row). Backward adds dQ, dK, dV and Delta = rowsum(dO * O) (fp32
  per row); with GQA, dK/dV are first produced per query head and then summed into Hkv heads. Whatever
  else an implementation's backward allocates is its `bwd_workspace_q`, in q-sized buffers of the input
  dtype, declared by its provider: measured in bf16 on an H200 with torch 2.11 (tests/measured/h200-default,
  peak above the inputs in units of one q-sized tensor T): the bundled kernel and FlexAttention 4.03 T
  (O + dQ + dK + dV: workspace 0), SDPA cuDNN and default dispatch 6.05 T (2: an fp32 dQ accumulator),
  SDPA efficient 7.03 T (3), SDPA flash 8.03 T (4).
stored-p (kernels/stored_p.py): a forward that also writes P (e per element, [B, H, Nq, Nk]) for the
  backward, which reads it instead of recomputing; no dS or dP is stored.
flash-v1 (kernels/flash_v1.py): the FlashAttention-1 loop order: an fp32 O accumulator [B, H, Nq, d] and
  m, l (fp32 per row) live in HBM during the forward, beside O and the saved log-sum-exp; v2's backward.

decode (kernels/decode.py, forward only): O. Its split partials and counters live in a workspace the kernel
  allocates once per device and stream and keeps (grown on demand), so after the first call a call allocates O only.

The KV cache a serving engine holds (kv_cache_bytes, the planner's serving half): K and V per layer,
  2 x layers x Hkv x d x e bytes per token; paged, every sequence holds whole pages (ceil(L / page) of them), so
  the last page of a sequence is on average half empty when lengths are not page multiples.

Caching-allocator rounding (512 B blocks) and workspace of a few MB are not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flashbench.models.traffic import one_pass_backward, out_bytes
from flashbench.spec import window as mask_rule

FAMILIES = ("naive", "sdpa-math", "flash", "stored-p", "flash-v1", "decode")
MODES = ("fwd", "bwd", "fwd+bwd")
FP32 = 4


def _check(family: str, mode: str, *dims: int) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown memory family {family!r}; expected one of {FAMILIES}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if any(d < 0 for d in dims):
        raise ValueError("shape dimensions must be >= 0")


def attention_matrix_bytes(batch: int, heads: int, seq_q: int, seq_k: int, elem_bytes: int) -> int:
    """Bytes of one full [B, H, Nq, Nk] score/probability matrix (S or P)."""
    return batch * heads * seq_q * seq_k * elem_bytes


def softmax_stats_bytes(batch: int, heads: int, seq_q: int, stats: int = 1) -> int:
    """Bytes of per-row fp32 softmax statistics: 1 vector (log-sum-exp) or 2 (m and l, FlashAttention-1)."""
    return batch * heads * seq_q * stats * FP32


def naive_matrix_coefficient(elem_bytes: int, mode: str, device: str = "cuda") -> int:
    """Bytes per attention-matrix element at the naive path's peak (see the module docstring)."""
    if mode == "fwd":
        return 8 if elem_bytes >= FP32 else elem_bytes + 8
    return 16 if device == "cuda" else 12  # CUDA's softmax backward adds an fp32 `grad * output` temporary


def predicted_peak_bytes(
    family: str,
    batch: int,
    heads: int,
    kv_heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    elem_bytes: int,
    causal: bool,
    mode: str,
    *,
    bwd_workspace_q: float = 0.0,
    device: str = "cuda",
    window: tuple[int, int] | None = None,
    documents: Sequence[int] | None = None,
    head_dim_v: int = 0,
) -> int:
    """Peak bytes allocated above the inputs (q, k, v and, for a backward, dO) during one call in `mode`.

    `bwd_workspace_q`: for the "flash" family, what the implementation's backward allocates beyond O, dQ, dK,
    dV and the row statistics, in q-sized buffers of the input dtype (its provider declares it).
    `device`: "cuda" or "cpu"; the naive backward differs (see the module docstring), the rest does not.
    `window`: a sliding window (left, right): the naive and math paths build its mask as they build the causal
    one; the tiled families allocate nothing for it.
    `documents`: a packed batch's document lengths: its T tokens as one sequence, [T, H, D] (io_model's rule:
    the tiled families' buffers grow with the tokens; naive and sdpa-math hold one [T, T] matrix and its mask).
    `head_dim_v`: MLA's V dims (Case.head_dim_v): the decode and flash forwards' O has them.
    """
    if documents is not None:
        total = sum(documents)
        dense = family in ("naive", "sdpa-math")  # io_model.DENSE_MASKED: an explicit block-diagonal mask
        return predicted_peak_bytes(
            family,
            1,
            heads,
            kv_heads,
            total,
            total,
            head_dim,
            elem_bytes,
            causal or dense,
            mode,
            bwd_workspace_q=bwd_workspace_q,
            device=device,
            window=None if dense else window,
            head_dim_v=head_dim_v,
        )
    masked = mask_rule.masked(causal, window)
    _check(family, mode, batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes)
    e = elem_bytes
    backward = mode != "fwd"
    matrix = attention_matrix_bytes(batch, heads, seq_q, seq_k, 1)  # elements, all heads
    q_like = batch * heads * seq_q * head_dim * e  # O, dQ
    kv_like = batch * kv_heads * seq_k * head_dim * e  # dK, dV
    # K and V copied per query head by eager GQA; MLA folds the heads into query rows of its one latent head
    kv_expanded = batch * heads * seq_k * head_dim * e if kv_heads != heads and not head_dim_v else 0
    grads = q_like + 2 * kv_like if backward else 0

    if family == "naive":
        mask = seq_q * seq_k if masked else 0  # one bool mask, broadcast over batch and heads
        gqa = 2 * kv_expanded * (2 if backward else 1)  # expanded K, V (and their gradients)
        # At the backward's peak (the softmax backward) only dV exists of the gradients: dQ and dK come
        # from dS afterwards, when the matrix buffers are being freed (measured: 16 E + 2 q-sized, not 4).
        dv = kv_like if backward else 0
        peak = naive_matrix_coefficient(e, mode, device) * matrix
        if not backward:  # O is written after the softmax's peak, beside s and P (see the module docstring)
            peak = max(peak, 2 * e * matrix + q_like) if e < FP32 else peak + q_like
            return peak + mask + gqa
        return peak + mask + gqa + q_like + dv

    if family == "sdpa-math":
        q32 = q_like * FP32 // e
        k32 = (kv_expanded or kv_like) * FP32 // e  # K (or dV) in fp32, per query head with GQA
        if backward:
            return naive_matrix_coefficient(FP32, mode, device) * matrix + q32 + 2 * k32 + q_like
        upcast = q32 + 2 * kv_like * FP32 // e if e < FP32 else 0
        gqa = 2 * k32 if kv_expanded else 0  # K and V expanded to every query head
        mask = 4 * seq_q * seq_k if masked else 0  # the bool mask converted to an fp32 additive one
        return 9 * matrix + batch * heads * seq_q + upcast + q32 + gqa + mask

    o_like = batch * heads * seq_q * (head_dim_v or head_dim) * e  # the forward's O
    if family == "decode":
        if backward:
            raise ValueError("the decode family is forward only")
        return o_like

    if family == "stored-p":
        lse = softmax_stats_bytes(batch, heads, seq_q)
        p = matrix * e
        delta = softmax_stats_bytes(batch, heads, seq_q) if backward else 0
        return p + q_like + lse + delta + grads

    if family == "flash-v1":
        stats = softmax_stats_bytes(batch, heads, seq_q, stats=3)  # m, l and the saved LSE
        o_acc = batch * heads * seq_q * head_dim * FP32
        if backward:  # the accumulator is freed when the forward returns; the backward is flash's
            delta = softmax_stats_bytes(batch, heads, seq_q)
            return max(
                q_like + stats + o_acc, q_like + softmax_stats_bytes(batch, heads, seq_q) + delta + grads
            )
        return q_like + stats + o_acc

    # flash (FP8 inputs: a bf16 O, traffic.out_bytes)
    lse = softmax_stats_bytes(batch, heads, seq_q)
    if not backward:
        return o_like * out_bytes(e) // e + lse
    extra = 0
    if backward:
        delta = softmax_stats_bytes(batch, heads, seq_q)
        extra = delta + round(bwd_workspace_q * q_like) + 2 * kv_expanded
    return q_like + lse + grads + extra


def reported_workspace_bytes(
    kernel_config: Mapping[str, Any] | None, batch: int, heads: int, seq_q: int, head_dim: int, mode: str
) -> int:
    """Bytes a bundled kernel's reported config says it allocated beyond its provider's declared workspace: the
    one-pass backward's fp32 dQ buffer (traffic.one_pass_backward, kernels/backward.py), which the
    provider cannot declare ahead (it runs only where the kernel takes one pass: Hopper, d 64 / 128, long enough)."""
    if mode != "fwd" and one_pass_backward(kernel_config):
        return batch * heads * seq_q * head_dim * FP32
    return 0


# ------------------------------------------------------------------------------ the memory planner


def plan_model_memory(
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    hidden: int,
    seq: int,
    elem_bytes: int,
    batch: int = 1,
    checkpointing: bool = False,
) -> dict[str, int]:
    """Attention memory of a whole model's training step at one sequence length (bytes; see README).

    standard_*: the N x N attention matrix kept for the backward, one per head and layer (what the source
        documents count: 34.36 GB per head per layer at 128K in fp16).
    eager_*: what PyTorch's eager path actually keeps per the naive model above (fp32 P plus its downcast:
        (4 + e) bytes per element for fp16/bf16, 4 for fp32).
    flash_lse_* / flash_ml_*: FlashAttention's per-row statistics, the log-sum-exp (FA2, fp32) or m and l
        (FA1 and the documents, fp32 each: 1.05 MB per head at 128K).
    With activation checkpointing only one layer's attention state is alive at a time (the layer being
    recomputed), plus each layer's input (seq x hidden) saved at the checkpoint boundary.
    """
    e = elem_bytes
    per_head = batch * seq * seq * e
    eager_per_head = batch * seq * seq * (FP32 + e if e < FP32 else FP32)
    lse_per_head = softmax_stats_bytes(batch, 1, seq, stats=1)
    ml_per_head = softmax_stats_bytes(batch, 1, seq, stats=2)
    alive_layers = 1 if checkpointing else layers
    boundary = layers * batch * seq * hidden * e if checkpointing else 0
    return {
        "standard_per_head": per_head,
        "standard_per_layer": per_head * heads,
        "standard_per_model": per_head * heads * alive_layers + boundary,
        "eager_per_layer": eager_per_head * heads,
        "eager_per_model": eager_per_head * heads * alive_layers + boundary,
        "flash_ml_per_head": ml_per_head,
        "flash_lse_per_head": lse_per_head,
        "flash_lse_per_layer": lse_per_head * heads,
        "flash_lse_per_model": lse_per_head * heads * alive_layers + boundary,
        "flash_ml_per_model": ml_per_head * heads * alive_layers + boundary,
        "checkpoint_boundary": boundary,
        "qkvo_per_layer": batch * seq * head_dim * e * (2 * heads + 2 * kv_heads),
    }


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    head_dim: int,
    elem_bytes: int,
    lengths: list[int] | tuple[int, ...],
    page_size: int = 0,
) -> int:
    """Bytes of K and V of every layer for sequences of `lengths` tokens (module docstring): contiguous
    (page_size 0: exactly the tokens) or paged (whole pages per sequence)."""
    if page_size < 0 or min((layers, kv_heads, head_dim, elem_bytes, *lengths), default=0) < 0:
        raise ValueError("dimensions and lengths must be >= 0")
    tokens = sum(-(-n // page_size) * page_size for n in lengths) if page_size else sum(lengths)
    return 2 * layers * kv_heads * head_dim * elem_bytes * tokens


def kv_cache_expected_bytes(
    layers: int, kv_heads: int, head_dim: int, elem_bytes: int, context: int, batch: int, page_size: int = 0
) -> float:
    """kv_cache_bytes of `batch` sequences of `context` tokens each, paged with the last page of every sequence
    half empty on average: with lengths uniform modulo the page, the last page leaves (page - 1) / 2 slots unused
    on average, so (context + (page - 1) / 2) tokens per sequence when paged."""
    per_token = 2 * layers * kv_heads * head_dim * elem_bytes
    return float(per_token * batch * (context + ((page_size - 1) / 2 if page_size else 0)))

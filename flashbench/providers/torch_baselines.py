"""PyTorch baselines: eager attention, SDPA (each backend forced), compiled FlexAttention, flash-attn 2/3.

Every builder imports torch inside itself: registering these costs the parent process nothing.
Tensors are q [B, H, Nq, D], k/v [B, Hkv, Nk, D]; causal masks are bottom-right aligned (Case docstring).
Sliding windows (spec/window.py) are taken by naive and sdpa-math (an explicit bool mask), flex (a block mask)
and flash-attn (window_size); the others' windowed cases are `unsupported` rows.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from flashbench.providers import packed, serving
from flashbench.providers.registry import Unsupported, register
from flashbench.spec.cases import Case
from flashbench.spec.window import masked, visible

_FLASH_HEAD_DIMS = tuple(range(8, 257, 8))  # flash-attn 2/3: multiples of 8 up to 256


def _scale(case: Case) -> float:
    return case.head_dim**-0.5


# --- naive: materializes S and P ----------------------------------------------------------------------


@register(
    "naive",
    dtypes=("fp16", "bf16", "fp32"),
    gqa=True,
    devices=("cuda", "cpu"),
    memory_family="naive",
    window=True,
    packed=True,  # a dense masked matrix at small sizes (providers/packed.py)
    baseline=0,  # the paper's "standard attention": the first default speedup reference
    colour="#7f7f7f",
    builder=True,
    source="builtin",
    description="PyTorch eager: S = QK^T and P = softmax(S) (fp32) materialized; autograd backward",
)
def _build_naive(case: Case, device: str, stack: Any) -> Any:
    import torch

    b, h, hkv, nq, nk = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k
    group = h // hkv
    scale = _scale(case)
    causal, window, documents = case.causal, case.window_size, None
    if case.packed:  # the packed tokens as one sequence under the document mask (built once, untimed)
        b, nq, nk, documents = 1, b * nq, b * nk, packed.document_mask(case, device)

    def naive(q: Any, k: Any, v: Any) -> Any:
        # GQA without copying K/V: query heads h*g..h*g+g-1 share kv head h, so fold them into rows.
        qg = q.reshape(b, hkv, group * nq, -1)  # [B, Hkv, g*Nq, D]
        s = torch.matmul(qg, k.transpose(-2, -1)).view(b, h, nq, nk) * scale  # S: [B, H, Nq, Nk]
        if documents is not None:
            s = s.masked_fill(~documents, float("-inf"))
        elif masked(causal, window):  # one bool [Nq, Nk] mask (causal, a window: spec/window.py)
            s = s.masked_fill(~_mask(case, q.device), float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)  # P: softmax in fp32, stored in the input dtype
        out = torch.matmul(p.view(b, hkv, group * nq, nk), v)  # [B, Hkv, g*Nq, D]
        return out.view(b, h, nq, -1)

    return packed.dense(case, "naive", naive) if case.packed else naive


def _mask(case: Case, device: Any) -> Any:
    """The case's mask as a bool [Nq, Nk] tensor, True = attend (spec/window.py's rule)."""
    import torch

    rows = torch.arange(case.seq_q, device=device)[:, None]
    cols = torch.arange(case.seq_k, device=device)[None, :]
    return visible(rows, cols, case.seq_q, case.seq_k, case.causal, case.window_size)


# --- scaled_dot_product_attention ---------------------------------------------------------------------


def _sdpa_builder(backend_name: str | None) -> Any:
    def build(case: Case, device: str, stack: Any) -> Any:
        import torch.nn.functional as F

        kwargs: dict[str, Any] = {"scale": _scale(case)}
        if case.kv_heads != case.heads:
            kwargs["enable_gqa"] = True
        if case.packed and backend_name == "MATH":  # an explicit document mask (providers/packed.py)
            kwargs["attn_mask"] = packed.document_mask(case, device)
        elif case.packed:
            pass  # nested jagged tensors: the documents are the batch
        elif case.window:  # an explicit bool mask (built once, untimed): only the math backend takes it here
            kwargs["attn_mask"] = _mask(case, device)
        elif case.causal and case.seq_q == 1:
            pass  # one query, the last token: bottom-right causal sees every key, so no mask at all
        elif case.causal and case.seq_q != case.seq_k:
            # is_causal=True is top-left aligned for Nq != Nk; the bias object gives bottom-right.
            from torch.nn.attention.bias import causal_lower_right

            kwargs["attn_mask"] = causal_lower_right(case.seq_q, case.seq_k)
        elif case.causal:
            kwargs["is_causal"] = True
        if backend_name is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = getattr(SDPBackend, backend_name, None)
            if backend is None:
                raise Unsupported(f"this torch has no SDPBackend.{backend_name}")
            # Entered once per case (not per call): the context sets global flags, ~us per entry.
            stack.enter_context(sdpa_kernel(backend))
        sdpa = F.scaled_dot_product_attention
        if case.latent:  # MLA: MQA over the latent dims (math and efficient take a V of its own head dim)
            return serving.sdpa_latent(case, sdpa, kwargs["scale"], device)
        if case.packed and backend_name == "MATH":
            return packed.dense(case, "sdpa-math", lambda q, k, v: sdpa(q, k, v, **kwargs))
        if case.packed:
            return packed.nested_sdpa(case, kwargs)
        return lambda q, k, v: sdpa(q, k, v, **kwargs)

    return build


# `workspace` is the backward's workspace in q-sized buffers of the input dtype (models/memory.py), measured in
# bf16 on an H200 with torch 2.11: peak above the inputs minus O, dQ, dK, dV. The default dispatch measured like
# cuDNN there (it picks cuDNN for these shapes); on other GPUs it may differ. `baseline`: the rank among the
# default speedup references, after naive: PyTorch's own backends, math first.
# Windows: only the math backend, through an explicit mask; the fused backends' windowed cases are unsupported
# rows (with a dense mask they would run a different kernel, or none). MLA cases (a V head dim of its own): math
# and efficient; flash and cuDNN take one head dim for q, k and v in the torch this was written against.
for _name, _backend, _family, _devices, _workspace, _baseline, _colour in (
    ("sdpa", None, "flash", ("cuda", "cpu"), 2.0, 2, "#bcbd22"),
    ("sdpa-math", "MATH", "sdpa-math", ("cuda", "cpu"), 0.0, 1, "#8c564b"),
    ("sdpa-efficient", "EFFICIENT_ATTENTION", "flash", ("cuda",), 3.0, 4, "#e377c2"),
    ("sdpa-flash", "FLASH_ATTENTION", "flash", ("cuda", "cpu"), 4.0, 3, "#d62728"),
    ("sdpa-cudnn", "CUDNN_ATTENTION", "flash", ("cuda",), 2.0, 6, "#2ca02c"),
):
    register(
        _name,
        gqa=True,
        devices=_devices,
        memory_family=_family,
        bwd_workspace_q=_workspace,
        window=_backend == "MATH",
        packed=True,  # math: a dense document mask; the others: nested jagged tensors (providers/packed.py)
        latent="also" if _backend in ("MATH", "EFFICIENT_ATTENTION") else "no",
        baseline=_baseline,
        colour=_colour,
        builder=True,
        source="builtin",
        description="torch scaled_dot_product_attention, "
        + (f"forced {_backend} backend" if _backend else "default dispatch"),
    )(_sdpa_builder(_backend))


# --- FlexAttention, compiled ----------------------------------------------------------------------------


def _flex_requires() -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as exc:
        return f"this torch has no FlexAttention ({exc})"
    return None


def _dynamo_graph_count() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


@register(
    "flex",
    gqa=True,
    devices=("cuda",),
    memory_family="flash",
    kv_layouts=("contiguous", "paged"),
    ragged=True,
    window=True,
    packed=True,
    latent="also",  # MQA over the latent: enable_gqa, v's own head dim
    baseline=5,
    colour="#9467bd",
    builder=True,
    requires=_flex_requires,
    source="builtin",
    description="torch.compile'd FlexAttention (causal via a block mask; KV caches: providers/serving.py); "
    "fails rather than falls back",
)
def _build_flex(case: Case, device: str, stack: Any) -> Any:
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # Seen on the H100: one process compiling many shapes hits the recompile limit and silently runs an
    # uncompiled path ~50x slower. So: a clean dynamo state per case, a generous limit, and a hard error
    # (never a fallback) if the limit is reached anyway; graph breaks are errors too (fullgraph).
    torch._dynamo.reset()
    cfg = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, limit):
            setattr(cfg, limit, max(int(getattr(cfg, limit)), 64))
    for flag in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, flag):
            setattr(cfg, flag, True)
    compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    block_mask = None
    gqa = case.kv_heads != case.heads
    scale = _scale(case)
    graphs_before = _dynamo_graph_count()
    if case.packed:  # one [1, H, T, D] batch under a document block mask (providers/packed.py)
        flex_packed = packed.flex_documents(case, device, compiled, gqa, scale)
        flex_packed.check_compiled = _compile_check(graphs_before)  # type: ignore[attr-defined]
        return flex_packed
    if case.serving:  # per-sequence lengths and pages: the block mask is made from the inputs (untimed)
        if case.window:
            raise Unsupported("flex: a sliding window over a paged or ragged KV cache is not built here")
        return serving.flex_kv_cache(case, device, compiled, gqa, scale, _compile_check(graphs_before))
    nq, nk, causal, window = case.seq_q, case.seq_k, case.causal, case.window_size
    if masked(causal, window):  # a block mask (spec/window.py's rule): blocks no query sees are skipped

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return visible(q_idx, kv_idx, nq, nk, causal, window)

        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=nq, KV_LEN=nk, device=device)

    def flex(q: Any, k: Any, v: Any) -> Any:
        return compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)

    flex.check_compiled = _compile_check(graphs_before)  # type: ignore[attr-defined]
    return flex


def _compile_check(graphs_before: int | None) -> Any:
    """The worker's check after the first call and after timing: no graph compiled, or a recompile during the
    samples, means the numbers are not those of one compiled kernel."""
    first_call_graphs: list[int] = []

    def check_compiled() -> str | None:
        graphs = _dynamo_graph_count()
        if graphs_before is None or graphs is None:
            return None
        if graphs == graphs_before:
            return "torch.compile produced no graph (FlexAttention ran uncompiled)"
        if not first_call_graphs:
            first_call_graphs.append(graphs)
        elif graphs != first_call_graphs[0]:
            return f"torch.compile recompiled during the samples ({graphs - first_call_graphs[0]} new graphs)"
        return None

    return check_compiled


# --- flash-attn 2 and 3 ([B, N, H, D] layout) -------------------------------------------------------------


def _module_requires(module: str, package: str) -> Any:
    def requires() -> str | None:
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (import {module} failed)"
        try:
            importlib.import_module(module)
        except Exception as exc:  # ABI mismatch with this torch, missing CUDA libs...
            return f"import {module} failed: {type(exc).__name__}: {exc}"
        return None

    return requires


def _to_bnhd(x: Any) -> Any:
    return x.transpose(1, 2)  # the worker allocated it [B, N, H, D]-contiguous: this is a free view


@register(
    "flash-attn",
    dtypes=("fp16", "bf16"),
    head_dims=_FLASH_HEAD_DIMS,
    gqa=True,
    devices=("cuda",),
    memory_family="flash",
    bwd_workspace_q=2.0,  # its fp32 dQ accumulator (from flash-attn's source; not measured: not installed)
    layout="bnhd",
    window=True,
    packed=True,  # flash_attn_varlen_func
    colour="#ff7f0e",
    package="flash-attn",
    builder=True,
    requires=_module_requires("flash_attn", "flash-attn"),
    source="builtin",
    description="flash-attn 2 flash_attn_func (Dao-AILab), [B, N, H, D] layout",
)
def _build_flash_attn(case: Case, device: str, stack: Any) -> Any:
    from flash_attn import flash_attn_func

    if case.packed:
        return packed.flash_attn_varlen(case)
    causal, scale = case.causal, _scale(case)
    masks = {"window_size": case.window_size} if case.window else {}  # the same convention, bottom-right
    return lambda q, k, v: _to_bnhd(
        flash_attn_func(_to_bnhd(q), _to_bnhd(k), _to_bnhd(v), softmax_scale=scale, causal=causal, **masks)
    )


@register(
    "flash-attn-3",
    dtypes=("fp16", "bf16", "fp8"),
    head_dims=_FLASH_HEAD_DIMS,
    gqa=True,
    devices=("cuda",),
    memory_family="flash",
    bwd_workspace_q=2.0,  # its fp32 dQ accumulator (from flash-attn's source; not measured: not installed)
    layout="bnhd",
    colour="#f2b701",
    package="flash_attn_3",
    builder=True,
    requires=_module_requires("flash_attn_interface", "flash-attn 3 (hopper/)"),
    source="builtin",
    description="flash-attn 3 (Hopper) flash_attn_interface.flash_attn_func, [B, N, H, D] layout; fp8: its "
    "e4m3 forward with q/k/v_descale",
)
def _build_flash_attn_3(case: Case, device: str, stack: Any) -> Any:
    import torch
    from flash_attn_interface import flash_attn_func

    major, _ = torch.cuda.get_device_capability()
    if major != 9:
        raise Unsupported(f"flash-attn 3 needs a Hopper GPU (sm90); this is sm{major}x")
    causal, scale = case.causal, _scale(case)

    def fa3(q: Any, k: Any, v: Any, **descales: Any) -> Any:  # descales: an fp8 case's, [B, Hkv] as FA3 takes
        out = flash_attn_func(
            _to_bnhd(q), _to_bnhd(k), _to_bnhd(v), softmax_scale=scale, causal=causal, **descales
        )
        out = out[0] if isinstance(out, tuple) else out  # older releases return (out, lse)
        return _to_bnhd(out)

    return fa3


@register(
    "flash-attn-kvcache",
    dtypes=("fp16", "bf16"),
    head_dims=_FLASH_HEAD_DIMS,
    backward=False,
    gqa=True,
    devices=("cuda",),
    memory_family="flash",
    layout="bnhd",
    kv_layouts=("contiguous", "paged"),
    ragged=True,
    package="flash-attn",
    builder=True,
    requires=_module_requires("flash_attn", "flash-attn"),
    source="builtin",
    description="flash-attn 2 flash_attn_with_kvcache: decode over a contiguous or paged KV cache",
)
def _build_flash_attn_kvcache(case: Case, device: str, stack: Any) -> Any:
    return serving.flash_attn_kv_cache(case, _to_bnhd)


@register(
    "flash-mla",
    dtypes=("fp16", "bf16"),
    backward=False,
    gqa=True,
    devices=("cuda",),
    memory_family="decode",
    kv_layouts=("contiguous", "paged"),
    ragged=True,
    latent="only",
    colour="#a05195",
    package="flash_mla",
    builder=True,
    requires=_module_requires("flash_mla", "FlashMLA (deepseek-ai/FlashMLA)"),
    source="builtin",
    description="FlashMLA flash_mla_with_kvcache (DeepSeek, Hopper): MLA decode over a paged latent cache",
)
def _build_flash_mla(case: Case, device: str, stack: Any) -> Any:
    return serving.flash_mla_kv_cache(case)

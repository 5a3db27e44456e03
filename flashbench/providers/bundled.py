"""The bundled Triton kernels (kernels/, imported as flashbench.kernels) as providers.

They register through the same decorator a user's --kernel file uses. The kernels module is imported only
inside the builders (in the worker), so the parent process never imports torch or triton.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from flashbench.errors import FlashbenchError
from flashbench.providers.registry import register
from flashbench.spec.cases import Case

# Force the bundled kernels' config for a whole sweep (block-size studies, the gate's injected slowdown):
# FLASHBENCH_TRITON_CONFIG='{"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}' (the decode
# kernels: BLOCK_N, num_warps, num_stages, and num_splits for their split count).
# The config used is recorded in every row's kernel_config either way.
CONFIG_ENV = "FLASHBENCH_TRITON_CONFIG"


def forced_config() -> dict[str, Any] | None:
    text = os.environ.get(CONFIG_ENV, "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlashbenchError(f"{CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise FlashbenchError(f'{CONFIG_ENV} must be a JSON object like {{"BLOCK_M": 64, ...}}')
    return config


def _forced_decode_config() -> tuple[dict[str, Any] | None, int | None]:
    """FLASHBENCH_TRITON_CONFIG for the decode kernels: the tile keys, and a "num_splits" key as their split count."""
    config = forced_config()
    if config is None or "num_splits" not in config:
        return config, None
    tile = {key: value for key, value in config.items() if key != "num_splits"}
    return tile or None, config["num_splits"]


def _kernels_requires() -> str | None:
    if importlib.util.find_spec("flashbench.kernels") is None:
        return "flashbench.kernels is not installed"
    try:
        import flashbench.kernels  # noqa: F401
    except Exception as exc:
        return f"import flashbench.kernels failed: {type(exc).__name__}: {exc}"
    return None


# flashbench.kernels imports torch and triton: the parent process reads this registry without either, so every
# import of the kernels below is deferred to the worker that runs them.
def _head_dims() -> Any:
    from flashbench.kernels import SUPPORTED_HEAD_DIMS

    return SUPPORTED_HEAD_DIMS


def _last_config() -> dict[str, Any] | None:
    """The forward's config, and under "bwd" the backward's ({"dkdv": ..., "dq": ...}) when one followed it."""
    from flashbench.kernels import last_config
    from flashbench.kernels.common import last_bwd_config

    config = last_config()
    if not config:
        return None
    bwd = last_bwd_config()
    return {**config, "bwd": bwd} if bwd else dict(config)


def _bundled(attr: str) -> Any:
    def build(case: Case, device: str, stack: Any) -> Any:
        import flashbench.kernels as kernels

        fn = getattr(kernels, attr)
        causal, scale, config = case.causal, case.head_dim**-0.5, forced_config()
        masks = {"window": case.window_size} if case.window else {}
        if case.packed:
            return _varlen(kernels.flash_attn_varlen, causal, scale, config, masks)

        def call(q: Any, k: Any, v: Any, **descales: Any) -> Any:  # descales: an fp8 case's (registry.py)
            return fn(q, k, v, causal=causal, sm_scale=scale, config=config, **masks, **descales)

        if case.dtype == "fp8":
            # The FP8 kernel reads V with the sequence axis contiguous: laid out once here, untimed (flash_fp8.py;
            # an ordinary V would be transposed inside every timed call).
            call.prepare = lambda q, k, v, **kw: (q, k, kernels.value_layout(v), kw)  # type: ignore[attr-defined]
        return call

    return build


def _varlen(fn: Any, causal: bool, scale: float, config: Any, masks: dict[str, Any]) -> Any:
    """flash_attn_varlen (kernels/varlen.py) on a packed case: the documents' cu_seqlens for queries and keys.
    The first call checks them on the host (one sync); the timed calls skip it, as a training loop would."""
    validate = [True]

    def call(q: Any, k: Any, v: Any, cu_seqlens: Any, max_seqlen: int) -> Any:
        out = fn(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            causal=causal,
            sm_scale=scale,
            config=config,
            validate=validate[0],
            **masks,
        )
        validate[0] = False
        return out

    return call


# Only flash_attn takes a sliding window (window=(left, right)); the variants' windowed cases are unsupported rows.
# The gate holds triton's time over sdpa-flash's, per shape, against the baseline run's (a slower machine slows
# both and leaves the ratio alone: docs/gate.md).
for _name, _attr, _family, _window, _what, _dtypes, _ratio_vs, _colour in (
    (
        "triton",
        "flash_attn",
        "flash",
        True,
        "FlashAttention-2 style: fwd + recompute bwd; fp8: FA3-style e4m3 forward",
        ("fp16", "bf16", "fp32", "fp8"),
        "sdpa-flash",
        "#1f77b4",  # blue: the bundled kernel
    ),
    (
        "triton-stored-p",
        "flash_attn_stored_p",
        "stored-p",
        False,
        "tiled fwd that stores P; bwd reads P (no recompute)",
        ("fp16", "bf16", "fp32"),
        None,
        "#6baed6",
    ),
    (
        "triton-v1",
        "flash_attn_v1",
        "flash-v1",
        False,
        "FlashAttention-1 loop order (outer loop over K/V blocks)",
        ("fp16", "bf16", "fp32"),
        None,
        "#08519c",
    ),
):
    register(
        _name,
        dtypes=_dtypes,
        gqa=True,
        devices=("cuda", "cpu"),
        memory_family=_family,
        window=_window,
        packed=_attr == "flash_attn",  # packed documents: flash_attn_varlen
        ratio_vs=_ratio_vs,
        colour=_colour,
        builder=True,
        requires=_kernels_requires,
        kernel_config=_last_config,
        head_dims_from=_head_dims,
        source="bundled",
        description=f"bundled Triton kernel, {_what}",
    )(_bundled(_attr))


# --- flash_decode (kernels/decode.py): the serving shape --------------------------------------------------
# At most DECODE_MAX_SEQ_Q query tokens per sequence: past one tile of 64 query rows (kernels/decode.py MAX_ROWS)
# every further row block reads the K/V again, and a training-shaped forward (`triton`) is the kernel to time.
DECODE_MAX_SEQ_Q = 64


def _decode_head_dims() -> Any:
    from flashbench.kernels.decode import DECODE_HEAD_DIMS

    return DECODE_HEAD_DIMS


def _last_decode_config() -> dict[str, Any] | None:
    from flashbench.kernels.decode import last_decode_config

    return last_decode_config()


@register(
    "triton-decode",
    dtypes=("fp16", "bf16", "fp32"),
    backward=False,
    gqa=True,
    devices=("cuda", "cpu"),
    memory_family="decode",
    kv_layouts=("contiguous", "paged"),
    ragged=True,
    kv_dtypes=("fp8",),
    max_seq_q=DECODE_MAX_SEQ_Q,
    colour="#3e6fd8",
    builder=True,
    requires=_kernels_requires,
    kernel_config=_last_decode_config,
    head_dims_from=_decode_head_dims,
    source="bundled",
    description="bundled Triton split-KV decode (Flash-Decoding) over a contiguous or paged KV cache, "
    "bf16/fp16 or e4m3 with scales",
)
def _build_decode(case: Case, device: str, stack: Any) -> Any:
    from flashbench.kernels import flash_decode

    causal, scale, (config, splits) = case.causal, case.head_dim**-0.5, _forced_decode_config()
    validate = [True]

    def decode(
        q: Any, k: Any, v: Any, cache_seqlens: Any = None, block_table: Any = None, **scales: Any
    ) -> Any:
        # The first call checks the lengths, the page table and an FP8 cache's k_scale, v_scale against the cache
        # (one device sync); the timed calls after it skip that check (validate=False), as a serving loop would.
        out = flash_decode(
            q, k, v, cache_seqlens, block_table, causal=causal, sm_scale=scale, num_splits=splits,
            validate=validate[0], config=config, **scales,
        )  # fmt: skip
        validate[0] = False
        return out

    return decode


# --- flash_mla_decode (kernels/mla.py): MLA decode in the absorbed form -----------------------------------------


def _last_mla_config() -> dict[str, Any] | None:
    from flashbench.kernels.mla import last_mla_config

    return last_mla_config()


@register(
    "triton-mla",
    dtypes=("fp16", "bf16", "fp32"),
    backward=False,
    gqa=True,
    devices=("cuda", "cpu"),
    memory_family="decode",
    kv_layouts=("contiguous", "paged"),
    ragged=True,
    max_seq_q=4,  # kernels/mla.py MAX_QUERIES
    latent="only",
    colour="#0b3d91",
    builder=True,
    requires=_kernels_requires,
    kernel_config=_last_mla_config,
    source="bundled",
    description="bundled Triton MLA decode (absorbed form, one latent cache, split-KV), contiguous or paged",
)
def _build_mla(case: Case, device: str, stack: Any) -> Any:
    from flashbench.kernels import flash_mla_decode

    causal, scale, dv = case.causal, case.head_dim**-0.5, case.head_dim_v
    config, splits = _forced_decode_config()
    validate = [True]

    def mla(q: Any, k: Any, v: Any, cache_seqlens: Any = None, block_table: Any = None) -> Any:
        # k is the latent cache (v, a view of it, is not read); validated on the first call only, as decode's.
        out = flash_mla_decode(
            q, k, cache_seqlens, block_table, causal=causal, sm_scale=scale, num_splits=splits, head_dim_v=dv,
            validate=validate[0], config=config,
        )  # fmt: skip
        validate[0] = False
        return out

    return mla

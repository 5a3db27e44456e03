"""Launching the bundled Triton kernels with a config, and the autograd glue shared by their entry points.

Config selection, decided at call time (never at import):
  - `config=` given      -> that forward config, validated, no autotuning;
  - TRITON_INTERPRET=1   -> one fixed config (timing the interpreter would pick nothing useful);
  - FLASHBENCH_AUTOTUNE=0 -> the first config of the space that fits (`default_config`), no autotuning;
  - otherwise (CUDA)     -> autotune.tune over a small space, keyed on the sequence-length bucket, the
                            compile-time arguments (head dim, causal, TMA, ...), Q's dtype and the
                            GPU, with configs pruned when their shared-memory or register estimate cannot fit;
                            candidates timed as sweep cases in rotation, the pick cached on disk
                            (kernels/autotune.py).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
from triton.runtime import errors as triton_errors
from triton.runtime.errors import OutOfResources

from . import autotune
from .common import KernelUnsupported, interpreting
from .configs import INTERPRET_FWD, LAUNCH_OPTIONS, candidates, config_dict, default_config, estimate
from .descriptors import size_descriptors

# A config that does not fit the GPU fails to compile with one of these.
_UNFIT: tuple[type[BaseException], ...] = tuple(
    e for e in (OutOfResources, getattr(triton_errors, "PTXASError", None)) if isinstance(e, type)
)


def autotune_enabled() -> bool:
    """False when FLASHBENCH_AUTOTUNE=0: CUDA launches then use `default_config` (no autotuning, one compile
    per shape class; the GPU test suite uses this to keep its compile time down)."""
    return os.environ.get("FLASHBENCH_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def launch(
    *,
    name: str,
    kind: str,
    kernel: Any,
    grid: Callable[[dict[str, Any]], tuple[int, ...]],
    args: Sequence[Any],
    constexprs: dict[str, Any],
    space: Sequence[tuple[int, ...]],
    forced: dict[str, Any] | None = None,
    interpret_config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Launch `kernel` (a @triton.jit function) and return the config it ran with.

    `args` are positional (the autotune key `N_BUCKET` and the `Q` tensor must be among the kernel's
    positional parameters); `constexprs` are the non-tuned compile-time arguments; `extra` are tuned-space
    constants that are not block sizes (e.g. Q_SPLIT). `name` keys the autotune cache (one per kernel);
    `kind` selects the prune estimate ("fwd", "dkdv", "dq"). Before every launch, host tensor descriptors among
    `args` take the block shape of the config about to run (`size_descriptors`).
    Autotuning: kernels/autotune.py (candidates timed as sweep cases in rotation, the pick cached on disk).
    """
    extra = dict(extra or {})
    tries: list[dict[str, Any]] = []  # configs to try in order; the first that compiles runs
    user_forced = forced is not None
    if forced is not None:
        if not interpreting():
            # Refuse a config far past the shared-memory limit before compiling it: ptxas can take minutes
            # on such a config (seen on an H200 with 256x256 fp32 tiles) only to report out-of-resources.
            d, elem, limit = constexprs["HEAD_DIM"], args[0].element_size(), _max_shared_mem()
            smem, _ = estimate(kind, forced, d, elem)
            if smem > 2 * limit:
                raise KernelUnsupported(
                    f"config {forced} does not fit this GPU: needs about {smem // 1024} KB of shared memory "
                    f"(estimate), the limit is {limit // 1024} KB"
                )
        tries = [forced]
    elif interpreting():
        tries = [{**(interpret_config or INTERPRET_FWD), **extra}]
    elif not autotune_enabled():
        # The preferred config first, then the rest of the space: the shared-memory estimate is rough
        # (seen on an H200: FA1-order at D = 256 needed 295 KB where the estimate allowed 227 KB).
        first = default_config(kind, space, constexprs["HEAD_DIM"], args[0].element_size(), _max_shared_mem())
        rest = [config_dict(c) for c in sorted(space, key=lambda c: -c[0] * c[1] * c[3])]
        tries = [{**c, **extra} for c in [first, *[c for c in rest if c != first]]]
    config: (
        dict[str, Any] | None
    )  # each of `tries` in turn, else the autotuner's pick (None until it has one)
    for config in tries:
        try:
            _run_config(kernel, grid, args, constexprs, config)
        except _UNFIT as exc:
            if user_forced or config is tries[-1]:
                raise KernelUnsupported(f"config {config} does not fit this GPU: {exc}") from None
            continue
        return dict(config)
    # The key: what selects a compiled kernel and its best tile (Q's dtype fixes the other tensors' dtypes).
    first = args[0]
    key = (
        name,
        args[_arg_index(kernel, "N_BUCKET")],
        tuple(constexprs.items()),
        first.dtype,
        first.device.index,
    )
    config = autotune.lookup(key)
    if config is None:  # first call of this key in this process: the disk cache, else tune (not per call)
        d, elem = constexprs["HEAD_DIM"], first.element_size()
        pool = [{**c, **extra} for c in candidates(kind, space, d, elem, _max_shared_mem())]
        device = _device_name(first.device.index or 0)
        identity = (
            name,
            kind,
            _source_key(kernel),
            triton.__version__,
            device,
            json.dumps(pool, sort_keys=True),
        )
        try:
            config = autotune.tune(
                key,
                pool,
                lambda c: _run_config(kernel, grid, args, constexprs, c),
                unfit=_UNFIT,
                path=autotune.cache_file(name, identity),
            )
        except _UNFIT as exc:  # every candidate failed to compile on this GPU
            raise KernelUnsupported(f"no config of {name} fits this GPU for head_dim {d}: {exc}") from None
    _run_config(kernel, grid, args, constexprs, config)
    return config


@functools.cache
def _arg_index(kernel: Any, arg: str) -> int:
    return list(kernel.arg_names).index(arg)


def _run_config(
    kernel: Any,
    grid: Callable[[dict[str, Any]], tuple[int, ...]],
    args: Sequence[Any],
    constexprs: dict[str, Any],
    config: dict[str, Any],
) -> None:
    """Launch `kernel` once with `config` (block sizes and flags as kernel arguments, the rest as options)."""
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    size_descriptors(kernel, args, constexprs, meta)
    kernel[grid(meta)](*args, **constexprs, **meta, **options)


def _max_shared_mem() -> int:
    """The current GPU's opt-in shared memory per block, in bytes (called only on the CUDA path)."""
    return _shared_mem_of(torch.cuda.current_device())


@functools.cache
def _shared_mem_of(device: int) -> int:
    return int(triton.runtime.driver.active.utils.get_device_properties(device)["max_shared_mem"])


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _source_key(kernel: Any) -> str:
    """Triton's hash of a @triton.jit function's source and the jit functions it calls (under the interpreter,
    a hash of the function's own source)."""
    key = getattr(kernel, "cache_key", None)
    if key is None:
        key = hashlib.sha256(inspect.getsource(getattr(kernel, "fn", kernel)).encode()).hexdigest()
    return str(key)


def attend(
    function: type[torch.autograd.Function],
    forward: Callable[..., tuple[Any, ...]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: dict[str, Any] | None,
    *extra: Any,
) -> torch.Tensor:
    """The attention output of checked inputs: through the autograd Function `function` (`function.apply(q, k, v,
    causal, sm_scale, config, *extra)`) when a gradient may be asked for, else the forward launcher alone
    (`forward(q, k, v, causal, sm_scale, config)[0]`): with nothing to differentiate the autograd node is only
    host time, on every eager call (benchmarks/host_path.py)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return function.apply(q, k, v, causal, sm_scale, config, *extra)
    return forward(q, k, v, causal, sm_scale, config)[0]

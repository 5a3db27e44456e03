"""Tensor descriptors (TMA on Hopper and newer) of the bundled Triton kernels, built on the host.

The FA2 forward moves Q, K, V and O, the backward's dK/dV pass Q and dO, its dQ pass K and V through 4-D
[B, H, N, D] descriptors made here, one per tensor and call; `size_descriptors` gives each the tile of the
config a launch runs with. Where `use_tma` says no, the kernels take the pointer path.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .common import interpreting


def use_tma(*tensors: torch.Tensor) -> bool:
    """Whether the kernels may stream these tensors through tensor descriptors (TMA on sm90+).

    Yes when FLASHBENCH_TMA is not 0, the GPU is Hopper or newer (or Triton's interpreter runs, which
    emulates descriptors, so the CPU tests cover this path), every sequence length is at least 16, and every
    base address and every stride but the last is a multiple of 16 bytes (TMA's alignment rule; a view sliced
    at an odd offset takes the pointer path).
    """
    if os.environ.get("FLASHBENCH_TMA", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    first = tensors[0]
    for t in tensors:
        if t.shape[-2] < 16:
            # Triton turns an int argument equal to 1 into a constant; a descriptor over a length-1 sequence made
            # ptxas crash (SIGSEGV, triton 3.6, H200). Short sequences gain nothing from TMA: pointer path.
            return False
    interpret = interpreting()
    if not interpret and (first.device.type != "cuda" or capability_major(first.device.index) < 9):
        return False
    for t in tensors:
        if t.data_ptr() % 16:
            return False
        elem = t.element_size()
        for s in t.stride()[:-1]:
            if s * elem % 16:
                return False
    return True


# Host descriptor argument names -> (the block dimension that sizes their tiles' rows, its divisor): KD2 / VD2
# are the FA2 forward's half-width diagonal blocks.
_DESCRIPTOR_ROWS = {
    "QD": ("BLOCK_M", 1),
    "OD": ("BLOCK_M", 1),
    "DOD": ("BLOCK_M", 1),
    "KD": ("BLOCK_N", 1),
    "VD": ("BLOCK_N", 1),
    "KD2": ("BLOCK_N", 2),
    "VD2": ("BLOCK_N", 2),
    "VTD": (
        "BLOCK_N",
        1,
    ),  # the FP8 forward's V^T ([B, H, D, N]): its tiles are [D, BLOCK_N], see _TRANSPOSED
}
# Descriptors over a transposed tensor ([B, H, D, N]): the tile's rows are D, its columns the sized dimension.
_TRANSPOSED = frozenset({"VTD"})


# (shape, strides, dtype) -> the attributes of a descriptor of that layout, made and validated once; its base is
# replaced per call (host_descriptor).
_DESCRIPTOR_LAYOUTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def host_descriptor(t: torch.Tensor) -> TensorDescriptor:
    """A 4-D [B, H, N, D] tensor descriptor of `t` (checked by `use_tma`). Its block is [1, 1, rows, D], rows
    set per config by `size_descriptors`; loads past N are zero-filled within each head, stores are clipped.

    Per call this copies a descriptor made (and validated by Triton) once per shape, strides and dtype, with `t`
    as its base: Triton's checks hold for every tensor of that layout, or `use_tma` has made them (alignment).
    About 2 us on the CPU machine against 3-4 us for a new TensorDescriptor (timeit).
    """
    key = (tuple(t.shape), t.stride(), t.dtype)
    layout = _DESCRIPTOR_LAYOUTS.get(key)
    if layout is None:
        if len(_DESCRIPTOR_LAYOUTS) >= 256:  # a sweep has tens of layouts; a long-lived caller may have more
            _DESCRIPTOR_LAYOUTS.pop(next(iter(_DESCRIPTOR_LAYOUTS)))
        layout = dict(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, t.shape[-1]]).__dict__)
        del layout["base"]  # kept per layout, not per tensor: the cache holds no tensor alive
        _DESCRIPTOR_LAYOUTS[key] = layout
    return _descriptor_from(layout, base=t, block_shape=[1, 1, 16, t.shape[-1]])


def twin_descriptor(d: TensorDescriptor) -> TensorDescriptor:
    """A second host descriptor of d's tensor, with a block shape of its own (set by `size_descriptors`): a
    shallow copy, cheaper than `host_descriptor` again (no layout lookup)."""
    return _descriptor_from(d.__dict__)


def _descriptor_from(attrs: dict[str, Any], **changes: Any) -> TensorDescriptor:
    """A TensorDescriptor with these attributes, not validated again (its __init__ is not run)."""
    d = object.__new__(TensorDescriptor)
    d.__dict__.update(attrs, **changes)
    return d


def size_descriptors(
    kernel: Any, args: Sequence[Any], constexprs: dict[str, Any], meta: dict[str, Any]
) -> None:
    """Give a launch's host descriptors (positional arguments named in _DESCRIPTOR_ROWS) the tile of the config
    about to run; `_run_config` calls it before every launch, the autotuner's included."""
    for i, rows, div, transposed in _descriptor_args(kernel):
        if i < len(args) and isinstance(args[i], TensorDescriptor):
            tile = [meta[rows] // div, constexprs["HEAD_DIM"]]
            args[i].block_shape = [1, 1, *(tile[::-1] if transposed else tile)]


@functools.cache
def _descriptor_args(kernel: Any) -> tuple[tuple[int, str, int, bool], ...]:
    """(position, rows key, divisor, transposed) of each of `kernel`'s parameters named in _DESCRIPTOR_ROWS."""
    return tuple(
        (i, *_DESCRIPTOR_ROWS[n], n in _TRANSPOSED)
        for i, n in enumerate(kernel.arg_names)
        if n in _DESCRIPTOR_ROWS
    )


@functools.cache
def capability_major(index: int | None) -> int:
    """The compute capability's major version of CUDA device `index`, asked of the driver once per device."""
    return torch.cuda.get_device_capability(index)[0]

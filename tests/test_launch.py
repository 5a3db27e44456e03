"""launch.KernelCall's direct launches on the CPU: a stand-in for a compiled kernel and Triton 3.6's launcher (the
closure that `triton.backends.nvidia.driver.wrap_handle_tensordesc` returns, whose cells launch.RawLaunch reads),
since the interpreter compiles nothing. What a GPU checks end to end is in tests/test_compile_graph.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from flashbench.kernels import launch
from triton import knobs
from triton.tools.tensor_descriptor import TensorDescriptor

GRID = (3, 2, 1)


def _wrap(launcher: Any, tensordesc_indices: set[int], tensordesc_meta: list[Any]) -> Any:
    """Triton's wrapper of the C launcher, as launch.RawLaunch.of finds it (its free variables by name)."""

    def inner(*args: Any) -> Any:
        return launcher, tensordesc_indices, tensordesc_meta

    return inner


class _CLaunch:
    """The compiled C launcher: a callable without Python code."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


class _Launcher:
    """A compiled kernel's `run`: records what Triton's own wrapper would be given (the fallback path); its
    `launch` records what the C launcher gets (the raw path)."""

    def __init__(self, indices: set[int], metas: list[Any]) -> None:
        self.c_launch = _CLaunch()
        self.c_args = self.c_launch.calls
        self.run_args: list[tuple[Any, ...]] = []
        self.launch = _wrap(self.c_launch, indices, metas)
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid = self.launch_pdl = False

    def __call__(self, *args: Any) -> None:
        self.run_args.append(args)


class _Kernel:
    """A @triton.jit function's stand-in: `kernel[grid](*args, **constexprs)` records the call (the JIT path)."""

    def __init__(self, run: _Launcher) -> None:
        self.compiled = SimpleNamespace(packed_metadata="packed", function="fn", run=run)
        self.params = [SimpleNamespace(name=n, default=None) for n in ("QD", "X", "KD", "N", "BLOCK")]
        self.jit_args: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.jit_args.append(args)
            return self.compiled

        return call


@pytest.fixture
def stub_driver(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The active driver's stream (0) and the tensor-map encoding: each encoding recorded and returned."""
    encoded: list[tuple[Any, ...]] = []
    active = SimpleNamespace(get_current_stream=lambda device: 0, get_current_device=lambda: 0)
    monkeypatch.setattr(launch, "_driver", SimpleNamespace(active=active))

    def encode(t: torch.Tensor, desc: launch.Descriptor, meta: dict[str, Any]) -> list[Any]:
        encoded.append((t.data_ptr(), desc.shape, desc.strides))
        return [("map", t.data_ptr()), *desc.shape, *desc.strides]

    monkeypatch.setattr(launch, "_encode", encode)
    return encoded


def _call() -> tuple[launch.KernelCall, _Kernel, _Launcher]:
    """A kernel (QD, X, KD, N, BLOCK): QD a Gluon descriptor (tile metadata), KD a tl one (none), BLOCK constexpr."""
    run = _Launcher({0, 2}, [{"block_size": [16, 16]}, None])
    kernel = _Kernel(run)
    return launch.KernelCall(kernel, GRID[:2], {"BLOCK": 16}, {}), kernel, run


def _descs(q: torch.Tensor, k: torch.Tensor) -> tuple[TensorDescriptor, TensorDescriptor]:
    """q's descriptor as a Gluon kernel takes it (2-D), k's as a tl kernel does (4-D)."""
    q2 = q.view(-1, q.shape[-1])
    return (
        TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [16, 16]),
        TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, 16, 16]),
    )


def test_a_compiled_kernel_takes_the_descriptors_tensors_with_the_first_calls_geometry(stub_driver) -> None:
    """After the JIT's call (real descriptors) the plan passes the tensors; the C launcher gets each descriptor
    as Triton's wrapper expands it: the encoded map with the shape and strides (Gluon), or base, shape, strides,
    padding, shape and strides (tl); other arguments in place, the constexprs after."""
    call, kernel, run = _call()
    q, k = torch.zeros(2, 3, 32, 16), torch.zeros(2, 3, 32, 16).transpose(1, 2)
    x = torch.zeros(4)
    call((*_descs(q, k)[:1], x, _descs(q, k)[1], 7))
    assert call.direct and len(kernel.jit_args) == 1 and not run.c_args
    call((q, x, k, 7))
    assert len(kernel.jit_args) == 1  # no JIT
    (c_args,) = run.c_args
    assert c_args[:13] == (*GRID, 0, "fn", False, False, None, None, "packed", None, None, None)
    kd = (*k.shape, *k.stride(), False, *k.shape, *k.stride())
    assert c_args[13:] == (("map", q.data_ptr()), 192, 16, 16, 1, x, k, *kd, 7, 16)


def test_a_map_is_encoded_once_per_address(stub_driver) -> None:
    """Repeated launches at the same addresses encode no new tensor map; a tensor at another address does."""
    call, _, run = _call()
    q, k, x = torch.zeros(1, 2, 32, 16), torch.zeros(1, 2, 32, 16), torch.zeros(4)
    call((*_descs(q, k)[:1], x, _descs(q, k)[1], 7))
    for _ in range(3):
        call((q, x, k, 7))
    assert stub_driver == [(q.data_ptr(), (64, 16), (16, 1))]
    q2 = torch.zeros_like(q)
    call((q2, x, k, 7))
    assert stub_driver[-1][0] == q2.data_ptr() and len(stub_driver) == 2
    assert run.c_args[-1][13] == ("map", q2.data_ptr())


def test_leading_maps_are_kept_together_and_a_new_address_encodes_its_map_alone(stub_driver) -> None:
    """Where every descriptor leads and is a map (the Gluon kernels), a launch takes their maps kept together by
    their addresses: the C launcher gets what the one-by-one path gives it, repeated calls encode nothing, and a
    new address at one position encodes that position's map alone."""
    run = _Launcher({0, 1}, [{"block_size": [16, 16]}] * 2)
    kernel = _Kernel(run)
    call = launch.KernelCall(kernel, GRID[:2], {"BLOCK": 16}, {})
    q, k, x = torch.zeros(1, 2, 32, 16), torch.zeros(1, 2, 32, 16), torch.zeros(4)
    descs = [TensorDescriptor(t.view(-1, 16), [64, 16], [16, 1], [16, 16]) for t in (q, k)]
    call((*descs, x, 7))
    assert call.raw is not None and call.raw.lead == 2
    for _ in range(3):
        call((q, k, x, 7))
    expected = (("map", q.data_ptr()), 64, 16, 16, 1, ("map", k.data_ptr()), 64, 16, 16, 1, x, 7, 16)
    assert len(stub_driver) == 2 and all(c[13:] == expected for c in run.c_args)
    k2 = torch.zeros_like(k)
    call((q, k2, x, 7))
    assert [e[0] for e in stub_driver[2:]] == [k2.data_ptr()]
    together = run.c_args[-1]
    call.raw.bases = None  # the one-by-one path
    call((q, k2, x, 7))
    assert run.c_args[-1] == together and together[18] == ("map", k2.data_ptr())


def test_without_the_raw_launch_triton_gets_descriptor_stand_ins(stub_driver) -> None:
    """Where RawLaunch does not mirror the launcher, `compiled.run` gets a TmaArg per descriptor: the tensor
    with the first call's shape, strides and padding."""
    call, _, run = _call()
    q, k, x = torch.zeros(1, 2, 32, 16), torch.zeros(1, 2, 32, 16), torch.zeros(4)
    call((*_descs(q, k)[:1], x, _descs(q, k)[1], 7))
    call.raw = None
    call((q, x, k, 7))
    (args,) = run.run_args
    qd, kd = args[9], args[11]
    assert isinstance(qd, launch.TmaArg) and isinstance(kd, launch.TmaArg)
    assert (qd.base, qd.shape, qd.strides, qd.padding) == (q, (64, 16), (16, 1), "zero")
    assert (kd.base, kd.shape, kd.strides) == (k, tuple(k.shape), k.stride())
    assert args[10] is x and args[12:] == (7, 16)


def test_a_launch_hook_sends_calls_through_the_jit_with_real_descriptors(stub_driver, monkeypatch) -> None:
    """With a profiler's launch hook installed, a compiled plan's call goes through the JIT again, each tensor
    wrapped in a descriptor like the first call's (class, block shape) over that tensor."""
    call, kernel, run = _call()
    q, k, x = torch.zeros(1, 2, 32, 16), torch.zeros(1, 2, 32, 16), torch.zeros(4)
    first = _descs(q, k)
    call((first[0], x, first[1], 7))
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    q2 = torch.ones_like(q)
    call((q2, x, k, 7))
    assert not run.c_args and len(kernel.jit_args) == 2
    qd, _, kd, _ = kernel.jit_args[-1]
    assert isinstance(qd, TensorDescriptor) and isinstance(kd, TensorDescriptor)
    assert qd.base.data_ptr() == q2.data_ptr() and tuple(qd.base.shape) == (64, 16)
    assert (qd.block_shape, kd.block_shape) == (first[0].block_shape, first[1].block_shape)
    assert kd.base.data_ptr() == k.data_ptr() and tuple(kd.base.shape) == tuple(k.shape)


def test_a_plan_keeps_no_tensor_alive(stub_driver) -> None:
    """What KernelCall keeps of the first call's descriptors holds no tensor (a plan cache must not keep user
    tensors' memory)."""
    call, _, _ = _call()
    q, k, x = torch.zeros(1, 2, 32, 16), torch.zeros(1, 2, 32, 16), torch.zeros(4)
    call((*_descs(q, k)[:1], x, _descs(q, k)[1], 7))
    for desc in call.descs.values():
        assert not any(isinstance(v, torch.Tensor) for v in desc.attrs.values())

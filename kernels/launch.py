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
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
from triton import knobs as _knobs
from triton.runtime import driver as _driver
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


class TmaArg:
    """What Triton's launcher reads of a host tensor descriptor (base, shape, strides, padding), without a
    TensorDescriptor's validation: KernelCall makes one per descriptor argument where it launches through
    `compiled.run` (a launcher launch.RawLaunch does not mirror); the tile shape and layout live in the compiled
    kernel."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(
        self, base: torch.Tensor, shape: Sequence[int], strides: Sequence[int], padding: str
    ) -> None:
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding


class Descriptor:
    """A host tensor descriptor argument of a compiled kernel, as its first launch (through the JIT) had it, less
    its base: later launches of the same plan pass the tensor alone at that position (`KernelCall`), since the
    plan's key fixes the shape, strides, dtype and alignment the descriptor was validated for. Holds no tensor."""

    __slots__ = ("cls", "attrs", "shape", "strides", "padding")

    def __init__(self, desc: Any) -> None:
        self.cls = type(desc)
        self.attrs = {k: v for k, v in vars(desc).items() if k != "base"}
        self.shape, self.strides = tuple(desc.shape), tuple(desc.strides)
        self.padding = getattr(desc, "padding", "zero")

    @staticmethod
    def found(arg: Any) -> bool:
        """`arg` is a host tensor descriptor (tl's or Gluon's TensorDescriptor: a base and a block shape)."""
        return hasattr(arg, "block_shape") and isinstance(getattr(arg, "base", None), torch.Tensor)

    def over(self, t: torch.Tensor) -> Any:
        """A descriptor of this one's class and attributes over `t` (viewed in its shape), not validated again:
        what the JIT takes where a launch hook sends a call through it."""
        d = object.__new__(self.cls)
        d.__dict__.update(self.attrs, base=t.view(self.shape))
        return d


class KernelCall:
    """One kernel of a launch plan: its grid, compile-time arguments and launch options, fixed per input
    signature. The first call goes through Triton's JIT (compile or cache lookup, specialization, descriptor
    checks); later calls launch the compiled binary through its launcher, with the same compile-time arguments
    and the run-time ones in the same order, each host descriptor's tensor in place of the descriptor (its
    geometry is the first call's: `Descriptor`).

    JITFunction.run binds every argument, specializes each (alignment, ==1, %16), hashes the key and builds the
    launch metadata on every call: 30-80 us of host time per launch of the bundled kernels on an H100 host
    (cProfile, `python3 benchmarks/host_time.py --profile fwd`). The caller owns the correctness of skipping it:
    its plan key must hold everything the specialization reads (shapes and strides, dtypes, the 16-byte
    alignment of every pointer argument, the device), so that a call with the same key would specialize the
    same. A profiler's launch hook (Triton's knobs.runtime.launch_enter_hook) sends every call through the JIT.
    """

    __slots__ = (
        "kernel",
        "grid",
        "constexprs",
        "options",
        "compiled",
        "tail",
        "raw",
        "descs",
        "stream",
        "device",
    )

    def __init__(
        self, kernel: Any, grid: tuple[int, ...], constexprs: dict[str, Any], options: dict[str, Any]
    ) -> None:
        self.kernel, self.constexprs, self.options = kernel, constexprs, options
        self.grid = (*grid, 1, 1)[:3]
        self.compiled: Any = None
        self.tail: tuple[Any, ...] = ()
        self.raw: RawLaunch | None = None
        self.descs: dict[int, Descriptor] = {}  # position -> the first call's descriptor there
        self.stream: Any = None  # once compiled, the driver's current-stream and current-device getters
        self.device: Any = None

    def __call__(self, args: Sequence[Any]) -> None:
        """Launch with the run-time arguments `args` (the kernel's leading parameters, in order): real
        descriptors until the kernel is compiled (`direct`), then the descriptors' tensors."""
        compiled = self.compiled
        if compiled is not None:
            if _hooked():
                args = [self.descs[i].over(a) if i in self.descs else a for i, a in enumerate(args)]
            else:
                stream = self.stream(self.device())
                raw = self.raw
                if raw is not None:
                    raw(stream, args)
                    return
                g = self.grid
                args = [
                    TmaArg(a, d.shape, d.strides, d.padding) if (d := self.descs.get(i)) else a
                    for i, a in enumerate(args)
                ]
                compiled.run(
                    g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
                    *args, *self.tail,
                )  # fmt: skip
                return
        kernel = self.kernel
        launched = kernel[self.grid](*args, **self.constexprs, **self.options)
        if compiled is None and getattr(launched, "packed_metadata", None) is not None:  # not the interpreter
            params = kernel.params[len(args) :]
            self.tail = tuple(self.constexprs.get(p.name, p.default) for p in params)
            self.descs = {i: Descriptor(a) for i, a in enumerate(args) if Descriptor.found(a)}
            self.compiled = launched
            self.raw = RawLaunch.of(launched, self.descs, self.grid, self.tail)
            self.stream, self.device = _stream_getters()

    @property
    def direct(self) -> bool:
        """Later calls skip the JIT (a kernel was compiled for this signature): they pass each host descriptor's
        tensor, not a descriptor."""
        return self.compiled is not None


def _stream_getters() -> tuple[Callable[[int], Any], Callable[[], int]]:
    """The active driver's (current stream of a device, current device), as Triton's JIT reads them per launch:
    torch.cuda.current_device less its Python lazy-init check, done by the time a kernel has compiled (and again
    by the CUDA allocation of every plan's run before its launches: a forked child is still refused)."""
    active = _driver.active
    device = active.get_current_device
    if device is torch.cuda.current_device:
        device = getattr(torch._C, "_cuda_getDevice", device)
    return active.get_current_stream, device


class RawLaunch:
    """Triton's C launcher of one compiled kernel, called without its Python wrappers, with each tensor
    descriptor's encoded CUtensorMap kept for the next call at the same address.

    Triton 3.6's CudaLauncher turns every host descriptor into a CUtensorMap (cuTensorMapEncodeTiled) on every
    launch, in Python, and allocates no scratch for the bundled kernels. A map depends only on the base address,
    the shape and strides and the kernel's tile metadata, so the one made for a (position, address) is the one a
    later call would make (the shape and strides of a position are its KernelCall's): an eager loop whose
    allocator hands back the same blocks encodes each map once. `of` returns None where the launcher is not the
    one this mirrors (another Triton, scratch memory, fp4 descriptors); the caller then launches through
    `compiled.run`.

    Where the descriptors are the kernel's leading arguments, each a map (the Gluon kernels), the maps of all of
    them are also kept together under their addresses: one lookup where there would be one a descriptor (the
    one-pass backward's launch, 7 maps, 3.0 -> 2.05 us on the CPU machine through tools/host_path.py's stub).
    """

    __slots__ = ("launch", "grid", "after", "tail", "descs", "maps", "lead", "bases", "together")

    def __init__(
        self,
        launch: Any,
        compiled: Any,
        grid: tuple[int, ...],
        tail: tuple[Any, ...],
        descs: list[tuple[int, Descriptor, dict[str, Any] | None]],
    ) -> None:
        self.launch, self.grid, self.tail = launch, grid, tail
        run = compiled.run
        # the C launcher's arguments after the stream, fixed per compiled kernel: the function, the cooperative
        # grid and PDL flags, two null scratch buffers, the packed metadata, and the three launch hooks (none)
        self.after = (
            compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None, compiled.packed_metadata,
            None, None, None,
        )  # fmt: skip
        # per descriptor, in order of position: (position, what follows its base or map among the C launcher's
        # arguments, the tile metadata (None: a tl kernel's descriptor, decomposed by the frontend))
        self.descs = [
            (i, (*d.shape, *d.strides, d.padding == "nan", *d.shape, *d.strides) if m is None else (), d, m)
            for i, d, m in descs
        ]
        self.maps: dict[tuple[int, int], list[Any]] = {}
        # the leading descriptors' count where every descriptor leads and is a map (else 0), their tensors' getter,
        # and their maps, one after another, by the tuple of their addresses
        leading = [i for i, _, m in descs if m is not None] == list(range(len(descs)))
        self.lead = len(descs) if leading and len(descs) > 1 else 0
        self.bases = operator.itemgetter(*range(self.lead)) if self.lead else None
        self.together: dict[tuple[int, ...], list[Any]] = {}

    @staticmethod
    def of(
        compiled: Any, descs: dict[int, Descriptor], grid: tuple[int, ...], tail: tuple[Any, ...]
    ) -> RawLaunch | None:
        """The raw launch, over `grid` with the constexpr `tail`, of a compiled kernel whose `run` (a CudaLauncher)
        takes the descriptor arguments `descs`, or None where it is none such (no `run`: a driver without
        launchers, as tools/sm90_compile.py's compile-only stub)."""
        run = getattr(compiled, "run", None)
        launch = getattr(run, "launch", None)
        scratch = (getattr(run, "global_scratch_size", 1), getattr(run, "profile_scratch_size", 1))
        if launch is None or any(scratch):
            return None
        code = getattr(launch, "__code__", None)
        if code is None:  # the C launcher itself: no descriptor among the arguments
            if descs:
                return None
            return RawLaunch(launch, compiled, grid, tail, [])
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__ or ()), strict=False))
        inner, indices, meta = (
            cells.get("launcher"),
            cells.get("tensordesc_indices"),
            cells.get("tensordesc_meta"),
        )
        if inner is None or indices is None or getattr(inner, "__code__", None) is not None:
            return None
        metas = list(meta) if meta else [None] * len(indices)
        if len(metas) != len(indices) or any(m is not None and m.get("fp4_padded") for m in metas):
            return None
        if sorted(indices) != sorted(descs):  # the launcher's descriptors are not the ones the JIT was given
            return None
        order = sorted(indices)
        return RawLaunch(
            inner, compiled, grid, tail, [(i, descs[i], m) for i, m in zip(order, metas, strict=True)]
        )

    def __call__(self, stream: int, args: Sequence[Any]) -> None:
        """Launch on `stream` with the run-time arguments `args` (descriptors' tensors in their places)."""
        if not self.descs:
            self.launch(*self.grid, stream, *self.after, *args, *self.tail)
            return
        if self.bases is not None:
            key = tuple(map(_data_ptr, self.bases(args)))
            maps = self.together.get(key)
            if maps is None:
                maps = [x for i, _, desc, meta in self.descs for x in self._map(i, args[i], desc, meta)]
                if len(self.together) >= 64:
                    self.together.clear()
                self.together[key] = maps
            self.launch(*self.grid, stream, *self.after, *maps, *args[self.lead :], *self.tail)
            return
        final: list[Any] = [*self.grid, stream, *self.after]
        start = 0  # the arguments between descriptors go as they are, a slice at a time
        for i, rest, desc, meta in self.descs:
            final.extend(args[start:i])
            start = i + 1
            t = args[i]
            if (
                meta is None
            ):  # a tl kernel's descriptor: base, shape, strides, padding, shape and strides again
                final.append(t)
                final.extend(rest)
                continue
            final.extend(self._map(i, t, desc, meta))
        final.extend(args[start:])
        self.launch(*final, *self.tail)

    def _map(self, i: int, t: torch.Tensor, desc: Descriptor, meta: Any) -> list[Any]:
        """[CUtensorMap, *shape, *strides] of the descriptor `desc` at position i over `t`: the one kept for its
        address, else encoded (and kept)."""
        key = (i, t.data_ptr())
        encoded = self.maps.get(key)
        if encoded is None:
            encoded = _encode(t, desc, meta)
            if len(self.maps) >= 64:
                self.maps.clear()
            self.maps[key] = encoded
        return encoded


_data_ptr = torch.Tensor.data_ptr


def _encode(t: torch.Tensor, desc: Descriptor, meta: dict[str, Any]) -> list[Any]:
    """[CUtensorMap, *shape, *strides] of a host descriptor over `t` for a kernel's tile metadata, as Triton's
    launcher makes it (triton/backends/nvidia/driver.py, make_tensordesc_arg)."""
    from triton.backends.nvidia import driver as nvidia

    shape, strides = list(desc.shape), list(desc.strides)
    cu_map = _driver.active.utils.fill_tma_descriptor(
        t.data_ptr(),
        meta["swizzle"],
        meta["elem_size"],
        nvidia.TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
        meta["block_size"],
        shape,
        strides,
        1 if desc.padding == "nan" else 0,
    )
    return [cu_map, *shape, *strides]


class TunedCall:
    """A kernel whose config `launch` picks on the first call (forced, the interpreter's, the first that fits,
    or the autotuner's), then a KernelCall with that config: the JIT once more (it captures the compiled
    kernel), then direct launches. `launch_kw` are launch()'s keywords but `args`."""

    __slots__ = ("kw", "call", "config")

    def __init__(self, **launch_kw: Any) -> None:
        self.kw = launch_kw
        self.call: KernelCall | None = None
        self.config: dict[str, Any] = {}

    @property
    def direct(self) -> bool:
        return self.call is not None and self.call.direct

    def __call__(self, args: Sequence[Any]) -> dict[str, Any]:
        """Launch; returns the config it ran with. `args`: real descriptors until `direct`, TmaArgs after."""
        call = self.call
        if call is not None:
            if not call.direct:
                size_descriptors(self.kw["kernel"], args, call.constexprs, call.constexprs)
            call(args)
            return self.config
        kw = self.kw
        self.config = launch(args=args, **kw)
        meta = {k: v for k, v in self.config.items() if k not in LAUNCH_OPTIONS}
        options = {k: v for k, v in self.config.items() if k in LAUNCH_OPTIONS}
        self.call = KernelCall(kw["kernel"], kw["grid"](meta), {**kw["constexprs"], **meta}, options)
        return self.config


class PlanCache:
    """Launch plans by input signature (plain tuples: shapes, strides, dtypes, pointer alignment, device, flags),
    made by `make(*args)` on a miss; at most `size` kept, the oldest dropped first."""

    def __init__(self, make: Callable[..., Any], size: int = 256) -> None:
        self.make, self.size = make, size
        self.plans: dict[Any, Any] = {}

    def get(self, key: Any, *args: Any) -> Any:
        plan = self.plans.get(key)
        if plan is None:
            plan = self.make(*args)
            self.put(key, plan)
        return plan

    def put(self, key: Any, plan: Any) -> None:
        """Keep `plan` under `key`, the oldest dropped first when full."""
        if len(self.plans) >= self.size:
            self.plans.pop(next(iter(self.plans)))
        self.plans[key] = plan


def tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What a launch plan depends on of one tensor: shape, strides, dtype and whether its base is 16-byte aligned
    (Triton specializes pointers on it; TMA needs it)."""
    return t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0


def config_key(config: dict[str, Any] | None) -> Any:
    """A forced config as part of a plan key."""
    return None if config is None else tuple(sorted(config.items()))


_FLAGS = (
    "FLASHBENCH_GLUON",
    "FLASHBENCH_GLUON_BWD",
    "FLASHBENCH_TMA",
    "FLASHBENCH_AUTOTUNE",
    "TRITON_INTERPRET",
)


# os.environ's own store, keyed by encoded names: a lookup there skips os.environ.get's encoding of the name
# and of the value (about 1 us each, five per forward on the hot path); other platforms read os.environ.
_ENVIRON: dict[Any, Any] | None = getattr(os.environ, "_data", None)
_ENV_KEYS = tuple(os.environ.encodekey(name) for name in _FLAGS) if _ENVIRON is not None else _FLAGS


def env_key() -> tuple[Any, ...]:
    """The environment switches a plan's choices read (Gluon or tl, TMA, autotuning, the interpreter): read per
    call, so a plan is never reused across a change of them."""
    # map: 0.30 us a call on the CPU machine, a generator over the names 0.54
    return tuple(map((_ENVIRON if _ENVIRON is not None else os.environ).get, _ENV_KEYS))


def _hooked() -> bool:
    """A launch hook is installed (Triton 3.6 keeps an empty HookChain there; older Triton keeps None)."""
    hook = _knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


# Set by the pre-compile's recording process (flashbench/engine/compile_worker.py), where Triton's JIT records each
# launch's build instead of compiling and running it: the autotuner then records every candidate and times none.
RECORD_ONLY = False


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
        path = autotune.cache_file(name, identity)
        if RECORD_ONLY:  # the builds the tuning would compile: the cached pick's, else every candidate's
            picked = autotune.cached_pick(key, pool, path)
            for c in [picked] if picked is not None else pool:
                _run_config(kernel, grid, args, constexprs, c)
            return dict(picked or pool[0])
        try:
            config = autotune.tune(
                key,
                pool,
                lambda c: _run_config(kernel, grid, args, constexprs, c),
                unfit=_UNFIT,
                path=path,
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
    host time, on every eager call (tools/host_path.py)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return record(function, (q, k, v), causal, sm_scale, config, *extra)
    return forward(q, k, v, causal, sm_scale, config)[0]


def record(function: type[torch.autograd.Function], tensors: tuple[torch.Tensor, ...], *rest: Any) -> Any:
    """`function.apply(*tensors, *rest)` for an autograd Function whose tensor arguments are `tensors`: outside
    functorch's transforms and torch.compile, without Function.apply's Python (binding defaults for a
    setup_context these Functions do not define, and a generator over every argument that unwraps dead functorch
    wrappers, done here for the tensors alone): 2.5 of its 9 us on the CPU machine (tools/host_path.py)."""
    if _C_APPLY is None or torch.compiler.is_compiling() or _are_functorch_transforms_active():
        return function.apply(*tensors, *rest)
    return _C_APPLY.__get__(None, function)(*map(_unwrap_if_dead, tensors), *rest)


# torch's private pieces under torch.autograd.Function.apply (torch/autograd/function.py); a torch that moves them
# gets Function.apply itself, never an import error.
try:
    _C_APPLY: Any = torch._C._FunctionBase.__dict__["apply"]  # the classmethod under Function.apply
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead
    _are_functorch_transforms_active = torch._C._are_functorch_transforms_active
except (AttributeError, KeyError):  # pragma: no cover - depends on the installed torch
    _C_APPLY = None

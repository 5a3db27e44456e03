"""One case, in this process: inputs, first (compile) call, correctness, peak memory, timing, NVML.

The worker process (flashbench.engine.worker) calls measure_case() for each case it is sent; benchmarks/fidelity.py
calls prepare() and measure_case() directly to compare with triton.testing.do_bench in one process.
Everything here may import torch and touch CUDA: only ever run it in a worker (or a script), never in the
sweep's parent process.
"""

from __future__ import annotations

import contextlib
import gc
import re
import time
import traceback
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flashbench.engine import build_lock, correctness, fp8, kv_cache, packed, timing
from flashbench.gpu import nvml
from flashbench.models.flops import case_flops
from flashbench.providers import registry
from flashbench.results.rows import CRASH, OK, OOM, UNAVAILABLE, UNSUPPORTED, WRONG, Row
from flashbench.spec.cases import Case

# Errors after which the CUDA context is unusable: the worker reports the row and exits (a fresh one starts).
_FATAL = re.compile(
    r"illegal memory access|device-side assert|unspecified launch failure|misaligned address|"
    r"illegal instruction|CUDA error: an? .*(fault|exception)|cudaErrorLaunchFailure|CUBLAS_STATUS_EXECUTION_FAILED",
    re.I,
)
# torch's words when a forced SDPA backend refuses a case
_SDPA_REFUSAL = re.compile(r"No available kernel|No viable backend", re.I)


@dataclass(frozen=True)
class Options(timing.Regime):
    """How to measure (from the SweepSpec): the timing regime, plus CUDA graphs and the reference's budget."""

    cuda_graph: bool = False
    ref_flops_limit: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Options:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class Context:
    """Per-process state: device, the L2 flush buffer, the GPU's name, the NVML index, the clock sampler and
    the launch blocker (made on first use)."""

    device: str
    gpu: str = ""
    nvml_index: int = 0
    flusher: Any = None
    sampler: Any = None  # nvml.ClockSampler, or False where NVML gives no reading
    blocker: Any = None  # blocking.LaunchBlocker, or False where it cannot work (block_note says why)
    block_note: str = ""
    phase: Callable[[str], None] = lambda _phase: None
    infos: dict[str, registry.ProviderInfo] = field(default_factory=dict)

    def info(self, name: str) -> registry.ProviderInfo:
        if name not in self.infos:
            self.infos[name] = registry.get(name).resolved_info()
        return self.infos[name]


class Prepared:
    """A case made runnable: inputs, the provider's call, and the mode's timed call (+ untimed setup)."""

    def __init__(self, case: Case, layout: str, fn: Callable[..., Any], device: str) -> None:
        import torch

        self.case, self.fn, self.device = case, fn, device
        # fp8: made in bf16, then quantized per (batch, K/V head) below, outside any timing
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}.get(
            case.dtype, torch.bfloat16
        )
        grad = case.mode != "fwd"
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.shape_key.encode()))
        b, h, hkv, nq, nk, d = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim

        def make(heads: int, n: int) -> Any:
            if case.packed:  # the documents one after another: [B * N, H, D] (engine/packed.py)
                t = torch.randn(b * n, heads, d, dtype=dtype, device=device, generator=gen)
            elif layout == "bnhd":  # [B, N, H, D] storage seen as [B, H, N, D]: a leaf view, no copy
                t = torch.randn(b, n, heads, d, dtype=dtype, device=device, generator=gen).transpose(1, 2)
            else:
                t = torch.randn(b, heads, n, d, dtype=dtype, device=device, generator=gen)
            return t.requires_grad_(grad)

        self.q, k = make(h, nq), make(hkv, nk)
        v = k[..., : case.head_dim_v] if case.latent else make(hkv, nk)  # MLA: V is the latent cache's prefix
        self.do = make(h, nq).detach() if grad else None
        self.descales: dict[str, Any] = {}
        if (
            case.dtype == "fp8"
        ):  # e4m3 inputs and their descales, passed as q_descale=, k_descale=, v_descale=
            (self.q, qd), (k, kd), (v, vd) = (fp8.quantize(t, hkv) for t in (self.q, k, v))
            self.descales = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
        self.kv_scales: dict[str, Any] = {}
        if case.kv_dtype == "fp8":  # an e4m3 cache and its k_scale=, v_scale= (kv_cache.quantize)
            k, v, self.kv_scales = kv_cache.quantize(k, v)
        # The call's K/V: the contiguous cache, or its page pool, with the cache keywords of a serving case
        # (kv_cache.py); the float64 reference reads the contiguous cache (self.reference_kv).
        self.k, self.v, self.cache = kv_cache.build(case, k, v)
        self.cache.update(self.descales)
        if case.packed:
            self.cache.update(packed.keywords(case, device))
        self.cache.update(self.kv_scales)
        self.reference_kv: tuple[Any, Any] | None = (k, v)
        prepare_inputs = getattr(fn, "prepare", None)  # a provider's own cache layout, made once, untimed
        if prepare_inputs is not None:
            self.q, self.k, self.v, self.cache = prepare_inputs(self.q, self.k, self.v, **self.cache)
        self._out: Any = None

    @property
    def inputs(self) -> dict[str, Any]:
        """What the reference reads: q, the contiguous k and v, dO, and each sequence's keys (None: all)."""
        k, v = self.reference_kv or (None, None)
        lengths = self.case.kv_lengths() if self.case.ragged else None
        q = self.q
        if self.descales:  # fp8: the real values the e4m3 inputs stand for
            q, k, v = (
                fp8.dequantize(t, self.descales[f"{n}_descale"]) for n, t in (("q", q), ("k", k), ("v", v))
            )
        if self.kv_scales and k is not None:  # an FP8 cache: the real values it stands for
            k, v = (fp8.dequantize(t, self.kv_scales[f"{n}_scale"]) for n, t in (("k", k), ("v", v)))
        return {"q": q, "k": k, "v": v, "do": self.do, "seqlens_k": lengths}

    def drop_reference(self) -> None:
        """After the check: a paged case no longer keeps the contiguous cache its pool was copied from."""
        if self.case.paged:
            self.reference_kv = None

    def forward(self) -> Any:
        return self.fn(self.q, self.k, self.v, **self.cache)

    def full(self) -> dict[str, Any]:
        """The whole mode once, results kept: out (and dq, dk, dv in the backward modes)."""
        import torch

        out = self.forward()
        if self.case.mode == "fwd":
            return {"out": out}
        dq, dk, dv = torch.autograd.grad(out, (self.q, self.k, self.v), self.do)
        return {"out": out, "dq": dq, "dk": dk, "dv": dv}

    def timed(self) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
        """(call, setup): what the samples time, and what runs untimed before each sample."""
        import torch

        q, k, v, do, fn, cache = self.q, self.k, self.v, self.do, self.fn, self.cache
        if self.case.mode == "fwd":
            return (lambda: fn(q, k, v, **cache)), None
        if self.case.mode == "fwd+bwd":
            return (lambda: torch.autograd.grad(fn(q, k, v, **cache), (q, k, v), do)), None

        def setup() -> None:  # bwd: the forward runs outside the timed region, every sample
            self._out = fn(q, k, v, **cache)

        return (lambda: torch.autograd.grad(self._out, (q, k, v), do)), setup

    def looped(self) -> Callable[[], Any]:
        """What a caller's loop repeats (timing.measure_host): the timed call; in bwd mode the backward of one
        forward with its graph retained, so that the loop holds backward passes alone."""
        import torch

        call, setup = self.timed()
        if setup is None:
            return call
        q, k, v, do = self.q, self.k, self.v, self.do
        out = self.forward()
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def graphed(self) -> Callable[[], Any]:
        """The timed call captured in a CUDA graph (bwd: the backward of one forward, retained)."""
        import torch

        q, k, v, do = self.q, self.k, self.v, self.do
        if self.case.mode == "bwd":
            self._out = self.forward()
            graph = timing.capture_cuda_graph(
                lambda: torch.autograd.grad(self._out, (q, k, v), do, retain_graph=True)
            )
        else:
            graph = timing.capture_cuda_graph(self.timed()[0])
        return graph.replay


def prepare(case: Case, device: str, stack: contextlib.ExitStack) -> Prepared:
    """Build the provider's call for `case` (contexts it opens live on `stack`) and make the inputs."""
    provider = registry.get(case.provider)
    info = provider.resolved_info()
    fn = provider.build(case, device, stack)
    prepared = Prepared(case, info.layout, fn, device)
    return prepared


def _nvml_sample(ctx: Context) -> dict[str, Any] | None:
    if ctx.device != "cuda":
        return None
    return nvml.sample(ctx.nvml_index)


def classify(exc: BaseException, caught: list[str]) -> tuple[str, str, bool]:
    """(status, reason, fatal) for an exception raised while running a case."""

    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if isinstance(exc, registry.Unsupported) or name in ("KernelUnsupported", "Unsupported"):
        return UNSUPPORTED, text or name, False
    if _is_oom(exc):
        return OOM, text[:500], False
    if _SDPA_REFUSAL.search(text):
        reasons = [" ".join(w.split()) for w in caught if w.strip()]
        return UNSUPPORTED, ("; ".join(reasons) or text)[:800], False
    where = ""
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        where = f" (at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})"
    return CRASH, f"{name}: {text}"[:800] + where, bool(_FATAL.search(text))


def measure_case(case: Case, opts: Options, ctx: Context) -> tuple[Row, bool]:
    """Run one case; return its row and whether this process must exit (the CUDA context is broken)."""
    import torch

    base = {"device": ctx.device, "gpu": ctx.gpu, "cuda_graph": opts.cuda_graph, "timestamp": time.time()}
    flops = case_flops(case)
    base["flops"] = flops
    info = ctx.info(case.provider)
    if not info.available:
        return Row.for_case(case, UNAVAILABLE, reason=info.reason, **base), False
    why = info.supports(case, ctx.device)
    if why:
        return Row.for_case(case, UNSUPPORTED, reason=why, **base), False
    caught: list[str] = []
    row: Row | None = None
    fatal = False
    prepared: Prepared | None = None
    try:
        with contextlib.ExitStack() as stack:
            ctx.phase("build")
            prepared = prepare(case, ctx.device, stack)
            row = _measure(prepared, opts, ctx, base, caught)
    except Exception as exc:
        status, reason, fatal = classify(exc, caught)
        row = Row.for_case(case, status, reason=reason, **base)
    finally:
        prepared = None  # noqa: F841  (drop inputs before the next case)
        gc.collect()
        if ctx.device == "cuda" and not fatal:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    return row, fatal


def _check_compiled(prepared: Prepared) -> str | None:
    check = getattr(prepared.fn, "check_compiled", None)
    return check() if check else None


def _measure(prepared: Prepared, opts: Options, ctx: Context, base: dict[str, Any], caught: list[str]) -> Row:
    import torch

    case, device = prepared.case, ctx.device
    # 1. the first call: compile + autotune (+ one run), warnings recorded (SDPA's refusal reasons)
    ctx.phase("compile")
    results: dict[str, Any] = {}

    def first() -> None:
        results.update(prepared.full())

    waited = build_lock.waited_s()
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        try:
            compile_ms = timing.first_call_ms(first, device)
        finally:
            build_lock.release()
            caught.extend(str(r.message) for r in records)
    base["compile_ms"] = compile_ms
    if waited is not None:  # of compile_ms: waiting for another process's compile of a build this call needed
        base["compile_wait_ms"] = ((build_lock.waited_s() or 0.0) - waited) * 1e3
    fallback = _check_compiled(prepared)
    if fallback:
        return Row.for_case(case, CRASH, reason=f"compile fallback detected: {fallback}", **base)
    kernel_config = _kernel_config(case.provider)
    # 2. correctness against the float64 reference, before any timing
    ctx.phase("check")
    verdict = correctness.check(case, prepared.inputs, results, device, opts.ref_flops_limit)
    results.clear()
    prepared.drop_reference()
    base.update(rel_err=verdict.rel_err, err_budget=verdict.err_budget, ref=verdict.ref)
    base["kernel_config"] = kernel_config
    if not verdict.ok:
        return Row.for_case(case, WRONG, reason=verdict.reason, **base)
    # 3. peak memory from its own untimed run: bytes allocated above the inputs
    if device == "cuda":
        ctx.phase("memory")
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        floor = torch.cuda.memory_allocated()
        kept = prepared.full()
        torch.cuda.synchronize()
        base["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated() - floor)
        del kept
        gc.collect()
        torch.cuda.empty_cache()  # the timing loop starts from an unfragmented cache
    # 4. samples (a timing loop that runs out of memory is retried once with the allocator cache emptied: a
    # case whose measured run fitted can still fail to find a contiguous block in a fragmented cache)
    ctx.phase("timing")
    before = _nvml_sample(ctx)
    held: str | None = None
    try:
        samples, regime = _time(prepared, opts, ctx)
    except CaseRefused as refusal:
        return Row.for_case(case, UNSUPPORTED, reason=str(refusal), **base)
    except Exception as exc:
        if not _is_oom(exc):
            raise
        held = _allocator_state(device)  # the retry runs outside this block: exc's frames hold tensors
    if held is not None:
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        try:
            samples, regime = _time(prepared, opts, ctx)
        except Exception as again:
            if not _is_oom(again):
                raise
            reason = f"out of memory in the timing loop, again after emptying the allocator cache{held}: "
            return Row.for_case(case, OOM, reason=(reason + " ".join(str(again).split()))[:800], **base)
        note = f"the timing loop ran out of memory once{held}; it ran after emptying the allocator cache"
        regime["reason"] = "; ".join(x for x in (regime.get("reason", ""), note) if x)
    after = _nvml_sample(ctx)
    fallback = _check_compiled(prepared)
    if fallback:
        return Row.for_case(case, CRASH, reason=f"compile fallback detected: {fallback}", **base)
    stats = timing.summarize(samples)
    throttled = bool(regime.pop("throttled", False))
    throttled |= bool((before or {}).get("throttled")) or bool((after or {}).get("throttled"))
    return Row.for_case(
        case,
        OK,
        samples_ms=[round(s, 6) for s in samples],
        **{k: round(v, 6) for k, v in stats.items()},
        tflops=base["flops"] / (stats["median_ms"] * 1e-3) / 1e12,
        nvml_before=before,
        nvml_after=after,
        throttled=throttled,
        **regime,
        **base,
    )


class CaseRefused(Exception):
    """The case cannot be timed as asked (a CUDA graph that does not capture): an `unsupported` row."""


def _time(prepared: Prepared, opts: Options, ctx: Context) -> tuple[list[float], dict[str, Any]]:
    """The samples and the row fields that say how they were taken (the regime, the clocks of the window)."""
    import torch

    if ctx.device != "cuda":
        call, setup = prepared.timed()
        knobs = {k: getattr(opts, k) for k in ("warmup_ms", "rep_ms", "min_samples", "max_samples")}
        # no loop timing on the CPU: a call's run is its host time there, and the interpreter's calls are long
        return timing.time_cpu(call, setup=setup, **knobs), {}
    if ctx.flusher is None or ctx.flusher.mode != opts.l2_flush:
        ctx.flusher = timing.L2Flusher(torch.cuda.current_device(), opts.l2_flush)
    if opts.cuda_graph:
        try:
            call, setup = prepared.graphed(), None
        except Exception as exc:
            raise CaseRefused(
                f"CUDA graph capture failed: {type(exc).__name__}: {' '.join(str(exc).split())}"[:800]
            ) from None
    else:
        call, setup = prepared.timed()
    blocker = _blocker(ctx) if opts.block_launches else None
    took = timing.measure_cuda(
        call, flush=ctx.flusher, setup=setup, regime=opts, sampler=_sampler(ctx), blocker=blocker
    )
    index = ctx.nvml_index
    power = (
        timing.counter_power(lambda: nvml.energy_mj(index), torch.cuda.synchronize) if ctx.sampler else None
    )
    held = timing.held_batch(blocker) if blocker is not None and not took.host_time_included else None
    loop_call = call if opts.cuda_graph else prepared.looped()
    fields: dict[str, Any] = {
        "warmup_s": round(took.warmup_s, 3) if took.warmup_s is not None else None,
        "warmup_settled": took.warmup_settled,
        "host_time_included": took.host_time_included,
        **nvml.window_summary(took.window),
        **_host_fields(loop_call, took.samples_ms, opts, torch.cuda.synchronize, held, power),
    }
    fields["throttled"] = bool(fields.get("throttle_reasons"))
    note = took.note or (ctx.block_note if opts.block_launches and blocker is None else "")
    if note:
        fields["reason"] = note
    return took.samples_ms, fields


def _host_fields(
    call: Callable[[], Any],
    samples_ms: list[float],
    opts: Options,
    sync: Callable[[], Any],
    held: timing.Held | None,
    power: timing.Power | None,
) -> dict[str, Any]:
    """The row's host_ms, loop_ms, loop_samples_ms, loop_gpu_ms, host_bound and energy_j (timing.measure_host)
    for a GPU case, or {} when host timing is off (host_loops = 0)."""
    if opts.host_loops <= 0 or not samples_ms:
        return {}
    gpu_ms = timing.quantile(samples_ms, 0.5)
    took = timing.measure_host(
        call,
        sync=sync,
        gpu_ms=gpu_ms,
        held=held,
        power=power,
        loops=opts.host_loops,
        loop_ms=opts.host_loop_ms,
    )
    return {
        "host_ms": round(took.host_ms, 6),
        "loop_ms": round(took.loop_ms, 6),
        "loop_samples_ms": [round(s, 6) for s in took.loop_samples_ms],
        "loop_gpu_ms": round(took.loop_gpu_ms, 6) if took.loop_gpu_ms is not None else None,
        "host_bound": took.host_bound(gpu_ms, opts.host_bound_pct),
        "energy_j": round(took.energy_j, 6) if took.energy_j is not None else None,
    }


def _sampler(ctx: Context) -> Any:
    """The worker's NVML clock sampler, or None where NVML gives no reading."""
    if ctx.sampler is None:
        index = ctx.nvml_index
        ctx.sampler = nvml.clock_sampler(index) or False
    return ctx.sampler or None


def _blocker(ctx: Context) -> Any:
    """The worker's launch blocker, or None where it cannot work here (ctx.block_note says why)."""
    if ctx.blocker is None:
        try:
            from flashbench.engine import blocking  # imports triton: only where a GPU case is timed

            ctx.blocker, ctx.block_note = blocking.make_blocker()
        except Exception as exc:
            ctx.blocker, ctx.block_note = None, f"launch blocking off: {type(exc).__name__}: {exc}"[:300]
        ctx.blocker = ctx.blocker or False
    return ctx.blocker or None


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or bool(re.search(r"\bout of memory\b", str(exc), re.I))


def _allocator_state(device: str) -> str:
    """' (X GiB reserved, Y GiB allocated)' from torch's caching allocator, or '' on the CPU."""
    if device != "cuda":
        return ""
    import torch

    gib = 2**30
    reserved, allocated = torch.cuda.memory_reserved() / gib, torch.cuda.memory_allocated() / gib
    return f" ({reserved:.1f} GiB reserved, {allocated:.1f} GiB allocated)"


def _kernel_config(name: str) -> dict[str, Any] | None:
    hook = registry.get(name).kernel_config
    if hook is None:
        return None
    try:
        config = hook()
    except Exception:
        return None
    if not config:
        return None
    return _plain(config)


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """A reported config as JSON: numbers, strings, booleans and nested dicts of them; anything else as text."""
    return {
        str(k): _plain(v)
        if isinstance(v, dict)
        else (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
        for k, v in config.items()
    }

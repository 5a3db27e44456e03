"""Measure this GPU's achievable ceilings: copy and read bandwidth, and matmul TFLOP/s per dtype.

The result is the "measured" roof beside the datasheet and NVML-derived ones (hardware.py). It is stored as
JSON at hardware.calibration_file(spec): ``$FLASHBENCH_HOME/calibration/<gpu-key>.json`` if FLASHBENCH_HOME
is set, else ``${XDG_CACHE_HOME:-~/.cache}/flashbench/calibration/<gpu-key>.json``.

Method: the sweep's regime (engine/timing.py): a steady warm-up until the SM clock settles (bounded), then
CUDA-event-timed repetitions filling about `seconds`, median kept with p20/p80, the SM clock, power and
clock-event reasons read by NVML during the repetitions and stored with each figure. Measured back to back
with 0.1 s warm-ups instead, an H100 gave bf16 725 and fp16 687 TFLOP/s (equal rates on that hardware) while
its clock fell to 1260 MHz at 697 W: each figure must carry the clock it was taken at.
  copy   device-to-device copy of buffers much larger than L2 (default 1 GiB): bytes read + written (2 x size)
  read   torch.sum over one such buffer: bytes read (the result is 4 bytes), the figure a decode kernel, which
         reads the KV cache and hardly writes, is held to
  empty  one launch of a Triton kernel that does nothing, timed as the sweep times a call (CUDA events behind
         the launch blocker, so no host gap counts), eagerly and as a CUDA-graph replay: the floor of any timed
         call, and with the read bandwidth the floor of a decode call (models.roofline.decode_floor_s)
  matmul square n x n x n (default n = 8192), 2 n^3 FLOPs. fp32 runs with TF32 disabled, tf32 with it
         enabled; fp8 uses torch._scaled_mm (e4m3 inputs, bf16 output) where the GPU and torch support it.
A calibration is `throttled` when a clock-event reason other than idle was active during its repetitions
(on an H100 under sustained matmuls: the software power cap); `throttle_reason` says which, where, and at
what clock, in words. The ceiling is then what this GPU sustains under that limit, not its boost-clock peak.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flashbench.engine import timing
from flashbench.errors import EXIT_NO_GPU, FlashbenchError
from flashbench.gpu import hardware, nvml


def _require_cuda() -> Any:
    try:
        import torch
    except ImportError:
        raise FlashbenchError(
            "calibrate needs PyTorch with CUDA; torch is not installed", EXIT_NO_GPU
        ) from None
    if not torch.cuda.is_available():
        raise FlashbenchError("calibrate needs a CUDA GPU and found none", EXIT_NO_GPU)
    return torch


def bench_ms(fn: Callable[[], Any], seconds: float = 0.5, index: int = 0) -> dict[str, Any]:
    """Time fn() on the current CUDA stream in the steady regime: median / p20 / p80 (ms), repetitions, the
    warm-up, and the clocks of the timed window (nvml.window_summary)."""
    _require_cuda()
    fn()
    regime = timing.Regime(
        rep_ms=seconds * 1e3, rep_max_ms=4 * seconds * 1e3, min_samples=10, block_launches=False
    )
    took = timing.measure_cuda(fn, flush=lambda: None, regime=regime, sampler=nvml.clock_sampler(index))
    return {
        **timing.summarize(took.samples_ms),
        "reps": len(took.samples_ms),
        "warmup_s": round(took.warmup_s or 0.0, 3),
        "warmup_settled": took.warmup_settled,
        **nvml.window_summary(took.window),
    }


def copy_bandwidth(nbytes: int = 1 << 30, seconds: float = 0.5, index: int = 0) -> dict[str, Any]:
    """Device-to-device copy: bytes read + written per second."""
    torch = _require_cuda()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = bench_ms(lambda: dst.copy_(src), seconds=seconds, index=index)
    moved = 2 * nbytes
    return {**t, "bytes_moved": moved, "gb_s": moved / (t["median_ms"] * 1e-3) / 1e9}


def read_bandwidth(nbytes: int = 1 << 30, seconds: float = 0.5, index: int = 0) -> dict[str, Any]:
    """A reduction over `nbytes` (torch.sum of fp32): bytes read per second (the 4-byte result aside)."""
    torch = _require_cuda()
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    t = bench_ms(lambda: torch.sum(src), seconds=seconds, index=index)
    moved = src.numel() * 4
    return {**t, "bytes_moved": moved, "gb_s": moved / (t["median_ms"] * 1e-3) / 1e9}


def empty_kernel(seconds: float = 0.5, index: int = 0) -> dict[str, Any]:
    """The empty kernel's time (module docstring) in microseconds: {"eager_us", "cuda_graph_us", "details",
    "note"}; note says why a figure may include host time (no launch blocker here)."""
    torch = _require_cuda()
    from flashbench.engine import blocking  # imports triton: only where a GPU is calibrated

    blocker, note = blocking.make_blocker()
    unused = torch.empty(1, device="cuda")
    launch = lambda: blocking.launch_empty(unused)  # noqa: E731
    graph = timing.capture_cuda_graph(launch)
    regime = timing.Regime(rep_ms=seconds * 1e3, rep_max_ms=4 * seconds * 1e3, min_samples=10)
    details = {}
    for name, call in (("eager", launch), ("cuda_graph", graph.replay)):
        took = timing.measure_cuda(call, flush=lambda: None, regime=regime, blocker=blocker)
        details[name] = {
            **timing.summarize(took.samples_ms),
            "reps": len(took.samples_ms),
            "host_time_included": took.host_time_included,
        }
    return {
        "eager_us": details["eager"]["median_ms"] * 1e3,
        "cuda_graph_us": details["cuda_graph"]["median_ms"] * 1e3,
        "details": details,
        "note": note,
    }


def matmul_tflops(dtype: str, n: int = 8192, seconds: float = 0.5, index: int = 0) -> dict[str, Any]:
    """Square matmul rate for one dtype: fp32, tf32, fp16, bf16 or fp8."""
    torch = _require_cuda()
    flops = 2 * n**3
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        if dtype == "fp8":
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                return {"error": "this torch has no float8 matmul"}
            a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
            b = (
                torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
            )  # column-major, as _scaled_mm needs
            one = torch.tensor(1.0, device="cuda")

            def fn() -> Any:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        else:
            tdt = {
                "fp32": torch.float32,
                "tf32": torch.float32,
                "fp16": torch.float16,
                "bf16": torch.bfloat16,
            }[dtype]
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            a = torch.randn(n, n, device="cuda", dtype=tdt)
            b = torch.randn(n, n, device="cuda", dtype=tdt)

            def fn() -> Any:
                return a @ b

        t = bench_ms(fn, seconds=seconds, index=index)
    except Exception as exc:  # an unsupported dtype on this GPU is a recorded fact, not a crash
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return {**t, "n": n, "flops": flops, "tflops": flops / (t["median_ms"] * 1e-3) / 1e12}


def calibrate(
    index: int = 0,
    n: int = 8192,
    copy_bytes: int = 1 << 30,
    seconds: float = 0.5,
    dtypes: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32", "fp8"),
    save: bool = True,
) -> dict[str, Any]:
    """Measure, store (hardware.save_calibration) and return the calibration record for GPU `index`."""
    torch = _require_cuda()
    torch.cuda.set_device(index)
    name = torch.cuda.get_device_name(index)
    try:
        spec, _facts = hardware.detect(index)
    except FlashbenchError:  # no NVML (unusual with CUDA): name the file after the device name
        spec = hardware.match_nvml_name(name) or hardware.derived_spec({"name": name})
    before = nvml.sample(index)
    copy = copy_bandwidth(copy_bytes, seconds, index)
    read = read_bandwidth(copy_bytes, seconds, index)
    empty = empty_kernel(seconds, index)
    matmuls = {d: matmul_tflops(d, n, seconds, index) for d in dtypes}
    after = nvml.sample(index)
    measured = {"copy": copy, "read": read, **{f"{d} matmul": r for d, r in matmuls.items() if "tflops" in r}}
    max_sm = (nvml.gpu_facts(index) or {}).get("max_sm_clock_mhz")
    reason = throttle_verdict(measured, max_sm)
    clocks = [r["sm_clock_mhz"] for r in measured.values() if r.get("sm_clock_mhz")]
    record = {
        "gpu": name,
        "key": spec.key,
        "copy_bw_gb_s": copy["gb_s"],
        "read_bw_gb_s": read["gb_s"],
        # the empty kernel's event time (us): eager and as a CUDA-graph replay (empty_kernel)
        "empty_kernel_us": {"eager": empty["eager_us"], "cuda_graph": empty["cuda_graph_us"]},
        "matmul_tflops": {d: r["tflops"] for d, r in matmuls.items() if "tflops" in r},
        # the SM clock the figures were taken at: the lowest of the measurements' medians, and the maximum
        "sm_clock_mhz": min(clocks) if clocks else None,
        "max_sm_clock_mhz": max_sm,
        "throttled": bool(reason),
        "throttle_reason": reason,
        "details": {"copy": copy, "read": read, "empty": empty, "matmul": matmuls},
        "nvml_before": before,
        "nvml_after": after,
        "torch": torch.__version__,
        "timestamp_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": "steady warm-up (SM clock settled), then the median of CUDA-event-timed repetitions with "
        "NVML clocks read during them; copy counts read + write bytes, read (torch.sum) the bytes read; "
        "empty: one do-nothing kernel behind the launch blocker; matmul 2*n^3",
    }
    if save:
        record["path"] = str(hardware.save_calibration(spec, record))
    return record


def throttle_verdict(measured: dict[str, dict[str, Any]], max_sm_clock_mhz: float | None) -> str:
    """In words, which clock-event reasons held the clock down during which measurements, and at what clock;
    '' when none did. `measured` maps a name ("bf16 matmul") to its bench_ms result."""
    parts: list[str] = []
    for what, result in measured.items():
        reasons = result.get("throttle_reasons") or []
        if not reasons:
            continue
        clock = result.get("sm_clock_mhz")
        at = f" at {clock:.0f} MHz" if clock else ""
        if clock and max_sm_clock_mhz:
            at += f" ({clock / max_sm_clock_mhz:.0%} of its {max_sm_clock_mhz:.0f} MHz maximum)"
        share = result.get("throttled_share")
        during = f" (in {share:.0%} of its clock readings)" if share is not None else ""
        parts.append(f"{what}: {', '.join(r.replace('_', ' ') for r in reasons)}{during}{at}")
    return "; ".join(parts)

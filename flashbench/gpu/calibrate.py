"""Measure this GPU's achievable ceilings: device-to-device copy bandwidth and matmul TFLOP/s per dtype.

The result is the "measured" roof beside the datasheet and NVML-derived ones (hardware.py). It is stored as
JSON at hardware.calibration_file(spec): ``$FLASHBENCH_HOME/calibration/<gpu-key>.json`` if FLASHBENCH_HOME
is set, else ``${XDG_CACHE_HOME:-~/.cache}/flashbench/calibration/<gpu-key>.json``.

Method (triton.testing.do_bench style): CUDA events around each repetition, warm-up by time, at least
`min_reps` repetitions filling about `seconds` of GPU time, median kept with p20/p80. The copy uses buffers
much larger than L2 (default 1 GiB each way) and counts bytes read + bytes written (2 x size per copy).
Matmuls are square n x n x n (default n = 8192) and count 2 n^3 FLOPs. fp32 runs with TF32 disabled, tf32
with it enabled; fp8 uses torch._scaled_mm (e4m3 inputs, bf16 output) where the GPU and torch support it.
Clocks move (power caps, heat): NVML samples before and after are stored with the numbers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flashbench.errors import EXIT_NO_GPU, FlashbenchError


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


def bench_ms(
    fn: Callable[[], Any], seconds: float = 0.5, min_reps: int = 10, warmup_s: float = 0.1
) -> dict[str, Any]:
    """Time fn() on the current CUDA stream: median / p20 / p80 in ms and the raw samples."""
    torch = _require_cuda()
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        fn()
        torch.cuda.synchronize()
    # Estimate the per-call time to size the run.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    torch.cuda.synchronize()
    est_ms = max(e0.elapsed_time(e1), 1e-3)
    reps = max(min_reps, min(1000, int(seconds * 1e3 / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    samples = sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    q = statistics.quantiles(samples, n=5) if len(samples) >= 5 else [samples[0]] * 4
    return {"median_ms": statistics.median(samples), "p20_ms": q[0], "p80_ms": q[3], "reps": reps}


def copy_bandwidth(nbytes: int = 1 << 30, seconds: float = 0.5) -> dict[str, Any]:
    """Device-to-device copy: bytes read + written per second."""
    torch = _require_cuda()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = bench_ms(lambda: dst.copy_(src), seconds=seconds)
    moved = 2 * nbytes
    return {**t, "bytes_moved": moved, "gb_s": moved / (t["median_ms"] * 1e-3) / 1e9}


def matmul_tflops(dtype: str, n: int = 8192, seconds: float = 0.5) -> dict[str, Any]:
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

        t = bench_ms(fn, seconds=seconds)
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
    from flashbench.gpu import hardware, nvml

    torch.cuda.set_device(index)
    name = torch.cuda.get_device_name(index)
    try:
        spec, _facts = hardware.detect(index)
    except FlashbenchError:  # no NVML (unusual with CUDA): name the file after the device name
        spec = hardware.match_nvml_name(name) or hardware.derived_spec({"name": name})
    before = nvml.sample(index)
    copy = copy_bandwidth(copy_bytes, seconds)
    matmuls = {d: matmul_tflops(d, n, seconds) for d in dtypes}
    after = nvml.sample(index)
    record = {
        "gpu": name,
        "key": spec.key,
        "copy_bw_gb_s": copy["gb_s"],
        "matmul_tflops": {d: r["tflops"] for d, r in matmuls.items() if "tflops" in r},
        "details": {"copy": copy, "matmul": matmuls},
        "nvml_before": before,
        "nvml_after": after,
        "throttled": bool((before or {}).get("throttled") or (after or {}).get("throttled")),
        "torch": torch.__version__,
        "timestamp_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": "median of CUDA-event-timed repetitions; copy counts read + write bytes; matmul 2*n^3",
    }
    if save:
        record["path"] = str(hardware.save_calibration(spec, record))
    return record

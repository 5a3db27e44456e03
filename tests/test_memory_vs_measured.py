"""The memory model against measured peaks: GPU peaks from a committed sweep (H200, torch 2.11, bf16), and the
naive path's peak on this machine's CPU (a process's peak RSS).

GPU: each provider's prediction uses the memory family and workspace its registry entry declares; every measured
ok row must be within 5% of the model (the allocator's rounding and a few MB of workspace are not modelled).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from flashbench.models.memory import predicted_peak_bytes, reported_workspace_bytes
from flashbench.providers import builtin, registry
from flashbench.results.rows import read_rows

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "measured" / "h200-default"


@pytest.mark.skipif(not (RUN / "rows.jsonl").is_file(), reason="no committed GPU run")
def test_predicted_peak_memory_is_within_5_percent_of_the_measured_peak():
    builtin.load()
    rows = [r for r in read_rows(RUN) if r.status == "ok" and r.peak_mem_bytes]
    assert len(rows) >= 400  # the whole sweep, not a handful
    off = []
    for r in rows:
        info = registry.get(r.provider).info
        model = predicted_peak_bytes(
            info.memory_family,
            r.batch,
            r.heads,
            r.kv_heads,
            r.seq_q,
            r.seq_k,
            r.head_dim,
            r.case.elem_bytes,
            r.causal,
            r.mode,
            bwd_workspace_q=info.bwd_workspace_q,
        ) + reported_workspace_bytes(r.kernel_config, r.batch, r.heads, r.seq_q, r.head_dim, r.mode)
        ratio = r.peak_mem_bytes / model
        if not 0.95 <= ratio <= 1.05:
            off.append(f"{r.key}: measured/model = {ratio:.3f}")
    assert not off, "\n".join(off[:20])


# The naive provider's call in a fresh process; its peak RSS (VmHWM, reset just before) above the RSS before. The
# attention matrices (>= 32 MiB each here) are mmap'ed by glibc and returned when freed, so the RSS follows the
# live tensors. Prints {"peak": bytes}.
_CPU_PEAK = """
import contextlib, json, sys
import torch
from flashbench.providers import builtin, registry
from flashbench.spec.cases import Case
torch.set_num_threads(1)
builtin.load()
case = Case.from_dict(json.loads(sys.argv[1]))
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
grad = case.mode != "fwd"
shape = (case.batch, case.heads, case.seq_q, case.head_dim)
q, k, v, do = (torch.randn(shape, dtype=dtype, requires_grad=grad and i < 3) for i in range(4))
build = registry.get(case.provider).build
small = build(Case.from_dict({**case.to_dict(), "seq_q": 64, "seq_k": 64}), "cpu", contextlib.ExitStack())
out = small(*(t[..., :64, :].detach().requires_grad_(grad) for t in (q, k, v)))  # first-call set-up
if grad:
    out.backward(torch.ones_like(out))
call = build(case, "cpu", contextlib.ExitStack())


def status_kib(field):
    line = next(x for x in open("/proc/self/status") if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS (VmHWM) to the current RSS
before = status_kib("VmRSS")
with torch.set_grad_enabled(grad):
    out = call(q, k, v)
    if grad:
        out.backward(do)
print(json.dumps({"peak": status_kib("VmHWM") - before}))
"""


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo: x86 "flags", arm "Features")."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    return {
        f for line in lines if line.startswith(("flags", "Features")) for f in line.split(":", 1)[1].split()
    }


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) that leave it no bf16 matmul at all, and those that keep AVX-512 but not its
# native bf16 instructions.
_NO_ONEDNN_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
_NO_NATIVE_BF16 = ("AVX512_CORE", "AVX512_CORE_VNNI")


def onednn_emulates_bf16(flags: set[str], isa_cap: str = "", machine: str = platform.machine()) -> bool:
    """Whether torch's bf16 CPU matmuls run as oneDNN's fp32 emulation: torch hands them to oneDNN on an x86 CPU
    with AVX-512 BW, VL and DQ, and oneDNN emulates them there unless the CPU has AVX512_BF16 or AMX-BF16 (or
    `isa_cap`, oneDNN's ONEDNN_MAX_CPU_ISA, keeps it from using them). Without AVX-512, and on arm CPUs (torch
    hands oneDNN bf16 matmuls only where the CPU has bf16), ATen's own matmul runs them."""
    cap = isa_cap.strip().upper()
    if machine not in ("x86_64", "AMD64") or cap in _NO_ONEDNN_BF16:
        return False
    avx512 = {"avx512bw", "avx512vl", "avx512dq"} <= flags
    native = bool({"avx512_bf16", "amx_bf16"} & flags) and cap not in _NO_NATIVE_BF16
    return avx512 and not native


def emulation_bytes(dtype: str, mode: str, seq_q: int, seq_k: int, emulated: bool) -> int:
    """What oneDNN's bf16 emulation adds to the naive path's peak RSS: one (batch, head) slice of a score-sized
    matmul output in fp32, 4 Nq Nk bytes, in the backward (measured at N = 2048: +16.8-18.0 MB over the 203.4 MB
    model with 4 or 8 heads, d = 64 or 128; at N = 1448 with 16 heads +7.5 MB against 8.4; the forward +0)."""
    return 4 * seq_q * seq_k if emulated and dtype == "bf16" and mode != "fwd" else 0


def test_bf16_emulation_is_read_from_the_cpu_flags_and_onednns_isa_cap():
    xeon = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}  # the CPU where naive bf16 peaked at +9%
    assert onednn_emulates_bf16(xeon, machine="x86_64")
    assert not onednn_emulates_bf16(xeon | {"avx512_bf16"}, machine="x86_64")
    assert not onednn_emulates_bf16(xeon | {"amx_bf16"}, machine="x86_64")
    assert onednn_emulates_bf16(xeon | {"avx512_bf16"}, "avx512_core", machine="x86_64")  # capped below bf16
    assert not onednn_emulates_bf16(xeon, "AVX2", machine="x86_64")  # no oneDNN bf16: ATen's matmul
    assert not onednn_emulates_bf16({"avx2", "fma"}, machine="x86_64")
    assert not onednn_emulates_bf16({"asimd", "bf16"}, machine="aarch64")
    assert not onednn_emulates_bf16({"asimd"}, machine="aarch64")


_ISA_CAP = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
_AVX512 = platform.machine() in ("x86_64", "AMD64") and {"avx512bw", "avx512vl", "avx512dq"} <= cpu_flags()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    ("dtype", "mode", "isa_cap"),
    [
        ("bf16", "fwd+bwd", _ISA_CAP),
        ("fp32", "fwd+bwd", _ISA_CAP),
        ("bf16", "fwd", _ISA_CAP),
        # the model of a CPU without native bf16, on any AVX-512 CPU: oneDNN capped below AVX512_CORE_BF16
        pytest.param(
            "bf16",
            "fwd+bwd",
            "AVX512_CORE",
            marks=pytest.mark.skipif(not _AVX512, reason="oneDNN emulates bf16 on AVX-512 CPUs only"),
        ),
    ],
    ids=["bf16-fwd+bwd", "fp32-fwd+bwd", "bf16-fwd", "bf16-fwd+bwd-emulated"],
)
def test_naive_peak_on_the_cpu_is_within_5_percent_of_the_model(dtype, mode, isa_cap):
    # The CPU's softmax backward has no fp32 `grad * output` temporary: 12 bytes per element, not CUDA's 16.
    case = {"provider": "naive", "batch": 1, "heads": 4, "kv_heads": 4, "seq_q": 2048, "seq_k": 2048}
    case.update(head_dim=64, dtype=dtype, causal=False, mode=mode)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa_cap} if isa_cap else None
    proc = subprocess.run(
        [sys.executable, "-c", _CPU_PEAK, json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
        check=True,
    )
    peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    e = 4 if dtype == "fp32" else 2
    args = (1, 4, 4, 2048, 2048, 64, e, False, mode)
    emulated = onednn_emulates_bf16(cpu_flags(), isa_cap)
    model = predicted_peak_bytes("naive", *args, device="cpu") + emulation_bytes(
        dtype, mode, 2048, 2048, emulated
    )
    assert 0.95 <= peak / model <= 1.05, (
        f"measured {peak} vs model {model} (oneDNN emulating bf16: {emulated})"
    )
    if mode != "fwd":
        assert peak < 0.9 * predicted_peak_bytes("naive", *args, device="cuda")  # not CUDA's 16 E

"""The memory model against measured peaks: GPU peaks from a committed sweep (H200, torch 2.11, bf16), and the
naive path's peak on this machine's CPU (a process's peak RSS).

GPU: each provider's prediction uses the memory family and workspace its registry entry declares; every measured
ok row must be within 5% of the model (the allocator's rounding and a few MB of workspace are not modelled).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashbench.models.memory import predicted_peak_bytes, reported_workspace_bytes
from flashbench.providers import registry
from flashbench.results.rows import read_rows

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "measured" / "h200-default"


@pytest.mark.skipif(not (RUN / "rows.jsonl").is_file(), reason="no committed GPU run")
def test_predicted_peak_memory_is_within_5_percent_of_the_measured_peak():
    registry.load_builtins()
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
from flashbench.providers import registry
from flashbench.spec.cases import Case
torch.set_num_threads(1)
registry.load_builtins()
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


@pytest.mark.skipif(not Path("/proc/self/clear_refs").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize(("dtype", "mode"), [("bf16", "fwd+bwd"), ("fp32", "fwd+bwd"), ("bf16", "fwd")])
def test_naive_peak_on_the_cpu_is_within_5_percent_of_the_model(dtype, mode):
    # The CPU's softmax backward has no fp32 `grad * output` temporary: 12 bytes per element, not CUDA's 16.
    case = {"provider": "naive", "batch": 1, "heads": 4, "kv_heads": 4, "seq_q": 2048, "seq_k": 2048}
    case.update(head_dim=64, dtype=dtype, causal=False, mode=mode)
    proc = subprocess.run(
        [sys.executable, "-c", _CPU_PEAK, json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=True,
    )
    peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    e = 4 if dtype == "fp32" else 2
    args = (1, 4, 4, 2048, 2048, 64, e, False, mode)
    model = predicted_peak_bytes("naive", *args, device="cpu")
    assert 0.95 <= peak / model <= 1.05, f"measured {peak} vs model {model}"
    if mode != "fwd":
        assert peak < 0.9 * predicted_peak_bytes("naive", *args, device="cuda")  # not CUDA's 16 E

"""Compile the bundled kernels for sm_90a (H100) on a machine without a GPU: registers, spills, shared memory, SASS.

No device time: Triton compiles through a stub driver that reports an sm_90 target, every launch is turned into
a compile-only warm-up, and ptxas / nvdisasm from the Triton wheel do the rest. Use the GPU machine's Triton
(3.6; Gluon's API differs in later releases), e.g. in a side environment that reuses this machine's torch:
`python3 -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0`.

    /tmp/t36/bin/python tools/sm90_compile.py ws  '{"BLOCK_M": 192, "PERSISTENT": 1}' --causal
    /tmp/t36/bin/python tools/sm90_compile.py tl  '{"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}' --causal
    /tmp/t36/bin/python tools/sm90_compile.py bwd '{"dkdv": [64, 128, 8, 3], "dq": [128, 64, 8, 3]}' --dim 128
    /tmp/t36/bin/python tools/sm90_compile.py bwd '{"dkdv": {"kernel": "gluon-ws"}, "dq": [128, 64, 8, 3]}' --dim 128
    /tmp/t36/bin/python tools/sm90_compile.py ws  '{}' --dim 128 --causal --window 4096,0
    /tmp/t36/bin/python tools/sm90_compile.py ws  '{"STAGES": 4}' --dim 128 --fp8
    /tmp/t36/bin/python tools/sm90_compile.py dump DIR [--part 0/2]

ws / tl / bwd print one line per compiled kernel (registers, spill stores/loads, shared memory, MUFU.EX2,
HGMMA and QGMMA (e4m3) counts, the wgmma groups (ptxas's "serialized" wgmma: one group per wgmma); for each P V
with P in registers, the MUFU.EX2 between its issue and its wait in
SASS order: the softmax that overlaps it); --sass DIR writes each kernel's SASS there; --no-tma compiles the tl
kernels' pointer path; --fp8 compiles ws's FP8 (e4m3) mode, as flash_fp8's forward launches it (V^T, descales).
dump writes the SASS of every shipped config to DIR, one file per kernel: the tl forward's autotune candidates
at d = 64 and 128, causal or not, through host descriptors and through pointers; the Gluon forward's defaults
(each head group of the list-scheduled walk, and the FP8 default at d = 128); the backward passes' candidates
(recompute) and defaults (stored P, pointers, the Gluon one pass and its deterministic two-pass dK/dV); the
stored-P and FA1-order forwards' defaults. A change that should leave
the code alone is checked with `diff -r` of two dumps; --part i/n
compiles every n-th kernel from the i-th (n processes side by side).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

SMEM = 232448  # an H100's opt-in shared memory per block
DIMS = (64, 128)


class _Sm90Driver(CudaDriver):
    """A CUDA driver that needs no GPU: target sm_90, device 0, stream 0 (compile only, never launch)."""

    def __init__(self):  # skip CudaDriver's CUDA initialisation
        self.utils = None

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def get_active_torch_device(self):
        return torch.device("cpu")

    @staticmethod
    def is_active():
        return True


# (kernel name, compiled kernel) of every launch since the last clear: launches only compile (JITFunction.run
# with warmup=True), so a launcher runs unchanged up to its kernel call.
_CAPTURED: list[tuple[str, Any]] = []


def _compile_only() -> None:
    run = JITFunction.run

    def warmup(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        _CAPTURED.append((self.__name__, kernel))
        return kernel

    JITFunction.run = warmup


def _stub_gpu(tma: bool) -> None:
    """What the launchers ask the GPU (TMA use, shared memory, SM count, Gluon support), answered for an H100."""
    from flashbench.kernels import backward_ws, flash_ws

    for name, module in list(sys.modules.items()):
        if name.startswith("flashbench.kernels"):
            if hasattr(module, "_PLANS"):  # a plan made under the other TMA answer would launch its kernel
                module._PLANS.plans.clear()
            if hasattr(module, "use_tma"):
                module.use_tma = lambda *tensors: tma
            if hasattr(module, "_max_shared_mem"):
                module._max_shared_mem = lambda: SMEM
    flash_ws._sm_count = lambda index: 132
    flash_ws.supported = lambda *args, **kwargs: None
    backward_ws.supported = lambda *args, **kwargs: None


def _disassemble(kernel: Any) -> tuple[str, int | None]:
    """(SASS, registers per thread) of a compiled kernel, by the Triton wheel's nvdisasm and cuobjdump."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        nvdisasm, cuobjdump = (os.path.join(bin_dir, tool) for tool in ("nvdisasm", "cuobjdump"))
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run(
            [cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return sass, int(regs.group(1)) if regs else None


def under_pv(sass: str) -> list[int]:
    """For each P V issue (an HGMMA group with its A operand in registers), the MUFU.EX2 between its last HGMMA
    and the WARPGROUP.DEPBAR that waits for every group: the exp2 work that runs under that P V."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    counts = []
    for i, op in enumerate(ops):
        if re.search(r"HGMMA\S* R\d+, R\d+, gdesc", op) and "gsb0" in op:
            end = next(
                (j for j in range(i + 1, len(ops)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ops[j]), len(ops)
            )
            counts.append(sum("MUFU.EX2" in x for x in ops[i + 1 : end]))
    return counts


def _summary(kernel: Any, sass: str, regs: int | None) -> str:
    spills = (len(re.findall(r"\bSTL\b", sass)), len(re.findall(r"\bLDL\b", sass)))
    pv = under_pv(sass)
    mmas = re.findall(r"[HQ]GMMA[^;]*;", sass)
    # the last wgmma of a group carries gsb0; ptxas gives it to every one when it serializes them
    groups = sum("gsb0" in op for op in mmas)
    return (
        f"regs={regs}, shared={kernel.metadata.shared} B, STL/LDL={spills}, MUFU.EX2={sass.count('MUFU.EX2')}, "
        f"HGMMA={sass.count('HGMMA')}, QGMMA={sass.count('QGMMA')}, setmaxnreg={sass.count('USETMAXREG')}"
        + (f", wgmma groups={groups}/{len(mmas)}{' (serialized)' if mmas and groups == len(mmas) else ''}")
        + (f", MUFU.EX2 under each P V={pv}" if pv else "")
    )


def _config(entry: tuple[int, ...] | list[int] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(entry, dict):  # e.g. {"kernel": "gluon-ws", "NUM_WG": 2}
        return entry
    return dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), entry, strict=True))


def _inputs(dim: int, seq: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, o, do of the speed preset's shape class (hidden 2048, bf16), and lse; never read."""
    q = torch.empty(2, 2048 // dim, seq, dim, dtype=torch.bfloat16)
    lse = torch.empty(2, 2048 // dim, seq, dtype=torch.float32)
    return q, torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), lse


def tl_forward(config: dict[str, Any], dim: int, causal: bool, seq: int = 2048, window: Any = None) -> None:
    from flashbench.kernels import flash_v2

    q, k, v, *_ = _inputs(dim, seq)
    flash_v2.attention_forward(q, k, v, causal, dim**-0.5, config, window)


def ws_forward(
    config: dict[str, Any], dim: int, causal: bool, seq: int = 2048, window: Any = None, fp8: bool = False
) -> None:
    from flashbench.kernels import flash_ws

    q, k, v, *_ = _inputs(dim, seq)
    if not fp8:
        flash_ws.attention_forward(q, k, v, causal, dim**-0.5, config, window)
        return
    q, k = (t.to(torch.float8_e4m3fn) for t in (q, k))
    v = torch.empty(*v.shape[:2], dim, seq, dtype=torch.float8_e4m3fn).transpose(-1, -2)  # value_layout's
    descales = tuple(torch.ones(*q.shape[:2]) for _ in "qkv")
    flash_ws.attention_forward(q, k, v, causal, dim**-0.5, config, window, descales=descales)


def backward(
    dkdv: dict[str, Any],
    dq: dict[str, Any],
    dim: int,
    causal: bool,
    stored_p: bool = False,
    window: Any = None,
) -> None:
    from flashbench.kernels.backward import attention_backward

    q, k, v, o, do, lse = _inputs(dim, 2048)
    p = torch.empty(*q.shape[:3], k.shape[2], dtype=q.dtype) if stored_p else None
    attention_backward(q, k, v, o, lse, do, p, causal, dim**-0.5, dkdv, dq, window=window)


def variant_forward(name: str, config: dict[str, Any], dim: int, causal: bool) -> None:
    from flashbench.kernels import flash_v1, stored_p

    q, k, v, *_ = _inputs(dim, 2048)
    if name == "v1":
        flash_v1.attention_forward_v1(q, k, v, causal, dim**-0.5, {**config, "Q_SPLIT": 1})
    else:
        stored_p.attention_forward_stored_p(q, k, v, causal, dim**-0.5, config)


def _spaces() -> dict[str, Any]:
    from flashbench.kernels import configs

    return {
        "fwd": configs.FWD_SPACE,
        "variant": configs.VARIANT_FWD_SPACE,
        "dkdv": configs.BWD_DKDV_SPACE,
        "dq": configs.BWD_DQ_SPACE,
        "candidates": configs.candidates,
    }


def _tag(config: dict[str, int]) -> str:
    return "x".join(map(str, config.values()))


def shipped() -> list[tuple[str, bool, functools.partial]]:
    """(name, TMA, compile call) of every shipped config (see the module docstring)."""
    from flashbench.kernels import backward_ws, flash_ws

    s = _spaces()
    jobs: list[tuple[str, bool, functools.partial]] = []

    def add(name: str, tma: bool, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        jobs.append((name, tma, functools.partial(fn, *args, **kwargs)))

    for dim, causal in itertools.product(DIMS, (False, True)):
        shape = f"d{dim}-{'causal' if causal else 'full'}"
        fwd = s["candidates"]("fwd", s["fwd"], dim, 2, SMEM)
        for cfg, tma in itertools.product(fwd, (True, False)):
            add(f"tl-{shape}-{'tma' if tma else 'ptr'}-{_tag(cfg)}", tma, tl_forward, cfg, dim, causal)
        if dim in flash_ws.HEAD_DIMS:
            add(f"ws-{shape}-default", True, ws_forward, {}, dim, causal, 8192)
            if causal and flash_ws.lpt_heads(2048, dim) != flash_ws.lpt_heads(
                8192, dim
            ):  # its other head group
                add(f"ws-{shape}-default-n2048", True, ws_forward, {}, dim, causal, 2048)
            if (dim, causal) in flash_ws.GLUON_FP8_MIN_SEQ:
                add(f"ws-fp8-{shape}-default", True, ws_forward, {}, dim, causal, 8192, fp8=True)
        dkdv = s["candidates"]("dkdv", s["dkdv"], dim, 2, SMEM)
        dq = s["candidates"]("dq", s["dq"], dim, 2, SMEM)
        # Every candidate of each pass; where the shorter list runs out, its first candidate again.
        for i in range(max(len(dkdv), len(dq))):
            a, b = dkdv[i] if i < len(dkdv) else dkdv[0], dq[i] if i < len(dq) else dq[0]
            add(f"bwd-{shape}-tma-{_tag(a)}-{_tag(b)}", True, backward, a, b, dim, causal)
        add(f"bwd-{shape}-ptr-default", False, backward, dkdv[0], dq[0], dim, causal)
        add(f"bwd-ws-{shape}-default", True, backward, {"kernel": "gluon-ws"}, dq[0], dim, causal)
        if backward_ws.MIN_SEQ_TWO_PASS.get((dim, causal)) is not None:  # the deterministic default
            two_pass = {"kernel": "gluon-ws", **backward_ws.TWO_PASS}
            add(f"bwd-ws-two-pass-{shape}-default", True, backward, two_pass, dq[0], dim, causal)
        add(f"bwd-stored_p-{shape}-ptr-default", False, backward, dkdv[0], dq[0], dim, causal, stored_p=True)
        variant = s["candidates"]("fwd", s["variant"], dim, 2, SMEM)[0]
        for name in ("v1", "stored_p"):
            add(f"{name}-{shape}-default", False, variant_forward, name, variant, dim, causal)
    return jobs


def dump(folder: str, part: str) -> int:
    index, count = (int(x) for x in part.split("/"))
    os.makedirs(folder, exist_ok=True)
    for j, (name, tma, call) in enumerate(shipped()):
        if j % count != index:
            continue
        _stub_gpu(tma)
        _CAPTURED.clear()
        call()
        for kernel_name, kernel in _CAPTURED:
            sass, regs = _disassemble(kernel)
            with open(os.path.join(folder, f"{name}.{kernel_name}.sass"), "w") as out:
                out.write(sass)
            print(f"{name}.{kernel_name}: {_summary(kernel, sass, regs)}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", choices=["ws", "tl", "bwd", "dump"])
    ap.add_argument("config", nargs="?", default="{}", help="a JSON config; dump: the output folder")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--no-tma", action="store_true", help="tl, bwd: the pointer path")
    ap.add_argument("--sass", help="write each kernel's SASS into this folder")
    ap.add_argument("--part", default="0/1", help="dump: every n-th kernel from the i-th (i/n)")
    ap.add_argument("--window", help="ws, tl, bwd: a sliding window L,R (flash_attn's window=(L, R))")
    ap.add_argument("--fp8", action="store_true", help="ws: the FP8 (e4m3) mode")
    a = ap.parse_args()
    triton.runtime.driver.set_active(_Sm90Driver())
    os.environ["FLASHBENCH_GLUON"] = "1"
    _compile_only()
    import flashbench.kernels  # noqa: F401  (every kernel module, so that _stub_gpu reaches them)

    if a.kernel == "dump":
        return dump(a.config, a.part)
    _stub_gpu(not a.no_tma)
    cfg = json.loads(a.config)
    window = tuple(int(x) for x in a.window.split(",")) if a.window else None
    if a.kernel == "ws":
        ws_forward(cfg, a.dim, a.causal, a.seq, window, fp8=a.fp8)
    elif a.kernel == "tl":
        tl_forward(cfg, a.dim, a.causal, a.seq, window)
    else:
        backward(_config(cfg["dkdv"]), _config(cfg["dq"]), a.dim, a.causal, window=window)
    for kernel_name, kernel in _CAPTURED:
        sass, regs = _disassemble(kernel)
        if a.sass:
            os.makedirs(a.sass, exist_ok=True)
            with open(os.path.join(a.sass, f"{kernel_name}.sass"), "w") as out:
                out.write(sass)
        print(
            f"{a.kernel}{' fp8' if a.fp8 else ''} d={a.dim} causal={int(a.causal)} {cfg} {kernel_name}: "
            f"{_summary(kernel, sass, regs)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

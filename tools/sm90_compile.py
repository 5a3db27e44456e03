"""Compile the bundled kernels for sm_90a (H100) on a machine without a GPU: registers, spills, shared memory, SASS.

No device time: Triton compiles through a stub driver that reports an sm_90 target, every launch is turned into
a compile-only warm-up, and ptxas / nvdisasm from the Triton wheel do the rest. Use the GPU machine's Triton
(3.6; Gluon's API differs in later releases), e.g. in a side environment that reuses this machine's torch:
`python3 -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0`.

    /tmp/t36/bin/python tools/sm90_compile.py ws  '{"BLOCK_M": 192, "PERSISTENT": 1}' --causal
    /tmp/t36/bin/python tools/sm90_compile.py tl  '{"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}' --causal
    /tmp/t36/bin/python tools/sm90_compile.py bwd '{"dkdv": [64, 128, 8, 3], "dq": [128, 64, 8, 3]}' --dim 128
    /tmp/t36/bin/python tools/sm90_compile.py bwd '{"dkdv": {"kernel": "gluon-ws"}, "dq": [128, 64, 8, 3]}' --dim 128
    /tmp/t36/bin/python tools/sm90_compile.py bwd '{"kernel": "gluon-ws"}' --dim 128 --causal --varlen
    /tmp/t36/bin/python tools/sm90_compile.py ws  '{}' --dim 128 --causal --window 4096,0
    /tmp/t36/bin/python tools/sm90_compile.py ws  '{"STAGES": 4}' --dim 128 --fp8
    /tmp/t36/bin/python tools/sm90_compile.py ws  '{}' --dim 128 --causal --varlen
    /tmp/t36/bin/python tools/sm90_compile.py decode '{}' --dim 128 --causal --fp8 [--group 4] [--paged 16]
    /tmp/t36/bin/python tools/sm90_compile.py mla '{"BLOCK_N": 32, "num_warps": 8, "num_stages": 3}' --causal --nq 2
    /tmp/t36/bin/python tools/sm90_compile.py mla '{}' --gluon --causal --nq 2 [--paged 64]
    /tmp/t36/bin/python tools/sm90_compile.py dump DIR [--part 0/2]

ws / tl / bwd / decode / mla print one line per compiled kernel (registers, spill stores/loads, shared memory, MUFU.EX2,
HGMMA and QGMMA (e4m3) counts, the wgmma groups (ptxas's "serialized" wgmma: one group per wgmma); for each P V
with P in registers, the MUFU.EX2 between its issue and its wait in SASS order: the softmax that overlaps it; the
spill loads and stores in each innermost loop that runs matmuls, in SASS order: one per partition of a
warp-specialized kernel, what each of its steps pays in local memory); --sass DIR writes each kernel's SASS and
TTGIR there (a load that Triton's pipeliner made asynchronous is a `ttg.async_copy_global_to_local` into shared
memory, read back by `ttg.local_load`); --no-tma compiles the tl kernels' pointer path; --fp8 compiles ws's FP8
(e4m3) mode, as flash_fp8's forward launches it (V^T, descales); --varlen its VARLEN mode, as flash_attn_varlen
launches it (varlen_ws.py: 8 packed documents), and bwd --varlen the Gluon backward's VARLEN mode
(varlen_ws.BackwardPlan; the config is the backward's, e.g. '{"kernel": "gluon-ws"}'). decode and mla compile the
decode kernels as flash_decode and flash_mla_decode launch them ('{}': the default tile, else any of BLOCK_N,
num_warps, num_stages), with the host's split heuristic on 132 SMs: decode takes bf16 q (32 heads, --group query
heads per KV head) over a bf16 or (--fp8) e4m3 cache of --seq keys (default 8192, batch 16); mla DeepSeek-V3's shape
(128 heads, 576 / 512 latent dims, bf16, --nq queries, 4096 keys, batch 32; --heads H for fewer); --paged PAGE takes
a paged cache; mla --gluon compiles kernels/mla_ws.py's Gluon kernel (and its combine) as flash_mla_decode launches
it when forced (with --paged, its paged mode: PAGE a multiple of 64; where H x nq <= 64, the split consumers of
kernels/mla_split_kernel.py). They add a line for one pass of the kernel's main loop (the SASS loop with the most
tensor-core ops): its instructions, and per opcode the cp.async copies (LDGSTS) with their commits (LDGDEPBAR) and
waits (DEPBAR), TMA (UTMALDG) and register (LDG) loads, shared-memory reads (LDSM = ldmatrix, LDS) and writes,
conversions (F2FP, F2F, HADD2.F32, PRMT, I2F) and the HMMA (mma.sync) / HGMMA (wgmma) ops. ws / tl / bwd add one
for an attention step (step_loop: the shortest innermost matmul loop that runs exp2s): its instructions, and per
opcode the MUFU.EX2, the softmax's FADD / FMNMX / FFMA / FMUL, SHFL, P's conversions and the tensor-core ops (an
FP8 d = 128 step over 256 keys: 668 instructions, FADD 6, MUFU.EX2 130). dump writes the SASS and
TTGIR of every shipped config to DIR, one pair of files per kernel: the tl forward's autotune candidates at d = 64
and 128, causal or not, through host descriptors and through pointers; the Gluon forward's defaults at each of its
head dims (64, 128, 256: each head group of the list-scheduled walk, the FP8 defaults and the VARLEN defaults); the
backward passes' candidates (recompute) and defaults (stored P, pointers, the Gluon one pass and its deterministic
two-pass dK/dV, the Gluon one pass's VARLEN mode); the stored-P and FA1-order forwards' defaults; flash_decode's
default tile at every head dim over bf16 and e4m3 caches (batch 16, key splits with the combine, paged; e4m3 at d =
128 also past fp8_plan's fill); flash_mla_decode's candidate tiles, its paged default and its Gluon kernel
(contiguous and paged). A change that should leave the code alone is checked with `diff -r` of two dumps; --part i/n
compiles every n-th kernel from the i-th, i from 0 (n processes side by side: 0/2 and 1/2), --only PREFIX the
kernels whose names start with PREFIX (`decode`, `mla`, ...). The dump compiles the kernels of the installed
package: to dump another commit's, check its kernels/ out into this tree (a second worktree's kernels/ is not the
installed flashbench.kernels).
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
    from flashbench.kernels import backward_ws, decode, flash_ws, mla, mla_ws, varlen_ws

    for name, module in list(sys.modules.items()):
        if name.startswith("flashbench.kernels"):
            if hasattr(module, "_PLANS"):  # a plan made under the other TMA answer would launch its kernel
                module._PLANS.plans.clear()
            if hasattr(module, "use_tma"):
                module.use_tma = lambda *tensors: tma
            if hasattr(module, "_max_shared_mem"):
                module._max_shared_mem = lambda: SMEM
    flash_ws._sm_count = lambda index: 132
    decode._sm_count = mla._sm_count = lambda index: 132
    decode._COMPILED.clear()  # a compiled kernel there would be launched, not compiled again
    # The decode launchers refuse CPU tensors outside the interpreter; the inputs here are built valid.
    decode._check_tensors = mla._check_tensors = lambda *args: None
    flash_ws.supported = varlen_ws.supported = varlen_ws.backward_supported = lambda *args, **kwargs: None
    backward_ws.supported = lambda *args, **kwargs: None
    mla_ws.refusal = lambda *args: None


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
        + (f", LDL/STL in each inner matmul loop={inner}" if (inner := mma_loop_spills(sass)) else "")
    )


# The opcodes a decode loop's summary counts: the cache tile's way from HBM (cp.async, TMA, register loads) and
# through shared memory (ldmatrix, plain loads), the conversions that fp8 or a P cast emit, the tensor-core ops.
LOOP_OPS = (
    "LDGSTS", "LDGDEPBAR", "DEPBAR", "UTMALDG", "LDG", "LDSM", "LDS", "STS", "F2FP", "F2F", "HADD2.F32", "PRMT",
    "I2F", "HMMA", "HGMMA", "QGMMA",
)  # fmt: skip
# The opcodes an attention step's summary counts (step_loop): the softmax's exp2s, adds, maxes, FMAs and the
# rescale's multiplies, shuffles (the row reductions), P's conversions and the tensor-core ops.
STEP_OPS = ("MUFU.EX2", "FADD", "FMNMX", "FFMA", "FMUL", "SHFL", "F2FP", "PRMT", "HMMA", "HGMMA", "QGMMA")


def _loops(sass: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The SASS instructions in order, and its loops as [first, end) index ranges into them: a branch back to an
    earlier label (an mbarrier wait's retry is one too)."""
    ops: list[str] = []
    labels: dict[str, int] = {}
    loops: list[tuple[int, int]] = []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ops)
            continue
        op = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+([^;]*);", line)
        if not op:
            continue
        target = re.search(r"BRA `\((\.L_x_\d+)\)", op.group(1))
        if target and target.group(1) in labels:
            loops.append((labels[target.group(1)], len(ops) + 1))
        ops.append(op.group(1).strip())
    return ops, loops


def _mmas(body: list[str]) -> int:
    return sum(bool(re.search(r"[HQ]G?MMA", x)) for x in body)


def main_loop(sass: str) -> list[str]:
    """The instructions of the kernel's main loop: of the loops in SASS, the one that holds the most tensor-core
    ops, then the longest."""
    ops, loops = _loops(sass)
    bodies = [ops[a:b] for a, b in loops]
    return max(bodies, key=lambda body: (_mmas(body), len(body)), default=[])


def _inner_mma_loops(sass: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The SASS instructions, and in SASS order the innermost loop around each tensor-core op (of the loops
    holding it, the shortest)."""
    ops, loops = _loops(sass)
    inner = {
        min((lp for lp in loops if lp[0] <= k < lp[1]), key=lambda lp: lp[1] - lp[0])
        for k, op in enumerate(ops)
        if re.search(r"[HQ]G?MMA", op) and any(a <= k < b for a, b in loops)
    }
    return ops, sorted(inner)


def mma_loop_spills(sass: str) -> list[int]:
    """Per innermost loop around a tensor-core op, in SASS order: its spill loads and stores (LDL, STL), what each
    pass of it pays in local memory. A warp-specialized kernel has one such loop per partition that runs
    matmuls."""
    ops, inner = _inner_mma_loops(sass)
    return [sum(bool(re.search(r"\b(LDL|STL)\b", x)) for x in ops[a:b]) for a, b in inner]


def step_loop(sass: str) -> list[str]:
    """The instructions of one attention step: the shortest innermost loop around a tensor-core op that runs
    exp2s (MUFU.EX2), e.g. a Gluon forward's unmasked key-block loop; [] if none."""
    ops, inner = _inner_mma_loops(sass)
    steps = [ops[a:b] for a, b in inner if any("MUFU.EX2" in x for x in ops[a:b])]
    return min(steps, key=len, default=[])


def loop_summary(body: list[str], counted: tuple[str, ...] = LOOP_OPS, label: str = "main loop") -> str:
    """Per pass of a loop (main_loop's, step_loop's): its instruction count and each counted opcode, by its full
    mnemonic."""
    counts: dict[str, int] = {}
    for op in body:
        if op.startswith("@!PT "):  # never runs (ptxas's padding)
            continue
        mnemonic = re.sub(r"^@!?U?P[T0-9]\s+", "", op).split()[0]
        if any(mnemonic == x or mnemonic.startswith(x + ".") for x in counted):
            counts[mnemonic] = counts.get(mnemonic, 0) + 1
    return f"{label}: {len(body)} instructions, " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _config(entry: tuple[int, ...] | list[int] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(entry, dict):  # e.g. {"kernel": "gluon-ws", "NUM_WG": 2}
        return entry
    return dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), entry, strict=True))


def _inputs(dim: int, seq: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, o, do of the speed preset's shape class (hidden 2048, bf16), and lse; never read."""
    q = torch.empty(2, 2048 // dim, seq, dim, dtype=torch.bfloat16)
    lse = torch.empty(2, 2048 // dim, seq, dtype=torch.float32)
    return q, torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), lse


def _heads(seq: int, dim: int, causal: bool, fp8: bool) -> int:
    """The head group (flash_ws.lpt_heads) of the Gluon forward's default at _inputs' shape, on an H100's 132 SMs."""
    from flashbench.kernels import flash_ws

    cfg = flash_ws.default_config(dim, causal, fp8)
    return flash_ws.lpt_heads(cfg, 2 * (2048 // dim), seq, seq, dim, causal, 132, fp8=fp8)


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


def varlen_forward(config: dict[str, Any], dim: int, causal: bool, seq: int = 2048) -> None:
    """flash_attn_varlen's Gluon forward (varlen_ws) over 8 documents packed into 2 * seq tokens."""
    from flashbench.kernels import varlen_ws

    q = torch.empty(2 * seq, 2048 // dim, dim, dtype=torch.bfloat16)
    cu = torch.zeros(9, dtype=torch.int32)
    varlen_ws.VarlenPlan(q, q, q, 8, causal, config).run(q, q, q, cu, cu, dim**-0.5)


def varlen_backward(config: dict[str, Any], dim: int, causal: bool, seq: int = 2048) -> None:
    """flash_attn_varlen's Gluon backward (varlen_ws.BackwardPlan) over 8 documents packed into 2 * seq tokens."""
    from flashbench.kernels import varlen_ws

    q = torch.empty(2 * seq, 2048 // dim, dim, dtype=torch.bfloat16)
    lse = torch.empty(1, q.shape[1], q.shape[0], dtype=torch.float32)
    cu = torch.zeros(9, dtype=torch.int32)
    plan = varlen_ws.BackwardPlan(q, q, q, q, 8, causal, config)
    plan.run(q, q, q, q, lse, q, cu, cu, dim**-0.5)


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


def _cache(
    batch: int, heads: int, seq: int, dim: int, dtype: torch.dtype, page: int | None
) -> tuple[Any, Any]:
    """A full KV cache of `seq` keys per sequence, [B, heads, seq, dim], or a pool of `page`-token pages and its
    block table; never read."""
    if page is None:
        return torch.empty(batch, heads, seq, dim, dtype=dtype), None
    return torch.empty(batch * seq // page, heads, page, dim, dtype=dtype), torch.zeros(
        batch, seq // page, dtype=torch.int32
    )


def decode(
    config: dict[str, Any],
    dim: int,
    fp8: bool,
    group: int,
    page: int | None,
    causal: bool,
    batch: int = 16,
    seq: int = 8192,
    nq: int = 1,
) -> None:
    """flash_decode of bf16 q over a bf16 or e4m3 cache: 32 query heads over 32 / group KV heads."""
    from flashbench.kernels import decode as dec

    q = torch.empty(batch, 32, nq, dim, dtype=torch.bfloat16)
    k, table = _cache(batch, 32 // group, seq, dim, dec.KV_FP8_DTYPE if fp8 else q.dtype, page)
    lens = torch.full((batch,), seq, dtype=torch.int32)
    dec.flash_decode(q, k, torch.empty_like(k), lens, table, causal, validate=False, config=config or None)


def mla(
    config: dict[str, Any],
    page: int | None,
    causal: bool,
    batch: int = 32,
    seq: int = 4096,
    nq: int = 1,
    gluon: bool = False,
    heads: int = 128,
) -> None:
    """flash_mla_decode of DeepSeek-V3's shape: `heads` heads (128) over one 576-dim latent head (512 of them V),
    bf16."""
    from flashbench.kernels import mla as mla_kernel

    q = torch.empty(batch, heads, nq, mla_kernel.MLA_HEAD_DIM, dtype=torch.bfloat16)
    kv, table = _cache(batch, 1, seq, mla_kernel.MLA_HEAD_DIM, q.dtype, page)
    lens = torch.full((batch,), seq, dtype=torch.int32)
    if gluon:  # mla_ws.py's kernel, as flash_mla_decode launches it when forced
        config = {"kernel": mla_kernel.GLUON_KERNEL}
    mla_kernel.flash_mla_decode(q, kv, lens, table, causal, validate=False, config=config or None)


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
    from flashbench.kernels import decode as dec
    from flashbench.kernels import mla as mla_kernel

    s = _spaces()
    jobs: list[tuple[str, bool, functools.partial]] = []

    def add(name: str, tma: bool, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        jobs.append((name, tma, functools.partial(fn, *args, **kwargs)))

    for dim, causal in itertools.product(DIMS, (False, True)):
        shape = f"d{dim}-{'causal' if causal else 'full'}"
        fwd = s["candidates"]("fwd", s["fwd"], dim, 2, SMEM)
        for cfg, tma in itertools.product(fwd, (True, False)):
            add(f"tl-{shape}-{'tma' if tma else 'ptr'}-{_tag(cfg)}", tma, tl_forward, cfg, dim, causal)
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
    for dim, causal in itertools.product(flash_ws.HEAD_DIMS, (False, True)):
        shape = f"d{dim}-{'causal' if causal else 'full'}"
        for fp8 in (False, True):
            if fp8 and (dim, causal) not in flash_ws.GLUON_FP8_MIN_SEQ:
                continue
            name = f"ws-{'fp8-' if fp8 else ''}{shape}-default"
            add(name, True, ws_forward, {}, dim, causal, 8192, fp8=fp8)
            # the default's other walk, at a length that takes it: a causal default's other head group
            # (flash_ws.lpt_heads); d = 64 without a mask, list-scheduled at 2048 keys (round-robin at 8192 here:
            # flash_ws.list_schedule_pays)
            other_group = _heads(2048, dim, causal, fp8) != _heads(8192, dim, causal, fp8)
            listed = not causal and flash_ws.default_config(dim, causal, fp8).get("LPT")
            if (causal and other_group) or listed:
                add(f"{name}-n2048", True, ws_forward, {}, dim, causal, 2048, fp8=fp8)
        add(f"ws-varlen-{shape}-default", True, varlen_forward, {}, dim, causal, 8192)
    for dim, causal in itertools.product(backward_ws.HEAD_DIMS, (False, True)):
        shape = f"d{dim}-{'causal' if causal else 'full'}"
        add(
            f"bwd-ws-varlen-{shape}-default", True, varlen_backward, {"kernel": "gluon-ws"}, dim, causal, 8192
        )
    # The decode kernels at their GPU tiles: batch 16, GQA 32/8 (bf16: one split; e4m3 at d = 128: fp8_plan's
    # fill tile, split), key splits and the combine (batch 1), a paged cache (16-token pages); e4m3 at d = 128 past
    # fp8_plan's fill (MHA 32/32 at batch 16: its other tile, one split), contiguous and paged; MLA's candidates at
    # 128 heads, Nq 1, its default over 64-token pages, and the Gluon kernel over a contiguous cache and over
    # 64-token pages.
    for dim, fp8 in itertools.product(dec.DECODE_HEAD_DIMS, (False, True)):
        shape = f"d{dim}-{'e4m3' if fp8 else 'bf16'}"
        add(f"decode-{shape}-contig-default", False, decode, {}, dim, fp8, 4, None, True)
        add(f"decode-{shape}-contig-splits-default", False, decode, {}, dim, fp8, 4, None, True, batch=1)
        add(f"decode-{shape}-paged-default", False, decode, {}, dim, fp8, 4, 16, True, batch=1)
    for dim, page in itertools.product(dec.FP8_TILE_DIMS, (None, 16)):
        layout = "paged" if page else "contig"
        add(f"decode-d{dim}-e4m3-{layout}-past-fill-default", False, decode, {}, dim, True, 1, page, True)
    for cfg in mla_kernel.CANDIDATE_CONFIGS:
        add(f"mla-contig-{_tag(cfg)}", False, mla, cfg, None, True)
    add("mla-paged-default", False, mla, {}, 64, True)
    add("mla-gluon-contig", True, mla, {}, None, True, gluon=True)
    add("mla-gluon-paged", True, mla, {}, 64, True, gluon=True)
    return jobs


def _write(folder: str, stem: str, **texts: str) -> None:
    """Each text to folder/stem.<its name> (sass=..., ttgir=...)."""
    os.makedirs(folder, exist_ok=True)
    for suffix, text in texts.items():
        with open(os.path.join(folder, f"{stem}.{suffix}"), "w") as out:
            out.write(text)


def parse_part(part: str) -> tuple[int, int]:
    """--part i/n as (i, n): every n-th kernel from the i-th, i from 0 to n - 1 (ValueError, one line, else: a
    dump at i = n would compile nothing and say nothing)."""
    try:
        index, count = (int(x) for x in part.split("/"))
    except ValueError:
        raise ValueError(f"--part {part!r}: i/n, two integers (every n-th kernel from the i-th)") from None
    if not 0 <= index < count:
        raise ValueError(f"--part {part}: i runs from 0 to n - 1 (here 0 to {count - 1})")
    return index, count


def dump(folder: str, part: str, only: str = "") -> int:
    index, count = parse_part(part)
    os.makedirs(folder, exist_ok=True)
    for j, (name, tma, call) in enumerate(shipped()):
        if j % count != index or not name.startswith(only):
            continue
        _stub_gpu(tma)
        _CAPTURED.clear()
        call()
        for kernel_name, kernel in _CAPTURED:
            sass, regs = _disassemble(kernel)
            _write(folder, f"{name}.{kernel_name}", sass=sass, ttgir=kernel.asm["ttgir"])
            loop = f"; {loop_summary(main_loop(sass))}" if name.startswith(("decode", "mla")) else ""
            print(f"{name}.{kernel_name}: {_summary(kernel, sass, regs)}{loop}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", choices=["ws", "tl", "bwd", "decode", "mla", "dump"])
    ap.add_argument("config", nargs="?", default="{}", help="a JSON config; dump: the output folder")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq", type=int, help="keys (default 2048; decode 8192, mla 4096 cached keys)")
    ap.add_argument("--no-tma", action="store_true", help="tl, bwd: the pointer path")
    ap.add_argument("--sass", help="write each kernel's SASS and TTGIR into this folder")
    ap.add_argument("--part", default="0/1", help="dump: every n-th kernel from the i-th (i/n)")
    ap.add_argument("--only", default="", help="dump: the kernels whose names start with this (e.g. decode)")
    ap.add_argument("--window", help="ws, tl, bwd: a sliding window L,R (flash_attn's window=(L, R))")
    ap.add_argument("--fp8", action="store_true", help="ws: the FP8 (e4m3) mode; decode: an e4m3 KV cache")
    ap.add_argument(
        "--varlen",
        action="store_true",
        help="ws, bwd: packed documents (flash_attn_varlen's VARLEN mode, 2 x seq tokens)",
    )
    ap.add_argument("--group", type=int, default=4, help="decode: query heads per KV head (of 32)")
    ap.add_argument(
        "--paged", type=int, metavar="PAGE", help="decode, mla: a paged cache of PAGE-token pages"
    )
    ap.add_argument("--gluon", action="store_true", help="mla: the Gluon kernel (kernels/mla_ws.py)")
    ap.add_argument("--nq", type=int, default=1, help="decode, mla: query tokens per sequence")
    ap.add_argument(
        "--heads", type=int, default=128, help="mla: query heads (H x nq <= 64: the split schedule)"
    )
    ap.add_argument("--batch", type=int, help="decode, mla: sequences (default 16, mla 32)")
    a = ap.parse_args()
    try:
        parse_part(a.part)
    except ValueError as exc:
        ap.error(str(exc))
    triton.runtime.driver.set_active(_Sm90Driver())
    os.environ["FLASHBENCH_GLUON"] = "1"
    _compile_only()
    import flashbench.kernels  # noqa: F401  (every kernel module, so that _stub_gpu reaches them)

    if a.kernel == "dump":
        return dump(a.config, a.part, a.only)
    _stub_gpu(not a.no_tma)
    cfg = json.loads(a.config)
    window = tuple(int(x) for x in a.window.split(",")) if a.window else None
    if a.kernel == "ws" and a.varlen:
        varlen_forward(cfg, a.dim, a.causal, a.seq or 2048)
    elif a.kernel == "ws":
        ws_forward(cfg, a.dim, a.causal, a.seq or 2048, window, fp8=a.fp8)
    elif a.kernel == "tl":
        tl_forward(cfg, a.dim, a.causal, a.seq or 2048, window)
    elif a.kernel == "decode":
        decode(cfg, a.dim, a.fp8, a.group, a.paged, a.causal, a.batch or 16, a.seq or 8192, a.nq)
    elif a.kernel == "mla":
        mla(cfg, a.paged, a.causal, a.batch or 32, a.seq or 4096, a.nq, a.gluon, a.heads)
    elif a.varlen:
        varlen_backward(cfg, a.dim, a.causal, a.seq or 2048)
    else:
        backward(_config(cfg["dkdv"]), _config(cfg["dq"]), a.dim, a.causal, window=window)
    if a.kernel == "decode":
        label = f"decode {'e4m3' if a.fp8 else 'bf16'} cache d={a.dim} G={a.group}"
    elif a.kernel == "mla":
        label = f"mla{' gluon' if a.gluon else ''} Nq={a.nq}"
    else:
        label = f"{a.kernel}{' fp8' if a.fp8 else ''} d={a.dim}"
    if a.kernel in ("decode", "mla"):
        label += f" {f'paged {a.paged}' if a.paged else 'contiguous'}"
    for kernel_name, kernel in _CAPTURED:
        sass, regs = _disassemble(kernel)
        if a.sass:
            _write(a.sass, kernel_name, sass=sass, ttgir=kernel.asm["ttgir"])
        print(f"{label} causal={int(a.causal)} {cfg} {kernel_name}: {_summary(kernel, sass, regs)}")
        if a.kernel in ("decode", "mla"):
            print(f"  {loop_summary(main_loop(sass))}")
        elif step := step_loop(sass):
            print(f"  {loop_summary(step, STEP_OPS, 'step loop')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

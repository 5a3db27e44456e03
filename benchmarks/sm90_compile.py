"""Compile the bundled forwards for sm_90a (H100) on a machine without a GPU: registers, spills, shared memory, SASS.

No device time: Triton compiles through a stub driver that reports an sm_90 target, and ptxas / nvdisasm from
the Triton wheel do the rest. Use the GPU machine's Triton (3.6; Gluon's API differs in later releases), e.g.
in a separate environment: `python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 torch`.

    /tmp/t36/bin/python benchmarks/sm90_compile.py ws   '{"BLOCK_M": 192, "PERSISTENT": 1, "WALK": "snake"}' --causal
    /tmp/t36/bin/python benchmarks/sm90_compile.py tl   '{"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}' --causal
Prints one line (registers, spill stores/loads, shared memory, MUFU.EX2 / HGMMA counts); --sass FILE writes
the SASS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402


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


def _report(kernel, sass_path: str | None) -> str:
    cubin = kernel.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        sass = subprocess.run([os.path.join(bin_dir, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    if sass_path:
        with open(sass_path, "w") as out:
            out.write(sass)
    md = kernel.metadata
    n_regs = getattr(kernel, "n_regs", None)
    spills = (len(re.findall(r"\bSTL\b", sass)), len(re.findall(r"\bLDL\b", sass)))
    return (f"shared={md.shared} B, STL/LDL={spills}, MUFU.EX2={sass.count('MUFU.EX2')}, "
            f"HGMMA={sass.count('HGMMA')}, setmaxnreg={sass.count('USETMAXREG')}, regs={n_regs}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", choices=["ws", "tl"])
    ap.add_argument("config", nargs="?", default="{}")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--sass")
    a = ap.parse_args()
    triton.runtime.driver.set_active(_Sm90Driver())
    os.environ["FLASHBENCH_GLUON"] = "1"
    cfg = json.loads(a.config)
    from flashbench.kernels import common, flash_v2, flash_ws

    q = torch.empty(2, 2048 // a.dim, a.seq, a.dim, dtype=torch.bfloat16)
    k, v = torch.empty_like(q), torch.empty_like(q)
    captured = {}
    if a.kernel == "ws":
        orig = flash_ws._attn_fwd_ws
        flash_ws._sm_count = lambda index: 132

        class Grab:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    captured["k"] = orig.warmup(*args, grid=grid, **kwargs)

                return run

        flash_ws._attn_fwd_ws = Grab()
        flash_ws.supported = lambda *args, **kwargs: None
        flash_ws.attention_forward(q, k, v, a.causal, a.dim**-0.5, cfg)
    else:
        common.use_tma = lambda *t: True
        common._max_shared_mem = lambda: 232448

        def run_config(kernel, grid, args, constexprs, config):
            meta = {key: val for key, val in config.items() if key not in common.LAUNCH_OPTIONS}
            options = {key: val for key, val in config.items() if key in common.LAUNCH_OPTIONS}
            common.size_descriptors(kernel, args, constexprs, meta)
            captured["k"] = kernel.warmup(*args, grid=grid(meta), **constexprs, **meta, **options)

        common._run_config = run_config
        flash_v2.use_tma = common.use_tma
        flash_v2.attention_forward(
            q, k, v, a.causal, a.dim**-0.5, common.normalize_config("tl", cfg, flags=("WS", "OV", "DIAG"))
        )
    print(f"{a.kernel} d={a.dim} causal={int(a.causal)} {cfg}: {_report(captured['k'], a.sass)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

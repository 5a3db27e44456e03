"""Backward studies as providers: the bundled backward with a forced dK/dV or dQ config, one provider per variant.

Loaded with `--kernel` by benchmarks/studies/backward.toml (benchmarks/README.md), so every variant is timed as a
sweep times a case (`--mode bwd`: the backward of one forward, the forward untimed) and its dQ, dK, dV are
checked against the float64 oracle first:

    flashbench sweep --config benchmarks/studies/backward.toml

Each provider runs the bundled forward as shipped, then `attention_backward` with its configs:

- `bwd-dkdv-BMxBN-wW-sS`: that tl dK/dV tile, the tl dQ pass autotuned;
- `bwd-dq-BMxBN-wW-sS`: that tl dQ tile, the tl dK/dV pass autotuned;
- `bwd-tl`: both tl passes autotuned (FLASHBENCH_GLUON_BWD=0);
- `bwd-gluon-*`: the Gluon dK/dV kernel (kernels/backward_ws.py) forced, one pass (dQ by reduce-adds) or two
  (`-two-pass`: ONE_PASS=0, the tl dQ pass autotuned), with its stages forced (`-sS`); `-convert-after`: the one
  pass with dQ's accumulator converted after the kernel rather than behind it (CONVERT_BEHIND=0); `-persistent`:
  the one pass with a program per SM taking the tiles in turn (PERSISTENT=1), `-grid` with a program per tile
  (PERSISTENT=0).

The shipped backward is the study config's `triton`; cuDNN's is `sdpa-cudnn`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from flashbench.kernels import last_config
from flashbench.kernels.backward import attention_backward
from flashbench.kernels.backward_ws import TWO_PASS
from flashbench.kernels.common import last_bwd_config
from flashbench.kernels.configs import BWD_DKDV_SPACE, BWD_DQ_SPACE, config_dict
from flashbench.kernels.flash_v2 import attention_forward

from flashbench.providers import register
from flashbench.spec.cases import Case

# tl tiles outside the spaces that were measured and not adopted: an 8-warp 32-query dK/dV tile, and 32-key dQ
# tiles with 8 warps or deeper pipelines.
DKDV_OUTSIDE = ((32, 128, 8, 3),)
DQ_OUTSIDE = ((128, 32, 8, 3), (128, 32, 4, 4), (128, 32, 4, 5))
_GLUON = {"kernel": "gluon-ws"}
GLUON_VARIANTS: dict[str, dict[str, Any]] = {
    "bwd-gluon": _GLUON,
    "bwd-gluon-s2": {**_GLUON, "STAGES": 2},
    "bwd-gluon-s3": {**_GLUON, "STAGES": 3},
    "bwd-gluon-two-pass": {**_GLUON, **TWO_PASS},  # what the deterministic backward runs at d = 128
    "bwd-gluon-two-pass-s3": {**_GLUON, "ONE_PASS": 0, "STAGES": 3},
    # the one pass with dQ's accumulator converted after the kernel (torch's copy), not behind it
    "bwd-gluon-convert-after": {**_GLUON, "CONVERT_BEHIND": 0},
    # the one pass over a persistent walk (a program per SM takes the tiles in turn), or a program per tile
    "bwd-gluon-persistent": {**_GLUON, "PERSISTENT": 1},
    "bwd-gluon-grid": {**_GLUON, "PERSISTENT": 0},
}


def tile_name(prefix: str, entry: tuple[int, ...]) -> str:
    bm, bn, warps, stages = entry
    return f"{prefix}-{bm}x{bn}-w{warps}-s{stages}"


class _ForcedBackward(torch.autograd.Function):
    """The shipped forward; the backward with the provider's dK/dV and dQ configs (None: chosen as shipped)."""

    @staticmethod
    def forward(ctx: Any, q, k, v, causal, sm_scale, dkdv, dq, gluon_bwd):  # type: ignore[override]
        o, lse, _ = attention_forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, sm_scale, dkdv, dq, gluon_bwd)
        return o

    @staticmethod
    def backward(ctx: Any, do):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        causal, sm_scale, dkdv, dq, gluon_bwd = ctx.args
        if gluon_bwd:
            grads = attention_backward(q, k, v, o, lse, do, None, causal, sm_scale, dkdv, dq)
        else:  # the kernels read FLASHBENCH_GLUON_BWD per call (launch.env_key): the tl dK/dV pass, autotuned
            os.environ["FLASHBENCH_GLUON_BWD"] = "0"
            try:
                grads = attention_backward(q, k, v, o, lse, do, None, causal, sm_scale, dkdv, dq)
            finally:
                os.environ.pop("FLASHBENCH_GLUON_BWD")
        return (*grads, None, None, None, None, None)


def _register(
    name: str, dkdv: dict[str, Any] | None, dq: dict[str, Any] | None, gluon_bwd: bool = True
) -> None:
    def build(case: Case, device: str, stack: Any) -> Any:
        causal, scale = case.causal, case.head_dim**-0.5
        return lambda q, k, v: _ForcedBackward.apply(q, k, v, causal, scale, dkdv, dq, gluon_bwd)

    register(
        name,
        dtypes=("fp16", "bf16", "fp32"),
        gqa=True,
        devices=("cuda",) if dkdv is not None and dkdv.get("kernel") else ("cuda", "cpu"),
        builder=True,
        kernel_config=lambda: {**(last_config() or {}), "bwd": last_bwd_config()},
        description=f"backward study: dK/dV {dkdv or 'autotuned'}, dQ {dq or 'autotuned'}",
    )(build)


for _entry in (*BWD_DKDV_SPACE, *DKDV_OUTSIDE):
    _register(tile_name("bwd-dkdv", _entry), config_dict(_entry), None)
for _entry in (*BWD_DQ_SPACE, *DQ_OUTSIDE):
    _register(tile_name("bwd-dq", _entry), None, config_dict(_entry), gluon_bwd=False)
_register("bwd-tl", None, None, gluon_bwd=False)
for _name, _forced in GLUON_VARIANTS.items():
    _register(_name, _forced, None)

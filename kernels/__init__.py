"""flashbench's bundled Triton attention kernels (installed as `flashbench.kernels`).

    flash_attn(q, k, v, causal=False, sm_scale=None, config=None)           FlashAttention-2 loop order, recompute backward
        (..., q_descale=None, k_descale=None, v_descale=None)               e4m3 q, k, v: FP8 forward (flash_fp8.py)
    flash_attn_stored_p(q, k, v, causal=False, sm_scale=None, config=None)  forward stores P (N x N), backward reads it
    flash_attn_v1(q, k, v, causal=False, sm_scale=None, config=None)        FlashAttention-1 loop order, v2's backward
    flash_decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=True, sm_scale=None,
                 num_splits=None)                                           split-KV decode over a contiguous or paged cache
        (..., k_scale=None, v_scale=None)                                   e4m3 k_cache, v_cache: an FP8 KV cache
    flash_mla_decode(q, kv_cache, cache_seqlens=None, block_table=None, causal=True, sm_scale=None,
                     num_splits=None, head_dim_v=512)                       MLA decode over one latent cache (mla.py)
    flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                      sm_scale=None, window=None, validate=False)           packed documents (varlen.py), with backward

q: [B, H, Nq, D]; k, v: [B, Hkv, Nk, D] (flash_attn_varlen: q [total_q, H, D], k, v [total_k, Hkv, D]); all but
the decodes are autograd functions (flash_decode, flash_mla_decode: forward only). `last_config()` returns the
forward config of the most recent launch of the first three or flash_attn_varlen; launchers raise `KernelUnsupported` (a ValueError) naming what they refuse.
"""

from . import ops  # noqa: F401  (registers the torch.library custom ops that torch.compile traces)
from .api import flash_attn
from .common import SUPPORTED_HEAD_DIMS, KernelUnsupported, last_config
from .decode import flash_decode
from .flash_fp8 import value_layout
from .flash_v1 import flash_attn_v1
from .mla import flash_mla_decode
from .stored_p import flash_attn_stored_p
from .varlen import flash_attn_varlen

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "KernelUnsupported",
    "flash_attn",
    "flash_attn_stored_p",
    "flash_attn_v1",
    "flash_attn_varlen",
    "flash_decode",
    "flash_mla_decode",
    "last_config",
    "value_layout",
]

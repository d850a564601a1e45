"""The op layer: each kernel has an MLX-ops twin with its signature (the CPU path and the kernel's test
oracle); the kernels are `mx.fast.cuda_kernel` / `mx.fast.metal_kernel` built once at import from one body
each, on the backend's prelude (backend.py).

    from pdlib.engine import kernels as K
    K.BACKEND                                   # "cuda", "metal" or "cpu"
    y = K.gemv(x, w_bf16, norm=w_norm, eps=1e-6)   # kernel on a GPU, ops twin on the CPU
"""

from pdlib.engine.kernels.attention import attention_ops, attention_rows, causal_mask, query_rows
from pdlib.engine.kernels.backend import BACKEND
from pdlib.engine.kernels.decode_attention import (
    decode_attention,
    decode_attention_kernel,
    decode_attention_ops,
    stores_kv_in_place,
)
from pdlib.engine.kernels.fence import new_fence, read_after
from pdlib.engine.kernels.flash_prefill import arithmetic as flash_arithmetic
from pdlib.engine.kernels.flash_prefill import enabled as flash_enabled
from pdlib.engine.kernels.flash_prefill import flash_attention, flash_attention_ops
from pdlib.engine.kernels.gemm import bf16_weights as gemm_bf16_weights
from pdlib.engine.kernels.gemm import choice as gemm_choice
from pdlib.engine.kernels.gemm import enabled as gemm_enabled
from pdlib.engine.kernels.gemm import linear_t, tf32x3_matmul, tf32x3_ops
from pdlib.engine.kernels.gemm import sum_choice as gemm_sum_choice
from pdlib.engine.kernels.gemm import variant as gemm_variant
from pdlib.engine.kernels.gemv import gemv, gemv_kernel, gemv_ops, linear
from pdlib.engine.kernels.kv_store import install_kv, install_kv_kernel, store_kv, store_kv_kernel, store_kv_ops
from pdlib.engine.kernels.mailbox import MailboxRegion, TokenMailbox
from pdlib.engine.kernels.mailbox import choice as token_read_choice
from pdlib.engine.kernels.mailbox import region as mailbox_region
from pdlib.engine.kernels.persistent_decode import (
    DecodeWeights,
    decode_persistent,
    decode_persistent_group,
    decode_persistent_group_ops,
    decode_persistent_ops,
)
from pdlib.engine.kernels.qk_rope import enabled as qk_rope_enabled
from pdlib.engine.kernels.qk_rope import qk_rope_store, qk_rope_store_kernel, qk_rope_store_ops
from pdlib.engine.kernels.rmsnorm import rms_norm
from pdlib.engine.kernels.rope import rope_inv_freq, rope_ops, rope_rotate, rope_tables

__all__ = [
    "BACKEND",
    "attention_ops",
    "attention_rows",
    "causal_mask",
    "query_rows",
    "decode_attention",
    "decode_attention_kernel",
    "decode_attention_ops",
    "DecodeWeights",
    "decode_persistent",
    "decode_persistent_ops",
    "decode_persistent_group",
    "decode_persistent_group_ops",
    "flash_arithmetic",
    "flash_attention",
    "flash_attention_ops",
    "flash_enabled",
    "gemm_bf16_weights",
    "gemm_choice",
    "gemm_enabled",
    "gemm_sum_choice",
    "gemm_variant",
    "gemv",
    "gemv_kernel",
    "gemv_ops",
    "linear",
    "linear_t",
    "tf32x3_matmul",
    "tf32x3_ops",
    "new_fence",
    "read_after",
    "rms_norm",
    "rope_inv_freq",
    "rope_ops",
    "rope_rotate",
    "rope_tables",
    "store_kv",
    "store_kv_kernel",
    "store_kv_ops",
    "stores_kv_in_place",
    "install_kv",
    "install_kv_kernel",
    "qk_rope_enabled",
    "qk_rope_store",
    "qk_rope_store_kernel",
    "qk_rope_store_ops",
    "MailboxRegion",
    "TokenMailbox",
    "mailbox_region",
    "token_read_choice",
]

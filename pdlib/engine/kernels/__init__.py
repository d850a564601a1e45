"""The op layer: each op has an MLX-ops twin (the CPU path and the kernels' test oracle) and may have
`mx.fast.cuda_kernel` / `mx.fast.metal_kernel` bodies, built once at import and chosen by backend.

    from pdlib.engine import kernels
    kernels.BACKEND            # "cuda", "metal" or "cpu"
    y = kernels.rms_norm(x, w, eps=1e-6)
"""

import mlx.core as mx

BACKEND = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"

from pdlib.engine.kernels.attention import attention, attention_ops  # noqa: E402
from pdlib.engine.kernels.gemv import gemv_packed, gemv_packed_ops, linear  # noqa: E402
from pdlib.engine.kernels.rmsnorm import rms_norm, rms_norm_ops  # noqa: E402
from pdlib.engine.kernels.rope import rope, rope_inv_freq, rope_ops  # noqa: E402

__all__ = ["BACKEND", "attention", "attention_ops", "gemv_packed", "gemv_packed_ops", "linear",
           "rms_norm", "rms_norm_ops", "rope", "rope_inv_freq", "rope_ops"]

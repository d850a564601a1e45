"""Matrix products. Prefill reads FP32 weights; decode reads losslessly bf16-packed copies and
accumulates in FP32 (half the bytes of the memory-bound decode step, bit-identical results)."""

import mlx.core as mx


def linear(x: mx.array, w: mx.array) -> mx.array:
    """x: (..., D) @ w.T with w: (N, D), FP32."""
    return x @ w.T


def gemv_packed_ops(x: mx.array, w: mx.array) -> mx.array:
    """x: (D,) FP32, w: (N, D) bf16 (or FP32 when packing is off) -> (N,) FP32."""
    return w.astype(mx.float32) @ x


gemv_packed = gemv_packed_ops

"""Rotary embedding, half-split ("non-traditional") layout as in Qwen3.

The angle is computed exactly as MLX's own rope does it on the running backend (FP32 inverse frequencies,
FP32 position times frequency): at 5K positions a float64 table differs from it by ~2e-3, which would eat
the whole 1e-3 validation tolerance. MLX's CPU path uses exp(-i * ln(base) / half); its GPU kernels use
exp2(-(i / half) * log2(base)) on the device, so on a GPU a one-line kernel computes the table the same way
(a host-side exp2 is 1 ulp off for some i, which at position ~2.6K already costs 1.06x the tolerance).
"""

import math

import mlx.core as mx

from pdlib.engine.kernels.backend import kernel_or_none, source

# MLX's own GPU rope kernels compute their frequencies this way, and so does this kernel (one block of HALF threads)
INV_FREQ = source("rope_inv_freq.cu")
_inv_freq_kernel = kernel_or_none("pdlib_rope_inv_freq", ["lb"], ["out"], source=INV_FREQ)


def rope_inv_freq(head_dim: int, *, base: float) -> mx.array:
    """FP32 inverse frequencies, bit-identical to those of MLX's rope on this backend (the reference's)."""
    half = head_dim // 2
    if _inv_freq_kernel is None:
        return mx.exp(-mx.arange(half, dtype=mx.float32) * (math.log(base) / half))
    (out,) = _inv_freq_kernel(
        inputs=[mx.array([math.log2(base)], mx.float32)],
        template=[("HALF", half)],
        grid=(half, 1, 1),
        threadgroup=(half, 1, 1),
        output_shapes=[(half,)],
        output_dtypes=[mx.float32],
    )
    return out


def rope_tables(positions: mx.array, inv_freq: mx.array) -> tuple[mx.array, mx.array]:
    """cos and sin (T, Dh/2) of the T int32 positions: a step computes them once for all its layers."""
    angle = positions.astype(mx.float32)[:, None] * inv_freq[None]
    return mx.cos(angle), mx.sin(angle)


def rope_rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """x: (..., T, Dh) rotated by the tables of its T positions."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_ops(x: mx.array, *, positions: mx.array, inv_freq: mx.array) -> mx.array:
    """x: (..., T, Dh) at the T int32 positions."""
    return rope_rotate(x, *rope_tables(positions, inv_freq))

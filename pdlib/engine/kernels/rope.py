"""Rotary embedding, half-split ("non-traditional") layout as in Qwen3.

The angle is computed exactly as MLX's own rope does it on the running backend (FP32 inverse frequencies,
FP32 position times frequency): at 5K positions a float64 table differs from it by ~2e-3, which would eat
the whole 1e-3 validation tolerance. MLX's CPU path uses exp(-i * ln(base) / half); its GPU kernels use
exp2(-(i / half) * log2(base)).
"""

import math

import mlx.core as mx
import numpy as np

from pdlib.engine.kernels.backend import BACKEND


def rope_inv_freq(head_dim: int, *, base: float) -> mx.array:
    half = head_dim // 2
    if BACKEND == "cpu":
        return mx.exp(-mx.arange(half, dtype=mx.float32) * (math.log(base) / half))
    d = np.arange(half, dtype=np.float32) / np.float32(half)
    return mx.array(np.exp2(-d * np.float32(math.log2(base))).astype(np.float32))


def rope_ops(x: mx.array, *, start: int, inv_freq: mx.array) -> mx.array:
    """x: (..., T, Dh) at positions start .. start+T-1."""
    T, half = x.shape[-2], x.shape[-1] // 2
    angle = mx.arange(start, start + T, dtype=mx.float32)[:, None] * inv_freq[None]
    cos, sin = mx.cos(angle), mx.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


rope = rope_ops

"""RMSNorm over the last axis, FP32: x * rsqrt(mean(x^2) + eps) * w. No kernel of its own: decode fuses it into
gemv and decode_attention, whose ops twins call this."""

import mlx.core as mx


def rms_norm(x: mx.array, w: mx.array, *, eps: float) -> mx.array:
    return x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps) * w

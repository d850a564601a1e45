"""Causal GQA attention of T new queries over a request's KV cache, FP32 with a max-subtracted softmax."""

import mlx.core as mx


def attention_ops(q: mx.array, k: mx.array, v: mx.array, *, start: int, scale: float) -> mx.array:
    """q: (Hq, T, Dh) at positions start .. start+T-1; k, v: (Hkv, S, Dh) with S = start + T.
    Returns (Hq, T, Dh)."""
    Hq, T, Dh = q.shape
    Hkv, S, _ = k.shape
    qg = q.reshape(Hkv, Hq // Hkv, T, Dh)
    scores = (qg * scale) @ k[:, None].swapaxes(-1, -2)          # (Hkv, rep, T, S)
    if T > 1:
        causal = mx.arange(start, start + T)[:, None] >= mx.arange(S)[None]
        scores = mx.where(causal, scores, mx.array(-mx.inf, mx.float32))
    scores = mx.exp(scores - mx.max(scores, axis=-1, keepdims=True))
    probs = scores / mx.sum(scores, axis=-1, keepdims=True)
    return (probs @ v[:, None]).reshape(Hq, T, Dh)


attention = attention_ops

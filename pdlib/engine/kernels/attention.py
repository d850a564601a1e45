"""Causal GQA attention of T new queries over a request's whole KV cache, FP32, max-subtracted softmax.

The cache has static shape (Hkv, capacity, Dh); `causal_mask` says which slots each query may see (those at
or before its own position), so stale entries past the request's length are never read into a result.
"""

import mlx.core as mx


def causal_mask(positions: mx.array, capacity: int) -> mx.array:
    """(T, capacity) bool: key slot j is visible to the query at positions[t] iff j <= positions[t]."""
    return mx.arange(capacity, dtype=mx.int32)[None] <= positions[:, None]


def attention_ops(q: mx.array, k: mx.array, v: mx.array, *, mask: mx.array, scale: float) -> mx.array:
    """q: (Hq, T, Dh); k, v: (Hkv, S, Dh); mask: (T, S) -> (Hq, T, Dh). The REP query heads that share a KV
    head are stacked along the rows, so each product is one plain batched matmul (no broadcast K/V copy)."""
    Hq, T, Dh = q.shape
    Hkv, S = k.shape[0], k.shape[1]
    rep = Hq // Hkv
    scores = (q.reshape(Hkv, rep * T, Dh) * scale) @ k.swapaxes(-1, -2)  # (Hkv, rep T, S)
    scores = mx.where(mask, scores.reshape(Hkv, rep, T, S), mx.array(-mx.inf, mx.float32))
    probs = mx.softmax(scores, axis=-1, precise=True).reshape(Hkv, rep * T, S)
    return (probs @ v).reshape(Hq, T, Dh)


def query_rows(mask: mx.array, rep: int) -> mx.array:
    """A (T, S) causal mask as the (rep * T, S) mask of attention_rows' stacked query rows."""
    return mx.tile(mask, (rep, 1))


def attention_rows(q: mx.array, k: mx.array, v: mx.array, *, mask_rows: mx.array, scale: float) -> mx.array:
    """attention_ops with the mask already stacked (query_rows): nothing here depends on S, the cache prefix's
    length, so one shapeless compiled graph serves every chunk of a prompt."""
    Hq, T, Dh = q.shape
    Hkv = k.shape[0]
    rep = Hq // Hkv
    scores = (q.reshape(Hkv, rep * T, Dh) * scale) @ k.swapaxes(-1, -2)  # (Hkv, rep T, S)
    probs = mx.softmax(mx.where(mask_rows, scores, mx.array(-mx.inf, mx.float32)), axis=-1, precise=True)
    return (probs @ v).reshape(Hq, T, Dh)

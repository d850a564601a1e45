"""Decode attention for one new token, fused with what feeds it: q/k RMSNorm, RoPE at the token's position
and the new K/V slot. FP32 throughout; GQA (REP query heads share a KV head).

    o, k, v, written = decode_attention(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, ...)

`qkv` is the raw q|k|v projection (Hq + 2 Hkv heads of Dh). The layer's caches are (Hkv, cap, Dh); positions
< pos are read from them, position pos from the new k/v. The kernel stores the new k/v at slot pos *in
place*, into the cache it was given as an input: MLX has no in-place output for custom kernels, and the
functional alternative (`slice_update`) cannot reuse the buffer while other kernels of the step still hold
it, so it copied the cache every token (1 GB per step at 4K context with one array for all layers).
Nothing else reads slot pos in the same step (this kernel takes it from registers); the kernel takes the
layer's write fence and outputs the next one (fence.py), so the next write and every read of the cache depend
on this kernel through a buffer it outputs; the validation gate checks every slot written. The ops twin
returns k and v for the caller to store, and the fence unchanged.
Split-K ("flash decoding"): block (h, c) handles KV head h over keys [c*CHUNK, (c+1)*CHUNK) with an online
softmax; a second kernel merges the chunks. Shapes are static (the cache capacity), so a decode step
compiles to one graph; chunks past pos exit at once.
"""

import mlx.core as mx

from pdlib.engine.kernels.attention import causal_mask
from pdlib.engine.kernels.backend import float_bits, kernel_or_none, source
from pdlib.engine.kernels.rmsnorm import rms_norm

CHUNK, THREADS, GROUP = 128, 256, 8  # keys per block, threads per block (8 warps), keys per warp load group


def decode_attention_ops(
    qkv,
    q_norm,
    k_norm,
    inv_freq,
    pos,
    k_cache,
    v_cache,
    written=None,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    poison: bool = False,
):
    """The oracle, with the same static shapes: attends over the whole capacity, masking positions > pos.
    -> (o, k, v): it writes no cache, so it needs no fence (`written`) and has nothing to poison."""
    Hkv, cap, Dh = k_cache.shape
    q = qkv[: heads * Dh].reshape(heads, Dh)
    k = qkv[heads * Dh : (heads + kv_heads) * Dh].reshape(kv_heads, Dh)
    v = qkv[(heads + kv_heads) * Dh :].reshape(kv_heads, Dh)

    def norm_rope(x, w):
        x = rms_norm(x, w, eps=eps)
        angle = pos.astype(mx.float32) * inv_freq
        cos, sin = mx.cos(angle), mx.sin(angle)
        x1, x2 = x[:, : Dh // 2], x[:, Dh // 2 :]
        return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    q, k = norm_rope(q, q_norm), norm_rope(k, k_norm)
    at_pos = (mx.arange(cap) == pos)[None, :, None]
    keys = mx.where(at_pos, k[:, None, :], k_cache)  # (Hkv, cap, Dh)
    values = mx.where(at_pos, v[:, None, :], v_cache)
    qg = q.reshape(kv_heads, heads // kv_heads, Dh) * (Dh**-0.5)
    scores = qg @ keys.swapaxes(-1, -2)  # (Hkv, rep, cap)
    scores = mx.where(causal_mask(pos, cap)[None], scores, -mx.inf)
    p = mx.exp(scores - mx.max(scores, axis=-1, keepdims=True))
    o = (p / mx.sum(p, axis=-1, keepdims=True)) @ values  # (Hkv, rep, Dh)
    return o.reshape(heads * Dh), k, v


QK_NORM_ROPE = source("qk_norm_rope.cuh")  # the persistent kernel's too
PARTIAL = source("decode_attention_partial.cu")

REDUCE = source("decode_attention_reduce.cu")

_partial = kernel_or_none(
    "pdlib_decode_attn_partial",
    ["qkv", "qn", "knw", "inv_freq", "pos", "kc", "vc", "after"],
    ["part_m", "part_l", "part_o", "written"],
    source=PARTIAL,
    header=QK_NORM_ROPE,
)
_reduce = kernel_or_none("pdlib_decode_attn_reduce", ["part_m", "part_l", "part_o", "pos"], ["o"], source=REDUCE)


def decode_attention_kernel(
    qkv,
    q_norm,
    k_norm,
    inv_freq,
    pos,
    k_cache,
    v_cache,
    written,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    poison: bool = False,
):
    """-> (o, the next fence); stores k and v at slot pos of k_cache / v_cache in place."""
    Hkv, cap, Dh = k_cache.shape
    nc = -(-cap // CHUNK)
    part_m, part_l, part_o, written = _partial(
        inputs=[qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written],
        template=[
            ("HQ", heads),
            ("HKV", kv_heads),
            ("DH", Dh),
            ("CAP", cap),
            ("NC", nc),
            ("CHUNK", CHUNK),
            ("THREADS", THREADS),
            ("GROUP", GROUP),
            ("EPS_BITS", float_bits(eps)),
            ("SCALE_BITS", float_bits(Dh**-0.5)),
        ],
        grid=(kv_heads * nc * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(heads * nc,), (heads * nc,), (heads * nc * Dh,), written.shape],
        output_dtypes=[mx.float32] * 3 + [written.dtype],
        init_value=float("nan") if poison else None,
    )
    (o,) = _reduce(
        inputs=[part_m, part_l, part_o, pos],
        template=[("NC", nc), ("DH", Dh), ("CHUNK", CHUNK)],
        grid=(heads * Dh, 1, 1),
        threadgroup=(Dh, 1, 1),
        output_shapes=[(heads * Dh,)],
        output_dtypes=[mx.float32],
        init_value=float("nan") if poison else None,
    )
    return o, written


def stores_kv_in_place(head_dim: int) -> bool:
    """Whether `decode_attention` runs the kernel (which stores the new k/v itself) for this head size."""
    return _partial is not None and head_dim == 128


def decode_attention(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw):
    """-> (o, k, v, written). The kernel on a GPU backend for head_dim 128 (one thread per dim, a float4 per
    lane), which stores k and v itself, returns None for them and the next fence; the ops twin otherwise (the
    CPU, or other head sizes such as the `tiny` preset's), whose k and v the caller stores."""
    if stores_kv_in_place(k_cache.shape[-1]):
        o, written = decode_attention_kernel(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw)
        return o, None, None, written
    return (*decode_attention_ops(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw), written)

"""Decode attention for the R decode rows of one step (a serving decode round, or decodes beside prompt chunks),
each at its own position in its own cache: one launch pair a layer for all of them instead of one a row.

    o, written = decode_rows_kernel(qkv, meta, layer, q_norm, k_norm, inv_freq, pool_k, pool_v, after, ...)
    o, ks, vs = decode_rows_ops(qkv, rows, q_norm, k_norm, inv_freq, caches, ...)

The kernel needs the rows' caches in one buffer: a pool (cache.KVPool), K and V each (slots, L, Hkv, cap, Dh),
whose slots the requests' caches are views of. `meta` (R, 3) int32 gives each row (its row of the step's raw
q|k|v projection, its cache's slot, its position); `layer` int32, word 0 the layer (16 bytes: MLX keeps
arrays of 8 bytes or less in managed memory). Each block is the single-row kernel's block
(decode_attention_partial.cu) with a row index, so a row's output and K/V slot are bit for bit what that kernel
gives it (check-kernels compares them exactly); it stores every row's new K/V in place. One fence for all
rows: the launch takes one that depends on every row's cache's fence and outputs the next, which all their
caches then share. o comes back (Hq, R, Dh) as the other attention paths give it, a view of the (R, Hq, Dh)
rows the kernel writes, which o_proj then reads as they lie (no copy).
The ops twin is the single-row twin on each row: the rows' k and v come back for the caller to store.
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import float_bits, kernel_or_none, source
from pdlib.engine.kernels.decode_attention import CHUNK, GROUP, QK_NORM_ROPE, THREADS, decode_attention_ops
from pdlib.engine.kernels.fence import FENCE_WORDS

PARTIAL = source("decode_attention_rows.cu")
REDUCE = source("decode_attention_rows_reduce.cu")

INPUTS = ["qkv", "meta", "layer", "qn", "knw", "inv_freq", "kc", "vc", "after"]
_partial = kernel_or_none(
    "pdlib_decode_rows_partial",
    INPUTS,
    ["part_m", "part_l", "part_o", "written"],
    source=PARTIAL,
    header=QK_NORM_ROPE,
)
_reduce = kernel_or_none("pdlib_decode_rows_reduce", ["part_m", "part_l", "part_o", "meta"], ["o"], source=REDUCE)


def available(head_dim: int) -> bool:
    """Whether the rows kernel runs here (a GPU backend, head_dim 128, as the single-row kernel)."""
    return _partial is not None and head_dim == 128


def decode_rows_kernel(
    qkv,
    meta,
    layer,
    q_norm,
    k_norm,
    inv_freq,
    pool_k,
    pool_v,
    after,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    poison: bool = False,
):
    """qkv: the step's raw projection (T, Hq + 2 Hkv, Dh) or flat; meta (R, 3) int32; layer: word 0 the layer;
    pool_k, pool_v (slots, L, Hkv, cap, Dh). -> (o (Hq, R, Dh), the next fence)."""
    _, layers, Hkv, cap, Dh = pool_k.shape
    rows, nc = meta.shape[0], -(-cap // CHUNK)
    part_m, part_l, part_o, written = _partial(
        inputs=[qkv, meta, layer, q_norm, k_norm, inv_freq, pool_k, pool_v, after],
        template=[
            ("HQ", heads),
            ("HKV", kv_heads),
            ("DH", Dh),
            ("CAP", cap),
            ("LAYERS", layers),
            ("NC", nc),
            ("CHUNK", CHUNK),
            ("THREADS", THREADS),
            ("GROUP", GROUP),
            ("EPS_BITS", float_bits(eps)),
            ("SCALE_BITS", float_bits(Dh**-0.5)),
        ],
        grid=(rows * kv_heads * nc * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(rows * heads * nc,), (rows * heads * nc,), (rows * heads * nc * Dh,), (FENCE_WORDS,)],
        output_dtypes=[mx.float32] * 3 + [after.dtype],
        init_value=float("nan") if poison else None,
    )
    (o,) = _reduce(
        inputs=[part_m, part_l, part_o, meta],
        template=[("HQ", heads), ("NC", nc), ("DH", Dh), ("CHUNK", CHUNK)],
        grid=(rows * heads * Dh, 1, 1),
        threadgroup=(Dh, 1, 1),
        output_shapes=[(rows, heads, Dh)],
        output_dtypes=[mx.float32],
        init_value=float("nan") if poison else None,
    )
    return o.swapaxes(0, 1), written  # a view: (R, Hq, Dh) rows as o_proj reads them


def decode_rows_ops(qkv, rows, q_norm, k_norm, inv_freq, caches, *, heads: int, kv_heads: int, eps: float):
    """The twin: qkv (T, Hq + 2 Hkv, Dh); rows [(row of qkv, position)]; caches [(k, v)] of the layer, (Hkv, cap,
    Dh) each, one per row. -> (o (Hq, R, Dh), each row's new k and v (Hkv, Dh) for the caller to store)."""
    outs, ks, vs = [], [], []
    for (r, pos), (kc, vc) in zip(rows, caches, strict=True):
        o, k, v = decode_attention_ops(
            qkv[r].reshape(-1),
            q_norm,
            k_norm,
            inv_freq,
            mx.array([pos], mx.int32),
            kc,
            vc,
            heads=heads,
            kv_heads=kv_heads,
            eps=eps,
        )
        outs.append(o.reshape(heads, 1, -1))
        ks.append(k)
        vs.append(v)
    return mx.concatenate(outs, axis=1), ks, vs


def joined_fence(fences: list[mx.array]) -> mx.array:
    """One fence that depends on every one of `fences`: the one they share, or their least counter word by word
    (so a zero, a poisoned writer's, carries on into every read after the launch)."""
    if all(f is fences[0] for f in fences):
        return fences[0]
    return mx.min(mx.stack(fences), axis=0)

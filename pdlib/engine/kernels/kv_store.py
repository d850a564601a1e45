"""Store a prefill chunk's K and V into a layer's cache, and hand back the keys and values attention reads.

    k_cache, v_cache, keys, values = store_kv(k, v, k_cache, v_cache, positions=positions, start=start)

k, v: (Hkv, T, Dh) at the T consecutive positions start.. (an int32 device array, and its first value);
keys, values: (Hkv, start + T, Dh), the cache's first start slots followed by k, v.

On a GPU one kernel writes the new slots into the cache in place (why: decode_attention.py; a functional
update of a cache that other kernels still read copied all of it, most of a 128-token chunk's time) and
writes keys/values as fresh outputs. Attention must read those outputs, not the cache: MLX orders kernels in
a CUDA graph only through the arrays they output, so a read of the cache could run before the store (the
validation gate caught exactly that). The returned caches are tied to the kernel with `mx.depends`, so
evaluating them runs it; later chunks and decode steps are later graphs. On the CPU it is the functional
`slice_update`, whose copy is one layer's cache, and keys/values are views of the result.
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import kernel_or_none

CUDA_SOURCE = r"""
    // one thread per float4 of keys (and of values): (h, s, d4) over HKV x S x DH/4, S = start + T
    const int start = pos[0], S = start + T;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)HKV * S * (DH / 4)) return;
    const int d4 = i % (DH / 4), s = (i / (DH / 4)) % S, h = i / ((size_t)(DH / 4) * S);
    const size_t slot = ((size_t)h * CAP + s) * (DH / 4) + d4;
    float4* K4 = reinterpret_cast<float4*>(const_cast<float*>(kc));
    float4* V4 = reinterpret_cast<float4*>(const_cast<float*>(vc));
    float4 kv, vv;
    if (s < start) { kv = K4[slot]; vv = V4[slot]; }
    else {
        const size_t src = ((size_t)h * T + (s - start)) * (DH / 4) + d4;
        kv = reinterpret_cast<const float4*>(k)[src]; vv = reinterpret_cast<const float4*>(v)[src];
        K4[slot] = kv; V4[slot] = vv;
    }
    reinterpret_cast<float4*>(keys)[i] = kv;
    reinterpret_cast<float4*>(values)[i] = vv;
"""

METAL_SOURCE = r"""
    const int start = pos[0], S = start + T;
    const size_t i = thread_position_in_grid.x;
    if (i >= (size_t)HKV * S * (DH / 4)) return;
    const int d4 = i % (DH / 4), s = (i / (DH / 4)) % S, h = i / ((size_t)(DH / 4) * S);
    const size_t slot = ((size_t)h * CAP + s) * (DH / 4) + d4;
    device float4* K4 = reinterpret_cast<device float4*>(const_cast<device float*>(kc));
    device float4* V4 = reinterpret_cast<device float4*>(const_cast<device float*>(vc));
    float4 kv, vv;
    if (s < start) { kv = K4[slot]; vv = V4[slot]; }
    else {
        const size_t src = ((size_t)h * T + (s - start)) * (DH / 4) + d4;
        kv = reinterpret_cast<const device float4*>(k)[src]; vv = reinterpret_cast<const device float4*>(v)[src];
        K4[slot] = kv; V4[slot] = vv;
    }
    reinterpret_cast<device float4*>(keys)[i] = kv;
    reinterpret_cast<device float4*>(values)[i] = vv;
"""

_kernel = kernel_or_none("pdlib_kv_store", ["k", "v", "pos", "kc", "vc"], ["keys", "values"],
                         cuda_source=CUDA_SOURCE, metal_source=METAL_SOURCE)


def store_kv_ops(k, v, k_cache, v_cache, *, start: int):
    k_cache = mx.slice_update(k_cache, k, mx.array(start), axes=(1,))
    v_cache = mx.slice_update(v_cache, v, mx.array(start), axes=(1,))
    stop = start + k.shape[1]
    return k_cache, v_cache, k_cache[:, :stop], v_cache[:, :stop]


def store_kv_kernel(k, v, k_cache, v_cache, *, positions: mx.array, start: int):
    """`positions` carries start to the kernel (a template value would compile one kernel per chunk);
    the host's `start` only sizes the outputs."""
    Hkv, T, Dh = k.shape
    S = start + T
    n = Hkv * S * Dh // 4
    keys, values = _kernel(inputs=[k, v, positions, k_cache, v_cache],
                           template=[("T", T), ("HKV", Hkv), ("DH", Dh), ("CAP", k_cache.shape[1])],
                           grid=(-(-n // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
                           output_shapes=[(Hkv, S, Dh), (Hkv, S, Dh)], output_dtypes=[mx.float32, mx.float32])
    k_cache, v_cache = mx.depends([k_cache, v_cache], [keys, values])
    return k_cache, v_cache, keys, values


def store_kv(k, v, k_cache, v_cache, *, positions: mx.array, start: int):
    """The kernel on a GPU backend (head_dim a multiple of 4); `slice_update` otherwise."""
    if _kernel is not None and k.shape[-1] % 4 == 0:
        return store_kv_kernel(k, v, k_cache, v_cache, positions=positions, start=start)
    return store_kv_ops(k, v, k_cache, v_cache, start=start)

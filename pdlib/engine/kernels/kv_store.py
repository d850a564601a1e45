"""Store a prefill chunk's K and V into a layer's cache.

    k_cache, v_cache = store_kv(k, v, k_cache, v_cache, positions=positions, start=start)

k, v: (Hkv, T, Dh) at the T consecutive positions start.. (an int32 device array, and its first value).

On a GPU a kernel writes the slots in place (the reason is in decode_attention.py: a functional update of a
cache that other kernels still read copies all of it, which was most of a 128-token chunk's time) and the
cache arrays come back tied to it with `mx.depends`, so whatever reads them runs after the store. On the
CPU it is the functional `slice_update`, whose copy is one layer's cache.
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import kernel_or_none

CUDA_SOURCE = r"""
    // one thread per float4 of k (and of v): (h, t, d4) over HKV x T x DH/4
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * HKV * (DH / 4)) return;
    const int d4 = i % (DH / 4), t = (i / (DH / 4)) % T, h = i / ((DH / 4) * T);
    const size_t dst = ((size_t)h * CAP + pos[t]) * (DH / 4) + d4;
    reinterpret_cast<float4*>(const_cast<float*>(kc))[dst] = reinterpret_cast<const float4*>(k)[i];
    reinterpret_cast<float4*>(const_cast<float*>(vc))[dst] = reinterpret_cast<const float4*>(v)[i];
    if (i == 0) done[0] = 1;
"""

METAL_SOURCE = r"""
    const uint i = thread_position_in_grid.x;
    if (i >= (uint)T * HKV * (DH / 4)) return;
    const int d4 = i % (DH / 4), t = (i / (DH / 4)) % T, h = i / ((DH / 4) * T);
    const size_t dst = ((size_t)h * CAP + pos[t]) * (DH / 4) + d4;
    reinterpret_cast<device float4*>(const_cast<device float*>(kc))[dst] = reinterpret_cast<const device float4*>(k)[i];
    reinterpret_cast<device float4*>(const_cast<device float*>(vc))[dst] = reinterpret_cast<const device float4*>(v)[i];
    if (i == 0) done[0] = 1;
"""

_kernel = kernel_or_none("pdlib_kv_store", ["k", "v", "pos", "kc", "vc"], ["done"], cuda_source=CUDA_SOURCE,
                         metal_source=METAL_SOURCE)


def store_kv_ops(k, v, k_cache, v_cache, *, start: int):
    return (mx.slice_update(k_cache, k, mx.array(start), axes=(1,)),
            mx.slice_update(v_cache, v, mx.array(start), axes=(1,)))


def store_kv_kernel(k, v, k_cache, v_cache, *, positions: mx.array):
    Hkv, T, Dh = k.shape
    n = T * Hkv * Dh // 4
    (done,) = _kernel(inputs=[k, v, positions, k_cache, v_cache],
                      template=[("T", T), ("HKV", Hkv), ("DH", Dh), ("CAP", k_cache.shape[1])],
                      grid=(-(-n // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
                      output_shapes=[(1,)], output_dtypes=[mx.int32])
    return tuple(mx.depends([k_cache, v_cache], [done]))


def store_kv(k, v, k_cache, v_cache, *, positions: mx.array, start: int):
    """The kernel on a GPU backend (head_dim a multiple of 4); `slice_update` otherwise."""
    if _kernel is not None and k.shape[-1] % 4 == 0:
        return store_kv_kernel(k, v, k_cache, v_cache, positions=positions)
    return store_kv_ops(k, v, k_cache, v_cache, start=start)

"""Store a prefill chunk's K and V into a layer's cache, and hand back the keys and values attention reads.

    k_cache, v_cache, written, keys, values = store_kv(k, v, k_cache, v_cache, written, positions=positions,
                                                       start=start)

k, v: (Hkv, T, Dh) at the T consecutive positions start.. (an int32 device array, and its first value);
keys, values: (Hkv, start + T, Dh), the cache's first start slots followed by k, v; `written`: the layer's
write fence (fence.py), taken as an input and returned advanced.

On a GPU one kernel writes the new slots into the cache in place (why: decode_attention.py; a functional
update of a cache that other kernels still read copied all of it, most of a 128-token chunk's time) and
writes keys/values and the new fence as fresh outputs. MLX orders the kernels of a CUDA graph only through
the buffers they output, and the cache is not one of them: MLX's ops attention therefore reads keys/values,
and anything else reads the cache through the fence this kernel outputs (`fence.read_after`, or a kernel
that takes the fence as an input, as the flash prefill attention does).
On the CPU it is the functional `slice_update`, whose copy is one layer's cache, keys/values are views of the
result, and the fence is returned as it came.

    k_cache, v_cache, written = install_kv(k, v, k_cache, v_cache, written, positions=positions, start=start)

writes new rows the same way, handing nothing back: a prefix computed elsewhere (disagg), or a chunk whose
attention reads the cache itself (flash_prefill.py).
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import kernel_or_none, source
from pdlib.engine.kernels.decode_attention import stores_kv_in_place

SOURCE = source("kv_store.cu")

INSTALL = source("kv_install.cu")

_kernel = kernel_or_none(
    "pdlib_kv_store", ["k", "v", "pos", "kc", "vc", "after"], ["keys", "values", "written"], source=SOURCE
)
_install = kernel_or_none("pdlib_kv_install", ["k", "v", "pos", "kc", "vc", "after"], ["written"], source=INSTALL)


def store_kv_ops(k, v, k_cache, v_cache, written, *, positions: mx.array | None = None, start: int):
    """`slice_update` at the host's `start` (so `positions` goes unused); returns the fence as it came."""
    k_cache = mx.slice_update(k_cache, k, mx.array(start), axes=(1,))
    v_cache = mx.slice_update(v_cache, v, mx.array(start), axes=(1,))
    stop = start + k.shape[1]
    return k_cache, v_cache, written, k_cache[:, :stop], v_cache[:, :stop]


def store_kv_kernel(k, v, k_cache, v_cache, written, *, positions: mx.array, start: int):
    """`positions` carries start to the kernel, and k's shape the length (a template value would compile one
    kernel per chunk); the host's `start` only sizes the outputs. The caches come back as they went in: written
    in place."""
    Hkv, T, Dh = k.shape
    S = start + T
    n = Hkv * S * Dh // 4
    keys, values, written = _kernel(
        inputs=[k, v, positions, k_cache, v_cache, written],
        template=[("HKV", Hkv), ("DH", Dh), ("CAP", k_cache.shape[1])],
        grid=(-(-n // 256) * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(Hkv, S, Dh), (Hkv, S, Dh), written.shape],
        output_dtypes=[mx.float32, mx.float32, written.dtype],
    )
    return k_cache, v_cache, written, keys, values


def store_kv(k, v, k_cache, v_cache, written, *, positions: mx.array, start: int):
    """The kernel where decode attention also writes in place (a GPU, head_dim 128), so a cache is written
    in place by every writer or by none (the functional path's readers use no fence); `slice_update`
    otherwise."""
    if stores_kv_in_place(k.shape[-1]):
        return store_kv_kernel(k, v, k_cache, v_cache, written, positions=positions, start=start)
    return store_kv_ops(k, v, k_cache, v_cache, written, positions=positions, start=start)


def install_kv_kernel(k, v, k_cache, v_cache, written, *, positions: mx.array, start: int):
    """The new rows written in place at positions[0].. (the host's `start` goes unused); the caches come back
    as they went in, with the next fence."""
    Hkv, T, Dh = k.shape
    if T == 0:  # nothing to write (a launch of no threads is an error)
        return k_cache, v_cache, written
    n = Hkv * T * Dh // 4
    (written,) = _install(
        inputs=[k, v, positions, k_cache, v_cache, written],
        template=[("HKV", Hkv), ("DH", Dh), ("CAP", k_cache.shape[1])],
        grid=(-(-n // 256) * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[written.shape],
        output_dtypes=[written.dtype],
    )
    return k_cache, v_cache, written


def install_kv(k, v, k_cache, v_cache, written, *, positions: mx.array, start: int):
    """store_kv without the keys/values for attention: (k_cache, v_cache, written), in place where store_kv is."""
    if stores_kv_in_place(k.shape[-1]):
        return install_kv_kernel(k, v, k_cache, v_cache, written, positions=positions, start=start)
    return store_kv_ops(k, v, k_cache, v_cache, written, positions=positions, start=start)[:3]

"""Write fences: the true data dependency behind every in-place write to a KV cache.

    written = new_fence()                                    # one per request's cache, beside its K and V
    ..., written = kernel(..., k_cache, v_cache, written)    # a kernel that writes the cache in place
    k = read_after(k_cache[:, start:stop], written)          # any other reader

MLX custom kernels cannot output into an input, so a kernel that writes the cache does so through its input
pointer, and MLX does not know the cache changed. On CUDA it orders the kernels of a graph only through the
buffers they output (and `mx.depends` adds no such edge), so a reader of the cache could run before the
write, or, across two streams, on another queue entirely. Every writer therefore takes the cache's fence as
an input and outputs the next one (a counter: after[0] + 1), so writes to one cache, whatever their layer,
are a chain of real dependencies; readers go through `read_after`, which consumes the latest fence. A cache
is written in place by all its writers or by none (kv_store.store_kv), so the functional path needs no
fence. Writes wait for nothing they would overwrite: only slots no earlier step reads are written, and a
reset request's slots are rewritten only after its reads were evaluated (Engine.kv says so). The fence is
16 bytes: MLX keeps arrays of 8 bytes or less in managed memory, where a kernel's access is slow.
"""

import mlx.core as mx

FENCE_WORDS = 4


def new_fence() -> mx.array:
    """A fresh cache's fence: 1 (its zeros count as the first write)."""
    return mx.ones((FENCE_WORDS,), mx.uint32)


def read_after(x: mx.array, written: mx.array) -> mx.array:
    """x (a view of a cache), ordered after the write that produced `written`. A zero counter (a fence whose
    writer was poisoned, or never ran) turns the read into NaN, which no check passes."""
    return mx.where(written[0] > 0, x, mx.array(float("nan"), x.dtype))

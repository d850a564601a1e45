"""Per-request KV cache, preallocated for prompt + outputs: for each layer, K and V of shape (Hkv, capacity, Dh),
FP32.

A logical reset only rewinds `length` and keeps the allocation (and its stale contents, which nothing may
read: attention only sees positions < length, or masks the rest); a full reset allocates fresh buffers.
One array per layer: on a GPU the kernels write new slots into them in place, and on the CPU a functional
update copies one layer's cache rather than every layer's.
"""

import mlx.core as mx


class KVCache:
    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, capacity: int):
        self.shape = (layers, kv_heads, capacity, head_dim)
        self.allocations = 0
        self.allocate()

    @property
    def capacity(self) -> int:
        return self.shape[2]

    def allocate(self) -> None:
        layers, *per_layer = self.shape
        self.k = [mx.zeros(per_layer, mx.float32) for _ in range(layers)]
        self.v = [mx.zeros(per_layer, mx.float32) for _ in range(layers)]
        mx.eval(self.k, self.v)
        self.length = 0
        self.next_pos = None  # (host int, device int32 array) of the next decode position
        self.allocations += 1

    def reset(self, *, logical: bool) -> None:
        if logical:
            self.length, self.next_pos = 0, None
        else:
            self.k = self.v = None  # drop the old buffers before allocating new ones
            self.allocate()

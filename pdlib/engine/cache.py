"""Per-request KV cache, preallocated for prompt + outputs: for each layer, K and V of shape (Hkv, capacity, Dh),
FP32, and the layer's write fence (kernels/fence.py). The cache is the one owner of a request's progress:
`length` (positions written), from which the engine derives how much of the prompt is prefilled and where the
next decode goes.

A logical reset only rewinds `length` and keeps the allocation (and its stale contents, which nothing may
read: attention only sees positions < length, or masks the rest); a full reset allocates fresh buffers.
One array per layer: on a GPU the kernels write new slots into them in place, and on the CPU a functional
update copies one layer's cache rather than every layer's.
"""

import mlx.core as mx

from pdlib.engine.kernels import new_fence, read_after, store_kv


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
        self.written = [new_fence() for _ in range(layers)]
        mx.eval(self.k, self.v, self.written)
        self._length = 0
        self._pos = None  # the device int32 array holding position `length`, kept for the next decode
        self.allocations += 1

    @property
    def length(self) -> int:
        return self._length

    def advance(self, n: int, *, next_pos: mx.array | None = None) -> None:
        """n more positions written; `next_pos`, when given, already holds the new length on the device."""
        if self._length + n > self.capacity:
            raise ValueError(f"KV cache overflow: {self._length} + {n} positions exceed capacity {self.capacity}")
        self._length += n
        self._pos = next_pos

    def position(self) -> mx.array:
        """`length` as a device int32 array (1,): decode steps pass it on from one step to the next, since a
        host-written scalar per step makes every kernel that reads it fault on MLX's managed memory."""
        if self._pos is None:
            self._pos = mx.array([self._length], mx.int32)
        return self._pos

    def store(self, layer: int, k: mx.array, v: mx.array, *, positions: mx.array, start: int):
        """Write a prefill chunk's k, v (Hkv, T, Dh) at positions start..; returns the (Hkv, start + T, Dh) keys
        and values attention reads. `advance` follows once every layer is stored."""
        self.k[layer], self.v[layer], self.written[layer], keys, values = store_kv(
            k, v, self.k[layer], self.v[layer], self.written[layer], positions=positions, start=start)
        return keys, values

    def store_decoded(self, ks: list, vs: list, written: list, *, next_pos: mx.array) -> None:
        """After a decode step: the new fences, and the new rows (Hkv, 1, Dh) where the step's kernels did not
        store them themselves (empty lists when they did); then one position more."""
        for i, (k, v) in enumerate(zip(ks, vs)):
            self.k[i] = mx.slice_update(self.k[i], k, self.position(), axes=(1,))
            self.v[i] = mx.slice_update(self.v[i], v, self.position(), axes=(1,))
        self.written = list(written)
        self.advance(1, next_pos=next_pos)

    def install(self, keys: list, values: list) -> None:
        """A prefix computed elsewhere (disagg: received from the prefill worker): per layer (Hkv, T, Dh) K and
        V written at positions [length, length + T), then T positions more. A functional update, so every later
        read or in-place write of the layer's buffer depends on it."""
        start, n = self._length, keys[0].shape[1]
        if start + n > self.capacity:
            raise ValueError(f"KV cache overflow: {start} + {n} positions exceed capacity {self.capacity}")
        at = mx.array([start])  # one index for every layer (MLX keeps tiny arrays in managed memory)
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.k[i] = mx.slice_update(self.k[i], k, at, axes=(1,))
            self.v[i] = mx.slice_update(self.v[i], v, at, axes=(1,))
        self.advance(n)

    def read(self, layer: int, start: int, stop: int) -> tuple[mx.array, mx.array]:
        """K and V of one layer over positions [start, stop), ordered after the cache's last in-place write."""
        w = self.written[layer]
        return read_after(self.k[layer][:, start:stop], w), read_after(self.v[layer][:, start:stop], w)

    def reset(self, *, logical: bool) -> None:
        if logical:
            self._length, self._pos = 0, None
        else:
            self.k = self.v = self.written = None  # drop the old buffers before allocating new ones
            self.allocate()

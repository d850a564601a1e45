"""Per-request KV cache, preallocated for prompt + outputs: for each layer, K and V of shape (Hkv, capacity, Dh),
FP32, and one write fence for the whole cache (kernels/fence.py). The cache is the one owner of a request's progress:
`length` (positions written), from which the engine derives how much of the prompt is prefilled and where the
next decode goes.

A logical reset only rewinds `length` and keeps the allocation (and its stale contents, which nothing may
read: attention only sees positions < length, or masks the rest); a full reset allocates fresh buffers.
Where the kernels write new slots in place (a GPU), K and V are each one array (L, Hkv, capacity, Dh) and the
layers' arrays are views of it: per-layer kernels take a view, the persistent decode takes the whole, so its
launch has two cache buffers instead of 2 L. Where updates are functional (the CPU), each layer has its own
array, so an update copies one layer's cache rather than every layer's.

A pool (KVPool) holds many requests' caches of one capacity in one K and one V array (slots, L, Hkv, capacity,
Dh), each cache a view of its slot, so that one launch reads every decode row's cache (kernels/decode_rows.py).
Where updates are functional the pool only numbers its caches, which keep their own arrays.
"""

import mlx.core as mx

from pdlib.engine.kernels import install_kv, new_fence, read_after, store_kv, stores_kv_in_place


class KVPool:
    def __init__(self, *, slots: int, layers: int, kv_heads: int, head_dim: int, capacity: int):
        if slots < 1:
            raise ValueError(f"a pool needs at least one slot, got {slots}")
        self.shape = (slots, layers, kv_heads, capacity, head_dim)
        self.free = list(range(slots))
        self.fences: dict[int, mx.array] = {}  # a given-back slot's last fence, for its next cache
        self.k = self.v = None
        if stores_kv_in_place(head_dim):
            self.k, self.v = mx.zeros(self.shape, mx.float32), mx.zeros(self.shape, mx.float32)
            mx.eval(self.k, self.v)

    def cache(self) -> "KVCache":
        """A cache in the lowest free slot (its stale contents are never read: nothing reads past `length`)."""
        if not self.free:
            raise RuntimeError(f"every one of the pool's {self.shape[0]} cache slots is taken")
        _, layers, kv_heads, capacity, head_dim = self.shape
        slot = self.free.pop(0)
        cache = KVCache(layers=layers, kv_heads=kv_heads, head_dim=head_dim, capacity=capacity, pool=self, slot=slot)
        if slot in self.fences:  # its writes come after the last owner's, through the fence they left
            cache.written = self.fences.pop(slot)
        return cache

    def give_back(self, cache: "KVCache") -> None:
        if cache.pool is not self or cache.slot in self.free:
            raise ValueError(f"slot {cache.slot} is not one of this pool's taken slots")
        self.fences[cache.slot] = cache.written
        self.free.append(cache.slot)
        self.free.sort()


class KVCache:
    def __init__(
        self,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        pool: KVPool | None = None,
        slot: int | None = None,
    ):
        self.shape = (layers, kv_heads, capacity, head_dim)
        self.pool, self.slot = pool, slot
        self.allocations = 0
        self.allocate()

    @property
    def pooled(self) -> bool:
        """Whether K and V are views of a pool's arrays (a slot there)."""
        return self.pool is not None and self.pool.k is not None

    @property
    def capacity(self) -> int:
        return self.shape[2]

    @property
    def in_place(self) -> bool:
        return stores_kv_in_place(self.shape[3])

    def allocate(self) -> None:
        layers, *per_layer = self.shape
        if self.in_place:
            if self.pooled:
                s = self.slot
                self._k_all = self.pool.k[s : s + 1].reshape(self.shape)
                self._v_all = self.pool.v[s : s + 1].reshape(self.shape)
            else:
                self._k_all, self._v_all = mx.zeros(self.shape, mx.float32), mx.zeros(self.shape, mx.float32)
            mx.eval(self._k_all, self._v_all)
            # a slice, not an integer index: MLX gathers (copies) for `a[i]`, and slices share the buffer
            self.k = [self._k_all[i : i + 1].reshape(per_layer) for i in range(layers)]
            self.v = [self._v_all[i : i + 1].reshape(per_layer) for i in range(layers)]
        else:
            self._k_all = self._v_all = None
            self.k = [mx.zeros(per_layer, mx.float32) for _ in range(layers)]
            self.v = [mx.zeros(per_layer, mx.float32) for _ in range(layers)]
        self.written = new_fence()
        mx.eval(self.k, self.v, self.written)
        self._length = 0
        self._pos = None  # the device int32 array holding position `length`, kept for the next decode
        self.allocations += 1

    @property
    def k_all(self) -> mx.array:
        """Every layer's K, (L, Hkv, capacity, Dh): the array the layers' views share where writes are in place,
        a stacked copy elsewhere."""
        return self._k_all if self._k_all is not None else mx.stack(self.k)

    @property
    def v_all(self) -> mx.array:
        return self._v_all if self._v_all is not None else mx.stack(self.v)

    def lazy(self) -> list[mx.array]:
        """What a step may leave unevaluated here: the fence where writes are in place (K and V stay the buffers
        they were, evaluated), else every layer's K and V too."""
        return [self.written] if self.in_place else [*self.k, *self.v, self.written]

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
        self.k[layer], self.v[layer], self.written, keys, values = store_kv(
            k, v, self.k[layer], self.v[layer], self.written, positions=positions, start=start
        )
        return keys, values

    def write(self, layer: int, k: mx.array, v: mx.array, *, positions: mx.array, start: int) -> None:
        """`store` for attention that reads the cache itself (kernels/flash_prefill.py): only the new rows are
        written (in place behind the fence, or functionally), with no copy of the prefix handed back."""
        self.k[layer], self.v[layer], self.written = install_kv(
            k, v, self.k[layer], self.v[layer], self.written, positions=positions, start=start
        )

    def store_decoded(self, ks: list, vs: list, written: mx.array, *, next_pos: mx.array) -> None:
        """After a decode step: the new fence, and the new rows (Hkv, 1, Dh) where the step's kernels did not
        store them themselves (empty lists when they did); then one position more."""
        for i, (k, v) in enumerate(zip(ks, vs)):
            self.k[i] = mx.slice_update(self.k[i], k, self.position(), axes=(1,))
            self.v[i] = mx.slice_update(self.v[i], v, self.position(), axes=(1,))
        self.written = written
        self.advance(1, next_pos=next_pos)

    def install(self, keys: list, values: list) -> None:
        """A prefix computed elsewhere (disagg: received from the prefill worker): per layer (Hkv, T, Dh) K and
        V written at positions [length, length + T), then T positions more. Written as every other writer of this
        cache writes (in place behind the fence, or functionally), so every later read or write depends on it."""
        start, n = self._length, keys[0].shape[1]
        if start + n > self.capacity:
            raise ValueError(f"KV cache overflow: {start} + {n} positions exceed capacity {self.capacity}")
        positions = mx.arange(start, start + n, dtype=mx.int32)  # one array for every layer
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.k[i], self.v[i], self.written = install_kv(
                k, v, self.k[i], self.v[i], self.written, positions=positions, start=start
            )
        self.advance(n)

    def read(self, layer: int, start: int, stop: int) -> tuple[mx.array, mx.array]:
        """K and V of one layer over positions [start, stop), ordered after the cache's last in-place write."""
        w = self.written
        return read_after(self.k[layer][:, start:stop], w), read_after(self.v[layer][:, start:stop], w)

    def reset(self, *, logical: bool) -> None:
        if logical:
            self._length, self._pos = 0, None
        elif self.pooled:
            raise ValueError("a cache in a pool's slot resets logically only (its buffer is the pool's)")
        else:
            self.k = self.v = self._k_all = self._v_all = self.written = None  # drop the old buffers first
            self.allocate()

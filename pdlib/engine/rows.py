"""The decode rows of a ragged step (its one-row segments: a serving decode round, or decodes beside prompt
chunks), attended all at once: per layer one decode_rows launch pair over the rows' caches in their pool where
the kernel runs (kernels/decode_rows.py), else the single-row twin on each row. A step with fewer than two decode
rows, or rows whose caches are not in one pool (Engine(slots=...) makes one), attends them one by one as before
(Qwen3.stages). The rows' metadata is one int32 array a step, whatever the number of rows.

    rows = DecodeRows.of(segments, offsets, positions, head_dim)      # None: attend row by row
    o = rows.attend(i, layer, raw, inv_freq, heads=..., kv_heads=..., eps=...)   # (Hq, R, Dh)
"""

import functools

import mlx.core as mx

from pdlib.engine.kernels.decode_rows import available, decode_rows_kernel, decode_rows_ops, joined_fence
from pdlib.engine.parts import Segment


@functools.cache
def layer_id(i: int) -> mx.array:
    """Layer i's index for the kernel, made once: 16 bytes, since MLX keeps arrays of 8 or less in managed
    memory, where a kernel's access is slow."""
    a = mx.array([i, 0, 0, 0], mx.int32)
    mx.eval(a)
    return a


def output_pieces(row_of: dict[int, int], want) -> list:
    """A step's attention output as pieces, the segments `want` in order: a segment's index, or, for each run of
    consecutive decode rows, one slice of the rows' output (row_of: segment -> its row there). One slice a run,
    not one a row: a mixed step's graph does not grow by a node a row and layer."""
    out: list = []
    for j in want:
        r = row_of.get(j)
        if r is None:
            out.append(j)
        elif out and isinstance(out[-1], slice) and out[-1].stop == r:
            out[-1] = slice(out[-1].start, r + 1)
        else:
            out.append(slice(r, r + 1))
    return out


class DecodeRows:
    def __init__(self, segments: list[Segment], js: list[int], offsets: list[int], positions: mx.array, kernel: bool):
        self.js, self.kernel = js, kernel
        self.segments = [segments[j] for j in js]
        self.rows = [(offsets[j], segments[j].start) for j in js]
        self.all_positions, self.offsets = positions, offsets
        # every segment one row, each emitting (a decode; not a one-token chunk short of its prompt's end): o is the
        # step's as it comes, the final layer's pruned rows included
        self.whole = len(js) == len(segments) and all(s.emits for s in self.segments)
        if kernel:
            self.meta = mx.array([(r, s.cache.slot, p) for (r, p), s in zip(self.rows, self.segments)], mx.int32)

    @classmethod
    def of(
        cls, segments: list[Segment], offsets: list[int], positions: mx.array | None, head_dim: int
    ) -> "DecodeRows | None":
        """The step's decode rows, or None: fewer than two, or their caches not in one pool. `positions`: every
        row's, which only the ops twin reads (None where the caller runs the kernel alone)."""
        js = [j for j, (a, b) in enumerate(zip(offsets, offsets[1:])) if b - a == 1]
        caches = [segments[j].cache for j in js]
        if len(js) < 2 or caches[0].pool is None or any(c.pool is not caches[0].pool for c in caches):
            return None  # the rows' caches are not in one pool: row by row
        kernel = available(head_dim)
        if kernel and not all(c.pooled for c in caches):
            return None
        return cls(segments, js, offsets, positions, kernel=kernel)

    def attend(self, i: int, layer, raw: mx.array, inv_freq: mx.array, **shape) -> mx.array:
        """Layer i's attention output for every row, (Hq, R, Dh); each row's new K/V goes into its cache."""
        caches = [s.cache for s in self.segments]
        if self.kernel:
            pool = caches[0].pool
            o, written = decode_rows_kernel(
                raw,
                self.meta,
                layer_id(i),
                layer.q_norm,
                layer.k_norm,
                inv_freq,
                pool.k,
                pool.v,
                joined_fence([c.written for c in caches]),
                **shape,
            )
            for c in caches:
                c.written = written
            return o
        o, ks, vs = decode_rows_ops(
            raw, self.rows, layer.q_norm, layer.k_norm, inv_freq, [(c.k[i], c.v[i]) for c in caches], **shape
        )
        for c, s, j, k, v in zip(caches, self.segments, self.js, ks, vs):
            at = self.all_positions[self.offsets[j] : self.offsets[j] + 1]
            c.write(i, k[:, None], v[:, None], positions=at, start=s.start)
        return o

"""A decode round as one compiled function (PDLIB_DECODE_ROUND=compiled): a step in which every part is a decode,
three or more, their caches in one pool and attended by the rows kernel (a GPU). Qwen3.stages builds such a step
layer by layer in Python (the q|k|v projection, the rows' attention, o_proj and the MLP, 28 times), host work a
round repeats; here the same calls, layer for layer and launch for launch, form one function of (tokens, rows'
metadata, fence, pool K, pool V) that mx.compile traces once per row count and MLX then replays without Python.
Which rounds qualify is DecodeRows.of's rule (one launch pair a layer for every row) with every row emitting;
elsewhere the caller runs stages as before.

    rounds = CompiledRounds(qwen3)
    logits = rounds(segments)     # [(V,)] per segment, or None: not a round this runs
    rounds.trace(pool, range(3, 49))   # each row count's trace made now, not inside a timed step
"""

import mlx.core as mx

from pdlib.engine import kernels as K
from pdlib.engine.kernels.decode_rows import available, decode_rows_kernel, joined_fence
from pdlib.engine.kernels.fence import new_fence
from pdlib.engine.parts import Segment
from pdlib.engine.rows import DecodeRows, layer_id


class CompiledRounds:
    def __init__(self, model):
        self.model = model
        # MLX keeps a trace per input shapes and per default stream (partition's decodes run on a slice's own)
        self.compiled = mx.compile(self._layers)

    def __call__(self, segments: list[Segment]) -> list[mx.array] | None:
        caches = [s.cache for s in segments]
        if len(segments) < 3 or any(s.size != 1 for s in segments) or len(set(map(id, caches))) < len(caches):
            return None  # not a round (a repeated cache: stages refuses it)
        rows = DecodeRows.of(segments, list(range(len(segments) + 1)), None, self.model.cfg.head_dim)
        if rows is None or not rows.kernel or not rows.whole:
            return None  # attended row by row, or a row that does not emit: stages runs it
        for s in segments:  # as Qwen3.stages checks
            if s.start != s.cache.length:
                raise ValueError(f"segment at position {s.start} of a cache holding {s.cache.length}")
            if s.start + 1 > s.cache.capacity:
                raise RuntimeError(f"KV cache overflow: position {s.start} >= capacity {s.cache.capacity}")
        tokens = mx.concatenate([s.tokens.astype(mx.int32) for s in segments])
        pool = caches[0].pool
        logits, written = self.compiled(tokens, rows.meta, joined_fence([c.written for c in caches]), pool.k, pool.v)
        for c in caches:
            c.written = written
            c.advance(1)
        return [logits[r] for r in range(len(segments))]

    def trace(self, pool, rows) -> list[int]:
        """Trace the function for each row count in `rows` (3 up to the pool's slots) on `pool`'s K and V without
        running it (the outputs are never evaluated), so that no timed round pays a trace: the row counts
        traced; none where this pool's rounds never run here (the rows kernel is a GPU's)."""
        if pool is None or pool.k is None or not available(self.model.cfg.head_dim):
            return []
        done = [r for r in rows if 3 <= r <= pool.shape[0]]
        for r in done:
            meta = mx.zeros((r, 3), mx.int32)
            self.compiled(mx.zeros((r,), mx.int32), meta, new_fence(), pool.k, pool.v)
        return done

    def _layers(self, tokens, meta, after, pool_k, pool_v):
        """stages' round, every row a decode that emits: (R, V) logits and the last layer's fence."""
        m = self.model
        c = m.cfg
        shape = dict(heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, eps=c.rms_norm_eps)
        h = m.embed[tokens]
        x = mx.fast.rms_norm(h, m.layers[0].in_norm, c.rms_norm_eps)
        written = after
        for i, L in enumerate(m.layers):
            raw = m._proj(x, (L.t["wqkv"], L.d_qkv))
            o, written = decode_rows_kernel(
                raw, meta, layer_id(i), L.q_norm, L.k_norm, m.inv_freq, pool_k, pool_v, written, **shape
            )
            next_norm = m.layers[i + 1].in_norm if i < len(m.layers) - 1 else m.norm
            wo, up, down = (L.t["wo"], L.d_o), (L.t["w_gate_up"], L.d_gate_up), (L.t["w_down"], L.d_down)
            h, x = m._out_mlp(h, o, wo, L.post_norm, up, down, next_norm)
        return K.linear_t(x, m.lm_head_t, m.d_lm_head), written


__all__ = ["CompiledRounds"]

"""Qwen3 forward passes on pdlib's op layer: a ragged step over one or more requests' rows (prompt chunks
and decodes batched together; FP32 weights, MLX ops with compiled pieces, final-layer pruning) and the one-
token decode step (bf16-packed weights, FP32 accumulation): on CUDA one persistent kernel per token
(kernels/persistent_decode.py), elsewhere the op layer's kernels compiled into one graph (PDLIB_DECODE picks).
Shapes: D hidden, T tokens in the step, Dh head dim.
"""

import sys
import weakref
from functools import partial

import mlx.core as mx

from pdlib import settings
from pdlib.engine import kernels as K
from pdlib.engine.cache import KVCache, KVPool
from pdlib.engine.kernels import persistent_decode as persistent
from pdlib.engine.kernels.arithmetic import prefill_arithmetic
from pdlib.engine.parts import Layer, Segment, drain
from pdlib.engine.rows import DecodeRows, output_pieces
from pdlib.errors import InputError
from pdlib.settings import decode_mode
from pdlib.weights import LoadedModel, layer_names, pack_bf16

# PDLIB_PAIR_DECODE: `pair` decodes two requests' tokens of one step in one persistent launch (each weight read
# once for both, the grid barriers paid once); `each` launches one per request, one after the other
PAIR_ENV = "PDLIB_PAIR_DECODE"
SYNCS_KEPT = 256  # launches of several decodes: the sync buffers of the latest groups (17 KB each)


class Qwen3:
    def __init__(
        self,
        model: LoadedModel,
        *,
        lossless_decode_weights: bool = True,
        compile_steps: bool = True,
        decode: str | None = None,
        token_read: str | None = None,
    ):
        self.cfg = cfg = model.config
        w = model.weights
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = self.embed if cfg.tie_word_embeddings else w["lm_head.weight"]
        self.norm = w["model.norm.weight"]
        self.inv_freq = K.rope_inv_freq(cfg.head_dim, base=cfg.rope_theta)
        self.scale = cfg.head_dim**-0.5
        pack = (lambda a, name: pack_bf16(a, name=name)) if lossless_decode_weights else (lambda a, name: a)
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            names = layer_names(i)
            L = Layer(**{k: w[n] for k, n in names.items()})
            L.d_qkv = pack(mx.concatenate([L.wq, L.wk, L.wv]), f"{names['wq']} (+k, v)")
            L.d_o = pack(L.wo, names["wo"])
            L.d_gate_up = pack(mx.concatenate([L.w_gate, L.w_up]), f"{names['w_gate']} (+up)")
            L.d_down = pack(L.w_down, names["w_down"])
            # q|k|v and gate|up as one matrix each: a chunk step runs four GEMMs per layer instead of seven
            L.t = {
                "wqkv": mx.concatenate([L.wq, L.wk, L.wv]).T,
                "wo": L.wo.T,
                "w_gate_up": mx.concatenate([L.w_gate, L.w_up]).T,
                "w_down": L.w_down.T,
                "qk_norm": mx.concatenate(
                    [
                        mx.broadcast_to(L.q_norm, (cfg.num_attention_heads, cfg.head_dim)),
                        mx.broadcast_to(L.k_norm, (cfg.num_key_value_heads, cfg.head_dim)),
                    ]
                ),
            }
            self.layers.append(L)
        self.d_lm_head = pack(self.lm_head, "lm_head")
        self.lm_head_t = self.lm_head.T
        mx.eval(self.d_lm_head, self.lm_head_t, [[L.d_qkv, L.d_o, L.d_gate_up, L.d_down, L.t] for L in self.layers])
        # Static shapes (the cache capacity) and a position input: every decode step replays one graph.
        self._step = mx.compile(self.decode_step) if compile_steps else self.decode_step
        wrap = mx.compile if compile_steps else (lambda f: f)
        self._p_qkv, self._p_proj, self._p_out_mlp = wrap(self._qkv), wrap(self._proj), wrap(self._out_mlp)
        self._compile_steps, self._attention = compile_steps, {}
        runs_here = persistent.available(cfg, packed=lossless_decode_weights)
        self.decode_mode = decode_mode(decode) or ("persistent" if runs_here else "kernels")
        # a bad PDLIB_PREFILL_* is refused here, not at a prefill
        K.flash_enabled(cfg.head_dim), K.gemm_enabled(), K.gemm_sum_choice(), K.qk_rope_enabled(cfg.head_dim)
        self._flash_arithmetic = K.flash_arithmetic()
        self.prefill_arithmetic = prefill_arithmetic(cfg.head_dim, packed=lossless_decode_weights)
        # one barrier buffer per cache (decodes of two requests may overlap), gone with its cache
        self.decode_weights, self._syncs = None, weakref.WeakKeyDictionary()
        # mailbox: the kernel also leaves each token where the host polls (kernels/mailbox.py), where it decodes
        chosen = token_read or K.token_read_choice()
        self.token_read = chosen or ("mailbox" if self.decode_mode == "persistent" else "item")
        self._boxes = weakref.WeakKeyDictionary()
        # two or more requests' decodes in one step: one persistent launch for all where it fits (PDLIB_PAIR_DECODE=
        # pair, the default there; a bad value is refused here), else one each; `group`: the most a launch fits
        most = persistent.largest_group(cfg, packed=lossless_decode_weights)  # 1: not even a pair fits
        self.pairs = settings.get(PAIR_ENV) == "pair" and self.decode_mode == "persistent" and most >= 2
        self.group, self._pair_syncs = most if self.pairs else 1, {}  # mailboxes -> a launch's sync buffer
        if self.decode_mode == "persistent":
            if not runs_here:
                raise InputError(
                    f"PDLIB_DECODE=persistent: the persistent decode kernel needs CUDA, head_dim 128, bf16-packed "
                    f"decode weights and shapes within {persistent.SHARED_LIMIT} bytes of shared memory; here: "
                    f"backend {K.BACKEND}, head_dim {cfg.head_dim}, packed {lossless_decode_weights}, "
                    f"{persistent.shared_bytes(cfg)} bytes (PDLIB_DECODE=kernels runs everywhere)"
                )
            self.decode_weights = self.stacked_decode_weights()
            mx.eval(self.decode_weights)
            self.share_decode_weights()
            if self.token_read == "mailbox":
                self._pin_mailbox(chosen is not None)
        elif self.token_read == "mailbox":
            raise InputError(
                f"PDLIB_TOKEN_READ=mailbox: only the persistent decode kernel writes a mailbox (CUDA); "
                f"here decode is {self.decode_mode!r} (PDLIB_TOKEN_READ=item runs everywhere)"
            )

    def _pin_mailbox(self, asked: bool) -> None:
        """The process's mailbox region, pinned now rather than at the first decode; if it cannot be, an error where
        PDLIB_TOKEN_READ (or the caller) asked for it, else `.item()` with a warning (reports record which ran)."""
        try:
            K.mailbox_region()
        except RuntimeError as e:
            if asked:
                raise InputError(str(e)) from e
            print(f"warning: {e}; reading tokens by .item()", file=sys.stderr)
            self.token_read = "item"

    def stacked_decode_weights(self) -> "persistent.DecodeWeights":
        """The decode weights with the layers stacked per kind, for the persistent kernel (and its twin)."""
        stack = lambda name: mx.stack([getattr(L, name) for L in self.layers])  # noqa: E731
        per_layer = dict(qkv="d_qkv", o="d_o", gate_up="d_gate_up", down="d_down")
        per_layer.update((n, n) for n in ("in_norm", "post_norm", "q_norm", "k_norm"))
        return persistent.DecodeWeights(
            embed=self.embed,
            lm_head=self.d_lm_head,
            norm=self.norm,
            inv_freq=self.inv_freq,
            **{kind: stack(name) for kind, name in per_layer.items()},
        )

    def share_decode_weights(self) -> None:
        """The layers' decode matrices as views of the stacks in `decode_weights`, so each is in memory once (the
        per-operation kernels and profile_step still find them per layer). Slices, since `a[i]` copies."""
        for i, L in enumerate(self.layers):
            for name, kind in (("d_qkv", "qkv"), ("d_o", "o"), ("d_gate_up", "gate_up"), ("d_down", "down")):
                stack = getattr(self.decode_weights, kind)
                setattr(L, name, stack[i : i + 1].reshape(stack.shape[1:]))

    def new_cache(self, capacity: int) -> KVCache:
        c = self.cfg
        return KVCache(
            layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads, head_dim=c.head_dim, capacity=capacity
        )

    def new_pool(self, capacity: int, slots: int) -> KVPool:
        c = self.cfg
        shape = dict(layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads, head_dim=c.head_dim)
        return KVPool(slots=slots, capacity=capacity, **shape)

    # -- prefill ---------------------------------------------------------------------------------------
    # All but attention depends only on the step's row count: compiled pieces (one trace per count, for every
    # layer), fusing elementwise work and skipping Python, whose microseconds per graph node a GPU's host pays.
    # Attention: where flash runs (CUDA), one kernel per segment for q/k norms, RoPE and the K/V store
    # (kernels/qk_rope.py), then flash over the cache in place; elsewhere MLX's ops (`attention_rows`, compiled
    # shapeless), RoPE from one request's first position or by tables. A decode's row: decode attention.
    def warm(self, max_rows: int) -> list[int]:
        """Run once, on zeros, each variant of the matmul kernels (kernels/gemm.py `variant`) a step of 1..max_rows
        rows can meet, so that no timed step compiles one; returns the row counts run."""
        c, L = self.cfg, self.layers[0]
        names = zip(("wqkv", "wo", "w_gate_up", "w_down"), (L.d_qkv, L.d_o, L.d_gate_up, L.d_down))
        wqkv, wo, up, down = [(L.t[n], d) for n, d in names]
        seen, runs = set(), []
        for m in range(1, max_rows + 1):
            v = tuple(K.gemm_variant(m, *w) for w in (wqkv, wo, up, down, (self.lm_head_t, self.d_lm_head)))
            if v not in seen:
                seen.add(v)
                runs.append(m)
                o = mx.zeros((c.num_attention_heads, m, c.head_dim))
                h, x = self._p_out_mlp(mx.zeros((m, c.hidden_size)), o, wo, L.post_norm, up, down, self.norm)
                mx.eval(self._p_proj(x, wqkv), h, K.linear_t(x, self.lm_head_t, self.d_lm_head))
        return runs

    def _proj(self, x, wqkv):
        """x: (T, D), the layer's normed input -> its q|k|v projection (T, Hq + 2 Hkv, Dh), as the GEMM leaves it."""
        c = self.cfg
        H = c.num_attention_heads + 2 * c.num_key_value_heads
        return K.linear_t(x, *wqkv).reshape(x.shape[0], H, c.head_dim)

    def _qkv(self, x, wqkv, qk_norm, *rope):
        """x: (T, D), the layer's normed input -> q (Hq, T, Dh) and k (Hkv, T, Dh), each after its norm and RoPE,
        v (Hkv, T, Dh), and the projection as it came, (T, Hq + 2 Hkv, Dh): a decode's row attends from that.
        The q and k heads are normed as one array (every head of the projection, contiguous; v's norms go
        unused), then scaled by qk_norm (Hq + Hkv, Dh): column slices would need a copy before a fused norm.
        `rope`: the first row's position, 0-d, when the rows' positions run on from it, else cos, sin tables.
        mx.fast.rope reads an offset of shape (n,) as one per leading index (per head here) on CUDA and Metal.
        Each weight comes as a pair (transposed FP32 view, decode copy): K.linear_t picks."""
        c = self.cfg
        Hq, Hkv = c.num_attention_heads, c.num_key_value_heads
        heads = self._proj(x, wqkv)
        qk = mx.fast.rms_norm(heads, None, c.rms_norm_eps)[:, : Hq + Hkv] * qk_norm
        q, k, v = qk[:, :Hq].swapaxes(0, 1), qk[:, Hq:].swapaxes(0, 1), heads[:, Hq + Hkv :].swapaxes(0, 1)
        if len(rope) == 1:
            turn = partial(
                mx.fast.rope, dims=c.head_dim, traditional=False, base=c.rope_theta, scale=1.0, offset=rope[0]
            )
            return turn(q), turn(k), v, heads
        return K.rope_rotate(q, *rope), K.rope_rotate(k, *rope), v, heads

    def _attention_for(self, rows: int):
        """attention_rows for `rows` query rows, compiled shapeless: one graph for every cache length."""
        if rows not in self._attention:
            fn = partial(K.attention_rows, scale=self.scale)
            self._attention[rows] = mx.compile(fn, shapeless=True) if self._compile_steps else fn
        return self._attention[rows]

    def _out_mlp(self, h, o, wo, post_norm, w_gate_up, w_down, next_norm):
        """Residual stream after attention output o (Hq, T, Dh) and the MLP (weights in pairs, as _qkv's), and
        its RMSNorm by `next_norm` (the next layer's in-norm, or the final norm): each norm follows a residual
        add, so a K split's sum may apply it (PDLIB_PREFILL_GEMM_SUM=fused-norm)."""
        c = self.cfg
        eps = c.rms_norm_eps
        h, x = K.linear_t(
            o.swapaxes(0, 1).reshape(-1, c.num_attention_heads * c.head_dim), *wo, add=h, norm=(post_norm, eps)
        )
        a = K.linear_t(x, *w_gate_up, swiglu=True)  # silu(g) * u
        return K.linear_t(a, *w_down, add=h, norm=(next_norm, eps))

    def prefill(self, cache: KVCache, tokens: mx.array, *, start: int, last: bool, prune: bool = True):
        """Run prompt tokens (T,) at positions start .. start+T-1, writing their K/V into the cache. Returns the
        logits (V,) of the final position when `last` (this chunk finishes the prompt), else None."""
        return self.step([Segment(cache, tokens, start=start, emits=last)], prune=prune)[0]

    def step(self, segments: list["Segment"], *, prune: bool = True) -> list[mx.array | None]:
        """One ragged step over several requests' rows: a prompt chunk, a decode (one row: the last token), or
        several of those for different caches. The projections and the MLP run over all rows at once (every
        row rides on one read of the weights); attention runs per segment over its own cache. Returns, per
        segment, the logits (V,) of its last row when it `emits`, else None.

        A segment of one row (a decode beside a prompt chunk) attends as a decode step does: its raw q|k|v row
        goes to decode_attention, which norms it, rotates it, stores its K/V and attends split over the keys.
        The flash kernel would pad that row to a block of query rows, a large share of a chunk step.

        Final-layer pruning: the last layer's output only matters for emitting rows, so the rows of a chunk
        that does not finish its prompt stop after storing their K/V there."""
        return drain(self.stages(segments, prune=prune))

    def stages(self, segments: list["Segment"], *, prune: bool = True):
        """`step` one layer at a time: each next() builds one more layer's graph and yields the arrays that
        make it concrete (evaluate them to run it); the generator's return value is step's. Overlap dispatches
        a long prompt this way (pdlib/overlap.py)."""
        c = self.cfg
        for s in segments:
            if s.start != s.cache.length:
                raise ValueError(f"segment at position {s.start} of a cache holding {s.cache.length}")
            if s.start + s.size > s.cache.capacity:
                raise RuntimeError(f"KV cache overflow: position {s.start + s.size - 1} >= capacity {s.cache.capacity}")
        if len({id(s.cache) for s in segments}) < len(segments):
            raise ValueError("a step holds at most one segment per cache")
        offsets = [0]
        for s in segments:
            offsets.append(offsets[-1] + s.size)
        positions = self._positions(segments)
        flash = K.flash_enabled(c.head_dim)
        # with flash, a chunk's norms, RoPE and K/V store are one kernel (qk_rope_store) where it runs; else one
        # request's rows rotate from its first position, and a ragged step's by tables
        fused = flash and K.qk_rope_enabled(c.head_dim)
        rope = None if fused else (positions[0],) if len(segments) == 1 else K.rope_tables(positions, self.inv_freq)
        tokens = [s.tokens for s in segments]
        h = self.embed[tokens[0] if len(tokens) == 1 else mx.concatenate([t.astype(mx.int32) for t in tokens])]
        x = mx.fast.rms_norm(h, self.layers[0].in_norm, c.rms_norm_eps)  # each layer's normed input (_out_mlp)
        if not flash:
            masks = [K.causal_mask(positions[a:b], s.start + s.size) for s, a, b in zip(segments, offsets, offsets[1:])]
            rep = c.num_attention_heads // c.num_key_value_heads
            mask_rows = [K.query_rows(m, rep) for m in masks]
        emitting = [j for j, s in enumerate(segments) if s.emits]
        rows = DecodeRows.of(segments, offsets, positions, c.head_dim)
        row_of = {j: r for r, j in enumerate(rows.js)} if rows is not None else {}
        want = {False: range(len(segments)), True: emitting}  # o's pieces; none where o is the rows' output whole
        plans = {} if rows is not None and rows.whole else {k: output_pieces(row_of, w) for k, w in want.items()}

        def last_rows(a: mx.array) -> mx.array:  # the emitting segments' last rows, by slices
            if len(emitting) == offsets[-1]:  # every row a segment of its own that emits: all of them
                return a
            pieces = [a[offsets[j + 1] - 1 : offsets[j + 1]] for j in emitting]
            return pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)

        n_layers, pruned, in_place = len(self.layers), False, K.stores_kv_in_place(c.head_dim)
        shape = dict(heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, eps=c.rms_norm_eps)
        for i, L in enumerate(self.layers):
            if fused:
                raw = self._p_proj(x, (L.t["wqkv"], L.d_qkv))
            else:
                q, k, v, raw = self._p_qkv(x, (L.t["wqkv"], L.d_qkv), L.t["qk_norm"], *rope)
            qs, solo, kv = {}, {}, {}  # per segment: query rows; a one-row one's attention output; keys, values
            if rows is not None:  # the decode rows at once (engine/rows.py)
                o_rows = rows.attend(i, L, raw, self.inv_freq, **shape)
            for j, (s, a, b) in enumerate(zip(segments, offsets, offsets[1:])):
                if j in row_of:
                    continue
                at = positions[a:b]
                if b - a == 1:
                    solo[j], k1, v1, s.cache.written = K.decode_attention(  # raw[a] would gather a copy
                        raw[a:b].reshape(-1),
                        L.q_norm,
                        L.k_norm,
                        self.inv_freq,
                        at,
                        s.cache.k[i],
                        s.cache.v[i],
                        s.cache.written,
                        **shape,
                    )
                    if k1 is not None:  # the ops twin hands the row's K/V back to be stored
                        s.cache.write(i, k1[:, None], v1[:, None], positions=at, start=s.start)
                elif fused:
                    qs[j], s.cache.k[i], s.cache.v[i], s.cache.written = K.qk_rope_store(
                        raw[a:b],
                        L.q_norm,
                        L.k_norm,
                        self.inv_freq,
                        at,
                        s.cache.k[i],
                        s.cache.v[i],
                        s.cache.written,
                        start=s.start,
                        **shape,
                    )
                elif flash:  # attention reads the caches in place: only the new rows are written
                    qs[j] = q[:, a:b]
                    s.cache.write(i, k[:, a:b], v[:, a:b], positions=at, start=s.start)
                else:
                    qs[j] = q[:, a:b]
                    kv[j] = s.cache.store(i, k[:, a:b], v[:, a:b], positions=at, start=s.start)

            def attend(j: int, last: bool) -> mx.array:
                """Segment j's query rows (all of them, or only its `last`) over its cache."""
                s, a, b = segments[j], offsets[j], offsets[j + 1]
                if j in solo:
                    return solo[j].reshape(c.num_attention_heads, 1, c.head_dim)
                qr = qs[j][:, -1:] if last else qs[j]
                if flash:
                    at = positions[b - 1 : b] if last else positions[a:b]
                    return K.flash_attention(
                        qr,
                        s.cache.k[i],
                        s.cache.v[i],
                        at,
                        s.cache.written,
                        scale=self.scale,
                        length=s.start + s.size,
                        arithmetic=self._flash_arithmetic,
                    )
                m = K.query_rows(masks[j][-1:], rep) if last else mask_rows[j]
                return self._attention_for(qr.shape[1])(qr, *kv[j], mask_rows=m)

            last = prune and i == n_layers - 1  # only the emitting segments' last rows go on
            if last:
                if not emitting:
                    break
                h, pruned = last_rows(h), True
            if rows is not None and rows.whole:  # every row a decode, each emitting
                o = o_rows
            else:
                o = [attend(p, last) if isinstance(p, int) else o_rows[:, p] for p in plans[last]]
                if len(o) > 1 and flash:  # most lie as (rows, heads, Dh) (the merge's, the rows'): joined so
                    o = [mx.concatenate([p.swapaxes(0, 1) for p in o]).swapaxes(0, 1)]
                o = o[0] if len(o) == 1 else mx.concatenate(o, axis=1)
            next_norm = self.layers[i + 1].in_norm if i < n_layers - 1 else self.norm
            wo, up, down = (L.t["wo"], L.d_o), (L.t["w_gate_up"], L.d_gate_up), (L.t["w_down"], L.d_down)
            h, x = self._p_out_mlp(h, o, wo, L.post_norm, up, down, next_norm)
            # the last layer's x (the final norm's) feeds an emitting step only: a silent step's is never started
            used = [h, x] if i < n_layers - 1 else [x] if emitting else []
            # in place (a GPU) the caches' writes are done with the fence they share, else K and V are new arrays
            made = {id(a): a for s in segments for a in (s.cache.k[i], s.cache.v[i], s.cache.written)[2 * in_place :]}
            yield [*used, *made.values()]
        for s in segments:
            s.cache.advance(s.size)
        if not emitting:
            return [None] * len(segments)
        logits = K.linear_t(x if pruned else last_rows(x), self.lm_head_t, self.d_lm_head)  # (emitting, V)
        out = [None] * len(segments)
        for r, j in enumerate(emitting):
            out[j] = logits[r]
        return out

    @staticmethod
    def _positions(segments: list[Segment]) -> mx.array:
        """Every row's position, segment after segment (a round of decodes: one array from the host, not N)."""
        if len(segments) > 2 and all(s.size == 1 for s in segments):
            return mx.array([s.start for s in segments], mx.int32)
        pieces = [mx.arange(s.start, s.start + s.size, dtype=mx.int32) for s in segments]
        return pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)

    # -- decode ---------------------------------------------------------------------------------------

    def decode_step(
        self, token: mx.array, pos: mx.array, k_cache: list[mx.array], v_cache: list[mx.array], written: mx.array
    ):
        """One token at position pos (an int32 array, so one compiled graph serves every position):
        (token, pos, caches, fence) -> (logits (V,), greedy token, pos + 1, new K rows, new V rows, fence).
        Where the attention kernel runs (a GPU, head_dim 128) it stores the new rows in the caches itself, the
        rows are empty lists and the fence is the last layer's kernel's (each layer's takes the one before);
        otherwise the rows are each layer's (Hkv, 1, Dh) for the cache to store.
        Six kernels per layer: norm+q|k|v, q/k-norm+RoPE+attention (+ the K/V store), its merge,
        o_proj+residual, norm+gate|up+SwiGLU, down+residual."""
        c = self.cfg
        eps = c.rms_norm_eps
        h = self.embed[token].reshape(c.hidden_size)
        ks, vs = [], []
        for i, L in enumerate(self.layers):
            qkv = K.gemv(h, L.d_qkv, norm=L.in_norm, eps=eps)
            o, k, v, written = K.decode_attention(
                qkv,
                L.q_norm,
                L.k_norm,
                self.inv_freq,
                pos,
                k_cache[i],
                v_cache[i],
                written,
                heads=c.num_attention_heads,
                kv_heads=c.num_key_value_heads,
                eps=eps,
            )
            h = K.gemv(o, L.d_o, residual=h)
            act = K.gemv(h, L.d_gate_up, norm=L.post_norm, eps=eps, swiglu=True)
            h = K.gemv(act, L.d_down, residual=h)
            if k is not None:
                ks.append(k[:, None])
                vs.append(v[:, None])
        logits = K.gemv(h, self.d_lm_head, norm=self.norm, eps=eps)
        return logits, mx.argmax(logits), pos + 1, ks, vs, written

    def mailbox(self, cache: KVCache) -> "K.TokenMailbox | None":
        """Where the persistent kernel leaves this cache's decoded tokens for the host (PDLIB_TOKEN_READ=mailbox;
        slot by position), once it has decoded; else None."""
        return self._boxes.get(cache)

    def _new_mailbox(self, cache: KVCache) -> "K.TokenMailbox":
        """An area of the process's mailbox region for the cache, given back when the cache goes (its steps'
        tokens were all observed by then)."""
        region = K.mailbox_region()
        box = self._boxes[cache] = region.take()
        weakref.finalize(cache, region.give_back, box)
        return box

    def decode(self, cache: KVCache, token: mx.array) -> tuple[mx.array, mx.array]:
        """Run the (compiled) step at the cache's next position; returns the logits (V,) and the greedy token.
        The position lives on the device and the step advances it there (KVCache.position says why)."""
        self._check_room(cache)
        if self.decode_weights is not None:
            if cache not in self._syncs:
                self._syncs[cache] = persistent.new_sync(self._box_address(cache))
            self._clear_box(cache)
            c = self.cfg
            logits, token, next_pos, ks, vs, written = persistent.decode_persistent(
                token,
                cache.position(),
                self.decode_weights,
                cache.k_all,
                cache.v_all,
                cache.written,
                self._syncs[cache],
                heads=c.num_attention_heads,
                kv_heads=c.num_key_value_heads,
                eps=c.rms_norm_eps,
            )
        else:
            logits, token, next_pos, ks, vs, written = self._step(
                token, cache.position(), cache.k, cache.v, cache.written
            )
        cache.store_decoded(ks, vs, written, next_pos=next_pos)
        return logits, token

    def decode_group(self, caches: list[KVCache], tokens: list[mx.array]) -> list[tuple[mx.array, mx.array]]:
        """Two to `group` requests' decode steps (`decode` each) in one persistent launch (`pairs` says where it
        runs): the logits and greedy token of each, in order."""
        n = len(caches)
        if not self.pairs or not 2 <= len(set(map(id, caches))) == n <= self.group:
            raise ValueError(f"{n} decodes in one launch need the persistent kernel and 2 to {self.group} caches")
        for cache in caches:
            self._check_room(cache)
        key = tuple(map(self._box_address, caches))  # a group's barrier buffer: its mailboxes, its counts (reused)
        sync = self._pair_syncs.pop(key, None)
        self._pair_syncs[key] = persistent.new_sync(*key) if sync is None else sync  # the latest last
        if len(self._pair_syncs) > SYNCS_KEPT:  # a serving run's groups change as requests come and go
            del self._pair_syncs[next(iter(self._pair_syncs))]
        for cache in caches:
            self._clear_box(cache)
        outs = persistent.decode_persistent_group(
            [(t, x.position(), x.k_all, x.v_all, x.written) for t, x in zip(tokens, caches, strict=True)],
            self.decode_weights,
            self._pair_syncs[key],
            heads=self.cfg.num_attention_heads,
            kv_heads=self.cfg.num_key_value_heads,
            eps=self.cfg.rms_norm_eps,
        )
        for cache, (_, _, next_pos, ks, vs, written) in zip(caches, outs):
            cache.store_decoded(ks, vs, written, next_pos=next_pos)
        return [(logits, token) for logits, token, *_ in outs]

    @staticmethod
    def _check_room(cache: KVCache) -> None:
        if cache.length >= cache.capacity:
            raise RuntimeError(f"KV cache overflow: position {cache.length} >= capacity {cache.capacity}")

    def _box_address(self, cache: KVCache) -> int:
        """The device address of the cache's token mailbox area (made at its first decode), or 0 without one."""
        if self.token_read != "mailbox":
            return 0
        box = self._boxes.get(cache)
        return (self._new_mailbox(cache) if box is None else box).address

    def _clear_box(self, cache: KVCache) -> None:
        box = self._boxes.get(cache)
        if box is not None:
            box.clear(cache.length)

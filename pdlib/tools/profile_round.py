"""Where a round of R decodes' time goes (a serving decode round as one ragged step, PDLIB_DECODE_ROUND=step):
the whole round, the host's part of it, and each kind of its work alone, 28 layers of it, each timed as a chain
that is built, started and waited for, next to the bytes it reads.

    rows = profile_round(engine, names, context=2048, steps=20)   # {label: {"ms", "bytes"}}

`names`: R requests of the engine's pool, prefilled to `context`. The parts: the layers' q|k|v projections and
their output projections and MLPs at M = R rows (linear_t: MLX's FP32 matmul on the FP32 weights below
gemm.MIN_ROWS rows, the tensor-core GEMM on the bf16 copies from there; `gemm.variant` says which), the rows'
attention (engine/rows.py: one launch pair a layer over the pool), and the LM head on R rows. Their sum against
the round says how much is the parts' own device time and how much lies between them (the host, launches).
"""

import statistics
import time

import mlx.core as mx

from pdlib.engine import Engine, observe_all
from pdlib.engine import kernels as K
from pdlib.engine.parts import Segment
from pdlib.engine.rows import DecodeRows
from pdlib.tools.profile import timed


def _weight_bytes(m: int, w_t: mx.array, w: mx.array | None) -> int:
    """What a matmul of m rows reads of its weight: the bf16 copy where linear_t's kernel takes it, else FP32."""
    v = K.gemm_variant(m, w_t, w)
    bf16 = v is not None and w is not None and w.dtype == mx.bfloat16 and K.gemm_bf16_weights()
    return w_t.size * (2 if bf16 else 4)


def profile_round(engine: Engine, names: list[str], *, context: int, steps: int) -> dict:
    """{label: {"ms": median, "bytes": read}} for a round of len(names) decodes at `context` (module docstring).
    The round's steps are real decodes (each advances its request); the parts rewrite the rows' next slots."""
    model, cfg = engine.model, engine.model.cfg
    R, layers = len(names), engine.model.layers
    parts = [(name, None) for name in names]
    kv_row = cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * 4 * context
    out: dict = {}
    host: list[float] = []

    def round_():
        t0 = time.perf_counter_ns()
        outs = engine.batch(parts)
        host.append((time.perf_counter_ns() - t0) / 1e6)
        observe_all(outs)

    out[f"round of {R}, tokens observed"] = {"ms": timed(round_, steps), "bytes": None}
    out[f"round of {R}, host (Engine.batch returns)"] = {"ms": statistics.median(host[2:]), "bytes": None}

    D, H = cfg.hidden_size, cfg.num_attention_heads + 2 * cfg.num_key_value_heads
    x = mx.random.normal((R, D)) * 0.1
    o = (mx.random.normal((R, cfg.num_attention_heads, cfg.head_dim)) * 0.1).swapaxes(0, 1)  # as the rows give it
    mx.eval(x, o)
    weights = [  # per layer: q|k|v, o, gate|up, down, each (transposed FP32 view, decode copy) as the step takes it
        [(L.t[n], d) for n, d in zip(("wqkv", "wo", "w_gate_up", "w_down"), (L.d_qkv, L.d_o, L.d_gate_up, L.d_down))]
        for L in layers
    ]

    def proj():
        mx.eval([model._p_proj(x, w[0]) for w in weights])

    def mlp():
        mx.eval([model._p_out_mlp(x, o, w[1], L.post_norm, w[2], w[3], L.in_norm) for L, w in zip(layers, weights)])

    out[f"{len(layers)} x q|k|v projection, {R} rows"] = {
        "ms": timed(proj, steps),
        "bytes": sum(_weight_bytes(R, *w[0]) for w in weights),
    }
    out[f"{len(layers)} x o_proj + MLP, {R} rows"] = {
        "ms": timed(mlp, steps),
        "bytes": sum(_weight_bytes(R, *p) for w in weights for p in w[1:]),
    }

    reqs = [engine.requests[name] for name in names]
    segments = [Segment(r.cache, r.next_token.reshape(1), start=r.cache.length, emits=True) for r in reqs]
    offsets = list(range(R + 1))
    positions = mx.array([s.start for s in segments], mx.int32)
    rows = DecodeRows.of(segments, offsets, positions, cfg.head_dim)
    if rows is not None:
        raw = mx.random.normal((R, H, cfg.head_dim)) * 0.1
        mx.eval(raw)
        shape = dict(heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, eps=cfg.rms_norm_eps)

        def attend():
            mx.eval([rows.attend(i, L, raw, model.inv_freq, **shape) for i, L in enumerate(layers)])
            mx.eval([r.cache.written for r in reqs])

        out[f"{len(layers)} x attention over {R} rows' caches"] = {"ms": timed(attend, steps), "bytes": R * kv_row}
    head = {"ms": timed(lambda: mx.eval(K.linear_t(x, model.lm_head_t, model.d_lm_head)), steps)}
    out[f"LM head, {R} rows"] = {**head, "bytes": _weight_bytes(R, model.lm_head_t, model.d_lm_head)}
    return out


def profile_rounds(model, rounds, *, context: int, steps: int) -> dict:
    """{R: profile_round's rows} for each round size in `rounds`, on one engine of max(rounds) pooled requests
    prefilled to `context`, its rounds as one step each (PDLIB_DECODE_ROUND=step)."""
    from pdlib.tools.timing import bench_prompt

    rounds = sorted(set(rounds))
    engine = Engine(model, capacity=context + len(rounds) * (3 * steps + 8) + 8, slots=max(rounds))
    engine.decode_round = "step"
    names = [f"R{i}" for i in range(max(rounds))]
    for i, name in enumerate(names):
        engine.add_request(name, bench_prompt(model.config.vocab_size, context, i))
        engine.prefill_chunk(name, context).token.item()
    return {str(R): profile_round(engine, names[:R], context=context, steps=steps) for R in rounds}


def format_rounds(result: dict) -> str:
    """One line per part of each round: ms, and the bytes it reads over that time."""
    lines = []
    for rows in result.values():
        width = max(map(len, rows))
        for label, r in rows.items():
            rate = "" if not r["bytes"] else f"  {r['bytes'] / 1e9:6.2f} GB, {r['bytes'] / r['ms'] / 1e6:7.0f} GB/s"
            lines.append(f"{label:{width}s} {r['ms']:9.3f} ms{rate}")
    return "\n".join(lines)


__all__ = ["format_rounds", "profile_round", "profile_rounds"]

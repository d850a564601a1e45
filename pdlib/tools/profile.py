"""Where a decode step's time goes, on the current device: variants of the step timed side by side.

    python -m pdlib profile-step [--model synthetic:qwen3-0.6b] [--context 4096] [--steps 50] [--output P]

Not a benchmark (see `bench-step`): a tool for finding where a step's time goes, printing one table; the CLI
writes the JSON through report.write_new (never over a file).
"""

import statistics
import time

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.engine import kernels as K
from pdlib.engine.kernels.backend import kernel_or_none
from pdlib.weights import load_model

_noop = kernel_or_none(
    "pdlib_noop",
    ["x"],
    ["y"],
    cuda_source="if (threadIdx.x == 0) y[0] = x[0] + 1.f;",
    metal_source="if (thread_position_in_grid.x == 0) y[0] = x[0] + 1.f;",
)


def timed(fn, steps: int, *, sync_each: bool = True) -> float:
    """Median ms per call (sync_each) or mean ms per call over a pipelined run (not sync_each)."""
    fn()
    fn()
    if not sync_each:
        t0 = time.perf_counter_ns()
        outs = [fn(sync=False) for _ in range(steps)]
        mx.eval(outs)
        return (time.perf_counter_ns() - t0) / 1e6 / steps
    times = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def profile_step(model_spec: str = "synthetic:qwen3-0.6b", *, context: int = 4096, steps: int = 50) -> dict:
    """{"context", "rows_ms": {variant: ms}, "device"}: every variant of one decode step, timed."""
    model = load_model(model_spec)
    cfg = model.config
    ctx = context
    engine = Engine(model, capacity=ctx + 4 * steps + 64)
    engine.add_request("X", [(i * 31) % 1000 for i in range(ctx)])
    engine.reset("X", logical=True)
    engine.prefill_chunk("X", ctx).token.item()
    m, r = engine.model, engine.requests["X"]
    rows = {}

    def full(sync=True):
        out = engine.decode("X")
        return out.observe() if sync else out.token

    rows["engine.decode, token observed"] = timed(full, steps)
    rows["engine.decode, pipelined (no host sync)"] = timed(full, steps, sync_each=False)

    pos = mx.array([r.cache.length], mx.int32)
    k_layers, v_layers, fence = r.cache.k, r.cache.v, r.cache.written
    tok = r.next_token

    def step_only(sync=True):
        logits, t, *_ = m._step(tok, pos, k_layers, v_layers, fence)
        return t.item() if sync else t

    rows["compiled step alone (same position each time)"] = timed(step_only, steps)

    eager = m.decode_step

    def uncompiled(sync=True):
        logits, t, *_ = eager(tok, pos, k_layers, v_layers, fence)
        return t.item() if sync else t

    rows["uncompiled step"] = timed(uncompiled, steps)

    def host_only(sync=True):
        t0 = time.perf_counter_ns()
        out = m._step(tok, pos, k_layers, v_layers, fence)
        dt = (time.perf_counter_ns() - t0) / 1e6
        mx.eval(out)
        return dt

    host = [host_only() for _ in range(steps)]
    rows["compiled step: host time to build (no eval)"] = statistics.median(host)

    h = mx.random.normal((cfg.hidden_size,))
    mx.eval(h)

    def chain(fn):
        def run(sync=True):
            y = fn()
            return y.sum().item() if sync else y

        return run

    def gemv_chain():
        y = h
        for L in m.layers:
            y = K.gemv(y, L.d_qkv, norm=L.in_norm, eps=1e-6)[: cfg.hidden_size]
        return y

    rows["28 x gemv q|k|v (norm), eager"] = timed(chain(gemv_chain), steps)
    rows["28 x gemv q|k|v (norm), compiled"] = timed(chain(mx.compile(gemv_chain)), steps)
    rows["lm_head gemv (norm)"] = timed(chain(lambda: K.gemv(h, m.d_lm_head, norm=m.norm, eps=1e-6)), steps)
    qkv = mx.random.normal(((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim,))

    def attn_chain():
        outs = []
        for i, L in enumerate(m.layers):
            o, _, _, _ = K.decode_attention(
                qkv,
                L.q_norm,
                L.k_norm,
                m.inv_freq,
                pos,
                k_layers[i],
                v_layers[i],
                fence,
                heads=cfg.num_attention_heads,
                kv_heads=cfg.num_key_value_heads,
                eps=1e-6,
            )
            outs.append(o)
        return mx.stack(outs)

    rows["28 x decode attention, compiled"] = timed(chain(mx.compile(attn_chain)), steps)

    if _noop is not None:

        def noops(n):
            def f():
                y = h[:1]
                for _ in range(n):
                    (y,) = _noop(
                        inputs=[y],
                        grid=(32, 1, 1),
                        threadgroup=(32, 1, 1),
                        output_shapes=[(1,)],
                        output_dtypes=[mx.float32],
                    )
                return y

            return f

        rows["180 no-op kernels, eager"] = timed(chain(noops(180)), steps)
        rows["180 no-op kernels, compiled"] = timed(chain(mx.compile(noops(180))), steps)

        def host_scalar(sync=True):  # a kernel chain reading a 4-byte array the host wrote this call
            y = mx.array([1.0], mx.float32)
            for _ in range(28):
                (y,) = _noop(
                    inputs=[y],
                    grid=(32, 1, 1),
                    threadgroup=(32, 1, 1),
                    output_shapes=[(1,)],
                    output_dtypes=[mx.float32],
                )
            return y.item() if sync else y

        rows["28 no-op kernels from a host-written scalar"] = timed(host_scalar, steps)
        rows["28 no-op kernels from a device scalar"] = timed(chain(noops(28)), steps)

    def mm_chain():
        y = h
        for L in m.layers:
            y = (L.wq @ y)[: cfg.hidden_size]
        return y

    rows["28 x MLX matmul q (FP32 weights), compiled"] = timed(chain(mx.compile(mm_chain)), steps)

    def slice_upd(sync=True):
        nk = mx.slice_update(k_layers[0], mx.zeros((cfg.num_key_value_heads, 1, cfg.head_dim)), pos, axes=(1,))
        return nk[0, 0, 0].item() if sync else nk

    rows["slice_update of one layer's K (not donatable: copies)"] = timed(slice_upd, 10)

    return {
        "context": ctx,
        "decode": m.decode_mode,
        "token_read": m.token_read,
        "rows_ms": rows,
        "device": mx.device_info(),
    }


def format_rows(result: dict) -> str:
    rows = result["rows_ms"]
    width = max(map(len, rows))
    return "\n".join(f"{k:{width}s} {v:9.3f} ms" for k, v in rows.items())

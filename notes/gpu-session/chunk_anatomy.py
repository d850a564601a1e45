"""Where one 128-token chunk step's time goes (issue 12: is chunked prefill bound by FP32 GEMMs, attention or the
host?), and a mixed step's (the chunk beside one decode). Run it under different settings (MLX_USE_CUDA_GRAPHS=0,
PDLIB_PREFILL_ATTENTION) and compare; prints one JSON line of median milliseconds (PROFILE=1: first, a
cProfile of the call that builds and issues one chunk step and one mixed step, as # lines).

    python3 notes/gpu-session/chunk_anatomy.py [context]
"""

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.engine import kernels as K
from pdlib.weights import load_model

T, CTX, N = 128, int(sys.argv[1]) if len(sys.argv) > 1 else 2048, 15


def ms(t0):
    return (time.perf_counter_ns() - t0) / 1e6


def median_of(fn):
    fn()
    fn()
    return statistics.median(fn() for _ in range(N))


model = load_model(os.environ.get("MODEL", "synthetic:qwen3-0.6b"))   # MODEL: another, to try it
engine = Engine(model, capacity=CTX + T + 8)
engine.add_request("P", [(i * 7919 + 13) % model.config.vocab_size for i in range(CTX + T + 1)])
SWITCHES = ("MLX_USE_CUDA_GRAPHS", "MLX_ENABLE_TF32", "PDLIB_PREFILL_GEMM", "PDLIB_PREFILL_GEMM_SUM",
            "PDLIB_PREFILL_QK", "PDLIB_PREFILL_ATTENTION", "PDLIB_STEP_DISPATCH")
out = {"context": CTX, "rows": T, "label": os.environ.get("LABEL"), "env": {k: os.environ.get(k) for k in SWITCHES}}


def chunk_step():
    """(host ms until prefill_chunk returns, ms until the device is done) for one chunk at CTX."""
    engine.reset("P", logical=True)
    engine.prefill_chunk("P", CTX)
    mx.synchronize()
    t0 = time.perf_counter_ns()
    engine.prefill_chunk("P", T)
    host = ms(t0)
    mx.synchronize()
    return host, ms(t0)


steps = [chunk_step() for _ in range(N + 2)][2:]
out["chunk_host_ms"] = statistics.median(h for h, _ in steps)
out["chunk_total_ms"] = statistics.median(t for _, t in steps)

# mixed's ragged step: the same chunk beside one decode of a request at CTX (v20: a mixed round cost
# ~5 ms more than a chunk step and a decode); then that decode alone
engine.add_request("D", [(i * 104729 + 7) % model.config.vocab_size for i in range(CTX)])
for n in range(0, CTX, 1024):
    engine.prefill_chunk("D", min(1024, CTX - n))
mx.synchronize()


def mixed_step():
    engine.reset("P", logical=True)
    engine.prefill_chunk("P", CTX)
    mx.synchronize()
    t0 = time.perf_counter_ns()
    engine.batch([("P", T), ("D", None)])
    host = ms(t0)
    mx.synchronize()
    return host, ms(t0)


def decode_alone():
    t0 = time.perf_counter_ns()
    engine.decode("D")
    mx.synchronize()
    return ms(t0)


steps = [mixed_step() for _ in range(6)][1:]   # D's cache has room for CTX + T + 8 tokens
out["mixed_host_ms"] = statistics.median(h for h, _ in steps)
out["mixed_total_ms"] = statistics.median(t for _, t in steps)


def host_profile(label, build):
    """PROFILE=1: where the call that builds and issues one step spends its time (cProfile; issuing past MLX's
    command buffers in flight waits for the device, which shows as async_eval's own time); the 14 functions
    with the most time of their own, on stdout as # lines."""
    engine.reset("P", logical=True)
    engine.prefill_chunk("P", CTX)
    mx.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    build()
    prof.disable()
    mx.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    print("\n".join(f"# {label}: {line}" for line in text.getvalue().splitlines() if line.strip()), flush=True)


if os.environ.get("PROFILE"):   # after the timed steps, which it would slow; D decodes once more
    host_profile("chunk", lambda: engine.prefill_chunk("P", T))
    host_profile("mixed", lambda: engine.batch([("P", T), ("D", None)]))
out["decode_alone_ms"] = statistics.median(decode_alone() for _ in range(8))

layers = engine.model.layers
xs = {d: mx.random.normal((T, d)) for d in (1024, 2048, 3072)}  # a GEMM's input, by its width
PAIRS = (("wqkv", "d_qkv"), ("wo", "d_o"), ("w_gate_up", "d_gate_up"), ("w_down", "d_down"))
mats = [(L.t[t], getattr(L, d)) for L in layers for t, d in PAIRS]  # the prefill's weights, as the engine has them
mx.eval(xs)


def gemms():
    t0 = time.perf_counter_ns()
    mx.eval([K.linear_t(xs[m.shape[0]], m, d) for m, d in mats])  # as the engine calls them
    return ms(t0)


out["gemms_28_layers_ms"] = median_of(gemms)
xs = {d: mx.random.normal((T + 1, d)) for d in (1024, 2048, 3072)}  # a mixed step's rows: the chunk and a decode
mx.eval(xs)
out["gemms_129_rows_28_layers_ms"] = median_of(gemms)
xs = {d: mx.random.normal((T, d)) for d in (1024, 2048, 3072)}
mx.eval(xs)
out["gemms_per_step"] = len(mats)
flops = 2 * T * sum(m.size for m, _ in mats)
out["gemm_tflops"] = flops / out["gemms_28_layers_ms"] / 1e9

q = mx.random.normal((16, T, 128))
kv = [(mx.random.normal((8, CTX + T, 128)), mx.random.normal((8, CTX + T, 128))) for _ in layers]
mask = K.query_rows(K.causal_mask(mx.arange(CTX, CTX + T, dtype=mx.int32), CTX + T), 2)
attend = mx.compile(lambda q, k, v, m: K.attention_rows(q, k, v, mask_rows=m, scale=128 ** -0.5), shapeless=True)
mx.eval(q, kv, mask)


def attention():
    t0 = time.perf_counter_ns()
    mx.eval([attend(q, k, v, mask) for k, v in kv])
    return ms(t0)


out["attention_28_layers_ms"] = median_of(attention)
out["attention_tflops"] = 4 * 16 * T * (CTX + T) * 128 / out["attention_28_layers_ms"] / 1e9 * len(layers)

if K.BACKEND == "cuda":  # the flash kernel on caches as they lie (capacity past the chunk), as the engine calls it
    cap = CTX + T + 8
    caches = [(mx.random.normal((8, cap, 128)), mx.random.normal((8, cap, 128))) for _ in layers]
    positions, fence = mx.arange(CTX, CTX + T, dtype=mx.int32), K.new_fence()
    mx.eval(caches, positions, fence)

    def flash(q, positions):
        t0 = time.perf_counter_ns()
        mx.eval([K.flash_attention(q, k, v, positions, fence, scale=128 ** -0.5, length=CTX + T,
                                   arithmetic=K.flash_arithmetic()) for k, v in caches])
        return ms(t0)

    out["flash_28_layers_ms"] = median_of(lambda: flash(q, positions))
    out["flash_tflops"] = 4 * 16 * T * (CTX + T) * 128 / out["flash_28_layers_ms"] / 1e9 * len(layers)
    wq = mx.random.normal((16, CTX + T, 128))
    wpos = mx.arange(0, CTX + T, dtype=mx.int32)
    mx.eval(wq, wpos)

    # a whole prompt of CTX + T rows: causal, so half the square's FLOPs
    out["flash_whole_prompt_28_layers_ms"] = median_of(lambda: flash(wq, wpos))
    out["flash_whole_tflops"] = 2 * 16 * (CTX + T) ** 2 * 128 / out["flash_whole_prompt_28_layers_ms"] / 1e9 * len(layers)
if K.BACKEND == "cuda":  # a mixed step's decode row: one query row over D's cache
    one, at = q[:, :1], mx.array([CTX], dtype=mx.int32)
    mx.eval(one, at)
    out["flash_one_row_28_layers_ms"] = median_of(lambda: flash(one, at))
    c = model.config   # what a mixed step runs for that row instead (v27): decode attention from the raw q|k|v row
    raw, L0 = mx.random.normal(((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,)), layers[0]
    mx.eval(raw)

    def decode_rows():
        t0 = time.perf_counter_ns()
        mx.eval([K.decode_attention(raw, L0.q_norm, L0.k_norm, engine.model.inv_freq, at, k, v, fence,
                                    heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                                    eps=c.rms_norm_eps)[0] for k, v in caches])
        return ms(t0)

    out["decode_attention_one_row_28_layers_ms"] = median_of(decode_rows)
    raw_rows = mx.random.normal((T, c.num_attention_heads + 2 * c.num_key_value_heads, c.head_dim))
    mx.eval(raw_rows)

    def qk_rope():   # a chunk's q/k norms, RoPE and K/V store as one kernel (v27), on its own
        t0 = time.perf_counter_ns()
        mx.eval([K.qk_rope_store_kernel(raw_rows, L0.q_norm, L0.k_norm, engine.model.inv_freq, positions, k, v,
                                        fence, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                                        eps=c.rms_norm_eps)[::3] for k, v in caches])
        return ms(t0)

    out["qk_rope_store_28_layers_ms"] = median_of(qk_rope)

# the step's two compiled pieces around attention (each with its GEMMs; since v30 the in-norm is the piece
# after attention's, as the norm after its last residual add), for a chunk (RoPE by mx.fast.rope from the
# first position) and for a mixed step's 129 rows (RoPE by tables: the rows' positions are scattered)
M, D = engine.model, model.config.hidden_size
h_rows = {n: mx.random.normal((n, D)) for n in (T, T + 1)}
o_rows = {n: mx.random.normal((model.config.num_attention_heads, n, model.config.head_dim)) for n in (T, T + 1)}
tables = K.rope_tables(mx.concatenate([mx.arange(CTX, CTX + T, dtype=mx.int32), mx.array([CTX], dtype=mx.int32)]),
                       M.inv_freq)
first = mx.array(CTX, dtype=mx.int32)
mx.eval(h_rows, o_rows, tables, first)


def qkv(n, *rope):
    t0 = time.perf_counter_ns()
    mx.eval([M._p_qkv(h_rows[n], (L.t["wqkv"], L.d_qkv), L.t["qk_norm"], *rope) for L in layers])   # x normed
    return ms(t0)


def out_mlp(n):
    t0 = time.perf_counter_ns()
    mx.eval([M._p_out_mlp(h_rows[n], o_rows[n], (L.t["wo"], L.d_o), L.post_norm, (L.t["w_gate_up"], L.d_gate_up),
                          (L.t["w_down"], L.d_down), L.in_norm) for L in layers])   # + the next in-norm
    return ms(t0)


out["qkv_28_layers_ms"] = median_of(lambda: qkv(T, first))
out["qkv_ragged_129_rows_28_layers_ms"] = median_of(lambda: qkv(T + 1, *tables))
out["out_mlp_28_layers_ms"] = median_of(lambda: out_mlp(T))
out["out_mlp_129_rows_28_layers_ms"] = median_of(lambda: out_mlp(T + 1))
tiny = mx.zeros((4,))
mx.eval(tiny)


def small_ops(n=28 * 12):
    t0 = time.perf_counter_ns()
    y = tiny
    for _ in range(n):
        y = y * 1.0001
    mx.eval(y)
    return ms(t0)


out["336_tiny_ops_ms"] = median_of(small_ops)
print(json.dumps(out))

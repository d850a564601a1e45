"""Where the persistent decode's ~0.55 ms of host time per token goes (issue 12). One JSON line per case.

1. Trivial `mx.fast.cuda_kernel` launches (thread 0 adds one to a chained token), varying what the real launch
   has: inputs (99), of which big K/V-sized arrays (56 x 21 MB), outputs (33), and a ~60 KB source. Per launch:
   the call (graph build), mx.async_eval, until .item() returns; and pipelined (50 chained, one eval).
2. The real decode step, split the same way, plus an async_eval of the cache lists alone.

    python3 notes/gpu-session/dispatch_probe.py [context]
"""

import json
import os
import statistics
import sys
import time

import mlx.core as mx

N = 50


def med(xs):
    return round(statistics.median(xs[10:]), 4)


def trivial(n_small: int, n_big: int, n_out: int, big_source: bool, big_mb: float = 21.0, chained: bool = False):
    from pdlib.engine.kernels import persistent_decode as P
    names = ["tok"] + [f"s{i}" for i in range(n_small)] + [f"b{i}" for i in range(n_big)]
    if chained:  # the small inputs are the last launch's outputs (as the decode's 28 fences were)
        assert n_small == n_out - 1
    outs = [f"o{i}" for i in range(n_out)]
    body = "if (threadIdx.x == 0 && blockIdx.x == 0) {\n" + \
        "\n".join(f"  {o}[0] = tok[0] + 1u; {o}[1] = 0u; {o}[2] = 0u; {o}[3] = 0u;" for o in outs) + "\n}\n"
    k = mx.fast.cuda_kernel(name=f"probe_{n_small}_{n_big}_{n_out}_{int(big_source)}", input_names=names,
                            output_names=outs, source=body, header=P.HEADER if big_source else "")
    small = [mx.zeros((16,), mx.uint32) for _ in range(n_small)]
    big = [mx.zeros((int(big_mb * 2**20) // 4,), mx.float32) for _ in range(n_big)]
    tok = mx.zeros((4,), mx.uint32)
    mx.eval(small, big, tok)

    def call(t):
        nonlocal small
        o = k(inputs=[t, *small, *big], grid=(32, 1, 1), threadgroup=(32, 1, 1),
              output_shapes=[(4,)] * n_out, output_dtypes=[mx.uint32] * n_out)
        if chained:
            small = o[1:]
        return o

    t_call, t_async, t_item = [], [], []
    for _ in range(N):
        t0 = time.perf_counter_ns()
        o = call(tok)
        t1 = time.perf_counter_ns()
        mx.async_eval(o)
        t2 = time.perf_counter_ns()
        o[0][0].item()
        t3 = time.perf_counter_ns()
        tok = o[0]
        t_call.append((t1 - t0) / 1e3), t_async.append((t2 - t1) / 1e3), t_item.append((t3 - t2) / 1e3)
    t0 = time.perf_counter_ns()
    for _ in range(N):
        o = call(tok)
        mx.async_eval(o)
        tok = o[0]
    tok[0].item()
    pipe = (time.perf_counter_ns() - t0) / 1e3 / N
    return {"case": "trivial", "inputs": 1 + n_small + n_big, "big_inputs": n_big, "big_mb": big_mb,
            "outputs": n_out, "big_source": big_source, "chained": chained, "call_us": med(t_call),
            "async_eval_us": med(t_async), "item_us": med(t_item), "pipelined_us": round(pipe, 2)}


def real(ctx: int):
    from pdlib.engine import Engine, check_token
    from pdlib.weights import load_model
    model = load_model("synthetic:qwen3-0.6b")
    engine = Engine(model, capacity=ctx + 1200)
    engine.add_request("X", [(i * 7919 + 13) % 50000 for i in range(ctx)])
    engine.reset("X", logical=True)
    engine.prefill_chunk("X", ctx).token.item()
    r = engine.requests["X"]
    m = engine.model
    rows = {k: [] for k in ("model_decode_us", "async_eval_us", "item_us", "cache_async_eval_us", "engine_decode_us",
                            "engine_item_us")}
    for _ in range(N):
        t0 = time.perf_counter_ns()
        logits, token = m.decode(r.cache, r.next_token)
        t1 = time.perf_counter_ns()
        mx.async_eval(token, logits)
        t2 = time.perf_counter_ns()
        check_token(token.item())
        t3 = time.perf_counter_ns()
        mx.async_eval(r.cache.k, r.cache.v, r.cache.written)
        t4 = time.perf_counter_ns()
        r.next_token = token
        rows["model_decode_us"].append((t1 - t0) / 1e3)
        rows["async_eval_us"].append((t2 - t1) / 1e3)
        rows["item_us"].append((t3 - t2) / 1e3)
        rows["cache_async_eval_us"].append((t4 - t3) / 1e3)
    for _ in range(N):
        t0 = time.perf_counter_ns()
        out = engine.decode("X")
        t1 = time.perf_counter_ns()
        check_token(out.token.item())
        t2 = time.perf_counter_ns()
        rows["engine_decode_us"].append((t1 - t0) / 1e3)
        rows["engine_item_us"].append((t2 - t1) / 1e3)
    return {"case": "real", "context": ctx, "decode": m.decode_mode, **{k: med(v) for k, v in rows.items()}}


if __name__ == "__main__":
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    head = {"MLX_USE_CUDA_GRAPHS": os.environ.get("MLX_USE_CUDA_GRAPHS")}
    cases = [(0, 0, 1, False), (98, 0, 33, False), (16, 0, 6, False), (42, 56, 33, False), (15, 2, 6, False),
             (0, 0, 1, True), (98, 0, 33, True), (14, 1, 1, False, 1200.0), (32, 0, 33, False, 21.0, True)]
    for c in cases:
        try:
            row = trivial(*c)
        except Exception as e:  # keep going: one failing case must not hide the others
            row = {"case": "trivial", "args": c, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps({**head, **row}), flush=True)
    try:
        row = real(ctx)
    except Exception as e:
        row = {"case": "real", "error": f"{type(e).__name__}: {e}"}
    print(json.dumps({**head, **row}), flush=True)

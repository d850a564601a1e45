"""Where the persistent decode kernel's time goes (issue 12): ms per token with the token observed on the host
(and how much of it the host spends before the device starts: `dispatch_ms`, until decode() returns; then,
in a loop of its own, that time split into dispatch, the wait for the stream, and the token's read, to say
where observed's ~0.5 ms over pipelined goes: v29 took only ~0.07 ms of it by queueing the launch) and
pipelined (no host sync, the device's own pace), and one step's phase timeline from block 0's clocks
(P.launch(stamps=True)), medians over layers 1-27 in µs, the launch of median length of five. One JSON line
each; then the timeline alone for each other attention load-group size given.

    python3 notes/gpu-session/persistent_profile.py [context [kv_group ...]]
    PAIR=1 python3 notes/gpu-session/persistent_profile.py [context]   # then a pair launch's timeline too

With PAIR=1 a last line times two requests at the same context in one launch (P.launch(pair=...)): its phases
against the single's, to say how a pair step's ~66 µs a layer split (notes/gpu.md, v38).
"""

import json
import os
import statistics
import sys
import time

import mlx.core as mx

from pdlib.engine import Engine, check_token
from pdlib.engine.kernels import persistent_decode as P
from pdlib.weights import load_model

CTX = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
model = load_model("synthetic:qwen3-0.6b")
cfg = model.config
engine = Engine(model, capacity=CTX + 1200, decode="persistent")
engine.add_request("X", [(i * 7919 + 13) % 50000 for i in range(CTX)])
engine.reset("X", logical=True)
engine.prefill_chunk("X", CTX).token.item()
req, q = engine.requests["X"], engine.model
kw = dict(heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, eps=cfg.rms_norm_eps)
PHASES = ["norm+qkv", "barrier1", "attention", "barrier2", "o_proj", "barrier3", "norm+gate_up", "barrier4",
          "down", "barrier5"]


def observed(n=40):
    times, dispatch = [], []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        out = engine.decode("X")
        dispatch.append((time.perf_counter_ns() - t0) / 1e6)
        check_token(out.token.item())
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return {"observed_ms": statistics.median(times[5:]), "dispatch_ms": statistics.median(dispatch[5:])}


def observed_split(n=40):
    """Medians (ms): decode() returning, then mx.synchronize(), then .item() on the finished token."""
    parts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        out = engine.decode("X")
        t1 = time.perf_counter_ns()
        mx.synchronize()
        t2 = time.perf_counter_ns()
        check_token(out.token.item())
        t3 = time.perf_counter_ns()
        parts.append(((t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6, (t3 - t0) / 1e6))
    parts = parts[5:]
    return {f"split_{k}_ms": statistics.median(p[i] for p in parts)
            for i, k in enumerate(("dispatch", "wait", "read", "total"))}


def pipelined(n=40):
    engine.decode("X").token.item()
    t0 = time.perf_counter_ns()
    toks = [engine.decode("X").token for _ in range(n)]
    mx.eval(toks)
    return (time.perf_counter_ns() - t0) / 1e6 / n


def timeline(blocks, kv_group=P.KV_GROUP, pair=None):
    """One launch's phases; `pair`: a second request, decoded in the same launch (its tokens: token_ok's last
    four words)."""
    c = req.cache
    second = None if pair is None else (pair.next_token, pair.cache.position(), pair.cache.k_all, pair.cache.v_all,
                                        pair.cache.written)
    outs = P.launch(req.next_token, c.position(), q.decode_weights, c.k_all, c.v_all, c.written, P.new_sync(),
                    blocks=blocks, stamps=True, kv_group=kv_group, pair=second, **kw)
    mx.eval(outs)
    s = outs[4].tolist()
    L = cfg.num_hidden_layers
    ns, cyc = s[: 10 * L + 3], s[10 * L + 3:]
    end = lambda l, k: ns[l * 10 + k + 1] if l * 10 + k + 1 < 10 * L else ns[10 * L]  # noqa: E731
    per = {name: statistics.median((end(l, k) - ns[l * 10 + k]) / 1e3 for l in range(1, L))
           for k, name in enumerate(PHASES)}
    total_ns = ns[10 * L + 1] - ns[10 * L + 2]
    return {"kv_group": kv_group, "phases_us": per, "layer_us": sum(per.values()),
            "lm_head_us": (ns[10 * L + 1] - ns[10 * L]) / 1e3,
            "first_phase_start_us": (ns[0] - ns[10 * L + 2]) / 1e3, "kernel_us": total_ns / 1e3,
            "sm_ghz": (cyc[10 * L + 1] - cyc[10 * L + 2]) / total_ns,
            "token_ok": outs[1].tolist()[:2] + outs[1].tolist()[4:6]}


def steady(fn, n=5):
    """fn's row with the median kernel time of n launches (the first compiles)."""
    fn()
    rows = sorted((fn() for _ in range(n)), key=lambda r: r["kernel_us"])
    return rows[n // 2]


nb = P.sm_count()
head = {"context": CTX, "blocks": nb, "MLX_USE_CUDA_GRAPHS": os.environ.get("MLX_USE_CUDA_GRAPHS"),
        "fold": P.folded()}
try:
    row = {**head, **observed(), **observed_split(), "pipelined_ms": pipelined(), **steady(lambda: timeline(nb))}
except Exception as e:
    row = {**head, "error": f"{type(e).__name__}: {e}"}
print(json.dumps(row), flush=True)
if os.environ.get("PAIR") == "1":  # two requests in one launch: the timeline only
    engine.add_request("Y", [(i * 7919 + 13) % 50000 for i in range(CTX)])
    engine.reset("Y", logical=True)
    engine.prefill_chunk("Y", CTX).token.item()
    try:
        row = {**head, "pair": True, **steady(lambda: timeline(nb, pair=engine.requests["Y"]))}
    except Exception as e:
        row = {**head, "pair": True, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(row), flush=True)
for g in sys.argv[2:]:  # other load-group sizes: the timeline only
    try:
        row = {**head, **steady(lambda: timeline(nb, int(g)))}
    except Exception as e:
        row = {**head, "kv_group": int(g), "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(row), flush=True)

"""A persistent decode kernel switch's settings against each other (issue 12), at 4K and 5K context, in
alternating rounds on one engine: `fold` (0 or 1) or `kv_group` (keys per warp and stage), as `launch` takes
them. Per setting and round: the kernel's own time and phases (block 0's clocks, the launch of median length
of five, stamps on), the device's pace with launches queued back to back (each takes the fence the one before
returned, as decode does; stamps off), and the token observed on the host after each launch. Every launch is
at the same position (its new K/V slot rewritten with the same values), so every setting sees the same cache;
each setting's logits, token and written slots are compared with the first's bit for bit (`same_as_first`:
settings that only move bytes must match; fold changes the sums' order and need not). One JSON line per
setting and round, then medians. v33 and v34 ran it for two switches since taken out again (L2 look-ahead at
3036335, the barrier's fences at eb3f405; notes/gpu.md, v33-v34).

    python3 notes/gpu-session/persistent_ab.py knob rounds setting [setting ...]     e.g. kv_group 2 4 2
"""

import json
import statistics
import sys
import time

import mlx.core as mx

from pdlib.engine import Engine, check_token
from pdlib.engine.kernels import persistent_decode as P
from pdlib.weights import load_model

KNOB, ROUNDS, MODES = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
MODES = [m == "1" for m in MODES] if KNOB == "fold" else [int(m) for m in MODES]
PHASES = ["norm+qkv", "barrier1", "attention", "barrier2", "o_proj", "barrier3", "norm+gate_up", "barrier4",
          "down", "barrier5"]
model = load_model("synthetic:qwen3-0.6b")
cfg = model.config
L = cfg.num_hidden_layers
engine = Engine(model, capacity=6400, decode="persistent")
q = engine.model
kw = dict(heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, eps=cfg.rms_norm_eps)


def launch(mode, sync, written, stamps=False):
    c = req.cache
    return P.launch(req.next_token, c.position(), q.decode_weights, c.k_all, c.v_all, written, sync,
                    stamps=stamps, **{KNOB: mode}, **kw)


def timeline(mode):
    outs = launch(mode, P.new_sync(), req.cache.written, stamps=True)
    mx.eval(outs)
    s = outs[4].tolist()
    ns = s[: 10 * L + 3]
    end = lambda l, k: ns[l * 10 + k + 1] if l * 10 + k + 1 < 10 * L else ns[10 * L]  # noqa: E731
    per = {name: statistics.median((end(l, k) - ns[l * 10 + k]) / 1e3 for l in range(1, L))
           for k, name in enumerate(PHASES)}
    return {"kernel_us": (ns[10 * L + 1] - ns[10 * L + 2]) / 1e3, "layer_us": sum(per.values()),
            "lm_head_us": (ns[10 * L + 1] - ns[10 * L]) / 1e3, "phases_us": per}, outs


def pipelined(mode, n=60):
    sync, written = P.new_sync(), req.cache.written
    mx.eval(launch(mode, sync, written)[1])
    t0 = time.perf_counter_ns()
    toks = []
    for _ in range(n):
        outs = launch(mode, sync, written)
        written = outs[5]
        toks.append(outs[1])
    mx.eval(toks)
    return (time.perf_counter_ns() - t0) / 1e6 / n


def observed(mode, n=40):
    sync, written, times = P.new_sync(), req.cache.written, []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        outs = launch(mode, sync, written)
        written = outs[5]
        check_token(outs[1][0].item())
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times[5:])


def slots():
    """Every layer's K and V at the step's position (the slots each launch writes)."""
    c, p = req.cache, req.cache.length
    return mx.concatenate([c.k_all[:, :, p].reshape(-1), c.v_all[:, :, p].reshape(-1)])


rows = []
for ctx in (4096, 5120):
    engine.add_request(f"X{ctx}", [(i * 7919 + 13) % min(50000, cfg.vocab_size) for i in range(ctx)])
    engine.reset(f"X{ctx}", logical=True)
    engine.prefill_chunk(f"X{ctx}", ctx).token.item()
    req = engine.requests[f"X{ctx}"]
    ref = None
    for rnd in range(ROUNDS):
        for mode in MODES:
            try:
                # the median of five stamped launches (the first compiles), its outputs kept for the comparison
                runs = [timeline(mode) for _ in range(6)][1:]
                row, outs = sorted(runs, key=lambda r: r[0]["kernel_us"])[2]
                got = (outs[0], outs[1][:2], slots())
                mx.eval(got)
                if ref is None and mode == MODES[0]:
                    ref = got
                same = None if ref is None else all(mx.array_equal(a, b).item() for a, b in zip(got, ref))
                row = {"context": ctx, "mode": mode, "round": rnd, **row, "pipelined_ms": pipelined(mode),
                       "observed_ms": observed(mode), "token": outs[1][0].item(), "same_as_first": same}
            except Exception as e:  # noqa: BLE001 (the next mode still runs)
                row = {"context": ctx, "mode": mode, "round": rnd, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(json.dumps(row), flush=True)

print(f"{'context':>7} {'mode':>13} {'kernel us':>9} {'layer us':>8} {'attn us':>7} {'b2 us':>6} {'piped ms':>8} "
      f"{'observed':>8}  same", flush=True)
for ctx in (4096, 5120):
    for mode in MODES:
        mine = [r for r in rows if r["context"] == ctx and r["mode"] == mode and "error" not in r]
        if not mine:
            print(f"{ctx:>7} {mode:>13} (no run)")
            continue
        med = lambda f: statistics.median(f(r) for r in mine)  # noqa: E731
        print(f"{ctx:>7} {mode:>13} {med(lambda r: r['kernel_us']):9.1f} {med(lambda r: r['layer_us']):8.2f} "
              f"{med(lambda r: r['phases_us']['attention']):7.2f} {med(lambda r: r['phases_us']['barrier2']):6.2f} "
              f"{med(lambda r: r['pipelined_ms']):8.3f} {med(lambda r: r['observed_ms']):8.3f}  "
              f"{all(r['same_as_first'] for r in mine)}", flush=True)

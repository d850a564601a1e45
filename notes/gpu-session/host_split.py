"""Where the host's time goes while it builds and issues one 128-token chunk step (issue 12, after v35: every
prompt-chunk step in the published reports lasted as long as the host took to issue it). The engine's
layer-by-layer dispatch (`Engine._layer_by_layer`), taken apart: per layer, the Python that builds its graph
(`Qwen3.stages`' next()) and MLX's `async_eval` of it (encoding its launches; it also waits while more than ten
command buffers are in flight), each as wall time and as this thread's CPU time, then `_finish`. Medians over
N chunk steps at a context, the device idle before each (as chunk_anatomy.py's chunk_host_ms); one JSON line.

    python3 notes/gpu-session/host_split.py [context [steps]]
"""

import json
import os
import statistics
import sys
import time

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.weights import load_model

T = 128
CTX = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
N = int(sys.argv[2]) if len(sys.argv) > 2 else 15
model = load_model(os.environ.get("MODEL", "synthetic:qwen3-0.6b"))
engine = Engine(model, capacity=CTX + T + 8)
engine.add_request("P", [(i * 7919 + 13) % model.config.vocab_size for i in range(CTX + T + 1)])


def clocks():
    return time.perf_counter_ns(), time.thread_time_ns()


def one_step() -> dict:
    """One chunk step at CTX, issued as Engine.batch does with layers dispatch, each part timed (µs)."""
    engine.reset("P", logical=True)
    engine.prefill_chunk("P", CTX)
    mx.synchronize()
    req = engine.requests["P"]
    w0, c0 = clocks()
    segments = [engine._segment("P", T)]
    stages = engine.model.stages(segments, prune=engine.prune_final_layer)
    build, build_cpu, issue, issue_cpu = [], [], [], []
    while True:
        w1, c1 = clocks()
        try:
            arrays = next(stages)
        except StopIteration as done:
            logits = done.value
            break
        w2, c2 = clocks()
        mx.async_eval(arrays)
        w3, c3 = clocks()
        build.append(w2 - w1), build_cpu.append(c2 - c1), issue.append(w3 - w2), issue_cpu.append(c3 - c2)
    w4, c4 = clocks()
    engine._finish([req], logits)
    w5, c5 = clocks()
    mx.synchronize()
    w6, _ = clocks()
    us = lambda ns: ns / 1e3  # noqa: E731
    return {"layers": len(build), "build_us": us(sum(build)), "build_cpu_us": us(sum(build_cpu)),
            "async_eval_us": us(sum(issue)), "async_eval_cpu_us": us(sum(issue_cpu)),
            "tail_us": us(w5 - w4), "tail_cpu_us": us(c5 - c4),
            "issued_us": us(w5 - w0), "issued_cpu_us": us(c5 - c0), "done_us": us(w6 - w0),
            "layer_build_us": [round(us(x), 1) for x in build], "layer_async_eval_us": [round(us(x), 1) for x in issue]}


rows = [one_step() for _ in range(N + 2)][2:]
out = {"context": CTX, "rows": T, "steps": N, "dispatch": engine.dispatch, "label": os.environ.get("LABEL")}
for key in ("build_us", "build_cpu_us", "async_eval_us", "async_eval_cpu_us", "tail_us", "tail_cpu_us", "issued_us",
            "issued_cpu_us", "done_us"):
    out[key] = round(statistics.median(r[key] for r in rows), 1)
mid = sorted(rows, key=lambda r: r["issued_us"])[len(rows) // 2]   # the step of median issue time, layer by layer
out["median_step_layer_build_us"], out["median_step_layer_async_eval_us"] = (mid["layer_build_us"],
                                                                             mid["layer_async_eval_us"])
print(json.dumps(out), flush=True)

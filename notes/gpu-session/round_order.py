"""A chunked round in two orders (issue 12, v29): A's decode launched once the host has seen B's chunk end
(`observed`, how the executor ran a round before v29) or queued behind the chunk before it ends (`queued`,
pipelined decodes since v29). A decodes at CONTEXT (default 4,096) while B's 4,096-token prompt goes in
128-token chunks, as the chunked policy's rounds do; passes alternate between the orders. Prints one JSON
line: per order, A's gaps (token to token) over all passes, median, p90 and worst, in ms.

    python3 notes/gpu-session/round_order.py [passes]
"""

import json
import os
import statistics
import sys
import time

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.weights import load_model

CTX, PROMPT, T = int(os.environ.get("CONTEXT", 4096)), 4096, 128
PASSES = int(sys.argv[1]) if len(sys.argv) > 1 else 6
ROUNDS = PROMPT // T


def ids(n, a, b, vocab):
    return [(i * a + b) % vocab for i in range(n)]


model = load_model(os.environ.get("MODEL", "synthetic:qwen3-0.6b"))
vocab = model.config.vocab_size
engine = Engine(model, capacity=max(CTX, PROMPT) + 2 * (PASSES + 2) * (ROUNDS + 1) + 8)
engine.add_request("A", ids(CTX, 7919, 13, vocab))
engine.add_request("B", ids(PROMPT, 104729, 7, vocab))
for n in range(0, CTX, 1024):
    engine.prefill_chunk("A", min(1024, CTX - n))
mx.synchronize()


def one_pass(order: str) -> list[float]:
    """A's gaps (ms) across B's whole prompt, in 128-token chunks, each round a chunk then A's decode."""
    engine.reset("B", logical=True)
    engine.decode("A").token.item()
    mx.synchronize()
    last, gaps = time.perf_counter_ns(), []
    for _ in range(ROUNDS):
        engine.batch([("B", T)])
        if order == "observed":
            mx.synchronize()   # the chunk seen done, then A's decode launched
        token = engine.decode("A").token
        token.item()
        now = time.perf_counter_ns()
        gaps.append((now - last) / 1e6)
        last = now
    mx.synchronize()
    return gaps


for order in ("observed", "queued"):   # warm-up: every shape compiled
    one_pass(order)
gaps = {"observed": [], "queued": []}
for i in range(PASSES):
    for order in (("observed", "queued") if i % 2 == 0 else ("queued", "observed")):
        gaps[order].extend(one_pass(order))
out = {"context": CTX, "passes": PASSES, "rounds_per_pass": ROUNDS}
for order, g in gaps.items():
    g = sorted(g)
    out[order] = {"median_ms": statistics.median(g), "p90_ms": g[int(0.9 * (len(g) - 1))], "max_ms": g[-1]}
print(json.dumps(out))

"""bench-step's decode rounds: one step that decodes N requests at one context (a serving policy's decode round),
timed in each PDLIB_DECODE_ROUND mode, next to its byte floor: the bf16 weights read once plus every row's FP32
K/V cache, over the device-to-device copy bandwidth measured in the same run.

    rounds = bench_rounds(model, rows=(1, 8, 32), context=2048, tokens=50, warmup=5, bandwidth=bw)

`each`: a decode launch per request (two share the paired persistent launch); `step`: one ragged engine step, the
weights read once for all rows and their attention one launch a layer over the requests' cache pool; `compiled`:
that step as one compiled function (engine/round.py; where the rows kernel does not run, `step`'s launches);
`pairs`: the rows two by two in persistent pair launches, the odd one alone (PDLIB_ROUND_PAIRS at least N; where
pairs do not run, `each`); `groups`: the rows in persistent launches of up to 8 (PDLIB_ROUND_GROUP 8: as many as
the kernel fits, eight of Qwen3-0.6B's; where pairs do not run, `each`). The modes apply from three rows; below
that they run the same launches.
`ms`: every round's tokens observed on the host before the next round is built; `pipelined_ms`: the next round
built and started before this one's tokens are read, as `serve` runs its decode rounds (pipeline_decodes), so the
host's work hides behind the device's; the median over `tokens` rounds. `host_ms`: the median time in
`Engine.batch` alone (building the round's graph and starting it, layer by layer, while the device runs what was
started): near the pipelined round's time, the round is bound by the host.
"""

import statistics
import time

from pdlib.engine import Engine, check_token, observe_all
from pdlib.tools.timing import bench_prompt, ms_since, observed, pipelined
from pdlib.weights import LoadedModel

MODES = ("each", "step", "compiled", "pairs", "groups")


def kv_bytes(cfg, context: int) -> int:
    """One request's FP32 K and V over `context` positions, every layer."""
    return cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * 4 * context


def round_bytes(cfg, context: int, rows: int, weights: int) -> int:
    return weights + rows * kv_bytes(cfg, context)


def bench_rounds(
    model: LoadedModel, *, rows=(1, 8, 32), context: int, tokens: int, warmup: int, bandwidth: float, weights: int
) -> dict:
    """Median ms of a round of N decodes per mode and N; `weights`: the bytes a decode step reads of them."""
    cfg = model.config
    engine = Engine(model, capacity=context + 2 * (warmup + tokens + 2), slots=max(rows))  # observed, then pipelined
    names = [f"R{i}" for i in range(max(rows))]
    for i, name in enumerate(names):
        engine.add_request(name, bench_prompt(cfg.vocab_size, context, i))
    out = {"context": context, "rows": list(rows)}
    out.update({k: {m: {} for m in MODES} for k in ("ms", "pipelined_ms", "host_ms")})
    out.update(bytes={}, floor_ms={})
    for mode in MODES:
        engine.decode_round = "each" if mode in ("pairs", "groups") else mode
        engine.round_pairs = max(rows) if mode in ("pairs", "groups") else 2
        engine.round_group = 8 if mode == "groups" else 2
        for n in rows:
            parts = [(name, None) for name in names[:n]]
            for name in names[:n]:
                engine.reset(name, logical=True)
                engine.prefill_chunk(name, context).token.item()
            host = []

            def round_(parts=parts, host=host):
                t0 = time.perf_counter_ns()
                outs = engine.batch(parts)
                host.append(ms_since(t0))
                return [check_token(t) for t in observe_all(outs)]

            out["ms"][mode][str(n)] = statistics.median(observed(round_, tokens, warmup))
            out["host_ms"][mode][str(n)] = statistics.median(host[warmup:])

            def seen(outs):  # every row's token checked; the first goes back to pipelined's own check
                tokens_ = observe_all(outs)
                for t in tokens_[1:]:
                    check_token(t)
                return tokens_[0]

            piped = pipelined(lambda _, parts=parts: engine.batch(parts), engine.batch(parts), tokens, warmup, seen)
            out["pipelined_ms"][mode][str(n)] = statistics.median(piped)
    for n in rows:
        b = round_bytes(cfg, context, n, weights)
        out["bytes"][str(n)], out["floor_ms"][str(n)] = b, b / bandwidth * 1e3
    return out


__all__ = ["MODES", "bench_rounds", "kv_bytes", "round_bytes"]

"""Where a serving step's time goes on the host: one prompt chunk of C tokens beside R decode rows (chunked's prompt
step at R = 0, mixed's with R), built as `serve` builds it (Engine.batch), in each PDLIB_STEP_DISPATCH mode.

    result = profile_serve_steps(model, chunk=512, rows=(0, 8, 32), context=2048, steps=20)

Each step prefills the next C tokens of a prompt of `context` + C tokens (rewound, logically, when it runs out)
and decodes one token of each of R requests already at `context` positions. Per (dispatch, R): `ms`, the median
step from Engine.batch's call to its outputs read on the host and its work done (a silent chunk's K/V writes too);
`host_ms`, the median of Engine.batch alone (building the step and starting it): near `ms`, the device waits on
the host; and `profile`, the Python functions with the most own time inside Engine.batch over further steps run
under cProfile, in ms a step (cProfile's own cost inflates them: compare them with each other and with
`profiled_host_ms`, their sum's yardstick, not with `ms`).
"""

import cProfile
import pstats
import statistics
import time
from pathlib import Path

import mlx.core as mx

from pdlib.engine import Engine, observe_all
from pdlib.tools.timing import bench_prompt

DISPATCHES = ("layers", "step")
TOP = 25


def _where(key: tuple) -> str:
    """cProfile's (file, line, function) as a short name: the path from its package down."""
    file, line, name = key
    parts = Path(file).parts
    for root in ("pdlib", "mlx", "mlx_lm"):
        if root in parts:
            file = "/".join(parts[len(parts) - 1 - parts[::-1].index(root) :])
            break
    return f"{file}:{line}({name})" if line else name


def profile_serve_step(engine: Engine, prompt: str, names: list[str], *, chunk: int, steps: int) -> dict:
    """profile_serve_steps' record for one engine state: `prompt`'s next chunk beside a decode of each of `names`."""
    parts = [(prompt, chunk)] + [(name, None) for name in names]
    host: list[float] = []
    ms: list[float] = []

    def step(profiler=None):
        r = engine.requests[prompt]
        if r.prefilled + chunk > r.prompt.size:
            engine.reset(prompt, logical=True)
        t0 = time.perf_counter_ns()
        if profiler is not None:
            profiler.enable()
        outs = engine.batch(parts)
        if profiler is not None:
            profiler.disable()
        t1 = time.perf_counter_ns()
        observe_all(outs)
        mx.synchronize()  # a chunk that does not finish its prompt emits nothing to observe: wait for its writes
        host.append((t1 - t0) / 1e6)
        ms.append((time.perf_counter_ns() - t0) / 1e6)

    for _ in range(3):  # traces and first launches out of the numbers
        step()
    host.clear()
    ms.clear()
    for _ in range(steps):
        step()
    out = {"ms": statistics.median(ms), "host_ms": statistics.median(host)}
    profiler = cProfile.Profile()
    host.clear()
    for _ in range(steps):
        step(profiler)
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, _)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:TOP]
    out["profiled_host_ms"] = statistics.median(host)
    out["profile"] = [
        {"function": _where(key), "own_ms": own / steps * 1e3, "cum_ms": cum / steps * 1e3, "calls": calls / steps}
        for key, (_, calls, own, cum, _) in rows
    ]
    return out


def profile_serve_steps(model, *, chunk: int, rows, context: int, steps: int) -> dict:
    """{dispatch: {R: record}} (module docstring) on one engine: max(rows) requests prefilled to `context` and one
    prompt of `context` + `chunk` tokens, all in one pool."""
    rows = sorted(set(rows))
    per_step = 2 * (steps + 3)  # every R's decodes, timed and profiled, in both dispatch modes
    capacity = context + chunk + len(DISPATCHES) * len(rows) * per_step + 8
    engine = Engine(model, capacity=capacity, slots=max(rows) + 1)
    names = [f"R{i}" for i in range(max(rows))]
    vocab = model.config.vocab_size
    for i, name in enumerate(names):
        engine.add_request(name, bench_prompt(vocab, context, i))
        engine.prefill_chunk(name, context).token.item()
    engine.add_request("P", bench_prompt(vocab, context + chunk, len(names)))
    out: dict = {"chunk": chunk, "context": context, "steps": steps}
    for dispatch in DISPATCHES:
        engine.dispatch = dispatch
        out[dispatch] = {str(r): profile_serve_step(engine, "P", names[:r], chunk=chunk, steps=steps) for r in rows}
    return out


def format_serve_steps(result: dict, top: int = 8) -> str:
    """A line per (dispatch, R), then its `top` functions by own time."""
    lines = []
    for dispatch in DISPATCHES:
        for r, rec in result[dispatch].items():
            ms, host, prof = rec["ms"], rec["host_ms"], rec["profiled_host_ms"]
            head = f"{dispatch:6s} chunk {result['chunk']} + {r:>2s} decode rows: step {ms:8.3f} ms"
            lines.append(f"{head}, host {host:8.3f} ms ({host / ms:.0%}); profiled host {prof:.3f} ms")
            for f in rec["profile"][:top]:
                own, cum, calls = f["own_ms"], f["cum_ms"], f["calls"]
                lines.append(f"    {own:8.3f} ms own {cum:8.3f} cum {calls:7.1f}x  {f['function']}")
    return "\n".join(lines)


__all__ = ["DISPATCHES", "format_serve_steps", "profile_serve_step", "profile_serve_steps"]

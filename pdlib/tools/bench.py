"""`python -m pdlib bench-step`: one decode step and one prompt's prefill, pdlib's engine next to mlx-lm's
Qwen3 on the same device, same weights, in one run, and, where torch sees a CUDA device, transformers' Qwen3
with a static cache and torch.compile in FP32 and bf16 (bench_hf.py). Prints a table, writes JSON.

    python -m pdlib bench-step --model synthetic:qwen3-0.6b --output bench.json

Decode: median ms per token at each context (the token observed on the host, as in the trials), after a
warm-up; and pipelined, each token observed only after the next step is issued (mlx-lm's `generate` runs
this way), the interval between observations: the device's pace plus what the host cannot hide. Prefill: a
whole 4,096-token prompt, the same prompt in 128-token chunks back to back, and in chunks each synced before
the next is issued, as a chunked trial runs them (median of repeats).
Bandwidth: the bytes a decode step must read (bf16-packed weights + the FP32 KV cache so far) over its time,
and the floor: those bytes over a device-to-device copy's bandwidth measured in the same run.
"""

import platform
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import KVCache as LmCache

from pdlib.engine import Engine, Output, check_token
from pdlib.engine.kernels import BACKEND, persistent_decode
from pdlib.report.bench import SCHEMA
from pdlib.report.io import environment
from pdlib.run.reference import Reference
from pdlib.settings import decode_mode
from pdlib.tools.bench_rounds import bench_rounds
from pdlib.tools.timing import bench_prompt, ms_since, observed, pipelined, prefills
from pdlib.weights import LoadedModel


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), median of 5."""
    x = mx.random.uniform(shape=(nbytes // 4,))
    mx.eval(x)
    times = []
    for _ in range(6):
        t0 = time.perf_counter_ns()
        y = x + 0.0
        mx.eval(y)
        times.append(ms_since(t0) / 1e3)
        del y
    return 2 * nbytes / statistics.median(times[1:])


def decode_bytes(cfg, context: int) -> int:
    D, F, V, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    Hq, Hkv, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    per_layer = ((Hq + 2 * Hkv) * Dh * D + D * Hq * Dh + 2 * F * D + D * F) * 2  # bf16 matrices
    kv = L * Hkv * Dh * 2 * 4 * context  # FP32 K and V read
    return L * per_layer + V * D * 2 + kv


def bench_pdlib(
    model: LoadedModel,
    *,
    contexts,
    tokens: int,
    warmup: int,
    prefill_tokens: int,
    chunk: int,
    repeats: int,
    decode: str | None = None,
) -> dict:
    cfg = model.config
    steps = 2 * (warmup + tokens + 2)  # every context's decodes, observed, then pipelined
    # the per-operation kernels write no mailbox: beside the persistent kernel they are read by .item()
    engine = Engine(
        model,
        capacity=max(max(contexts) + steps, prefill_tokens + 1),  # a prompt needs one more position
        decode=decode,
        token_read="item" if decode == "kernels" else None,
    )
    out = {**engine.settings, "decode_ms_median": {}, "decode_ms_all": {}, "decode_pipelined_ms_median": {}}
    for ctx in contexts:
        engine.add_request("X", bench_prompt(cfg.vocab_size, ctx))
        engine.reset("X", logical=True)
        engine.prefill_chunk("X", ctx).token.item()
        times = observed(lambda: check_token(engine.decode("X").observe()), tokens, warmup)
        out["decode_ms_median"][str(ctx)] = statistics.median(times)
        out["decode_ms_all"][str(ctx)] = times
        piped = pipelined(lambda _: engine.decode("X"), engine.decode("X"), tokens, warmup, Output.observe)
        out["decode_pipelined_ms_median"][str(ctx)] = statistics.median(piped)
        if engine.model.pairs:
            (
                out.setdefault("pair_step_ms_median", {})[str(ctx)],
                out.setdefault("pair_step_pipelined_ms_median", {})[str(ctx)],
            ) = _pair_steps(engine, cfg, ctx, tokens, warmup)
    engine.add_request("P", bench_prompt(cfg.vocab_size, prefill_tokens))

    def prefill(n, synced=False):
        engine.reset("P", logical=True)
        t0 = time.perf_counter_ns()
        for start in range(0, prefill_tokens, n):
            o = engine.prefill_chunk("P", min(n, prefill_tokens - start))
            if synced:
                mx.synchronize()
        o.token.item()
        return ms_since(t0) / 1e3

    return {**out, **prefills(prefill, prefill_tokens=prefill_tokens, chunk=chunk, repeats=repeats)}


def _pair_steps(engine: Engine, cfg, ctx: int, tokens: int, warmup: int) -> tuple[float, float]:
    """Median ms of a step that decodes two requests at context ctx in one launch (Engine.batch of two decodes,
    as mixed's rounds after B's first token run): both tokens observed after each step, then pipelined."""
    for name in ("X2", "Y2"):
        engine.add_request(name, bench_prompt(cfg.vocab_size, ctx))
        engine.reset(name, logical=True)
        engine.prefill_chunk(name, ctx).token.item()
    pair = [("X2", None), ("Y2", None)]
    times = observed(lambda: [check_token(o.observe()) for o in engine.batch(pair)], tokens, warmup)

    def observe(outs):  # the step's tokens: the first checked here, the second by _pipelined
        check_token(outs[0].observe())
        return outs[1].observe()

    piped = pipelined(lambda _: engine.batch(pair), engine.batch(pair), tokens, warmup, observe)
    return statistics.median(times), statistics.median(piped)


def bench_mlx_lm(
    model: LoadedModel, *, contexts, tokens: int, warmup: int, prefill_tokens: int, chunk: int, repeats: int
) -> dict:
    ref = Reference(model).model
    cfg = model.config
    out = {"decode_ms_median": {}, "decode_ms_all": {}, "decode_pipelined_ms_median": {}}
    for ctx in contexts:
        cache = [LmCache() for _ in range(cfg.num_hidden_layers)]
        tok = mx.argmax(ref(mx.array(bench_prompt(cfg.vocab_size, ctx))[None], cache=cache)[0, -1]).item()
        times = []
        for i in range(warmup + tokens):
            t0 = time.perf_counter_ns()
            tok = mx.argmax(ref(mx.array([[tok]]), cache=cache)[0, -1]).item()
            if i >= warmup:
                times.append(ms_since(t0))
        out["decode_ms_median"][str(ctx)] = statistics.median(times)
        out["decode_ms_all"][str(ctx)] = times

        def step(token, cache=cache):  # as mlx-lm's generate_step: the next token, started before this one is read
            following = mx.argmax(ref(token.reshape(1, 1), cache=cache)[0, -1])
            mx.async_eval(following)
            return following

        piped = pipelined(step, step(mx.array(tok)), tokens, warmup)
        out["decode_pipelined_ms_median"][str(ctx)] = statistics.median(piped)
        del cache

    def prefill(n, synced=False):
        cache = [LmCache() for _ in range(cfg.num_hidden_layers)]
        prompt = mx.array(bench_prompt(cfg.vocab_size, prefill_tokens))[None]
        t0 = time.perf_counter_ns()
        for start in range(0, prefill_tokens, n):
            logits = ref(prompt[:, start : start + n], cache=cache)
            if synced:
                mx.eval(logits, [(c.keys, c.values) for c in cache])
        mx.argmax(logits[0, -1]).item()
        return ms_since(t0) / 1e3

    return {**out, **prefills(prefill, prefill_tokens=prefill_tokens, chunk=chunk, repeats=repeats)}


def bench_step(
    model: LoadedModel,
    *,
    contexts=(1024, 4096, 5120),
    tokens: int = 200,
    warmup: int = 20,
    prefill_tokens: int = 4096,
    chunk: int = 128,
    repeats: int = 3,
    peers: bool | None = None,
    rounds=(1, 8, 32),
    round_context: int = 2048,
    log=print,
) -> dict:
    """`peers`: measure transformers' Qwen3 too (None: when torch sees a CUDA device); `rounds`: the row counts
    of pdlib's decode rounds at `round_context` (bench_rounds.py; none: skipped)."""
    kw = dict(
        contexts=contexts, tokens=tokens, warmup=warmup, prefill_tokens=prefill_tokens, chunk=chunk, repeats=repeats
    )
    bw = copy_bandwidth()
    log(f"device-to-device copy: {bw / 1e12:.2f} TB/s")
    engines = {"pdlib": bench_pdlib(model, **kw)}
    mx.clear_cache()
    weights = decode_bytes(model.config, 0)
    round_kw = dict(context=round_context, tokens=tokens, warmup=warmup, bandwidth=bw, weights=weights)
    decode_rounds = bench_rounds(model, rows=tuple(rounds), **round_kw) if rounds else None
    mx.clear_cache()
    if decode_mode() is None and persistent_decode.available(model.config, packed=True):
        # pdlib decodes with the persistent kernel here: the per-operation kernels it replaced, beside it
        engines["pdlib-kernels"] = bench_pdlib(model, decode="kernels", **kw)
        mx.clear_cache()
    engines["mlx-lm"] = bench_mlx_lm(model, **kw)
    mx.clear_cache()
    from pdlib.tools import bench_hf

    if peers or (peers is None and bench_hf.available()):
        for dtype in bench_hf.DTYPES:
            name = f"hf-{'fp32' if dtype == 'float32' else 'bf16'}"
            try:  # a peer that cannot run here (torch beside MLX, a transformers change) must not lose the rest
                engines[name] = bench_hf.bench_hf(model, dtype=dtype, **kw)
            except Exception as e:
                engines[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                log(f"{name}: not measured ({engines[name]['error']})")
    floors = {
        str(c): {"bytes": decode_bytes(model.config, c), "floor_ms": decode_bytes(model.config, c) / bw * 1e3}
        for c in contexts
    }
    return {
        "schema": SCHEMA,
        "model": model.source,
        "environment": environment(BACKEND),
        "settings": kw,
        "copy_bandwidth_Bps": bw,
        "floors": floors,
        "engines": engines,
        **({"rounds": decode_rounds} if decode_rounds else {}),
        "python": platform.python_version(),
    }


def write_json(path, result: dict) -> None:
    from pdlib.report.io import claim_output, write_report

    write_report(claim_output(path), result)


__all__ = ["bench_step", "write_json"]

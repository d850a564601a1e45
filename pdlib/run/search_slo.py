"""The SLOs a search measures at its start (serve_search.py): one decode step of one request at the workload's
median prompt length, and the uncontended TTFT of its p90 prompt, prefilled alone in chunk_size chunks to its
first token (the TTFT SLO is TTFT_FACTOR times it: Splitwise's P90 TTFT SLO is 3x the uncontended).

    calib = calibrate(model, workload, chunk_size=512)   # {"decode_ms", "prefill_ms", samples, ...}
"""

import math
import time

import mlx.core as mx
import numpy as np

from pdlib.engine import Engine, check_token
from pdlib.run.clock import now
from pdlib.workload import Workload, iter_prompts

TTFT_FACTOR = 3.0
DECODE_STEPS = 20
DECODE_WARM = 3  # untimed steps before them: the first ones compile
PREFILL_REPEATS = 5  # timed prefills of the p90 prompt, after one untimed


def _prefill(engine: Engine, name: str, n: int, chunk_size: int) -> int:
    """Prefill `name` alone in chunks, each done when its K/V are (as serve_once's steps); its first token."""
    out = None
    while n:
        k = min(chunk_size, n)
        out = engine.batch([(name, k)])[0]
        if out is None:
            mx.eval(engine.requests[name].cache.lazy())
        n -= k
    return check_token(out.observe())


def calibrate(model, workload: Workload, *, chunk_size: int) -> dict:
    """One decode step (ms, the median of DECODE_STEPS) of one request at the workload's median prompt length,
    and the uncontended TTFT (ms, median of PREFILL_REPEATS) of its p90 prompt in chunk_size chunks."""
    t = time.perf_counter()
    p50 = max(1, round(float(np.median(workload.prompt_tokens))))
    p90 = max(1, math.ceil(float(np.percentile(workload.prompt_tokens, 90))))
    n_dec = DECODE_WARM + DECODE_STEPS
    w = Workload("calibration", np.zeros(2, np.int64), np.array([p50, p90]), np.array([n_dec + 1, 1]))
    ids = [p.token_ids for p in iter_prompts(w, vocab_size=model.config.vocab_size, tokenizer=model.tokenizer)]
    engine = Engine(model, capacity=max(p50 + n_dec + 2, p90 + 1))
    engine.add_request("decode", ids[0])
    engine.add_request("prefill", ids[1])
    prefill = []
    for _ in range(1 + PREFILL_REPEATS):
        engine.reset("prefill", logical=True)
        mx.synchronize()
        t0 = now()
        _prefill(engine, "prefill", p90, chunk_size)
        prefill.append((now() - t0) / 1e6)
    engine.reset("decode", logical=True)
    _prefill(engine, "decode", p50, chunk_size)
    decode = []
    for _ in range(n_dec):
        t0 = now()
        check_token(engine.batch([("decode", None)])[0].observe())
        decode.append((now() - t0) / 1e6)
    return {
        "decode_ms": float(np.median(decode[DECODE_WARM:])),
        "decode_samples_ms": decode[DECODE_WARM:],
        "decode_prompt_tokens": p50,
        "prefill_ms": float(np.median(prefill[1:])),
        "prefill_samples_ms": prefill[1:],
        "prefill_prompt_tokens": p90,
        "chunk_size": chunk_size,
        "ttft_factor": TTFT_FACTOR,
        "wall_s": time.perf_counter() - t,
    }


__all__ = ["DECODE_STEPS", "TTFT_FACTOR", "calibrate"]

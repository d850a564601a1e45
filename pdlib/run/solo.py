"""Each request alone on the whole device, measured in the same run as the trials: the references the policies'
figures are read against (issue goal: A's worst gap at most 1.5x its solo decode step, B's time to first token
at most 1.5x its solo whole prefill).

    solo = solo_references(engine, prompt_tokens=4096, decodes=64, repeats=3)
    # {"a_decode_ms": median observed decode step of A at its prompt's length,
    #  "b_prefill_s": median time from B's whole-prompt prefill issued to its first token observed, ...}

Untimed as far as the trials are concerned: it runs after the gate and before the warmups, on requests that
every run resets. A's decodes start from its prompt's end, as the trials' do; B's prefill is one engine step of
the whole prompt, as eager's would be with one chunk.
"""

import statistics
import time

import mlx.core as mx

from pdlib.engine import Engine, check_token


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def solo_references(engine: Engine, *, prompt_tokens: int, decodes: int, repeats: int = 3) -> dict:
    """A's median decode step (ms, each token observed; one untimed step first) and B's median whole prefill
    (s, to its first token observed; one untimed run first), each request alone."""
    engine.reset("A", logical=True)
    check_token(engine.prefill_chunk("A", prompt_tokens).observe())
    steps = []
    for i in range(decodes + 1):
        t0 = time.perf_counter_ns()
        check_token(engine.decode("A").observe())
        if i:
            steps.append(_ms(t0))
    prefills = []
    for i in range(repeats + 1):
        engine.reset("B", logical=True)
        mx.synchronize()
        t0 = time.perf_counter_ns()
        check_token(engine.prefill_chunk("B", prompt_tokens).observe())
        if i:
            prefills.append(_ms(t0) / 1e3)
    for r in ("A", "B"):
        engine.reset(r, logical=True)
    mx.synchronize()
    return {
        "a_decode_ms": statistics.median(steps),
        "a_decode_steps": decodes,
        "b_prefill_s": statistics.median(prefills),
        "b_prefill_repeats": repeats,
    }


__all__ = ["solo_references"]

"""What bench-step's engines share, so each is timed the same way: a millisecond clock, observed and pipelined
steps and the three prefills.

ms = ms_since(time.perf_counter_ns())
times = observed(run, n=200, warmup=20)                              # ms of each run(), after warmups
gaps = pipelined(step, step(None), n=200, warmup=20)                 # ms between tokens seen one step behind
out = prefills(prefill, prefill_tokens=4096, chunk=128, repeats=3)   # prefill(n, synced) -> seconds
"""

import statistics
import time

from pdlib.engine import check_token


def ms_since(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def observed(run, n: int, warmup: int) -> list[float]:
    """ms of each of n calls of run() (a step issued and its tokens observed), after `warmup` untimed ones."""
    times = []
    for i in range(warmup + n):
        t0 = time.perf_counter_ns()
        run()
        if i >= warmup:
            times.append(ms_since(t0))
    return times


def pipelined(step, first, n: int, warmup: int, observe=lambda token: token.item()) -> list[float]:
    """ms between consecutive host observations of n tokens, each observed after the next step is issued:
    `first` is the step whose token comes first, step(token) issues the next from the last (on the device);
    `observe` reads a step's token on the host."""
    seen, token = [], first
    for _ in range(warmup + n + 1):
        following = step(token)
        check_token(observe(token))
        seen.append(time.perf_counter_ns())
        token = following
    check_token(observe(token))
    return [(b - a) / 1e6 for a, b in zip(seen[warmup:], seen[warmup + 1 :])]


def bench_prompt(vocab_size: int, n: int, row: int = 0) -> list[int]:
    """n token ids of a fixed arithmetic pattern, another for each row (timing needs lengths, not text)."""
    return [(i * 7919 + 13 + row * 104729) % min(vocab_size, 50000) for i in range(n)]


def prefills(prefill, *, prefill_tokens: int, chunk: int, repeats: int) -> dict:
    """A whole prompt, the prompt in `chunk`-token pieces back to back, and each piece synced: medians of
    `repeats` after one untimed run of each."""
    out = {}
    for key, n, synced in (
        ("prefill_whole_s", prefill_tokens, False),
        ("prefill_chunked_s", chunk, False),
        ("prefill_chunked_synced_s", chunk, True),
    ):
        prefill(n, synced)
        out[key] = statistics.median(prefill(n, synced) for _ in range(repeats))
    return out

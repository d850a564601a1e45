"""What bench-step's engines share, so each is timed the same way: a millisecond clock, observed steps and the
three prefills.

ms = ms_since(time.perf_counter_ns())
times = observed(run, n=200, warmup=20)                              # ms of each run(), after warmups
out = prefills(prefill, prefill_tokens=4096, chunk=128, repeats=3)   # prefill(n, synced) -> seconds
"""

import statistics
import time


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

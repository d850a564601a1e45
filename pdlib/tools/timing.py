"""What bench-step's engines share, so each is timed the same way: a millisecond clock and the three prefills.

ms = ms_since(time.perf_counter_ns())
out = prefills(prefill, prefill_tokens=4096, chunk=128, repeats=3)   # prefill(n, synced) -> seconds
"""

import statistics
import time


def ms_since(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


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

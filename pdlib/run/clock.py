"""The serving runs' clock: `time.perf_counter_ns`, read as ns since a run's start, and the wait for an arrival
(pdlib/run/serve.py's policies and pdlib/run/peer.py's peer run on the same rules).

    t0 = now(); ...; wait_until(t0 + arrival_ns)
"""

import time

now = time.perf_counter_ns
SPIN_NS = 1_000_000  # the last stretch of a wait for an arrival is spun, not slept: sleep overshoots


def wait_until(t_ns: int) -> None:
    """Return once now() >= t_ns: sleep until SPIN_NS before it, then spin."""
    while (left := t_ns - now()) > 0:
        if left > 2 * SPIN_NS:
            time.sleep((left - SPIN_NS) / 1e9)

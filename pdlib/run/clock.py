"""The serving runs' clock: `time.perf_counter_ns`, read as ns since a run's start, and the wait for an arrival
(pdlib/run/serve.py's policies and pdlib/run/peer.py's peer run on the same rules).

    t0 = now(); ...; wait_until(t0 + arrival_ns)
    t0 = next_arrival(t0, arrival_ns, skip=True)   # nothing in the system: the clock jumps to the arrival

Skipping an idle span (a params file's `idle: skip`) moves the run's origin back instead of sleeping: every stamp
is read as now() - t0, so the arrival is due at once and what any request sees is unchanged (none is in the
system while the clock jumps). Azure's traces, paced, hold lulls of 14 s in a 48-request block at 1x and 115 s
at 0.125x: skipped, a low rate's point costs its busy time, not its arrivals' span.
"""

import time

now = time.perf_counter_ns
SPIN_NS = 1_000_000  # the last stretch of a wait for an arrival is spun, not slept: sleep overshoots


def wait_until(t_ns: int) -> None:
    """Return once now() >= t_ns: sleep until SPIN_NS before it, then spin."""
    while (left := t_ns - now()) > 0:
        if left > 2 * SPIN_NS:
            time.sleep((left - SPIN_NS) / 1e9)


def next_arrival(t0: int, arrival_ns: int, *, skip: bool) -> int:
    """The run's origin once the arrival at `arrival_ns` (ns since t0) is due: the same t0 after a wait, or with
    `skip` an earlier one, now() - t0 reading arrival_ns at once. Only while nothing runs (module docstring)."""
    if not skip:
        wait_until(t0 + arrival_ns)
        return t0
    return t0 - max(0, arrival_ns - (now() - t0))

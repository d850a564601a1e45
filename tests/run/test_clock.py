"""The serving runs' clock (pdlib.run.clock): a wait for an arrival ends once it is due; a skipped idle span
moves the run's origin so that the arrival is due at once, and never moves it forward.

    .venv/bin/python -m pytest -q tests/run/test_clock.py
"""

import time

from pdlib.run.clock import next_arrival, now

MS = 1_000_000


def test_a_wait_ends_once_the_arrival_is_due_and_keeps_the_origin():
    t0 = now()
    assert next_arrival(t0, 30 * MS, skip=False) == t0
    assert now() - t0 >= 30 * MS


def test_a_skip_makes_the_arrival_due_at_once():
    t0 = now()
    t = time.perf_counter()
    t1 = next_arrival(t0, 3_600_000 * MS, skip=True)  # an hour's lull
    assert time.perf_counter() - t < 0.5 and now() - t1 >= 3_600_000 * MS and t0 - t1 <= 3_600_000 * MS


def test_a_skip_to_an_arrival_already_due_keeps_the_origin():
    t0 = now() - 50 * MS  # the arrival was due 40 ms ago
    assert next_arrival(t0, 10 * MS, skip=True) == t0

"""A search command's time budget (`serve --search --budget-s`): under a per-command limit (a lent GPU's ten
minutes, say), a point starts only when it is expected to end inside the budget, so the command stops between
points and writes its report, rather than being killed in the middle of one with none; the log resumes it.

    budget = Budget(540, spans=[36.0, 41.2])        # seconds; each rep's arrival span at rate 1 (or set later)
    budget.admit("mixed", 4.0, 0, warmups=1)         # raises BudgetSpent where it would not fit
    budget.record(4.0, 0, point)                     # learns what a run takes past its arrivals and setup

A point is admitted once what it shares with later points is made (the model, every rep's references, the engine
and its compiles, a fit: serve_search.measure calls `admit` then), against the time left: its expected time is
its arrival span at that rate + the overhead, and as much for each warmup run before it at that rate or the
search's start rate, the higher. Where idle spans are skipped (a params file's `idle: skip`, run/clock.py), `gaps`
(each rep's arrival gaps in s at rate 1) replace the span: each gap counts at most IDLE_CAP_S at any rate, what
a burst's drain may take of a lull. The overhead (a run's wall
time past its arrivals: the drain, the gate, a replay) starts at FIRST_OVERHEAD_S and is then the largest seen
in this command, setup left out. Arrivals scale as 1/rate for a trace's multiplier and a Poisson rate alike.
"""

import math
import time

from pdlib.errors import InputError

FIRST_OVERHEAD_S = 60.0
IDLE_CAP_S = 5.0


class BudgetSpent(Exception):
    """The next point would not end inside the budget: where the command stopped."""

    def __init__(self, policy: str, rate: float, rep: int, expected_s: float, left_s: float, reason: str | None = None):
        super().__init__(reason or f"{policy} at {rate:g} rep {rep}: expected {expected_s:.0f} s, {left_s:.0f} s left")
        self.record = dict(policy=policy, rate=rate, rep=rep, expected_s=expected_s, left_s=left_s)
        if reason is not None:
            self.record["reason"] = reason


class Budget:
    def __init__(self, seconds: float | None, spans: list[float] | None = None, clock=None):
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf
        ):
            raise InputError(f"--budget-s must be a positive number of seconds, got {seconds!r}")
        self.seconds, self.spans = seconds, spans
        self.gaps = None  # per rep, its arrival gaps in s at rate 1, where idle spans are skipped (module docstring)
        self.clock = clock or (lambda: time.perf_counter())  # read when called: a test may stand in for it
        self.t0, self.overhead, self.seen = self.clock(), FIRST_OVERHEAD_S, False  # made as the command starts
        self.warm_rate = 0.0  # warmups run at a point's rate or this, the higher (the search's start)
        self.stopped = None  # the first point refused (BudgetSpent.record): no later one is measured

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (self.clock() - self.t0)

    def arrivals(self, rep: int, rate: float) -> float:
        """The seconds a run at `rate` spends on rep's arrivals: their span, or its gaps capped (module docstring)."""
        if self.gaps is None:
            return self.spans[rep] / rate
        return float(sum(min(g / rate, IDLE_CAP_S) for g in self.gaps[rep]))

    def expect(self, rate: float, rep: int, warmups: int) -> float:
        """A point's runs: its own at `rate`, each warmup at `rate` or `warm_rate`, the higher."""
        warm = max(rate, self.warm_rate)
        return self.arrivals(rep, rate) + self.overhead + warmups * (self.arrivals(rep, warm) + self.overhead)

    def admit(self, policy: str, rate: float, rep: int, *, warmups: int) -> None:
        expected, left = self.expect(rate, rep, warmups), self.left()
        if expected > left:
            raise BudgetSpent(policy, rate, rep, expected, left)

    def record(self, rate: float, rep: int, point: dict) -> None:
        """A measured point's time past its arrivals, per run, without its setup (what later points reuse)."""
        runs, warmups = point["wall_s"] - point.get("setup_s", 0.0), point.get("warmups", 0)
        arrivals = self.arrivals(rep, rate) + warmups * self.arrivals(rep, point.get("warmup_rate", rate))
        over = (runs - arrivals) / (1 + warmups)
        self.overhead = max(over, self.overhead if self.seen else 0.0)
        self.seen = True

    def to_dict(self) -> dict:
        return {"budget_s": self.seconds, "overhead_s": self.overhead if self.seen else None}


__all__ = ["FIRST_OVERHEAD_S", "IDLE_CAP_S", "Budget", "BudgetSpent"]

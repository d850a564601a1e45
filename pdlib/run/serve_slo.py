"""The serving `slo-mixed` policy's budget: how many prompt tokens a step may carry beside its decodes and still meet a
time-between-tokens target, from a step cost fitted on this engine (pdlib/run/slo.py's StepCost).

    cost = calibrate_serving(engine, workload, chunk_size=256)        # untimed, before the runs
    budget = step_budget(cost, tbt_ms=14.0, ceiling=256)
    policy = make_batch_policy("slo-mixed", budget=budget)

A step of D decode rows, at cache lengths c_i, plus a prompt chunk of n tokens from position s costs
a + b (D + n) + c (sum c_i + n s) ms (the fit's form: weights once a step, per-row work, attention over the
prefix). The budget is the largest n, 1 .. ceiling, whose predicted time is at most the limit: the target, or
a one-token chunk's predicted step plus the fit's scatter if that is more (as in the two-request rule: below
it, smaller chunks buy the decodes less than one step's noise while delaying the prompt). An n of at least
ceiling/16 (the quantum) is rounded down to a multiple of it, so a run compiles few step shapes; where even one
token misses the target, the budget is at least one quantum, so prompts still advance and the run's TBT shows
the target could not hold.
"""

from collections.abc import Callable

from pdlib.batching import first_waiting
from pdlib.engine import Engine
from pdlib.run.slo import StepCost, calibrate
from pdlib.scheduler import RequestState
from pdlib.workload import Workload


def calibrate_serving(engine: Engine, workload: Workload, *, chunk_size: int) -> tuple[StepCost, str]:
    """The step cost, timed on the workload's longest prompt (its request is reset by every run): the fit and
    the request it used."""
    i = int(workload.prompt_tokens.argmax())
    name = workload.names[i]
    cost = calibrate(
        engine,
        prompt_tokens=int(workload.prompt_tokens[i]),
        ceiling=chunk_size,
        logical_reset=True,
        req=name,
    )
    return cost, name


def predicted_ms(cost: StepCost, running: list[RequestState], n: int) -> float:
    """The model's time of a step of every ready decode in `running` plus n prompt tokens of its first waiting
    request."""
    decodes = [r for r in running if r.ready]
    context = sum(r.prompt_tokens + r.emitted - 1 for r in decodes)  # each decode attends over its cache
    w = first_waiting(running)
    start = w.prefilled if w is not None else 0
    return cost.a + cost.b * (len(decodes) + n) + cost.c * (context + n * start)


def step_budget(cost: StepCost, *, tbt_ms: float, ceiling: int) -> Callable[[list[RequestState]], int]:
    """running -> prompt tokens for the next step (module docstring)."""
    quantum = max(1, ceiling // 16)

    def budget(running: list[RequestState]) -> int:
        if first_waiting(running) is None:
            return ceiling  # no prompt waits: the budget does not matter
        floor = predicted_ms(cost, running, 1)
        limit = max(tbt_ms, floor + cost.spread_ms)
        lo, hi = 1, ceiling  # the time grows with n (non-negative terms): bisect for the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if predicted_ms(cost, running, mid) <= limit else (lo, mid - 1)
        n = lo // quantum * quantum if lo >= quantum else lo
        return max(quantum, n) if floor > tbt_ms else max(1, n)

    return budget


def slo_budget(engine: Engine, workload: Workload, *, chunk_size: int, slos: dict) -> tuple[dict, Callable]:
    """The slo policy's record and budget: the step cost calibrated here, the target the strict SLO's TBT bound
    when SLOs are set, else 5x the fitted decode step."""
    cost, name = calibrate_serving(engine, workload, chunk_size=chunk_size)
    strict = slos.get("strict")
    tbt_ms = strict.tbt_ms if strict is not None else cost.default_target_ms()
    record = {
        "tbt_ms": tbt_ms,
        "target_from": "strict slo" if strict is not None else "5x decode",
        "calibrated_on": name,
        "cost": cost.to_dict(),
    }
    return record, step_budget(cost, tbt_ms=tbt_ms, ceiling=chunk_size)


__all__ = ["calibrate_serving", "predicted_ms", "slo_budget", "step_budget"]

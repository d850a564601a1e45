"""The serving `slo-mixed` policy's budget: how many prompt tokens a step may carry beside its decodes and still meet a
time-between-tokens target, from a step cost fitted on this engine (pdlib/run/slo.py's StepCost).

    cost = calibrate_serving(engine, workload, chunk_size=256)        # untimed, before the runs
    budget = step_budget(cost, tbt_ms=14.0, ceiling=256)
    policy = make_batch_policy("slo-mixed", budget=budget)

A prompt chunk of n tokens from position s costs a + b n + c n s ms alone (slo.py's fit: weights once a step,
per-row work, attention over the prefix). Decode rows beside it cost far more than that form's per-row terms say
(their attention and the decode path's launches: on the H200 a 512-token chunk step took 11.9 ms alone and 18.4
with 8 rows), so they have a fit of their own (`fit_rows`): D >= 1 rows over C cached positions in all add
rows_a + rows_b D + rows_c C, fitted on the residuals of steps timed with 1, 4 and 16 rows beside chunks of the
same prompt (`rows_points`). A cost without that fit (no other request had room to decode through it)
prices each row as one more chunk token.

The budget is the largest n, 1 .. ceiling, whose predicted time is at most the limit: the target, or a one-token
chunk's predicted step plus the fit's scatter if that is more (as in the two-request rule: below it, smaller
chunks buy the decodes less than one step's noise while delaying the prompt). An n of at least ceiling/16 (the
quantum) is rounded down to a multiple of it, so a run compiles few step shapes. The budget is the whole ceiling
(mixed's step) where there is no gap to keep: no decode is ready, or even one prompt token beside the ready ones
misses the target. Then every step with prompt work is a gap over the target for each decode in it, so the
fewest such steps miss it least (a P99 bound counts them) and give the prompts the most progress per miss; the
quantum floor this replaced starved the prompts (an H100, 2026-12-06: TTFT p90 4.8 s at the conversation trace's
1x, where mixed's was 84 ms) and still missed the target.

The fit prices steps timed one at a time; in the serving loop a step's decodes wait longer (the host builds the
step, admits arrivals, reads the tokens: on an H100 the steps predicted at 5.7 ms gave gaps of ~10 ms). So each
run also learns what the loop adds: after every step with prompt work beside decodes, the longest gap it ended
minus the step's prediction; the budget prices a step at its prediction plus the median of the last LOOP_WINDOW
such overruns (none yet: the fit alone; a step's overrun is seen as the step after it goes out, so it prices
the one after that). An additive term, as host work per step is, and never negative; each run starts afresh.
BUDGET_RULE names the rule in each search point, so a log's points made under another are measured again.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import fields, replace

import numpy as np

from pdlib.batching import first_waiting
from pdlib.engine import Engine
from pdlib.errors import InputError, is_finite
from pdlib.run.slo import StepCost, calibrate, nonnegative_fit, timed_ms
from pdlib.scheduler import RequestState
from pdlib.workload import Workload

BUDGET_RULE = (
    "pdlib.slo-budget/4: the ceiling where no decode is ready or no prompt token fits beside them; "
    "each step priced with the run's median overrun of its last steps with prompt work beside decodes, if positive"
)
LOOP_WINDOW = 16  # the steps whose overruns price the next
ROW_COUNTS = (1, 4, 16)  # decode rows beside the calibration's chunks
ROW_PASSES = 2  # the first compiles the steps' shapes and is not kept


def calibrate_serving(engine: Engine, workload: Workload, *, chunk_size: int) -> tuple[StepCost, str]:
    """The step cost, timed on the workload's longest prompt, with its decode rows' fit (every request it used
    is reset by every run): the fit and the request it was timed on."""
    i = int(workload.prompt_tokens.argmax())
    name, prompt = workload.names[i], int(workload.prompt_tokens[i])
    attached = _hold(engine, [name])
    try:
        cost = calibrate(engine, prompt_tokens=prompt, ceiling=chunk_size, logical_reset=True, req=name)
        return fit_rows(cost, rows_points(engine, workload, name, chunk_size=chunk_size)), name
    finally:
        for r in attached:
            engine.detach(r)


def _hold(engine: Engine, names: list[str]) -> list[str]:
    """Give each of `names` without a cache one (a serving engine's requests hold none between runs): those given."""
    given = [r for r in names if engine.requests[r].cache is None]
    for r in given:
        engine.attach(r)
    return given


def rows_points(engine: Engine, workload: Workload, name: str, *, chunk_size: int) -> list[list]:
    """Request `name`'s prompt in chunks of chunk_size and chunk_size/4 in turn, each chunk beside D decode rows
    of other requests (each D of ROW_COUNTS the workload has rows for), every step synced and timed:
    [[D, C, n, start, ms], ...], C the rows' cached positions. The rows are the longest prompts with room in
    their caches for every decode the calibration makes, as many as have caches or can take a free one; none: []."""
    prompt = int(workload.prompt_tokens[workload.names.index(name)])
    sizes = [chunk_size, max(1, chunk_size // 4)]
    steps = -(-prompt // sum(sizes)) * len(sizes)  # chunks of the prompt, rounded up to whole cycles
    need = steps * len(ROW_COUNTS) * ROW_PASSES
    order = np.argsort(-workload.prompt_tokens, kind="stable")
    free = len(workload.names) if engine.spare is None else engine.spare  # caches for rows that hold none
    rows = []
    for j in order:
        r = workload.names[j]
        if len(rows) == max(ROW_COUNTS) or r == name or int(workload.prompt_tokens[j]) + need >= engine.capacity:
            continue
        if engine.requests[r].cache is None:
            if not free:
                continue
            free -= 1
        rows.append(r)
    counts = sorted({min(d, len(rows)) for d in ROW_COUNTS} - {0})
    points = []
    attached = _hold(engine, rows)
    for r in rows:
        engine.reset(r, logical=True)
        n = int(workload.prompt_tokens[workload.names.index(r)])
        for start in range(0, n, chunk_size):
            engine.prefill_chunk(r, min(chunk_size, n - start))
    for p in range(ROW_PASSES if rows else 0):
        for d in counts:
            engine.reset(name, logical=True)
            done, k = 0, 0
            while done < prompt:
                n = min(sizes[k % len(sizes)], prompt - done)
                context = sum(engine.requests[r].cache.length for r in rows[:d])
                ms = timed_ms(lambda: engine.batch([(name, n)] + [(r, None) for r in rows[:d]]))
                if p == ROW_PASSES - 1:
                    points.append([d, context, n, done, ms])
                done, k = done + n, k + 1
    for r in [name, *rows]:
        engine.reset(r, logical=True)
    for r in attached:
        engine.detach(r)
    return points


def fit_rows(cost: StepCost, points: list[list]) -> StepCost:
    """`cost` with its decode rows' terms fitted (module docstring) on the residuals of `points` about the chunk
    alone; `cost` itself where there are no points."""
    if not points:
        return cost
    x = np.array([[1.0, d, c] for d, c, *_ in points])
    y = np.array([ms - cost.step_ms(n, start) for _, _, n, start, ms in points])
    coef, _ = nonnegative_fit(x, y)
    a, b, c = (float(v) for v in coef)
    return replace(cost, rows_a=a, rows_b=b, rows_c=c, rows_points=[list(p) for p in points])


def predicted_ms(cost: StepCost, running: list[RequestState], n: int) -> float:
    """The model's time of a step of every ready decode in `running` plus n prompt tokens of its first waiting
    request."""
    decodes = [r for r in running if r.ready]
    context = sum(r.prompt_tokens + r.emitted - 1 for r in decodes)  # each decode attends over its cache
    w = first_waiting(running)
    start = w.prefilled if w is not None else 0
    if not cost.rows_points:  # no rows fit: each row priced as a chunk token
        return cost.a + cost.b * (len(decodes) + n) + cost.c * (context + n * start)
    rows = cost.rows_a + cost.rows_b * len(decodes) + cost.rows_c * context if decodes else 0.0
    return cost.step_ms(n, start) + rows


class StepBudget:
    """running -> prompt tokens for the next step (module docstring). The serving loop calls `start` before a
    run, `expect_step` as it issues a step, and `observe` with that prediction (where there is one) and the
    longest gap the step ended."""

    def __init__(self, cost: StepCost, *, tbt_ms: float, ceiling: int):
        self.cost, self.tbt_ms, self.ceiling = cost, tbt_ms, ceiling
        self.quantum = max(1, ceiling // 16)
        self.overruns: deque = deque(maxlen=LOOP_WINDOW)

    def start(self) -> None:
        self.overruns.clear()

    @property
    def loop_ms(self) -> float:
        """What the loop adds to a step's predicted time, as learned so far in this run; never below 0 (gaps under
        the predictions say the fit overprices, not by how much a smaller step would: taken as a negative addend,
        it would let the fewest prompt tokens through under a target no step meets)."""
        return max(0.0, float(np.median(self.overruns))) if self.overruns else 0.0

    def expect(self, running: list[RequestState], n: int) -> float:
        return predicted_ms(self.cost, running, n)

    def expect_step(self, running: list[RequestState], parts: list[tuple]) -> float | None:
        """A step's prediction where it carries prompt work beside decodes (the steps whose overrun is learned):
        `parts` as Engine.batch takes them; None for any other step."""
        n = sum(k for _, k in parts if k is not None)
        return self.expect(running, n) if n and any(k is None for _, k in parts) else None

    def observe(self, expected_ms: float, gap_ms: float) -> None:
        self.overruns.append(gap_ms - expected_ms)

    def __call__(self, running: list[RequestState]) -> int:
        ceiling, extra = self.ceiling, self.loop_ms
        if first_waiting(running) is None or not any(r.ready for r in running):
            return ceiling  # no prompt waits, or no decode has a gap to keep
        floor = predicted_ms(self.cost, running, 1) + extra
        if floor > self.tbt_ms:
            return ceiling  # no prompt token fits: the fewest steps that miss (module docstring)
        limit = max(self.tbt_ms, floor + self.cost.spread_ms)
        lo, hi = 1, ceiling  # the time grows with n (non-negative terms): bisect for the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if predicted_ms(self.cost, running, mid) + extra <= limit else (lo, mid - 1)
        return lo // self.quantum * self.quantum if lo >= self.quantum else lo


def step_budget(cost: StepCost, *, tbt_ms: float, ceiling: int) -> StepBudget:
    """running -> prompt tokens for the next step (module docstring)."""
    return StepBudget(cost, tbt_ms=tbt_ms, ceiling=ceiling)


def slo_budget(engine: Engine, workload: Workload, *, chunk_size: int, slos: dict) -> tuple[dict, Callable]:
    """The slo policy's record and budget: the step cost calibrated here, the target the strict SLO's TBT bound
    when SLOs are set, else 5x the fitted decode step."""
    cost, name = calibrate_serving(engine, workload, chunk_size=chunk_size)
    strict = slos.get("strict")
    tbt_ms = strict.tbt_ms if strict is not None else cost.default_target_ms()
    record = {
        "tbt_ms": tbt_ms,
        "target_from": "strict slo" if strict is not None else "5x decode",
        "rule": BUDGET_RULE,
        "calibrated_on": name,
        "cost": cost.to_dict(),
    }
    return record, step_budget(cost, tbt_ms=tbt_ms, ceiling=chunk_size)


def _fit_problem(kept) -> str | None:
    """What is out of shape in a kept fit (slo_budget's record, as a search log reads back), or None."""
    if not isinstance(kept, dict) or not isinstance(kept.get("cost"), dict):
        return "not a fit record with a cost"
    if not (is_finite(kept.get("tbt_ms")) and kept["tbt_ms"] > 0):
        return f"tbt_ms {kept.get('tbt_ms')!r}"
    cost, known = kept["cost"], {f.name for f in fields(StepCost)}
    if not set(cost) <= known or not {"a", "b", "c", "decode_ms", "points"} <= set(cost):
        return f"cost fields {sorted(cost)}"
    bad = [k for k in ("a", "b", "c", "decode_ms", "spread_ms", "rows_a", "rows_b", "rows_c") if k in cost]
    bad = [k for k in bad if not (is_finite(cost[k]) and cost[k] >= 0)]
    return f"cost {bad[0]} {cost[bad[0]]!r}" if bad else None


def kept_budget(kept, *, ceiling: int, where: str) -> tuple[dict, StepBudget]:
    """slo_budget's (record, budget) from a record kept by an earlier command; InputError, one line naming `where`,
    for a record out of shape (a hand-edited log)."""
    problem = _fit_problem(kept)
    if problem is None:
        try:
            return kept, step_budget(StepCost(**kept["cost"]), tbt_ms=kept["tbt_ms"], ceiling=ceiling)
        except (TypeError, ValueError) as e:  # a list field of the wrong shape
            problem = str(e)
    raise InputError(f"{where}: its kept slo fit is damaged ({problem}); use a new log")


__all__ = [
    "BUDGET_RULE",
    "LOOP_WINDOW",
    "StepBudget",
    "calibrate_serving",
    "fit_rows",
    "kept_budget",
    "predicted_ms",
    "rows_points",
    "slo_budget",
    "step_budget",
]

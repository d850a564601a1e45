"""Chunk sizes from a time-between-tokens target: a per-device cost model of a step, fitted before the gate,
and the rule the slo policies plan with.

    cost = calibrate(engine, prompt_tokens=4096, ceiling=128, logical_reset=True)   # untimed, on request B
    rule = chunk_rule(cost, tbt_slo_ms=15, ceiling=128, mode="chunked")           # prefilled -> chunk size
    plan("slo-chunked", ..., chunk_rule=rule)

A step of `rows` rows over a cache prefix of `context` positions costs a + b * rows + c * rows * context ms
(weights once per step, per-row work, attention over the prefix). A's gap across one B chunk of n tokens is
predicted as decode + step(n) for chunked rounds and step(n + 1) for mixed steps (A's row rides along).
The fit comes from timing chunks of several sizes at growing contexts, then one untimed probe run per mode
with the plan it gives: the median of A's observed minus predicted gaps there becomes the mode's overhead
(on the H200 the bare fit under-predicted trial gaps by ~2 ms). Both happen before the gate, because the plan
the gate checks must be the one the trials run: the sizes are fixed per run, not refitted as it goes. The
report keeps the fit, the overheads and each chunk's prediction; metrics.slo_chunks compares them with the
observed gaps, which is how a remaining drift shows.
"""

import statistics
import time
from dataclasses import asdict, dataclass, field

import mlx.core as mx
import numpy as np

from pdlib.engine import Engine

MODES = ("chunked", "mixed")
# Without a target from the params: Sarathi-Serve's strict time-between-tokens SLO, 5x one decode step
# (Agrawal et al., OSDI '24), from this device's own fit; on the H200, ~2.8 ms decodes give ~14 ms.
DEFAULT_TARGET_DECODES = 5


@dataclass(frozen=True)
class StepCost:
    a: float            # ms per step
    b: float            # ms per row
    c: float            # ms per row per cached position
    decode_ms: float    # one decode step, token observed
    points: list        # [rows, context, ms] measured
    # per mode, what a probe run's gaps showed the chunk timings miss (the executor's own work between
    # steps, ...): the median of observed minus predicted, added to every prediction (Experiment.step_cost)
    overhead_ms: dict = field(default_factory=dict)

    def step_ms(self, rows: int, context: int) -> float:
        return self.a + self.b * rows + self.c * rows * context

    def gap_ms(self, n: int, context: int, *, mode: str) -> float:
        """A's predicted gap across a B chunk of n tokens at `context` prefilled positions."""
        gap = self.decode_ms + self.step_ms(n, context) if mode == "chunked" else self.step_ms(n + 1, context)
        return gap + self.overhead_ms.get(mode, 0.0)

    def default_target_ms(self) -> float:
        return DEFAULT_TARGET_DECODES * self.decode_ms

    def to_dict(self) -> dict:
        return asdict(self)


def fit(points: list[tuple[int, int, float]], *, decode_ms: float) -> StepCost:
    """Least squares of ms on [1, rows, rows * context]; negative terms (noise) are clipped to zero, so the
    predicted cost never falls as a chunk grows."""
    x = np.array([[1.0, r, r * s] for r, s, _ in points])
    y = np.array([ms for _, _, ms in points])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    a, b, c = (max(float(v), 0.0) for v in coef)
    return StepCost(a, b, c, decode_ms, [list(p) for p in points])


def _timed(fn) -> float:
    t = time.perf_counter_ns()
    fn()
    mx.synchronize()
    return (time.perf_counter_ns() - t) / 1e6


def calibrate(engine: Engine, *, prompt_tokens: int, ceiling: int, logical_reset: bool, passes: int = 2,
              decodes: int = 8) -> StepCost:
    """Time B's prompt in chunks of ceiling, ceiling/2, ceiling/4, ... in turn (so sizes and contexts vary),
    then a few of B's decodes; the first pass only warms up (compilation). Untimed set-up: it runs before the
    gate, and B is reset by every run."""
    sizes = sorted({max(1, ceiling >> k) for k in range(4)}, reverse=True)
    decodes = min(decodes, engine.capacity - prompt_tokens)
    points, decode = [], []
    for p in range(passes):
        engine.reset("B", logical=logical_reset)
        done, k = 0, 0
        while done < prompt_tokens:
            n = min(sizes[k % len(sizes)], prompt_tokens - done)
            ms = _timed(lambda: engine.prefill_chunk("B", n))
            if p == passes - 1:
                points.append((n, done, ms))
            done, k = done + n, k + 1
        for _ in range(decodes):
            ms = _timed(lambda: engine.decode("B").token.item())
            if p == passes - 1:
                decode.append(ms)
    engine.reset("B", logical=logical_reset)
    return fit(points, decode_ms=statistics.median(decode))


def chunk_rule(cost: StepCost, *, tbt_slo_ms: float, ceiling: int, mode: str):
    """prefilled -> the largest chunk (1 .. ceiling) whose predicted gap is at most the target. Sizes are
    rounded down to a multiple of ceiling/16 (the quantum), so a run compiles a few step shapes rather than
    one per chunk. Where even one token misses the target, the quantum: a step's fixed cost then dominates
    (on the H200 a chunk step costs ~17 ms at any size), so one-token chunks would buy A almost nothing for
    up to `ceiling` times the steps; the report shows the target could not hold."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}; expected one of {MODES}")
    quantum = max(1, ceiling // 16)

    def rule(prefilled: int) -> int:
        lo, hi = 1, ceiling  # the cost grows with n (non-negative terms): bisect for the largest that fits
        if cost.gap_ms(1, prefilled, mode=mode) > tbt_slo_ms:
            return quantum
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost.gap_ms(mid, prefilled, mode=mode) <= tbt_slo_ms else (lo, mid - 1)
        return max(1, lo // quantum * quantum) if lo >= quantum else lo

    return rule


def mode_of(policy: str) -> str:
    """slo-chunked -> chunked, slo-mixed -> mixed."""
    return policy.removeprefix("slo-")

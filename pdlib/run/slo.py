"""Chunk sizes from a time-between-tokens target: a per-device model of A's gap across one of B's chunks,
fitted before the gate, and the rule the slo policies plan with.

    cost = calibrate(engine, prompt_tokens=4096, ceiling=128, logical_reset=True)   # untimed, on request B
    cost = replace(cost, gap_fit={"chunked": fit_gap(points)})                     # from probe runs
    rule = chunk_rule(cost, tbt_slo_ms=25, ceiling=128, mode="chunked")           # prefilled -> chunk size
    plan("slo-chunked", ..., chunk_rule=rule)

A step of `rows` rows over a cache prefix of `context` positions costs a + b * rows + c * rows * context ms
(weights once per step, per-row work, attention over the prefix); `calibrate` fits it from chunks of several
sizes, each synced, and times a decode. That is the engine's cost, not yet A's gap: a trial's gap also holds
the executor's work between steps, and on the H200 a chunk step's cost is nearly flat in its size, so an
offset measured at one size does not carry to another. So, per mode, two untimed probe runs
(Experiment._probe; the first compiles the step shapes) run the policy's own rounds with chunk sizes cycling
through ceiling, ceiling/2, ceiling/4, ceiling/8, and A's observed gaps across them in the second are fitted
in the same form (`fit_gap`): that model is what the rule plans with. A probe too short to fit (A runs out
of tokens first) leaves the engine's cost plus the probe's median miss (`overhead_ms`). Both happen before
the gate, because the plan the gate checks must be the one the trials run: sizes are fixed per run, not
refitted as it goes. The report keeps both fits and each chunk's prediction; metrics.slo_chunks compares
them with the observed gaps.
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
    a: float  # ms per step
    b: float  # ms per row
    c: float  # ms per row per cached position
    decode_ms: float  # one decode step, token observed
    points: list  # [rows, context, ms] measured
    spread_ms: float = 0.0  # the fit's residual scatter (1.4826 x median absolute deviation)
    # per mode, A's gap across a chunk of n tokens fitted from a probe run: {"a", "b", "c", "spread_ms",
    # "points": [[n, context, ms], ...]}; gap = a + b * n + c * n * context (Experiment._probe)
    gap_fit: dict = field(default_factory=dict)
    # per mode without a gap fit: the probe's median of observed minus predicted, added to the prediction
    overhead_ms: dict = field(default_factory=dict)
    # serving's decode rows beside a chunk (serve_slo.fit_rows): a step with D >= 1 of them over cached positions
    # C costs rows_a + rows_b * D + rows_c * C more than its chunk alone; points [[D, C, n, start, ms], ...]
    rows_a: float = 0.0
    rows_b: float = 0.0
    rows_c: float = 0.0
    rows_points: list = field(default_factory=list)

    def step_ms(self, rows: int, context: int) -> float:
        return self.a + self.b * rows + self.c * rows * context

    def gap_ms(self, n: int, context: int, *, mode: str) -> float:
        """A's predicted gap across a B chunk of n tokens at `context` prefilled positions."""
        if mode in self.gap_fit:
            g = self.gap_fit[mode]
            return g["a"] + g["b"] * n + g["c"] * n * context
        gap = self.decode_ms + self.step_ms(n, context) if mode == "chunked" else self.step_ms(n + 1, context)
        return gap + self.overhead_ms.get(mode, 0.0)

    def gap_spread_ms(self, mode: str) -> float:
        """How far one observed gap scatters about the model's prediction (the fit's residuals)."""
        return self.gap_fit[mode]["spread_ms"] if mode in self.gap_fit else self.spread_ms

    def default_target_ms(self) -> float:
        return DEFAULT_TARGET_DECODES * self.decode_ms

    def to_dict(self) -> dict:
        return asdict(self)


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Coefficients >= 0 of y ~ x @ coef (least squares over each subset of the columns: a cost never falls as
    a step grows), and the residuals' scatter: 1.4826 x their median absolute deviation, a robust standard
    deviation of one observation about the fit."""
    k = x.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y**2))
    for mask in range(1, 2**k):
        cols = [j for j in range(k) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if np.all(coef >= 0):
            full = np.zeros(k)
            full[cols] = coef
            err = float(np.sum((y - x @ full) ** 2))
            if err < best_err:
                best, best_err = full, err
    residuals = y - x @ best
    return best, float(1.4826 * np.median(np.abs(residuals - np.median(residuals))))


def _least_squares(points) -> tuple[float, float, float, float]:
    """a, b, c >= 0 of ms ~ a + b * n + c * n * context, and the residuals' scatter (nonnegative_fit)."""
    x = np.array([[1.0, n, n * s] for n, s, _ in points])
    coef, spread = nonnegative_fit(x, np.array([ms for _, _, ms in points]))
    return float(coef[0]), float(coef[1]), float(coef[2]), spread


def fit(points: list[tuple[int, int, float]], *, decode_ms: float) -> StepCost:
    """The engine's step cost from timed chunks [rows, context, ms]."""
    a, b, c, spread = _least_squares(points)
    return StepCost(a, b, c, decode_ms, [list(p) for p in points], spread_ms=spread)


GAP_FIT_MIN_POINTS = 6  # and at least two chunk sizes: below that a probe's gaps are too few to fit


def fit_gap(points: list[tuple[int, int, float]]) -> dict | None:
    """A's observed gaps across chunks [n, context, ms] -> a gap model for StepCost.gap_fit, or None when
    there are too few of them or one size only (nothing to tell the intercept from the slope)."""
    if len(points) < GAP_FIT_MIN_POINTS or len({n for n, _, _ in points}) < 2:
        return None
    a, b, c, spread = _least_squares(points)
    return {"a": a, "b": b, "c": c, "spread_ms": spread, "points": [list(p) for p in points]}


def probe_sizes(ceiling: int) -> list[int]:
    """The chunk sizes a probe run cycles through: ceiling, ceiling/2, ceiling/4, ceiling/8 (distinct)."""
    return sorted({max(1, ceiling >> k) for k in range(4)}, reverse=True)


def cycling_rule(ceiling: int):
    """prefilled -> the probe's next size, the sizes taken in turn from the start of the prompt (a function
    of `prefilled` alone, as every chunk rule is)."""
    sizes = probe_sizes(ceiling)
    period = sum(sizes)
    offsets = np.cumsum([0] + sizes[:-1])

    def rule(prefilled: int) -> int:
        k = int(np.searchsorted(offsets, prefilled % period, side="right")) - 1
        return sizes[k]

    return rule


def timed_ms(fn) -> float:
    """fn()'s wall time in ms, the device's work included."""
    t = time.perf_counter_ns()
    fn()
    mx.synchronize()
    return (time.perf_counter_ns() - t) / 1e6


def calibrate(
    engine: Engine,
    *,
    prompt_tokens: int,
    ceiling: int,
    logical_reset: bool,
    passes: int = 2,
    decodes: int = 8,
    req: str = "B",
) -> StepCost:
    """Time request `req`'s prompt in chunks of ceiling, ceiling/2, ceiling/4, ... in turn (so sizes and contexts
    vary), then a few of its decodes; the first pass only warms up (compilation). Untimed set-up: it runs before
    the gate, and every run resets the request."""
    sizes = probe_sizes(ceiling)
    decodes = min(decodes, engine.capacity - prompt_tokens)
    points, decode = [], []
    for p in range(passes):
        engine.reset(req, logical=logical_reset)
        done, k = 0, 0
        while done < prompt_tokens:
            n = min(sizes[k % len(sizes)], prompt_tokens - done)
            ms = timed_ms(lambda: engine.prefill_chunk(req, n))
            if p == passes - 1:
                points.append((n, done, ms))
            done, k = done + n, k + 1
        for _ in range(decodes):
            ms = timed_ms(lambda: engine.decode(req).observe())
            if p == passes - 1:
                decode.append(ms)
    engine.reset(req, logical=logical_reset)
    return fit(points, decode_ms=statistics.median(decode))


def chunk_rule(cost: StepCost, *, tbt_slo_ms: float, ceiling: int, mode: str):
    """prefilled -> the largest chunk (1 .. ceiling) whose predicted gap is at most the target. Sizes are
    rounded down to a multiple of ceiling/16 (the quantum), so a run compiles a few step shapes rather than
    one per chunk. The target is taken as at least a one-token chunk's predicted gap plus the gap's own
    scatter (`gap_spread_ms`): below that, smaller chunks would buy A less than the trial-to-trial noise of
    one gap while delaying B (on the H200 a chunk step costs ~20 ms at any size from 16 to 128), and a
    target just above or just below a one-token chunk's gap gives the same chunks. Where even one token
    misses the target, chunks are at least the quantum; the report shows the target could not hold."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}; expected one of {MODES}")
    quantum = max(1, ceiling // 16)
    spread = cost.gap_spread_ms(mode)

    def rule(prefilled: int) -> int:
        floor = cost.gap_ms(1, prefilled, mode=mode)
        limit = max(tbt_slo_ms, floor + spread)
        lo, hi = 1, ceiling  # the gap grows with n (non-negative terms): bisect for the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost.gap_ms(mid, prefilled, mode=mode) <= limit else (lo, mid - 1)
        n = max(1, lo // quantum * quantum) if lo >= quantum else lo
        return max(quantum, n) if floor > tbt_slo_ms else n

    return rule


def mode_of(policy: str) -> str:
    """slo-chunked -> chunked, slo-mixed -> mixed."""
    return policy.removeprefix("slo-")

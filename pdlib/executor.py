"""The one executor of a plan: validation and timed trials are two uses of it, so the step sequence that is
timed is the one that was checked, by construction.

    steps = plan("chunked", prompt_tokens=4096, output_tokens=1024, chunk_size=128)
    execute(engine, steps, logical_reset=True, hooks=[recorder])     # or a validation hook, or both

A run: reset A; run A's set-up steps; at t0 (the first step after A's set-up prefill) reset B; then every
step. A step issues its parts to the engine in order, then the host observes each output's token id
(`.item()`) and reads the clock right after it; the step ends with its last token, or, when it yields none,
with a device sync, so its time is its work's. Hooks see each step after it ran: its parts' results and the clock readings.
"""

import time
from dataclasses import dataclass

import mlx.core as mx

from pdlib.engine import Engine, Output
from pdlib.scheduler import Prefill, Step, Work, t0_index

now = time.perf_counter_ns


@dataclass
class WorkResult:
    work: Work
    start: int                  # cache positions the part wrote: [start, stop)
    stop: int
    output: Output | None       # the output it yielded, if any (decodes, and a prompt's last chunk)
    token: int | None = None    # the token id as the host observed it
    t_emit: int | None = None   # perf_counter_ns right after the host observed it


class Hook:
    """What a use of the executor does around the steps; every method is optional."""

    def on_t0(self, t0: int, t_reset_end: int) -> None:
        """B arrived at t0 and its cache reset ended at t_reset_end (perf_counter_ns)."""

    def on_step(self, index: int, step: Step, results: list[WorkResult], t_start: int, t_end: int,
                *, timed: bool) -> None:
        """Step `index` ran between t_start and t_end; `timed` is False for A's set-up before t0."""


def _issue(engine: Engine, work: Work) -> WorkResult:
    r = engine.requests[work.req]
    start = r.length
    out = engine.prefill_chunk(work.req, work.n) if isinstance(work, Prefill) else engine.decode(work.req)
    return WorkResult(work, start, r.length, out)


def execute(engine: Engine, steps: list[Step], *, logical_reset: bool, hooks: list[Hook] = ()) -> None:
    t0 = t0_index(steps)
    engine.reset("A", logical=logical_reset)
    for i, step in enumerate(steps):
        if i == t0:
            mx.synchronize()  # nothing of the set-up may run into the timed part
            t = now()
            engine.reset("B", logical=logical_reset)
            mx.synchronize()
            t_reset = now()
            for h in hooks:
                h.on_t0(t, t_reset)
        t_start = now()
        results = [_issue(engine, w) for w in step.work]
        for r in results:
            if r.output is not None:
                r.token = r.output.token.item()
                r.t_emit = now()
        emitted = [r.t_emit for r in results if r.t_emit is not None]
        if emitted:
            t_end = emitted[-1]  # the step ends when its last token is observed
        else:
            mx.synchronize()  # the chunk's K/V are written: the step ends here
            t_end = now()
        for h in hooks:
            h.on_step(i, step, results, t_start, t_end, timed=i >= t0)

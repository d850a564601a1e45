"""Fixed-arrival trials: A is decoding, B arrives at t0; a policy orders the work; every token is timed.

    exp = Experiment(params)
    validation = exp.validate()                       # the gate: nothing is timed unless it passes
    trials = run_trials(exp, reference_tokens={r: v.tokens[r] ...})

Per run (untimed): reset A, prefill A's whole prompt in chunks, observe A's first token. Then t0: timed
from there are B's cache reset, every scheduling decision, device execution, greedy selection and the host
observation of each token id (`.item()`), stamped with `time.perf_counter_ns()` right after the id arrives.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.scheduler import Decode, Prefill, RequestState, make_policy, prefill_steps, schedule

now = time.perf_counter_ns


class TokenMismatch(RuntimeError):
    """A warmup or timed run produced a token sequence that differs from the validated reference."""


@dataclass
class RunRecord:
    policy: str
    output_ids: dict[str, list[int]]
    emit_ns: dict[str, list[int]]      # since t0, timed outputs only
    events: list[dict]
    makespan_ns: int

    def to_trial(self, *, trial: int, position: int) -> dict:
        timed_from = {"A": 1, "B": 0}
        return {"policy": self.policy, "trial": trial, "position": position, "makespan_ns": self.makespan_ns,
                "requests": {r: {"output_ids": self.output_ids[r], "timed_from": timed_from[r],
                                 "emit_ns": self.emit_ns[r]} for r in ("A", "B")},
                "events": self.events}


def run_once(engine: Engine, policy: str, *, prompt_tokens: int, output_tokens: int, chunk_size: int,
             logical_reset: bool) -> RunRecord:
    a = RequestState("A", prompt_tokens, output_tokens)
    b = RequestState("B", prompt_tokens, output_tokens)
    ids = {"A": [], "B": []}
    emits = {"A": [], "B": []}
    # -- untimed set-up: A's prompt and first output
    engine.reset("A", logical=logical_reset)
    for step in prefill_steps(a, chunk_size=chunk_size):
        out = engine.prefill_chunk("A", step.n)
        a.apply(step)
    ids["A"].append(out.token.item())
    mx.synchronize()
    # -- t0: B arrives
    events = []
    t0 = now()
    engine.reset("B", logical=logical_reset)
    mx.synchronize()
    events.append({"kind": "reset", "req": "B", "start": 0, "stop": 0, "t_start_ns": 0, "t_end_ns": now() - t0})
    for step in schedule(make_policy(policy), a, b, chunk_size=chunk_size):
        t_start = now()
        req = step.req
        if isinstance(step, Prefill):
            start = engine.requests[req].prefilled
            out = engine.prefill_chunk(req, step.n)
            span = (start, start + step.n)
            if out is None:
                mx.synchronize()  # the chunk's K/V are written: the event ends here
        else:
            pos = engine.requests[req].length
            out = engine.decode(req)
            span = (pos, pos + 1)
        if out is not None:
            ids[req].append(out.token.item())   # the host observes the token id
            t_end = now()
            emits[req].append(t_end - t0)
        else:
            t_end = now()
        events.append({"kind": "prefill" if isinstance(step, Prefill) else "decode", "req": req,
                       "start": span[0], "stop": span[1], "t_start_ns": t_start - t0, "t_end_ns": t_end - t0})
    makespan = max(emits["A"][-1] if emits["A"] else 0, emits["B"][-1])
    return RunRecord(policy, ids, emits, events, makespan)


def check_tokens(run: RunRecord, reference_tokens: dict[str, list[int]], *, what: str) -> None:
    for r in ("A", "B"):
        got, want = run.output_ids[r], reference_tokens[r]
        if got != want:
            i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise TokenMismatch(f"{what}: policy {run.policy!r}, request {r} differs from the validated reference "
                                f"at output {i}: got {got[i] if i < len(got) else 'nothing'}, "
                                f"expected {want[i] if i < len(want) else 'nothing'}")


def trial_orders(policies: list[str], trials: int) -> list[list[str]]:
    """Paired trials with rotating order: trial 1 runs p0, p1, ..; trial 2 runs p1, .., p0; and so on."""
    n = len(policies)
    return [[policies[(t + i) % n] for i in range(n)] for t in range(trials)]


def run_trials(engine: Engine, *, policies: list[str], trials: int, warmups: int, prompt_tokens: int,
               output_tokens: int, chunk_size: int, logical_reset: bool, reference_tokens: dict,
               on_run: Callable[[], None] | None = None) -> list[dict]:
    """Warmups (untimed, checked), then paired timed trials; returns report trial records."""
    kw = dict(prompt_tokens=prompt_tokens, output_tokens=output_tokens, chunk_size=chunk_size,
              logical_reset=logical_reset)
    for policy in policies:
        for w in range(warmups):
            check_tokens(run_once(engine, policy, **kw), reference_tokens, what=f"warmup {w + 1}")
            if on_run:
                on_run()
    records = []
    for t, order in enumerate(trial_orders(list(policies), trials), start=1):
        for position, policy in enumerate(order):
            run = run_once(engine, policy, **kw)
            check_tokens(run, reference_tokens, what=f"trial {t}")
            records.append(run.to_trial(trial=t, position=position))
            if on_run:
                on_run()
    return records

"""Fixed-arrival trials: A is decoding, B arrives at t0; a policy orders the work; every token is timed.

    exp = Experiment(params)
    validation = exp.validate()                       # the gate: nothing is timed unless it passes
    trials = run_trials(exp.engine, walks={p: partial(exp.walk, p) for p in params.policies}, trials=5,
                        warmups=1, logical_reset=True, reference_tokens=...)

A run is the executor (executor.py) with a recorder, on the policy deciding live and held to the plan the
gate checked, step for step. Untimed are A's reset and set-up prefill and its first output; timed from t0
are B's cache reset, the policy's decisions, device execution, greedy selection and the host observation of
each token id, stamped with `time.perf_counter_ns()` right after the id arrives.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pdlib.engine import Engine
from pdlib.errors import RunFailure
from pdlib.report.checks import mismatch
from pdlib.run.executor import Hook, execute
from pdlib.scheduler import Prefill, Step


class TokenMismatch(RunFailure):
    """A warmup or timed run produced a token sequence that differs from the validated reference."""


@dataclass
class RunRecord:
    policy: str
    output_ids: dict[str, list[int]]
    emit_ns: dict[str, list[int]]  # since t0, timed outputs only
    events: list[dict]
    makespan_ns: int

    def to_trial(self, *, trial: int, position: int) -> dict:
        timed_from = {"A": 1, "B": 0}
        return {
            "policy": self.policy,
            "trial": trial,
            "position": position,
            "makespan_ns": self.makespan_ns,
            "requests": {
                r: {"output_ids": self.output_ids[r], "timed_from": timed_from[r], "emit_ns": self.emit_ns[r]}
                for r in ("A", "B")
            },
            "events": self.events,
        }


class Recorder(Hook):
    """Token ids (all), emission times and events (timed steps only), in ns since t0."""

    def __init__(self):
        self.t0 = None
        self.ids = {"A": [], "B": []}
        self.emits = {"A": [], "B": []}
        self.events = []

    def on_t0(self, t0, t_reset_end):
        self.t0 = t0
        self.events.append(
            {"kind": "reset", "req": "B", "start": 0, "stop": 0, "t_start_ns": 0, "t_end_ns": t_reset_end - t0}
        )

    def on_step(self, index, step, results, t_start, t_end, *, timed):
        for r in results:
            req = r.work.req
            if r.token is not None:
                self.ids[req].append(r.token)
                if timed:
                    self.emits[req].append(r.t_emit - self.t0)
            if timed and r.remote is not None:  # B's prefill ran elsewhere: on a worker or a second stream
                x = r.remote
                self.events.append(
                    {
                        "kind": "prefill",
                        "req": req,
                        "start": r.start,
                        "stop": r.stop,
                        "remote": True,
                        "site": x["site"],
                        "t_start_ns": x["t_dispatch"] - self.t0,
                        "t_end_ns": x["t_ready"] - self.t0,
                        # partition: the slices' SMs (None and split false where the backend has none)
                        **{k: x[k] for k in ("split", "a_sms", "b_sms") if x["site"] == "slice"},
                    }
                )
                if x["site"] == "worker":  # disagg: the join is the K/V transfer
                    self.events.append(
                        {
                            "kind": "transfer",
                            "req": req,
                            "start": r.start,
                            "stop": r.stop,
                            "bytes": x["bytes"],
                            "mode": x["mode"],
                            "t_start_ns": x["t_start"] - self.t0,
                            "t_end_ns": x["t_end"] - self.t0,
                        }
                    )
            elif timed:
                self.events.append(
                    {
                        "kind": "prefill" if isinstance(r.work, Prefill) else "decode",
                        "req": req,
                        "start": r.start,
                        "stop": r.stop,
                        "t_start_ns": t_start - self.t0,
                        "t_issued_ns": r.t_issued - self.t0,
                        "t_wait_ns": r.t_wait - self.t0,
                        "t_end_ns": t_end - self.t0,
                        "cpu_issue_ns": r.cpu_issue,
                    }
                )

    def record(self, policy: str) -> RunRecord:
        makespan = max(self.emits["A"][-1] if self.emits["A"] else 0, self.emits["B"][-1])
        return RunRecord(policy, self.ids, self.emits, self.events, makespan)


def run_once(
    engine: Engine,
    policy: str,
    *,
    steps: Iterable[Step],
    logical_reset: bool,
    pipeline: bool = False,
    poll: bool = False,
) -> RunRecord:
    """One timed run of `policy`: `steps` is its step source (Experiment.walk), or a plan; `pipeline`:
    pipelined decodes, `poll`: chunks issued while they are polled (executor.py)."""
    recorder = Recorder()
    execute(engine, steps, logical_reset=logical_reset, hooks=[recorder], pipeline=pipeline, poll=poll)
    return recorder.record(policy)


def check_tokens(run: RunRecord, reference_tokens: dict[str, list[int]], *, what: str) -> None:
    for r in ("A", "B"):  # the same rule a report's trials are checked by when it is read
        diff = mismatch(run.output_ids[r], reference_tokens[r])
        if diff:
            raise TokenMismatch(f"{what}: policy {run.policy!r}, request {r} {diff}")


def trial_orders(policies: list[str], trials: int) -> list[list[str]]:
    """Paired trials with rotating order: trial 1 runs p0, p1, ..; trial 2 runs p1, .., p0; and so on."""
    n = len(policies)
    return [[policies[(t + i) % n] for i in range(n)] for t in range(trials)]


def run_trials(
    engine: Engine,
    *,
    walks: dict[str, Callable[[], Iterable[Step]]],
    trials: int,
    warmups: int,
    logical_reset: bool,
    reference_tokens: dict,
    on_run: Callable[[], None] | None = None,
    pipeline: bool = False,
    poll: bool = False,
) -> list[dict]:
    """Warmups (untimed, checked), then paired timed trials of every policy in `walks` (in its order; each
    maps to a fresh step source per run); returns report trial records."""
    policies = list(walks)
    for policy in policies:
        for w in range(warmups):
            run = run_once(
                engine, policy, steps=walks[policy](), logical_reset=logical_reset, pipeline=pipeline, poll=poll
            )
            check_tokens(run, reference_tokens, what=f"warmup {w + 1}")
            if on_run:
                on_run()
    records = []
    for t, order in enumerate(trial_orders(policies, trials), start=1):
        for position, policy in enumerate(order):
            run = run_once(
                engine, policy, steps=walks[policy](), logical_reset=logical_reset, pipeline=pipeline, poll=poll
            )
            check_tokens(run, reference_tokens, what=f"trial {t}")
            records.append(run.to_trial(trial=t, position=position))
            if on_run:
                on_run()
    return records

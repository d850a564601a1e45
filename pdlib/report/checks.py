"""A report is checked when it is read: its shape (schema.py) and what it claims.

    check_report(report, where="outputs/x/report.json.gz")   # InputError, one line, on the first problem
    first_difference(got, want)        # the gate's token rule: None when equal, else the first output that differs

Beyond the shape, a report claims that every timed trial of a gated policy ran the sequence the gate
validated: its output ids equal reference_tokens exactly (the rule trials are held to when they run,
pdlib/run/trial.py), the policy's gate passed, and every event lies inside its trial in clock order. A peer's
trials (timed, never gated: schema.py) carry their agreement with the reference instead.
"""

import numpy as np

from pdlib.errors import INT64_MAX, InputError
from pdlib.report.schema import EVENT_KINDS, REQUESTS, SCHEMA, TOP_LEVEL_KEYS

TRIAL_KEYS = ("policy", "trial", "makespan_ns", "requests", "events")
REQUEST_KEYS = ("output_ids", "timed_from", "emit_ns")
EVENT_KEYS = ("kind", "req", "start", "stop", "t_start_ns", "t_end_ns")
STEP_STAMPS = ("t_start_ns", "t_issued_ns", "t_wait_ns", "t_end_ns")  # a step's clock readings, in order


# ---- the gate's token rule ----------------------------------------------------------------------------
def first_difference(got: list, want: list) -> int | None:
    """None when the sequences are equal, else the first output at which they differ (one ending early differs
    where it ends)."""
    if got == want:
        return None
    return next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))


def mismatch(got: list, want: list) -> str | None:
    """None when `got` equals the validated reference `want`, else where and how it differs."""
    i = first_difference(got, want)
    if i is None:
        return None
    return (
        f"differs from the validated reference at output {i}: got {got[i] if i < len(got) else 'nothing'}, "
        f"expected {want[i] if i < len(want) else 'nothing'}"
    )


def agreement(got: list, want: list) -> int:
    """How many leading outputs of `got` equal the reference's (a peer's "agreement")."""
    i = first_difference(got, want)
    return len(got) if i is None else i


# ---- the report --------------------------------------------------------------------------------------
def _require(ok, message):
    """For what a report file says (user input): InputError, one line."""
    if not ok:
        raise InputError(message)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and -INT64_MAX - 1 <= x <= INT64_MAX


def check_report(report: dict, *, where: str = "report") -> None:
    """Schema, top-level keys; per trial: both requests with consistent ids/emissions/makespan, events inside
    the trial; per policy: gated and passed with every trial equal to reference_tokens, or a peer."""
    _require(isinstance(report, dict), f"{where}: top level is not a JSON object")
    _require(report.get("schema") == SCHEMA, f"{where}: schema is {report.get('schema')!r}, expected {SCHEMA!r}")
    missing = [k for k in TOP_LEVEL_KEYS if k not in report]
    _require(not missing, f"{where}: missing top-level keys: {', '.join(missing)}")
    solo = report.get("solo")  # optional (older reports): the references a goal ratio divides by
    if solo is not None:
        ok = isinstance(solo, dict) and all(
            isinstance(solo.get(k), int | float) and not isinstance(solo.get(k), bool) and 0 < solo[k] < float("inf")
            for k in ("a_decode_ms", "b_prefill_s")
        )
        _require(ok, f"{where}: solo needs a_decode_ms and b_prefill_s, positive finite numbers; got {solo!r:.120}")
    trials = report["trials"]
    _require(isinstance(trials, list), f"{where}: 'trials' must be a list")
    _require(trials, f"{where}: holds no trials (a --validate-only run?): nothing to analyse")
    reference = _reference(report["reference_tokens"], where)
    validation = report["validation"]
    _require(isinstance(validation, dict), f"{where}: validation is not an object")
    seen, peers = set(), {}
    for i, trial in enumerate(trials):
        _check_trial(trial, f"{where}: trials[{i}]")
        key = (trial["policy"], trial["trial"])
        _require(key not in seen, f"{where}: trials[{i}] repeats policy {key[0]!r} trial {key[1]}")
        seen.add(key)
        peer = peers.setdefault(trial["policy"], "peer" in trial)
        _require(
            peer == ("peer" in trial),
            f"{where}: trials[{i}] ({key[0]} trial {key[1]}): policy {key[0]!r} has trials marked peer and "
            f"trials not; expected all or none",
        )
    for policy, peer in peers.items():  # the gate first: an edited reference is named as such
        _check_gate(policy, peer, validation, reference, where)
    for i, trial in enumerate(trials):
        _check_tokens(trial, reference, f"{where}: trials[{i}] ({trial['policy']} trial {trial['trial']})")


def _reference(ref, where):
    _require(
        isinstance(ref, dict) and all(isinstance(ref.get(r), list) for r in REQUESTS),
        f"{where}: reference_tokens must map each of {', '.join(REQUESTS)} to a list of output ids",
    )
    return ref


def _check_gate(policy, peer, validation, reference, where):
    """A gated policy's trials follow its passed gate; a peer has no gate to follow."""
    entry = validation.get(policy)
    if peer:  # a policy whose gate ran (and failed, say) is not passed off as an ungated peer
        _require(
            entry is None,
            f"{where}: peer policy {policy!r} has a validation entry; expected none (a peer is never gated)",
        )
        return
    _require(
        entry is not None,
        f"{where}: policy {policy!r} has trials but no validation entry; expected its gate's result "
        f'(or its trials marked "peer": true)',
    )
    passed = entry.get("passed") if isinstance(entry, dict) else None
    _require(
        isinstance(passed, bool),
        f"{where}: validation results are malformed: validation[{policy!r}] passed is {passed!r}; "
        f"expected true or false",
    )
    _require(
        passed,
        f"{where}: policy {policy!r} has trials but its gate did not pass (validation[{policy!r}] passed is "
        f"false); expected true: nothing is timed before its gate passes",
    )
    tokens = entry.get("tokens")  # the reference's tokens the gate compared against, where recorded
    if tokens is not None:
        _require(isinstance(tokens, dict), f"{where}: validation[{policy!r}] tokens is not an object")
        for r in REQUESTS:
            want = tokens.get(r)
            _require(isinstance(want, list), f"{where}: validation[{policy!r}] tokens {r} is not a list of ids")
            diff = mismatch(reference[r], want)
            _require(diff is None, f"{where}: reference_tokens request {r} {diff} (validation[{policy!r}] tokens)")


def _check_tokens(trial, reference, where):
    """A gated trial's outputs equal the reference exactly (as the runner checked them); a peer's carry their
    agreement with it."""
    if "peer" not in trial:
        for r in REQUESTS:
            diff = mismatch(trial["requests"][r]["output_ids"], reference[r])
            _require(diff is None, f"{where}: request {r} {diff}")
        return
    agreed = trial["agreement"]
    for r in REQUESTS:
        n = agreement(trial["requests"][r]["output_ids"], reference[r])
        _require(
            agreed.get(r) == n and _is_int(agreed.get(r)),
            f"{where}: agreement {r} is {agreed.get(r)!r}; expected {n}, the leading outputs equal to reference_tokens",
        )


def _check_trial(trial, where):
    _require(isinstance(trial, dict), f"{where}: not an object")
    missing = [k for k in TRIAL_KEYS if k not in trial]
    _require(not missing, f"{where}: missing keys: {', '.join(missing)}")
    _require(isinstance(trial["policy"], str), f"{where}: policy is {trial['policy']!r:.60}; expected a policy name")
    n = trial["trial"]  # sorted, paired across policies and drawn: a number, as the runner counts from 1
    _require(_is_int(n) and n >= 1, f"{where}: trial is {n!r:.60}; expected an integer >= 1 (the trial's number)")
    where = f"{where} ({trial['policy']} trial {n})"
    requests = trial["requests"] if isinstance(trial["requests"], dict) else {}
    for name in REQUESTS:
        _check_request(requests.get(name), f"{where} request {name}")
    # Makespan is by definition the last emission of either request; anything else is a writer bug.
    last = max(requests[r]["emit_ns"][-1] for r in REQUESTS)
    _require(trial["makespan_ns"] == last, f"{where}: makespan_ns {trial['makespan_ns']} != last emission {last} ns")
    # a peer (schema.py) is marked and carries its agreement: neither appears alone
    _require("peer" in trial or "agreement" not in trial, f'{where}: has "agreement" but no "peer": true')
    if "peer" in trial:
        _require(trial["peer"] is True, f'{where}: "peer" is {trial["peer"]!r}; expected true')
        _require(
            isinstance(trial.get("agreement"), dict),
            f'{where}: a peer trial needs "agreement": {{request: leading outputs equal to reference_tokens}}',
        )
    _require(isinstance(trial["events"], list), f"{where}: events must be a list")
    for j, ev in enumerate(trial["events"]):
        _check_event(ev, last, f"{where} events[{j}]")


def _check_event(ev, makespan, where):
    _require(isinstance(ev, dict) and all(k in ev for k in EVENT_KEYS), f"{where}: needs keys {', '.join(EVENT_KEYS)}")
    _require(
        ev["kind"] in EVENT_KINDS and ev["req"] in REQUESTS,
        f"{where}: kind {ev['kind']!r} / req {ev['req']!r} not in {EVENT_KINDS} / {REQUESTS}",
    )
    # Every event is timed: it starts at or after t0 and ends by the trial's last token (the last step's end).
    t0, t1 = ev["t_start_ns"], ev["t_end_ns"]
    _require(
        _is_int(t0) and _is_int(t1) and 0 <= t0 <= t1 <= makespan,
        f"{where}: t_start_ns {t0!r}, t_end_ns {t1!r}; expected integers with 0 <= t_start_ns <= t_end_ns <= "
        f"makespan_ns ({makespan})",
    )
    stamps = [k for k in STEP_STAMPS if k in ev]
    if len(stamps) > 2:  # a step's inner clock readings, where recorded
        times = [ev[k] for k in stamps]
        _require(
            all(_is_int(t) for t in times) and times == sorted(times),
            f"{where}: {', '.join(stamps)} must be integers in that order, got {', '.join(map(repr, times))}",
        )
    if "cpu_issue_ns" in ev:  # the host thread's CPU time while issuing the step: a part of that span
        cpu = ev["cpu_issue_ns"]
        _require("t_issued_ns" in ev, f"{where}: cpu_issue_ns without t_issued_ns")
        span = ev["t_issued_ns"] - ev["t_start_ns"]
        _require(
            _is_int(cpu) and 0 <= cpu <= span,
            f"{where}: cpu_issue_ns {cpu!r} must be an integer from 0 to t_issued_ns - t_start_ns ({span})",
        )


def _check_request(req, where):
    _require(isinstance(req, dict), f"{where}: missing")
    missing = [k for k in REQUEST_KEYS if k not in req]
    _require(not missing, f"{where}: lacks {', '.join(missing)}")
    ids, start, emit = req["output_ids"], req["timed_from"], req["emit_ns"]
    _require(isinstance(ids, list) and isinstance(emit, list), f"{where}: output_ids and emit_ns must be lists")
    _require(_is_int(start) and 0 <= start <= len(ids), f"{where}: timed_from {start!r} is not in [0, {len(ids)}]")
    _require(all(_is_int(i) for i in ids), f"{where}: output_ids must be integer token ids")
    _require(
        len(emit) == len(ids) - start,
        f"{where}: {len(emit)} emit_ns for {len(ids)} output_ids from timed_from {start} (expected {len(ids) - start})",
    )
    _require(emit, f"{where}: no timed outputs")
    # element by element first: a nested list or a float would make numpy fail or round, not refuse
    _require(
        all(_is_int(t) for t in emit),
        f"{where}: emit_ns must be non-negative, non-decreasing integer ns (below 2**63)",
    )
    e = np.asarray(emit, dtype=np.int64)
    _require(
        e[0] >= 0 and not np.any(np.diff(e) < 0),
        f"{where}: emit_ns must be non-negative, non-decreasing integer ns",
    )

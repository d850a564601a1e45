"""A search's reps, the workload of one point (serve_search.py measures it) and what its warmups run.

    w = rep_workload(workload_params, rate=4.0, rep=1)   # rep 1's sample at 4x
    rep_sample(workload_params, 1)                       # {"seed"}, {"trace_rows": [i, j]} or {"window_s": [a, b]}
    warm_up(run, 1, w_warm, w, release=collect)          # the workload the warmups ran (w_warm, or w after one
                                                         # at w_warm ran out of memory)

The rate: a trace's `rate_multiplier` (arrivals divided by it), a poisson source's `rate` (requests/s); the
params' own value is replaced by each measured rate. A rep is one fixed workload sample (REP_RULE):
- poisson: seed + rep (the lengths do not depend on the rate: the gaps are drawn first, always n - 1 of them);
- a trace with `first: K`: the rep-th block of K consecutive requests of the window (of the whole trace without
  window_s), refused if the window holds fewer than reps*K: the trace's own burstiness with a fixed N;
- a trace with window_s [a, b) and no `first`: the window moved by rep*(b - a) seconds; a whole trace: reps 1.
Rep 0 is the params' workload itself (Workload.from_params at that rate).
"""

import dataclasses
from decimal import Decimal

from pdlib.errors import InputError, check_int, out_of_memory
from pdlib.traces import Trace, load_trace
from pdlib.workload import LIMITS, TRACE_SOURCES, Workload, at_rate, trace_gap_ns, trace_window

REP_RULE = "pdlib.serve-search.rep/1: poisson seed+rep; trace first:K the rep-th K-block; window_s moved rep widths"


def rep_sample(workload_params: dict, rep: int) -> dict:
    """What makes rep `rep` its own sample (module docstring): {"seed"}, {"trace_rows": [i, j]} (trace indices) or
    {"window_s": [a, b]}; InputError when the params cannot give that rep."""
    check_int("rep", rep, 0)
    source, first, window = (workload_params.get(k) for k in ("source", "first", "window_s"))
    if source == "poisson":
        return {"seed": workload_params.get("seed", 0) + rep}
    if source not in TRACE_SOURCES:
        raise InputError(
            f"a rate search needs arrivals to speed up: source azure-code, azure-conv or poisson, not {source!r}"
        )
    trace = load_trace(TRACE_SOURCES[source])
    lo, hi = trace_window(trace, window)
    if first is None and window is None:
        if rep:
            raise InputError("reps > 1 on a whole trace: set `first: K` (rep r: the r-th K requests) or window_s")
        return {"trace_rows": [0, trace.n]}
    if first is None:
        a, b = (Decimal(str(x)) for x in window)
        return {"window_s": [float(a + rep * (b - a)), float(b + rep * (b - a))]}
    check_int("first", first, 1)
    start = lo + rep * first
    if start + first > hi:
        where = f"window_s={list(window)}" if window is not None else f"trace {source}"
        raise InputError(
            f"rep {rep} needs requests [{start}, {start + first}) of {where}, which holds {hi - lo} "
            f"({(hi - lo) // first} reps of first={first}): lower reps or first"
        )
    return {"trace_rows": [start, start + first]}


def rep_workload(workload_params: dict, rate: float, rep: int) -> Workload:
    """The workload of one point: the params' at `rate` (a trace's rate_multiplier, poisson's rate), rep's sample."""
    sample = rep_sample(workload_params, rep)
    p = at_rate(workload_params, rate)
    if rep == 0 or "seed" in sample or "window_s" in sample:  # rep 0: the plain workload
        return Workload.from_params({**p, **({} if rep == 0 else sample)})
    i, j = sample["trace_rows"]
    t = load_trace(TRACE_SOURCES[p["source"]])
    sub = Trace(t.name, t.arrival_ns[i:j] - t.arrival_ns[i], t.prompt_tokens[i:j], t.output_tokens[i:j], t.start)
    limits = {k: p.get(k) for k in LIMITS}
    pace = {"pace": p["pace"], "pace_gap_ns": trace_gap_ns(t)} if p.get("pace") else {}  # the whole trace's rate
    w = Workload.from_trace(sub, first=p["first"], rate_multiplier=rate, source=p["source"], **pace, **limits)
    return dataclasses.replace(w, options={**w.options, "trace_requests": t.n})


def warm_up(run, n: int, w_warm: Workload, w: Workload, *, release) -> Workload:
    """n warmups, run(w_warm) each (w_warm: the point's workload w, or the same rep at the search's start rate,
    above it); where one runs out of device memory above the point's rate, which says nothing about the point, the
    rest run at its rate (w), after `release()` collects the failed one's memory. Returns the workload the last
    one ran. (For a peer: an engine's failed warmup cannot run again without a new engine.)"""
    for _ in range(n):
        if w_warm is not w:
            try:
                run(w_warm)
                continue
            except RuntimeError as e:
                if not out_of_memory(e):
                    raise
            release()  # outside the except: its traceback held the failed run's frames
            w_warm = w
        run(w)
    return w_warm

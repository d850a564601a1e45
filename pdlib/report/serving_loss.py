"""Where a serving run loses its latency, in numbers a search point keeps (run/serve_search.py) and the analysis
reads; and, for a rate search, the point that bounds its value and what failed there. numpy only.

    split = time_split(run)                       # ns: prompt steps, decode-only steps, no step, waiting, host
    gaps = gap_work(run)                          # per request: its gaps and the prompt work inside each
    loss = run_loss(run, slos, kv_bytes_per_position=b)   # flat numbers (below)
    lim = search_limit(result, criterion, slo, points)   # what bounds a search's value: the bounds broken there
    print(limit_text(lim))

A run is a serve or peer run: requests {name, arrival_ns, emit_ns, prompt_tokens, output_tokens} and steps
{work: [[name, prompt tokens or None], ...], t_start_ns, t_end_ns, optionally t_issued_ns and replica}.

Time (time_split): a step covers [t_start, t_end]; pipelined steps overlap, so each kind's time is the measure of
its intervals' union, a decode-only step's time under a prompt step counting as the prompt step's; `no_step` is
the makespan no step covers (the host between steps, or the loop waiting for an arrival: `waiting`, None for a
run of replicas); `host` is the host's building time (t_issued - t_start), None where steps have no issue times.

A gap has prompt work inside it when a step carrying prompt tokens started within [the previous emit, this emit):
every step after the one that emitted the token before, up to and including its own (a run of replicas counts
the request's own replica's steps).

run_loss, the fields (counts over the requests that emitted; shares NaN where nothing is counted):
- prompt_steps_share, decode_steps_share, no_step_share, waiting_share: of the makespan; host_share: of the time
  some step was in flight (near 1: steps wait on the host);
- per Slo name n: tbt_over_n, the pooled gaps over its TBT bound, and tbt_over_n_prompt, those with prompt work
  inside (prefill stalls); ttft_over_n, the requests over its TTFT bound, and ttft_over_n_wait_share, the part
  of their TTFT spent before their first prompt step started (queued behind other work, against their own
  prefill; a request whose prompt no logged step carried counts all of it), ttft_over_n_memory_share, the part
  spent arrived but waiting for a free cache (requests' `cache_wait_ns`; 0 where a run has none); tpot_over_n,
  the requests over its TPOT bound, and tpot_over_n_prompt_share, the part of their gaps' time in gaps with
  prompt work;
- peak_requests: the most requests between arrival and last token at any moment; peak_positions: the most
  positions (prompt + output) live requests held at any moment; peak_kv_gib: that in K/V bytes when
  `kv_bytes_per_position` is given: what caches sized per request would need at the peak (a run's caches are
  allocated before it, each of the workload's longest request: this says how much of them the rate used);
  cache_waits: the requests that waited for a cache; peak_memory_gib: the device memory the run held at most
  (everything the process holds there, as MLX counts it; absent where the run does not say); held_gib (a
  search's point): what the process held as the point's runs began, its warmups first (models, references, the
  engine's caches).
Under overlap, partition and disagg a prompt runs beside the steps and only the step that joins it carries its
tokens: the wait then reads up to that step, and the gaps its prompt work slowed show none inside.

search_limit: the search's value is its lower-median rep's highest passing rate (report.serving.search); the
limit is that rep's lowest failing rate (None where it has none: every rate passed, or its budget ran out first),
the point's failed bounds and its run_loss (None where the log's point has none), and `causes`, named by these
rules: a failed TBT bound is lost to "prefill stalls" when at least half its over-bound gaps had prompt work
inside, else to "host time" when host_share >= 0.5, else to "decode steps" ("decode steps or host time" where
host_share is unknown, as for a peer; none named with no gap over it: a NaN p99);
a failed TTFT bound (or a failed attainment with requests over the TTFT bound) to "memory" when at least half
of those requests' TTFT was spent waiting for a cache, else "queueing" when at least half was wait, else
"prefill"; a failed attainment with requests over the TPOT bound to "prefill stalls" when at least half their gap
time had prompt work inside, else "decode steps"; requests a run lost (a peer's that ended short) to "lost
requests". A point whose run ran out of device memory (a search records it and goes on:
run/search_report.memory_point) is lost to "memory" alone.
"""

import math

import numpy as np

from pdlib.errors import InputError
from pdlib.report.serving import NS_PER_MS, Criterion, Slo, meets_bound, slo_list

GIB = 2**30
HALF = 0.5  # the share at which a cause is named (module docstring)


# ---- time --------------------------------------------------------------------------------------------------


def union(intervals) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def measure(intervals) -> int:
    return sum(b - a for a, b in intervals)


def overlap(xs, ys) -> int:
    """The measure of two unions' intersection (both sorted, disjoint)."""
    total, i, j = 0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, hi - lo)
        i, j = (i + 1, j) if xs[i][1] < ys[j][1] else (i, j + 1)
    return total


def issued_times(run: dict, where: str = "run") -> list[int] | None:
    """The steps' issue times, None where they have none; InputError where one lies outside its step."""
    steps = run["steps"]
    issued = steps.get("t_issued_ns")
    if issued is None:
        return None
    ok = isinstance(issued, list) and len(issued) == len(steps["t_start_ns"])
    ok = ok and all(
        isinstance(t, int) and not isinstance(t, bool) and a <= t <= b
        for a, t, b in zip(steps["t_start_ns"], issued, steps["t_end_ns"])
    )
    if not ok:
        raise InputError(f"{where}: steps.t_issued_ns must give each step a time between its start and its end")
    return issued


def time_split(run: dict, where: str = "run") -> dict:
    """ns: makespan, prompt_steps, decode_steps, no_step, busy (some step in flight), waiting (None for
    replicas), host (None without issue times)."""
    s = run["steps"]
    spans = list(zip(s["t_start_ns"], s["t_end_ns"]))
    prompt = union([t for t, work in zip(spans, s["work"]) if any(n for _, n in work)])
    decode = union([t for t, work in zip(spans, s["work"]) if not any(n for _, n in work)])
    busy = measure(union(prompt + decode))
    makespan = run.get("makespan_ns") or (max(s["t_end_ns"]) if spans else 0)
    issued = issued_times(run, where)
    return {
        "makespan": makespan,
        "prompt_steps": measure(prompt),
        "decode_steps": measure(decode) - overlap(decode, prompt),
        "no_step": makespan - busy,
        "busy": busy,
        "waiting": None if run.get("replicas") else run.get("idle_ns", 0),
        "host": None if issued is None else sum(t - a for (a, _), t in zip(spans, issued)),
    }


# ---- gaps and requests -------------------------------------------------------------------------------------


def gap_work(run: dict) -> list[dict]:
    """Per request with two emits or more, in request order: name, gaps_ns, emit_ns (each gap's end), and
    prompt_steps, prompt_tokens inside each gap (module docstring)."""
    work, t_start = run["steps"]["work"], np.asarray(run["steps"]["t_start_ns"], dtype=np.int64)
    replica = np.asarray(run["steps"].get("replica", [0] * len(work)), dtype=np.int64)
    tokens_all = np.array([sum(n for _, n in w if n is not None) for w in work], dtype=np.int64)
    by_replica = {}
    for k in np.unique(replica).tolist():
        mine = np.flatnonzero(replica == k)
        order = mine[np.argsort(t_start[mine], kind="stable")]
        tokens = tokens_all[order]
        by_replica[k] = (
            t_start[order],
            np.concatenate([[0], np.cumsum(tokens)]),
            np.concatenate([[0], np.cumsum(tokens > 0)]),
        )
    none = (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
    out = []
    for r in run["requests"]:
        emit = np.asarray(r["emit_ns"], dtype=np.int64)
        if emit.size < 2:
            continue
        starts, cum_tokens, cum_steps = by_replica.get(r.get("replica", 0), none)
        lo = np.searchsorted(starts, emit[:-1], side="left")
        hi = np.searchsorted(starts, emit[1:], side="left")
        out.append(
            {
                "name": r["name"],
                "gaps_ns": np.diff(emit),
                "emit_ns": emit[1:],
                "prompt_steps": cum_steps[hi] - cum_steps[lo],
                "prompt_tokens": cum_tokens[hi] - cum_tokens[lo],
            }
        )
    return out


def first_prompt_start(run: dict) -> dict:
    """Per request name: the start of the first step that carried any of its prompt."""
    out: dict = {}
    for work, t0 in zip(run["steps"]["work"], run["steps"]["t_start_ns"]):
        for name, n in work:
            if n and name not in out:
                out[name] = t0
    return out


def peaks(requests: list[dict]) -> tuple[int, int]:
    """(the most requests live at any moment, the most positions live requests held at any moment): live from
    arrival to last emit; one ending at the instant another arrives is not counted with it."""
    events = []
    for r in requests:
        size = int(r["prompt_tokens"]) + int(r["output_tokens"])
        events += [(int(r["arrival_ns"]), 1, 1, size), (int(r["emit_ns"][-1]), 0, -1, -size)]
    n = positions = peak_n = peak_pos = 0
    for _, _, dn, dp in sorted(events):  # at one instant, ends (0) before arrivals (1)
        n, positions = n + dn, positions + dp
        peak_n, peak_pos = max(peak_n, n), max(peak_pos, positions)
    return peak_n, peak_pos


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else math.nan


def run_loss(run: dict, slos=(), *, kv_bytes_per_position: int | None = None) -> dict:
    """The module docstring's fields for one run (its requests that emitted)."""
    t = time_split(run)
    m = t["makespan"]
    out = {
        "prompt_steps_share": _share(t["prompt_steps"], m),
        "decode_steps_share": _share(t["decode_steps"], m),
        "no_step_share": _share(t["no_step"], m),
        "waiting_share": math.nan if t["waiting"] is None else _share(t["waiting"], m),
        "host_share": math.nan if t["host"] is None else _share(t["host"], t["busy"]),
    }
    requests = [r for r in run["requests"] if r["emit_ns"]]
    gaps = {g["name"]: g for g in gap_work({**run, "requests": requests})}
    pooled = np.concatenate([g["gaps_ns"] for g in gaps.values()]) if gaps else np.zeros(0, np.int64)
    stalled = np.concatenate([g["prompt_steps"] > 0 for g in gaps.values()]) if gaps else np.zeros(0, bool)
    first = first_prompt_start(run)
    ttft = np.array([r["emit_ns"][0] - r["arrival_ns"] for r in requests], dtype=np.int64)
    start = np.array([first.get(r["name"], r["emit_ns"][0]) for r in requests], dtype=np.int64)
    wait = start - np.array([r["arrival_ns"] for r in requests], dtype=np.int64)
    held = np.array([r.get("cache_wait_ns", 0) for r in requests], dtype=np.int64)  # waiting for a cache
    for slo in slo_list(slos):
        n = slo.name
        over = pooled > slo.tbt_ms * NS_PER_MS  # a bound is met at equality
        out[f"tbt_over_{n}"] = int(over.sum())
        out[f"tbt_over_{n}_prompt"] = int((over & stalled).sum())
        late = ttft > slo.ttft_ms * NS_PER_MS
        out[f"ttft_over_{n}"] = int(late.sum())
        out[f"ttft_over_{n}_wait_share"] = _share(float(wait[late].sum()), float(ttft[late].sum()))
        out[f"ttft_over_{n}_memory_share"] = _share(float(held[late].sum()), float(ttft[late].sum()))
        slow = [g for g in gaps.values() if g["gaps_ns"].mean() > slo.tpot_ms * NS_PER_MS]  # TPOT: mean gap
        out[f"tpot_over_{n}"] = len(slow)
        spent = sum(int(g["gaps_ns"].sum()) for g in slow)
        out[f"tpot_over_{n}_prompt_share"] = _share(
            sum(int(g["gaps_ns"][g["prompt_steps"] > 0].sum()) for g in slow), spent
        )
    out["peak_requests"], out["peak_positions"] = peaks(requests)
    out["cache_waits"] = int((held > 0).sum())
    if "peak_memory_bytes" in run:
        out["peak_memory_gib"] = run["peak_memory_bytes"] / GIB
    if kv_bytes_per_position is not None:
        out["peak_kv_gib"] = out["peak_positions"] * kv_bytes_per_position / GIB
    return out


# ---- what bounds a search ----------------------------------------------------------------------------------


def failed_bounds(criterion: Criterion, summary: dict) -> list[dict]:
    """The criterion's bounds this summary breaks: {field, value, bound, side} (a NaN field meets no bound)."""
    out = []
    for side, bounds in (("at_most", criterion.at_most), ("at_least", criterion.at_least)):
        for k, b in bounds.items():
            if not meets_bound(summary[k], b, side):
                out.append({"field": k, "value": summary[k], "bound": b, "side": side})
    return out


def _causes(failed: list[dict], loss: dict | None, slo: Slo, lost: int = 0) -> list[str]:
    if not loss:
        return []
    if loss.get("out_of_memory"):  # the run stopped there (run/search_report.memory_point)
        return ["memory"]
    n, causes = slo.name, []
    fields = {f["field"] for f in failed}
    if "tbt_p99_ms" in fields and (over := loss[f"tbt_over_{n}"]):  # none over: a NaN p99 (no gaps) names nothing
        host = loss["host_share"]
        stalls = loss[f"tbt_over_{n}_prompt"] >= HALF * over
        slow = "decode steps or host time" if math.isnan(host) else "host time" if host >= HALF else "decode steps"
        causes.append("prefill stalls" if stalls else slow)  # a peer's steps have no issue times: host unknown
    attain = f"attain_{n}" in fields
    if ("ttft_p90_ms" in fields or attain) and loss[f"ttft_over_{n}"]:
        memory = loss.get(f"ttft_over_{n}_memory_share", 0.0) >= HALF  # older logs' points have no such share
        causes.append("memory" if memory else "queueing" if loss[f"ttft_over_{n}_wait_share"] >= HALF else "prefill")
    if attain and loss[f"tpot_over_{n}"]:
        causes.append("prefill stalls" if loss[f"tpot_over_{n}_prompt_share"] >= HALF else "decode steps")
    if lost and ("n_lost" in fields or attain):
        causes.append("lost requests")
    return list(dict.fromkeys(causes))


def search_limit(result: dict, criterion: Criterion, slo: Slo, points: dict) -> dict | None:
    """What bounds a search result's value (module docstring): None where its median rep never failed. `points`
    maps (rate, rep) to the measured points' log records ({"summary", "loss" (absent in older logs)}); InputError
    where the failing point is missing or passes the criterion (a report that would contradict itself)."""
    rep = result.get("value_rep")
    per = next((p for p in result["reps"] if p["rep"] == rep), None)
    if per is None or per["hi"] is None:
        return None
    point = points.get((per["hi"], rep))
    if point is None:
        raise InputError(f"{criterion.name}: no measured point at rate {per['hi']:g} rep {rep}, its failing rate")
    failed = failed_bounds(criterion, point["summary"])
    if not failed:
        raise InputError(f"{criterion.name}: the point at rate {per['hi']:g} rep {rep} meets it, yet bounds the search")
    loss = point.get("loss")
    return {
        "rate": per["hi"],
        "rep": rep,
        "slo": slo.name,
        "failed": failed,
        "causes": _causes(failed, loss, slo, lost=point["summary"].get("n_lost", 0)),
        "loss": loss,
    }


_NAMES = {"tbt_p99_ms": "TBT p99", "ttft_p90_ms": "TTFT p90"}


def share_below(value: float, bound: float) -> str:
    """`value` as a percentage with the fewest decimals (up to 3) that keep it visibly under `bound`: 43 of 48
    requests against 90% is 89.6%, not a self-contradicting 90%."""
    for digits in range(4):
        text = f"{value:.{digits}%}"
        if float(text[:-1]) < bound * 100:
            return text
    return f"{value:.4%}"


def _failed_text(f: dict) -> str:
    if f["value"] is None:  # a log's null
        return f"{_NAMES.get(f['field'], f['field'])} not recorded"
    if f["field"] == "n_lost":
        return f"{_n(int(f['value']), 'request')} lost"
    if f["field"].startswith("attain_"):
        return f"{share_below(f['value'], f['bound'])} of requests met TTFT and TPOT (< {f['bound']:.0%})"
    return f"{_NAMES.get(f['field'], f['field'])} {f['value']:.4g} ms > {f['bound']:.4g} ms"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def limit_text(limit: dict | None) -> str:
    """One line: where the search's value is lost, the bounds that failed there, the causes and their numbers."""
    if limit is None:
        return "no failing rate measured"
    loss, n = limit["loss"], limit["slo"]
    if loss and loss.get("out_of_memory"):  # no latency to name: the run stopped
        at = f"lost at {limit['rate']:.4g} (rep {limit['rep']}): the run ran out of device memory"
        if "held_gib" in loss:
            at += f" ({loss['peak_memory_gib']:.3g} GiB in use at most, {loss['held_gib']:.3g} GiB of it as it began)"
        return at + " -> memory"
    text = f"lost at {limit['rate']:.4g} (rep {limit['rep']}): " + "; ".join(_failed_text(f) for f in limit["failed"])
    if not loss:
        return text + " (the log's point has no breakdown)"
    parts = []
    if over := loss[f"tbt_over_{n}"]:
        parts.append(f"{loss[f'tbt_over_{n}_prompt']} of {_n(over, 'gap')} over the TBT bound had prompt work inside")
    if late := loss[f"ttft_over_{n}"]:
        text_late = f"{_n(late, 'request')} over the TTFT bound, {loss[f'ttft_over_{n}_wait_share']:.0%} of it waiting"
        if memory := loss.get(f"ttft_over_{n}_memory_share", 0.0):  # NaN or a share > 0
            text_late += f" ({memory:.0%} for a cache)"
        parts.append(text_late)
    if slow := loss[f"tpot_over_{n}"]:
        share = loss[f"tpot_over_{n}_prompt_share"]
        parts.append(f"{_n(slow, 'request')} over the TPOT bound, {share:.0%} of their gaps' time with prompt work")
    parts.append(
        f"{loss['prompt_steps_share']:.0%} of the run in prompt steps, {loss['decode_steps_share']:.0%} decode-only"
    )
    if not math.isnan(loss["host_share"]):
        parts.append(f"the host {loss['host_share']:.0%} of busy time")
    peak = f"at most {_n(loss['peak_requests'], 'request')} at once"
    if "peak_kv_gib" in loss:
        peak += f" ({loss['peak_kv_gib']:.2g} GiB of K/V)"
    if waits := loss.get("cache_waits"):
        peak += f", {_n(waits, 'request')} waiting for a cache"
    if loss.get("peak_memory_gib"):
        peak += f"; {loss['peak_memory_gib']:.3g} GiB of device memory at most"
        if "held_gib" in loss:
            peak += f" ({loss['held_gib']:.3g} GiB as the point began)"
    parts.append(peak)
    causes = f" -> {', '.join(limit['causes'])}" if limit["causes"] else ""
    return f"{text}{causes}: " + "; ".join(parts)


__all__ = [
    "failed_bounds",
    "first_prompt_start",
    "gap_work",
    "limit_text",
    "peaks",
    "run_loss",
    "search_limit",
    "share_below",
    "time_split",
]

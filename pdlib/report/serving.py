"""Metrics of a serving run of N requests, and the rate searches for capacity and goodput, in numpy only.

A run is a list of requests, each {"arrival_ns": int, "emit_ns": [int, ...]}: ns since the run's start, the
emits sorted (equal stamps allowed), the first not before the arrival, every request finished (one emit or more)
unless marked {"lost": True} (a peer's request that ended short, with or without emits): a lost request counts in
the run, meets no SLO and makes the run fail capacity; the latency figures are over the requests that emitted.

    slos = slos_from_step(decode_ms=20.0, ttft_ms=2000.0)
    s = run_summary(requests, slos)          # s["tbt_p99_ms"], s["ttft_p90_ms"], s["attain_strict"], ...
    cap = search(measure, meets=capacity_criterion(slos["strict"]), lo=0.1, hi=64.0, known=cache)
    good = search(measure, meets=goodput_criterion(slos["strict"]), lo=0.1, hi=64.0, known=cache)

Per request: TTFT = first emit - arrival; TBT = each gap between consecutive emits; TPOT = (last emit - first
emit) / (n - 1), undefined (NaN) for n = 1: such a request has no decode to be slow in, so it meets any TPOT
SLO and is left out of the TPOT percentiles; E2E = last emit - arrival. Per run, TBT is summarised twice:
pooled over all gaps (each gap weighs the same, so long requests dominate) and per request (each request's own
p99 or max gap, then the median or p90 over the requests with a gap: stalls hitting each short request once
show there and can vanish in the pooled p99). Percentiles are numpy's default linear interpolation over integer
ns, converted to ms once.

The search (the same for both numbers) treats each repetition index r as one fixed workload sample (the caller's
seed for rep r) and searches its own threshold: geometric bracketing from `start` (doubling until a rate fails, or
halving until one passes, within [lo, hi]), then geometric bisection until the failing rate is within `precision` of
the passing one. A start where another search found each rep's value (`near`) brackets by a first step of 1 +
precision, squared at each next one up to doubling, so a value found again costs two points. A `floor` below lo lets
a rep that fails at lo go on halving down to it (the path down to lo unchanged, so a log's points still serve), so a
system that fails at lo gets a number, not only "none at lo". A rep's capacity is its highest passing rate. The
reported capacity is the lower median over reps: where each rep passes below its threshold and fails above it, that
is the highest rate at which at least half the reps pass, i.e. the median over reps meets the SLO. The CI is [lowest
passing rate (0 for a rep with none), highest failing rate (None if a rep never failed)] over reps: it contains
every rep's threshold, so by the order-statistic argument it covers the median threshold of the rep population with
probability >= 1 - 2^(1-R) (R=5: 93.75%), with no assumption on its distribution. Rates are rounded to 6 significant
digits, so a rate read back from a JSONL cache is the same key and a resumed search (`known`) takes the same path
and measures nothing twice.
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from pdlib.errors import InputError, is_finite

NS_PER_MS = 1e6
MIN_PRECISION = 1e-4  # a search's relative width: the rate grid has 6 significant digits


# ---- requests -------------------------------------------------------------------------------------------------


def request_records(workload, *, admitted: list, emits: list, ids: list, lost: list | None = None) -> list[dict]:
    """A run's per-request records (serve.serve_once's and peer.peer_once's, the same shape): `admitted`,
    `emits`, `ids` (and `lost`, a peer's requests that ended short) in the workload's request order."""
    return [
        {
            "name": name,
            "arrival_ns": int(workload.arrival_ns[i]),
            "admitted_ns": admitted[i],
            "prompt_tokens": int(workload.prompt_tokens[i]),
            "output_tokens": int(workload.output_tokens[i]),
            "emit_ns": emits[i],
            "output_ids": ids[i],
            **({"lost": True} if lost and lost[i] else {}),
        }
        for i, name in enumerate(workload.names)
    ]


def _is_int(x) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def check_requests(requests, *, lost_empty: bool = False) -> list[tuple[int, np.ndarray]]:
    """(arrival_ns, emit_ns as int64) per request, or an InputError naming the first bad request; `lost_empty`: a
    lost request may have no emit."""
    if not isinstance(requests, list | tuple) or not requests:
        raise InputError(f"requests must be a non-empty list of {{'arrival_ns', 'emit_ns'}} dicts, got {requests!r}")
    out = []
    for i, r in enumerate(requests):
        if not isinstance(r, dict) or "arrival_ns" not in r or "emit_ns" not in r:
            raise InputError(f"request {i} must be a dict with 'arrival_ns' and 'emit_ns', got {r!r}")
        arrival = r["arrival_ns"]
        if not _is_int(arrival) or arrival < 0:
            raise InputError(f"request {i}: arrival_ns must be an integer >= 0, got {arrival!r}")
        emit = np.asarray(r["emit_ns"])
        emit = emit.astype(np.int64) if emit.ndim == 1 and emit.size == 0 else emit
        if emit.ndim != 1 or (emit.size == 0 and not (lost_empty and r.get("lost"))):
            raise InputError(f"request {i}: emit_ns must be a non-empty list (an unfinished request has no metrics)")
        if emit.dtype.kind not in "iu":  # a float or bool stamp is not an ns count
            raise InputError(f"request {i}: emit_ns must hold integers (ns), got dtype {emit.dtype}")
        emit = emit.astype(np.int64)
        if emit.size and emit[0] < arrival:
            raise InputError(f"request {i}: first emit {int(emit[0])} ns is before its arrival {arrival} ns")
        if np.any(np.diff(emit) < 0):
            k = int(np.argmax(np.diff(emit) < 0))
            raise InputError(f"request {i}: emit_ns not sorted at index {k + 1} ({int(emit[k])} > {int(emit[k + 1])})")
        out.append((int(arrival), emit))
    return out


def request_metrics(requests) -> dict:
    """Per request, in ns: arrival, ttft, e2e, n_out (int64 arrays), tpot (float64, NaN where n_out = 1), gaps
    (a list of int64 arrays, one per request, empty where n_out = 1)."""
    return _metrics(check_requests(requests))


def _metrics(checked: list[tuple[int, np.ndarray]]) -> dict:
    """request_metrics of check_requests' (arrival_ns, emit_ns) pairs, each with an emit."""
    arrival = np.array([a for a, _ in checked], dtype=np.int64)
    first = np.array([e[0] for _, e in checked], dtype=np.int64)
    last = np.array([e[-1] for _, e in checked], dtype=np.int64)
    n_out = np.array([e.size for _, e in checked], dtype=np.int64)
    decode = n_out > 1
    tpot = np.full(n_out.size, np.nan)
    tpot[decode] = (last - first)[decode] / (n_out - 1)[decode]
    return {
        "arrival_ns": arrival,
        "ttft_ns": first - arrival,
        "e2e_ns": last - arrival,
        "n_out": n_out,
        "tpot_ns": tpot,
        "gaps_ns": [np.diff(e) for _, e in checked],
        "last_ns": last,
    }


# ---- SLOs -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slo:
    """Absolute bounds in ms, the same for every system measured. tbt_ms bounds the run's pooled P99 TBT
    (capacity), tpot_ms each request's TPOT (goodput), ttft_ms the run's P90 TTFT (capacity) and each request's
    TTFT (goodput). `name` keys the run summary's attainment field, attain_<name>."""

    ttft_ms: float
    tbt_ms: float
    tpot_ms: float
    name: str

    def __post_init__(self):
        for k in ("ttft_ms", "tbt_ms", "tpot_ms"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (0 < v < math.inf):
                raise InputError(f"Slo {k} must be a positive finite number of ms, got {v!r}")
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InputError(f"Slo name must be an identifier (it names a summary field), got {self.name!r}")


def slos_from_step(decode_ms: float, ttft_ms: float, *, strict: float = 5.0, relaxed: float = 25.0) -> dict:
    """{"strict": Slo, "relaxed": Slo}, scaled to the model as Sarathi-Serve does: both per-token bounds (P99 TBT
    and TPOT) are `strict` (5x) or `relaxed` (25x) times `decode_ms`, one decode step's time without prefill
    interference (the caller states its batch and context). The same number bounds a tail gap (TBT) and a mean
    (TPOT): TPOT forgives a rare stall that TBT does not. ttft_ms is the caller's, the same in both."""
    if isinstance(decode_ms, bool) or not isinstance(decode_ms, int | float) or not (0 < decode_ms < math.inf):
        raise InputError(f"decode_ms must be a positive finite number, got {decode_ms!r}")
    return {
        name: Slo(ttft_ms=ttft_ms, tbt_ms=k * decode_ms, tpot_ms=k * decode_ms, name=name)
        for name, k in (("strict", strict), ("relaxed", relaxed))
    }


def slo_list(slos) -> list[Slo]:
    """The Slo objects of a dict or a sequence, their names distinct (each names a summary field)."""
    out = list(slos.values()) if isinstance(slos, dict) else list(slos)
    if not all(isinstance(s, Slo) for s in out):
        raise InputError(f"slos must be Slo objects, got {out!r}")
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise InputError(f"slo names must differ (each names a summary field), got {names}")
    return out


def attainment(m: dict, slo: Slo) -> np.ndarray:
    """Per request (of request_metrics' `m`): whether it meets both the TTFT and the TPOT bound (a bound is met
    at equality; a one-token request meets any TPOT bound)."""
    ttft_ok = m["ttft_ns"] <= slo.ttft_ms * NS_PER_MS
    tpot_ok = m["n_out"] == 1
    tpot_ok[~tpot_ok] = m["tpot_ns"][~tpot_ok] <= slo.tpot_ms * NS_PER_MS
    return ttft_ok & tpot_ok


# ---- per run --------------------------------------------------------------------------------------------------


def _pct_ms(values_ns: np.ndarray, qs) -> list[float]:
    if values_ns.size == 0:
        return [math.nan] * len(qs)
    return [float(v) / NS_PER_MS for v in np.percentile(values_ns, qs)]


def run_summary(requests, slos: Iterable[Slo] | dict = ()) -> dict:
    """One run's metrics as a flat dict of numbers (ms unless named otherwise; NaN where undefined): TTFT
    p50/p90/p99, TBT pooled p50/p99/p99.9/max, TBT per request (the median over requests of each one's p50, p99,
    p99.9 and max gap, and the p90 of each one's p99), TPOT p50/p90, E2E p50/p90, throughput in output tokens/s over
    first arrival to last emit (all over the requests that emitted), n_lost (the requests marked lost), and per
    Slo attain_<name>: the share of all the run's requests meeting its TTFT and TPOT, a lost one none."""
    checked = check_requests(requests, lost_empty=True)
    lost = np.array([bool(r.get("lost")) for r in requests])
    emitted = [(a, e) for a, e in checked if e.size]
    if not emitted:  # every request lost before its first token: no latency to show, no SLO met
        out = {k: math.nan for k in run_summary([{"arrival_ns": 0, "emit_ns": [1]}])}
        out |= {"n_requests": len(requests), "n_lost": len(requests), "n_output_tokens": 0, "n_gaps": 0}
        return out | {f"attain_{slo.name}": 0.0 for slo in slo_list(slos)}
    m = _metrics(emitted)
    gaps = [g for g in m["gaps_ns"] if g.size]
    pooled = np.concatenate(gaps) if gaps else np.zeros(0, dtype=np.int64)
    own_p50, own_p99, own_p999 = (np.array([np.percentile(g, q) for g in gaps]) for q in (50, 99, 99.9))
    own_max = np.array([g.max() for g in gaps], dtype=np.int64)
    tpot = m["tpot_ns"][~np.isnan(m["tpot_ns"])]
    ttft = _pct_ms(m["ttft_ns"], [50, 90, 99])
    tbt = _pct_ms(pooled, [50, 99, 99.9, 100])
    req_p99 = _pct_ms(own_p99, [50, 90])
    span_ns = int(m["last_ns"].max() - m["arrival_ns"].min())
    n_tokens = int(m["n_out"].sum())
    out = {
        "n_requests": len(requests),
        "n_lost": int(lost.sum()),
        "n_output_tokens": n_tokens,
        "n_gaps": int(pooled.size),
        "span_ms": span_ns / NS_PER_MS,
        "ttft_p50_ms": ttft[0],
        "ttft_p90_ms": ttft[1],
        "ttft_p99_ms": ttft[2],
        "tbt_p50_ms": tbt[0],
        "tbt_p99_ms": tbt[1],
        "tbt_p999_ms": tbt[2],
        "tbt_max_ms": tbt[3],
        "tbt_req_p50_p50_ms": _pct_ms(own_p50, [50])[0],
        "tbt_req_p99_p50_ms": req_p99[0],
        "tbt_req_p99_p90_ms": req_p99[1],
        "tbt_req_p999_p50_ms": _pct_ms(own_p999, [50])[0],
        "tbt_req_max_p50_ms": _pct_ms(own_max, [50])[0],
        "tpot_p50_ms": _pct_ms(tpot, [50])[0],
        "tpot_p90_ms": _pct_ms(tpot, [90])[0],
        "e2e_p50_ms": _pct_ms(m["e2e_ns"], [50])[0],
        "e2e_p90_ms": _pct_ms(m["e2e_ns"], [90])[0],
        "throughput_tok_s": n_tokens / (span_ns / 1e9) if span_ns else math.nan,
    }
    met = ~lost[[e.size > 0 for _, e in checked]]  # the emitted requests not lost, each in emitted's order
    for slo in slo_list(slos):
        out[f"attain_{slo.name}"] = float((attainment(m, slo) & met).sum() / len(requests))
    return out


# ---- criteria -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Criterion:
    """What one run's summary must meet: every `at_most` field <= its bound and every `at_least` field >= its
    bound. A NaN field meets no bound: a run without the quantity cannot show it met it."""

    name: str
    at_most: dict = field(default_factory=dict)
    at_least: dict = field(default_factory=dict)

    def metric(self, summary: dict) -> dict:
        """The summary's fields this criterion reads (recorded with every measured point)."""
        missing = [k for k in (*self.at_most, *self.at_least) if k not in summary]
        if missing:
            raise KeyError(f"{self.name}: the run summary has no {missing} (attain_<name> needs the Slo passed)")
        return {k: summary[k] for k in (*self.at_most, *self.at_least)}

    def __call__(self, summary: dict) -> bool:
        v = self.metric(summary)
        return all(meets_bound(v[k], b, "at_most") for k, b in self.at_most.items()) and all(
            meets_bound(v[k], b, "at_least") for k, b in self.at_least.items()
        )


def meets_bound(value, bound: float, side: str) -> bool:
    """Whether a summary's value meets an `at_most` or `at_least` bound (met at equality); NaN and None (a log's
    null) meet none."""
    return value is not None and (value <= bound if side == "at_most" else value >= bound)


def capacity_criterion(slo: Slo) -> Criterion:
    """Sarathi-Serve's capacity: pooled P99 TBT and P90 TTFT within the SLO, and no request lost (the latencies
    are the emitted requests': a run that drops some must not pass on the rest)."""
    return Criterion(
        f"capacity_{slo.name}", at_most={"tbt_p99_ms": slo.tbt_ms, "ttft_p90_ms": slo.ttft_ms, "n_lost": 0}
    )


def goodput_criterion(slo: Slo, share: float = 0.9) -> Criterion:
    """DistServe's goodput: at least `share` of the requests meet both the TTFT and the TPOT bound (the summary
    must have been made with this Slo)."""
    if not 0 < share <= 1:
        raise InputError(f"share must be in (0, 1], got {share!r}")
    return Criterion(f"goodput_{slo.name}", at_least={f"attain_{slo.name}": share})


# ---- the rate search ------------------------------------------------------------------------------------------


def interval_text(ci, fmt: str = ".4g") -> str:
    """[low, high] as text, an end that is None "unbounded"."""
    return "[" + ", ".join("unbounded" if v is None else format(v, fmt) for v in ci) + "]"


def ci_text(ci, level: float | None, *, fmt: str = ".4g") -> str:
    """An interval with its coverage, floored to a whole percent (9 reps: 99.6%, not 100%): "50% CI [low, high]";
    "range [low, high]" where it claims none (one rep, or a ratio of two 50% CIs); "CI [...]" where the level is not
    known (a result from before levels were kept)."""
    if level is None:
        return f"CI {interval_text(ci, fmt)}"
    return f"{math.floor(level * 100)}% CI {interval_text(ci, fmt)}" if level > 0 else f"range {interval_text(ci, fmt)}"


def grid_rate(rate: float) -> float:
    """A rate as the search measures and keys it: 6 significant digits, so it survives a JSON round trip as text."""
    return float(f"{rate:.6g}")


def start_rate(lo: float, hi: float, start: float | None) -> float:
    """Where a search over [lo, hi] starts: `start`, or the geometric mean of lo and hi, on the rate grid."""
    return grid_rate(math.sqrt(grid_rate(lo) * grid_rate(hi)) if start is None else start)


def known_from_records(records: Iterable[dict]) -> dict:
    """A `known` cache for search from stored rows {"rate", "rep", "summary"} (e.g. read back from a JSONL)."""
    return {(grid_rate(r["rate"]), int(r["rep"])): r["summary"] for r in records}


def _one_rep(passes, rep: int, lows: tuple, hi: float, start: float, precision: float, budget: int, near: bool) -> dict:
    """One rep's bracketing and bisection: its highest passing rate (`lo`) and lowest failing one (`hi`). `lows`:
    (lo, floor), halving clamped at lo first and then at floor. `near` (a start where the value was found before):
    the bracket's first step is 1 + precision, each next one its square, up to doubling."""
    lo, floor = lows
    n, ok, bad = 0, None, None
    # under 1 + precision by more than the grid's rounding (5e-6 at most): the first bracket is within precision
    factor = (1 + precision) * (1 - 1e-5) if near else 2.0

    def stride() -> float:
        nonlocal factor
        f, factor = factor, min(factor * factor, 2.0)
        return f

    def step(x):
        nonlocal n
        n += 1
        return passes(x, rep)

    def done(status):
        return {"rep": rep, "status": status, "lo": ok, "hi": bad, "measurements": n}

    x = start
    if step(x):
        ok = x
        while ok < hi:  # doubling up to hi
            if n >= budget:
                return done("budget")
            x = grid_rate(min(x * stride(), hi))
            if not step(x):
                bad = x
                break
            ok = x
        else:
            return done("all_pass")
    else:
        bad = x
        while bad > floor:  # halving down to lo, then on to floor
            if n >= budget:
                return done("budget")
            x = grid_rate(max(x / stride(), lo if bad > lo else floor))
            if step(x):
                ok = x
                break
            bad = x
        else:
            return done("none_pass")
    while bad > ok * (1 + precision):
        if n >= budget:
            return done("budget")
        x = grid_rate(math.sqrt(ok * bad))
        if not ok < x < bad:  # the grid has no rate left between them
            break
        if step(x):
            ok = x
        else:
            bad = x
    return done("bracketed")


_STATUS = {"bracketed": "found", "none_pass": "none", "all_pass": "at_least", "budget": "budget"}


def search(
    measure: Callable[[float, int], dict],
    *,
    meets: Callable[[dict], bool],
    lo: float,
    hi: float,
    reps: int = 5,
    start: float | list | None = None,
    precision: float = 0.05,
    max_per_rep: int = 16,
    known: dict | None = None,
    floor: float | None = None,
    near: bool = False,
) -> dict:
    """The highest rate multiplier in [lo, hi] at which `meets(measure(rate, rep))` holds, with a CI (the module
    docstring says how). `known` maps (rate, rep) to summaries already measured; each new one is added to it,
    so a search resumed with it (or with known_from_records of the caller's log) measures nothing twice, and a
    capacity and a goodput search over the same workload share their measurements. `start` (in [floor, hi], or
    one per rep; default the geometric mean of lo and hi) is where each rep begins; `near`: it is where another
    search found each rep's value (module docstring). `max_per_rep` caps one rep's measurements (cache hits count,
    so a resumed search follows the same path). `floor` (<= lo; None: lo): where halving stops (module docstring).

    Returns: value (the rate; 0.0 when none passes), value_rep (the rep it is from), status ("found", "none": not
    even lo passes, "at_least": hi passes, "budget": max_per_rep ran out), text, ci [low, high] (high None when
    unbounded), ci_level, per-rep results, every point {rate, rep, metric, pass} in search order, measured (new
    measure calls), reused (cache hits) and not_monotone (mark_not_monotone: known points contradicting a rep's bracket,
    also named in `text`)."""
    for k, v in (("lo", lo), ("hi", hi)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not (0 < v < math.inf):
            raise InputError(f"{k} must be a positive finite rate, got {v!r}")
    lo, hi = grid_rate(lo), grid_rate(hi)
    if hi < lo:
        raise InputError(f"hi ({hi:g}) must be >= lo ({lo:g})")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 < floor <= lo):
        raise InputError(f"floor must be a rate in (0, lo = {lo:g}], got {floor!r}")
    floor = lo if floor is None else grid_rate(floor)
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise InputError(f"reps must be an integer >= 1, got {reps!r}")
    if isinstance(start, list | tuple) and len(start) != reps:
        raise InputError(f"start: one rate per rep ({reps}), got {len(start)}")
    given = start if isinstance(start, list | tuple) else [start] * reps
    if not all(x is None or is_finite(x) for x in given):
        raise InputError(f"start must be a rate or one per rep, got {start!r}")
    starts = [start_rate(lo, hi, x) for x in given]
    for x in starts:
        if not floor <= x <= hi:
            raise InputError(f"start ({x:g}) must lie in [floor, hi] = [{floor:g}, {hi:g}]")
    if not isinstance(max_per_rep, int) or isinstance(max_per_rep, bool) or max_per_rep < 1:
        raise InputError(f"max_per_rep must be an integer >= 1, got {max_per_rep!r}")
    if not MIN_PRECISION <= precision < math.inf:
        raise InputError(f"precision must be a relative width of at least {MIN_PRECISION:g}, got {precision!r}")
    known = {} if known is None else known
    metric = getattr(meets, "metric", lambda s: None)
    points, counts = [], {"measured": 0, "reused": 0}

    def passes(rate, rep):
        key = (rate, rep)
        if key in known:
            counts["reused"] += 1
        else:
            known[key] = measure(rate, rep)
            counts["measured"] += 1
        ok = bool(meets(known[key]))
        points.append({"rate": rate, "rep": rep, "metric": metric(known[key]), "pass": ok})
        return ok

    per = [_one_rep(passes, r, (lo, floor), hi, starts[r], precision, max_per_rep, near) for r in range(reps)]
    est = [p["lo"] or 0.0 for p in per]  # a rep with no passing rate has capacity 0
    mid = per[sorted(range(reps), key=lambda r: est[r])[(reps - 1) // 2]]  # the lower median: a measured rate
    value, status = est[mid["rep"]], _STATUS[mid["status"]]
    uppers = [p["hi"] for p in per]
    text = {
        "found": f"{value:.4g}",
        "none": f"none (fails at {floor:g})",
        "at_least": f">= {hi:g}",
        "budget": f"{value:.4g} (search budget spent)",
    }[status]
    result = {
        "criterion": getattr(meets, "name", None),
        "value": value,
        "value_rep": mid["rep"],
        "status": status,
        "text": text,
        "ci": [min(est), None if None in uppers else max(uppers)],
        "ci_level": 1 - 2.0 ** (1 - reps),
        "lo": lo,
        "hi": hi,
        "floor": floor,
        "start": starts[0] if len(set(starts)) == 1 else starts,
        "near": near,
        "precision": precision,
        "reps": per,
        "points": points,
        "measured": counts["measured"],
        "reused": counts["reused"],
    }
    return mark_not_monotone(result, known, meets)


_BENT = " (not monotone:"


def mark_not_monotone(result: dict, known: dict, meets) -> dict:
    """`result` (search's) with not_monotone: the points in `known` that contradict a rep's bracket, a pass above its
    lowest failing rate or a fail below its highest passing one, {rep, fails_at, passes_at} each (fails_at below
    passes_at: the rep is not monotone in the rate there, so its value depends on where the search began), the first
    named in its text. Searches sharing a cache call it again on each once all have run, so a point a later one
    measured is seen as a re-composition from the log sees it. A fail of any cause counts (out of memory too: the
    path decides that as well). A summary without the criterion's fields is not judged."""
    out, points = [], sorted(known.items())
    for p in result["reps"]:
        for (rate, rep), summary in points:
            above = p["hi"] is not None and rate > p["hi"]
            below = p["lo"] is not None and rate < p["lo"]
            if rep != p["rep"] or not (above or below):
                continue
            try:
                ok = bool(meets(summary))
            except KeyError:
                continue
            if above and ok:
                out.append({"rep": rep, "fails_at": p["hi"], "passes_at": rate})
            elif below and not ok:
                out.append({"rep": rep, "fails_at": rate, "passes_at": p["lo"]})
    text = result["text"].split(_BENT)[0]
    if out:
        first = out[0]
        text += f"{_BENT} rep {first['rep']} passes at {first['passes_at']:g} above a fail at {first['fails_at']:g})"
    return result | {"not_monotone": out, "text": text}

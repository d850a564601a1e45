"""A serving run's metrics against hand-computed values, and the capacity/goodput search on synthetic runs with
a known threshold: found within its precision, resumed without re-measuring, none-pass and all-pass reported,
and its CI covering the true threshold about as often as it claims."""

import json
import math

import numpy as np
import pytest

from pdlib.errors import InputError
from pdlib.report.serving import (
    Criterion,
    Slo,
    attainment,
    capacity_criterion,
    ci_text,
    goodput_criterion,
    known_from_records,
    mark_not_monotone,
    request_metrics,
    run_summary,
    search,
    slos_from_step,
)

MS = 1_000_000  # ns

# Request 0 arrives at 100 ms and emits at 300, 350, 450, 600 ms: TTFT 200, gaps 50/100/150, TPOT 300/3 = 100,
# E2E 500. Request 1 arrives at 200 ms and emits once at 1000 ms: TTFT 800, no gap, no TPOT, E2E 800.
TWO = [
    {"arrival_ns": 100 * MS, "emit_ns": [300 * MS, 350 * MS, 450 * MS, 600 * MS]},
    {"arrival_ns": 200 * MS, "emit_ns": [1000 * MS]},
]


def test_per_request_metrics_are_the_hand_computed_ns():
    m = request_metrics(TWO)
    assert m["ttft_ns"].tolist() == [200 * MS, 800 * MS]
    assert m["e2e_ns"].tolist() == [500 * MS, 800 * MS]
    assert m["n_out"].tolist() == [4, 1]
    assert m["tpot_ns"][0] == 100 * MS and math.isnan(m["tpot_ns"][1])
    assert [g.tolist() for g in m["gaps_ns"]] == [[50 * MS, 100 * MS, 150 * MS], []]


def test_run_summary_is_the_hand_computed_percentiles():
    s = run_summary(TWO)
    # linear interpolation: p(q) of sorted x = x[i] + f (x[i+1] - x[i]), i + f = q/100 (n - 1)
    expected = {
        "n_requests": 2,
        "n_lost": 0,
        "n_output_tokens": 5,
        "n_gaps": 3,
        "span_ms": 900.0,  # 1000 (last emit) - 100 (first arrival)
        "ttft_p50_ms": 500.0,  # 200, 800
        "ttft_p90_ms": 740.0,  # 200 + 0.9 * 600
        "ttft_p99_ms": 794.0,
        "tbt_p50_ms": 100.0,  # 50, 100, 150
        "tbt_p99_ms": 149.0,  # index 1.98: 100 + 0.98 * 50
        "tbt_p999_ms": 149.9,
        "tbt_max_ms": 150.0,
        "tbt_req_p50_p50_ms": 100.0,  # one request with gaps
        "tbt_req_p99_p50_ms": 149.0,
        "tbt_req_p99_p90_ms": 149.0,
        "tbt_req_p999_p50_ms": 149.9,
        "tbt_req_max_p50_ms": 150.0,
        "tpot_p50_ms": 100.0,  # request 1 has no TPOT
        "tpot_p90_ms": 100.0,
        "e2e_p50_ms": 650.0,  # 500, 800
        "e2e_p90_ms": 770.0,
        "throughput_tok_s": 5 / 0.9,
    }
    assert set(s) == set(expected)
    for k, v in expected.items():
        assert s[k] == pytest.approx(v, rel=1e-12, abs=0), k


def test_a_run_of_one_token_requests_has_no_tbt_or_tpot():
    s = run_summary([{"arrival_ns": 0, "emit_ns": [5 * MS]}, {"arrival_ns": MS, "emit_ns": [9 * MS]}])
    assert s["n_gaps"] == 0
    for k in ("tbt_p99_ms", "tbt_max_ms", "tbt_req_p99_p50_ms", "tpot_p50_ms"):
        assert math.isnan(s[k]), k
    assert s["ttft_p50_ms"] == 6.5  # 5, 8
    # a NaN fails the capacity bound rather than passing it
    assert not capacity_criterion(Slo(1000, 1000, 1000, "x"))(s)


def _req(arrival_ms, gaps_ms, ttft_ms=1):
    emits = np.cumsum([arrival_ms + ttft_ms, *gaps_ms]) * MS
    return {"arrival_ns": arrival_ms * MS, "emit_ns": [int(e) for e in emits]}


def _pct(x, q):
    """numpy's linear percentile, written out: the tests' independent reference."""
    x = sorted(x)
    pos = q / 100 * (len(x) - 1)
    i = int(pos)
    return x[i] if i + 1 == len(x) else x[i] + (pos - i) * (x[i + 1] - x[i])


def test_pooled_and_per_request_tbt_differ_where_they_should():
    # one stall in each of 9 short requests: 9 of 1018 gaps (< 1%) vanish from the pooled p99, but each short
    # request's own p99 is near its stall, so the median over requests shows it
    spread = [_req(0, [10] * 1000)] + [_req(k, [10, 1000]) for k in range(9)]
    s = run_summary(spread)
    pooled = [10] * 1000 + [10, 1000] * 9
    assert s["tbt_p99_ms"] == pytest.approx(_pct(pooled, 99)) and s["tbt_p99_ms"] == 10
    assert s["tbt_p999_ms"] == 1000 and s["tbt_max_ms"] == 1000
    assert s["tbt_req_p99_p50_ms"] == pytest.approx(10 + 0.99 * 990)  # 990.1: nine of ten requests
    assert s["tbt_req_max_p50_ms"] == 1000
    # the converse: 20 stalls all in the long request fill the pooled p99, while the typical request has none
    packed = [_req(0, [10] * 980 + [1000] * 20)] + [_req(k, [10, 10]) for k in range(9)]
    s = run_summary(packed)
    assert s["tbt_p99_ms"] == 1000 == pytest.approx(_pct([10] * 980 + [1000] * 20 + [10] * 18, 99))
    assert s["tbt_req_p99_p50_ms"] == 10 and s["tbt_req_p99_p90_ms"] == pytest.approx(_pct([1000] + [10] * 9, 90))


def test_slo_attainment_counts_requests_meeting_both_bounds():
    m = request_metrics(TWO)  # request 0: TTFT 200, TPOT 100; request 1: TTFT 800, one token
    assert attainment(m, Slo(300, 1, 100, "a")).tolist() == [True, False]  # TPOT at its bound meets it
    assert attainment(m, Slo(800, 1, 100, "b")).tolist() == [True, True]  # one token meets any TPOT bound
    assert attainment(m, Slo(800, 1, 99.999, "c")).tolist() == [False, True]
    assert attainment(m, Slo(199.999, 1e9, 1e9, "d")).tolist() == [False, False]
    s = run_summary(TWO, [Slo(300, 1, 100, "a"), Slo(800, 1, 99.999, "c"), Slo(800, 1, 100, "b")])
    assert (s["attain_a"], s["attain_b"], s["attain_c"]) == (0.5, 1.0, 0.5)
    # 7 of 10 requests with TTFT <= 50 ms and TPOT <= 20 ms
    reqs = [_req(0, [20, 20], ttft_ms=50)] * 7  # TTFT and TPOT at their bounds
    reqs += [_req(0, [20, 21], ttft_ms=50), _req(0, [20], ttft_ms=51), _req(0, [5, 5], ttft_ms=60)]
    assert run_summary(reqs, {"s": Slo(50, 1, 20, "s")})["attain_s"] == 0.7


def test_slos_scale_with_the_decode_step():
    slos = slos_from_step(decode_ms=8.0, ttft_ms=1500.0)
    assert slos["strict"] == Slo(ttft_ms=1500.0, tbt_ms=40.0, tpot_ms=40.0, name="strict")
    assert slos["relaxed"] == Slo(ttft_ms=1500.0, tbt_ms=200.0, tpot_ms=200.0, name="relaxed")
    s = run_summary(TWO, slos)
    assert "attain_strict" in s and "attain_relaxed" in s
    with pytest.raises(InputError):
        slos_from_step(decode_ms=0, ttft_ms=1.0)
    with pytest.raises(InputError):
        Slo(-1, 1, 1, "x")
    with pytest.raises(InputError):
        Slo(1, 1, 1, "not a name")
    with pytest.raises(InputError, match="differ"):
        run_summary(TWO, [Slo(1, 1, 1, "x"), Slo(2, 2, 2, "x")])


@pytest.mark.parametrize(
    "bad, match",
    [
        ([], "non-empty"),
        ([{"arrival_ns": 0}], "emit_ns"),
        ([{"arrival_ns": 0, "emit_ns": []}], "non-empty"),
        ([{"arrival_ns": 0, "emit_ns": [5, 3]}], "not sorted at index 1"),
        ([{"arrival_ns": 10, "emit_ns": [5, 30]}], "before its arrival"),
        ([{"arrival_ns": 0, "emit_ns": [1.5, 3.0]}], "integers"),
        ([{"arrival_ns": True, "emit_ns": [3]}], "arrival_ns"),
        ([{"arrival_ns": -1, "emit_ns": [3]}], "arrival_ns"),
    ],
)
def test_bad_requests_are_refused(bad, match):
    with pytest.raises(InputError, match=match):
        run_summary(bad)
    assert issubclass(InputError, ValueError)


def test_a_lost_request_counts_in_the_run_and_meets_no_slo():
    slo = Slo(300, 1e9, 100, "a")  # TWO's request 0 meets it, request 1 (TTFT 800) does not
    good = goodput_criterion(slo, share=0.5)
    assert run_summary(TWO, [slo])["attain_a"] == 0.5 and good(run_summary(TWO, [slo]))
    # a third request lost before its first token: in the share's denominator, not in the latencies
    gone = {"arrival_ns": 0, "emit_ns": [], "lost": True}
    s = run_summary([*TWO, gone], [slo])
    assert (s["n_requests"], s["n_lost"], s["attain_a"]) == (3, 1, 1 / 3) and not good(s)
    assert s["ttft_p50_ms"] == run_summary(TWO)["ttft_p50_ms"] and s["n_output_tokens"] == 5
    # lost after emitting: its latencies count, it meets no SLO, and no run that lost one has a capacity
    short = dict(TWO[0], lost=True)
    s = run_summary([short, TWO[1]], [slo])
    assert (s["n_lost"], s["attain_a"], s["tbt_max_ms"]) == (1, 0.0, 150.0)
    cap = capacity_criterion(Slo(1e9, 1e9, 1e9, "loose"))
    assert cap(run_summary(TWO)) and not cap(run_summary([short, TWO[1]]))
    # every request lost before a token: no latency, no SLO met, no traceback
    s = run_summary([gone, dict(gone, arrival_ns=5)], [slo])
    assert (s["n_requests"], s["n_lost"], s["attain_a"], s["n_output_tokens"]) == (2, 2, 0.0, 0)
    assert math.isnan(s["ttft_p90_ms"]) and math.isnan(s["tbt_p99_ms"]) and not cap(s)
    assert set(s) == set(run_summary(TWO, [slo]))
    # only a request marked lost may have no emit (any true mark, as the report's checks read it)
    assert run_summary([TWO[0], dict(gone, lost=1)])["n_lost"] == 1
    with pytest.raises(InputError, match="non-empty"):
        run_summary([TWO[0], dict(gone, lost=False)])
    # a log's null meets no bound, as NaN does
    assert not cap({**run_summary(TWO), "tbt_p99_ms": None})


def test_equal_stamps_and_a_first_emit_at_arrival_are_accepted():
    s = run_summary([{"arrival_ns": 7, "emit_ns": [7, 9, 9]}])
    assert (s["ttft_p50_ms"], s["tbt_max_ms"], s["tpot_p50_ms"]) == (0.0, 2 / MS, 1 / MS)


def test_criteria_meet_at_the_bound_and_need_their_fields():
    slo = Slo(100, 10, 10, "strict")
    cap = capacity_criterion(slo)
    assert cap({"tbt_p99_ms": 10.0, "ttft_p90_ms": 100.0, "n_lost": 0})
    assert not cap({"tbt_p99_ms": 10.001, "ttft_p90_ms": 100.0, "n_lost": 0})
    assert not cap({"tbt_p99_ms": 10.0, "ttft_p90_ms": 100.001, "n_lost": 0})
    assert not cap({"tbt_p99_ms": 10.0, "ttft_p90_ms": 100.0, "n_lost": 1})
    with pytest.raises(KeyError, match="n_lost"):
        cap({"tbt_p99_ms": 10.0, "ttft_p90_ms": 100.0})  # a summary from before lost requests were counted
    good = goodput_criterion(slo)
    assert good({"attain_strict": 0.9}) and not good({"attain_strict": 0.8999})
    with pytest.raises(KeyError, match="attain_strict"):
        good(run_summary(TWO))  # made without the Slo


# ---- the search -----------------------------------------------------------------------------------------------


class Synthetic:
    """p99 TBT = rate ms times a per-rep factor (a rep is one workload sample) and optional per-point jitter;
    with SLO 5 ms, rep r's threshold is 5 / factor[r] and the population's median threshold 5 (median factor 1).
    Counts its measurements."""

    def __init__(self, seed=0, sigma=0.0, jitter=0.0):
        self.factor = np.exp(sigma * np.random.default_rng(seed).standard_normal(64))
        self.seed, self.jitter, self.calls = seed, jitter, []

    def __call__(self, rate, rep):
        self.calls.append((rate, rep))
        j = np.exp(self.jitter * np.random.default_rng([self.seed, rep, int(rate * 1e6)]).standard_normal())
        return {"tbt_p99_ms": rate * self.factor[rep] * j, "ttft_p90_ms": 1.0, "n_lost": 0}


SLO5 = Slo(ttft_ms=10.0, tbt_ms=5.0, tpot_ms=5.0, name="strict")


def test_search_finds_a_noiseless_threshold_within_its_precision():
    f = Synthetic()
    r = search(f, meets=capacity_criterion(SLO5), lo=1, hi=64, reps=1, precision=0.05)
    assert r["status"] == "found" and r["criterion"] == "capacity_strict"
    rep = r["reps"][0]
    assert rep["lo"] <= 5 < rep["hi"] <= rep["lo"] * 1.05
    assert r["value"] == rep["lo"] and r["ci"] == [rep["lo"], rep["hi"]]
    # the path: start at sqrt(64) = 8 fails, halve to 4 passes, then bisect geometrically
    assert [p["rate"] for p in r["points"][:2]] == [8.0, 4.0]
    assert r["points"][2]["rate"] == pytest.approx(math.sqrt(32), rel=1e-6)
    for p in r["points"]:
        assert p["pass"] == (p["rate"] <= 5) and p["metric"] == {
            "tbt_p99_ms": p["rate"],
            "ttft_p90_ms": 1.0,
            "n_lost": 0,
        }
    assert r["measured"] == len(f.calls) == len(r["points"]) == rep["measurements"] and r["reused"] == 0


def test_a_pass_known_above_a_reps_failing_rate_is_named():
    def bent(rate, rep):  # passes up to 2, fails at 4, passes again from 6: not monotone in the rate
        return {"tbt_p99_ms": 1.0 if rate <= 2 or rate >= 6 else 9.0, "ttft_p90_ms": 1.0, "n_lost": 0}

    crit = capacity_criterion(SLO5)
    plain = search(bent, meets=crit, lo=1, hi=16, reps=1, start=1, precision=0.5)
    assert plain["value"] == 2.0 and plain["not_monotone"] == [] and plain["text"] == "2"
    known: dict = {}
    search(bent, meets=crit, lo=1, hi=16, reps=1, start=8, precision=0.5, known=known)  # passes at 8 and 16
    r = search(bent, meets=crit, lo=1, hi=16, reps=1, start=1, precision=0.5, known=known)
    assert r["value"] == 2.0 and r["reps"][0]["hi"] < 8
    assert {(b["passes_at"], b["rep"]) for b in r["not_monotone"]} == {(8.0, 0), (16.0, 0)}
    assert r["text"].startswith(f"2 (not monotone: rep 0 passes at 8 above a fail at {r['reps'][0]['hi']:g})")
    # a later search over the same cache measures the pass: marking the earlier result again names it
    early: dict = {}
    first = search(bent, meets=crit, lo=1, hi=16, reps=1, start=1, precision=0.5, known=early)
    search(bent, meets=crit, lo=1, hi=16, reps=1, start=8, precision=0.5, known=early)
    assert first["not_monotone"] == [] and mark_not_monotone(first, early, crit)["text"] == r["text"]
    assert mark_not_monotone(mark_not_monotone(first, early, crit), early, crit)["text"] == r["text"]  # said once
    assert ci_text([1.0, 2.0], 1 - 2.0**-8) == "99% CI [1, 2]" and ci_text([1.0, None], 0.0) == "range [1, unbounded]"
    # a summary without the criterion's fields (another criterion's fake) is not judged
    other = search(bent, meets=crit, lo=1, hi=16, reps=1, start=1, known={(16.0, 0): {"attain_strict": 1.0}})
    assert other["not_monotone"] == []


def test_a_fail_known_below_a_reps_passing_rate_is_named():
    def bent(rate, rep):  # fails at low rates (a warmup, say), passes from 2 to 4, fails above
        return {"tbt_p99_ms": 1.0 if 2 <= rate <= 4 else 9.0, "ttft_p90_ms": 1.0, "n_lost": 0}

    crit = capacity_criterion(SLO5)
    known: dict = {}
    high = search(bent, meets=crit, lo=0.25, hi=16, reps=1, start=2, precision=0.5, known=known)
    assert high["value"] == 4.0 and high["not_monotone"] == []
    low = search(bent, meets=crit, lo=0.25, hi=16, reps=1, start=0.5, precision=0.5, known=known)
    assert low["reps"][0]["lo"] is None  # failed at 0.5 and 0.25: no passing rate of its own
    # the low search's fails lie below the high one's pass, and the high one's passes above the low one's fail
    again = mark_not_monotone(high, known, crit)
    assert [(b["fails_at"], b["passes_at"]) for b in again["not_monotone"]] == [(0.25, 4.0), (0.5, 4.0)]
    assert again["text"] == "4 (not monotone: rep 0 passes at 4 above a fail at 0.25)"
    assert {(b["fails_at"], b["passes_at"]) for b in low["not_monotone"]} == {(0.25, 2.0), (0.25, 4.0)}
    # a fail above the pass, a pass below it, or either inside the bracket (4, 5.66) is monotone: nothing named
    plain = {(8.0, 0): bent(8.0, 0), (3.0, 0): bent(3.0, 0), (5.0, 0): bent(5.0, 0), (2.0, 1): bent(0.5, 0)}
    assert high["reps"][0]["hi"] > 5.0 and mark_not_monotone(high, plain, crit)["not_monotone"] == []
    # a rep passing up to hi (no failing rate of its own) still has its fails below named
    top = search(lambda rate, rep: bent(min(rate, 3.0), rep), meets=crit, lo=0.25, hi=4, reps=1, start=2)
    assert top["status"] == "at_least" and top["reps"][0]["hi"] is None
    named = mark_not_monotone(top, {(1.0, 0): bent(1.0, 0)}, crit)["not_monotone"]
    assert named == [{"rep": 0, "fails_at": 1.0, "passes_at": 4.0}]


def test_search_reports_the_lower_median_of_per_rep_thresholds():
    f = Synthetic(seed=3, sigma=0.3)
    r = search(f, meets=capacity_criterion(SLO5), lo=0.5, hi=64, reps=5)
    true = sorted(5 / f.factor[:5])
    assert true[2] / 1.05 <= r["value"] <= true[2]  # the median rep's threshold, within precision
    for p, t in zip(r["reps"], 5 / f.factor[:5]):
        assert p["status"] == "bracketed" and p["lo"] <= t < p["hi"] <= p["lo"] * 1.05
    assert r["ci"] == [min(p["lo"] for p in r["reps"]), max(p["hi"] for p in r["reps"])]
    assert r["ci"][0] <= true[0] and true[-1] <= r["ci"][1]
    assert r["ci_level"] == 1 - 2 / 32
    # with four reps the lower median is the second lowest
    r4 = search(Synthetic(seed=3, sigma=0.3), meets=capacity_criterion(SLO5), lo=0.5, hi=64, reps=4)
    assert r4["value"] == sorted(p["lo"] for p in r4["reps"])[1]


def test_the_ci_covers_the_true_threshold_about_as_often_as_it_claims():
    covered, narrow, widths, errors = 0, 0, [], []
    trials = 200
    for seed in range(trials):
        f = Synthetic(seed=seed, sigma=0.25, jitter=0.01)
        r = search(f, meets=capacity_criterion(SLO5), lo=0.3, hi=100, reps=5)
        lo_ci, hi_ci = r["ci"]
        covered += lo_ci <= 5 <= hi_ci
        mid = next(p for p in r["reps"] if p["lo"] == r["value"])
        narrow += mid["lo"] <= 5 <= mid["hi"]  # the median rep's own bracket: too narrow to be a CI
        errors.append(math.log(r["value"] / 5))
        widths.append(hi_ci / lo_ci)
    # claimed >= 93.75%; the median rep's bracket alone covers far less, so the check can tell them apart
    assert covered / trials >= 0.88
    assert narrow / trials < 0.6
    # the point estimate centred on the truth, low by up to the precision (a rep's capacity is its last pass)
    assert -0.1 < np.median(errors) < 0.02
    assert np.median(widths) < 2.5  # not covering by being vacuous


def test_a_resumed_search_measures_nothing_twice():
    crit = capacity_criterion(SLO5)
    whole = Synthetic(seed=1, sigma=0.2)
    full = search(whole, meets=crit, lo=0.5, hi=64, reps=3)
    n = full["measured"]
    assert n == len(whole.calls) == len(set(whole.calls)) > 9

    # a run stopped after 7 measurements, logged as JSONL and read back
    log = []

    class Stopped(Exception):
        pass

    f = Synthetic(seed=1, sigma=0.2)

    def logged(rate, rep):
        if len(f.calls) == 7:
            raise Stopped
        s = f(rate, rep)
        log.append(json.dumps({"rate": rate, "rep": rep, "summary": s}))
        return s

    with pytest.raises(Stopped):
        search(logged, meets=crit, lo=0.5, hi=64, reps=3)
    known = known_from_records(json.loads(line) for line in log)
    assert len(known) == 7
    logged_keys = set(known)
    rest = Synthetic(seed=1, sigma=0.2)
    resumed = search(rest, meets=crit, lo=0.5, hi=64, reps=3, known=known)
    assert resumed["measured"] == n - 7 and resumed["reused"] == 7
    assert set(rest.calls).isdisjoint(logged_keys) and len(known) == n
    assert {k: resumed[k] for k in ("value", "ci", "reps")} == {k: full[k] for k in ("value", "ci", "reps")}
    assert [p["rate"] for p in resumed["points"]] == [p["rate"] for p in full["points"]]
    # once complete, a rerun measures nothing
    again = Synthetic(seed=1, sigma=0.2)
    assert search(again, meets=crit, lo=0.5, hi=64, reps=3, known=known)["measured"] == 0 and not again.calls


def test_none_pass_and_all_pass_are_reported_as_such():
    never, always = Criterion("never", at_most={"tbt_p99_ms": -1.0}), Criterion("always", at_least={"x": 0})
    calls = []

    def measure(rate, rep):
        calls.append(rate)
        return {"tbt_p99_ms": 1.0, "x": 1}

    none = search(measure, meets=never, lo=1, hi=64, start=8, reps=3)
    assert (none["status"], none["value"], none["text"]) == ("none", 0.0, "none (fails at 1)")
    assert none["ci"] == [0.0, 1.0] and [p["rate"] for p in none["points"][:4]] == [8, 4, 2, 1]
    assert none["measured"] == 12 == len(calls)
    every = search(measure, meets=always, lo=1, hi=64, start=8, reps=3)
    assert (every["status"], every["value"], every["text"]) == ("at_least", 64.0, ">= 64")
    assert every["ci"] == [64.0, None] and [p["rate"] for p in every["points"][:4]] == [8, 16, 32, 64]
    # start at an end: one measurement per rep
    assert search(measure, meets=always, lo=1, hi=64, start=64, reps=2)["measured"] == 2


def test_the_budget_stops_a_search_and_says_so():
    r = search(Synthetic(), meets=capacity_criterion(SLO5), lo=1, hi=64, reps=1, max_per_rep=3, precision=0.001)
    assert r["status"] == "budget" and r["measured"] == 3 and r["reps"][0]["lo"] <= 5 < r["reps"][0]["hi"]
    assert "budget" in r["text"]


def test_goodput_search_over_real_summaries_finds_the_90_percent_rate():
    # request i's TTFT grows as rate * (i + 1) ms and its TPOT stays 1 ms: at a TTFT SLO of 100 ms, 9 of 10
    # requests meet it while rate * 9 <= 100, so the goodput rate is 100/9
    slo = Slo(ttft_ms=100, tbt_ms=5, tpot_ms=5, name="strict")

    def measure(rate, rep):
        reqs = [
            {"arrival_ns": 0, "emit_ns": [round(rate * (i + 1) * MS) + k * MS for k in range(3)]} for i in range(10)
        ]
        return run_summary(reqs, [slo])

    r = search(measure, meets=goodput_criterion(slo), lo=0.5, hi=100, reps=1, precision=0.01)
    assert r["status"] == "found" and 100 / 9 / 1.01 <= r["value"] <= 100 / 9
    assert all(p["metric"]["attain_strict"] >= 0.9 for p in r["points"] if p["pass"])
    # capacity over the same cache: P90 TTFT = rate * (9 + 0.1) <= 100, measuring only what is new
    known = {}
    search(measure, meets=goodput_criterion(slo), lo=0.5, hi=100, reps=1, known=known)
    cap = search(measure, meets=capacity_criterion(slo), lo=0.5, hi=100, reps=1, known=known)
    assert cap["reused"] >= 1 and 100 / 9.1 / 1.05 <= cap["value"] <= 100 / 9.1


def test_a_floor_below_lo_finds_a_threshold_under_lo_on_the_same_path_down_to_lo():
    """Rep 0's threshold is 5 / 16 = 0.3125, under lo = 0.5: without a floor it is "none (fails at 0.5)"; with
    floor 0.125 the rep goes on halving to 0.25 (passes) and bisects; every point at or above lo is the one the
    floorless search measured, in the same order, so a log made without a floor still serves."""
    crit = capacity_criterion(SLO5)
    f = Synthetic()
    f.factor[0] = 16.0
    plain = search(f, meets=crit, lo=0.5, hi=64, reps=1, start=2)
    assert plain["status"] == "none" and plain["text"] == "none (fails at 0.5)" and plain["floor"] == 0.5
    g = Synthetic()
    g.factor[0] = 16.0
    deep = search(g, meets=crit, lo=0.5, hi=64, reps=1, start=2, floor=0.125)
    rates = [p["rate"] for p in deep["points"]]
    assert rates[: len(plain["points"])] == [p["rate"] for p in plain["points"]] == [2.0, 1.0, 0.5]
    assert rates[3] == 0.25 and deep["status"] == "found" and deep["floor"] == 0.125
    rep = deep["reps"][0]
    assert rep["lo"] <= 0.3125 < rep["hi"] <= rep["lo"] * 1.05 and deep["value"] == rep["lo"]
    # failing at the floor too: none, named at the floor
    h = Synthetic()
    h.factor[0] = 100.0
    low = search(h, meets=crit, lo=0.5, hi=64, reps=1, start=2, floor=0.125)
    assert low["status"] == "none" and low["text"] == "none (fails at 0.125)"
    assert [p["rate"] for p in low["points"]] == [2.0, 1.0, 0.5, 0.25, 0.125]
    # a start between lo and 2 lo: the step down is clamped at lo first, as without a floor
    k = Synthetic()
    k.factor[0] = 16.0
    odd = search(k, meets=crit, lo=0.5, hi=64, reps=1, start=0.7, floor=0.125)
    assert [p["rate"] for p in odd["points"]][:3] == [0.7, 0.5, 0.25]
    assert search(Synthetic(), meets=crit, lo=1, hi=64, reps=1, floor=1)["floor"] == 1.0
    with pytest.raises(InputError, match="floor must be a rate in"):
        search(Synthetic(), meets=crit, lo=1, hi=64, reps=1, floor=2)
    # a start under lo, as far down as the floor (another search's value, say): it fails there, none at once
    m = Synthetic()
    m.factor[0] = 100.0
    at_floor = search(m, meets=crit, lo=0.5, hi=64, reps=1, start=0.125, floor=0.125)
    assert at_floor["status"] == "none" and [p["rate"] for p in at_floor["points"]] == [0.125]
    assert at_floor["start"] == 0.125
    n = Synthetic()
    n.factor[0] = 16.0  # threshold 0.3125: from 0.25 it doubles, then bisects under lo
    up = search(n, meets=crit, lo=0.5, hi=64, reps=1, start=0.25, floor=0.125)
    assert [p["rate"] for p in up["points"]][:2] == [0.25, 0.5] and up["reps"][0]["lo"] <= 0.3125 < up["reps"][0]["hi"]
    # from each rep's value found before (`near`): a step of 1 + precision brackets it again in two points a rep,
    # where doubling from the same start bisects down from twice it; farther off, the steps grow to doubling
    q = Synthetic(sigma=0.3)
    thresholds = [5 / q.factor[r] for r in range(3)]
    found = search(q, meets=crit, lo=0.5, hi=64, reps=3, precision=0.05)
    again = search(
        Synthetic(sigma=0.3),
        meets=crit,
        lo=0.5,
        hi=64,
        reps=3,
        precision=0.05,
        start=[r["lo"] for r in found["reps"]],
        near=True,
    )
    assert again["measured"] == 6 and again["value"] == found["value"] and again["near"]
    plain = search(
        Synthetic(sigma=0.3), meets=crit, lo=0.5, hi=64, reps=3, precision=0.05, start=[r["lo"] for r in found["reps"]]
    )
    assert plain["measured"] > 9 and plain["value"] == pytest.approx(found["value"], rel=0.05)
    far = search(Synthetic(sigma=0.3), meets=crit, lo=0.5, hi=64, reps=3, precision=0.05, start=0.5, near=True)
    rates = [p["rate"] for p in far["points"] if p["rep"] == 0]
    f = 1.05 * (1 - 1e-5)  # each step the last one squared, from (just under) 1 + precision, up to doubling
    steps = [b / a for a, b in zip(rates, rates[1:5], strict=False)]
    assert rates[0] == 0.5 and steps == pytest.approx([f, f**2, f**4, f**8], rel=1e-5)
    assert rates[5] / rates[4] == pytest.approx(2.0, rel=1e-5)  # f**16 > 2: doubling
    assert all(r["lo"] <= t < r["hi"] for r, t in zip(far["reps"], thresholds, strict=True))
    for precision in (0.01, 0.25):  # the grid's rounding never widens the first step's bracket past precision
        for seed in range(20):
            base = search(Synthetic(seed, sigma=0.5), meets=crit, lo=0.5, hi=64, reps=3, precision=precision)
            starts = [r["lo"] for r in base["reps"]]
            kw = dict(lo=0.5, hi=64, reps=3, precision=precision, start=starts, near=True)
            assert search(Synthetic(seed, sigma=0.5), meets=crit, **kw)["measured"] == 6, (precision, seed)
    with pytest.raises(InputError, match="one rate per rep"):
        search(Synthetic(), meets=crit, lo=0.5, hi=64, reps=2, start=[1.0])
    with pytest.raises(InputError, match="precision must be a relative width of at least 0.0001"):
        search(Synthetic(), meets=crit, lo=0.5, hi=64, reps=1, precision=1e-6, start=2.0, near=True)
    for bad in (["1", 2.0], [True, 2.0], [float("nan"), 2.0]):
        with pytest.raises(InputError, match="start must be a rate or one per rep"):
            search(Synthetic(), meets=crit, lo=0.5, hi=64, reps=2, start=bad)
    with pytest.raises(InputError, match=r"must lie in \[floor, hi\]"):
        search(Synthetic(), meets=crit, lo=0.5, hi=64, reps=1, start=0.1, floor=0.125)


def test_bad_search_arguments_are_refused():
    f, crit = Synthetic(), capacity_criterion(SLO5)
    for kwargs in (
        {"lo": 0, "hi": 1},
        {"lo": 2, "hi": 1},
        {"lo": 1, "hi": 4, "start": 8},
        {"lo": 1, "hi": 4, "reps": 0},
        {"lo": 1, "hi": 4, "precision": 0},
        {"lo": 1, "hi": 4, "max_per_rep": 0},
    ):
        with pytest.raises(InputError):
            search(f, meets=crit, **kwargs)
    assert not f.calls

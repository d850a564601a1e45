"""Where a run loses its latency (pdlib/report/serving_loss.py), on runs built by hand so every number is known,
and what bounds a search: the failing point of its median rep, the bounds it broke and the cause named."""

import math

import pytest

from pdlib.errors import InputError
from pdlib.report.serving import Slo, capacity_criterion, goodput_criterion, search
from pdlib.report.serving_loss import gap_work, limit_text, peaks, run_loss, search_limit, share_below, time_split

MS = 1_000_000
SLO = Slo(ttft_ms=10.0, tbt_ms=5.0, tpot_ms=5.0, name="strict")


def run(prompt_at=12):
    """A decodes from 0 (arrived at 0, prompt 4, 5 tokens); B arrives at 10 ms, its 40-token prompt in one step
    at [prompt_at, prompt_at + 9] ms; its first token at 30 ms, its second at 32 ms. A's gaps: 2, 2, 20, 2 ms,
    the 20-ms one (11 -> 31) holding B's prompt step when it starts inside it."""
    a = [1 * MS, 3 * MS, 11 * MS, 31 * MS, 33 * MS]
    b = [30 * MS, 32 * MS]
    steps = [
        ([["a", 4]], 0, 1 * MS, 0),
        ([["a", None]], 1 * MS, 3 * MS, 1 * MS),
        ([["a", None]], 3 * MS, 11 * MS, 4 * MS),
        ([["b", 40]], prompt_at * MS, (prompt_at + 9) * MS, (prompt_at + 1) * MS),
        ([["a", None], ["b", None]], 29 * MS, 31 * MS, 29 * MS),
        ([["a", None], ["b", None]], 31 * MS, 33 * MS, 31 * MS),
    ]
    work, t0, t1, issued = (list(x) for x in zip(*steps))
    return {
        "policy": "chunked",
        "requests": [
            {"name": "a", "arrival_ns": 0, "emit_ns": a, "prompt_tokens": 4, "output_tokens": 5},
            {"name": "b", "arrival_ns": 10 * MS, "emit_ns": b, "prompt_tokens": 40, "output_tokens": 2},
        ],
        "steps": {"work": work, "t_start_ns": t0, "t_end_ns": t1, "t_issued_ns": issued},
        "idle_ns": 0,
        "makespan_ns": 40 * MS,
    }


def test_time_split_counts_each_kind_once():
    t = time_split(run())
    assert t["prompt_steps"] == 10 * MS  # [0, 1] and [12, 21]
    assert t["decode_steps"] == 2 * MS + 8 * MS + 4 * MS  # [1, 3], [3, 11], [29, 33]
    assert t["busy"] == 24 * MS and t["no_step"] == 16 * MS and t["makespan"] == 40 * MS
    assert t["host"] == 2 * MS and t["waiting"] == 0  # steps 2 and 3 took 1 ms each to issue
    bad = run()
    bad["steps"]["t_issued_ns"][2] = 20 * MS  # after its step's end
    with pytest.raises(InputError, match="t_issued_ns"):
        time_split(bad)


def test_a_gap_holds_the_prompt_steps_that_started_inside_it():
    gaps = {g["name"]: g for g in gap_work(run())}
    assert gaps["a"]["gaps_ns"].tolist() == [2 * MS, 8 * MS, 20 * MS, 2 * MS]
    assert gaps["a"]["prompt_tokens"].tolist() == [0, 0, 40, 0]
    assert gaps["b"]["prompt_steps"].tolist() == [0]
    moved = {g["name"]: g for g in gap_work(run(prompt_at=9))}  # B's prompt now starts in A's 3 -> 11 gap
    assert moved["a"]["prompt_tokens"].tolist() == [0, 40, 0, 0]


def test_run_loss_names_the_stalls_the_waits_and_the_peaks():
    loss = run_loss(run(), [SLO], kv_bytes_per_position=2**20)
    assert loss["prompt_steps_share"] == pytest.approx(10 / 40) and loss["no_step_share"] == pytest.approx(16 / 40)
    assert loss["host_share"] == pytest.approx(2 / 24) and loss["waiting_share"] == 0
    # gaps over 5 ms: A's 8 ms (no prompt inside) and 20 ms (B's prompt inside)
    assert loss["tbt_over_strict"] == 2 and loss["tbt_over_strict_prompt"] == 1
    # B's TTFT 20 ms > 10: 2 ms of it before its prompt step started at 12 ms
    assert loss["ttft_over_strict"] == 1 and loss["ttft_over_strict_wait_share"] == pytest.approx(2 / 20)
    # A's TPOT (33 - 1) / 4 = 8 ms > 5; 20 of its 32 ms of gaps had prompt work inside
    assert loss["tpot_over_strict"] == 1 and loss["tpot_over_strict_prompt_share"] == pytest.approx(20 / 32)
    assert loss["peak_requests"] == 2 and loss["peak_positions"] == 9 + 42
    assert loss["peak_kv_gib"] == pytest.approx(51 / 1024)
    assert loss["cache_waits"] == 0 and loss["ttft_over_strict_memory_share"] == 0
    later = run_loss(run(prompt_at=18), [SLO])  # B queued 8 ms before its prompt: the same gaps, more wait
    assert later["ttft_over_strict_wait_share"] == pytest.approx(8 / 20) and "peak_kv_gib" not in later
    held = run(prompt_at=18)
    held["requests"][1]["cache_wait_ns"] = 5 * MS  # 5 of those 8 ms waiting for a cache
    held = run_loss(held, [SLO])
    assert held["cache_waits"] == 1 and held["ttft_over_strict_memory_share"] == pytest.approx(5 / 20)
    none = run_loss(run(), [Slo(ttft_ms=100.0, tbt_ms=50.0, tpot_ms=50.0, name="relaxed")])
    assert none["tbt_over_relaxed"] == 0 and math.isnan(none["ttft_over_relaxed_wait_share"])


def test_a_request_ending_as_another_arrives_is_not_live_with_it():
    reqs = [
        {"arrival_ns": 5, "emit_ns": [9], "prompt_tokens": 7, "output_tokens": 1},  # listed first: order is time's
        {"arrival_ns": 0, "emit_ns": [5], "prompt_tokens": 3, "output_tokens": 1},
    ]
    assert peaks(reqs) == (1, 8)
    reqs[0]["arrival_ns"] = 4
    assert peaks(reqs) == (2, 12)


def test_a_step_with_no_prompt_tokens_is_not_prompt_work_and_an_unlogged_prompt_is_all_wait():
    r = run()
    r["steps"]["work"][2] = [["a", None], ["b", 0]]  # a part of no prompt tokens inside A's 3 -> 11 gap
    gaps = {g["name"]: g for g in gap_work(r)}
    assert gaps["a"]["prompt_steps"].tolist() == [0, 0, 1, 0]
    assert run_loss(r, [SLO])["ttft_over_strict_wait_share"] == pytest.approx(2 / 20)  # not its first prompt step
    r["steps"]["work"][3] = [["a", None]]  # B's prompt carried by no logged step: its whole TTFT counts as wait
    assert run_loss(r, [SLO])["ttft_over_strict_wait_share"] == 1.0


# ---- what bounds a search ----------------------------------------------------------------------------------


def measured(thresholds: dict):
    """A measure for search: rep r fails above thresholds[r]; every point's record (summary, loss) kept."""
    points = {}

    def measure(rate, rep):
        bad = rate > thresholds[rep]
        summary = {
            "tbt_p99_ms": 9.0 if bad else 1.0,
            "ttft_p90_ms": 3.0,
            "n_lost": 0,
            "attain_strict": 0.5 if bad else 1.0,
        }
        loss = {
            "tbt_over_strict": 10 if bad else 0,
            "tbt_over_strict_prompt": 8,
            "ttft_over_strict": 2,
            "ttft_over_strict_wait_share": 0.9,
            "tpot_over_strict": 0,
            "tpot_over_strict_prompt_share": math.nan,
            "prompt_steps_share": 0.5,
            "decode_steps_share": 0.2,
            "host_share": 0.1,
            "peak_requests": 7,
        }
        points[rate, rep] = {"summary": summary, "loss": loss}
        return summary

    return measure, points


def test_the_limit_is_the_median_reps_lowest_failing_point():
    measure, points = measured({0: 3.0, 1: 5.0, 2: 9.0})
    crit = capacity_criterion(SLO)
    result = search(measure, meets=crit, lo=0.5, hi=64, reps=3, start=2, precision=0.1)
    assert result["value_rep"] == 1  # the lower median of 3, 5 and 9
    lim = search_limit(result, crit, SLO, points)
    rep1 = next(p for p in result["reps"] if p["rep"] == 1)
    assert lim["rate"] == rep1["hi"] > result["value"] and lim["rep"] == 1
    assert lim["failed"] == [{"field": "tbt_p99_ms", "value": 9.0, "bound": 5.0, "side": "at_most"}]
    assert lim["causes"] == ["prefill stalls"]  # 8 of 10 over-bound gaps with prompt work
    text = limit_text(lim)
    assert f"lost at {lim['rate']:.4g} (rep 1)" in text and "8 of 10 gaps" in text and "7 requests at once" in text
    # the same point, its stalls elsewhere: the host or the decode steps; a share of exactly half is named
    cases = [(2, 0.7, "host time"), (2, 0.1, "decode steps"), (5, 0.1, "prefill stalls")]
    for prompt, host, cause in [*cases, (2, math.nan, "decode steps or host time")]:  # nan: a peer's steps
        points[lim["rate"], 1]["loss"].update(tbt_over_strict_prompt=prompt, host_share=host)
        assert search_limit(result, crit, SLO, points)["causes"] == [cause]
    points[lim["rate"], 1]["loss"].update(tbt_over_strict=0, tbt_over_strict_prompt=0)  # a NaN p99: no gap over
    assert search_limit(result, crit, SLO, points)["causes"] == []


def test_a_goodput_limit_names_its_waits_and_a_bound_never_failed_has_none():
    measure, points = measured({0: 4.0})
    crit = goodput_criterion(SLO)
    result = search(measure, meets=crit, lo=0.5, hi=64, reps=1, start=2, precision=0.1)
    lim = search_limit(result, crit, SLO, points)
    assert lim["failed"][0]["field"] == "attain_strict" and lim["causes"] == ["queueing"]
    assert "50% of requests met TTFT and TPOT (< 90%)" in limit_text(lim)
    lim["failed"][0]["value"] = 43 / 48  # 89.58%: rounded to 90% it would read as meeting the bound it failed
    assert "89.6% of requests met TTFT and TPOT (< 90%)" in limit_text(lim)
    assert share_below(0.8999, 0.9) == "89.99%" and share_below(0.5, 0.9) == "50%"
    points[lim["rate"], 0]["loss"]["ttft_over_strict_wait_share"] = 0.2
    assert search_limit(result, crit, SLO, points)["causes"] == ["prefill"]
    points[lim["rate"], 0]["loss"].update(ttft_over_strict_wait_share=0.5)  # exactly half: named
    assert search_limit(result, crit, SLO, points)["causes"] == ["queueing"]
    for share, cause in ((0.5, "prefill stalls"), (0.2, "decode steps")):  # requests over the TPOT bound too
        points[lim["rate"], 0]["loss"].update(tpot_over_strict=3, tpot_over_strict_prompt_share=share)
        assert search_limit(result, crit, SLO, points)["causes"] == ["queueing", cause]
    assert "3 requests over the TPOT bound, 20% of their gaps' time" in limit_text(
        search_limit(result, crit, SLO, points)
    )
    points[lim["rate"], 0]["loss"].update(ttft_over_strict_memory_share=0.5, cache_waits=4)  # waiting for caches
    memory = search_limit(result, crit, SLO, points)
    assert memory["causes"] == ["memory", "decode steps"]
    assert "(50% for a cache)" in limit_text(memory) and "4 requests waiting for a cache" in limit_text(memory)
    points[lim["rate"], 0]["loss"]["peak_memory_gib"] = 61.25
    assert "61.2 GiB of device memory at most" in limit_text(search_limit(result, crit, SLO, points))
    points[lim["rate"], 0]["loss"].update(ttft_over_strict_memory_share=0.4)
    assert search_limit(result, crit, SLO, points)["causes"] == ["queueing", "decode steps"]
    points[lim["rate"], 0]["loss"].update(ttft_over_strict=0)  # late by TPOT alone: no TTFT cause
    assert search_limit(result, crit, SLO, points)["causes"] == ["decode steps"]
    points[lim["rate"], 0].pop("loss")  # a point from a log written before losses were kept
    old = search_limit(result, crit, SLO, points)
    assert old["causes"] == [] and "no breakdown" in limit_text(old)
    always = search(measured({0: 100.0})[0], meets=crit, lo=0.5, hi=64, reps=1, start=2)
    assert always["status"] == "at_least" and search_limit(always, crit, SLO, {}) is None
    assert limit_text(None) == "no failing rate measured"


def test_a_run_that_lost_requests_names_them():
    measure, points = measured({0: 4.0})
    crit = capacity_criterion(SLO)
    result = search(measure, meets=crit, lo=0.5, hi=64, reps=1, start=2, precision=0.1)
    point = points[search_limit(result, crit, SLO, points)["rate"], 0]
    point["summary"].update(tbt_p99_ms=1.0, n_lost=2)  # its latencies within the bounds: failed by what it lost
    lim = search_limit(result, crit, SLO, points)
    assert lim["failed"] == [{"field": "n_lost", "value": 2, "bound": 0, "side": "at_most"}]
    assert lim["causes"] == ["lost requests"] and "2 requests lost" in limit_text(lim)
    good = goodput_criterion(SLO)
    point["summary"].update(attain_strict=0.5)  # goodput: the lost ones among those that missed
    assert search_limit(result, good, SLO, points)["causes"] == ["queueing", "lost requests"]


def test_a_limit_that_would_contradict_its_search_is_refused():
    measure, points = measured({0: 4.0})
    crit = capacity_criterion(SLO)
    result = search(measure, meets=crit, lo=0.5, hi=64, reps=1, start=2, precision=0.1)
    rate = result["reps"][0]["hi"]
    good = dict(points[rate, 0], summary={"tbt_p99_ms": 1.0, "ttft_p90_ms": 3.0, "n_lost": 0})
    with pytest.raises(InputError, match="meets it, yet bounds the search"):
        search_limit(result, crit, SLO, {**points, (rate, 0): good})
    with pytest.raises(InputError, match="no measured point"):
        search_limit(result, crit, SLO, {})

"""A search under --budget-s (pdlib.run.search_budget): a point starts only when it is expected to end inside the
budget; a command stopped so writes the report of the searches it finished and says where it stopped; the same
command with the same log goes on from there and comes out as an unbounded search does. The clock and `measure`
are stand-ins: each fake point takes its `wall_s` of the fake clock.

    .venv/bin/python -m pytest -q tests/run/test_search_budget.py
"""

import json
import types

import numpy as np
import pytest

from pdlib.errors import InputError
from pdlib.run import search_budget, serve_search
from pdlib.run.search_budget import Budget, BudgetSpent
from pdlib.run.search_report import search_table, stopped_line
from pdlib.run.serve_search import search_params_file

PARAMS = """
model: synthetic:tiny
workload: {source: azure-code, first: 8, max_prompt_tokens: 256, max_output_tokens: 16}
chunk_size: 32
policies: [chunked, mixed]
peers: []
search: {lo: 0.25, hi: 64, reps: 2, precision: 0.1, max_per_rep: 8, slo: {decode_ms: 1.0, ttft_ms: 100}}
"""
THRESHOLD = {"chunked": 4.0, "mixed": 8.0}
EXTRA_S = 2.0  # what a fake run takes past its arrivals
SETUP_S = 30.0  # what a fake point makes first, once per policy and rep: never counted as a run's overhead


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(search_budget, "time", types.SimpleNamespace(perf_counter=c))
    return c


@pytest.fixture
def fake(monkeypatch, clock):
    calls, made = [], set()

    def measure(bench, policy, rate, rep, admit=None):
        warmups = 0 if policy in bench.warmed else 1
        setup = SETUP_S if (policy, rep) not in made else 0.0  # a policy's engine, a rep's references: once
        made.add((policy, rep))
        clock.t += setup
        admit(warmups)
        calls.append((policy, rate, rep))
        bench.warmed.add(policy)
        span, warm = bench.samples[rep].duration_s, max(rate, bench.warm_rate)  # as measure warms up
        wall = setup + span / rate + EXTRA_S + warmups * (span / warm + EXTRA_S)
        clock.t += wall - setup
        thr = THRESHOLD[policy] * (1 + 0.05 * rep)
        summary = {
            "tbt_p99_ms": 5 * rate / thr,
            "ttft_p90_ms": 10.0,
            "n_lost": 0,
            "attain_strict": 1.0,
            "attain_relaxed": 1.0,
        }
        point = {"summary": summary, "gate": {"checks": "fake"}, "warmups": warmups, "warmup_rate": warm}
        point.update(makespan_s=0, wall_s=wall)
        return {**point, "setup_s": setup}

    monkeypatch.setattr(serve_search, "measure", measure)
    return calls


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "search.yaml"
    path.write_text(PARAMS)
    return path


def test_a_budget_admits_what_fits_and_learns_the_overhead(clock):
    b = Budget(100.0, spans=[40.0, 80.0])
    assert b.expect(2.0, 0, warmups=0) == 20.0 + search_budget.FIRST_OVERHEAD_S
    assert b.expect(2.0, 1, warmups=1) == 2 * (40.0 + search_budget.FIRST_OVERHEAD_S)
    b.admit("chunked", 1.0, 0, warmups=0)  # 100 s of 100: it ends inside
    with pytest.raises(BudgetSpent) as e:
        b.admit("chunked", 0.8, 0, warmups=0)  # 110 s
    assert e.value.record == dict(policy="chunked", rate=0.8, rep=0, expected_s=110.0, left_s=100.0)
    clock.t += 30.0
    b.record(2.0, 0, {"wall_s": 2 * 25.0, "warmups": 1})  # 5 s a run past its 20 s of arrivals
    assert b.overhead == 5.0 and b.left() == 70.0 and b.expect(1.0, 0, warmups=0) == 45.0
    b.record(4.0, 0, {"wall_s": 12.0})  # 2 s past: the largest seen stays
    assert b.overhead == 5.0 and b.to_dict() == {"budget_s": 100.0, "overhead_s": 5.0}
    unbounded = Budget(None, spans=[40.0])
    unbounded.admit("mixed", 0.01, 0, warmups=9)
    assert unbounded.to_dict() == {"budget_s": None, "overhead_s": None}


def test_a_low_rates_warmups_run_at_the_start_rate_and_are_expected_so(clock):
    b = Budget(500.0, spans=[40.0])
    b.warm_rate = 1.0  # the search's start: a 0.125x point warms up on 40 s of arrivals, not 320
    over = search_budget.FIRST_OVERHEAD_S
    assert b.expect(0.125, 0, warmups=1) == 320.0 + over + 40.0 + over
    assert b.expect(2.0, 0, warmups=1) == 2 * (20.0 + over)  # above the start rate: at its own rate
    b.admit("fifo", 0.125, 0, warmups=1)  # 480 s: it fits (760 with the warmup at 0.125x)
    b.record(0.125, 0, {"wall_s": 370.0, "warmups": 1, "warmup_rate": 1.0})  # 10 s past 320 + 40 s of arrivals
    assert b.overhead == 5.0


def test_with_idle_spans_skipped_a_lull_is_expected_to_cost_its_drain_not_its_length(clock):
    b = Budget(100.0, spans=[16.0])
    b.gaps = [np.array([0.5, 15.0, 0.5])]  # a burst, a lull, a burst: 16 s of arrivals at 1x
    cap, over = search_budget.IDLE_CAP_S, search_budget.FIRST_OVERHEAD_S
    assert b.expect(1.0, 0, warmups=0) == pytest.approx(0.5 + cap + 0.5 + over)
    assert b.expect(0.125, 0, warmups=0) == pytest.approx(4.0 + cap + 4.0 + over)  # 128 s waited, 13 s skipped
    b.record(0.125, 0, {"wall_s": 15.0})  # 2 s past the 13 s expected of its arrivals
    assert b.overhead == pytest.approx(2.0)
    b.gaps = None  # waited: the span again
    assert b.expect(0.125, 0, warmups=0) == pytest.approx(128.0 + 2.0)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "60"])
def test_a_budget_that_is_no_number_of_seconds_is_refused(bad):
    with pytest.raises(InputError, match=r"--budget-s must be a positive number of seconds, got "):
        Budget(bad, spans=[1.0])


def test_a_stopped_search_reports_what_it_finished_and_goes_on_from_its_log(tmp_path, params, fake, monkeypatch):
    whole = search_params_file(params, log=tmp_path / "whole.jsonl", note=lambda _: None)
    order, fake[:] = list(fake), []
    assert whole["stopped"] is None and whole["budget"]["budget_s"] is None
    assert whole["budget"]["overhead_s"] == pytest.approx(EXTRA_S)  # the fake's time past its arrivals
    notes = []
    part = search_params_file(
        params, output=tmp_path / "a.json", log=tmp_path / "log.jsonl", budget_s=150, note=notes.append
    )
    k = len(fake)
    assert 0 < k < len(order) and fake == order[:k]  # the same points in the same order, up to where it stopped
    s = part["stopped"]
    assert (s["policy"], s["rate"], s["rep"]) == order[k]  # the next point of the unbounded search
    assert s["expected_s"] > s["left_s"]
    assert part["searches"] == whole["searches"][: len(part["searches"])]  # only whole searches, in order
    finished = [n for n in notes if " SLO: " in n]
    assert len(part["searches"]) == len(finished) > 0  # every search it finished, those of the stopped run too
    assert len(part["searches"]) % 4 != 0  # stopped within a run's four searches: the case that matters
    assert all(x["result"]["status"] != "budget" for x in part["searches"])
    assert json.loads((tmp_path / "a.json").read_text())["stopped"] == s
    assert notes[-1] == stopped_line(part) and "goes on from there" in notes[-1]
    assert search_table(part) and part["measurements"]["reused"] == 0  # a new log: nothing of it to go through
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == 1 + k  # the header, then every point measured
    fake[:] = []
    rest = search_params_file(params, log=tmp_path / "log.jsonl", note=lambda _: None)
    assert fake == order[k:] and rest["stopped"] is None
    assert rest["measurements"]["reused"] == k  # each point the stopped command measured, gone through again
    strip = lambda r: [(x["policy"], x["slo"], x["criterion"], x["result"]["value"], x["result"]["ci"]) for x in r]  # noqa: E731
    assert strip(rest["searches"]) == strip(whole["searches"])


def test_a_stopped_command_still_reports_the_later_runs_its_log_completes(tmp_path, params, fake, monkeypatch):
    log = tmp_path / "log.jsonl"
    mixed = search_params_file(params, log=log, policies=["mixed"], note=lambda _: None)
    fake[:], entered, inner = [], [], serve_search.measure
    monkeypatch.setattr(serve_search, "measure", lambda b, p, *a, **k: entered.append(p) or inner(b, p, *a, **k))
    report = search_params_file(params, log=log, budget_s=40, note=lambda _: None)  # chunked's first point: no
    assert fake == [] and report["stopped"]["policy"] == "chunked"
    assert entered == ["chunked"]  # once stopped, no later point is even prepared (no model, no references)
    assert [x["policy"] for x in report["searches"]] == ["mixed"] * 4  # every one of mixed's, from the log alone
    strip = lambda r: [(x["slo"], x["criterion"], x["result"]["value"], x["result"]["ci"]) for x in r]  # noqa: E731
    assert strip(report["searches"]) == strip(mixed["searches"]) and report["measurements"]["new"] == 0


def test_a_budget_too_small_for_any_point_measures_nothing(tmp_path, params, fake, monkeypatch):
    entered, inner = [], serve_search.measure
    monkeypatch.setattr(serve_search, "measure", lambda b, p, *a, **k: entered.append(p) or inner(b, p, *a, **k))
    report = search_params_file(params, log=tmp_path / "log.jsonl", budget_s=10, note=lambda _: None)
    assert fake == [] and report["searches"] == [] and report["stopped"]["policy"] == "chunked"
    assert entered == ["chunked"]  # mixed, after it, is not started either
    assert report["measurements"]["new"] == 0


def test_the_cli_takes_a_budget_only_with_a_search(tmp_path, capsys):
    from pdlib.__main__ import main

    assert main(["serve", "--params", "params/serve-search-smoke-cpu.yaml", "--budget-s", "60"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: serve: --budget-s 60 bounds a search: give it with --search and --log"
    ]
    argv = ["serve", "--params", "params/serve-search-smoke-cpu.yaml", "--search", "--log", str(tmp_path / "l.jsonl")]
    assert main([*argv, "--budget-s", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --budget-s must be a positive number of seconds, got 0.0"]
    assert not (tmp_path / "l.jsonl").exists()

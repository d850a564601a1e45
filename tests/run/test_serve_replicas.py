"""A policy as K data-parallel replicas (serve_replicas.py): requests dealt i mod K, each replica run on its own
requests at their own arrivals, every replica gated and replayed, the records merged onto the workload's clock;
the analysis keeps a request's gaps to its own replica's steps; names and bad logs refused in one line."""

import copy

import numpy as np
import pytest

from pdlib.analysis.serving import check_serving_report, gaps_frame
from pdlib.errors import InputError
from pdlib.run.serve import run_serving
from pdlib.run.serve_gate import reference_sequences
from pdlib.run.serve_params import ServeParams
from pdlib.run.serve_replicas import deal, resolve
from pdlib.run.trial import TokenMismatch
from pdlib.workload import Workload, iter_prompts

MS = 1_000_000


@pytest.fixture(scope="module")
def workload():
    return Workload(
        "replicas",
        np.array([0, MS, 2 * MS, 5 * MS, 6 * MS, 9 * MS]),  # replica 1's clock starts at 1 ms
        np.array([16, 24, 20, 12, 30, 18]),
        np.array([8, 6, 7, 5, 9, 4]),
    )


@pytest.fixture(scope="module")
def report(tiny, workload):
    return run_serving(tiny, workload, policy=["mixed", "mixed-x2"], chunk_size=16, replay=2, warmups=1)


def test_requests_are_dealt_in_arrival_order_each_replica_on_its_own_clock(workload):
    (a, a0), (b, b0) = deal(workload, 2)
    assert a.names == ("r0", "r2", "r4") and b.names == ("r1", "r3", "r5") and (a0, b0) == (0, MS)
    assert b.arrival_ns.tolist() == [0, 4 * MS, 8 * MS]
    (_, _), (c, c0), (_, _) = deal(workload, 3)
    assert c.names == ("r1", "r4") and c0 == MS and c.arrival_ns.tolist() == [0, 5 * MS]
    *_, (last, offset) = deal(workload, 6)
    assert last.names == ("r5",) and offset == 9 * MS and last.arrival_ns.tolist() == [0]
    for bad in (1, 7, 2.0, True):
        with pytest.raises(InputError, match="replicas must be a whole number from 2 to the workload's 6 requests"):
            deal(workload, bad)


def test_a_replicated_run_is_every_replicas_run_gated_replayed_and_merged(report, workload):
    alone, run = report["runs"]
    assert run["policy"] == "mixed-x2" and run["replica_of"] == "mixed" and run["replicas"] == 2
    assert [r["name"] for r in run["requests"]] == list(workload.names)
    assert [r["replica"] for r in run["requests"]] == [0, 1, 0, 1, 0, 1]
    assert [r["output_ids"] for r in run["requests"]] == [r["output_ids"] for r in alone["requests"]]
    for r, arrival in zip(run["requests"], workload.arrival_ns.tolist()):  # on the workload's clock
        assert r["arrival_ns"] == arrival <= r["admitted_ns"] <= r["emit_ns"][0] and r["check"]["status"] == "ok"
    replay = run["replay"]
    assert replay["passed"] and len(replay["replicas"]) == 2 and len(replay["requests"]) == 4  # 2 a replica
    assert replay["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in replay["replicas"]) > 0
    assert run["makespan_ns"] == max(run["replica_makespan_ns"]) == max(run["steps"]["t_end_ns"])
    steps = run["steps"]
    assert len(steps["replica"]) == len(steps["work"]) and set(steps["replica"]) == {0, 1}
    stamps = zip(steps["t_start_ns"], steps["t_issued_ns"], steps["t_end_ns"], strict=True)
    assert all(a <= t <= b for a, t, b in stamps)  # each step's issue moved onto the workload's clock with it
    for work, k in zip(steps["work"], steps["replica"]):  # a replica's steps hold only its own requests
        assert {run["requests"][int(name[1:])]["replica"] for name, _ in work} == {k}
    check_serving_report(copy.deepcopy(report))


def test_a_requests_gaps_count_only_its_own_replicas_prompt_steps(report):
    run = report["runs"][1]
    gaps = gaps_frame({"runs": [run]})
    s = run["steps"]
    for r in run["requests"]:
        mine = [(t, sum(n or 0 for _, n in w)) for w, t, k in zip(s["work"], s["t_start_ns"], s["replica"])]
        mine = [(t, n) for (t, n), k in zip(mine, s["replica"]) if k == r["replica"]]
        emit = r["emit_ns"]
        want = [sum(n > 0 for t, n in mine if a <= t < b) for a, b in zip(emit, emit[1:])]
        assert gaps[gaps.request == r["name"]].prompt_steps.tolist() == want


def test_a_wrong_token_in_one_replica_stops_the_run_naming_it(tiny, workload):
    prompts = {p.name: p.token_ids for p in iter_prompts(workload, vocab_size=tiny.config.vocab_size)}
    refs, _ = reference_sequences(tiny, prompts, dict(zip(workload.names, workload.output_tokens.tolist())))
    planted = copy.deepcopy(refs)
    r = planted["r3"]  # replica 1's
    r.tokens[2], r.margin[2] = r.tokens[2] ^ 1, 1.0  # far from a tie: a plain mismatch
    with pytest.raises(TokenMismatch, match=r"policy 'mixed-x2': request r3 differs .* at output 2"):
        run_serving(tiny, workload, policy="mixed-x2", chunk_size=16, refs=planted, replay=0)


@pytest.mark.parametrize(
    "name, message",
    [
        ("mixed-x1", "unknown serving policy 'mixed-x1'"),
        ("lifo-x2", "unknown serving policy 'lifo-x2'"),
        ("disagg-x2", "serving policy 'disagg-x2': disagg already takes two GPUs"),
        ("mixed-x02", "unknown serving policy 'mixed-x02'"),
        ("mixed-x\u00b2", "unknown serving policy 'mixed-x\u00b2'"),
    ],
)
def test_a_replicated_name_is_a_policy_and_a_count_of_two_or_more(name, message):
    assert resolve("mixed-x2") == ("mixed", 2) and resolve("overlap-x12") == ("overlap", 12)
    assert resolve("mixed") == ("mixed", 1)
    with pytest.raises(InputError, match=message):
        resolve(name)
    with pytest.raises(InputError, match=f"policies: {message}"):
        ServeParams(policies=(name,))
    assert ServeParams(policies=("mixed", "mixed-x2")).policies == ("mixed", "mixed-x2")
    with pytest.raises(InputError, match="serving policy 'mixed-x7': 7 replicas for 6 requests; each needs one"):
        resolve("mixed-x7", 6)


def test_more_replicas_than_requests_is_refused_before_any_work(tiny, workload, monkeypatch):
    monkeypatch.setattr("pdlib.run.serve.reference_sequences", lambda *a, **k: pytest.fail("work was done"))
    with pytest.raises(InputError, match="'mixed-x7': 7 replicas for 6 requests"):
        run_serving(tiny, workload, policy=["mixed", "mixed-x7"], chunk_size=16)


def test_a_step_log_with_a_bad_replica_list_is_refused(report):
    bad = copy.deepcopy(report)
    bad["runs"][1]["steps"]["replica"] = bad["runs"][1]["steps"]["replica"][1:]
    with pytest.raises(InputError, match=r"steps.replica must give each step's replica"):
        check_serving_report(bad)
    bad = copy.deepcopy(report)
    bad["runs"][1]["requests"][0]["replica"] = 5
    with pytest.raises(InputError, match="request r0: its replica is none of the step log's"):
        check_serving_report(bad)


def test_a_search_measures_replicas_as_one_run_gated_replica_by_replica(tmp_path):
    import json

    from pdlib.run.serve_search import search_params_file

    params = tmp_path / "r.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed-x2]\nreplay_requests: 1\n"
        "workload: {source: poisson, rate: 1.0, n: 4, seed: 0, prompt: 24, output: 3}\n"
        "search: {lo: 40, hi: 160, reps: 1, precision: 1.0, max_per_rep: 2, criteria: [capacity]}\n"
    )
    log = tmp_path / "log.jsonl"
    report = search_params_file(params, output=tmp_path / "out.json.gz", log=log, note=lambda _: None)
    assert {s["policy"] for s in report["searches"]} == {"mixed-x2"}
    points = [p for p in map(json.loads, log.read_text().splitlines()[1:]) if "policy" in p]  # not kept values
    assert points and all(pt["policy"] == "mixed-x2" and pt["summary"]["n_requests"] == 4 for pt in points)
    for pt in points:  # one request replayed in full on each replica
        replay = pt["gate"]["replay"]
        assert replay["passed"] and len(replay["replicas"]) == 2 and len(replay["requests"]) == 2


def test_slo_mixed_replicas_get_the_fitted_budget(tiny, workload):
    report = run_serving(tiny, workload, policy=["slo-mixed-x2"], chunk_size=16, replay=1)
    assert report["slo_policy"]["tbt_ms"] > 0 and report["runs"][0]["replay"]["passed"]

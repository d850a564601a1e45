"""The rate searches as a runnable thing (pdlib.run.serve_search): with `measure` replaced by a deterministic fake
whose summaries cross each SLO at a known rate, every policy's and peer's searches come out where they should and
share their points; a killed search (its log cut mid-line) resumes measuring only what was lost; a log of other
params is refused; each rep is its own workload sample; and one small real search runs end to end through the
gate on the tiny model.

    .venv/bin/python -m pytest -q tests/run/test_serve_search.py
"""

import fcntl
import gc
import json
import weakref
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from pdlib.engine import Engine
from pdlib.errors import InputError
from pdlib.report.io import read_text, source_hashes, sources_hash
from pdlib.report.serving import Slo, capacity_criterion, goodput_criterion, grid_rate
from pdlib.report.serving_loss import failed_bounds, limit_text
from pdlib.run import search_rules, serve, serve_search
from pdlib.run.search_log import LOG_SCHEMA
from pdlib.run.search_report import SCHEMA, search_table
from pdlib.run.search_workload import rep_sample, rep_workload
from pdlib.run.serve_params import load_serve_params
from pdlib.run.serve_search import search_params_file
from pdlib.run.trial import TokenMismatch
from pdlib.traces import load_trace
from pdlib.workload import Workload, clip_lengths

PRECISION = 0.05
# serving_loss's causes; "decode steps or host time" is a peer's slow TBT (its steps have no issue times)
CAUSES = {"prefill stalls", "host time", "decode steps", "decode steps or host time", "queueing", "prefill", "memory"}
SLOS = ("strict", "relaxed")
# The fake's thresholds (rate multiplier) at rep 0; rep r's are (1 + 0.05 r) times these.
BASE = {"chunked": 4.0, "mixed": 8.0, "mlx-lm-bf16@32": 2.0}
PARAMS = f"""
model: synthetic:tiny
workload: {{source: azure-code, first: 8, max_prompt_tokens: 256, max_output_tokens: 16}}
chunk_size: 32
policies: [chunked, mixed]
peers: [mlx-lm-bf16@chunk]
search: {{lo: 0.25, hi: 64, reps: 3, precision: {PRECISION}, max_per_rep: 16, slo: {{decode_ms: 1.0, ttft_ms: 100}}}}
"""


def threshold(policy, rep, slo, criterion):
    """Where the fake crosses: capacity at thr (strict) and 5 thr (relaxed); goodput at thr/2 and 2 thr."""
    thr = BASE[policy] * (1 + 0.05 * rep)
    return thr * {("strict", "capacity"): 1, ("relaxed", "capacity"): 5, ("strict", "goodput"): 0.5}.get(
        (slo, criterion), 2
    )


class Fake:
    """measure's stand-in: decode_ms 1 makes the TBT SLOs 5 and 25 ms; TTFT 10 ms always meets 100 ms."""

    def __init__(self):
        self.calls = []

    def __call__(self, bench, policy, rate, rep, admit=None):
        if admit is not None:  # no --budget-s here: never refused
            admit(0)
        self.calls.append((policy, rate, rep))
        thr = BASE[policy] * (1 + 0.05 * rep)
        summary = {
            "tbt_p99_ms": 5 * rate / thr,
            "ttft_p90_ms": 10.0,
            "n_lost": 0,
            "attain_strict": 1.0 if rate <= thr / 2 else 0.5,
            "attain_relaxed": 1.0 if rate <= 2 * thr else 0.5,
        }
        return {"summary": summary, "gate": {"checks": "fake"}, "makespan_s": 0.0, "wall_s": 0.0}


@pytest.fixture
def fake(monkeypatch):
    f = Fake()
    monkeypatch.setattr(serve_search, "measure", f)
    return f


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "search.yaml"
    path.write_text(PARAMS)
    return path


def test_the_searches_find_every_runs_thresholds_and_share_their_points(tmp_path, params, fake):
    notes = []
    report = search_params_file(params, output=tmp_path / "out.json", log=tmp_path / "log.jsonl", note=notes.append)
    assert report["schema"] == SCHEMA and json.loads(read_text(tmp_path / "out.json"))["schema"] == SCHEMA
    s = report["searches"]
    assert [(x["policy"], x["peer"], x["slo"], x["criterion"]) for x in s] == [
        (p, p.startswith("mlx-lm"), slo, c) for p in BASE for slo in SLOS for c in ("capacity", "goodput")
    ]
    for x in s:
        r = x["result"]
        want = threshold(x["policy"], 1, x["slo"], x["criterion"])  # the lower median of 3 reps: rep 1's
        assert r["status"] == "found" and want / (1 + PRECISION) <= r["value"] <= want, (x, r["value"], want)
        assert r["criterion"] == f"{x['criterion']}_{x['slo']}"
        lo, hi = r["ci"]
        assert lo <= threshold(x["policy"], 0, x["slo"], x["criterion"]) and hi > threshold(
            x["policy"], 2, x["slo"], x["criterion"]
        )
    # the four searches of a run share its points: each (rate, rep) measured once, the rest reused
    assert len(fake.calls) == len(set(fake.calls)) == report["measurements"]["new"]
    assert sum(x["result"]["measured"] for x in s) == len(fake.calls)
    for p in BASE:
        seen = {(q["rate"], q["rep"]) for x in s if x["policy"] == p for q in x["result"]["points"]}
        assert seen == {(rate, rep) for q, rate, rep in fake.calls if q == p}
    assert sum(x["result"]["reused"] for x in s) > 0
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["schema"] == LOG_SCHEMA and len(lines) == 1 + len(fake.calls)
    assert {"policy", "rate", "rep", "summary", "gate", "created_utc"} <= set(json.loads(lines[1]))
    assert report["slos"]["strict"]["tbt_ms"] == 5.0 and report["slos"]["relaxed"]["tpot_ms"] == 25.0
    assert report["slo_measured"] == [] and report["calibration"] is None  # both given: nothing measured
    assert [r["trace_rows"] for r in report["reps"]] == [[0, 8], [8, 16], [16, 24]]
    assert "mixed" in search_table(report) and len(notes) == len(fake.calls) + len(s)


def test_a_paced_search_says_what_request_rate_1x_is(tmp_path, params, fake):
    plain = search_params_file(params, log=tmp_path / "a.jsonl", note=lambda _: None)
    assert "rate = rate multiplier; decode step" in search_table(plain)
    paced = tmp_path / "paced.yaml"
    paced.write_text(PARAMS.replace("first: 8,", "first: 8, pace: trace,"))
    report = search_params_file(paced, log=tmp_path / "b.jsonl", note=lambda _: None)
    assert report["workload"]["pace"] == "trace" and report["workload"]["duration_s"] == pytest.approx(7 / 2.566, 1e-3)
    assert "rate = rate multiplier (1x: 2.57 requests/s, the trace's mean); decode step" in search_table(report)


def test_a_floor_in_the_params_takes_a_run_failing_at_lo_below_it(tmp_path, fake):
    """With lo 8 the searches whose thresholds lie under it fail at lo; floor 0.5 finds them, the points at or
    above lo being the ones the floorless search measured; the others are unchanged."""
    plain, deep = (tmp_path / "plain.yaml", tmp_path / "deep.yaml")
    plain.write_text(PARAMS.replace("lo: 0.25", "lo: 8"))
    deep.write_text(PARAMS.replace("lo: 0.25", "lo: 8, floor: 0.5"))
    first = search_params_file(plain, log=tmp_path / "a.jsonl", note=lambda _: None)
    second = search_params_file(deep, log=tmp_path / "b.jsonl", note=lambda _: None)
    # the plain log resumed with the floor: said, and only its points on the deeper search's path serve
    notes: list = []
    third = search_params_file(deep, log=tmp_path / "a.jsonl", note=notes.append)
    assert [n for n in notes if "began with other settings (floor: null != 0.5)" in n], notes
    m = third["measurements"]
    assert m["reused"] == m["from_log"] and m["new"] > 0  # every point of the plain search lies on the deep path
    # resumed from another start: the deep search's path meets only some of the log's points
    moved = tmp_path / "moved.yaml"
    moved.write_text(PARAMS.replace("lo: 0.25", "lo: 8, floor: 0.5, start: 9"))
    fourth = search_params_file(moved, log=tmp_path / "a.jsonl", note=lambda _: None)["measurements"]
    assert 0 < fourth["reused"] < fourth["from_log"] and fourth["new"] > 0
    below = 0
    for a, b in zip(first["searches"], second["searches"]):
        want = threshold(a["policy"], 1, a["slo"], a["criterion"])  # the median rep's
        if want < 8:
            below += 1
            assert a["result"]["status"] == "none" and a["result"]["text"] == "none (fails at 8)"
            assert b["result"]["status"] == "found" and want / (1 + PRECISION) <= b["result"]["value"] <= want
            above = [(q["rate"], q["rep"]) for q in b["result"]["points"] if q["rate"] >= 8]
            assert above == [(q["rate"], q["rep"]) for q in a["result"]["points"]]
        else:
            assert b["result"]["value"] == a["result"]["value"]
    assert below >= 4


def test_a_killed_search_resumes_and_measures_only_what_it_lost(tmp_path, params, fake):
    first = search_params_file(params, output=tmp_path / "a.json", log=tmp_path / "log.jsonl", note=lambda _: None)
    n = len(fake.calls)
    again = search_params_file(params, output=tmp_path / "b.json", log=tmp_path / "log.jsonl", note=lambda _: None)
    want = {"new": 0, "reused": n, "from_log": n, "in_log": n, "cut_bytes": 0}
    assert len(fake.calls) == n and again["measurements"] == want
    assert f"0 runs measured, {n} of the log's {n} reused" in search_table(again)
    assert again["from_log"] is False and "composed_on" not in again["environment"]  # resumed, not --from-log
    # killed while writing point k: the log ends in the middle of its line
    k = 7
    data = (tmp_path / "log.jsonl").read_bytes()
    starts = [i + 1 for i, b in enumerate(data) if b == ord("\n")]  # starts[j]: where line j + 2 begins
    cut = starts[k] + (starts[k + 1] - starts[k]) // 2  # inside point k + 1's line (1-based)
    (tmp_path / "cut.jsonl").write_bytes(data[:cut])
    notes = []
    fake.calls.clear()
    resumed = search_params_file(params, output=tmp_path / "c.json", log=tmp_path / "cut.jsonl", note=notes.append)
    assert len(fake.calls) == n - k and resumed["measurements"]["from_log"] == k == resumed["measurements"]["reused"]
    assert resumed["measurements"]["cut_bytes"] == cut - starts[k]
    assert "ignored a partial last line" in notes[0]
    assert [x["result"]["value"] for x in resumed["searches"]] == [x["result"]["value"] for x in first["searches"]]
    assert [x["result"]["ci"] for x in resumed["searches"]] == [x["result"]["ci"] for x in first["searches"]]
    assert (tmp_path / "cut.jsonl").read_bytes().count(b"\n") == 1 + n  # whole again, every line complete


def test_a_policys_points_made_under_another_rule_are_measured_again(tmp_path, params, fake, monkeypatch):
    """A policy whose rule changed (slo-mixed's budget) keeps the rule in each point and search: a log's points
    made under another rule are measured again, the other runs' are reused."""
    assert search_rules.policy_rule("slo-mixed") == search_rules.policy_rule("slo-mixed-x2") is not None
    assert search_rules.policy_rule("mixed") is None
    assert search_rules.policy_rule("mlx-lm-bf16@32") == search_rules.PEER_RULE  # its memory collected first
    log = tmp_path / "log.jsonl"
    first = search_params_file(params, log=log, note=lambda _: None)
    n_mixed = sum(p == "mixed" for p, _, _ in fake.calls)
    fake.calls.clear()
    monkeypatch.setitem(search_rules.RULES, "mixed", "mixed-rule/2")
    notes = []
    again = search_params_file(params, log=log, note=notes.append)
    assert {p for p, _, _ in fake.calls} == {"mixed"} and len(fake.calls) == n_mixed
    stale = f"mixed: {n_mixed} points of the log were measured under another rule"
    assert any(line.startswith(stale) for line in notes)
    assert [x.get("rule") for x in again["searches"] if x["policy"] == "mixed"] == ["mixed-rule/2"] * 4
    assert all(x.get("rule") == search_rules.policy_rule(x["policy"]) for x in again["searches"])
    assert [x["result"]["value"] for x in again["searches"]] == [x["result"]["value"] for x in first["searches"]]
    ruled = [p for p in logged_points(log) if p["policy"] == "mixed" and p.get("rule") == "mixed-rule/2"]
    assert len(ruled) == n_mixed
    fake.calls.clear()
    search_params_file(params, log=log, note=lambda _: None)
    assert fake.calls == []  # every point now under the current rules


@pytest.mark.parametrize(
    "switch, other, logged", [("PDLIB_ROUND_GROUP", "8", "8"), ("PDLIB_PERSISTENT_LOAD", "late", '"late"')]
)
def test_a_log_made_before_a_switch_existed_resumes_where_it_is_at_its_default(
    tmp_path, params, fake, monkeypatch, switch, other, logged
):
    """An engine switch added since a log was made (its header's settings lack it) changes nothing at its default:
    the log resumes, measuring nothing again; set otherwise, the log is refused, naming it."""
    log = tmp_path / "log.jsonl"
    first = search_params_file(params, log=log, note=lambda _: None)
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    del header["identity"]["machine"]["settings"][switch]  # a log from before the switch
    log.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    fake.calls.clear()
    again = search_params_file(params, log=log, note=lambda _: None)
    assert fake.calls == [] and again["measurements"]["new"] == 0
    assert [x["result"]["value"] for x in again["searches"]] == [x["result"]["value"] for x in first["searches"]]
    monkeypatch.setenv(switch, other)
    with pytest.raises(InputError, match=rf"machine.settings.{switch}: null != {logged}"):
        search_params_file(params, log=log, note=lambda _: None)
    monkeypatch.delenv(switch)  # a switch recorded later than it existed is refused, even at its default
    del header["identity"]["machine"]["settings"]["PDLIB_KV_CACHE_GIB"]
    log.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    with pytest.raises(InputError, match=r"machine.settings.PDLIB_KV_CACHE_GIB: null != "):
        search_params_file(params, log=log, note=lambda _: None)


def test_a_report_from_the_log_alone_measures_nothing_on_any_machine(tmp_path, params, fake):
    """--from-log: the searches the log completes, the log's machine as the report's, nothing measured; a point the
    log lacks is where it stops, named so."""
    log = tmp_path / "log.jsonl"
    first = search_params_file(params, log=log, note=lambda _: None)
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    header["identity"]["machine"].update(device_name="NVIDIA H100 80GB HBM3", backend="cuda")
    log.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    with pytest.raises(InputError, match="another machine"):  # measuring, it is another machine's log
        search_params_file(params, log=log, note=lambda _: None)
    fake.calls.clear()
    report = search_params_file(params, output=tmp_path / "r.json.gz", log=log, note=lambda _: None, from_log=True)
    assert fake.calls == [] and report["from_log"] and report["stopped"] is None
    for key in ("value", "ci", "status", "points"):
        assert [x["result"][key] for x in report["searches"]] == [x["result"][key] for x in first["searches"]]
    env = report["environment"]
    assert env["device_name"] == "NVIDIA H100 80GB HBM3" and env["device"] == "gpu" and "composed_on" in env
    assert log.read_text().splitlines()[1:] == lines[1:]  # nothing appended
    # a log without mixed's points: chunked's searches, then where it stops; the peer's from the log again
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(x for x in log.read_text().splitlines() if '"policy":"mixed"' not in x) + "\n")
    notes = []
    part = search_params_file(params, log=cut, note=notes.append, from_log=True)
    assert fake.calls == [] and part["stopped"]["policy"] == "mixed" and part["stopped"]["reason"] == "not in the log"
    assert {x["policy"] for x in part["searches"]} == {"chunked", "mlx-lm-bf16@32"}
    assert any(line.startswith("from the log: it stops before mixed") for line in notes)
    with pytest.raises(InputError, match="no search log"):
        search_params_file(params, log=tmp_path / "none.jsonl", from_log=True)
    with pytest.raises(InputError, match="--budget-s"):
        search_params_file(params, log=log, from_log=True, budget_s=60)


def test_each_point_keeps_the_code_that_measured_it_and_a_report_counts_them(tmp_path, params, fake):
    """A report composed from a log names the sources hash of every point it uses (its own `sources` are the
    composing code's); a point logged before points kept one counts as unrecorded."""
    log = tmp_path / "log.jsonl"
    first = search_params_file(params, log=log, note=lambda _: None)
    mine = sources_hash(source_hashes(params))
    lines = log.read_text().splitlines()
    assert all(json.loads(x)["sources_hash"] == mine for x in lines[1:])
    used = {(x["policy"], q["rate"], q["rep"]) for x in first["searches"] for q in x["result"]["points"]}
    assert first["measured_with"] == {mine: len(used)}
    # two of chunked's points made by other code, one by code too old to say
    edited, changed = [lines[0]], []
    for x in lines[1:]:
        r = json.loads(x)
        if r["policy"] == "chunked" and len(changed) < 3 and (r["policy"], r["rate"], r["rep"]) in used:
            if changed:
                r["sources_hash"] = "0123456789ab"
            else:
                del r["sources_hash"]
            changed.append(r)
        edited.append(json.dumps(r))
    log.write_text("\n".join(edited) + "\n")
    fake.calls.clear()
    again = search_params_file(params, log=log, note=lambda _: None, from_log=True)
    assert fake.calls == []
    assert again["measured_with"] == {mine: len(used) - 3, "0123456789ab": 2, "unrecorded": 1}


def test_a_log_of_other_params_or_a_damaged_one_is_refused(tmp_path, params, fake):
    log = tmp_path / "log.jsonl"
    search_params_file(params, log=log, note=lambda _: None)
    other = tmp_path / "other.yaml"
    other.write_text(PARAMS.replace("first: 8", "first: 6"))
    with pytest.raises(InputError) as e:
        search_params_file(other, log=log, note=lambda _: None)
    assert "other params or on another machine (workload.first: 8 != 6)" in str(e.value) and "\n" not in str(e.value)
    # settings that do not change a point's numbers reuse them: more reps measure only the new rep
    more = tmp_path / "more.yaml"
    more.write_text(PARAMS.replace("reps: 3", "reps: 4"))
    n = len(fake.calls)
    search_params_file(more, log=log, note=lambda _: None)
    assert {rep for _, _, rep in fake.calls[n:]} == {3}
    lines = log.read_text().splitlines()
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join([lines[0], lines[1][:20], *lines[2:]]) + "\n")
    with pytest.raises(InputError, match="line 2 is damaged"):
        search_params_file(params, log=damaged, note=lambda _: None)
    with open(log, "rb") as held:  # another search holds it: refused, never appended to by two
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(InputError, match="is in use by another search"):
            search_params_file(params, log=log, note=lambda _: None)
    (tmp_path / "notalog.jsonl").write_text('{"schema": "pdlib.serve/1"}\n')
    with pytest.raises(InputError, match="is not a search log"):
        search_params_file(params, log=tmp_path / "notalog.jsonl", note=lambda _: None)


def test_an_existing_output_is_refused_before_any_work(tmp_path, params, fake):
    (tmp_path / "out.json").write_text("{}")
    with pytest.raises(InputError, match="already exists"):
        search_params_file(params, output=tmp_path / "out.json", log=tmp_path / "log.jsonl")
    assert not (tmp_path / "log.jsonl").exists() and fake.calls == []


@pytest.mark.parametrize(
    "change, message",
    [
        (("", ""), r"one cache of \d+ positions needs .* GiB \(over PDLIB_KV_CACHE_GIB=1e-06\)"),
        (("model: synthetic:tiny", "model: synthetic:nope"), "unknown model preset 'nope'"),
        (("lo: 0.25", "lo: 1.0e-300"), "rate_multiplier 1e-300: the arrivals would span"),
    ],
)
def test_a_search_refused_before_its_first_point_leaves_no_log(tmp_path, monkeypatch, change, message):
    """Measured for real (the tiny model): the model, its caches' fit in memory and the slowest rate's workload
    are refused before any point, and the log made for the search goes with its folders."""
    if not change[0]:  # memory for no cache: refused as the first point prepares its rep
        monkeypatch.setenv("PDLIB_KV_CACHE_GIB", "0.000001")
    params = tmp_path / "search.yaml"
    params.write_text(PARAMS.replace(*change))
    with pytest.raises(InputError, match=message):
        search_params_file(params, log=tmp_path / "logs" / "log.jsonl", note=lambda _: None)
    assert not (tmp_path / "logs").exists()


def test_the_cli_refuses_one_path_for_the_log_and_the_report(tmp_path, capsys, fake):
    from pdlib.__main__ import main

    params = tmp_path / "search.yaml"
    params.write_text(PARAMS)
    same = str(tmp_path / "same.json")
    assert main(["serve", "--params", str(params), "--search", "--log", same, "--output", same]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: serve: --log and --output are both {same!r}: the log and the report need two paths"
    ]
    assert fake.calls == [] and not (tmp_path / "same.json").exists()
    folder = str(tmp_path / "new") + "/"
    assert main(["serve", "--params", str(params), "--search", "--log", same, "--output", folder]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: output {folder!r} names a folder: give the report's file name"
    ]
    assert fake.calls == [] and not (tmp_path / "new").exists()


# ---- reps ----------------------------------------------------------------------------------------------------


def same(a: Workload, b: Workload) -> bool:
    arrays = ("arrival_ns", "prompt_tokens", "output_tokens")
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays) and a.to_dict() == b.to_dict()


def test_rep_0_is_the_plain_workload_and_each_rep_its_own_sample():
    code = {"source": "azure-code", "first": 8, "max_prompt_tokens": 256}
    assert same(rep_workload(code, 2.5, 0), Workload.from_params({**code, "rate_multiplier": 2.5}))
    window = {**code, "window_s": [29, 60]}
    assert same(rep_workload(window, 1.0, 0), Workload.from_params(window))
    t = load_trace("code")
    i = int(np.searchsorted(t.arrival_ns, 29 * 10**9))
    w = rep_workload(window, 2.0, 2)  # requests [i + 16, i + 24) of the trace, arrivals halved
    assert rep_sample(window, 2) == {"trace_rows": [i + 16, i + 24]}
    p, o, _ = clip_lengths(t.prompt_tokens[i + 16 : i + 24], t.output_tokens[i + 16 : i + 24], max_prompt_tokens=256)
    assert np.array_equal(w.prompt_tokens, p) and np.array_equal(w.output_tokens, o)
    rel = t.arrival_ns[i + 16 : i + 24] - t.arrival_ns[i + 16]
    assert np.array_equal(w.arrival_ns, np.rint(rel / 2.0).astype(np.int64))
    assert w.options["first"] == 8 and w.options["rate_multiplier"] == 2.0 and w.options["trace_requests"] == t.n
    poisson = {"source": "poisson", "rate": 9.0, "n": 5, "seed": 7, "prompt": 20, "output": 3}
    assert same(rep_workload(poisson, 9.0, 0), Workload.from_params(poisson))
    assert same(rep_workload(poisson, 3.0, 2), Workload.from_params({**poisson, "rate": 3.0, "seed": 9}))
    slices = {"source": "azure-conv", "window_s": [10, 20.5]}
    assert rep_sample(slices, 2) == {"window_s": [31.0, 41.5]}
    assert same(rep_workload(slices, 1.0, 2), Workload.from_params({**slices, "window_s": [31.0, 41.5]}))
    # paced, every rep has the whole trace's mean rate at 1x (not its block's), its own gaps' proportions kept
    gap = (t.arrival_ns[-1] - t.arrival_ns[0]) / (t.n - 1)
    paced = {"source": "azure-code", "first": 48, "pace": "trace"}
    for rep in range(3):
        raw, w = rep_workload({**paced, "pace": None}, 1.0, rep), rep_workload(paced, 2.0, rep)
        assert w.duration_s == pytest.approx(47 * gap / 2 / 1e9, rel=1e-9) and w.options["pace"] == "trace"
        shares = [np.diff(x.arrival_ns) / x.arrival_ns[-1] for x in (raw, w)]
        assert np.allclose(*shares, atol=1e-8) and np.array_equal(raw.prompt_tokens, w.prompt_tokens)
    assert [rep_workload({**paced, "pace": None}, 1.0, r).duration_s > 30 for r in (0, 1)] == [True, True]


@pytest.mark.parametrize(
    "params, rep, message",
    [
        ({"source": "azure-code"}, 1, "reps > 1 on a whole trace"),
        ({"source": "azure-code", "window_s": [0, 0.12], "first": 2}, 1, "needs requests [2, 4) of window_s"),
        ({"source": "pair", "prompt_tokens": 8, "output_tokens": 2}, 0, "needs arrivals to speed up"),
    ],
)
def test_a_rep_the_params_cannot_give_is_refused_in_one_line(params, rep, message):
    with pytest.raises(InputError) as e:
        rep_workload(params, 1.0, rep)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "search, message",
    [
        ("{lo: 2, hi: 1}", "lo <= start <= hi"),
        ("{reps: 0}", "search reps must be an integer >= 1"),
        ("{precision: 0.00001}", "search precision must be at least 0.0001 (6-digit rates), got 1e-05"),
        ("{criteria: [capacity, latency]}", "search criteria must be a non-empty list of capacity, goodput"),
        ("{slo: {decode_ms: -1}}", "search slo decode_ms must be a positive finite number or null"),
        ("{budget: 3}", "search: unknown key(s) budget"),
        ("{lo: 0.5, floor: 1}", "search floor must be <= lo, got floor 1, lo 0.5"),
        ("{floor: 0}", "search floor must be a positive finite number or null"),
    ],
)
def test_bad_search_settings_are_refused_in_one_line(tmp_path, search, message):
    path = tmp_path / "p.yaml"
    path.write_text(f"workload: {{source: poisson, rate: 1, n: 2, seed: 0, prompt: 8, output: 2}}\nsearch: {search}\n")
    with pytest.raises(InputError) as e:
        load_serve_params(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_smoke_params_load():
    w, p = load_serve_params("params/serve-search-smoke-cpu.yaml")
    assert p.search["reps"] == 2 and p.search["slo"] == {"decode_ms": None, "ttft_ms": None}
    assert [rep_workload(w, 1.0, r).n for r in range(p.search["reps"])] == [8, 8]


def test_every_serving_params_file_loads_with_every_rep_its_search_asks_for():
    """A GPU command is no place to learn that a params file is refused: every `params/` file with a workload
    loads, and a search section's reps can all be made."""
    files = [f for f in sorted(Path("params").glob("*.yaml")) if "workload:" in f.read_text()]
    assert len(files) >= 4
    for f in files:
        w, p = load_serve_params(f)
        reps = p.search["reps"] if p.search else 1
        assert [rep_workload(w, 1.0, r).n for r in range(reps)] == [w.get("first") or rep_workload(w, 1.0, 0).n] * reps


# ---- one real search -----------------------------------------------------------------------------------------


def logged_points(log) -> list[dict]:
    """A search log's measured points, in order (not its header, nor the values it keeps for later commands)."""
    if not log.exists():  # a search stopped before any line: its log is removed
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()[1:]) if "policy" in r]


def small_search(tmp_path):
    """A real search on the tiny model: one policy, one peer, one rep; (params file, log, report)."""
    params = tmp_path / "real.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed]\npeers: [mlx-lm-fp32@chunk]\nwarmups: 1\nidle: skip\n"
        "workload: {source: poisson, rate: 1.0, n: 4, seed: 0, prompt: 24, output: 3}\n"
        "search: {lo: 40, hi: 160, reps: 1, precision: 1.0, max_per_rep: 3, criteria: [capacity, goodput]}\n"
    )
    log = tmp_path / "log.jsonl"
    return params, log, search_params_file(params, output=tmp_path / "out.json.gz", log=log, note=lambda _: None)


def test_a_small_real_search_runs_through_the_gate_and_resumes(tmp_path, monkeypatch):
    params, log, report = small_search(tmp_path)
    cal = report["calibration"]
    assert report["slo_measured"] == ["decode_ms", "ttft_ms"] and cal["decode_prompt_tokens"] == 24
    assert report["decode_step_ms"] == cal["decode_ms"] > 0 and len(cal["decode_samples_ms"]) == 20
    assert report["slos"]["strict"]["ttft_ms"] == pytest.approx(3 * cal["prefill_ms"])
    assert len(report["searches"]) == 8 and {x["peer"] for x in report["searches"]} == {False, True}
    n = report["measurements"]["new"]
    assert 2 <= n <= 2 * 3
    points = logged_points(log)  # beside them, one line of rep 0's references
    assert len(points) == n
    for run in ("mixed", "mlx-lm-fp32@16"):  # one warmup a command, before the run's first point
        assert [pt["warmups"] for pt in points if pt["policy"] == run][:2] in ([1], [1, 0]), run
    assert report["warm"]["warm_rows"] == [1] and report["warm"]["warm_rounds"] == []  # no compiled rounds here
    for pt in points:
        assert pt["summary"]["n_requests"] == 4 and "attain_strict" in pt["summary"]
        assert 0 <= pt["skipped_s"] <= pt["makespan_s"]  # `idle: skip`: the spans with no request, jumped
        if pt["policy"] == "mixed":
            assert pt["gate"]["checks"] == "tokens, and in full on a replay" and pt["gate"]["near_ties"] == []
            replay = pt["gate"]["replay"]  # 4 of the point's own 4 requests, every check made
            assert replay["passed"] and len(replay["requests"]) == 4 and replay["skipped_near_ties"] == []
            assert all(replay["checks"][k]["count"] > 0 for k in ("prefix_kv", "logits", "token", "decode_kv"))
        else:
            assert pt["gate"]["agreement"] == pt["gate"]["tokens"] == 12 and pt["gate"]["lost"] == 0
    assert report["references"]["computed"] == 1 and report["references"]["from_log"] == 0
    for pt in points:  # where each run lost latency, kept with its point
        loss = pt["loss"]
        assert 1 <= loss["peak_requests"] <= 4 and loss["peak_kv_gib"] > 0
        assert 0 < loss["held_gib"] <= loss["peak_memory_gib"]  # the models (and caches) alive as the run began
        assert 0 <= loss["tbt_over_strict_prompt"] <= loss["tbt_over_strict"] <= 4 * 2
        assert 0 <= loss["prompt_steps_share"] <= 1 and 0 <= loss["no_step_share"] <= 1
    by_key = {(pt["policy"], pt["rate"], pt["rep"]): pt for pt in points}
    for x in report["searches"]:  # each value's limit: the failing point above it, and the bounds it broke there
        r, lim = x["result"], x["result"]["limit"]
        if r["reps"][0]["hi"] is None:
            assert lim is None
            continue
        pt = by_key[x["policy"], lim["rate"], 0]
        crit = {"capacity": capacity_criterion, "goodput": goodput_criterion}[x["criterion"]](
            Slo(**report["slos"][x["slo"]])
        )
        assert lim["rate"] == r["reps"][0]["hi"] > r["value"] and lim["failed"] == failed_bounds(crit, pt["summary"])
        assert lim["failed"] and json.dumps(lim["loss"]) == json.dumps(pt["loss"]) and set(lim["causes"]) <= CAUSES
    monkeypatch.setattr(serve_search, "load_model", lambda spec: pytest.fail("a resumed search loaded the model"))
    again = search_params_file(params, log=log, note=lambda _: None)  # nothing left to measure, nothing loaded
    assert again["measurements"]["new"] == 0 and again["calibration"] == cal
    assert report["model"]["source"] == "synthetic" and report["model"]["spec"].startswith("synthetic:tiny")
    assert again["model"] == report["model"]  # which weights, from the references' key in the log
    assert [x["result"]["value"] for x in again["searches"]] == [x["result"]["value"] for x in report["searches"]]


def test_the_engine_gives_its_caches_back_before_a_peer_runs(tmp_path, monkeypatch):
    """On an H200 the engine's 48 caches of the code trace (76 GiB) left mlx-lm too little memory: a peer's point
    runs after Engine.release, and the engine's memory is back only when a policy's point makes it again. The
    engine's model sits in reference cycles: it is collected before the peer starts, not at Python's next
    collection (on an H100 mlx-lm's points ran out of memory until then)."""
    events = []
    release, peer_once = Engine.release, serve_search.peer_once

    def released(engine):
        events.append("release")
        release(engine)

    def peer(*args, **kw):  # what the engine held is gone, without waiting for Python's next collection
        held = mx.get_active_memory()
        gc.collect()
        events.append(("peer", held - mx.get_active_memory()))
        return peer_once(*args, **kw)

    monkeypatch.setattr(Engine, "release", released)
    monkeypatch.setattr(serve_search, "peer_once", peer)
    gc.disable()
    try:
        small_search(tmp_path)
    finally:
        gc.enable()
    assert events[0] == "release" and events.count("release") == 1 and events[1] == ("peer", 0)


def test_every_reps_references_are_made_before_the_engines_caches(tmp_path, monkeypatch):
    """On an H100 rep 1's FP32 references, made after rep 0's points beside 50 GiB of caches, ran out of memory:
    a search makes every rep's references first, and a resumed one takes them all from its log."""
    events = []
    made = serve_search.reference_sequences

    def refs(model, prompts, outputs):
        events.append("refs")
        return made(model, prompts, outputs)

    class Logged(Engine):  # the search's engine (the SLO calibration's own comes before any reference)
        def __init__(self, *a, **kw):
            events.append("engine")
            super().__init__(*a, **kw)

    monkeypatch.setattr(serve_search, "reference_sequences", refs)
    monkeypatch.setattr(serve_search, "Engine", Logged)
    params = tmp_path / "two.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [chunked]\nwarmups: 0\nreplay_requests: 1\n"
        "workload: {source: poisson, rate: 1.0, n: 3, seed: 0, prompt: 20, output: 2}\n"
        "search: {lo: 40, hi: 160, start: 80, reps: 2, precision: 1.0, max_per_rep: 1, criteria: [capacity]}\n"
    )
    report = search_params_file(params, log=tmp_path / "log.jsonl", note=lambda _: None)
    assert report["references"]["computed"] == 2 and {p["rep"] for p in logged_points(tmp_path / "log.jsonl")} == {0, 1}
    assert events[:3] == ["refs", "refs", "engine"] and events.count("refs") == 2
    events.clear()  # another policy on the same log: its engine made again, both reps' references from the log
    params.write_text(params.read_text().replace("policies: [chunked]", "policies: [chunked, mixed]"))
    again = search_params_file(params, log=tmp_path / "log.jsonl", note=lambda _: None)
    assert again["references"] == {"computed": 0, "from_log": 2, "seconds": 0.0} and events == ["engine"]


def test_a_resumed_search_gates_against_the_references_in_its_log(tmp_path, monkeypatch):
    """A later command measuring new points on a rep takes that rep's reference sequences from the log rather
    than running the FP32 reference again, and gates against them: a token changed there stops the search."""
    params, log, report = small_search(tmp_path)
    assert report["references"]["computed"] == 1
    more = params.read_text().replace("policies: [mixed]", "policies: [mixed, chunked]")
    params.write_text(more)
    ran = []
    monkeypatch.setattr(serve_search, "reference_sequences", lambda *a: ran.append(a) or pytest.fail("recomputed"))
    lines = log.read_text().splitlines()
    again = search_params_file(params, log=log, note=lambda _: None)
    assert again["references"] == {"computed": 0, "from_log": 1, "seconds": 0.0} and not ran
    assert again["measurements"]["new"] >= 1  # chunked's points, gated against the logged references
    at = next(i for i, line in enumerate(lines) if line.startswith('{"kept":"references"'))
    bad = json.loads(lines[at])
    bad["value"]["r0"]["tokens"][0] += 1
    log.write_text("\n".join(lines[:at] + [json.dumps(bad)] + lines[at + 1 :]) + "\n")
    params.write_text(more.replace("chunked", "eager"))
    with pytest.raises(TokenMismatch, match="request r0"):
        search_params_file(params, log=log, note=lambda _: None)
    for edit, said in (
        (lambda v: v["r0"].update(tokens=v["r0"]["tokens"][:-1]), "kept reference of r0 is damaged"),
        (lambda v: v["r0"]["margin"].__setitem__(0, "x"), "kept reference of r0 is damaged"),
        (lambda v: v["r0"].pop("runner_up"), "kept reference of r0 is damaged"),
        (lambda v: v.pop("r0"), "kept references are for other requests than this rep's"),
    ):  # a hand-edited shape: one line naming the log, not a TypeError inside the gate
        bad = json.loads(lines[at])
        edit(bad["value"])
        log.write_text("\n".join(lines[:at] + [json.dumps(bad)] + lines[at + 1 :]) + "\n")
        with pytest.raises(InputError, match=f"^search log '{log}': its {said}") as e:
            search_params_file(params, log=log, note=lambda _: None)
        assert "\n" not in str(e.value) and str(e.value).endswith("use a new log")


def test_the_cli_pairs_search_with_its_log(tmp_path, capsys):
    from pdlib.__main__ import main

    for argv in (["--search"], ["--log", str(tmp_path / "log.jsonl")]):
        assert main(["serve", "--params", "params/serve-search-smoke-cpu.yaml", *argv]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == ["error: serve: --search and --log go together (the log is where a search resumes from)"]
    assert not (tmp_path / "log.jsonl").exists()
    assert main(["serve", "--params", "params/serve-search-smoke-cpu.yaml", "--from-log"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: serve: --from-log reports a search's log: give it with --search and --log"
    ]
    log = ["--search", "--log", str(tmp_path / "log.jsonl"), "--from-log"]
    assert main(["serve", "--params", "params/serve-search-smoke-cpu.yaml", *log]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --from-log: no search log at") and "log.jsonl" in err[0]
    assert not (tmp_path / "log.jsonl").exists()
    assert main(["notebooks", "--params", "params/smoke-cpu.yaml", "--search-report", "x.json"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: notebooks --search-report is for notebook 05: alone or with --serve REPORT"
    ]


def test_the_cli_runs_the_policies_and_peers_it_is_given(tmp_path, capsys):
    """--policies and --peers replace the params file's, for a plain serve and for a search (a log resumed with
    others measures only theirs); a name the file could not hold is refused the same way, in one line."""
    from pdlib.__main__ import main

    read_report = lambda path: json.loads(read_text(path))  # noqa: E731
    params = tmp_path / "p.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed]\npeers: [mlx-lm-fp32@chunk]\n"
        "workload: {source: poisson, rate: 1.0, n: 3, seed: 0, prompt: 20, output: 2}\n"
        "search: {lo: 40, hi: 160, reps: 1, precision: 1.0, max_per_rep: 2, criteria: [capacity]}\n"
    )
    out = tmp_path / "serve.json"
    assert (
        main(["serve", "--params", str(params), "--policies", "chunked", "eager", "--peers", "--output", str(out)]) == 0
    )
    assert [r["policy"] for r in read_report(out)["runs"]] == ["chunked", "eager"]
    log, found = tmp_path / "log.jsonl", tmp_path / "search.json"
    argv = ["serve", "--params", str(params), "--search", "--log", str(log), "--output", str(found)]
    assert main([*argv, "--policies", "chunked", "--peers"]) == 0
    assert {s["policy"] for s in read_report(found)["searches"]} == {"chunked"}
    assert {pt["policy"] for pt in logged_points(log)} == {"chunked"}
    capsys.readouterr()
    assert main(["serve", "--params", str(params), "--policies", "sjf", "--output", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: policies:") and "sjf" in err[0] and "chunked" in err[0]
    assert main(["serve", "--params", str(params), "--peers", "mlx-lm-fp16@2", "--output", str(tmp_path / "y")]) == 2
    assert capsys.readouterr().err.startswith("error:") and not (tmp_path / "x.json").exists()
    assert not (tmp_path / "y").exists()


def test_slo_mixed_runs_with_one_fit_per_log(tmp_path, monkeypatch):
    """The slo policy's step-cost fit is made at the search's first slo-mixed point and kept in the log: a later
    command's points run with that fit, not a new one."""
    params = tmp_path / "slo.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [slo-mixed]\n"
        "workload: {source: poisson, rate: 1.0, n: 3, seed: 0, prompt: 20, output: 2}\n"
        "search: {lo: 40, hi: 160, reps: 1, precision: 1.0, max_per_rep: 1, criteria: [capacity]}\n"
    )
    log = tmp_path / "log.jsonl"
    search_params_file(params, log=log, note=lambda _: None)
    (fit,) = [json.loads(x)["value"] for x in log.read_text().splitlines() if x.startswith('{"kept":"slo-fit"')]
    monkeypatch.setattr(serve_search, "slo_budget", lambda *a, **k: pytest.fail("fitted again"))
    params.write_text(params.read_text().replace("max_per_rep: 1", "max_per_rep: 3"))
    again = search_params_file(params, log=log, note=lambda _: None)
    assert again["measurements"]["new"] >= 1
    points = logged_points(log)
    assert len(points) >= 2 and all(pt["gate"]["slo_policy"] == fit for pt in points)
    lines = log.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('{"kept":"slo-fit"'))
    params.write_text(params.read_text().replace("reps: 1", "reps: 2"))  # rep 1's points need the fit
    for edit, said in (
        (lambda v: v.update(tbt_ms=-1.0), "tbt_ms -1.0"),
        (lambda v: v["cost"].update(a=float("nan")), "cost a nan"),
        (lambda v: v["cost"].pop("points"), "cost fields"),
        (lambda v: v["cost"].update(extra=1), "cost fields"),
    ):  # a hand-edited fit: one line naming the log
        bad = json.loads(lines[at])
        edit(bad["value"])
        log.write_text("\n".join(lines[:at] + [json.dumps(bad)] + lines[at + 1 :]) + "\n")
        with pytest.raises(InputError, match=f"^search log '{log}': its kept slo fit is damaged \\({said}") as e:
            search_params_file(params, log=log, note=lambda _: None)
        assert "\n" not in str(e.value)


def test_the_full_checks_run_once_per_policy_and_rate(tmp_path):
    """Every point passes the token gate; the replay with the full checks runs on one point per policy and rate
    (the first measured there, of any rep), as many times as there are rates, not points."""
    params = tmp_path / "two.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed]\nreplay_requests: 1\n"
        "workload: {source: poisson, rate: 1.0, n: 3, seed: 0, prompt: 20, output: 2}\n"
        "search: {lo: 40, hi: 160, start: 80, reps: 2, precision: 1.0, max_per_rep: 2, criteria: [capacity]}\n"
    )
    log = tmp_path / "log.jsonl"
    search_params_file(params, log=log, note=lambda _: None)
    points = logged_points(log)
    by_rate: dict = {}
    for pt in points:
        by_rate.setdefault(pt["rate"], []).append(pt)
    assert any(len(pts) == 2 for pts in by_rate.values())  # both reps started at 80
    for pts in by_rate.values():
        assert ["replay" in pt["gate"] for pt in pts] == [True] + [False] * (len(pts) - 1)
        assert [pt["gate"]["checks"] for pt in pts[1:]] == ["tokens"] * (len(pts) - 1)


def test_a_point_out_of_device_memory_fails_for_memory_and_the_search_goes_on(tmp_path, params, monkeypatch):
    """On an H100 mlx-lm's FP32 batching ran out of memory at 2x the conversation trace: such a point is recorded
    as failing every bound, its loss named memory, and the searches go on; any other error still stops them."""
    fake = Fake()

    def measure(bench, policy, rate, rep, admit=None):
        if policy.startswith("mlx-lm") and rate > 1:
            bench.held_bytes = 3 * 2**30  # what the process held as the run began: the report says it
            raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")
        return fake(bench, policy, rate, rep, admit)

    monkeypatch.setattr(serve_search, "measure", measure)
    notes = []
    report = search_params_file(params, output=tmp_path / "out.json", log=tmp_path / "log.jsonl", note=notes.append)
    peer = [x for x in report["searches"] if x["peer"]]
    assert len(peer) == 4 and all(x["result"]["value"] <= 1 for x in peer)
    lost = [x["result"]["limit"] for x in peer if x["result"]["limit"] is not None]
    assert lost and all(lim["causes"] == ["memory"] and lim["rate"] > 1 for lim in lost)
    said = "ran out of device memory (3 GiB in use at most, 3 GiB of it as it began) -> memory"
    assert all(said in limit_text(lim) for lim in lost)
    oom = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()[1:]]
    oom = [r for r in oom if "out_of_memory" in r["gate"]]
    assert oom and all(r["summary"]["attain_strict"] == 0 and np.isnan(r["summary"]["tbt_p99_ms"]) for r in oom)
    assert any("out of device memory" in n for n in notes)
    policies = [x for x in report["searches"] if not x["peer"]]  # untouched by the peer's memory
    assert all(x["result"]["status"] == "found" for x in policies)

    def broken(bench, policy, rate, rep, admit=None):
        raise RuntimeError("an unrelated failure")

    monkeypatch.setattr(serve_search, "measure", broken)
    with pytest.raises(RuntimeError, match="unrelated"):
        search_params_file(params, log=tmp_path / "other.jsonl")


def test_a_peers_earlier_points_count_unless_they_ran_out_of_memory(tmp_path, params, monkeypatch):
    """Points of a peer logged before PEER_RULE (no `rule`) count where they ran; those that ran out of memory,
    perhaps for the engine's memory still held then, are measured again (a report from the log alone says so),
    and the searches go on from what they find."""
    fake, log = Fake(), tmp_path / "log.jsonl"

    def measure(bench, policy, rate, rep, admit=None):
        if policy.startswith("mlx-lm") and rate > 1:
            raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")
        return fake(bench, policy, rate, rep, admit)

    monkeypatch.setattr(serve_search, "measure", measure)
    search_params_file(params, log=log, note=lambda _: None)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    peer = [r for r in lines if str(r.get("policy")).startswith("mlx-lm")]
    assert peer and all(r["rule"] == search_rules.PEER_RULE for r in peer)
    for r in peer:  # as the log was before the rule
        del r["rule"]
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    oom = {(r["policy"], r["rate"], r["rep"]) for r in peer if "out_of_memory" in r["gate"]}
    assert oom and len(oom) < len(peer)
    notes = []
    part = search_params_file(params, log=log, note=notes.append, from_log=True)
    assert part["stopped"]["policy"].startswith("mlx-lm") and part["stopped"]["reason"] == "not in the log"
    assert any(f"{len(oom)} points of the log were measured under another rule; not used" in n for n in notes)
    fake.calls.clear()
    monkeypatch.setattr(serve_search, "measure", fake)  # memory enough now
    again = search_params_file(params, log=log, note=lambda _: None)
    called = [(p, grid_rate(r), rep) for p, r, rep in fake.calls]
    ran = {(r["policy"], r["rate"], r["rep"]) for r in peer} - oom
    assert oom & set(called) and not ran & set(called) and len(called) == len(set(called))  # the rest reused
    assert all("memory" not in (x["result"]["limit"] or {}).get("causes", []) for x in again["searches"])


def test_an_engine_that_ran_out_of_memory_is_gone_before_the_next_peer_runs(tmp_path, monkeypatch):
    """A policy's run that ran out of memory leaves its engine in the exception's traceback and its model in
    reference cycles: it is released and collected outside the except clause, so the next engine, or the peer
    after it, runs without it, with no wait for Python's next collection."""
    models, seen, runs = [], [], [0]
    real_init, real_serve_once, real_peer_once = Engine.__init__, serve.serve_once, serve_search.peer_once

    def init(self, *args, **kw):
        seen.append([m() is not None for m in models])  # the engines made before this one
        real_init(self, *args, **kw)
        models.append(weakref.ref(self.model))

    def serve_once(engine, *args, **kw):
        runs[0] += 1
        if runs[0] >= 2:  # the warmup runs, then every run is out of memory
            raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")
        return real_serve_once(engine, *args, **kw)

    def peer_once(*args, **kw):
        seen.append([m() is not None for m in models])
        return real_peer_once(*args, **kw)

    monkeypatch.setattr(Engine, "__init__", init)
    monkeypatch.setattr(serve, "serve_once", serve_once)
    monkeypatch.setattr(serve_search, "peer_once", peer_once)
    gc.disable()
    try:
        params, log, report = small_search(tmp_path)
    finally:
        gc.enable()
    points = logged_points(log)
    assert any("out_of_memory" in p["gate"] and p["policy"] == "mixed" for p in points)
    assert len(models) >= 2 and len(seen) > len(models) and all(alive == [False] * len(alive) for alive in seen)


@pytest.mark.parametrize(
    "text, oom",
    [
        ("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory", True),
        ("[metal::malloc] Resource limit (499000) exceeded.", True),
        ("Attempting to allocate 9 bytes which is greater than the maximum allowed buffer size", True),
        ("[cuda] kernel launch failed", False),
    ],
)
def test_what_counts_as_out_of_memory(text, oom):
    from pdlib.errors import ChecksOutOfMemory, RunFailure, out_of_memory

    assert out_of_memory(RuntimeError(text)) is oom
    assert not out_of_memory(ValueError(text))  # MLX says it as a RuntimeError
    assert out_of_memory(RunFailure(text)) is oom  # a worker's failure carrying MLX's: the run's memory
    assert not out_of_memory(ChecksOutOfMemory(text))  # the checks' (a replay's): not the run's memory


def test_a_search_with_fewer_caches_than_requests_runs_each_rep_through_the_gate(tmp_path, monkeypatch):
    """Memory for 2 caches of 4 requests a rep (serve.py, Memory): the search's one engine makes 2, every point's
    requests wait for them, and the next rep's requests take the same caches."""
    from pdlib.run.serve import kv_cache_bytes
    from pdlib.weights import load_model

    one = kv_cache_bytes(load_model("synthetic:tiny"), requests=1, capacity=24 + 3)
    monkeypatch.setenv("PDLIB_KV_CACHE_GIB", str(2 * one / 2**30))
    params = tmp_path / "mem.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed, slo-mixed]\npeers: []\nwarmups: 0\n"
        "workload: {source: poisson, rate: 1.0, n: 4, seed: 0, prompt: 24, output: 3}\n"
        "search: {lo: 20000, hi: 40000, reps: 2, precision: 1.0, max_per_rep: 2, criteria: [capacity],"
        " slo: {decode_ms: 1.0, ttft_ms: 100}}\n"
    )
    log = tmp_path / "log.jsonl"
    report = search_params_file(params, output=tmp_path / "out.json.gz", log=log, note=lambda _: None)
    assert report["warm"]["slots"] == 2
    points = logged_points(log)
    assert {pt["rep"] for pt in points} == {0, 1} and {pt["policy"] for pt in points} == {"mixed", "slo-mixed"}
    for pt in points:
        assert pt["gate"]["near_ties"] == [] and pt["loss"]["peak_requests"] >= 1
        assert pt["loss"]["cache_waits"] >= 1  # 4 requests within ~1 ms, 2 caches: a step takes longer


def test_a_replay_out_of_device_memory_stops_the_search_and_logs_no_point(tmp_path, monkeypatch):
    """The replay's memory is the checks', not the policy's: the command stops with one line, the timed run is
    not logged as a point failing for memory, and the points before it stay in the log."""
    from pdlib.errors import ChecksOutOfMemory
    from pdlib.run.validate import Gate

    params = tmp_path / "two.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed]\nreplay_requests: 1\n"
        "workload: {source: poisson, rate: 1.0, n: 3, seed: 0, prompt: 20, output: 2}\n"
        "search: {lo: 40, hi: 160, start: 80, reps: 1, precision: 1.0, max_per_rep: 2, criteria: [capacity]}\n"
    )
    log = tmp_path / "log.jsonl"
    real, replays = Gate.on_step, []

    def on_step(self, *args, **kw):  # the second point's replay runs out of memory
        if not replays or replays[-1] is not self:
            replays.append(self)
        if len(replays) == 2:
            raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")
        return real(self, *args, **kw)

    monkeypatch.setattr(Gate, "on_step", on_step)
    with pytest.raises(ChecksOutOfMemory, match=r"^the replay of mixed's steps .* ran out of device memory"):
        search_params_file(params, output=tmp_path / "out.json", log=log, note=lambda _: None)
    points = logged_points(log)
    assert len(points) == 1 and "replay" in points[0]["gate"] and len(replays) == 2
    assert not any("out_of_memory" in p["gate"] for p in points) and not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    "made, said",
    [("Reference", "the FP32 reference of the replays"), ("reference_sequences", "rep 0's FP32 references")],
)
def test_references_out_of_device_memory_stop_the_search_too(tmp_path, monkeypatch, made, said):
    """The references are made beside the engine's caches too (the replays' model on the first replay, a rep's
    token-gate references where the log lacks them): running out there is the checks' as well."""
    from pdlib.errors import ChecksOutOfMemory

    params = tmp_path / "one.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed]\nreplay_requests: 1\n"
        "workload: {source: poisson, rate: 1.0, n: 3, seed: 0, prompt: 20, output: 2}\n"
        "search: {lo: 40, hi: 160, start: 80, reps: 1, precision: 1.0, max_per_rep: 2, criteria: [capacity]}\n"
    )

    def oom(*args, **kw):
        raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")

    monkeypatch.setattr(serve_search, made, oom)
    with pytest.raises(ChecksOutOfMemory, match=rf"^{said} .*ran out of device memory .*: the checks', not the run"):
        search_params_file(params, log=tmp_path / "log.jsonl", note=lambda _: None)
    assert logged_points(tmp_path / "log.jsonl") == []

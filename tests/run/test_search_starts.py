"""Searches that begin where another search report found each value (pdlib.run.search_starts, `serve --search
--start-from`): the same values in fewer points, the starts kept in the log so a resumed or composed search takes
the same path and survives a change of reps, floor or hi; a report that is not one, disagrees with the kept
starts or would restart a run the log holds points of, refused in one line before any point; and a peer's warmup
above its point's rate that runs out of memory runs again at the point's rate (search_workload.warm_up).

    .venv/bin/python -m pytest -q tests/run/test_search_starts.py
"""

import json

import numpy as np
import pytest
from run.test_serve_search import BASE, PARAMS, PRECISION, SLOS, Fake, logged_points, threshold  # tests/ on sys.path

from pdlib.__main__ import main
from pdlib.errors import InputError
from pdlib.report.io import sha256_file
from pdlib.run import serve_search
from pdlib.run.search_report import SCHEMA, search_table
from pdlib.run.search_starts import KIND, start_key, start_rates, starts_from_report
from pdlib.run.search_workload import warm_up
from pdlib.run.serve_params import search_settings
from pdlib.run.serve_search import search_params_file

CRITERIA = ("capacity", "goodput")


def quiet(_):
    pass


def made_report(path, values: dict, status: str = "found"):
    """A search report naming only what starts read: each run's value, the same at every SLO and criterion."""
    searches = [
        {"policy": run, "slo": slo, "criterion": c, "result": {"value": v, "status": status}}
        for run, v in values.items()
        for slo in SLOS
        for c in CRITERIA
    ]
    path.write_text(json.dumps({"schema": SCHEMA, "searches": searches}))
    return path


@pytest.fixture
def fake(monkeypatch):
    f = Fake()
    monkeypatch.setattr(serve_search, "measure", f)
    return f


@pytest.fixture
def far(tmp_path):
    """The fake's params with the searches starting at hi, far above every threshold (2-40)."""
    path = tmp_path / "far.yaml"
    path.write_text(PARAMS.replace("precision:", "start: 64, precision:"))
    return path


def test_a_report_gives_each_search_its_value_within_floor_and_hi(tmp_path):
    settings = search_settings({"lo": 0.25, "hi": 16, "floor": 0.03125, "reps": 5})
    got = {}
    for status, value in {"found": 0.149, "none": 0.0, "at_least": 64.0, "budget": 0.0}.items():
        p = made_report(tmp_path / f"{status}.json", {"x": value}, status)
        got[status] = starts_from_report(p)
        assert got[status]["from"] == {"path": str(p), "sha256": sha256_file(p)}
    keys = {start_key(s, c) for s in SLOS for c in CRITERIA}
    assert got["found"]["runs"]["x"] == {k: {"value": 0.149, "reps": []} for k in keys}
    rates = {k: [start_rates(e, settings) for e in g["runs"]["x"].values()] for k, g in got.items()}
    assert rates["found"] == [[0.149] * 5] * 4
    assert rates["none"] == rates["budget"] == [[0.03125] * 5] * 4  # none passed: this search's floor
    assert rates["at_least"] == [[16.0] * 5] * 4  # every rate passed: this search's hi
    # each rep at its own highest passing rate: none -> floor, all -> hi, a rep the report lacks at its value
    reps = [{"rep": 0, "lo": 1.19, "status": "bracketed"}, {"rep": 1, "lo": None, "status": "none_pass"}]
    reps += [{"rep": 2, "lo": 32.0, "status": "all_pass"}, {"rep": 3, "lo": None, "status": ["budget"]}]
    one = {"policy": "x", "slo": "strict", "criterion": "capacity", "result": {"value": 0.5, "status": "found"}}
    one["result"]["reps"] = reps
    (tmp_path / "reps.json").write_text(json.dumps({"schema": SCHEMA, "searches": [one]}))
    entry = starts_from_report(tmp_path / "reps.json")["runs"]["x"]["strict/capacity"]
    assert entry == {"value": 0.5, "reps": [1.19, "floor", "hi", None]}  # as the report says it, not yet clamped
    assert start_rates(entry, settings) == [1.19, 0.03125, 16.0, 0.5, 0.5]
    assert start_rates(entry, {**settings, "reps": 2, "floor": None, "hi": 1}) == [1.0, 0.25]


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not JSON"),
        ('{"schema": "pdlib.serve/1", "searches": []}', "not a search report"),
        (json.dumps({"schema": SCHEMA, "searches": [{"policy": "chunked", "slo": "strict"}]}), "searches.0. needs"),
        (
            json.dumps(
                {
                    "schema": SCHEMA,
                    "searches": [{"policy": "x", "slo": "strict", "criterion": "tpot", "result": {"value": 1}}],
                }
            ),
            "searches.0. needs",
        ),
        (
            json.dumps(
                {
                    "schema": SCHEMA,
                    "searches": [{"policy": "x", "slo": "loose", "result": {"value": 1, "status": "found"}}],
                }
            ),
            "searches.0. needs",
        ),
    ],
)
def test_what_is_not_a_search_report_is_refused_in_one_line(tmp_path, text, message):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(InputError, match=message) as e:
        starts_from_report(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    with pytest.raises(InputError, match="missing.json: cannot read search report"):
        starts_from_report(tmp_path / "missing.json")


def test_searches_from_a_reports_values_find_the_same_in_fewer_points(tmp_path, far, fake):
    first = search_params_file(far, output=tmp_path / "a.json", log=tmp_path / "a.jsonl", note=quiet)
    n_first = len(fake.calls)
    fake.calls.clear()
    log = tmp_path / "b.jsonl"
    report = search_params_file(far, output=tmp_path / "b.json", log=log, note=quiet, start_from=tmp_path / "a.json")
    assert 0 < len(fake.calls) < n_first / 2
    assert report["start_from"] == {"path": str(tmp_path / "a.json"), "sha256": sha256_file(tmp_path / "a.json")}
    for x, y in zip(first["searches"], report["searches"], strict=True):
        assert y["result"]["start"] == [r["lo"] for r in x["result"]["reps"]] and x["result"]["start"] == 64.0
        assert y["result"]["near"] and not x["result"]["near"]
        want = threshold(y["policy"], 1, y["slo"], y["criterion"])
        assert want / (1 + PRECISION) <= y["result"]["value"] <= want
    kept = [json.loads(line) for line in log.read_text().splitlines() if '"kept":"starts"' in line.replace(" ", "")]
    assert [k["key"]["run"] for k in kept] == list(BASE) and all(k["kept"] == KIND for k in kept)
    # resumed without --start-from: the kept starts, the same path, nothing measured; composed from the log alike
    fake.calls.clear()
    again = search_params_file(far, log=log, note=quiet)
    composed = search_params_file(far, log=log, note=quiet, from_log=True)
    assert fake.calls == [] and again["measurements"]["new"] == 0 and composed["stopped"] is None
    for r in (again, composed):
        assert [x["result"]["points"] for x in r["searches"]] == [x["result"]["points"] for x in report["searches"]]
    assert again["start_from"] is None and composed["start_from"] is None  # none given; each search says its own
    said = f"searches began at each rep's value in {tmp_path / 'a.json'}: chunked, mixed, mlx-lm-bf16@32"
    assert said in search_table(report) and said in search_table(again) and "began at" not in search_table(first)
    assert all(x["start_from"]["path"] == str(tmp_path / "a.json") for x in again["searches"])
    # the kept starts are the report's own, mapped onto the params in use: more reps resume measuring only the
    # new one; a lower hi starts each search within it
    more, lower = tmp_path / "more.yaml", tmp_path / "lower.yaml"
    more.write_text(far.read_text().replace("reps: 3", "reps: 4"))
    lower.write_text(more.read_text().replace("hi: 64", "hi: 32").replace("start: 64", "start: 32"))
    fake.calls.clear()
    four = search_params_file(more, log=log, note=quiet, start_from=tmp_path / "a.json")
    assert fake.calls and {c[2] for c in fake.calls} == {3}
    assert all(len(x["result"]["reps"]) == 4 and x["result"]["near"] for x in four["searches"])
    capped = search_params_file(lower, log=log, note=quiet)
    assert all(x["result"]["near"] and max(np.atleast_1d(x["result"]["start"])) <= 32 for x in capped["searches"])


def test_starts_other_than_the_kept_ones_are_refused_before_any_point(tmp_path, far, fake):
    log = tmp_path / "log.jsonl"
    first = made_report(tmp_path / "a.json", {"mixed": 8.0})
    search_params_file(far, log=log, note=quiet, start_from=first, policies=["mixed"], peers=[])
    lines = log.read_text()
    # another report: its starts for mixed (not the first run) differ; nothing measured, nothing kept for chunked
    other = made_report(tmp_path / "b.json", {"chunked": 4.0, "mixed": 2.0})
    fake.calls.clear()
    with pytest.raises(InputError, match=r"searches of mixed started from .*a\.json .*give that report or none"):
        search_params_file(far, log=log, note=quiet, start_from=other)
    with pytest.raises(InputError, match="--from-log takes each run's starts from the log"):
        search_params_file(far, log=log, note=quiet, from_log=True, start_from=other)
    assert fake.calls == [] and log.read_text() == lines
    # starts for a run the log holds points of, searched from the params' start: refused too
    search_params_file(far, log=log, note=quiet, policies=["chunked"], peers=[])
    lines, fake.calls = log.read_text(), []
    with pytest.raises(InputError, match="the log holds points of chunked searched from the params' start"):
        search_params_file(far, log=log, note=quiet, start_from=made_report(tmp_path / "c.json", {"chunked": 4.0}))
    assert fake.calls == [] and log.read_text() == lines
    # the same starts again (the same report, or another agreeing with the kept ones) are taken
    again = made_report(tmp_path / "d.json", {"mixed": 8.0})
    search_params_file(far, log=log, note=quiet, start_from=again, policies=["mixed"], peers=[])
    assert fake.calls == []
    # a kept value damaged by hand: one line naming the log
    damaged = lines.replace('"value":8.0', '"value":"up"').replace('"value": 8.0', '"value": "up"')
    assert damaged != lines
    log.write_text(damaged)
    with pytest.raises(InputError, match=r"search log .*log\.jsonl: the starts kept for mixed are damaged"):
        search_params_file(far, log=log, note=quiet)


def test_the_cli_takes_start_from_only_with_a_search(tmp_path, capsys, far, fake):
    report = made_report(tmp_path / "a.json", {"chunked": 4.0})
    assert main(["serve", "--params", str(far), "--start-from", str(report)]) == 2
    said = capsys.readouterr().err.strip()
    assert said == f"error: serve: --start-from {report} sets where searches begin: give it with --search"
    log = tmp_path / "log.jsonl"
    args = ["serve", "--params", str(far), "--search", "--log", str(log), "--start-from", str(tmp_path / "no.json")]
    assert main(args) == 2 and capsys.readouterr().err.strip().startswith(f"error: {tmp_path / 'no.json'}: cannot read")
    assert main([*args[:-1], str(report)]) == 0 and "searches began at each rep's value in" in capsys.readouterr().out
    assert any(r["policy"] == "chunked" for r in logged_points(log))


class OutOfMemory:
    """run's stand-in: out of device memory on the workloads named, else it records the run."""

    def __init__(self, failing):
        self.failing, self.calls = failing, []

    def __call__(self, w):
        self.calls.append(w)
        if w in self.failing:
            raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")


def test_a_warmup_out_of_memory_above_the_points_rate_runs_again_at_it():
    high, own, released = "at 1x", "at 1/32x", []
    run = OutOfMemory({high})
    assert warm_up(run, 2, high, own, release=lambda: released.append(len(run.calls))) == own
    assert run.calls == [high, own, own] and released == [1]  # collected before the warmup at the point's rate
    fine = OutOfMemory(set())
    assert warm_up(fine, 2, high, own, release=pytest.fail) == high and fine.calls == [high, high]
    with pytest.raises(RuntimeError, match="out of memory"):  # at the point's own rate: the point's memory
        warm_up(OutOfMemory({own}), 1, own, own, release=pytest.fail)

    def broken(w):
        raise RuntimeError("[cuda] kernel launch failed")

    with pytest.raises(RuntimeError, match="kernel launch"):
        warm_up(broken, 1, high, own, release=pytest.fail)


@pytest.mark.parametrize("fails", [(), (3,), (2,)])
def test_a_peers_first_point_below_the_start_warms_up_at_its_own_rate_when_the_start_is_too_much(
    tmp_path, monkeypatch, fails
):
    """A peer whose search starts under the params' start (another report's value) warms up at the params'
    start; where that runs out of memory, its point is measured after a warmup at its own rate, not logged as out
    of memory; where its own run (call 3) or that warmup (call 2) runs out too, the point says which
    (`out_of_memory_in`) and at what rate its last warmup ran."""
    params = tmp_path / "real.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [chunked]\npeers: [mlx-lm-fp32@chunk]\nwarmups: 1\n"
        "idle: skip\nworkload: {source: poisson, rate: 1.0, n: 4, seed: 0, prompt: 24, output: 3}\n"
        "search: {lo: 40, hi: 160, start: 160, reps: 1, precision: 1.0, max_per_rep: 1, criteria: [capacity],"
        " slo: {decode_ms: 1000, ttft_ms: 100000}}\n"
    )
    real, calls = serve_search.peer_once, []

    def peer_once(model, w, *args, **kw):
        calls.append(w.duration_s)
        if len(calls) == 1 or len(calls) in fails:  # the warmup at 160; that at 40 (2) or the point's run (3)
            raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")
        return real(model, w, *args, **kw)

    monkeypatch.setattr(serve_search, "peer_once", peer_once)
    starts = made_report(tmp_path / "a.json", {"mlx-lm-fp32@16": 40.0})
    log = tmp_path / "log.jsonl"
    search_params_file(params, log=log, note=quiet, start_from=starts)
    (point,) = [p for p in logged_points(log) if p["policy"] == "mlx-lm-fp32@16"]
    assert point["rate"] == 40.0 and point["warmups"] == 1 and point["warmup_rate"] == 40.0
    assert len(calls) == (2 if 2 in fails else 3) and calls[0] < calls[1]  # 160's arrivals span less than 40's
    if fails:
        assert "out_of_memory" in point["gate"] and "held_gib" in point["loss"]
        assert point["out_of_memory_in"] == {(2,): "a warmup", (3,): "its run"}[fails]
    else:
        assert "out_of_memory" not in point["gate"] and point["gate"]["agreement"] == 12


def test_runs_a_report_lacks_are_named_and_begin_where_the_params_say(tmp_path, far, fake):
    notes = []
    only = made_report(tmp_path / "a.json", {"mixed": 8.0})
    report = search_params_file(far, log=tmp_path / "log.jsonl", note=notes.append, start_from=only, peers=[])
    assert f"--start-from {only}: no starts for chunked; they begin where the params say" in notes
    by_run = {x["policy"]: x for x in report["searches"]}
    assert by_run["chunked"]["result"]["start"] == 64.0 and not by_run["chunked"]["result"]["near"]
    assert by_run["mixed"]["start_from"]["path"] == str(only) == report["start_from"]["path"]
    alone = search_params_file(
        far, log=tmp_path / "b.jsonl", note=quiet, start_from=only, policies=["chunked"], peers=[]
    )
    assert alone["start_from"] is None  # no search of this command began from it

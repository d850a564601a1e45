"""analysis.serving and serving_charts on a hand-made serving report (serve_reports.py): the frames against numbers
worked out by hand from its schedules, peers labelled and flagged, the findings' sentences against numbers
computed here, the charts' Vega-Lite fields, a bad report refused in one line, and the rate-search charts on
report.serving.search run on a fake measure."""

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
from serve_reports import MS, make_serve_report, synthetic_searches

from pdlib.analysis import serving as sv
from pdlib.analysis import serving_charts as sc
from pdlib.analysis import serving_search as ss
from pdlib.errors import InputError
from pdlib.report.serving import run_summary, slos_from_step

SLOS = slos_from_step(2.0, 30.0)  # TPOT bound 10 ms strict, 50 ms relaxed; TTFT 30 ms in both
PEER = "mlx-lm fp32 @64"
# By hand from the schedules in serve_reports.py (ms): each run's TTFT and gaps per request.
TTFT = {"chunked": [20, 34, 36], "fifo": [20, 36, 40], PEER: [15, 21, 21]}
GAPS = {
    "chunked": [[2, 12, 12], [2, 12], [2]],
    "fifo": [[2, 2, 2], [2, 2], [2]],
    PEER: [[2, 14, 10], [10, 2], [2]],
}
LAST_EMIT = {"chunked": 58, "fifo": 62, PEER: 43}


@pytest.fixture(scope="module")
def report():
    return make_serve_report(slos=SLOS)


def test_requests_frame_is_the_hand_worked_schedule(report):
    req = sv.requests_frame(report)
    assert list(req["run"].unique()) == ["chunked", "fifo", PEER]
    for run, ttft in TTFT.items():
        r = req[req["run"] == run]
        assert r["ttft_ms"].tolist() == ttft
        assert r["tbt_max_ms"].tolist() == [max(g) for g in GAPS[run]]
        assert r["tpot_ms"].tolist() == pytest.approx([sum(g) / len(g) for g in GAPS[run]])
    c = req[req["run"] == "chunked"].set_index("request")
    assert c.loc["r1", ["prefill_start_ms", "prefill_end_ms"]].tolist() == [22, 44]  # its two chunks' steps
    assert c["check"].tolist() == ["ok"] * 3 and c["agreement"].isna().all()
    p = req[req["run"] == PEER].set_index("request")
    assert p["peer"].all() and p["check"].tolist() == ["agrees 4/4", "agrees 2/3", "agrees 2/2"]


def test_gaps_frame_counts_the_prompt_work_inside_each_gap(report):
    gaps = sv.gaps_frame(report)
    for run, per in GAPS.items():
        assert gaps[gaps["run"] == run]["gap_ms"].tolist() == [g for gs in per for g in gs]
    c = gaps[gaps["run"] == "chunked"]
    # r0 22 -> 34 holds r1's chunk at 22; r0 34 -> 46 r1's at 34; r1 46 -> 58 r2's at 46; the 2 ms gaps none
    assert c["prompt_tokens"].tolist() == [0, 32, 32, 0, 32, 0]
    assert c["prompt_steps"].tolist() == [0, 1, 1, 0, 1, 0]
    assert (gaps[gaps["run"] == "fifo"]["prompt_tokens"] == 0).all()
    assert gaps[gaps["run"] == PEER]["prompt_tokens"].tolist() == [0, 64, 32, 32, 0, 0]


def test_summary_frame_is_run_summary_and_flags_the_peer(report):
    s = sv.summary_frame(report).set_index("run")
    for run in report["runs"]:
        label = sv.run_label(run)
        for k, v in run_summary(run["requests"], SLOS).items():
            assert s.loc[label, k] == pytest.approx(v, nan_ok=True), (label, k)
        for k, v in run["summary"].items():  # the report's own summary: the same numbers
            assert s.loc[label, k] == pytest.approx(v, nan_ok=True)
    for run, last in LAST_EMIT.items():
        assert s.loc[run, "throughput_tok_s"] == pytest.approx(9 / (last / 1000))
        assert s.loc[run, "ttft_p90_ms"] == pytest.approx(np.percentile(TTFT[run], 90))
        assert s.loc[run, "tbt_p99_ms"] == pytest.approx(np.percentile(sum(GAPS[run], []), 99))
    assert s["peer"].tolist() == [False, False, True]
    assert s.loc[PEER, "agree_all"] == 2 and s.loc[PEER, "system"] == "mlx-lm BatchGenerator"
    assert s.loc["fifo", "near_ties"] == 0 and math.isnan(s.loc["fifo", "agree_all"])
    assert s.loc[PEER, "attain_strict"] == 1.0 and s.loc["fifo", "attain_strict"] == pytest.approx(1 / 3)
    table = sv.summary_table(sv.summary_frame(report))
    assert table["kind"].tolist() == ["policy", "policy", "peer"]
    assert table.loc[PEER, "tokens"] == "2/3 agree, 0 lost" and table.loc["fifo", "tokens"] == "gated, 0 near-ties"
    assert table.loc[PEER, "strict SLO met"] == "100%"


def test_an_slo_given_replaces_the_reports_and_a_bad_one_is_refused(report):
    none = make_serve_report(peer=False)
    assert sv.report_slos(none) == {} and not [c for c in sv.summary_frame(none) if c.startswith("attain_")]
    slos = sv.report_slos(none, {"decode_ms": 2.0, "ttft_ms": 30.0})
    assert slos == SLOS and sv.report_slos(report) == SLOS
    assert sv.summary_frame(none, slos)["attain_strict"].tolist() == pytest.approx([1 / 3, 1 / 3])
    with pytest.raises(InputError, match="slo must be None or"):
        sv.report_slos(none, {"decode_ms": 2.0})
    for bad in ([1], {"strict": [1]}, {"strict": {"x": 1}}):  # one line each, no traceback
        with pytest.raises(InputError, match="the report's slos are malformed"):
            sv.report_slos({"slos": bad})


def test_a_lost_request_counts_in_the_run_and_its_missing_tokens_in_no_metric(report):
    r = json.loads(json.dumps(report))
    peer = r["runs"][2]
    peer["requests"][2].update(emit_ns=[], lost=True, agreement=0)  # dropped before its first token
    peer["requests"][1].update(emit_ns=peer["requests"][1]["emit_ns"][:2], lost=True)  # ended short
    sv.check_serving_report(r)
    s = sv.summary_frame(r).set_index("run")
    assert s.loc[PEER, "lost"] == 2 and s.loc[PEER, "n_lost"] == 2 and s.loc[PEER, "n_requests"] == 3
    assert s.loc[PEER, "n_output_tokens"] == 6 and all(
        s.loc[PEER, f"attain_{n}"] <= 1 / 3 for n in ("strict", "relaxed")
    )
    req = sv.requests_frame(r)
    lost = req[(req["run"] == PEER) & (req["request"] == "r2")].iloc[0]
    assert lost["lost"] and lost["emitted"] == 0 and math.isnan(lost["ttft_ms"])
    sc.timeline_chart(r, PEER).to_dict()  # a request without tokens is still a row
    assert "1 of 3 requests equal the FP32 reference in every output; 2 lost." in sv.findings(r)  # r0 agrees


def fmt(v):  # fmt_ms, restated: one decimal from 10 ms, three significant digits below
    return f"{v:.1f} ms" if v >= 10 else f"{v:.3g} ms"


def test_findings_are_the_numbers_computed_here(report):
    text = sv.findings(report)
    ttft = {run: np.percentile(v, 90) for run, v in TTFT.items()}  # chunked 35.6, fifo 39.2, peer 21
    tbt = {run: np.percentile(sum(g, []), 99) for run, g in GAPS.items()}  # chunked 12, fifo 2, peer 13.8
    tput = {run: 9 / (last / 1000) for run, last in LAST_EMIT.items()}
    lines = text.splitlines()
    assert lines[0] == (
        "- 3 requests over 0.02 s (hand-made); 2 policies, every token gated against the FP32 reference "
        "(0 near-ties), and 1 peer (timed, not gated)."
    )
    assert (
        f"- **Lowest TTFT p90:** **{PEER}**, {fmt(ttft[PEER])} (then chunked {fmt(ttft['chunked'])}, "
        f"fifo {fmt(ttft['fifo'])})." in lines
    )
    assert (
        f"- **Lowest pooled TBT p99:** **fifo**, {fmt(tbt['fifo'])} (then chunked {fmt(tbt['chunked'])}, "
        f"{PEER} {fmt(tbt[PEER])})." in lines
    )
    best = f"- **Highest throughput:** **{PEER}**, {tput[PEER]:.0f} tok/s"
    assert f"{best} (then chunked {tput['chunked']:.0f} tok/s, fifo {tput['fifo']:.0f} tok/s)." in lines
    assert (
        f"- **Highest share meeting the strict SLO (TTFT <= 30 ms and TPOT <= 10 ms):** **{PEER}**, 100% "
        f"(then chunked 33%, fifo 33%)." in lines
    )
    # chunked: the three 12 ms gaps held a chunk (median 12 against 2 ms); the first of them is the longest
    assert (
        "- **chunked**: 3 of 6 gaps (50%) had prompt work run inside them; their median is 12.0 ms against 2 ms "
        "for the rest. The longest, 12.0 ms (request r0, before its output 2, at 34.0 ms), held 32 prompt tokens "
        "in 1 step." in lines
    )
    assert "- **fifo**: 0 of 6 gaps (0%) had prompt work run inside them. The longest, 2 ms" in text
    assert (
        f"- **{PEER}** (peer): TTFT p90 {fmt(ttft[PEER])}, {ttft[PEER] / ttft['chunked']:.2f}x chunked's "
        f"{fmt(ttft['chunked'])}; pooled TBT p99 {fmt(tbt[PEER])}, {tbt[PEER] / tbt['fifo']:.1f}x fifo's "
        f"{fmt(tbt['fifo'])}; throughput {tput[PEER]:.0f} tok/s, {tput[PEER] / tput['chunked']:.2f}x chunked's "
        f"{tput['chunked']:.0f} tok/s. 2 of 3 requests equal the FP32 reference in every output; 0 lost." in lines
    )
    alone = sv.findings(make_serve_report(peer=False))
    assert "(peer)" not in alone and "SLO" not in alone and "1 peer" not in alone


def test_a_tie_is_said_only_when_the_numbers_are_equal(report):
    r = json.loads(json.dumps(report))
    twin = json.loads(json.dumps(r["runs"][1]))  # fifo's schedule again: equal numbers
    r["runs"].insert(2, {**twin, "policy": "fifo-again"})
    assert "- **Lowest pooled TBT p99:** **fifo** and **fifo-again** (tied), 2 ms (then chunked" in sv.findings(r)
    r["runs"][2]["requests"][0]["emit_ns"][-1] += 1  # one gap 1 ns longer: still "2 ms" when rounded, no tie
    text = sv.findings(r)
    assert "- **Lowest pooled TBT p99:** **fifo**, 2 ms (then fifo-again 2 ms, " in text


def _encodings(spec) -> set:
    """Every field any layer or panel encodes."""
    found = set()

    def walk(node):
        if isinstance(node, dict):
            for v in (node.get("encoding") or {}).values():
                if isinstance(v, dict) and "field" in v:
                    found.add(v["field"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    return found


def _values(spec, data=None) -> list:
    """A chart's (or a layer's) inline rows: Altair moves them into the top level's datasets."""
    data = spec["data"] if data is None else data
    return data["values"] if "values" in data else spec["datasets"][data["name"]]


def test_latency_chart_has_each_runs_ecdfs(report):
    spec = sc.latency_chart(report).to_dict()
    assert {"x", "ecdf", "tail", "run", "kind"} <= _encodings(spec) and len(spec["hconcat"]) == 3
    rows = pd.DataFrame(_values(spec))
    ttft = rows[(rows["metric"] == "ttft") & (rows["run"] == "fifo")]
    assert ttft["x"].tolist() == [20, 36, 40] and ttft["ecdf"].tolist() == pytest.approx([1 / 3, 2 / 3, 1])
    assert set(rows.loc[rows["run"] == PEER, "kind"]) == {"peer"}
    assert "log" in json.dumps(spec) and "peers dashed" in spec["description"]


def test_timeline_chart_rows_are_the_slice(report):
    spec = sc.timeline_chart(report, "chunked", first=1, n=2).to_dict()
    assert {"x", "x2", "request", "what"} <= _encodings(spec)
    rows = pd.DataFrame(_values(spec))
    assert set(rows["request"]) == {"r1", "r2"}
    assert rows[rows["what"] == "token"].groupby("request")["x"].apply(list).to_dict() == {
        "r1": [44, 46, 58],
        "r2": [56, 58],
    }
    steps = rows[rows["what"] == "prompt step"]
    assert steps[["request", "x", "x2", "n"]].values.tolist() == [
        ["r1", 22, 32, 32],
        ["r1", 34, 44, 32],
        ["r2", 46, 56, 32],
    ]
    assert rows[rows["what"] == "arrival"]["x"].tolist() == [10, 20]
    assert spec["title"].startswith("chunked: requests 1-2 of 3")
    assert sc.timeline_chart(report, PEER).to_dict()["title"].startswith(PEER)  # a peer by its label
    assert sc.timeline_chart(report, "mlx-lm-fp32@64").to_dict()["title"].startswith(PEER)  # or its policy name
    with pytest.raises(InputError, match=r"timeline first = 3, but chunked has 3 requests \(0 .. 2\)"):
        sc.timeline_chart(report, "chunked", first=3)
    with pytest.raises(InputError, match="no run 'eager' in this report; its runs are chunked, fifo, mlx-lm"):
        sc.timeline_chart(report, "eager")


def test_attainment_chart_has_throughput_and_each_slo(report):
    spec = sc.attainment_chart(report).to_dict()
    assert len(spec["hconcat"]) == 3 and {"run", "value"} <= _encodings(spec)
    rows = pd.DataFrame(_values(spec)).set_index(["panel", "run"])["value"]
    assert rows[("strict", PEER)] == 1.0 and rows[("throughput", "fifo")] == pytest.approx(9 / 0.062)
    plain = sc.attainment_chart(make_serve_report(peer=False)).to_dict()
    assert len(plain["hconcat"]) == 1 and "no SLO in the report" in plain["description"]


def test_charts_render_to_png(report):
    from pdlib.analysis import png

    data = png.render(sc.timeline_chart(report))
    assert data.startswith(png.SIGNATURE) and png.size(data)[0] > 0


@pytest.fixture(scope="module")
def searches():
    return synthetic_searches(SLOS["strict"])


def test_rate_curves_chart_plots_every_measured_point(searches):
    spec = sc.rate_curves_chart(searches).to_dict()
    points = sc.search_points(searches)
    assert list(dict.fromkeys(points["metric"])) == ["tbt_p99_ms", "ttft_p90_ms", "attain_strict"]
    assert len(spec["hconcat"]) == 3 and {"rate", "value", "run", "result"} <= _encodings(spec)
    measured = {(run, p["rate"], p["rep"]) for run, results in searches.items() for r in results for p in r["points"]}
    assert set(zip(points["run"], points["rate"], points["rep"])) == measured
    first = pd.DataFrame(_values(spec, spec["hconcat"][0]["layer"][1]["data"]))  # the dots of TBT p99
    assert len(first) == len(points[points["metric"] == "tbt_p99_ms"])
    assert "rate multiplier on a log axis" in spec["description"]


def test_rate_curves_draw_each_slo_bound_where_its_metric_is(searches):
    bounds = sc.slo_bounds(SLOS)
    strict, relaxed = SLOS["strict"], SLOS["relaxed"]
    got = {(m, v): b for m, b, v in bounds.itertuples(index=False)}
    assert (
        got[("tbt_p99_ms", strict.tbt_ms)] == "strict bound" and got[("tbt_p99_ms", relaxed.tbt_ms)] == "relaxed bound"
    )
    assert got[("attain_strict", 0.9)] == "goodput's 90%" and len(bounds) == 6 - (strict.ttft_ms == relaxed.ttft_ms)
    spec = sc.rate_curves_chart(searches, SLOS).to_dict()
    for panel, metric in zip(spec["hconcat"], ("tbt_p99_ms", "ttft_p90_ms", "attain_strict")):
        rules = [lay for lay in panel["layer"] if lay["mark"] == {"type": "rule", "color": "gray", "strokeWidth": 1}]
        (rule,) = rules
        assert sorted(r["value"] for r in _values(spec, rule["data"])) == sorted(
            bounds[bounds["metric"] == metric]["value"]
        )
    assert "grey horizontal rule" in spec["description"]
    assert "grey" not in sc.rate_curves_chart(searches).to_dict()["description"]  # no SLOs given: no bounds


def test_capacity_chart_shows_each_searchs_value_and_ci(searches):
    spec = sc.capacity_chart(searches).to_dict()
    rows = pd.DataFrame(_values(spec))
    for run, results in searches.items():
        for r in results:
            row = rows[(rows["run"] == run) & (rows["criterion"] == r["criterion"])].iloc[0]
            assert row["value"] == r["value"] and [row["ci_low"], row["ci_high"]] == r["ci"] and row["bounded"]
    # chunked's capacity: TTFT p90 = 40 ms * rate * (1 + 0.02 rep) <= 30 ms, rep r's threshold 0.75 / (1 + 0.02 r)
    cap, median = searches["chunked"][0], 0.75 / 1.02
    assert cap["criterion"] == "capacity_strict" and median / 1.05 <= cap["value"] <= median
    assert cap["ci"][0] <= 0.75 / 1.04 and cap["ci"][1] > 0.75
    assert {"ci_low", "ci_high", "value", "text"} <= _encodings(spec) and "coverage >= 75%" in spec["title"]


def test_an_unbounded_ci_is_drawn_to_the_searchs_hi():
    from pdlib.report.serving import Criterion, search

    always = search(
        lambda rate, rep: {"x": 0.0}, meets=Criterion("capacity_always", at_most={"x": 1.0}), lo=1.0, hi=8.0, reps=1
    )
    assert always["status"] == "at_least" and always["ci"][1] is None
    row = sc.search_values({"a": [always]}).iloc[0]
    assert row["ci_high"] == 8.0 and not row["bounded"] and row["text"] == ">= 8"
    sc.capacity_chart({"a": [always]}).to_dict()


@pytest.mark.parametrize(
    "bad, said",
    [
        ([], "non-empty mapping"),
        ({"a": []}, r"searches\['a'\] must be a non-empty list"),
        ({"a": [{"criterion": "c", "value": 1.0, "ci": [0, 1], "points": [{"rate": 1}]}]}, "is not a search result"),
    ],
)
def test_bad_searches_are_refused_in_one_line(bad, said):
    with pytest.raises(InputError, match=said) as e:
        sc.rate_curves_chart(bad)
    assert "\n" not in str(e.value)


# ---- a bad report --------------------------------------------------------------------------------------------
def _mutate(report, change):
    r = json.loads(json.dumps(report))
    change(r)
    return r


BAD = {
    "a two-request report": (lambda r: r.update(schema="pdlib.report/1"), "is not a serving report's"),
    "no runs": (lambda r: r.update(runs=[]), "runs must be a non-empty list"),
    "no step log": (lambda r: r["runs"][0].pop("steps"), r"runs\[0\] \(chunked\): no step log"),
    "unsorted emits": (
        lambda r: r["runs"][1]["requests"][0]["emit_ns"].reverse(),
        r"runs\[1\] \(fifo\): request r0: emit_ns not sorted",
    ),
    "emit before arrival": (
        lambda r: r["runs"][0]["requests"][1]["emit_ns"].__setitem__(0, 5 * MS),
        "request r1: first emit before its arrival",
    ),
    "float stamps": (lambda r: r["runs"][0]["requests"][0]["emit_ns"].__setitem__(0, 1.5), "request r0: bad emit_ns"),
    "nothing emitted": (
        lambda r: r["runs"][0]["requests"][0].update(emit_ns=[]),
        "request r0 emitted nothing and is not marked lost",
    ),
    "a stranger in a step": (
        lambda r: r["runs"][0]["steps"]["work"][0].append(["r9", None]),
        r"step 0: parts must be \[request, prompt tokens or null\]",
    ),
    "two runs, one label": (lambda r: r["runs"][1].update(policy="chunked"), "two runs share a label"),
    "a bad slo": (lambda r: r["slos"]["strict"].update(tpot_ms=-1), "Slo tpot_ms must be a positive finite number"),
    "bad searches": (lambda r: r.update(searches={"chunked": [{"value": 1}]}), r"searches\['chunked'\]\[0\] is not"),
    "a stringly check": (lambda r: r["runs"][0]["requests"][0].update(check="ok"), "request r0: check is not an"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_report_is_refused_in_one_line_naming_the_file(report, case, tmp_path):
    change, said = BAD[case]
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_mutate(report, change)).encode()))
    with pytest.raises(InputError, match=said) as e:
        sv.load_serving_report(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


def test_unreadable_files_are_refused_in_one_line(report, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report))
    assert sv.load_serving_report(good)["runs"][0]["policy"] == "chunked"
    cases = {
        tmp_path / "missing.json": "cannot read serving report",
        tmp_path / "cut.json": r"not valid JSON \(truncated\?\)",
        tmp_path / "cut.json.gz": "damaged gzip",
    }
    (tmp_path / "cut.json").write_text(json.dumps(report)[:100])
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(json.dumps(report).encode())[:50])
    for path, said in cases.items():
        with pytest.raises(InputError, match=said) as e:
            sv.load_serving_report(path)
        assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_a_search_report_is_grouped_by_run_and_checked(searches, tmp_path):
    """The shape `serve --search` writes (a list of {policy, slo, criterion, result}) becomes {run: results}."""
    listed = [
        {"policy": run, "peer": False, "slo": "strict", "criterion": r["criterion"].split("_")[0], "result": r}
        for run, results in searches.items()
        for r in results
    ]
    path = tmp_path / "search.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"schema": sv.SEARCH_SCHEMA, "searches": listed}).encode()))
    assert json.dumps(sv.load_search_report(path)) == json.dumps(searches)  # NaN shares: compared as written
    path.write_text(json.dumps({"schema": "pdlib.serve/1", "searches": listed}))
    with pytest.raises(InputError, match=r"search.json.gz: not a search report \(expected schema"):
        sv.load_search_report(path)
    broken = [{**listed[0], "result": {**listed[0]["result"], "ci": [1]}}]
    path.write_text(json.dumps({"schema": sv.SEARCH_SCHEMA, "searches": broken}))
    with pytest.raises(InputError, match=r"search.json.gz: searches\[.*\]\[0\] is not a search result"):
        sv.load_search_report(path)


def test_the_limits_table_reads_each_searchs_limit(searches):
    """A row per run and search lost within its rates, its numbers from the limit; a result without one (a report
    from before limits were kept) gives no row; a limit missing a field is refused in one line."""
    frame = ss.limits_frame(searches)
    lims = [(run, r["limit"]) for run, rs in searches.items() for r in rs if r["limit"]]
    assert frame["run"].tolist() == [run for run, _ in lims] and len(frame) > 0
    assert frame["lost_at"].tolist() == [lim["rate"] for _, lim in lims]
    first = lims[0][1]["loss"]
    assert frame["stall_share"][0] == pytest.approx(first["tbt_over_strict_prompt"] / first["tbt_over_strict"])
    assert ss.limits_table(frame)["cause"].tolist() == [", ".join(lim["causes"]) for _, lim in lims]
    old = {run: [{k: v for k, v in r.items() if k != "limit"} for r in rs] for run, rs in searches.items()}
    assert ss.limits_frame(old).empty
    run = next(iter(searches))
    bad = {run: [{**searches[run][0], "limit": {"rate": 1.0}}]}
    with pytest.raises(InputError, match=r"limit must hold rate, rep, slo, failed, causes, loss") as e:
        ss.limits_frame(bad)
    assert "\n" not in str(e.value)

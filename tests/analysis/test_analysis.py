"""Known-answer tests for pdlib.analysis.frames on small hand-made reports."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from reports import make_report, ms

from pdlib.analysis import findings
from pdlib.analysis import frames as an
from pdlib.errors import InputError


def one(report, **kw):
    """The single metrics row of a one-policy, one-trial report."""
    m = an.metrics_frame(report, **kw)
    assert len(m) == 1
    return m.iloc[0]


def write(tmp_path, text, name="report.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- loading ----------------------------------------------------------------------------------------
def test_load_round_trip(tmp_path):
    report = make_report()
    assert an.load_report(write(tmp_path, json.dumps(report))) == report


def test_truncated_json_is_one_clear_line(tmp_path):
    text = json.dumps(make_report())
    path = write(tmp_path, text[: len(text) // 2])
    with pytest.raises(InputError, match="not valid JSON") as err:
        an.load_report(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        an.load_report(tmp_path / "nope.json")


@pytest.mark.parametrize("schema", ["pdlib.report/0", None])
def test_wrong_or_missing_schema(tmp_path, schema):
    report = make_report()
    report["schema"] = schema
    path = write(tmp_path, json.dumps(report))
    with pytest.raises(InputError, match=r"report\.json: schema is .* expected 'pdlib\.report/1'"):
        an.load_report(path)


def test_missing_top_level_key():
    report = make_report()
    del report["prompts"]
    with pytest.raises(InputError, match="missing top-level keys: prompts"):
        an.check_report(report)


def test_request_without_emissions():
    report = make_report()
    del report["trials"][0]["requests"]["B"]["emit_ns"]
    with pytest.raises(InputError, match="request B: lacks emit_ns"):
        an.check_report(report, where="x.json")


def test_emission_count_must_match_timed_outputs():
    report = make_report()
    report["trials"][0]["requests"]["A"]["emit_ns"].append(ms(9000)[0])
    with pytest.raises(InputError, match=r"request A: 5 emit_ns for 5 output_ids from timed_from 1"):
        an.check_report(report)


def test_makespan_must_be_last_emission():
    report = make_report()
    report["trials"][0]["makespan_ns"] += 1
    with pytest.raises(InputError, match="makespan_ns .* != last emission"):
        an.metrics_frame(report)


def test_duplicate_trial():
    report = make_report(policies=("eager",))
    report["trials"].append(report["trials"][0])
    with pytest.raises(InputError, match="repeats policy 'eager' trial 1"):
        an.check_report(report)


@pytest.mark.parametrize("issued, wait", [(-1, 0), ("late", 0), (10**15, 10**15), (1.5, 2), (2, 1)])
def test_a_steps_clock_readings_out_of_order_are_refused(issued, wait):
    """t_start <= t_issued <= t_wait <= t_end, all integers (offsets from t_start here)."""
    report = make_report()
    step = next(e for e in report["trials"][0]["events"] if e["kind"] == "prefill")
    step["t_issued_ns"] = step["t_start_ns"] + issued if not isinstance(issued, str) else issued
    step["t_wait_ns"] = step["t_start_ns"] + wait
    with pytest.raises(
        InputError,
        match=r"events\[\d+\]: t_start_ns, t_issued_ns, t_wait_ns, t_end_ns must be "
        r"integers in that order, got",
    ):
        an.check_report(report)
    step["t_issued_ns"], step["t_wait_ns"] = step["t_start_ns"], step["t_end_ns"]
    an.check_report(report)  # at the ends is in order


@pytest.mark.parametrize("cpu", [-1, 1.5, "busy", True, 1001])
def test_a_steps_cpu_time_beyond_its_issue_span_is_refused(cpu):
    """cpu_issue_ns is the host thread's CPU time inside the span t_start..t_issued: an integer in [0, span]."""
    report = make_report()
    step = next(e for e in report["trials"][0]["events"] if e["kind"] == "prefill")
    step["t_issued_ns"], step["t_wait_ns"] = step["t_start_ns"] + 1000, step["t_start_ns"] + 2000
    step["cpu_issue_ns"] = 1000
    an.check_report(report)  # all of the span on the CPU is possible
    step["cpu_issue_ns"] = cpu
    with pytest.raises(
        InputError,
        match=r"events\[\d+\]: cpu_issue_ns .* must be an integer from 0 to "
        r"t_issued_ns - t_start_ns \(1000\)",
    ):
        an.check_report(report)


def test_a_steps_cpu_time_without_its_issue_reading_is_refused():
    report = make_report()
    step = next(e for e in report["trials"][0]["events"] if e["kind"] == "prefill")
    step["cpu_issue_ns"] = 0
    with pytest.raises(InputError, match=r"events\[\d+\]: cpu_issue_ns without t_issued_ns"):
        an.check_report(report)


# ---- frames -----------------------------------------------------------------------------------------
def test_tokens_frame_indexes_and_gaps():
    tok = an.tokens_frame(make_report(policies=("eager",)))
    a, b = tok[tok.request == "A"], tok[tok.request == "B"]
    assert a["index"].tolist() == [1, 2, 3, 4] and b["index"].tolist() == [0, 1, 2, 3, 4]
    assert a["emit_ms"].tolist() == [2500, 2520, 2540, 2560]
    assert a["gap_ms"].tolist() == [2500, 20, 20, 20]  # first gap counts from t0
    assert b["gap_ms"].tolist() == [2400, 110, 20, 20, 20]
    assert list(tok.columns) == ["policy", "trial", "request", "index", "token_id", "emit_ms", "gap_ms"]


def test_events_frame():
    ev = an.events_frame(make_report(policies=("eager",), prompt_tokens=256, chunk_size=64))
    assert list(ev.columns) == ["policy", "trial", "kind", "req", "start", "stop", "t_start_ms", "t_end_ms", "dur_ms"]
    assert ev.iloc[0][["kind", "req", "t_start_ms"]].tolist() == ["reset", "B", 0.0]
    assert (ev.kind == "prefill").sum() == 4 and (ev.kind == "decode").sum() == 4 + 4
    assert np.allclose(ev.dur_ms, ev.t_end_ms - ev.t_start_ms)


def _with_readings(report, split, cpu=0.5):
    """Every step's t_issued_ns and t_wait_ns at the fractions split(policy, trial, event) = (issued, wait)
    of the way from its start to its end, and a `cpu` share of its issuing on the CPU."""
    for t in report["trials"]:
        for e in t["events"]:
            if e["kind"] != "reset":
                span = e["t_end_ns"] - e["t_start_ns"]
                issued, wait = split(t["policy"], t["trial"], e)
                e["t_issued_ns"], e["t_wait_ns"] = (e["t_start_ns"] + round(f * span) for f in (issued, wait))
                e["cpu_issue_ns"] = round(cpu * (e["t_issued_ns"] - e["t_start_ns"]))
    return report


def test_steps_split_into_the_host_the_steps_between_and_the_wait():
    """A trial whose prompt steps went to the host shows it under issue_ms, one whose device was slow under
    wait_ms; a step's parts (A's decode beside B's chunk, listed first as a mixed step lists them) count once,
    as a prompt step."""
    report = make_report(policies=("chunked",), trials=2, prompt_tokens=256, chunk_size=64)
    report = _with_readings(
        report,
        lambda p, trial, e: ((0.8, 0.9) if trial == 1 else (0.1, 0.2)) if e["kind"] == "prefill" else (0.5, 0.75),
    )
    events = report["trials"][0]["events"]
    chunk = next(e for e in events if e["kind"] == "prefill")
    events.insert(events.index(chunk), {**chunk, "kind": "decode", "req": "A", "start": 999, "stop": 1000})
    steps = an.steps_frame(report)
    assert len(steps) == 2 * (4 + 4 + 4) and steps.loc[steps.kind == "prompt", "rows"].tolist()[0] == 64 + 1
    assert steps.loc[steps.kind == "prompt", "prompt_start"].tolist()[:4] == [0, 64, 128, 192]
    assert steps.loc[steps.kind == "decode", "prompt_start"].isna().all()
    assert np.allclose(steps.issue_ms + steps.between_ms + steps.wait_ms, steps.dur_ms)
    times = an.step_times(steps).set_index(["trial", "kind"])
    assert times["steps"].tolist() == [4, 8, 4, 8] and times.index.tolist() == [
        (1, "prompt"),
        (1, "decode"),
        (2, "prompt"),
        (2, "decode"),
    ]
    slow_host, slow_device = times.loc[(1, "prompt")], times.loc[(2, "prompt")]
    assert slow_host.issue_ms == pytest.approx(0.8 * slow_host.dur_ms, rel=1e-3)
    assert slow_device.wait_ms == pytest.approx(0.8 * slow_device.dur_ms, rel=1e-3)
    decode = times.loc[(1, "decode")]  # decodes of 0.5 ms: 0.25 issuing, 0.125 between, 0.125 waiting
    assert [decode.issue_ms, decode.between_ms, decode.wait_ms] == pytest.approx([0.25, 0.125, 0.125])
    assert np.allclose(steps.issue_cpu_ms, 0.5 * steps.issue_ms, atol=1e-6)  # half of each step's issuing
    assert times["issue_cpu_ms"].tolist() == pytest.approx((0.5 * times["issue_ms"]).tolist(), rel=1e-3)


def test_step_table_reads_whole_counts_in_a_fixed_order_and_dashes_without_readings():
    """overlap runs B's prompt elsewhere, so its trials have decode steps only: the counts stay integers and
    the columns stay put."""
    from pdlib.analysis import present

    report = make_report(policies=("overlap", "eager"))
    for t in report["trials"]:
        if t["policy"] == "overlap":
            t["events"] = [e for e in t["events"] if e["kind"] != "prefill"]
    plain = present.step_table(an.step_times(an.steps_frame(report)))
    assert list(plain.columns) == [
        "policy",
        "trial",
        "steps",
        "n",
        "ms",
        "host issuing",
        "of it on the CPU",
        "between",
        "waiting",
    ]
    assert plain.values.tolist()[:2] == [
        ["overlap", "1", "decode", "8", "0.5", "-", "-", "-", "-"],
        ["eager", "1", "prompt", "4", "600", "-", "-", "-", "-"],
    ]
    timed = present.step_table(an.step_times(an.steps_frame(_with_readings(report, lambda *_: (0.5, 0.75), 0.4))))
    assert timed.values.tolist()[0][5:] == ["0.25", "0.1", "0.125", "0.125"]


def test_rows_follow_declared_policy_order():
    # Trial 2 runs chunked first; rows and charts should still list eager first.
    m = an.metrics_frame(make_report(policies=("eager", "chunked"), trials=2))
    assert m[["policy", "trial"]].values.tolist() == [["eager", 1], ["eager", 2], ["chunked", 1], ["chunked", 2]]


# ---- metrics ----------------------------------------------------------------------------------------
def test_single_long_gap():
    # A stalls 2.5 s from t0; B's first token (2.4 s) lands inside that stall, as under eager.
    r = one(make_report(policies=("eager",)))
    assert r.a_gap_max_ms == 2500 and r.a_resume_gap_ms == 2500
    assert r.stalls == 1 and r.stall_excess_ms == 2400
    assert r.a_max_gap_phase == "b_prefill"
    assert r.b_prefill_gaps == 1 and r.b_prefill_gap_max_ms == 2500
    assert r.b_service_gaps == 4 and r.b_service_gap_max_ms == 2500
    assert (r.b_ttft_ms, r.a_completion_ms, r.makespan_ms) == (2400, 2560, 2570)


def test_max_gap_after_b_first_token_is_decode():
    r = one(make_report(policies=("x",), a_emits=ms(10, 20, 150, 400), b_emits=ms(100, 110)))
    assert r.a_gap_max_ms == 250 and r.a_max_gap_phase == "decode"
    # [20, 150] straddles B's first token at 100 ms: it overlaps the prefill interval.
    assert r.b_prefill_gaps == 3 and r.b_prefill_gap_max_ms == 130
    # B's service ends at 110 ms, so the last gap [150, 400] is outside it.
    assert r.b_service_gaps == 3


def test_no_gap_overlaps_prefill_gives_nan_max():
    # B's first token at t0 itself: its prefill interval has no length.
    r = one(make_report(policies=("x",), a_emits=ms(10, 20), b_emits=[0, ms(30)[0]]))
    assert r.b_prefill_gaps == 0 and math.isnan(r.b_prefill_gap_max_ms)


def test_gaps_exactly_at_threshold_are_not_stalls():
    # Far from t0, so float ms would not difference to exactly 100; integer ns do.
    a = ms(51_650.3, 51_750.3, 51_850.3)
    r = one(make_report(policies=("x",), a_emits=a, b_emits=ms(10)))
    assert r.a_gap_max_ms > 100
    m = an.tokens_frame(make_report(policies=("x",), a_emits=a, b_emits=ms(10)))
    assert m[m.request == "A"].gap_ms.tolist()[1:] == [100.0, 100.0]
    assert r.stalls == 1  # only the 51.65 s resumption gap
    flat = one(make_report(policies=("x",), a_emits=ms(100, 200, 300), b_emits=ms(50)))
    assert flat.stalls == 0 and flat.stall_excess_ms == 0
    assert (
        one(make_report(policies=("x",), a_emits=ms(100, 200, 300), b_emits=ms(50)), stall_threshold_ms=99.999).stalls
        == 3
    )


def test_percentiles_with_ties_interpolate_linearly():
    r = one(make_report(policies=("x",), a_emits=ms(10, 20, 30, 40, 90), b_emits=ms(5)))
    # Sorted gaps 10, 10, 10, 10, 50: p95 sits at position 3.8, p99 at 3.96.
    assert r.a_gap_p50_ms == 10 and r.a_gap_max_ms == 50
    assert r.a_gap_p95_ms == pytest.approx(42.0) and r.a_gap_p99_ms == pytest.approx(48.4)


def test_throughput_is_outputs_over_makespan():
    r = one(make_report(policies=("x",), a_emits=ms(100, 200, 300), b_emits=ms(50, 400)))
    assert r.makespan_ms == 400 and r.throughput_tok_s == pytest.approx(5 / 0.4)


def test_bad_threshold_is_a_programming_error_not_input():
    with pytest.raises(ValueError, match="stall_threshold_ms") as err:
        an.metrics_frame(make_report(), stall_threshold_ms=-1)
    assert type(err.value) is ValueError  # the user-facing check is present.stall_threshold


# ---- summaries and ratios ---------------------------------------------------------------------------
def varying(policy, trial):
    """A's resumption gap: eager 2000 + 100*trial ms, chunked a tenth of that."""
    first = 2000 + 100 * trial if policy == "eager" else (2000 + 100 * trial) / 10
    return ms(first, first + 20, first + 40)


def test_summary_frame():
    s = an.summary_frame(an.metrics_frame(make_report(trials=3, a_emits=varying)))
    assert list(s.columns) == ["policy", "metric", "median", "min", "max", "n"]
    row = s[(s.policy == "eager") & (s.metric == "a_gap_max_ms")].iloc[0]
    assert (row["median"], row["min"], row["max"], row["n"]) == (2200, 2100, 2300, 3)
    assert s.policy.unique().tolist() == ["eager", "chunked"]
    assert "a_max_gap_phase" not in set(s.metric) and "trial" not in set(s.metric)


def test_paired_ratio_exact_and_one_trial_has_no_ci():
    a = {"eager": ms(2500, 2520), "chunked": ms(125, 250)}
    per, summ = an.paired_ratios(an.metrics_frame(make_report(a_emits=a)), numerator="eager", denominator="chunked")
    row = per[per.metric == "a_gap_max_ms"].iloc[0]
    assert (row.numerator_value, row.denominator_value, row.ratio) == (2500, 125, 20)
    s = summ.set_index("metric").loc["a_gap_max_ms"]
    assert s.median_ratio == 20 and s.n == 1
    assert math.isnan(s.ci_low) and math.isnan(s.ci_high) and "no bootstrap CI" in s.ci_note
    assert summ.set_index("metric").loc["b_ttft_ms"].median_ratio == 1


def test_bootstrap_ci_with_enough_trials():
    m = an.metrics_frame(make_report(trials=6, a_emits=varying))
    _, s1 = an.paired_ratios(m, numerator="eager", denominator="chunked", columns=("a_gap_max_ms",))
    _, s2 = an.paired_ratios(m, numerator="chunked", denominator="eager")
    r = s1.iloc[0]
    assert r.median_ratio == pytest.approx(10) and r.ci_note == ""
    assert r.ci_low == pytest.approx(10) and r.ci_high == pytest.approx(10)  # all ratios equal
    b = s2.set_index("metric").loc["makespan_ms"]
    assert b.ci_low <= b.median_ratio <= b.ci_high and b.ci_low < b.ci_high
    _, again = an.paired_ratios(m, numerator="chunked", denominator="eager")
    pd.testing.assert_frame_equal(s2, again)  # seeded


def test_unknown_policy_or_metric():
    m = an.metrics_frame(make_report())
    with pytest.raises(ValueError, match="unknown policy 'fifo'; the metrics have eager, chunked") as err:
        an.paired_ratios(m, numerator="fifo", denominator="chunked")
    assert type(err.value) is ValueError
    with pytest.raises(ValueError, match="unknown metric"):
        an.paired_ratios(m, numerator="eager", denominator="chunked", columns=("nope",))


def test_markdown():
    m = an.metrics_frame(make_report())
    _, ratios = an.paired_ratios(m, numerator="eager", denominator="chunked")
    md = findings.metrics_markdown(an.summary_frame(m), ratios=ratios)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]
    assert rows[0] == ["metric", "eager", "chunked"] and set(rows[1][0]) <= set(":-")
    assert ["a_gap_max_ms", "2500 [2500, 2500] n=1", "2500 [2500, 2500] n=1"] in rows
    ratio_head = next(r for r in rows if r[0] == "metric" and "eager / chunked (median)" in r)
    assert ratio_head == ["metric", "eager / chunked (median)", "95% CI", "n", "note"]
    assert ["b_ttft_ms", "1.000", "-", "1", "1 paired trials < 5: no bootstrap CI"] in rows


def test_fifo_gaps_before_b_starts_prefilling_are_not_prefill_gaps():
    """Under fifo B waits for A: A's gaps before B's first prefill chunk must not count as during B's prefill."""
    from pdlib.report.metrics import trial_metrics

    ms_ = 1_000_000
    trial = {
        "policy": "fifo",
        "trial": 1,
        "makespan_ns": 60 * ms_,
        "requests": {
            "A": {"output_ids": [1, 2, 3, 4], "timed_from": 1, "emit_ns": [5 * ms_, 10 * ms_, 15 * ms_]},
            "B": {"output_ids": [7, 8], "timed_from": 0, "emit_ns": [50 * ms_, 60 * ms_]},
        },
        "events": [
            {"kind": "reset", "req": "B", "start": 0, "stop": 0, "t_start_ns": 0, "t_end_ns": 1000},
            {"kind": "prefill", "req": "B", "start": 0, "stop": 64, "t_start_ns": 16 * ms_, "t_end_ns": 50 * ms_},
        ],
    }
    m = trial_metrics(trial)
    assert m["b_prefill_start_ms"] == 16.0 and m["b_prefill_gaps"] == 0 and np.isnan(m["b_prefill_gap_max_ms"])
    assert m["a_max_gap_phase"] == "decode" and m["b_service_gaps"] == 3
    trial["events"][1]["t_start_ns"] = 12 * ms_  # now A's last gap (10-15 ms) overlaps B's prefill
    assert trial_metrics(trial)["b_prefill_gaps"] == 1


def _remote(report, policy, *, site, t_end_ms, transfer=None):
    """Replace `policy`'s B prefill chunks by one remote prefill [0, t_end_ms] (+ a transfer event)."""
    for t in report["trials"]:
        if t["policy"] != policy:
            continue
        ev = [e for e in t["events"] if not (e["req"] == "B" and e["kind"] == "prefill")]
        ev.append(
            dict(
                kind="prefill",
                req="B",
                start=0,
                stop=256,
                remote=True,
                site=site,
                t_start_ns=1_000,
                t_end_ns=ms(t_end_ms)[0],
            )
        )
        if transfer:
            start, end, nbytes = transfer
            ev.append(
                dict(
                    kind="transfer",
                    req="B",
                    start=0,
                    stop=256,
                    bytes=nbytes,
                    mode="whole",
                    t_start_ns=ms(start)[0],
                    t_end_ns=ms(end)[0],
                )
            )
        t["events"] = sorted(ev, key=lambda e: e["t_start_ns"])


def test_remote_frame_reads_overlap_and_disagg_trials_and_nothing_else():
    a = ms(10, 20, 30, 40, 2600)
    report = make_report(policies=("chunked", "overlap", "disagg"), trials=2, a_emits=a)
    _remote(report, "overlap", site="stream", t_end_ms=35)
    _remote(report, "disagg", site="worker", t_end_ms=25, transfer=(2395, 2400, 940_000_000))
    f = an.remote_frame(report)
    assert list(f["policy"]) == ["overlap", "overlap", "disagg", "disagg"] and list(f["trial"]) == [1, 2, 1, 2]
    o, d = f.iloc[0], f.iloc[2]
    assert o["site"] == "stream" and o["prefill_ms"] == pytest.approx(35 - 0.001)
    assert o["a_tokens_during"] == 3 and math.isnan(o["transfer_ms"]) and pd.isna(o["transfer_mode"])
    assert d["site"] == "worker" and d["a_tokens_during"] == 2
    assert d["transfer_ms"] == pytest.approx(5) and d["transfer_mb"] == 940 and d["transfer_gb_s"] == pytest.approx(188)
    assert an.remote_frame(make_report(policies=("eager", "chunked"))).empty

    from pdlib.analysis import present

    table = present.remote_table(f)
    assert list(table.index) == ["overlap", "disagg"] and list(table["trials"]) == [2, 2]
    assert table.loc["disagg", "transfer (GB/s)"] == "188 [188, 188]" and table.loc["overlap", "transfer (ms)"] == "-"
    assert table.loc["overlap", "A's tokens during it"] == "3 [3, 3]"

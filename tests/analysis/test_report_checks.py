"""A report is checked when it is read: its trials equal the validated reference, a policy with trials passed
its gate, every event lies inside its trial, and a peer (timed, never gated) carries its agreement instead."""

import copy
import json
from pathlib import Path

import pytest
from reports import make_report

from pdlib.__main__ import main
from pdlib.analysis import frames as an
from pdlib.errors import InputError
from pdlib.report.checks import agreement, first_difference, mismatch

SMALL = json.loads((Path(__file__).parents[1] / "data" / "small-report.json").read_text())


def small():
    return copy.deepcopy(SMALL)


def refused(report, match):
    with pytest.raises(InputError, match=match) as e:
        an.check_report(report)
    assert "\n" not in str(e.value)


# ---- the gate's token rule, shared with the runner --------------------------------------------------
def test_the_token_rule():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None and mismatch([1, 2, 3], [1, 2, 3]) is None
    assert mismatch([1, 2, 9], [1, 2, 3]) == "differs from the validated reference at output 2: got 9, expected 3"
    assert mismatch([1, 2], [1, 2, 3]) == "differs from the validated reference at output 2: got nothing, expected 3"
    assert [agreement(got, [1, 2, 3]) for got in ([1, 2, 3], [1, 9, 3], [7], [1, 2, 3, 4])] == [3, 1, 0, 3]


# ---- tokens -----------------------------------------------------------------------------------------
def test_an_edited_output_id_of_a_is_refused():
    report = small()
    report["trials"][1]["requests"]["A"]["output_ids"][2] = 9
    refused(
        report,
        r"^report: trials\[1\] \(chunked trial 1\): request A differs from the validated reference at output 2: "
        r"got 9, expected 368$",
    )


def test_bs_ids_reversed_are_refused():
    report = small()
    ids = report["trials"][2]["requests"]["B"]["output_ids"]
    ids.reverse()
    refused(report, r"trials\[2\] .*request B differs from the validated reference at output 0: got 260, expected 215")


def test_an_edited_reference_is_refused():
    report = small()
    report["reference_tokens"]["B"][5] += 1
    refused(
        report,
        r"reference_tokens request B differs from the validated reference at output 5: got 327, expected 326 "
        r"\(validation\['eager'\] tokens\)",
    )
    for v in report["validation"].values():  # without the gate's tokens, the trials no longer equal it
        del v["tokens"]
    refused(report, r"trials\[0\] \(eager trial 1\): request B differs .* at output 5: got 326, expected 327")


def test_a_fabricated_report_equals_its_reference_even_with_uneven_emissions():
    report = make_report(a_emits={"eager": [1, 2, 3], "chunked": [1, 2, 3, 4, 5]})
    an.check_report(report)
    report["trials"][0]["requests"]["A"]["output_ids"][0] += 1
    refused(report, "request A differs from the validated reference at output 0")


# ---- the gate ---------------------------------------------------------------------------------------
def test_a_policy_whose_gate_failed_cannot_have_trials():
    report = small()
    report["validation"]["chunked"].update(passed=False, failure="validation failed for policy 'chunked': ...")
    refused(report, r"policy 'chunked' has trials but its gate did not pass \(validation\['chunked'\] passed is false")


@pytest.mark.parametrize("entry", [None, "yes", {"checks": 1}])
def test_a_policy_with_trials_needs_a_gate_result(entry):
    report = small()
    report["validation"]["chunked"] = entry
    if entry is None:
        del report["validation"]["chunked"]
    refused(report, r"policy 'chunked' has trials but no validation entry|validation\['chunked'\] passed is")


# ---- event stamps -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "index, stamps",
    [
        (1, {"t_start_ns": -1e6}),  # before t0, and not integer ns
        (1, {"t_start_ns": -1_000_000}),
        (-1, {"t_end_ns": 1e15}),
        (-1, {"t_end_ns": 10**15}),  # after the trial's last token
        (0, {"t_start_ns": 200_000}),  # a reset that starts after it ends
        (2, {"t_start_ns": 16_755_872, "t_end_ns": 16_755_900}),  # wholly after the trial
    ],
)
def test_event_stamps_out_of_order_or_outside_the_trial_are_refused(index, stamps):
    report = small()
    report["trials"][0]["events"][index].update(stamps)
    refused(
        report,
        r"trials\[0\] \(eager trial 1\) events\[\d+\]: t_start_ns .*, t_end_ns .*; expected integers with "
        r"0 <= t_start_ns <= t_end_ns <= makespan_ns \(16755871\)$",
    )


def test_event_stamps_at_the_trials_ends_are_fine():
    report = small()
    events, makespan = report["trials"][0]["events"], report["trials"][0]["makespan_ns"]
    events[0]["t_end_ns"] = 0
    events[-1]["t_end_ns"] = makespan
    an.check_report(report)


# ---- peers: timed, not gated ------------------------------------------------------------------------
def peer_report(**agree):
    """small-report with chunked turned into a peer whose B differs from the reference from output 3."""
    report = small()
    del report["validation"]["chunked"]
    for t in report["trials"]:
        if t["policy"] == "chunked":
            t["requests"]["B"]["output_ids"][3:] = [0] * 5
            t.update(peer=True, agreement={"A": 8, "B": 3, **agree})
    return report


def test_a_peer_row_carries_its_agreement_instead_of_equalling_the_reference():
    an.check_report(peer_report())
    assert len(an.metrics_frame(peer_report())) == 4


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: t.pop("agreement"), r'a peer trial needs "agreement"'),
        (lambda t: t["agreement"].update(B=8), r"agreement B is 8; expected 3"),
        (lambda t: t["agreement"].update(A=8.0), r"agreement A is 8.0; expected 8"),
        (lambda t: t.update(peer="yes"), r'"peer" is \'yes\'; expected true'),
        (lambda t: t.pop("peer"), r'has "agreement" but no "peer": true'),
    ],
)
def test_a_peer_row_needs_its_marker_and_a_true_agreement(damage, message):
    report = peer_report()
    damage(report["trials"][1])
    refused(report, message)


def test_a_gated_policy_is_not_passed_off_as_a_peer():
    report = peer_report()
    report["validation"]["chunked"] = {**report["validation"]["eager"], "policy": "chunked", "passed": False}
    refused(report, r"peer policy 'chunked' has a validation entry; expected none")
    report = peer_report()
    last = [t for t in report["trials"] if t["policy"] == "chunked"][-1]
    last.pop("peer"), last.pop("agreement")
    refused(report, r"policy 'chunked' has trials marked peer and trials not; expected all or none")


# ---- through the CLI: one line, exit 2, nothing written ---------------------------------------------
def _edit_a(r):
    r["trials"][0]["requests"]["A"]["output_ids"][2] = 9


def _fail_gate(r):
    r["validation"]["eager"]["passed"] = False


def _late_event(r):
    r["trials"][0]["events"][-1]["t_end_ns"] = 10**15


@pytest.mark.parametrize("damage", [_edit_a, _fail_gate, _late_event])
@pytest.mark.parametrize("command", ["render", "notebooks"])
def test_the_cli_refuses_a_report_that_claims_too_much(tmp_path, capsys, damage, command):
    report = small()
    damage(report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "x"
    source = [str(path)] if command == "render" else ["--report", str(path)]
    assert main([command, *source, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert str(path) in captured.err and captured.out == ""
    assert not out.exists()


# ---- the solo references and the goal's ratios ---------------------------------------------------------------
def test_the_goal_table_divides_each_policys_medians_by_the_solo_references():
    from pdlib.report.metrics import goal_table, trial_metrics

    report = make_report(policies=("eager", "chunked"), trials=3)
    assert goal_table(report, ["eager", "chunked"]) is None  # an older report: no references, no table
    report["solo"] = {"a_decode_ms": 2.0, "a_decode_steps": 64, "b_prefill_s": 0.05, "b_prefill_repeats": 3}
    an.check_report(report)
    rows = {line.split()[0]: line.split()[1:] for line in goal_table(report, ["eager", "chunked"]).splitlines()[3:]}
    for policy in ("eager", "chunked"):
        ms = [trial_metrics(t) for t in report["trials"] if t["policy"] == policy]
        a = sorted(m["a_gap_max_ms"] for m in ms)[1] / 2.0
        b = sorted(m["b_ttft_ms"] for m in ms)[1] / 50.0
        assert rows[policy] == [f"{a:.2f}", f"{b:.2f}", "yes" if a <= 1.5 and b <= 1.5 else "no"]


@pytest.mark.parametrize("solo", [{"a_decode_ms": 2.0}, {"a_decode_ms": 0, "b_prefill_s": 0.1}, "fast"])
def test_a_report_with_broken_solo_references_is_refused(solo):
    report = make_report()
    report["solo"] = solo
    refused(report, "solo needs a_decode_ms and b_prefill_s")

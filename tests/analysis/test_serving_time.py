"""Where a serving run's time goes (pdlib/analysis/serving_time.py), worked out on a hand-made step log with
pipelined (overlapping) steps, a gap with no step, and issue times."""

import math

import pytest

from pdlib.analysis.serving_time import time_frame, time_line
from pdlib.errors import InputError

MS = 1_000_000
D = None
# (t_start, t_issued, t_end) ms, parts: a prompt step, a decode issued under it, a decode after, nothing, a prompt
STEPS = [
    ((0, 3, 10), [["r0", 32]]),
    ((8, 9, 12), [["r1", D]]),
    ((11, 11.5, 14), [["r1", D], ["r2", D]]),
    ((20, 22, 30), [["r2", 16], ["r1", D]]),
]


def run(policy="mixed", steps=STEPS, issued=True, **extra) -> dict:
    s = {
        "work": [w for _, w in steps],
        "t_start_ns": [int(t[0] * MS) for t, _ in steps],
        "t_end_ns": [int(t[2] * MS) for t, _ in steps],
    }
    if issued:
        s["t_issued_ns"] = [int(t[1] * MS) for t, _ in steps]
    return {"policy": policy, "steps": s, "makespan_ns": 30 * MS, "idle_ns": 5 * MS, **extra}


def test_each_kind_counts_its_union_and_decodes_under_a_prompt_count_as_the_prompts():
    (row,) = time_frame({"runs": [run()]}).to_dict("records")
    assert row["prompt_steps_ms"] == 20  # [0, 10] and [20, 30]
    assert row["decode_steps_ms"] == 4  # [8, 14], less [8, 10] under the prompt step
    assert row["no_step_ms"] == 6 and row["waiting_ms"] == 5  # [14, 20]; the loop slept 5 of it
    assert row["host_ms"] == pytest.approx(6.5) and row["host_share"] == pytest.approx(6.5 / 24)
    assert row["prompt_steps_ms"] + row["decode_steps_ms"] + row["no_step_ms"] == row["makespan_ms"] == 30


def test_without_issue_times_or_with_replicas_the_unknowns_are_nan():
    peer = run("mlx-lm-fp32@32", issued=False, peer=True)
    replicas = run("mixed-x2", replicas=2)
    f = time_frame({"runs": [peer, replicas]}).set_index("run")
    assert math.isnan(f.loc["mlx-lm-fp32@32", "host_ms"]) and math.isnan(f.loc["mlx-lm-fp32@32", "host_share"])
    assert math.isnan(f.loc["mixed-x2", "waiting_ms"]) and f.loc["mixed-x2", "host_ms"] == pytest.approx(6.5)


@pytest.mark.parametrize("at", [-1 * MS, 11 * MS])
def test_an_issue_time_outside_its_step_is_refused_in_one_line(at):
    bad = run()
    bad["steps"]["t_issued_ns"][0] = at
    with pytest.raises(InputError, match=r"^runs\[0\] \(mixed\): steps.t_issued_ns must give each step"):
        time_frame({"runs": [bad]})


def test_the_line_says_the_shares():
    line = time_line(time_frame({"runs": [run()]}), "mixed")
    assert line == (
        "**mixed**: of its 0.03 s, 67% in steps with prompt tokens, 13% in decode-only steps, 20% with no step in "
        "flight, 17% waiting for arrivals; the host spent 27% of the time a step was in flight building steps."
    )


def test_the_findings_and_the_notebooks_table_carry_it():
    from serve_reports import make_serve_report

    from pdlib.analysis.serving import findings, run_label
    from pdlib.analysis.serving_time import time_table

    report = make_serve_report()  # chunked, fifo and a peer: no issue times
    text = findings(report)
    assert "**chunked**: of its 0.058 s, 86% in steps with prompt tokens, 14% in decode-only steps, 0% with" in text
    assert "building steps" not in text
    table = time_table(time_frame(report, label=run_label))
    assert list(table["run"]) == ["chunked", "fifo", "mlx-lm fp32 @64"] and set(table["host, of busy"]) == {"-"}

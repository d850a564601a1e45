"""The best policy against mlx-lm per criterion (pdlib/report/serving_versus.py): which runs are compared, the
ratio and its interval from the two CIs, and when the 3x target is met."""

import pytest

from pdlib.report.serving_versus import peer_kind, versus, versus_line


def result(criterion, value, ci):
    return {"criterion": criterion, "value": value, "ci": ci}


def test_peer_names_parse_as_serve_and_the_analysis_spell_them():
    assert peer_kind("mlx-lm-fp32@2048") == ("fp32", 2048) and peer_kind("mlx-lm bf16 @512") == ("bf16", 512)
    assert peer_kind("chunked") is None and peer_kind("mlx-lm-fp16@2048") is None


def test_the_best_policy_meets_the_best_fp32_peer():
    searches = {
        "chunked": [result("capacity_strict", 4.0, [3.0, 5.0]), result("goodput_strict", 2.0, [2.0, None])],
        "mixed": [result("capacity_strict", 6.0, [5.0, 8.0]), result("goodput_strict", 0.5, [0.5, 1.0])],
        "mlx-lm-fp32@2048": [result("capacity_strict", 1.0, [0.5, 2.0]), result("goodput_strict", 0.0, [0.0, 0.5])],
        "mlx-lm-fp32@512": [result("capacity_strict", 2.0, [1.0, 4.0]), result("goodput_strict", 0.0, [0.0, 0.5])],
        "mlx-lm-bf16@2048": [result("capacity_strict", 5.0, [4.0, 6.0])],  # another dtype: not the fp32 row's
    }
    cap, good = versus(searches)
    assert (cap["policy"], cap["peer"]) == ("mixed", "mlx-lm-fp32@512")  # the stronger of each side
    assert cap["ratio"] == 3.0 and cap["ratio_ci"] == [5.0 / 4.0, 8.0 / 1.0] and cap["meets"]
    assert good["policy"] == "chunked" and good["ratio"] is None  # mlx-lm has none: a rate where it has none
    assert good["ratio_ci"] == [2.0 / 0.5, None] and good["meets"]  # no upper end: the peer's low is 0
    assert "mlx-lm has none; 3x target met" in versus_line(good)
    # results without a level (older reports) say only "CI"
    assert versus_line(cap).startswith(
        "capacity_strict: mixed 6 CI [5, 8] vs mlx-lm-fp32@512 2 CI [1, 4]: 3x CI [1.25, 8]"
    )
    # at 2 reps each CI claims 50% and their ratio's interval nothing: a range; at 5 reps 93.75% each (floored to
    # 93%), 87.5% the ratio
    for level, ratio in ((0.5, "range"), (0.9375, "87% CI")):
        leveled = {run: [{**r, "ci_level": level} for r in rs] for run, rs in searches.items()}
        row = versus(leveled)[0]
        assert row["ratio_ci_level"] == pytest.approx(max(0.0, 2 * level - 1))
        side = f"{int(level * 100)}% CI"
        assert f"mixed 6 {side} [5, 8] vs mlx-lm-fp32@512 2 {side} [1, 4]: 3x {ratio} [1.25, 8]" in (versus_line(row))
    assert not versus(searches, target=3.5)[0]["meets"]
    open_peer = {**searches, "mlx-lm-fp32@512": [result("capacity_strict", 2.0, [1.0, None])]}  # passed at hi
    assert versus(open_peer)[0]["ratio_ci"] == [0.0, 8.0] and "3x CI [0, 8]" in versus_line(versus(open_peer)[0])
    (bf16,) = versus(searches, dtype="bf16")
    assert bf16["ratio"] == pytest.approx(6.0 / 5.0) and not bf16["meets"]


def test_neither_with_a_rate_does_not_meet_and_a_lone_side_gives_no_row():
    searches = {"eager": [result("capacity_strict", 0.0, [0.0, 0.5])],
                "mlx-lm-fp32@2048": [result("capacity_strict", 0.0, [0.0, 0.5])]}  # fmt: skip
    (row,) = versus(searches)
    assert row["ratio"] is None and not row["meets"] and "neither has a rate; 3x target not met" in versus_line(row)
    assert versus({"eager": searches["eager"]}) == [] and versus({"mlx-lm-fp32@2048": searches["eager"]}) == []

"""slo-chunked / slo-mixed: chunk sizes from a fitted step cost and A's gap target. The fit, the rule, the
plans (every token once, never above the ceiling), the gate, and a run whose report says per chunk what was
predicted and what was observed."""

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlib.__main__ import main
from pdlib.config import RunParams
from pdlib.errors import InputError
from pdlib.report.metrics import slo_chunks
from pdlib.run.experiment import Experiment
from pdlib.run.slo import GAP_FIT_MIN_POINTS, StepCost, chunk_rule, cycling_rule, fit, fit_gap, probe_sizes
from pdlib.scheduler import Batch, Decode, Prefill, plan

COST = StepCost(a=1.0, b=0.1, c=0.001, decode_ms=2.0, points=[])


def test_fit_recovers_a_known_cost_and_never_lets_cost_fall_with_size():
    pts = [(n, s, 1.0 + 0.1 * n + 0.001 * n * s) for n in (8, 16, 32) for s in (0, 64, 200)]
    c = fit(pts, decode_ms=2.0)
    assert np.allclose([c.a, c.b, c.c], [1.0, 0.1, 0.001]) and c.decode_ms == 2.0 and len(c.points) == 9
    noisy = fit([(n, 0, 5.0 - 0.01 * n) for n in (8, 16, 32)], decode_ms=1.0)  # cost falling with n: noise
    assert noisy.b == 0.0 and noisy.c == 0.0


@pytest.mark.parametrize("mode", ["chunked", "mixed"])
def test_the_rule_picks_the_largest_chunk_that_meets_the_target(mode):
    for target in (3.5, 5.0, 8.0, 30.0):
        rule = chunk_rule(COST, tbt_slo_ms=target, ceiling=64, mode=mode)
        for prefilled in (0, 100, 1000):
            n = rule(prefilled)
            assert 1 <= n <= 64 and (n % 4 == 0 or n < 4)  # a multiple of ceiling/16 (or below it)
            if COST.gap_ms(1, prefilled, mode=mode) <= target:
                assert COST.gap_ms(n, prefilled, mode=mode) <= target
                assert n == 64 or COST.gap_ms(n + 4, prefilled, mode=mode) > target
    assert chunk_rule(COST, tbt_slo_ms=2.5, ceiling=64, mode="chunked")(0) == 4  # unattainable: the quantum
    assert chunk_rule(COST, tbt_slo_ms=1e6, ceiling=64, mode="mixed")(5000) == 64  # the ceiling caps it


@settings(max_examples=200, deadline=None)
@given(
    policy=st.sampled_from(["slo-chunked", "slo-mixed"]),
    prompt=st.integers(1, 300),
    out=st.integers(1, 20),
    ceiling=st.integers(1, 128),
    sizes=st.lists(st.integers(1, 500), min_size=1, max_size=7),
)
def test_slo_plans_prefill_every_token_once_and_never_exceed_the_ceiling(policy, prompt, out, ceiling, sizes):
    steps = plan(
        policy,
        prompt_tokens=prompt,
        output_tokens=out,
        chunk_size=ceiling,
        chunk_rule=lambda prefilled: sizes[prefilled % len(sizes)],
    )
    parts = [w for s in steps for w in s.work]
    for r in "AB":
        chunks = [w.n for w in parts if isinstance(w, Prefill) and w.req == r]
        assert sum(chunks) == prompt and max(chunks) <= ceiling
        assert sum(isinstance(w, Decode) and w.req == r for w in parts) == out - 1
    if policy == "slo-mixed":  # every step carries every ready decode (A's rides with each B chunk)
        pre, emit = {"A": 0, "B": 0}, {"A": 0, "B": 0}
        for step in steps:
            ready = [r for r in "AB" if pre[r] == prompt and emit[r] < out]
            decodes = [w.req for w in step.work if isinstance(w, Decode)]
            assert decodes == ready or (pre["A"] < prompt and not decodes), step  # A's set-up has no decodes
            assert isinstance(step, Batch) == (len(step.work) > 1)
            for w in step.work:
                if isinstance(w, Prefill):
                    pre[w.req] += w.n
                    emit[w.req] += pre[w.req] == prompt
                else:
                    emit[w.req] += 1


def experiment(tiny, chunk, policies=("slo-chunked", "slo-mixed")):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=40,
        output_tokens=6,
        chunk_size=chunk,
        policies=policies,
        logical_cache_reset=True,
        validation_checkpoint_every=4,
        tbt_slo_ms=5.0,
    )
    exp = Experiment(params, model=tiny)
    exp._step_cost = COST  # a fixed cost: the plans do not depend on this machine's timings
    return exp


@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_slo_policies_pass_the_gate(tiny, chunk):
    exp = experiment(tiny, chunk)
    results = exp.validate()
    assert all(r.passed for r in results.values())
    sizes = {w.n for s in exp.plan("slo-chunked")[3:] for w in s.work if isinstance(w, Prefill)}
    assert max(sizes) <= chunk and (len(sizes) > 1 or chunk == 8)  # the rule shrinks chunks as B's prefix grows


def test_report_keeps_each_chunks_prediction_and_the_observed_gaps(tmp_path, monkeypatch):
    import pdlib.run.experiment

    calibrated = []
    monkeypatch.setattr(pdlib.run.experiment, "calibrate", lambda engine, **kw: calibrated.append(kw) or COST)
    monkeypatch.setattr(pdlib.run.experiment.Experiment, "_probe", lambda self, cost: cost)  # the plan: COST's alone
    path = tmp_path / "r.json"
    rc = main(
        [
            "run",
            "--model",
            "synthetic:tiny",
            "--prompt-tokens",
            "96",
            "--output-tokens",
            "8",
            "--chunk-size",
            "32",
            "--policies",
            "chunked",
            "slo-chunked",
            "slo-mixed",
            "--tbt-slo-ms",
            "4",
            "--trials",
            "2",
            "--warmups",
            "0",
            "--logical-cache-reset",
            "--quiet",
            "--output",
            str(path),
        ]
    )
    assert rc == 0
    r = json.loads(path.read_text())
    slo = r["slo"]
    assert calibrated == [{"prompt_tokens": 96, "ceiling": 32, "logical_reset": True}]  # once, for both policies
    assert slo["tbt_slo_ms"] == 4 and slo["ceiling"] == 32 and slo["cost"]["a"] == COST.a
    for policy in ("slo-chunked", "slo-mixed"):
        chunks = slo["chunks"][policy]
        assert sum(c["n"] for c in chunks) == 96 and all(1 <= c["n"] <= 32 for c in chunks)
        assert [c["start"] for c in chunks] == list(np.cumsum([0] + [c["n"] for c in chunks[:-1]]))
        for t in (t for t in r["trials"] if t["policy"] == policy):
            ev = [(e["start"], e["stop"]) for e in t["events"] if e["kind"] == "prefill" and e["req"] == "B"]
            assert ev == [(c["start"], c["start"] + c["n"]) for c in chunks]  # the plan the report describes ran
    rows = slo_chunks(r)
    assert len(rows) == sum(len(c) for c in slo["chunks"].values())
    # a chunk is observed in a trial while A is still decoding across it (A has 7 timed outputs here)
    assert rows[0]["observed_gap_ms"] and all(len(x["observed_gap_ms"]) <= 2 for x in rows)
    assert all(x["held"] == [g <= 4 for g in x["observed_gap_ms"]] for x in rows)
    assert [c["n"] for c in slo["chunks"]["slo-chunked"]][:3] == [10, 8, 8]  # shrinking as B's prefix grows
    # what notebook 02 shows: one row per chunk and trial, a per-policy table, the chart
    from pdlib.analysis import frames as analysis
    from pdlib.analysis import plots, present

    frame = analysis.slo_frame(r)
    assert len(frame) == sum(len(x["observed_gap_ms"]) for x in rows)
    assert set(frame["policy"]) == {"slo-chunked", "slo-mixed"}
    table = present.slo_table(r)
    assert list(table["chunks"]) == [len(slo["chunks"]["slo-chunked"]), len(slo["chunks"]["slo-mixed"])]
    assert list(table["gaps observed"]) == [int((frame["policy"] == p).sum()) for p in ("slo-chunked", "slo-mixed")]
    spec = plots.slo_chart(frame, tbt_slo_ms=4).to_dict()
    assert "4 ms target" in spec["description"] and len(spec["spec"]["layer"]) == 3
    assert analysis.slo_frame({"trials": []}).empty  # no slo policy: nothing to show


def test_the_target_defaults_to_five_decodes_and_slo_names_slo_chunked(tiny):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=40,
        output_tokens=6,
        chunk_size=16,
        policies=("chunked", "slo"),
        logical_cache_reset=True,
    )
    assert params.policies == ("chunked", "slo-chunked") and params.tbt_slo_ms is None
    exp = Experiment(params, model=tiny)
    exp._step_cost = COST
    slo = exp.slo_details()
    assert slo["tbt_slo_ms"] == 5 * COST.decode_ms and slo["target_from"] == "5x decode"
    want = chunk_rule(COST, tbt_slo_ms=5 * COST.decode_ms, ceiling=16, mode="chunked")
    assert [c["n"] for c in slo["chunks"]["slo-chunked"]][:-1] == [
        want(c["start"]) for c in slo["chunks"]["slo-chunked"]
    ][:-1]
    with pytest.raises(InputError, match="tbt_slo_ms must be a finite number > 0, got -1"):
        RunParams(model="synthetic:tiny", policies=("slo-chunked",), tbt_slo_ms=-1)


def test_a_probe_run_adds_what_the_fit_misses(tiny, monkeypatch):
    """A fit that predicts 0 ms gaps: the probe's observed gaps become each mode's overhead, which every
    prediction (and so every chunk size) then includes."""
    import pdlib.run.experiment

    blind = StepCost(a=0.0, b=0.0, c=0.0, decode_ms=1e-3, points=[])
    monkeypatch.setattr(pdlib.run.experiment, "calibrate", lambda engine, **kw: blind)
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=64,
        output_tokens=6,
        chunk_size=16,
        policies=("slo-chunked", "slo-mixed"),
        logical_cache_reset=True,
        tbt_slo_ms=1e6,
    )
    exp = Experiment(params, model=tiny)
    cost = exp.step_cost
    assert set(cost.overhead_ms) == {"chunked", "mixed"} and all(v > 0 for v in cost.overhead_ms.values())
    slo = exp.slo_details()
    assert slo["cost"]["overhead_ms"] == cost.overhead_ms
    for policy, mode in (("slo-chunked", "chunked"), ("slo-mixed", "mixed")):
        for c in slo["chunks"][policy]:
            assert c["predicted_gap_ms"] == pytest.approx(
                blind.gap_ms(c["n"], c["start"], mode=mode) + cost.overhead_ms[mode]
            )
    assert exp.validate()["slo-mixed"].passed  # the probe left the engine as a run leaves it


def test_fit_gap_recovers_a_known_gap_and_refuses_too_few_points():
    pts = [(n, s, 20.0 + 0.05 * n + 1e-4 * n * s) for n in (16, 32, 64, 128) for s in (0, 500, 2000)]
    g = fit_gap(pts)
    assert np.allclose([g["a"], g["b"], g["c"]], [20.0, 0.05, 1e-4]) and g["spread_ms"] < 1e-9
    assert len(g["points"]) == 12
    assert fit_gap(pts[: GAP_FIT_MIN_POINTS - 1]) is None  # too few gaps
    assert fit_gap([(32, s, 20.0 + s) for s in range(0, 800, 100)]) is None  # one size: no slope to tell
    noisy = fit_gap([(n, 0, 20.0 + (1.0 if k % 2 else -1.0)) for k, n in enumerate((16, 32, 64, 128) * 2)])
    assert noisy["spread_ms"] > 0.5  # the scatter is kept, for the rule


def test_a_probe_cycles_through_four_sizes_from_the_start_of_the_prompt():
    rule = cycling_rule(128)
    assert probe_sizes(128) == [128, 64, 32, 16] and probe_sizes(2) == [2, 1]
    steps = plan("slo-chunked", prompt_tokens=1000, output_tokens=4, chunk_size=128, chunk_rule=rule)
    sizes = [w.n for s in steps for w in s.work if isinstance(w, Prefill) and w.req == "B"]
    assert sizes[:9] == [128, 64, 32, 16, 128, 64, 32, 16, 128] and sum(sizes) == 1000


def test_an_unattainable_target_takes_the_largest_chunk_the_model_cannot_tell_from_one_token():
    """On the H200 a chunk step cost ~20 ms at any size: the quantum would only delay B."""
    flat = StepCost(a=20.0, b=0.0, c=1e-5, decode_ms=3.0, points=[], spread_ms=1.0)
    rule = chunk_rule(flat, tbt_slo_ms=15.0, ceiling=128, mode="chunked")
    assert rule(0) == 128  # no size differs: the ceiling
    n = rule(1000)  # the attention term grows 0.01 ms per token
    assert n == 96 and flat.gap_ms(n, 1000, mode="chunked") <= flat.gap_ms(1, 1000, mode="chunked") + 1.0
    assert flat.gap_ms(n + 8, 1000, mode="chunked") > flat.gap_ms(1, 1000, mode="chunked") + 1.0
    exact = replace(flat, b=0.1, spread_ms=0.0)  # a model that resolves every token: the quantum
    assert chunk_rule(exact, tbt_slo_ms=15.0, ceiling=128, mode="chunked")(0) == 8
    fitted = replace(flat, gap_fit={"mixed": {"a": 10.0, "b": 0.1, "c": 0.0, "spread_ms": 0.0, "points": []}})
    assert fitted.gap_ms(40, 0, mode="mixed") == 14.0 and fitted.gap_spread_ms("mixed") == 0.0
    assert chunk_rule(fitted, tbt_slo_ms=14.0, ceiling=128, mode="mixed")(0) == 40  # the probe's model rules


def test_a_long_enough_probe_fits_each_modes_gap_and_the_plan_follows_it(tiny, monkeypatch):
    """A fit that predicts 0 ms: the probe's own gaps, across chunks of four sizes, make the model."""
    import pdlib.run.experiment

    blind = StepCost(a=0.0, b=0.0, c=0.0, decode_ms=1e-3, points=[])
    monkeypatch.setattr(pdlib.run.experiment, "calibrate", lambda engine, **kw: blind)
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=120,
        output_tokens=40,
        chunk_size=32,
        policies=("slo-chunked", "slo-mixed"),
        logical_cache_reset=True,
        tbt_slo_ms=1e6,
    )
    exp = Experiment(params, model=tiny)
    cost = exp.step_cost
    assert set(cost.gap_fit) == {"chunked", "mixed"} and not cost.overhead_ms
    for mode, g in cost.gap_fit.items():  # 8 chunks (32, 16, 8, 4 twice); the first is left out, and in
        # a chunked round the last chunk's gap would end at A's decode after it, which the probe stops short of
        assert {n for n, _, _ in g["points"]} == {32, 16, 8, 4} and len(g["points"]) == {"chunked": 6, "mixed": 7}[mode]
        assert g["a"] + g["b"] + g["c"] > 0 and g["spread_ms"] >= 0
    slo = exp.slo_details()
    assert slo["cost"]["gap_fit"] == cost.gap_fit
    for policy, mode in (("slo-chunked", "chunked"), ("slo-mixed", "mixed")):
        g = cost.gap_fit[mode]
        assert all(s > 0 for _, s, _ in g["points"])  # not the first chunk: its gap holds B's reset
        for c in slo["chunks"][policy]:
            assert c["predicted_gap_ms"] == pytest.approx(g["a"] + g["b"] * c["n"] + g["c"] * c["n"] * c["start"])
    assert exp.validate()["slo-chunked"].passed  # the probe left the engine as a run leaves it
    # a target inside the model's range: the plan is the rule's on the fitted model, chunk by chunk
    target = cost.gap_ms(12, 0, mode="chunked") + cost.gap_spread_ms("chunked")
    tight = Experiment(replace(params, tbt_slo_ms=target), model=tiny)
    tight._step_cost = cost
    rule = chunk_rule(cost, tbt_slo_ms=target, ceiling=32, mode="chunked")
    chunks = tight.slo_details()["chunks"]["slo-chunked"]
    assert [c["n"] for c in chunks[:-1]] == [rule(c["start"]) for c in chunks[:-1]]


def test_each_chunk_is_read_against_the_gap_that_crosses_it_not_its_neighbours():
    """Mixed steps stamp A's token just before the step's end, so the next gap overlaps the step too: a small
    chunk after a big one must still get its own, small gap (it once took the big one's)."""
    ms = 1_000_000
    ends = [20, 25, 45, 50]  # steps of 20, 5, 20, 5 ms
    events, start = [], 0
    for k, end in enumerate(ends):
        events.append(
            {
                "kind": "prefill",
                "req": "B",
                "start": 10 * k,
                "stop": 10 * (k + 1),
                "t_start_ns": start * ms,
                "t_end_ns": end * ms + ms // 10,
            }
        )
        start = end
    trial = {"policy": "slo-mixed", "events": events, "requests": {"A": {"emit_ns": [e * ms for e in ends]}}}
    chunks = [{"start": 10 * k, "n": 10, "predicted_gap_ms": 0.0} for k in range(4)]
    rows = slo_chunks({"slo": {"tbt_slo_ms": 10.0, "chunks": {"slo-mixed": chunks}}, "trials": [trial]})
    assert [r["observed_gap_ms"] for r in rows] == [[20.0], [5.0], [20.0], [5.0]]
    assert [r["held"] for r in rows] == [[False], [True], [False], [True]]
    chunked = dict(trial, requests={"A": {"emit_ns": [20 * ms, 25 * ms]}})  # A finished: nothing to read
    rows = slo_chunks({"slo": {"tbt_slo_ms": 10.0, "chunks": {"slo-mixed": chunks}}, "trials": [chunked]})
    assert [r["observed_gap_ms"] for r in rows] == [[20.0], [5.0], [], []]


@pytest.mark.parametrize("mode", ["chunked", "mixed"])
def test_a_looser_target_never_gives_smaller_chunks(mode):
    """Near a one-token chunk's gap the rule used to flip: 19.9 ms gave 38 chunks, 20.05 ms gave 439."""
    model = {"a": 20.0, "b": 0.002, "c": 1e-6, "spread_ms": 0.5, "points": []}
    cost = StepCost(a=0.0, b=0.0, c=0.0, decode_ms=1.0, points=[], gap_fit={mode: model})
    for prefilled in (0, 1000, 4000):
        sizes = [chunk_rule(cost, tbt_slo_ms=t, ceiling=128, mode=mode)(prefilled) for t in np.arange(19.5, 21.5, 0.01)]
        assert sizes == sorted(sizes), prefilled
        assert min(sizes) >= 8  # never below the quantum, nor below what the scatter allows


def test_the_fit_is_non_negative_least_squares_not_a_clipped_one():
    """A slope that least squares makes negative: clipping it alone leaves the intercept fitted for it."""
    rng = np.random.default_rng(0)
    pts = [(n, s, 20.0 + 1e-6 * n * s + rng.normal(0, 0.5)) for n in (16, 32, 64, 128) for s in range(0, 4096, 256)]
    pts = [(n, s, ms - 0.004 * n) for n, s, ms in pts]  # cost falling with n: no valid b > 0
    g = fit_gap(pts)
    assert g["b"] == 0.0 and g["a"] >= 0 and g["c"] >= 0
    x = np.array([[1.0, s * n] for n, s, _ in pts])
    y = np.array([ms for _, _, ms in pts])
    (a, c), *_ = np.linalg.lstsq(x, y, rcond=None)  # the best fit without b
    assert (g["a"], g["c"]) == pytest.approx((a, c)) or c < 0

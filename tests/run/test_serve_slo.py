"""The serving `slo-mixed` policy's budget (pdlib/run/serve_slo.py): the largest prompt chunk whose predicted step meets
the target beside the ready decodes, shrinking as decode rows and their caches grow; the whole ceiling when no
prompt waits, when no decode is ready, and when not even one token fits; through `serve` it is calibrated once,
recorded, and its runs pass the gate."""

import time

import numpy as np
import pytest

from pdlib.report.serving import slos_from_step
from pdlib.run import serve_slo
from pdlib.run.serve import run_serving
from pdlib.run.serve_slo import predicted_ms, step_budget
from pdlib.run.slo import StepCost
from pdlib.scheduler import RequestState
from pdlib.workload import Workload

COST = StepCost(a=1.0, b=0.1, c=0.001, decode_ms=1.2, points=[], spread_ms=0.0)


def state(name, prompt, prefilled, emitted=0, outputs=10):
    return RequestState(name, prompt, outputs, prefilled=prefilled, emitted=emitted)


def test_the_prediction_is_the_fits_form_over_the_steps_rows():
    running = [state("d", 100, 100, emitted=5), state("p", 300, 64)]
    # one decode at 104 cached positions, 32 prompt tokens from 64: a + b (1 + 32) + c (104 + 32 * 64)
    assert predicted_ms(COST, running, 32) == pytest.approx(1.0 + 0.1 * 33 + 0.001 * (104 + 32 * 64))


def test_the_budget_is_the_largest_quantized_chunk_that_meets_the_target():
    budget = step_budget(COST, tbt_ms=8.0, ceiling=256)
    alone = [state("p", 1000, 0)]
    one = [state("d", 100, 100, emitted=1)] + alone
    n = budget(one)
    assert n % 16 == 0 and predicted_ms(COST, one, n) <= 8.0 < predicted_ms(COST, one, n + 16)
    busy = [state(f"d{i}", 200, 200, emitted=1) for i in range(4)] + alone
    assert 0 < budget(busy) < n  # decode rows and their caches take part of the step
    assert budget([state("d", 50, 50, emitted=1)]) == 256  # no prompt waits
    assert predicted_ms(COST, alone, 256) > 8.0 and budget(alone) == 256  # no decode has a gap to keep
    finished = [state("f", 50, 50, emitted=10)] + alone
    assert budget(finished) == 256  # a finished request decodes no more


def test_where_not_one_token_fits_the_budget_is_the_whole_ceiling():
    """Every step with prompt work then misses the target for each decode in it: the fewest such steps."""
    crowded = [state(f"d{i}", 4000, 4000, emitted=1) for i in range(40)] + [state("p", 1000, 0)]
    assert predicted_ms(COST, crowded, 1) > 8.0
    assert step_budget(COST, tbt_ms=8.0, ceiling=256)(crowded) == 256
    scattered = StepCost(a=1.0, b=0.1, c=0.001, decode_ms=1.2, points=[], spread_ms=6.0)
    assert step_budget(scattered, tbt_ms=8.0, ceiling=256)(crowded) == 256  # the scatter does not bring it back
    # just under the one-token step the target still holds, with nothing over it
    floor = predicted_ms(COST, crowded, 1)
    assert step_budget(COST, tbt_ms=floor, ceiling=256)(crowded) == 1


def test_where_one_token_fits_the_fits_scatter_may_allow_more():
    scattered = StepCost(a=1.0, b=0.1, c=0.001, decode_ms=1.2, points=[], spread_ms=6.0)
    running = [state(f"d{i}", 1000, 1000, emitted=1) for i in range(8)] + [state("p", 1000, 0)]
    floor = predicted_ms(scattered, running, 1)
    target = floor + 0.05  # one token fits; a few more would by the target alone
    n = step_budget(scattered, tbt_ms=target, ceiling=256)(running)
    assert n % 16 == 0 and n > 16  # the limit is the one-token step plus the scatter
    assert predicted_ms(scattered, running, n) <= floor + 6.0 < predicted_ms(scattered, running, n + 16)
    d = [state("d", 100, 100, emitted=1)]
    few = step_budget(COST, tbt_ms=predicted_ms(COST, d + [state("p", 1000, 0)], 5), ceiling=256)
    assert few(d + [state("p", 1000, 0)]) == 5  # under a quantum where only that many fit: not rounded up


@pytest.fixture(scope="module")
def workload():
    ms = 1_000_000
    return Workload("slo", np.array([0, 1 * ms, 2 * ms, 3 * ms]), np.array([16, 120, 90, 60]), np.array([30, 4, 4, 3]))


def test_serve_calibrates_once_records_the_target_and_gates_the_runs(tiny, workload, monkeypatch):
    report = run_serving(tiny, workload, policy=["mixed", "slo-mixed", "slo-mixed-x2"], chunk_size=32, replay=2)
    slo = report["slo_policy"]
    mixed, one, two = report["runs"]
    assert "slo_loop" not in mixed  # the budget is passed to every policy; only slo-mixed learns with it
    assert isinstance(one["slo_loop"]["loop_ms"], float)
    assert len(two["slo_loop"]["loop_ms"]) == len(two["slo_loop"]["overruns"]) == 2  # each replica's
    assert slo["target_from"] == "5x decode" and slo["tbt_ms"] == pytest.approx(5 * slo["cost"]["decode_ms"])
    assert slo["calibrated_on"] == "r1"  # the longest prompt
    assert all(r["check"]["status"] == "ok" for run in report["runs"] for r in run["requests"])
    assert slo["rule"] == serve_slo.BUDGET_RULE
    # a target no step with prompt work can meet: every prompt step carries the whole chunk_size (mixed's). The
    # cost is pinned, with no scatter
    monkeypatch.setattr(serve_slo, "calibrate_serving", lambda engine, workload, chunk_size: (COST, "r1"))
    strict = slos_from_step(1e-6, 1000.0)
    tight = run_serving(tiny, workload, policy="slo-mixed", chunk_size=32, slos=strict, replay=0)
    assert tight["slo_policy"]["target_from"] == "strict slo"
    chunks = [c for c in (sum(n for _, n in step if n) for step in tight["runs"][0]["steps"]["work"]) if c]
    assert sum(chunks) == int(workload.prompt_tokens.sum()) and max(chunks) == 32
    # each step takes min(32, the arrived prompts' tokens left): under 32 at most once an arrival, 4 + 286/32
    assert len(chunks) <= 4 + -(-286 // 32)


ROWS = StepCost(
    a=1.0, b=0.01, c=0.0, decode_ms=1.2, points=[], rows_a=5.0, rows_b=0.25, rows_c=0.0001, rows_points=[[1]]
)


def test_decode_rows_beside_a_chunk_are_priced_by_their_own_fit():
    running = [state(f"d{i}", 1000, 1000, emitted=1) for i in range(8)] + [state("p", 2000, 512)]
    # the chunk alone, a + b n, plus the rows' fixed cost, per row and per cached position (8 x 1,000)
    assert predicted_ms(ROWS, running, 64) == pytest.approx(1.0 + 0.01 * 64 + 5.0 + 0.25 * 8 + 0.0001 * 8000)
    assert predicted_ms(ROWS, [state("p", 2000, 512)], 64) == pytest.approx(1.0 + 0.01 * 64)  # no rows: none
    # the same cost without the rows' fit prices the 8 rows as 8 chunk tokens: 7.8 ms less here
    bare = StepCost(a=1.0, b=0.01, c=0.0, decode_ms=1.2, points=[])
    assert predicted_ms(bare, running, 64) == pytest.approx(1.0 + 0.01 * 72)


def test_fit_rows_recovers_the_rows_terms_from_steps_timed_beside_chunks():
    chunk = StepCost(a=1.0, b=0.01, c=0.0, decode_ms=1.2, points=[])
    true = lambda d, c, n, s: chunk.step_ms(n, s) + 5.0 + 0.25 * d + 0.0001 * c  # noqa: E731
    pts = [
        [d, c, n, s, true(d, c, n, s)] for d, c in ((1, 900), (4, 3800), (16, 15000)) for n, s in ((512, 0), (128, 512))
    ]
    fitted = serve_slo.fit_rows(chunk, pts)
    assert (fitted.rows_a, fitted.rows_b, fitted.rows_c) == pytest.approx((5.0, 0.25, 0.0001), rel=1e-6)
    assert fitted.rows_points == pts and (fitted.a, fitted.b) == (chunk.a, chunk.b)  # the chunk's fit unchanged
    assert serve_slo.fit_rows(chunk, []) is chunk


def test_the_serving_calibration_times_chunks_beside_1_4_and_16_rows_and_resets_them(tiny):
    from pdlib.engine import Engine

    ms = 1_000_000
    n = 20
    w = Workload("rows", np.arange(n) * ms, np.array([96] + [8 + i for i in range(n - 1)]), np.full(n, 4))
    engine = Engine(tiny, capacity=int((w.prompt_tokens + w.output_tokens).max()) + 80, slots=n)
    for i, name in enumerate(w.names):
        engine.add_request(name, [(j * 13 + i) % tiny.config.vocab_size for j in range(int(w.prompt_tokens[i]))])
    cost, name = serve_slo.calibrate_serving(engine, w, chunk_size=32)
    assert name == w.names[0]
    pts = cost.rows_points
    # 96 tokens in chunks of 32 and 8 in turn: 32, 8, 32, 8, 16; once per row count
    assert [p[0] for p in pts] == [1] * 5 + [4] * 5 + [16] * 5
    assert [(p[2], p[3]) for p in pts[:5]] == [(32, 0), (8, 32), (32, 40), (8, 72), (16, 80)]
    # the longest other prompt (26 tokens), after the first pass's 15 decodes (the kept pass is the second)
    assert pts[0][1] == 26 + 15
    assert pts[5][1] > pts[0][1] and all(p[4] > 0 for p in pts)
    assert all(r.cache.length == 0 for r in engine.requests.values())  # every request it touched reset


def test_the_budget_prices_each_step_with_the_runs_median_overrun():
    """What the loop adds to a step (the longest gap a step ended, less its prediction) shrinks the chunk; the
    median of the last LOOP_WINDOW overruns, so one slow step moves it little; where the overrun leaves no token
    room it is the whole ceiling; each run starts from the fit alone."""
    one = [state("d", 100, 100, emitted=1), state("p", 1000, 0)]
    budget = step_budget(COST, tbt_ms=8.0, ceiling=256)
    fresh = budget(one)
    assert budget.loop_ms == 0.0
    for _ in range(5):
        budget.observe(4.0, 5.5)  # each such step's gap 1.5 ms over its prediction
    budget.observe(4.0, 60.0)  # one outlier
    assert budget.loop_ms == pytest.approx(1.5)
    n = budget(one)
    assert n % 16 == 0 and n < fresh
    assert predicted_ms(COST, one, n) + 1.5 <= 8.0 < predicted_ms(COST, one, n + 16) + 1.5
    for _ in range(serve_slo.LOOP_WINDOW):  # the window forgets what came before it
        budget.observe(4.0, 4.0 + 8.0)
    assert budget.loop_ms == pytest.approx(8.0) and budget(one) == 256  # the one-token step over 8 ms: the ceiling
    budget.start()
    assert budget.loop_ms == 0.0 and budget(one) == fresh
    assert budget.expect(one, 32) == predicted_ms(COST, one, 32)
    # a loop faster than the fit adds nothing: under a target no step meets, prompt steps keep the ceiling (as a
    # negative addend, a 1-token step priced under the target would take one token a step)
    unmet = step_budget(COST, tbt_ms=1e-5, ceiling=32)
    for _ in range(serve_slo.LOOP_WINDOW):
        unmet.observe(5.0, 5.0 - predicted_ms(COST, one, 1))
    assert unmet.loop_ms == 0.0 and unmet(one) == 32


def test_the_loop_reports_each_step_with_prompt_work_beside_decodes_and_the_longest_gap_it_ended(
    tiny, workload, monkeypatch
):
    seen, starts = [], []
    real_observe, real_start = serve_slo.StepBudget.observe, serve_slo.StepBudget.start

    def observe(self, expected_ms, gap_ms):
        seen.append((expected_ms, gap_ms))
        real_observe(self, expected_ms, gap_ms)

    def start(self):
        starts.append(len(seen))
        real_start(self)

    monkeypatch.setattr(serve_slo.StepBudget, "observe", observe)
    monkeypatch.setattr(serve_slo.StepBudget, "start", start)
    report = run_serving(tiny, workload, policy="slo-mixed", chunk_size=32, replay=0, warmups=1)
    run = report["runs"][0]
    emits = {r["name"]: r["emit_ns"] for r in run["requests"]}
    prompts = dict(zip(workload.names, workload.prompt_tokens.tolist()))
    emitted, prefilled, want = dict.fromkeys(emits, 0), dict.fromkeys(emits, 0), []
    for step in run["steps"]["work"]:
        gaps = []
        for name, n in step:  # a decode emits; a chunk emits once it ends its prompt
            if n is None:
                gaps.append(emits[name][emitted[name]] - emits[name][emitted[name] - 1])
            else:
                prefilled[name] += n
            emitted[name] += n is None or prefilled[name] == prompts[name]
        if gaps and any(n is not None for _, n in step):
            want.append(max(gaps) / 1e6)
    assert len(starts) == 2 and 0 < len(want) < serve_slo.LOOP_WINDOW  # the warmup's run, then this one
    timed = seen[starts[-1] :]
    assert [g for _, g in timed] == pytest.approx(want)
    assert all(e > 0 for e, _ in timed)
    loop = run["slo_loop"]  # this run's alone: the warmup's are forgotten
    assert loop["overruns"] == pytest.approx([g - e for e, g in timed])
    assert loop["loop_ms"] == pytest.approx(max(0.0, float(np.median(loop["overruns"]))))  # never negative


def test_a_loop_slower_than_the_fit_turns_the_chunks_into_the_whole_ceiling(tiny, workload, monkeypatch):
    """The H100's case on the CPU: the fit says a one-row step with 48 prompt tokens meets a 0.5 ms target, but
    every step with prompt work takes 10 ms more in the loop. The first two such steps carry 48 tokens (a step's
    overrun is seen as the step after it goes out), every later one the whole chunk (or what is left)."""
    from pdlib.engine import Engine

    cheap = StepCost(a=0.0, b=0.01, c=0.0, decode_ms=0.1, points=[], spread_ms=0.0)
    monkeypatch.setattr(serve_slo, "calibrate_serving", lambda engine, workload, chunk_size: (cheap, "r1"))
    real = Engine.batch

    def slow(self, parts):
        if any(n is not None for _, n in parts):
            time.sleep(0.010)
        return real(self, parts)

    monkeypatch.setattr(Engine, "batch", slow)
    report = run_serving(tiny, workload, policy="slo-mixed", chunk_size=64, slos=slos_from_step(0.1, 1000.0), replay=0)
    run = report["runs"][0]
    mixed = [step for step in run["steps"]["work"] if any(n is None for _, n in step) and any(n for _, n in step)]
    sums = [sum(n for _, n in step if n) for step in mixed]
    assert sums[:2] == [48, 48] and len(sums) >= 4, sums  # 0.01 (1 + 48) <= 0.5: the fit alone
    assert all(s == 64 for s in sums[2:-1]) and sums[-1] <= 64, sums
    assert run["slo_loop"]["loop_ms"] >= 10.0

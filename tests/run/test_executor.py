"""One executor for validated and timed runs: the same plan, part for part; steps that carry several requests'
work (a `Batch`) are checked by the gate and recorded by trials like any other."""

import math

import pytest

import pdlib.run.executor
from pdlib.config import RunParams
from pdlib.run.experiment import Experiment
from pdlib.run.trial import check_tokens, run_once
from pdlib.run.validate import ValidationError
from pdlib.scheduler import POLICIES, Batch, Decode, Policy, Prefill, RequestState, follow, plan, schedule, t0_index

PROMPT, OUTPUTS, CHUNK = 40, 6, 16
DELAY_NS = 150_000_000  # a host delay planted in the timing tests


class _RoundBatches(Policy):  # registered only by the fixture (no `name` in the class body)
    """Each round as one step: every ready decode and, while B's prompt lasts, one B chunk."""

    def next_step(self, a, b, *, chunk_size):
        work = [Decode(r.name) for r in (a, b) if r.ready]
        if not b.prompt_done:
            work.append(Prefill(b.name, min(chunk_size, b.prompt_tokens - b.prefilled)))
        return Batch(tuple(work)) if work else None


@pytest.fixture
def batched():
    _RoundBatches.name = "round_batches"
    POLICIES["round_batches"] = _RoundBatches
    yield "round_batches"
    POLICIES.pop("round_batches")


def experiment(tiny, policies):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=CHUNK,
        policies=policies,
        logical_cache_reset=True,
        validation_checkpoint_every=4,
    )
    return Experiment(params, model=tiny)


def spy_issues(monkeypatch) -> list:
    """Log every step the executor issues to the engine: its parts as (request, kind, cache length before)."""
    log, real = [], pdlib.run.executor._issue

    def issue(engine, step, *between):
        log.append(tuple((w.req, type(w).__name__, engine.requests[w.req].length) for w in step.work))
        return real(engine, step, *between)

    monkeypatch.setattr(pdlib.run.executor, "_issue", issue)
    return log


@pytest.mark.parametrize("policy", ["eager", "chunked", "fifo"])
def test_the_gate_and_a_trial_issue_the_same_parts(tiny, monkeypatch, policy):
    exp = experiment(tiny, (policy,))
    log = spy_issues(monkeypatch)
    tokens = exp.validate()[policy].tokens
    validated = list(log)
    log.clear()
    run = run_once(exp.engine, policy, steps=exp.walk(policy), logical_reset=True)
    assert log == validated and len(log) == len(exp.plan(policy))
    check_tokens(run, tokens, what="trial")


def test_a_batch_step_is_validated_and_recorded(tiny, batched):
    exp = experiment(tiny, (batched,))
    steps = exp.plan(batched)
    kinds = {tuple(type(w).__name__ for w in s.work) for s in steps if isinstance(s, Batch)}
    assert {("Decode", "Prefill"), ("Decode", "Decode")} <= kinds  # A's decode beside B's chunk; both decode
    result = exp.validate()[batched]
    assert result.passed and result.steps == len(steps)
    assert result.checks["token"].count == 2 * OUTPUTS and result.checks["prefix_kv"].count == 2 * -(-PROMPT // CHUNK)
    run = run_once(exp.engine, batched, steps=exp.walk(batched), logical_reset=True)
    check_tokens(run, result.tokens, what="trial")
    timed = [e for e in run.events if e["kind"] != "reset"]
    assert len(timed) == sum(len(s.work) for s in steps[t0_index(steps) :])
    # round 1 is one step, A's decode and B's first chunk: both parts share its interval, which ends after
    # A's token is observed, once B's chunk is written too
    assert [(e["kind"], e["req"]) for e in timed[:2]] == [("decode", "A"), ("prefill", "B")]
    assert timed[0]["t_start_ns"] == timed[1]["t_start_ns"] and timed[0]["t_end_ns"] == timed[1]["t_end_ns"]
    assert timed[0]["t_start_ns"] < run.emit_ns["A"][0] < timed[0]["t_end_ns"]
    # a round of both decodes ends when B's token (observed after A's) is
    both = [
        (x, y)
        for x, y in zip(timed, timed[1:])
        if x["t_start_ns"] == y["t_start_ns"]
        and [(e["kind"], e["req"]) for e in (x, y)] == [("decode", "A"), ("decode", "B")]
    ]
    assert both and all(x["t_end_ns"] == y["t_end_ns"] and y["t_end_ns"] in run.emit_ns["B"] for x, y in both)


def test_a_fault_inside_a_batch_is_caught(tiny, batched, monkeypatch):
    """B's chunk beside A's decode: a shifted token in the chunk fails prefix_kv, naming B."""
    from pdlib.engine.model import Qwen3

    real = Qwen3.stages  # a step's layers, however it is dispatched (Qwen3.step runs them too)

    def stages(self, segments, *, prune=True):
        for s in segments:
            if s.start == CHUNK and s.cache is exp.engine.requests["B"].cache:
                s.tokens = s.tokens[::-1]
        return (yield from real(self, segments, prune=prune))

    exp = experiment(tiny, (batched,))
    monkeypatch.setattr(Qwen3, "stages", stages)
    with pytest.raises(ValidationError, match="prefix_kv check, request B"):
        exp.validate()


def test_schedule_checks_every_part_of_a_batch():
    class TwoDecodes(Policy):  # A's decode twice in one step, when A has one output left
        def next_step(self, a, b, *, chunk_size):
            return Batch((Decode("A"), Decode("A")))

    TwoDecodes.name = "two_decodes"
    a, b = RequestState("A", 2, 3, prefilled=2, emitted=2), RequestState("B", 2, 3)
    with pytest.raises(RuntimeError, match="made no progress.*not ready"):
        list(schedule(TwoDecodes(), a, b, chunk_size=2))
    assert (a.emitted, b.prefilled) == (2, 0)  # a refused step changes nothing
    with pytest.raises(ValueError, match="one or more"):
        Batch(())


def test_plans_are_made_once_and_a_live_walk_is_held_to_them(tiny):
    exp = experiment(tiny, ("eager", "chunked"))
    assert exp.plan("eager") is exp.plan("eager")
    assert exp.plan("eager") == plan("eager", prompt_tokens=PROMPT, output_tokens=OUTPUTS, chunk_size=CHUNK)
    assert list(exp.walk("chunked")) == exp.plan("chunked")
    validated = exp.plan("chunked")
    with pytest.raises(RuntimeError, match=r"step 3 is Decode\(req='A'\), the validated plan has Decode\(req='B'\)"):
        list(follow(iter(validated), validated[:3] + [Decode("B")] + validated[4:]))
    with pytest.raises(RuntimeError, match="ended after 2 steps, the validated plan has 3"):
        list(follow(iter(validated[:2]), validated[:3]))
    with pytest.raises(RuntimeError, match="step 3 is .*the validated plan has the end"):
        list(follow(iter(validated[:4]), validated[:3]))


class _Clock(pdlib.run.executor.Hook):
    """Each step the hooks see: its index, whether it holds only decodes, when it was issued and observed."""

    def __init__(self):
        self.steps = []

    def on_step(self, index, step, results, t_start, t_end, *, timed):
        self.steps.append((index, all(isinstance(w, Decode) for w in step.work), t_start, t_end, timed))


@pytest.mark.parametrize("policy", ["eager", "chunked", "fifo", "mixed"])
def test_pipelined_decodes_issue_a_decode_step_before_the_one_before_is_observed(tiny, monkeypatch, policy):
    """With pipeline on, a timed step of decodes is issued before the step before it is observed (its t_start
    precedes that step's t_end), whatever that step was (a chunk's too: A's decode is queued behind it), and
    no other step is; the parts issued, the hooks' order and the tokens are those of the plan. With it off,
    every step starts after the one before ended."""
    exp = experiment(tiny, (policy,))
    log = spy_issues(monkeypatch)
    runs = {}
    for pipeline in (False, True):
        clock = _Clock()
        log.clear()
        pdlib.run.executor.execute(exp.engine, exp.walk(policy), logical_reset=True, hooks=[clock], pipeline=pipeline)
        runs[pipeline] = (list(log), clock.steps)
    (issued, plain), (issued_piped, piped) = runs[False], runs[True]
    assert issued == issued_piped and [s[0] for s in piped] == list(range(len(exp.plan(policy))))
    assert all(b[2] >= a[3] for a, b in zip(plain, plain[1:]))
    overlapped = [b[1] and a[4] for a, b in zip(piped, piped[1:])]
    assert any(overlapped)
    assert any(o and not a[1] for a, o in zip(piped, overlapped))  # a decode queued behind a prompt chunk
    for (a, b), o in zip(zip(piped, piped[1:]), overlapped):
        assert (b[2] < a[3]) == o, (a, b)


@pytest.mark.parametrize("policy", ["chunked", "mixed"])
def test_a_chunk_ends_when_its_own_arrays_are_done_not_the_stream(tiny, monkeypatch, policy):
    """A step with a chunk and no token is observed by waiting on its cache's arrays: a stream sync would also
    wait for A's decode queued behind it, and charge that decode to the chunk. After t0 the executor never
    syncs the stream; each chunk that yields no token is waited for once, by exactly B's cache's arrays (its
    layers' K, V and its fence), none of A's."""
    exp = experiment(tiny, (policy,))
    b = exp.engine.requests["B"].cache
    syncs, waits, real_eval = [], [], pdlib.run.executor.mx.eval

    def wait(*arrays):  # B's cache is as the chunk left it: nothing of B's is issued before the chunk is seen
        waits.append(sorted(map(id, _flat(arrays))) == sorted(map(id, (*b.k, *b.v, b.written))))
        return real_eval(*arrays)

    class T0(pdlib.run.executor.Hook):
        def on_t0(self, t0, t_reset_end):
            monkeypatch.setattr(pdlib.run.executor.mx, "synchronize", lambda *a: syncs.append(a))
            monkeypatch.setattr(pdlib.run.executor.mx, "eval", wait)

    pdlib.run.executor.execute(exp.engine, exp.walk(policy), logical_reset=True, hooks=[T0()], pipeline=True)
    silent_chunks = math.ceil(PROMPT / CHUNK) - 1  # the last chunk yields B's first token
    assert syncs == [] and waits == [True] * silent_chunks


def _flat(xs):
    for x in xs:
        yield from _flat(x) if isinstance(x, (list, tuple)) else (x,)


def test_a_pipelined_trial_decodes_the_validated_tokens(tiny):
    exp = experiment(tiny, ("chunked",))
    tokens = exp.validate()["chunked"].tokens
    run = run_once(exp.engine, "chunked", steps=exp.walk("chunked"), logical_reset=True, pipeline=True)
    check_tokens(run, tokens, what="pipelined")
    assert all(len(run.output_ids[r]) for r in ("A", "B"))


def test_a_report_says_when_decodes_were_pipelined():
    from pdlib.text import run_line

    report = {
        "model": {"spec": "synthetic:tiny@0", "source": "synthetic"},
        "environment": {"backend": "cpu"},
        "params": {
            **RunParams(pipeline_decodes=False).to_dict(),
            "prompt_tokens": 40,
            "output_tokens": 6,
            "chunk_size": 16,
        },
    }
    assert run_line(report).endswith("chunk 16")
    report["params"]["pipeline_decodes"] = True
    assert run_line(report).endswith("chunk 16; decodes pipelined")
    report["params"]["poll_during_chunks"] = True  # polling needs the mailbox: without it the line says nothing
    assert run_line(report).endswith("chunk 16; decodes pipelined")
    report["environment"]["token_read"] = "mailbox"
    assert run_line(report).endswith("chunk 16; decodes pipelined, polled during chunks")


def test_a_report_says_what_the_prefill_ran_as():
    from pdlib.text import run_line

    report = {
        "model": {"spec": "synthetic:tiny@0", "source": "synthetic"},
        "environment": {"backend": "cuda", "prefill_matmuls": "tf32x2", "prefill_attention": "flash-tf32x3"},
        "params": {**RunParams().to_dict(), "prompt_tokens": 40, "output_tokens": 6, "chunk_size": 16},
    }
    assert "backend cuda (prefill matmuls tf32x2, attention flash-tf32x3); prompts 40 tokens" in run_line(report)
    report["environment"].update(prefill_split_sums="fused", prefill_qk="kernel")  # newer reports say these too
    assert (
        "backend cuda (prefill matmuls tf32x2, split sums fused, attention flash-tf32x3, q/k kernel); prompts 40"
        in run_line(report)
    )
    report["environment"]["step_dispatch"] = "layers"  # and newer still, how a step with a chunk was dispatched
    assert "attention flash-tf32x3, q/k kernel, steps by layers); prompts 40" in run_line(report)


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_step_records_when_the_host_had_issued_it_and_began_waiting(tiny, monkeypatch, pipeline):
    """t_start <= t_issued <= t_wait <= t_end in every step. A host slowed by DELAY while building prompt steps
    shows in their issue time, and a token that takes DELAY to arrive in its step's wait, each nowhere else.
    DELAY is far above what a tiny model's step takes on a busy two-core machine, so the bounds do not race."""
    import time

    exp = experiment(tiny, ("chunked",))
    tokens = exp.validate()["chunked"].tokens
    real_issue, real_check = pdlib.run.executor._issue, pdlib.run.executor.check_token

    def slow_host(engine, step, *between):
        out = real_issue(engine, step, *between)
        if any(isinstance(w, Prefill) for w in step.work):
            time.sleep(DELAY_NS / 1e9)
        return out

    def slow_token(token):
        time.sleep(DELAY_NS / 1e9)
        return real_check(token)

    monkeypatch.setattr(pdlib.run.executor, "_issue", slow_host)
    monkeypatch.setattr(pdlib.run.executor, "check_token", slow_token)
    run = run_once(exp.engine, "chunked", steps=exp.walk("chunked"), logical_reset=True, pipeline=pipeline)
    check_tokens(run, tokens, what="trial")
    timed = [e for e in run.events if e["kind"] != "reset"]
    assert all(e["t_start_ns"] <= e["t_issued_ns"] <= e["t_wait_ns"] <= e["t_end_ns"] for e in timed)
    chunks = [e for e in timed if e["kind"] == "prefill" and e["stop"] < PROMPT]  # B's last chunk yields a token
    decodes = [e for e in timed if e["kind"] == "decode"]
    assert len(chunks) == math.ceil(PROMPT / CHUNK) - 1 and decodes
    assert all(e["t_issued_ns"] - e["t_start_ns"] >= DELAY_NS > e["t_end_ns"] - e["t_wait_ns"] for e in chunks)
    assert all(e["t_issued_ns"] - e["t_start_ns"] < DELAY_NS <= e["t_end_ns"] - e["t_wait_ns"] for e in decodes)
    # the host slept through its delay: not on the CPU
    assert all(0 <= e["cpu_issue_ns"] < DELAY_NS for e in chunks)


def _burn(ns: int) -> None:
    """Compute until this thread has had `ns` of CPU time."""
    import time

    c0 = time.thread_time_ns()
    while time.thread_time_ns() - c0 < ns:
        pass


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_steps_cpu_time_is_the_host_threads_own(tiny, monkeypatch, pipeline):
    """cpu_issue_ns: the host thread's CPU time while it issued the step. A host that computes for DELAY of its
    own CPU time while building each prompt step shows it there; one that sleeps DELAY (as it does while MLX
    holds it for the device) does not, nor one that waits DELAY for another thread's computing (the process's
    CPU time would count that); all three show in the issue span."""
    import threading
    import time

    exp = experiment(tiny, ("chunked",))
    exp.validate()
    real_issue = pdlib.run.executor._issue

    def other_thread_burns():
        worker = threading.Thread(target=_burn, args=(DELAY_NS,))
        worker.start()
        worker.join()

    hosts = {
        "burns": lambda: _burn(DELAY_NS),
        "sleeps": lambda: time.sleep(DELAY_NS / 1e9),
        "waits": other_thread_burns,
    }

    def host(delay):
        def issue(engine, step, *between):
            out = real_issue(engine, step, *between)
            if any(isinstance(w, Prefill) for w in step.work):
                delay()
            return out

        return issue

    cpu = {}
    for name, delay in hosts.items():
        monkeypatch.setattr(pdlib.run.executor, "_issue", host(delay))
        run = run_once(exp.engine, "chunked", steps=exp.walk("chunked"), logical_reset=True, pipeline=pipeline)
        chunks = [e for e in run.events if e["kind"] == "prefill"]
        assert all(e["t_issued_ns"] - e["t_start_ns"] >= DELAY_NS for e in chunks)
        cpu[name] = [e["cpu_issue_ns"] for e in chunks]
        assert all(
            0 <= e["cpu_issue_ns"] <= e["t_issued_ns"] - e["t_start_ns"] for e in run.events if e["kind"] != "reset"
        )
    assert all(c >= DELAY_NS for c in cpu["burns"])
    assert all(c < DELAY_NS for c in cpu["sleeps"]) and all(c < DELAY_NS for c in cpu["waits"])

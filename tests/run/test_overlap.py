"""`overlap`: B's whole prompt on a second stream of this device while A decodes on the first; the gate
checks it like every policy, a trial records the second stream's prefill and how many of A's tokens came out
during it; a planted fault in the second stream's prefill is caught; a prefill that never finishes is an
error, not a hang."""

import threading
import time

import numpy as np
import pytest
from plants import plant_prompt_token

import pdlib.run.overlap as overlap
from pdlib.__main__ import main
from pdlib.config import RunParams
from pdlib.report.metrics import overlap_line, trial_metrics
from pdlib.run.experiment import Experiment
from pdlib.run.trial import check_tokens, run_once
from pdlib.run.validate import ValidationError
from pdlib.scheduler import Decode, Prefill, plan

PROMPT, OUTPUTS = 40, 6


def experiment(tiny, chunk=16, policies=("chunked", "overlap")):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=chunk,
        policies=policies,
        logical_cache_reset=True,
        validation_checkpoint_every=4,
    )
    return Experiment(params, model=tiny)


def test_the_plan_prefills_b_once_remotely_and_the_policy_waits_for_the_probe():
    steps = plan("overlap", prompt_tokens=8, output_tokens=3, chunk_size=4)
    assert steps[2:] == [Prefill("B", 8, remote=True), Decode("A"), Decode("B"), Decode("A"), Decode("B")]
    assert plan("overlap", prompt_tokens=8, output_tokens=3, chunk_size=4) == plan(
        "disagg", prompt_tokens=8, output_tokens=3, chunk_size=4
    )


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_overlap_passes_the_gate_and_a_trial_records_the_second_stream(tiny, chunk):
    exp = experiment(tiny, chunk)
    results = exp.validate()
    o = results["overlap"]
    assert o.passed and o.tokens == results["chunked"].tokens
    # B's prefix is checked once, when joined; every output's logits and token and every decode slot as usual
    assert o.checks["prefix_kv"].count == -(-PROMPT // chunk) + 1
    assert o.checks["token"].count == o.checks["logits"].count == 2 * OUTPUTS
    assert o.checks["decode_kv"].count == 2 * (OUTPUTS - 1)
    run = run_once(exp.engine, "overlap", steps=exp.walk("overlap"), logical_reset=True)
    check_tokens(run, o.tokens, what="trial")
    (prefill,) = [e for e in run.events if e["req"] == "B" and e["kind"] == "prefill"]
    assert prefill["remote"] and prefill["site"] == "stream" and (prefill["start"], prefill["stop"]) == (0, PROMPT)
    assert 0 <= prefill["t_start_ns"] <= prefill["t_end_ns"] <= run.emit_ns["B"][0]
    assert not any(e["kind"] == "transfer" for e in run.events)
    # A's steps before the join are its ordinary decodes; the metric counts those inside the prefill's span
    a_before = [e for e in run.events if e["req"] == "A" and e["t_end_ns"] <= prefill["t_end_ns"]]
    assert all(e["kind"] == "decode" for e in a_before)
    trial = run.to_trial(trial=1, position=0)
    m = trial_metrics(trial)
    assert m["b_prefill_end_ms"] == prefill["t_end_ns"] / 1e6
    assert m["a_tokens_in_b_prefill"] == sum(prefill["t_start_ns"] < t < prefill["t_end_ns"] for t in run.emit_ns["A"])
    # B goes out a layer at a time, one more after each of A's steps: A is never held behind all of it (one
    # of A's tokens between each two of B's layers; the last may land just after B is joined)
    assert m["a_tokens_in_b_prefill"] >= tiny.config.num_hidden_layers - 1
    assert overlap_line([trial]).startswith("overlap: A emitted")


def test_a_wrong_token_in_the_second_streams_prefill_is_caught_by_prefix_kv(tiny, monkeypatch):
    plant_prompt_token(monkeypatch, overlap.StreamPrefill, tiny.config.vocab_size, 20)
    with pytest.raises(ValidationError, match="prefix_kv check, request B, position 20, layer 0:"):
        experiment(tiny, policies=("overlap",)).validate()


def test_a_prefill_that_never_finishes_is_an_error_not_a_hang(tiny, monkeypatch):
    monkeypatch.setenv("PDLIB_OVERLAP_TIMEOUT_S", "0.2")
    monkeypatch.setattr(overlap.StreamPrefill, "_wait", lambda self: None)  # the waiter never says done
    exp = experiment(tiny, policies=("overlap",))
    with pytest.raises(RuntimeError, match="did not finish within 0 s"):
        run_once(exp.engine, "overlap", steps=exp.walk("overlap"), logical_reset=True)


def test_the_issues_validate_command_passes_every_policy(capsys):
    rc = main(
        [
            "validate",
            "--model",
            "synthetic:tiny",
            "--prompt-tokens",
            "300",
            "--output-tokens",
            "40",
            "--chunk-size",
            "64",
            "--policies",
            "eager",
            "chunked",
            "fifo",
            "mixed",
            "overlap",
            "slo",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    rows = {
        line.split()[0]: line.split()[1]
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in ("eager", "chunked", "fifo", "mixed", "overlap", "slo-chunked")
    }
    assert rows == dict.fromkeys(("eager", "chunked", "fifo", "mixed", "overlap", "slo-chunked"), "pass")


def test_b_goes_out_a_layer_per_advance_and_each_is_counted_when_done(tiny):
    """The waiter must see every layer finish (it paces the dispatch): with the layers' arrays lost on the way
    (a generator yielding None), B stayed at its first layer until A ran out of work."""
    exp = experiment(tiny, policies=("overlap",))
    e = exp.engine
    e.reset("B", logical=True)
    p = overlap.StreamPrefill("B", PROMPT, stream=overlap.second_stream())
    p.start(e)
    layers = tiny.config.num_hidden_layers
    for k in range(1, layers + 1):
        assert p.layers_dispatched == k
        deadline = time.monotonic() + 10
        while p.layers_done < k and time.monotonic() < deadline:
            time.sleep(0.001)
        assert p.layers_done == k, f"layer {k} of B never counted as done"
        p.advance()  # not forced: it goes out only because the last one is done
    assert p._stages is None and p._done.wait(10) and p.ready()
    out, info = p.receive(e, "B", PROMPT)
    assert info["layers"] == layers and out.token.item() >= 0


def test_a_join_with_a_layer_still_out_builds_the_rest_only_once_the_waiter_is_done_waiting(tiny, monkeypatch):
    """Joined with nothing else to run while a layer of B's is still on the device, the rest of B's layers are
    built only after the waiter has finished waiting on the ones handed to it, and the forced ones are not
    handed to it: building on arrays that another thread waits on crashed the process on CUDA (a serving
    search's overlap and partition). The waiter's wait is held open here; a layer built inside it fails."""
    exp = experiment(tiny, policies=("overlap",))
    e = exp.engine
    e.reset("B", logical=True)
    waiting, real_eval = threading.Event(), overlap.mx.eval

    def held_eval(*arrays):
        if threading.current_thread().name != "pdlib-overlap-waiter":
            return real_eval(*arrays)
        waiting.set()
        try:
            real_eval(*arrays)
            time.sleep(0.2)
        finally:
            waiting.clear()

    built_while_waiting, real_stages = [], e.prefill_stages

    def watched(name, n):
        stages = real_stages(name, n)
        while True:
            built_while_waiting.append(waiting.is_set())
            try:
                arrays = next(stages)
            except StopIteration as done:
                return done.value
            yield arrays

    monkeypatch.setattr(overlap.mx, "eval", held_eval)
    monkeypatch.setattr(e, "prefill_stages", watched)
    p = overlap.StreamPrefill("B", PROMPT, stream=overlap.second_stream())
    p.start(e)
    deadline = time.monotonic() + 10
    while not waiting.is_set() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert waiting.is_set(), "the waiter never waited on B's first layer"
    out, info = p.receive(e, "B", PROMPT)  # forced: the first layer is still being waited on
    layers = tiny.config.num_hidden_layers
    assert info["layers"] == layers and len(built_while_waiting) == layers + 1
    assert not any(built_while_waiting), f"layers built while the waiter waited: {built_while_waiting}"
    forced = np.array(out.logits)
    monkeypatch.undo()
    e.reset("B", logical=True)
    plain = e.prefill_chunk("B", PROMPT)
    np.testing.assert_allclose(forced, np.array(plain.logits), rtol=1e-3, atol=1e-3)


def test_b_is_ready_long_before_a_runs_out_of_work(tiny):
    """A trial where A has many more tokens to go than B has layers: B's first token comes while A is still
    decoding, not after A's last token (what a second stream is for)."""
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=60,
        chunk_size=16,
        policies=("overlap",),
        logical_cache_reset=True,
        validation_checkpoint_every=4,
    )
    exp = Experiment(params, model=tiny)
    run = run_once(exp.engine, "overlap", steps=exp.walk("overlap"), logical_reset=True)
    m = trial_metrics(run.to_trial(trial=1, position=0))
    assert m["a_tokens_in_b_prefill"] < 59 - 20, m["a_tokens_in_b_prefill"]
    assert run.emit_ns["B"][0] < run.emit_ns["A"][-20]

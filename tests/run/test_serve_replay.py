"""The full gate on a serving run (pdlib/run/serve_replay.py): the logged steps replayed with the two-request
gate's checks on sampled requests. A good run passes with every check made; a K/V slot or a logit planted
wrong in the replay fails it, naming the request; a step log that is not the run is refused; a request that
diverged at a near tie is left out and named."""

import copy

import mlx.core as mx
import numpy as np
import pytest

from pdlib.engine import Engine
from pdlib.run.serve import run_serving
from pdlib.run.serve_gate import NEAR_TIE_MARGIN, reference_sequences
from pdlib.run.serve_replay import replay_gate
from pdlib.run.validate import ValidationError
from pdlib.workload import Workload, iter_prompts

MS = 1_000_000
CHUNK = 16


@pytest.fixture(scope="module")
def workload():
    return Workload(
        "test",
        np.array([0, 2 * MS, 4 * MS, 6 * MS, 8 * MS]),
        np.array([40, 70, 24, 56, 33]),
        np.array([5, 4, 6, 3, 2]),
    )


@pytest.fixture(scope="module")
def prompts(tiny, workload):
    return {p.name: p.token_ids for p in iter_prompts(workload, vocab_size=tiny.config.vocab_size)}


@pytest.fixture(scope="module")
def report(tiny, workload):
    return run_serving(tiny, workload, policy="mixed", chunk_size=CHUNK, replay=5)


def engine_for(tiny, workload, prompts):
    e = Engine(tiny, capacity=int((workload.prompt_tokens + workload.output_tokens).max()))
    for name in workload.names:
        e.add_request(name, prompts[name])
    return e


def test_a_run_is_replayed_with_every_check_on_its_sample(report):
    (run,) = report["runs"]
    replay = run["replay"]
    assert report["gate"]["checks"] == "tokens, and in full on a replay" and report["gate"]["replay_requests"] == 5
    assert replay["passed"] and replay["requests"] == ["r0", "r1", "r2", "r3", "r4"]
    assert 0 < replay["steps"] <= len(run["steps"]["work"])  # the steps with a sampled request in them
    c = replay["checks"]
    assert c["token"]["count"] == c["logits"]["count"] == 5 + 4 + 6 + 3 + 2
    assert c["decode_kv"]["count"] == 4 + 3 + 5 + 2 + 1  # every decode's slot: all outputs but the prompt's
    assert c["prefix_kv"]["count"] >= 5 and c["prefix_kv"]["worst_ratio"] <= 1
    assert 0 < replay["min_margin"] < float("inf") and replay["seconds"] > 0 and replay["peak_memory_bytes"] > 0


def test_a_sample_is_drawn_from_the_run_with_its_seed(tiny, workload, prompts, report):
    (run,) = report["runs"]
    picks = [replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=2, seed=s) for s in (3, 3)]
    assert picks[0]["requests"] == picks[1]["requests"] and len(picks[0]["requests"]) == 2
    assert picks[0]["checks"]["token"]["count"] < report["runs"][0]["replay"]["checks"]["token"]["count"]


def plant_wrong_k_slot(monkeypatch, layer: int) -> None:
    """r2's decodes write layer `layer`'s K slot off by 0.01."""
    real = Engine.batch

    def wrong_slot(self, parts, **kw):
        outs = real(self, parts, **kw)
        for name, n in parts:
            if name == "r2" and n is None:
                c = self.requests[name].cache
                c.k[layer] = c.k[layer] + 0.01
        return outs

    monkeypatch.setattr(Engine, "batch", wrong_slot)


def test_a_planted_wrong_slot_or_logit_fails_naming_the_request(tiny, workload, prompts, report, monkeypatch):
    (run,) = report["runs"]
    real = Engine.batch
    plant_wrong_k_slot(monkeypatch, 0)
    with pytest.raises(ValidationError, match=r"decode_kv check, request r2, position 24, layer 0:"):
        replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=5)

    def wrong_logit(self, parts, **kw):  # r3's outputs come back with one logit moved
        outs = real(self, parts, **kw)
        for (name, _), out in zip(parts, outs):
            if name == "r3" and out is not None:
                out.logits = out.logits + mx.where(mx.arange(out.logits.size) == 7, 0.5, 0.0)
        return outs

    monkeypatch.setattr(Engine, "batch", wrong_logit)
    with pytest.raises(ValidationError, match=r"logits check, request r3"):
        replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=5)


def test_a_step_log_that_is_not_the_run_is_refused(tiny, workload, prompts, report):
    run = copy.deepcopy(report["runs"][0])
    run["requests"][1]["output_ids"][-1] ^= 1  # the run says r1 emitted another last token
    with pytest.raises(RuntimeError, match=r"gave r1 other tokens than the run \(output 3: "):
        replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=1)


def test_a_step_log_holding_more_requests_at_once_than_caches_is_refused(tiny, workload, prompts, report):
    from pdlib.errors import RunFailure

    e = Engine(tiny, capacity=int((workload.prompt_tokens + workload.output_tokens).max()), slots=2)
    for name in workload.names:
        e.add_request(name, prompts[name], cached=False)
    run = report["runs"][0]  # mixed at these arrivals: more than two requests live at once
    with pytest.raises(RunFailure, match=r"needs more caches than the engine holds: the steps logged are not"):
        replay_gate(e, tiny, run, prompts, sample=1)


def test_a_request_diverged_at_a_near_tie_is_left_out_and_named(tiny, workload, prompts):
    outputs = dict(zip(workload.names, workload.output_tokens.tolist()))
    refs, _ = reference_sequences(tiny, prompts, outputs)
    planted = copy.deepcopy(refs)
    r = planted["r1"]
    pick = r.tokens[1]
    r.tokens[1], r.runner_up[1], r.margin[1] = pick ^ 1, pick, NEAR_TIE_MARGIN / 2
    report = run_serving(tiny, workload, policy="eager", chunk_size=CHUNK, refs=planted, replay=5)
    replay = report["runs"][0]["replay"]
    assert replay["skipped_near_ties"] == ["r1"] and replay["requests"] == ["r0", "r2", "r3", "r4"]


def test_a_failed_replay_check_is_one_error_line_from_the_cli(tmp_path, monkeypatch, capsys):
    from pdlib.__main__ import main
    from pdlib.run import serve_replay

    real = serve_replay.ReferenceTrace.output

    def shifted(self, i):  # the reference's logits moved by 0.5: every output's logits check fails
        logits, token = real(self, i)
        return logits + 0.5, token

    monkeypatch.setattr(serve_replay.ReferenceTrace, "output", shifted)
    params = tmp_path / "p.yaml"
    params.write_text(
        "model: synthetic:tiny\npolicies: [mixed]\nworkload: {source: pair, prompt_tokens: 8, output_tokens: 2}\n"
    )
    out = tmp_path / "r.json"
    assert main(["serve", "--params", str(params), "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists()
    assert err[0].startswith("error: validation failed for policy 'mixed (replay)': logits check, request A")


def test_the_kv_checks_compare_a_slice_of_layers_at_a_time(tiny, workload, prompts, report, monkeypatch):
    """A long prefix's K/V is compared a few layers at a time (validate.KV_CHECK_BYTES): the same checks and
    worst errors as all layers at once, and a wrong slot in a later slice still named by its own layer."""
    from pdlib.run import validate

    (run,) = report["runs"]
    whole = replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=5)
    slices = []
    real_kv = Engine.kv

    def kv(self, name, start, stop, layers=None):
        slices.append(len(layers))
        return real_kv(self, name, start, stop, layers)

    monkeypatch.setattr(validate, "KV_CHECK_BYTES", 1)  # one layer a slice
    monkeypatch.setattr(Engine, "kv", kv)
    sliced = replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=5)
    assert slices and set(slices) == {1} and len(slices) % tiny.config.num_hidden_layers == 0
    for kind in ("prefix_kv", "decode_kv", "checkpoint_kv"):
        for stat in ("count", "worst_abs", "worst_ratio", "where"):  # where: the worst's layer, not its slice's index
            assert sliced["checks"][kind][stat] == whole["checks"][kind][stat], (kind, stat)
    assert any(whole["checks"][k]["where"]["layer"] > 0 for k in ("prefix_kv", "decode_kv", "checkpoint_kv"))
    plant_wrong_k_slot(monkeypatch, 1)
    with pytest.raises(ValidationError, match=r"decode_kv check, request r2, position 24, layer 1:"):
        replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=5)


def test_each_sampled_reference_is_released_when_its_request_ends(tiny, workload, prompts, report, monkeypatch):
    from pdlib.run.reference import Reference
    from pdlib.run.validate import ReferenceTrace

    (run,) = report["runs"]
    released, real = [], ReferenceTrace.release
    started, real_stream = [], Reference.stream

    def release(self):
        released.append((self.prompt_ids, self.stream is not None))
        real(self)

    def stream(self, prompt_ids):
        started.append(list(prompt_ids))
        return real_stream(self, prompt_ids)

    monkeypatch.setattr(ReferenceTrace, "release", release)
    monkeypatch.setattr(Reference, "stream", stream)
    record = replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=3, seed=1)
    assert sorted(ids for ids, _ in released) == sorted(list(prompts[name]) for name in record["requests"])
    assert all(held for _, held in released)  # each released once, holding its stream until then
    assert sorted(started) == sorted(ids for ids, _ in released)  # never released early and started again


def test_a_replays_peak_memory_is_its_own(tiny, workload, prompts, report):
    (run,) = report["runs"]
    big = mx.zeros((64, 1024, 1024))  # 256 MiB held and freed before the replay: not its peak
    mx.eval(big)
    del big
    record = replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=1)
    assert 0 < record["peak_memory_bytes"] < 64 * 2**20


def test_a_replay_out_of_device_memory_is_the_checks_failure_not_the_runs(tiny, workload, prompts, report, monkeypatch):
    """On an H100 the replays of the code trace ran out of memory beside 60 GiB of caches, after runs that did
    not: that is a RunFailure naming the replay (a search then stops rather than record the policy as failing
    for memory); any other error is left as it is."""
    from pdlib.errors import ChecksOutOfMemory, out_of_memory
    from pdlib.run.validate import Gate

    (run,) = report["runs"]

    def oom(self, *args, **kw):
        raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed: out of memory")

    monkeypatch.setattr(Gate, "on_step", oom)
    with pytest.raises(ChecksOutOfMemory, match=r"^the replay of mixed's steps \(the full checks on 2 of") as e:
        replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=2)
    assert "cudaMallocAsync(&data, size, stream) failed: out of memory" in str(e.value)
    assert not out_of_memory(e.value)

    def other(self, *args, **kw):
        raise RuntimeError("[cuda] kernel launch failed")

    monkeypatch.setattr(Gate, "on_step", other)
    with pytest.raises(RuntimeError, match=r"^\[cuda\] kernel launch failed$"):
        replay_gate(engine_for(tiny, workload, prompts), tiny, run, prompts, sample=2)

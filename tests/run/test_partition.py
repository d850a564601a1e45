"""`partition`: overlap's steps with A's decodes on one slice of the SMs and B's prefill on the other. On the
CPU (no green contexts) it runs on two plain streams, which is what CI checks: the gate passes it, A's steps
from t0 to the join are issued on slice A's stream and the rest on the device's default stream, B's layers
go out on slice B's, a trial records where B ran, and planted faults (a wrong prompt token, a wrong
position in B's prefill) fail the gate. The SM split itself is a GPU matter: check-kernels' slice rows."""

import mlx.core as mx
import pytest
from plants import plant_prompt_token

import pdlib.run.partition as partition
from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine.kernels import persistent_decode, slices
from pdlib.engine.model import Qwen3
from pdlib.errors import InputError
from pdlib.report.metrics import overlap_line
from pdlib.run.experiment import Experiment
from pdlib.run.trial import check_tokens, run_once
from pdlib.run.validate import ValidationError
from pdlib.scheduler import POLICIES, plan

PROMPT, OUTPUTS = 40, 6


def experiment(tiny, policies=("chunked", "partition")):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=16,
        policies=policies,
        logical_cache_reset=True,
        validation_checkpoint_every=4,
    )
    return Experiment(params, model=tiny)


def test_partition_takes_overlaps_steps_on_slices():
    assert POLICIES["partition"].remote_prefill == "slice"
    kw = dict(prompt_tokens=8, output_tokens=3, chunk_size=4)
    assert plan("partition", **kw) == plan("overlap", **kw)


def test_partition_passes_the_gate_and_a_step_is_issued_where_the_policy_says(tiny, monkeypatch):
    exp = experiment(tiny)
    results = exp.validate()
    p = results["partition"]
    assert p.passed and p.tokens == results["chunked"].tokens
    assert p.checks["token"].count == p.checks["logits"].count == 2 * OUTPUTS
    assert p.checks["prefix_kv"].count >= 1 and p.checks["decode_kv"].count == 2 * (OUTPUTS - 1)

    pair = partition.slice_pair()
    assert pair.a.stream != pair.b.stream and pair.a.sms is None  # the CPU: two streams, no split
    seen = []  # (request, stream) of each decode as the engine is asked for it
    decode = Engine.decode

    def spy(self, name):
        seen.append((name, mx.default_stream(mx.default_device())))
        return decode(self, name)

    monkeypatch.setattr(Engine, "decode", spy)
    run = run_once(exp.engine, "partition", steps=exp.walk("partition"), logical_reset=True)
    check_tokens(run, p.tokens, what="trial")
    (prefill,) = [e for e in run.events if e["req"] == "B" and e["kind"] == "prefill"]
    assert prefill["site"] == "slice" and prefill["remote"] and (prefill["start"], prefill["stop"]) == (0, PROMPT)
    assert (prefill["split"], prefill["a_sms"], prefill["b_sms"]) == (False, None, None)
    default = mx.default_stream(mx.default_device())
    b_first = next(i for i, (name, _) in enumerate(seen) if name == "B")
    before, after = seen[:b_first], seen[b_first:]
    on_a = [name for name, s in before if s == pair.a.stream]
    assert on_a and set(on_a) == {"A"}, "A's decodes while B's prefill is out run on slice A"
    assert all(s == default for name, s in before if s != pair.a.stream), "set-up decodes: the whole device"
    assert all(s == default for _, s in after), "after the join every decode runs on the whole device"
    assert overlap_line(run_trials(run), "partition").startswith("partition: A emitted")


def run_trials(run) -> list[dict]:
    return [run.to_trial(trial=1, position=0)]


def test_b_goes_out_on_slice_b(tiny, monkeypatch):
    exp = experiment(tiny, policies=("partition",))
    pair = partition.slice_pair()
    streams = []  # the stream each of B's layers was built and started on
    real = Engine._layer_by_layer

    def spy(self, reqs, segments):
        gen = real(self, reqs, segments)
        mine = reqs[0] is self.requests["B"]
        while True:
            if mine:
                streams.append(mx.default_stream(mx.default_device()))
            try:
                arrays = next(gen)
            except StopIteration as done:
                return done.value
            yield arrays

    monkeypatch.setattr(Engine, "_layer_by_layer", spy)
    run_once(exp.engine, "partition", steps=exp.walk("partition"), logical_reset=True)
    assert len(streams) > tiny.config.num_hidden_layers and all(s == pair.b.stream for s in streams)


def test_a_wrong_prompt_token_in_bs_prefill_fails_the_gate(tiny, monkeypatch):
    plant_prompt_token(monkeypatch, partition.SlicePrefill, tiny.config.vocab_size, 20)  # on slice B
    with pytest.raises(ValidationError, match="prefix_kv check, request B, position 20, layer 0:"):
        experiment(tiny, policies=("partition",)).validate()


def test_a_wrong_position_in_bs_prefill_fails_the_gate(tiny, monkeypatch):
    real_positions, real_start = Qwen3._positions, partition.SlicePrefill.start
    on = []

    def positions(segments):  # slice B's prefill: every row one position on (RoPE's and the mask's)
        p = real_positions(segments)
        return p + 1 if on else p

    def start(self, engine):  # the step's positions are made before its first layer goes out, here
        on.append(True)
        try:
            real_start(self, engine)
        finally:
            on.clear()

    monkeypatch.setattr(Qwen3, "_positions", staticmethod(positions))
    monkeypatch.setattr(partition.SlicePrefill, "start", start)
    with pytest.raises(ValidationError, match="prefix_kv check, request B, position 0, layer 0:"):
        experiment(tiny, policies=("partition",)).validate()


def test_slices_say_what_they_need_and_size_the_persistent_grid(monkeypatch):
    with pytest.raises(InputError, match="SM slices need a CUDA GPU"):
        slices.split(48)
    assert slices.current_sms() is None
    where = slices.Slice(40, mx.new_stream(mx.default_device()))
    with where.active():
        assert slices.current_sms() == 40 and persistent_decode.sm_count() == 40
        monkeypatch.setenv("PDLIB_PERSISTENT_BLOCKS", "100")  # never past the slice: those blocks would wait
        assert persistent_decode.sm_count() == 40
        monkeypatch.setenv("PDLIB_PERSISTENT_BLOCKS", "16")
        assert persistent_decode.sm_count() == 16
    assert slices.current_sms() is None

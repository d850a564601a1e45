"""The `mixed` policy: every ready decode and B's next chunk as one ragged engine step, checked by the gate
like every other step; faults inside a mixed step are caught by the check that should catch them."""

import mlx.core as mx
import pytest

from pdlib.__main__ import main
from pdlib.config import RunParams
from pdlib.engine import kernels as K
from pdlib.engine.model import Qwen3
from pdlib.run.experiment import Experiment
from pdlib.run.trial import check_tokens, run_once
from pdlib.run.validate import ValidationError
from pdlib.scheduler import Batch

PROMPT, OUTPUTS = 40, 6


def experiment(tiny, chunk, policies=("mixed",)):
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


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_mixed_passes_the_gate_and_a_trial_reproduces_it(tiny, chunk):
    exp = experiment(tiny, chunk, ("chunked", "mixed"))
    results = exp.validate()
    assert results["mixed"].passed and results["mixed"].tokens == results["chunked"].tokens
    steps = exp.plan("mixed")
    assert any(isinstance(s, Batch) and len(s.work) == 2 for s in steps)
    run = run_once(exp.engine, "mixed", steps=exp.walk("mixed"), logical_reset=True)
    check_tokens(run, results["mixed"].tokens, what="trial")


def fails(exp):
    with pytest.raises(ValidationError) as e:
        exp.validate()
    return str(e.value)


def test_a_decode_row_attending_the_other_requests_cache_is_caught(tiny, monkeypatch):
    exp = experiment(tiny, 16)
    a, b = (exp.engine.requests[r].cache for r in "AB")
    real_stages, real_attention, ragged = Qwen3.stages, K.decode_attention, []

    def stages(self, segments, **kw):  # the ragged steps' layers (decode steps do not pass through here)
        ragged.append(len(segments) > 1)
        try:
            return (yield from real_stages(self, segments, **kw))
        finally:
            ragged.pop()

    def decode_attention(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw):
        if ragged and ragged[-1] and any(k_cache is x for x in a.k):  # A's decode row reads B's cache instead
            i = next(i for i, x in enumerate(a.k) if x is k_cache)
            k_cache, v_cache = b.k[i], b.v[i]
        return real_attention(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw)

    monkeypatch.setattr(Qwen3, "stages", stages)
    monkeypatch.setattr(K, "decode_attention", decode_attention)
    # layer 0 stores A's own k/v (right: on the CPU the ops twin hands the row back to A's cache); its attention
    # output is wrong, so layer 1's new slot is
    assert f"decode_kv check, request A, position {PROMPT}, layer 1" in fails(exp)


def test_a_decode_row_at_the_wrong_position_is_caught(tiny, monkeypatch):
    exp = experiment(tiny, 16)
    real = Qwen3._positions

    def positions(segments):
        return mx.concatenate([real([s]) + (1 if s.size == 1 else 0) for s in segments])

    monkeypatch.setattr(Qwen3, "_positions", staticmethod(positions))
    # RoPE at position + 1: the K slot a decode row stores is already wrong in layer 0
    assert f"decode_kv check, request A, position {PROMPT}, layer 0" in fails(exp)


def test_validate_command_runs_every_policy(capsys):
    rc = main(
        [
            "validate",
            "--model",
            "synthetic:tiny",
            "--prompt-tokens",
            "60",
            "--output-tokens",
            "8",
            "--chunk-size",
            "16",
            "--policies",
            "eager",
            "chunked",
            "fifo",
            "mixed",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[3:]}
    assert rows == {"eager": "pass", "chunked": "pass", "fifo": "pass", "mixed": "pass"}

"""The gate catches planted faults, each by the check that should catch it, and says where."""

import importlib

import mlx.core as mx
import pytest

from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine.cache import KVCache
from pdlib.engine.model import Qwen3
from pdlib.run.experiment import Experiment
from pdlib.run.validate import ValidationError

decode_attention_module = importlib.import_module("pdlib.engine.kernels.decode_attention")

PROMPT, OUTPUTS, CHUNK = 40, 8, 16


@pytest.fixture(params=[False, True], ids=["observed", "pipelined"])
def exp(tiny, request):
    """Every fault is planted twice: with each step's tokens observed before the next is issued, and with
    pipelined decodes (the gate then checks a step after the next one was issued)."""
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=CHUNK,
        policies=("eager", "chunked", "fifo"),
        logical_cache_reset=True,
        validation_checkpoint_every=4,
        pipeline_decodes=request.param,
    )
    return Experiment(params, model=tiny)


def fails(exp, policy="chunked"):
    with pytest.raises(ValidationError) as e:
        exp.validate([policy])
    assert not e.value.result.passed and e.value.result.failure == str(e.value)
    return e.value


def test_perturbed_k_slot_is_caught_by_decode_kv(exp, monkeypatch):
    real = Engine.decode

    def decode(self, name):
        out = real(self, name)
        r = self.requests[name]
        if name == "B" and r.length == PROMPT + 3:  # B's third decode wrote slot PROMPT + 2
            r.cache.k[1][0, PROMPT + 2, 5] += 0.01
        return out

    monkeypatch.setattr(Engine, "decode", decode)
    e = fails(exp)
    assert "decode_kv check, request B, position 42, layer 1" in str(e)
    assert e.result.checks["decode_kv"].where == {"request": "B", "layer": 1, "position": PROMPT + 2}


def test_wrong_token_is_caught_by_the_token_check(exp, monkeypatch):
    real = Engine._emit

    def emit(r, logits, token=None):
        out = real(r, logits, token)
        if r.cache.length == PROMPT + 4 and r is exp.engine.requests["A"]:
            out.token = (out.token + 1) % logits.shape[0]
            r.next_token = out.token
        return out

    monkeypatch.setattr(Engine, "_emit", staticmethod(emit))
    e = fails(exp, "fifo")
    assert "token check, request A, position 43" in str(e) and "output 4 is token" in str(e)
    assert e.result.checks["logits"].worst_ratio <= 1  # the logits themselves were right


def test_off_by_one_position_is_caught_by_decode_kv(exp, monkeypatch):
    # every decode runs (and stores its K/V) one position past the cache's length
    monkeypatch.setattr(KVCache, "position", lambda self: mx.array([self.length + 1], mx.int32))
    e = fails(exp, "eager")
    assert "decode_kv check" in str(e) and f"position {PROMPT}" in str(e) and "layer 0" in str(e)


def test_stale_cache_entry_is_caught(tiny, monkeypatch):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=CHUNK,
        policies=("eager", "chunked"),
        logical_cache_reset=True,
    )
    exp = Experiment(params, model=tiny, compile_steps=False)  # uncompiled, so the planted mask takes effect
    exp.validate(["eager"])  # leaves stale K/V in both caches (logical reset keeps them)
    real = decode_attention_module.causal_mask
    # decode attention now also sees the slot after the new token's: stale, left by the earlier run
    monkeypatch.setattr(decode_attention_module, "causal_mask", lambda pos, cap: real(pos + 1, cap))
    e = fails(exp)
    assert e.result.checks["prefix_kv"].worst_ratio <= 1  # the prompts were fine
    # A's first decode read the stale slot in layer 0's attention: the K/V slot it writes in layer 1 is wrong
    assert f"decode_kv check, request A, position {PROMPT}, layer 1" in str(e)


def test_a_wrong_prefill_chunk_is_caught_by_prefix_kv(exp, monkeypatch):
    real = Qwen3.stages  # a step's layers, however it is dispatched (Qwen3.step runs them too)

    def stages(self, segments, *, prune=True):
        for s in segments:
            if s.start == CHUNK:  # the second chunk sees its tokens shifted by one
                s.tokens = mx.concatenate([s.tokens[1:], s.tokens[:1]])
        return (yield from real(self, segments, prune=prune))

    monkeypatch.setattr(Qwen3, "stages", stages)
    e = fails(exp, "eager")
    assert "prefix_kv check, request A" in str(e) and "layer 0" in str(e)
    assert CHUNK <= e.result.checks["prefix_kv"].where["position"] < 2 * CHUNK


def test_corrupted_old_cache_entry_is_caught_by_a_checkpoint(exp, monkeypatch):
    real = Engine.decode

    def decode(self, name):
        out = real(self, name)
        r = self.requests[name]
        if name == "A" and r.length == PROMPT + 1:  # after A's first decode, damage a prompt entry
            r.cache.v[2][1, 3, 0] += 1.0
        return out

    monkeypatch.setattr(Engine, "decode", decode)
    e = fails(exp, "fifo")
    # decode_kv only looks at the new slot; the later logits or the checkpoint must notice the damage
    assert e.result.failure.split(":")[1].strip().split(" check")[0] in ("logits", "checkpoint_kv")
    assert "request A" in str(e)


def test_nan_is_a_failure(exp, monkeypatch):
    real = Engine.decode

    def decode(self, name):
        out = real(self, name)
        out.logits = mx.where(mx.arange(out.logits.shape[0]) == 7, mx.nan, out.logits)
        return out

    monkeypatch.setattr(Engine, "decode", decode)
    e = fails(exp)
    assert "logits check" in str(e)


def test_result_dict_reports_worst_errors_and_margin(exp):
    r = exp.validate(["chunked"])["chunked"].to_dict()
    assert r["passed"] and r["tolerance"] == {"atol": 1e-3, "rtol": 1e-3}
    assert set(r["checks"]) == {"prefix_kv", "logits", "token", "decode_kv", "checkpoint_kv"}
    assert 0 < r["checks"]["logits"]["worst_abs"] < 1e-3
    assert r["checks"]["prefix_kv"]["where"]["request"] in ("A", "B")
    assert r["min_margin"] > 0 and r["min_margin_where"]["request"] in ("A", "B")


def test_non_finite_references_are_not_waved_through():
    """A NaN or infinite reference passes only where the engine produced exactly the same value."""
    from pdlib.tolerance import tolerance_stats

    ref = mx.array([[1.0, mx.nan, mx.inf, -mx.inf]])
    cases = {
        "equal": ([1.0, mx.nan, mx.inf, -mx.inf], [0, 1, 0, 0]),
        "finite for inf": ([1.0, 0.0, 5.0, 7.0], [0, 1, 1, 1]),
        "wrong sign": ([1.0, 1.0, -mx.inf, mx.inf], [0, 1, 1, 1]),
    }
    for name, (x, want_bad) in cases.items():
        for j, w in enumerate(want_bad):
            (_, (ratio,), (bad,)) = tolerance_stats(mx.array([[x[j]]]), ref[:, j : j + 1]).tolist()
            assert bad == w, (name, j)
            assert (ratio > 1) == bool(w), (name, j)


def test_a_bad_last_decode_slot_is_caught_when_the_run_ends(tiny, monkeypatch):
    """Decode slots are compared in batches; the last batch is compared when the run ends (no checkpoint
    here, which would compare it first)."""
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=CHUNK,
        policies=("fifo",),
        logical_cache_reset=True,
        validation_checkpoint_every=64,
    )
    exp = Experiment(params, model=tiny)
    real = Engine.decode

    def decode(self, name):
        out = real(self, name)
        r = self.requests[name]
        if name == "A" and r.length == PROMPT + OUTPUTS - 1:  # A's last decode wrote slot PROMPT + OUTPUTS - 2
            r.cache.v[0][1, PROMPT + OUTPUTS - 2, 3] += 0.01
        return out

    monkeypatch.setattr(Engine, "decode", decode)
    e = fails(exp, "fifo")
    assert f"decode_kv check, request A, position {PROMPT + OUTPUTS - 2}, layer 0" in str(e)

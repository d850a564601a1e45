"""pdlib's engine against mlx-lm's reference Qwen3 on the tiny preset, through the validation gate."""

import mlx.core as mx
import numpy as np
import pytest

from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine import model as model_module
from pdlib.errors import InputError
from pdlib.run.experiment import Experiment
from pdlib.run.reference import Reference
from pdlib.run.validate import ReferenceTrace, validate_policy

PROMPT, OUTPUTS = 40, 8


def experiment(tiny, *, chunk_size=16, logical=True, **kw):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=chunk_size,
        policies=("eager", "chunked", "fifo"),
        logical_cache_reset=logical,
        validation_checkpoint_every=3,
    )
    return Experiment(params, model=tiny, **kw)


@pytest.mark.parametrize("chunk_size", [1, 7, PROMPT, PROMPT + 25])
def test_every_policy_matches_the_reference(tiny, chunk_size):
    results = experiment(tiny, chunk_size=chunk_size).validate()
    assert set(results) == {"eager", "chunked", "fifo"}
    chunks = -(-PROMPT // chunk_size)
    for policy, r in results.items():
        assert r.passed and r.failure is None
        assert r.checks["prefix_kv"].count == 2 * chunks  # every chunk of both prompts
        assert r.checks["logits"].count == r.checks["token"].count == 2 * OUTPUTS
        assert r.checks["decode_kv"].count == 2 * (OUTPUTS - 1)
        assert r.checks["checkpoint_kv"].count == 2 * (OUTPUTS // 3)
        for name, c in r.checks.items():
            assert c.worst_ratio <= 1.0, (policy, name)
        assert 0 < r.min_margin < float("inf")
        assert [len(r.tokens[q]) for q in "AB"] == [OUTPUTS, OUTPUTS]
    # the policies differ only in order, so they must produce the same tokens
    assert results["eager"].tokens == results["chunked"].tokens == results["fifo"].tokens


def run_tokens(engine, prompt, outputs, chunk):
    engine.add_request("A", prompt)
    engine.reset("A", logical=False)
    logits, tokens = [], []
    for start in range(0, len(prompt), chunk):
        out = engine.prefill_chunk("A", min(chunk, len(prompt) - start))
    for i in range(outputs):
        logits.append(out.logits)
        tokens.append(out.token.item())
        if i < outputs - 1:
            out = engine.decode("A")
    return tokens, mx.stack(logits)


def test_packed_and_unpacked_decode_weights_agree(tiny):
    prompt = experiment(tiny).prompts["A"].token_ids
    packed = Engine(tiny, capacity=80, lossless_decode_weights=True)
    plain = Engine(tiny, capacity=80, lossless_decode_weights=False)
    assert packed.model.layers[0].d_qkv.dtype == mx.bfloat16 and plain.model.layers[0].d_qkv.dtype == mx.float32
    assert packed.model.d_lm_head.dtype == mx.bfloat16
    t1, l1 = run_tokens(packed, prompt, 20, 16)
    t2, l2 = run_tokens(plain, prompt, 20, 16)
    assert t1 == t2
    assert mx.array_equal(l1, l2).item()  # lossless packing: the same FP32 values reach the same arithmetic


def test_final_layer_pruning_changes_no_result_and_does_prune(tiny, monkeypatch):
    calls = []
    real = model_module.K.attention_rows

    def spy(q, k, v, *, mask_rows, scale):
        calls.append(q.shape[1])
        return real(q, k, v, mask_rows=mask_rows, scale=scale)

    monkeypatch.setattr(model_module.K, "attention_rows", spy)
    prompt = experiment(tiny).prompts["A"].token_ids
    layers = tiny.config.num_hidden_layers
    pruned = Engine(tiny, capacity=80, prune_final_layer=True, compile_steps=False)  # the spy sees every call
    t1, l1 = run_tokens(pruned, prompt, 6, 16)  # chunks of 16, 16, 8
    prefill_calls = calls[: 3 * layers - 2]  # the final layer skips attention in two chunks
    assert prefill_calls == [16] * (layers - 1) + [16] * (layers - 1) + [8] * (layers - 1) + [1]
    calls.clear()
    full = Engine(tiny, capacity=80, prune_final_layer=False, compile_steps=False)
    t2, l2 = run_tokens(full, prompt, 6, 16)
    assert calls[: 3 * layers] == [16] * layers + [16] * layers + [8] * layers
    assert t1 == t2
    assert mx.allclose(l1, l2, rtol=1e-5, atol=1e-5).item()
    # and the pruned engine passes the whole gate
    assert all(r.passed for r in experiment(tiny).validate().values())


def test_logical_reset_reuses_memory_and_leaks_nothing(tiny):
    exp = experiment(tiny, logical=True)
    cache = exp.engine.requests["B"].cache
    first = exp.validate(["eager"])["eager"]
    allocations = cache.allocations
    stale = mx.array(np.array(cache.k[0][:, : PROMPT + OUTPUTS - 1]))  # a host copy: GPU kernels write in place
    exp.engine.reset("B", logical=True)
    assert cache.length == 0 and cache.allocations == allocations
    # the stale entries are still there after a logical reset ...
    assert mx.array_equal(cache.k[0][:, : PROMPT + OUTPUTS - 1], stale).item()
    assert mx.any(stale != 0).item()
    # ... and the next runs, which write over them, still match the reference exactly
    second = exp.validate(["chunked", "fifo"])
    assert cache.allocations == allocations
    assert all(r.passed for r in second.values()) and second["fifo"].tokens == first.tokens


@pytest.mark.parametrize("in_place", [False, True])
def test_the_cache_layout(monkeypatch, in_place):
    """Where kernels write in place, the layers' K and V are views of one (L, Hkv, cap, Dh) array each (the
    persistent decode takes that array, two buffers instead of 2 L), also after a full reset; elsewhere each
    layer has its own array and `k_all` is a stacked copy. One fence per cache either way."""
    from pdlib.engine import cache as cache_module

    monkeypatch.setattr(cache_module, "stores_kv_in_place", lambda head_dim: in_place)
    cache = cache_module.KVCache(layers=3, kv_heads=2, head_dim=8, capacity=5)
    for _ in range(2):
        assert cache.k_all.shape == cache.v_all.shape == (3, 2, 5, 8) and cache.written.shape == (4,)
        base = np.asarray(cache.k_all).__array_interface__["data"][0]
        addresses = [np.asarray(k).__array_interface__["data"][0] - base for k in cache.k]
        layer_bytes = 2 * 5 * 8 * 4
        assert (addresses == [i * layer_bytes for i in range(3)]) == in_place
        cache.reset(logical=False)


def test_full_reset_reallocates(tiny):
    exp = experiment(tiny, logical=False)
    cache = exp.engine.requests["B"].cache
    before = cache.allocations
    exp.validate(["eager"])
    assert cache.allocations == before + 1  # B's reset at t0
    exp.engine.reset("B", logical=False)
    assert cache.allocations == before + 2 and not mx.any(cache.k[0] != 0).item()


def test_reference_trace_matches_a_fresh_stream_and_restarts(tiny):
    exp = experiment(tiny)
    trace = ReferenceTrace(Reference(tiny), exp.prompts["A"].token_ids)
    logits3, tok3 = trace.output(3)
    stream = Reference(tiny).stream(exp.prompts["A"].token_ids)
    for _ in range(3):
        stream.step()
    assert stream.token.item() == tok3 and len(trace.tokens) == 4
    assert mx.array_equal(stream.logits, logits3).item()
    # a new policy starts over from output 0: the reference restarts and reproduces itself exactly
    first = trace.tokens[:]
    logits0, tok0 = trace.output(0)
    assert trace.index == 0 and tok0 == first[0] and trace.stream.length == len(exp.prompts["A"].token_ids)
    assert trace.output(3)[1] == tok3 and trace.tokens == first


def test_validation_runs_the_reference_once_within_the_logits_budget(tiny, monkeypatch):
    """A later policy replays the kept logits; with no budget the trace holds only the current row and every
    policy re-runs the reference, as before."""
    import pdlib.run.experiment as experiment_module
    from pdlib.run.reference import ReferenceStream

    steps = []
    real = ReferenceStream.step
    monkeypatch.setattr(ReferenceStream, "step", lambda self: steps.append(1) or real(self))
    exp = experiment(tiny)
    exp.validate(["chunked", "fifo"])
    assert len(steps) == 2 * (OUTPUTS - 1)  # A and B once each, for both policies
    for trace in exp.traces.values():
        assert len(trace.kept) == OUTPUTS and trace.index == OUTPUTS - 1
    steps.clear()
    monkeypatch.setattr(experiment_module, "KEEP_REFERENCE_LOGITS_BYTES", 0)
    exp = experiment(tiny)
    results = exp.validate(["chunked", "fifo"])
    assert len(steps) == 2 * 2 * (OUTPUTS - 1) and results["fifo"].passed
    for trace in exp.traces.values():
        arrays = [v for v in vars(trace).values() if isinstance(v, mx.array)]
        lists = [v for v in vars(trace).values() if isinstance(v, list) and v and isinstance(v[0], mx.array)]
        assert not arrays and not lists
        assert trace.index == OUTPUTS - 1


def test_engine_rejects_bad_steps(tiny):
    engine = Engine(tiny, capacity=64)
    engine.add_request("A", list(range(10)))
    with pytest.raises(ValueError, match="before its prompt"):
        engine.decode("A")
    with pytest.raises(ValueError, match="overruns"):
        engine.prefill_chunk("A", 11)
    with pytest.raises(ValueError, match="no room"):
        engine.add_request("B", list(range(64)))
    vocab = tiny.config.vocab_size
    for bad in (vocab, -1):  # one past the embedding table reads past it (a segfault on the CPU, not an error)
        with pytest.raises(
            ValueError, match=rf"prompt token id {bad} is outside the model's vocabulary \[0, {vocab}\)"
        ):
            engine.add_request("C", [1, bad, 2])
    engine.add_request("C", [0, vocab - 1])


def test_validate_policy_runs_the_exact_plan(tiny):
    exp = experiment(tiny, chunk_size=7)
    r = validate_policy(
        "chunked",
        engine=exp.engine,
        traces=exp.traces,
        steps=exp.plan("chunked"),
        output_tokens=OUTPUTS,
        checkpoint_every=0,
    )
    assert r.steps == exp.steps_per_run("chunked") and r.checks["checkpoint_kv"].count == 0


def test_a_step_norms_and_rotates_with_one_fused_op_each(tiny, monkeypatch):
    """Every RMSNorm of a prefill step (input, q and k together, post-attention per layer; the final one) is
    MLX's fused op, one graph node on a GPU (the CPU spells it out in ops), where the ops version makes four;
    so is RoPE in a step of one request (q and k per layer), with no tables made. A ragged step, whose rows'
    positions do not run on, makes its tables once and calls no fused RoPE. The fused RoPE's offset is 0-d: on
    CUDA (MLX 0.32.4) an offset of shape (1,) is read once per head, past its end (the gate failed there)."""
    from pdlib.engine import kernels as K
    from pdlib.engine.model import Qwen3, Segment

    calls, rotations, tables = [], [], []
    fused, fused_rope, real_tables = mx.fast.rms_norm, mx.fast.rope, K.rope_tables
    monkeypatch.setattr(mx.fast, "rms_norm", lambda x, w, eps: calls.append(x.shape) or fused(x, w, eps))
    monkeypatch.setattr(
        mx.fast, "rope", lambda x, **kw: rotations.append((x.shape, kw["offset"].shape)) or fused_rope(x, **kw)
    )
    monkeypatch.setattr(K, "rope_tables", lambda *a: tables.append(1) or real_tables(*a))
    q = Qwen3(tiny, compile_steps=False)
    layers = tiny.config.num_hidden_layers
    cache = q.new_cache(64)
    (logits,) = q.step([Segment(cache, mx.arange(3, 43, dtype=mx.int32), start=0, emits=True)], prune=False)
    assert len(calls) == 3 * layers + 1 and logits is not None
    assert len(rotations) == 2 * layers and not tables
    assert {offset for _, offset in rotations} == {()}
    rotations.clear()
    other = q.new_cache(64)
    q.step(
        [
            Segment(cache, mx.arange(5, 7, dtype=mx.int32), start=40, emits=True),
            Segment(other, mx.arange(3, 13, dtype=mx.int32), start=0, emits=True),
        ]
    )
    assert not rotations and len(tables) == 1


def test_a_step_builds_the_rope_tables_once_and_transposes_no_weight(tiny, tmp_path):
    """Host cost on a GPU grows with a step's graph nodes : a ragged step's RoPE angles per
    step, not per layer; no weight transposed per matmul (the transposed views are made at load); q|k|v and
    gate|up one matmul each (with o_proj, down and each segment's two of attention: eight per layer for two
    segments, and the LM head)."""
    import re
    from collections import Counter

    from pdlib.engine.model import Segment

    engine = Engine(tiny, capacity=64)
    for name in "AB":
        engine.add_request(name, list(range(40)))
        engine.reset(name, logical=True)
    a, b = engine.requests["A"], engine.requests["B"]
    logits = engine.model.step(
        [Segment(a.cache, a.prompt[:40], start=0, emits=True), Segment(b.cache, b.prompt[:24], start=0, emits=False)],
        prune=False,
    )[0]
    mx.export_to_dot(str(tmp_path / "step.dot"), logits, *a.cache.k, *b.cache.k)
    nodes = Counter(re.findall(r'\[label ="([^"]+)", shape=rectangle\]', (tmp_path / "step.dot").read_text()))
    layers = tiny.config.num_hidden_layers
    assert nodes["Cos"] == nodes["Sin"] == 1 and nodes["Matmul"] == 8 * layers + 1
    # the only transposes left are the attention's keys and the heads' swaps, none on a weight
    assert nodes["Transpose"] <= 7 * layers


def test_a_step_dispatched_a_layer_at_a_time_is_the_same_step(tiny, monkeypatch):
    """PDLIB_STEP_DISPATCH=layers (the default) starts each layer of a step with a prompt chunk as soon as it is
    built (one async_eval per layer, the pruned last one included); the outputs and the caches are `step`'s bit
    for bit, for a chunk alone and a ragged step; the gate passes; a bad value is refused when the engine is made."""

    def run():
        engine = Engine(tiny, capacity=96)
        engine.add_request("A", list(range(3, 43)))
        engine.add_request("B", list(range(50, 80)))
        outs = [engine.prefill_chunk("A", 24), engine.prefill_chunk("A", 16)]
        outs += engine.batch([("A", None), ("B", 30)]) + engine.batch([("A", None), ("B", None)])
        caches = [engine.kv(r, 0, engine.requests[r].length) for r in "AB"]
        return [np.array(o.logits) for o in outs if o is not None], [np.array(c) for c in caches]

    calls, real = [], mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: calls.append(len(a)) or real(*a))
    monkeypatch.delenv("PDLIB_STEP_DISPATCH", raising=False)
    assert Engine(tiny, capacity=8).dispatch == "layers"  # the default (a 4K chunk step ~1.5 ms faster on the H200)
    monkeypatch.setenv("PDLIB_STEP_DISPATCH", "step")
    step, by_step = run(), len(calls)
    monkeypatch.setenv("PDLIB_STEP_DISPATCH", "layers")
    layers, by_layer = run(), len(calls) - by_step
    assert all((x == y).all() for x, y in zip(step[0] + step[1], layers[0] + layers[1]))
    assert len(step[0]) == len(layers[0]) == 5
    n = tiny.config.num_hidden_layers
    # a dispatch per layer of the 3 steps with a chunk; the first chunk's pruned last layer only stores its
    # K/V, which _finish starts as before
    assert by_layer - by_step == 3 * n - 1
    results = experiment(tiny).validate()
    assert all(r.passed for r in results.values())
    monkeypatch.setenv("PDLIB_STEP_DISPATCH", "graph")
    with pytest.raises(InputError, match="PDLIB_STEP_DISPATCH must be layers or step, got 'graph'"):
        Engine(tiny, capacity=96)


@pytest.mark.parametrize("emits", [False, True])
def test_a_silent_steps_last_stage_starts_only_its_cache_writes(tiny, emits):
    """Unpruned (prune=False), a chunk that emits nothing still stores its last layer's K/V, but that layer's
    output feeds nothing: the last stage yields only the caches' arrays, so a step dispatched a layer at a time
    starts no work that the executor does not wait on when it observes the chunk (and `step`, which never
    evaluates that output, does the same work). A chunk that emits yields the output too."""
    from pdlib.engine.model import Segment

    engine = Engine(tiny, capacity=64)
    engine.add_request("A", list(range(3, 43)))
    cache = engine.requests["A"].cache
    stages = engine.model.stages([Segment(cache, engine.requests["A"].prompt[:40], start=0, emits=emits)], prune=False)
    *_, last = stages
    ours = {id(x) for x in (*cache.k, *cache.v, cache.written)}
    assert all(id(x) in ours for x in last) is not emits


def test_a_steps_tokens_are_observed_together_and_each_is_seen_once(tiny, monkeypatch):
    """The rows' picks go out with their step as one array; observe_all reads that array, making nothing new (a
    new array would queue behind whatever was issued after the step, as a pipelined serving loop issues)."""
    from pdlib.engine import Output, observe_all

    e = Engine(tiny, capacity=64)
    for i, n in enumerate((12, 20, 9)):
        e.add_request(f"r{i}", [(j * 17 + i) % tiny.config.vocab_size + 1 for j in range(n)])
    e.prefill_chunk("r0", 12).observe()
    e.prefill_chunk("r1", 20).observe()
    outs = e.batch([("r0", None), ("r2", 4), ("r1", None)])  # two decode rows and a chunk short of its end
    assert outs[1] is None and outs[0].picks is outs[2].picks and (outs[0].row, outs[2].row) == (0, 1)
    want = [None if o is None else mx.argmax(o.logits).item() for o in outs]
    with monkeypatch.context() as m:
        m.setattr(mx, "stack", lambda *a, **k: pytest.fail("observe_all made a new array"))
        m.setattr(Output, "observe", lambda self: pytest.fail("observe_all read a row by itself"))
        seen = []
        tokens = observe_all(outs, lambda i, t: seen.append((i, t)))
    assert tokens == want and seen == [(0, want[0]), (2, want[2])]
    single = e.batch([("r0", None)])  # one row: its own token, by .item()
    assert single[0].picks is None and observe_all(single) == [single[0].token.item()]
    assert observe_all([None]) == [None]


def test_release_gives_every_cache_back_and_the_engine_still_serves(tiny):
    """What serve does before mlx-lm runs: every request's cache (here 4 of 512 positions) leaves device memory."""
    import gc
    import weakref

    cfg = tiny.config
    engine = Engine(tiny, capacity=512, slots=4)
    for i in range(4):
        engine.add_request(f"r{i}", list(range(1, 40)))
        engine.prefill_chunk(f"r{i}", 39).token.item()
    mx.synchronize()
    gc.collect()
    before, rounds = mx.get_active_memory(), weakref.ref(engine.rounds)
    gc.disable()  # what release frees, it frees itself: cycles included, not left to Python's next collection
    try:
        engine.release()
    finally:
        gc.enable()
    caches = 4 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 512 * 2 * 4
    assert before - mx.get_active_memory() >= caches and not engine.requests and engine.pool is None
    assert rounds() is None  # the compiled rounds (a cycle through their compiled method) are gone
    engine.add_request("again", list(range(1, 9)))  # a cache of its own now
    assert 0 <= engine.prefill_chunk("again", 8).token.item() < cfg.vocab_size


@pytest.mark.parametrize("tied", [True, False], ids=["tied-head", "own-head"])
def test_the_references_prompt_pass_gives_the_models_own_last_logits(tiny, tied):
    """The reference applies its head to the prompt's last position alone (a 7K-token prompt's every row would be
    4.5 GB of logits): what mlx-lm's Qwen3 computes for that row, with a tied head or its own."""
    from mlx_lm.models.cache import KVCache as MlxKVCache
    from mlx_lm.models.qwen3 import Model, ModelArgs

    from pdlib.run.reference import last_logits

    model = Model(ModelArgs.from_dict({**tiny.config.to_hf_dict(), "tie_word_embeddings": tied}))
    mx.eval(model.parameters())
    ids = mx.array([[3, 17, 250, 9, 41, 500, 2]], dtype=mx.int32)
    want = model(ids)[0, -1]
    got = last_logits(model, ids, [MlxKVCache() for _ in model.layers])
    assert got.shape == want.shape and mx.allclose(got, want, rtol=0, atol=1e-6).item()
    assert not mx.allclose(model(ids[:, :-1])[0, -1], want, rtol=0, atol=1e-6).item()  # another row differs


def test_the_reference_stream_takes_its_first_logits_from_the_last_position_alone(tiny, monkeypatch):
    from pdlib.run import reference

    calls, real = [], reference.last_logits

    def spy(model, inputs, cache):
        calls.append(inputs.shape)
        return real(model, inputs, cache)

    monkeypatch.setattr(reference, "last_logits", spy)
    ids = [3, 17, 250, 9, 41]
    stream = Reference(tiny).stream(ids)
    assert calls == [(1, len(ids))] and stream.logits.shape == (tiny.config.vocab_size,)


def test_a_released_reference_trace_restarts_and_reproduces_itself(tiny):
    exp = experiment(tiny)
    trace = ReferenceTrace(Reference(tiny), exp.prompts["A"].token_ids)
    logits2, tok2 = trace.output(2)
    first = trace.tokens[:]
    trace.release()  # its request done: the stream and its cache go
    assert trace.stream is None and trace.tokens == [] and trace.index == -1
    again, tok = trace.output(2)
    assert tok == tok2 and trace.tokens == first and mx.array_equal(again, logits2).item()

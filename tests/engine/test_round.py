"""The compiled decode round (pdlib/engine/round.py) runs only where the rows kernel does (a GPU, check-kernels'
`engine rows compiled` rows); on the CPU its function runs with a stand-in for the kernel that attends each row
by the ops twin without storing (a round's logits do not depend on its own stores: the new key is read from the
row itself), against the engine's own step over the same requests: the same logits, in the rows' order, and a
planted mix-up of the rows' slots shows. Which rounds qualify and what a round leaves on its caches are checked
with stand-in caches.
"""

import types

import mlx.core as mx
import numpy as np
import pytest

from pdlib.engine import Engine
from pdlib.engine import round as RD
from pdlib.engine import rows as R
from pdlib.engine.kernels.decode_attention import decode_attention_ops
from pdlib.engine.kernels.fence import new_fence

PROMPTS = (9, 14, 5)


def rows_standin(qkv, meta, layer, qn, kn, inv_freq, pool_k, pool_v, after, *, heads, kv_heads, eps):
    """decode_rows_kernel's arithmetic by the twin, traceable (every index an array): (Hq, R, Dh), after + 1."""
    outs = []
    for r in range(meta.shape[0]):
        row, slot, pos, i = meta[r, 0], meta[r, 1], meta[r, 2:3], layer[0]
        o, _, _ = decode_attention_ops(
            qkv[row].reshape(-1), qn, kn, inv_freq, pos, pool_k[slot, i], pool_v[slot, i],
            heads=heads, kv_heads=kv_heads, eps=eps,
        )  # fmt: skip
        outs.append(o.reshape(heads, 1, -1))
    return mx.concatenate(outs, axis=1), after + 1


@pytest.mark.parametrize("planted", [False, True])
def test_the_rounds_function_gives_the_steps_logits(tiny, monkeypatch, planted):
    monkeypatch.setattr(RD, "decode_rows_kernel", rows_standin)
    engine = Engine(tiny, capacity=32)
    engine.decode_round = "step"
    vocab = tiny.config.vocab_size
    for i, n in enumerate(PROMPTS):
        engine.add_request(f"r{i}", [(j * 31 + i * 7 + 1) % vocab for j in range(n)])
        engine.prefill_chunk(f"r{i}", n).observe()
    names = [f"r{i}" for i in range(len(PROMPTS))]
    slots = [2, 0, 1]  # the pool's slots, out of the rows' order
    caches = [engine.requests[n].cache for n in names]
    pool_k, pool_v = (mx.stack([getattr(caches[slots.index(s)], kv) for s in range(3)]) for kv in ("k_all", "v_all"))
    metas = [(r, slots[r], PROMPTS[r]) for r in range(3)]
    if planted:  # rows 0 and 1 read each other's caches
        metas[0], metas[1] = (0, slots[1], PROMPTS[0]), (1, slots[0], PROMPTS[1])
    tokens = mx.concatenate([engine.requests[n].next_token.reshape(1).astype(mx.int32) for n in names])
    rounds = RD.CompiledRounds(engine.model)
    fence = new_fence()
    logits, written = rounds.compiled(tokens, mx.array(metas, mx.int32), fence, pool_k, pool_v)
    want = [o.logits for o in engine.batch([(n, None) for n in names])]
    assert logits.shape == (3, vocab)
    assert int(written[0].item()) == int(fence[0].item()) + tiny.config.num_hidden_layers  # one fence a layer
    close = [np.allclose(np.array(logits[r]), np.array(want[r]), rtol=1e-3, atol=1e-3) for r in range(3)]
    assert close == ([False, False, True] if planted else [True, True, True])


def cache(slot, length, pool, *, capacity=16):
    c = types.SimpleNamespace(pool=pool, pooled=True, slot=slot, capacity=capacity, written=f"fence{slot}")
    c.length = length

    def advance(n):
        c.length += n

    c.advance = advance
    return c


def segment(c, token):
    return types.SimpleNamespace(cache=c, size=1, emits=True, start=c.length, tokens=mx.array([token], mx.int32))


def test_which_rounds_qualify_and_what_one_leaves_on_its_caches(tiny, monkeypatch):
    from pdlib.engine.model import Qwen3

    monkeypatch.setattr(R, "available", lambda head_dim: True)
    seen = {}

    def fake_round(tokens, meta, after, pool_k, pool_v):
        seen.update(tokens=tokens.tolist(), meta=meta.tolist(), after=after)
        return mx.arange(3 * 5).reshape(3, 5), "next fence"

    monkeypatch.setattr(RD, "joined_fence", lambda fences: tuple(fences))
    rounds = RD.CompiledRounds(Qwen3(tiny, compile_steps=False))
    rounds.compiled = fake_round
    pool = types.SimpleNamespace(k="K", v="V")
    caches = [cache(2, 7, pool), cache(0, 3, pool), cache(1, 11, pool)]
    segs = [segment(c, t) for c, t in zip(caches, (40, 41, 42))]
    assert rounds(segs[:2]) is None  # two decodes: the pair's launch, not a round
    other = cache(3, 4, types.SimpleNamespace(k="K2", v="V2"))
    assert rounds([*segs[:2], segment(other, 1)]) is None  # two pools
    chunk = types.SimpleNamespace(**{**vars(segs[2]), "size": 2})
    assert rounds([*segs[:2], chunk]) is None  # a prompt chunk in the step: stages runs it
    logits = rounds(segs)
    assert seen == {
        "tokens": [40, 41, 42],
        "meta": [[0, 2, 7], [1, 0, 3], [2, 1, 11]],
        "after": ("fence2", "fence0", "fence1"),
    }
    assert [lg.tolist() for lg in logits] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
    assert [c.length for c in caches] == [8, 4, 12] and {c.written for c in caches} == {"next fence"}
    caches[0].length += 1  # a segment that does not start at its cache's end is refused, as stages refuses it
    with pytest.raises(ValueError, match="segment at position 7 of a cache holding 9"):
        rounds(segs)


def test_trace_makes_each_row_counts_trace_before_any_round(tiny, monkeypatch):
    """trace() runs the function's Python once per row count in range, evaluating nothing: a round of a traced
    count then replays it (the layers' Python does not run again), a count left out is traced when it comes."""
    calls = []

    def counted(*args, **kw):
        calls.append(args[1].shape[0])
        return rows_standin(*args, **kw)

    monkeypatch.setattr(RD, "decode_rows_kernel", counted)
    monkeypatch.setattr(RD, "available", lambda head_dim: True)
    engine = Engine(tiny, capacity=16)
    c = tiny.config
    shape = (4, c.num_hidden_layers, c.num_key_value_heads, 16, c.head_dim)
    pool = types.SimpleNamespace(k=mx.zeros(shape), v=mx.zeros(shape), shape=shape)
    rounds = RD.CompiledRounds(engine.model)
    assert rounds.trace(pool, range(1, 9)) == [3, 4]  # 3 rows or more, at most the pool's 4 slots
    layers = c.num_hidden_layers
    assert calls == [3] * layers + [4] * layers
    args = (mx.zeros((3,), mx.int32), mx.zeros((3, 3), mx.int32), new_fence(), pool.k, pool.v)
    logits, _ = rounds.compiled(*args)
    mx.eval(logits)
    assert len(calls) == 2 * layers and logits.shape == (3, c.vocab_size)  # replayed, not traced again
    monkeypatch.setattr(R, "available", lambda head_dim: True)  # a round through __call__, its inputs as it makes
    caches = [cache(s, n, pool) for s, n in ((2, 5), (0, 3), (1, 9))]  # them: the traced function replays
    for c in caches:
        c.written = new_fence()
    out = rounds([segment(c, t) for c, t in zip(caches, (7, 8, 9))])
    mx.eval(out)
    assert len(calls) == 2 * layers and [c.length for c in caches] == [6, 4, 10]
    bigger = RD.CompiledRounds(engine.model)
    bigger.compiled(*args)
    assert len(calls) == 3 * layers  # a function nobody traced for 3 rows traces at its first round
    assert rounds.trace(None, range(3, 5)) == []  # no pool: rounds never run
    monkeypatch.setattr(RD, "available", lambda head_dim: False)
    assert rounds.trace(pool, range(3, 5)) == []  # no rows kernel (the CPU): nothing to trace

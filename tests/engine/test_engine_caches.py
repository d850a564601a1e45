"""Requests that wait for a cache (Engine.attach / detach / reserve): a pool of fewer slots than requests serves
them in turn, a handed-on cache is emptied and holds nothing of its last owner, and a step for a request without
one is refused.

    .venv/bin/python -m pytest -q tests/engine/test_engine_caches.py
"""

import mlx.core as mx
import pytest

from pdlib.engine import Engine
from pdlib.run.reference import Reference
from pdlib.run.validate import ReferenceTrace

CAPACITY = 64


def prompt(i: int, n: int, vocab: int) -> list[int]:
    return [(j * 7919 + i * 104729) % vocab for j in range(n)]


def greedy(engine: Engine, name: str, n: int, outputs: int) -> list[int]:
    tokens = [engine.prefill_chunk(name, n).observe()]
    tokens += [engine.decode(name).observe() for _ in range(outputs - 1)]
    return tokens


def test_two_caches_serve_three_requests_in_turn_each_as_it_would_alone(tiny):
    vocab = tiny.config.vocab_size
    e = Engine(tiny, capacity=CAPACITY, slots=2)
    lengths = {"a": 30, "b": 21, "c": 40}
    for i, (name, n) in enumerate(lengths.items()):
        e.add_request(name, prompt(i, n, vocab), cached=False)
    e.reserve(2)
    assert e.spare == 2 and len(e.idle) == 2 and e.pool.free == []  # both slots allocated, no request holds one
    e.attach("a")
    e.attach("b")
    assert e.spare == 0
    with pytest.raises(RuntimeError, match="every one of the pool's 2 cache slots is taken"):
        e.attach("c")
    with pytest.raises(ValueError, match="request c holds no cache"):
        e.prefill_chunk("c", 8)
    a = greedy(e, "a", 30, 6)
    held = e.requests["a"].cache
    e.detach("a")
    assert e.requests["a"].cache is None and e.spare == 1
    e.attach("c")  # a's cache, emptied: its 35 positions are not c's
    assert e.requests["c"].cache is held and held.length == 0
    c = greedy(e, "c", 40, 6)
    b = greedy(e, "b", 21, 6)
    ref = Reference(tiny)
    for name, got in (("a", a), ("b", b), ("c", c)):
        trace = ReferenceTrace(ref, prompt(list(lengths).index(name), lengths[name], vocab))
        assert got == [trace.output(k)[1] for k in range(6)], name
    with pytest.raises(ValueError, match="holds a cache already"):
        e.attach("c")


def test_caches_kept_for_the_next_requests_or_given_back(tiny):
    e = Engine(tiny, capacity=CAPACITY, slots=3)
    for i in range(3):
        e.add_request(f"r{i}", prompt(i, 10, tiny.config.vocab_size))  # cached: each takes a slot now
    assert e.spare == 0
    caches = {id(r.cache) for r in e.requests.values()}
    e.clear_requests(keep_caches=True)
    assert e.requests == {} and {id(c) for c in e.idle} == caches and e.pool.free == []
    e.add_request("x", prompt(9, 10, tiny.config.vocab_size), cached=False)
    e.attach("x")
    assert id(e.requests["x"].cache) in caches  # no new allocation
    e.clear_requests()
    assert e.idle == [] and e.pool.free == [0, 1, 2]


def test_a_cache_handed_on_without_its_reset_gives_other_tokens(tiny, monkeypatch):
    """The planted fault the serving gate must see: a reused cache that still holds its last owner's positions."""
    vocab = tiny.config.vocab_size
    e = Engine(tiny, capacity=CAPACITY, slots=1)
    e.add_request("a", prompt(0, 12, vocab))
    e.add_request("b", prompt(1, 30, vocab), cached=False)
    greedy(e, "a", 12, 4)
    e.detach("a")
    monkeypatch.setattr(type(e.idle[0]), "reset", lambda self, logical: None)  # handed on as it is
    e.attach("b")
    assert e.requests["b"].cache.length == 15  # a's prompt and 3 fed-back outputs
    out = e.prefill_chunk("b", 30 - 15)  # the engine takes the stale positions for b's own
    logits, _ = ReferenceTrace(Reference(tiny), prompt(1, 30, vocab)).output(0)
    assert not mx.allclose(out.logits, logits, rtol=1e-3, atol=1e-3).item()
    monkeypatch.undo()
    e.detach("b")
    e.attach("b")  # emptied this time: b's own first output
    out = e.prefill_chunk("b", 30)
    assert mx.allclose(out.logits, logits, rtol=1e-3, atol=1e-3).item()

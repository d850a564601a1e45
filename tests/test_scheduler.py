"""Scheduler properties over many shapes, plus exact sequences for one tiny case so a reader sees each policy.

.venv/bin/python -m pytest -q tests/test_scheduler.py
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlib.errors import InputError
from pdlib.scheduler import (
    POLICIES,
    Batch,
    Decode,
    Policy,
    Prefill,
    RequestState,
    make_policy,
    needs_chunk_rule,
    plan,
    prefill_steps,
    schedule,
    t0_index,
)

P, D = Prefill, Decode
shapes = given(
    policy=st.sampled_from(["eager", "chunked", "fifo", "mixed"]),
    prompt=st.integers(1, 300),
    out=st.integers(1, 40),
    chunk=st.integers(1, 400),
)


def replay(steps, prompt, out):
    """Independent re-count (no RequestState): per step, (prefilled, emitted) of both requests *before* it."""
    pre, emit, before = {"A": 0, "B": 0}, {"A": 0, "B": 0}, []
    for step in steps:
        before.append((dict(pre), dict(emit)))
        for s in step.work:
            if isinstance(s, Prefill):
                assert s.n >= 1 and pre[s.req] + s.n <= prompt, s  # contiguous ranges [pre, pre + n), in order
                pre[s.req] += s.n
                emit[s.req] += pre[s.req] == prompt
            else:
                assert pre[s.req] == prompt and emit[s.req] < out, f"decode before prompt done or past the end: {s}"
                emit[s.req] += 1
    return pre, emit, before


def parts(steps):
    return [w for s in steps for w in s.work]


@settings(max_examples=300, deadline=None)
@shapes
def test_every_token_once_and_every_output(policy, prompt, out, chunk):
    steps = plan(policy, prompt_tokens=prompt, output_tokens=out, chunk_size=chunk)
    pre, emit, _ = replay(steps, prompt, out)
    assert pre == {"A": prompt, "B": prompt} and emit == {"A": out, "B": out}
    for r in "AB":
        chunks = [s.n for s in parts(steps) if isinstance(s, Prefill) and s.req == r]
        assert all(n == chunk for n in chunks[:-1]) and 1 <= chunks[-1] <= chunk  # only the last is short
        assert sum(isinstance(s, Decode) and s.req == r for s in parts(steps)) == out - 1


@settings(max_examples=300, deadline=None)
@shapes
def test_t0_and_policy_shape(policy, prompt, out, chunk):
    steps = plan(policy, prompt_tokens=prompt, output_tokens=out, chunk_size=chunk)
    t0 = t0_index(steps)
    assert steps[:t0] == prefill_steps(RequestState("A", prompt, out), chunk_size=chunk)
    timed = steps[t0:]
    assert not any(isinstance(s, Prefill) and s.req == "A" for s in parts(timed))
    b_chunks = [i for i, s in enumerate(timed) if isinstance(s, Prefill)]
    if policy == "eager":
        assert b_chunks == list(range(len(b_chunks)))  # B's prefill back to back, from t0
        assert timed[0] == P("B", min(chunk, prompt))
    if policy == "fifo":
        a_steps = [i for i, s in enumerate(timed) if s.req == "A"]
        assert a_steps == list(range(out - 1)) and a_steps[-1:] < b_chunks[:1]
    if policy == "chunked":
        if out > 1:
            assert timed[0] == D("A")
        _, _, before = replay(steps, prompt, out)
        for i, j in zip(b_chunks, b_chunks[1:]):
            pre, emit = before[t0 + i + 1]  # who was ready right after chunk i
            ready = {r for r in "AB" if pre[r] == prompt and emit[r] < out}
            between = [s.req for s in timed[i + 1 : j]]
            assert set(between) == ready and len(between) == len(ready), (i, j, between, ready)
    if policy == "mixed":  # every step carries every ready decode, and B's next chunk while its prompt lasts
        _, _, before = replay(steps, prompt, out)
        for i, step in enumerate(timed):
            pre, emit = before[t0 + i]
            ready = [r for r in "AB" if pre[r] == prompt and emit[r] < out]
            want = [D(r) for r in ready] + ([P("B", min(chunk, prompt - pre["B"]))] if pre["B"] < prompt else [])
            assert list(step.work) == want, (i, step, want)
            assert isinstance(step, Batch) == (len(want) > 1)


def test_tiny_exact_sequences():
    setup = [P("A", 2), P("A", 2), P("A", 1)]  # prompt 5 in chunks of 2; A's first output comes with P(A, 1)
    want = {
        "eager": [P("B", 2), P("B", 2), P("B", 1), D("A"), D("B"), D("A"), D("B")],
        "chunked": [D("A"), P("B", 2), D("A"), P("B", 2), P("B", 1), D("B"), D("B")],
        "fifo": [D("A"), D("A"), P("B", 2), P("B", 2), P("B", 1), D("B"), D("B")],
        "mixed": [Batch((D("A"), P("B", 2))), Batch((D("A"), P("B", 2))), P("B", 1), D("B"), D("B")],
    }
    for name, timed in want.items():
        steps = plan(name, prompt_tokens=5, output_tokens=3, chunk_size=2)
        assert steps == setup + timed, name
        assert t0_index(steps) == 3


def test_one_output_each():
    # output_tokens=1: A is finished at t0, so every policy only prefills B (disagg: remotely, in one step)
    for name in POLICIES:
        rule = (lambda prefilled: 2) if needs_chunk_rule(name) else None
        want = [P("B", 3, remote=True)] if POLICIES[name].remote_prefill else [P("B", 2), P("B", 1)]
        assert plan(name, prompt_tokens=3, output_tokens=1, chunk_size=2, chunk_rule=rule)[2:] == want


def test_adding_a_policy_is_one_class():
    class BFirst(Policy):  # B's prompt and decodes first, then A
        name = "b_first"

        def next_step(self, a, b, *, chunk_size):
            for r in (b, a):
                if not r.prompt_done:
                    return P(r.name, min(chunk_size, r.prompt_tokens - r.prefilled))
                if r.ready:
                    return D(r.name)
            return None

    try:
        assert isinstance(make_policy("b_first"), BFirst)
        steps = plan("b_first", prompt_tokens=2, output_tokens=2, chunk_size=4)
        assert steps == [P("A", 2), P("B", 2), D("B"), D("A")]
        with pytest.raises(TypeError, match="already taken"):
            type("Again", (Policy,), {"name": "eager"})
    finally:
        POLICIES.pop("b_first", None)
    assert list(POLICIES) == [
        "eager",
        "chunked",
        "fifo",
        "mixed",
        "slo-chunked",
        "slo-mixed",
        "disagg",
        "overlap",
        "partition",
    ]


def test_fresh_policy_per_make():
    assert make_policy("chunked") is not make_policy("chunked")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1, got 0"),
        ({"prompt_tokens": -1}, "prompt_tokens must be an integer >= 1, got -1"),
        ({"output_tokens": -5}, "output_tokens must be an integer >= 1, got -5"),
        ({"output_tokens": 0}, "output_tokens"),
        ({"chunk_size": 2.5}, "chunk_size"),
        ({"chunk_size": True}, "chunk_size"),
    ],
)
def test_bad_numbers(kw, match):
    args = dict(prompt_tokens=5, output_tokens=3, chunk_size=2) | kw
    with pytest.raises(InputError, match=match):
        plan("eager", **args)


def test_unknown_policy():
    with pytest.raises(
        InputError,
        match=r"unknown policy 'greedy'; expected one of: eager, chunked, fifo, mixed, slo-chunked, slo-mixed",
    ):
        make_policy("greedy")
    with pytest.raises(InputError):
        plan("greedy", prompt_tokens=5, output_tokens=3, chunk_size=2)


def test_request_state():
    r = RequestState("A", prompt_tokens=3, output_tokens=2)
    assert not r.prompt_done and not r.ready and not r.finished
    for bad in (D("A"), P("A", 0), P("A", 4), P("B", 1)):  # not ready, n < 1, past the prompt, wrong request
        with pytest.raises(ValueError):
            r.apply(bad)
    r.apply(P("A", 2))
    assert (r.prefilled, r.emitted) == (2, 0)
    r.apply(P("A", 1))
    assert r.prompt_done and r.ready and r.emitted == 1
    r.apply(D("A"))
    assert r.finished and not r.ready
    with pytest.raises(ValueError):
        r.apply(D("A"))
    with pytest.raises(ValueError):
        r.apply(P("A", 1))


class _Quits(Policy):  # no `name` in the class body: stays out of the registry
    def next_step(self, a, b, *, chunk_size):
        return None


class _Stuck(Policy):
    def next_step(self, a, b, *, chunk_size):
        return D("B")  # B never prefilled, so this is illegal forever


@pytest.mark.parametrize("cls, match", [(_Quits, "stopped before"), (_Stuck, "made no progress")])
def test_schedule_guards_bad_policies(cls, match):
    cls.name = "broken"
    a, b = RequestState("A", 2, 3, prefilled=2, emitted=1), RequestState("B", 2, 3)
    with pytest.raises(RuntimeError, match=f"policy 'broken' {match}"):
        list(schedule(cls(), a, b, chunk_size=1))
    assert "broken" not in POLICIES


def test_schedule_applies_after_yield():
    a, b = RequestState("A", 2, 2, prefilled=2, emitted=1), RequestState("B", 2, 2)
    it = schedule(make_policy("eager"), a, b, chunk_size=2)
    assert next(it) == P("B", 2) and b.prefilled == 0  # the executor sees the state before the step
    assert next(it) == D("A") and b.prefilled == 2 and b.emitted == 1

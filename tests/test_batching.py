"""Serving policies for N requests (pdlib.batching): exact step sequences for 2 and 3 requests with staggered
arrivals, legality and progress over many shapes, and mixed's prompt budget shared by several prompts.

.venv/bin/python -m pytest -q tests/test_batching.py
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlib.batching import BATCH_POLICIES, Chunked, make_batch_policy, simulate
from pdlib.errors import InputError
from pdlib.scheduler import Batch, Decode, Prefill, RequestState, plan, t0_index

P, D = Prefill, Decode


def B(*work):
    return Batch(tuple(work))


# A: 40-token prompt, 3 outputs, arrives at 0; B: 40, 2, before step 2; C: 20, 2, before step 3 (chunk 16)
THREE = [("A", 40, 3, 0), ("B", 40, 2, 2), ("C", 20, 2, 3)]
EXPECTED_THREE = {
    "eager": [
        *[P("A", 16), P("A", 16), P("A", 8)],
        *[P("B", 16), P("B", 16), P("B", 8)],
        *[P("C", 16), P("C", 4)],
        B(D("A"), D("B"), D("C")),
        D("A"),
    ],
    "chunked": [
        *[P("A", 16), P("A", 16), P("A", 8)],  # nothing to decode yet: chunk after chunk
        *[D("A"), P("B", 16), D("A"), P("B", 16)],  # A finishes; B alone: chunk after chunk
        *[P("B", 8), D("B"), P("C", 16), P("C", 4), D("C")],
    ],
    "mixed": [
        *[P("A", 16), P("A", 16)],
        B(P("A", 8), P("B", 8)),  # two prompts share the step's 16 prompt tokens
        B(D("A"), P("B", 16)),
        B(D("A"), P("B", 16)),  # B's last chunk takes the whole budget: C, running, waits
        B(D("B"), P("C", 16)),
        P("C", 4),
        D("C"),
    ],
    "fifo": [
        *[P("A", 16), P("A", 16), P("A", 8), D("A"), D("A")],
        *[P("B", 16), P("B", 16), P("B", 8), D("B")],
        *[P("C", 16), P("C", 4), D("C")],
    ],
}


@pytest.mark.parametrize("policy", sorted(EXPECTED_THREE))
def test_three_staggered_requests_hand_checked(policy):
    assert simulate(policy, THREE, chunk_size=16) == EXPECTED_THREE[policy]


# A decoding from the start (prompt 8, one chunk), B arriving before step 1 with a 24-token prompt (chunk 8)
TWO = [("A", 8, 4, 0), ("B", 24, 2, 1)]
EXPECTED_TWO = {
    "eager": [P("A", 8), P("B", 8), P("B", 8), P("B", 8), B(D("A"), D("B")), D("A"), D("A")],
    "chunked": [P("A", 8), D("A"), P("B", 8), D("A"), P("B", 8), D("A"), P("B", 8), D("B")],
    "mixed": [P("A", 8), B(D("A"), P("B", 8)), B(D("A"), P("B", 8)), B(D("A"), P("B", 8)), D("B")],
    "fifo": [P("A", 8), D("A"), D("A"), D("A"), P("B", 8), P("B", 8), P("B", 8), D("B")],
}


@pytest.mark.parametrize("policy", sorted(EXPECTED_TWO))
def test_two_staggered_requests_hand_checked(policy):
    assert simulate(policy, TWO, chunk_size=8) == EXPECTED_TWO[policy]


@pytest.mark.parametrize("policy", ["overlap", "partition"])
def test_a_remote_prefill_policy_decodes_in_rounds_and_joins_each_prompt_whole(policy):
    R = lambda r, n: P(r, n, remote=True)  # noqa: E731
    steps = simulate(policy, [("A", 8, 3, 0), ("B", 6, 3, 1), ("C", 4, 2, 1)], chunk_size=4)
    # each prompt starts when the lane is free (earliest arrival first) and is joined at the next step; the
    # decode rounds go on meanwhile
    assert steps == [R("A", 8), D("A"), R("B", 6), B(D("A"), D("B")), R("C", 4), B(D("B"), D("C"))]
    assert all(s.work[0].remote for s in steps if isinstance(s, P))


@pytest.mark.parametrize("policy", ["eager", "chunked"])
def test_in_turns_the_pair_takes_the_two_request_policys_very_steps(policy):
    """decode_rounds="turns": a round of decodes goes out one decode a step, so after A's set-up the pair's
    steps are the two-request plan's, step for step (the figures then compare too, not only the tokens)."""
    two = plan(policy, prompt_tokens=40, output_tokens=5, chunk_size=16)
    timed = two[t0_index(two) :]
    n = simulate(make_batch_policy(policy, decode_rounds="turns"), [("A", 40, 5, 0), ("B", 40, 5, 3)], chunk_size=16)
    assert n[3:] == timed and n[:3] == [P("A", 16), P("A", 16), P("A", 8)]
    with pytest.raises(InputError, match="decode_rounds must be one of batched, turns, got 'pairs'"):
        make_batch_policy(policy, decode_rounds="pairs")


def test_on_the_pair_overlap_gives_each_request_the_two_request_overlaps_parts():
    two = plan("overlap", prompt_tokens=40, output_tokens=5, chunk_size=16)
    timed = two[t0_index(two) :]
    n = simulate("overlap", [("A", 40, 5, 0), ("B", 40, 5, 1)], chunk_size=16)
    assert n[0] == P("A", 40, remote=True)  # A's set-up: its prompt, run elsewhere and joined
    for r in "AB":
        after = [w for s in n[1:] for w in s.work if w.req == r]
        two_request = [w for s in timed for w in s.work if w.req == r]
        assert after == two_request
        assert [getattr(w, "remote", False) for w in after] == [getattr(w, "remote", False) for w in two_request]


def test_idle_until_the_next_arrival():
    """Nothing running: the clock jumps to the next arrival instead of stopping."""
    steps = simulate("eager", [("A", 4, 1, 0), ("B", 4, 1, 50)], chunk_size=8)
    assert steps == [P("A", 4), P("B", 4)]


def decode_order(steps):
    return [w.req for s in steps for w in s.work if isinstance(w, Decode)]


@pytest.mark.parametrize("policy", ["eager", "chunked", "mixed", "fifo"])
def test_on_the_pair_the_tokens_each_request_gets_are_the_two_request_policys(policy):
    """Same parts per request, in the same order per request, as pdlib.scheduler's two-request plan after t0."""
    two = plan(policy, prompt_tokens=40, output_tokens=5, chunk_size=16)
    timed = two[t0_index(two) :]
    a_setup = simulate(policy, [("A", 40, 5, 0)], chunk_size=16)[:3]  # A's prompt, as the pair's set-up
    n = simulate(policy, [("A", 40, 5, 0), ("B", 40, 5, 3)], chunk_size=16)
    assert n[:3] == a_setup
    for r in "AB":
        assert [w for s in n[3:] for w in s.work if w.req == r] == [w for s in timed for w in s.work if w.req == r]


def varying_budget(running):
    """A budget that changes from step to step, as a time budget does: 1 to 5 tokens."""
    return 1 + sum(r.emitted + r.prefilled for r in running) % 5


def make(name):
    return make_batch_policy(name, budget=varying_budget if name == "slo-mixed" else None)


reqs = st.lists(st.tuples(st.integers(1, 80), st.integers(1, 8), st.integers(0, 12)), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(sorted(BATCH_POLICIES)), spec=reqs, chunk=st.integers(1, 50))
def test_every_step_legal_and_every_request_finishes(policy, spec, chunk):
    arrivals = sorted(a for *_, a in spec)
    requests = [(f"r{i}", p, o, a) for i, ((p, o, _), a) in enumerate(zip(spec, arrivals))]
    steps = simulate(make(policy), requests, chunk_size=chunk)  # checks each step legal before taking it
    states = {n: RequestState(n, p, o) for n, p, o, _ in requests}
    for s in steps:
        assert len({w.req for w in s.work}) == len(s.work)
        for w in s.work:
            states[w.req].apply(w)  # legal again, independently
            if isinstance(w, Prefill) and not w.remote:
                assert w.n <= chunk
            if isinstance(w, Prefill) and w.remote:  # a prompt run elsewhere is joined whole, in a step alone
                assert BATCH_POLICIES[policy].remote_prefill and s.work == (w,) and w.n == states[w.req].prompt_tokens
        prefill = sum(w.n for w in s.work if isinstance(w, Prefill) and not w.remote)
        assert prefill <= chunk  # mixed's budget; the others carry one chunk at most
    assert all(r.finished for r in states.values())


@settings(max_examples=100, deadline=None)
@given(spec=reqs, chunk=st.integers(1, 50))
def test_a_decode_round_decodes_every_ready_request_at_once(spec, chunk):
    """eager's and mixed's decodes come in rounds: no step decodes a proper subset of the ready requests."""
    for policy in ("eager", "mixed"):
        requests = [(f"r{i}", p, o, 0) for i, (p, o, _) in enumerate(spec)]
        states = {n: RequestState(n, p, o) for n, p, o, _ in requests}
        for s in simulate(policy, requests, chunk_size=chunk):
            decoded = {w.req for w in s.work if isinstance(w, Decode)}
            if decoded:
                assert decoded == {n for n, r in states.items() if r.ready}
            for w in s.work:
                states[w.req].apply(w)


def test_mixed_splits_its_budget_across_prompts_in_arrival_order():
    running = [RequestState("A", 10, 2, prefilled=10, emitted=1), RequestState("B", 5, 2), RequestState("C", 30, 2)]
    running += [RequestState("D", 30, 2)]
    step = make_batch_policy("mixed").next_step(running, chunk_size=20)
    assert step == B(D("A"), P("B", 5), P("C", 15))  # D gets nothing this step
    running[2].prefilled = 28
    step = make_batch_policy("mixed").next_step(running[2:], chunk_size=20)
    assert step == B(P("C", 2), P("D", 18))


def test_fifo_serves_one_request_at_a_time_in_arrival_order():
    requests = [(f"r{i}", 20 + i, 3, i) for i in range(5)]
    order = [w.req for s in simulate("fifo", requests, chunk_size=8) for w in s.work]
    assert all(isinstance(s, (Prefill, Decode)) for s in simulate("fifo", requests, chunk_size=8))
    assert order == sorted(order, key=lambda r: int(r[1:]))


def test_chunked_decodes_first_in_each_round():
    c = Chunked()
    running = [RequestState("A", 8, 5, prefilled=8, emitted=1), RequestState("B", 32, 2)]
    assert c.next_step(running, chunk_size=8) == D("A")
    running[0].emitted = 2
    assert c.next_step(running, chunk_size=8) == P("B", 8)
    assert c.next_step(running, chunk_size=8) == D("A")


def test_nothing_running_is_no_step():
    for name in BATCH_POLICIES:
        assert make(name).next_step([], chunk_size=8) is None


def test_slo_is_mixed_with_each_steps_prompt_tokens_from_its_budget():
    seen = []

    def budget(running):
        seen.append([r.name for r in running])
        return 3 if len(seen) % 2 else 50  # 50: more than chunk_size, which still bounds it

    steps = simulate(make_batch_policy("slo-mixed", budget=budget), TWO, chunk_size=8)
    assert steps[:3] == [P("A", 3), B(P("A", 5), P("B", 3)), B(D("A"), P("B", 3))]  # prompts share a budget
    assert all(sum(w.n for w in s.work if isinstance(w, P)) <= (3 if i % 2 == 0 else 8) for i, s in enumerate(steps))
    with pytest.raises(ValueError, match="needs a budget"):
        make_batch_policy("slo-mixed")
    with pytest.raises(ValueError, match="whole number >= 1"):
        simulate(make_batch_policy("slo-mixed", budget=lambda running: 0), TWO, chunk_size=8)


def test_unknown_policy_is_refused_with_the_accepted_names():
    with pytest.raises(
        InputError,
        match="unknown serving policy 'lifo'; expected one of: eager, chunked, mixed, slo-mixed, fifo, overlap, "
        "partition, disagg$",
    ):
        make_batch_policy("lifo")
    with pytest.raises(InputError):
        simulate("lifo", THREE, chunk_size=8)


def test_simulate_refuses_an_illegal_policy():
    class Greedy(Chunked):  # decodes before the prompt is in
        def next_step(self, running, *, chunk_size):
            return D(running[0].name) if running else None

    with pytest.raises(ValueError, match="is illegal"):
        simulate(Greedy(), THREE, chunk_size=8)

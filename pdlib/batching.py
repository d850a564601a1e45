"""Who runs next among N requests that arrive over time: pure step logic, no arrays (pdlib.scheduler's steps).

    from pdlib.batching import make_batch_policy, simulate
    policy = make_batch_policy("mixed")
    step = policy.next_step(running, chunk_size=32)     # running: arrived, unfinished RequestStates, in arrival order
    steps = simulate("mixed", [("A", 64, 4, 0), ("B", 40, 3, 2)], chunk_size=32)   # arrivals counted in steps

`next_step` returns one step (`Prefill`, `Decode` or a `Batch`), or None when there is nothing to do until the
next arrival. A decode round is ONE step that decodes every ready request: a `Batch` of their `Decode`s (one
engine step, the weights read once for all rows), or a bare `Decode` when only one is ready. The policies keep
the meaning of pdlib.scheduler's two-request ones; on the pair workload the two-request eager and chunked
alternate single decodes (A, B, A, ...) where these batch them (A and B in one step): the tokens are the same,
only the steps differ.

- eager (prefill-first, vLLM V0 / SGLang): while any running request has prompt left, the next chunk of the
  earliest-arrived such request; else one decode round.
- chunked (decode-first): rounds of one decode round, then at most one prompt chunk (earliest-arrived first).
- mixed (Sarathi-Serve's stall-free batches): every step is every ready decode plus prompt chunks of the
  waiting requests in arrival order, up to chunk_size prompt tokens in all (several prompts may share them).
- slo-mixed: mixed with each step's prompt tokens from a time budget (a TBT target and a fitted step cost), at most
  chunk_size (all of it where no decode is ready or not one prompt token fits beside them).
- fifo: one request at a time, in arrival order, to completion: its prompt in chunks, then one decode a step.
- overlap: every step is one decode round; prompts run elsewhere, one at a time in arrival order, as one whole
  prefill on a second stream of the device (`remote_prefill`: the serving loop starts the prompt `next_remote`
  names, and joins it with a `Prefill(remote=True)` step once it is done).
- partition: overlap with the SMs split (CUDA green contexts): the prompt on one slice, the decode rounds on
  the other while it runs (pdlib/run/partition.py).
- disagg: overlap with the prompts on the prefill worker, a second GPU (pdlib/run/disagg/), their K/V sent over
  on join.

A new policy is one `BatchPolicy` subclass with a `name`; it registers itself in `BATCH_POLICIES`.
"""

from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

from pdlib.errors import InputError, check_int
from pdlib.scheduler import Batch, Decode, Prefill, RequestState, Step, Work

BATCH_POLICIES: dict[str, type["BatchPolicy"]] = {}


class BatchPolicy:
    """Given the running requests (arrived, unfinished, in arrival order), the next step or None. May keep tiny
    private state, so make a fresh instance per run."""

    name: ClassVar[str]
    remote_prefill: ClassVar[str | None] = None  # where else prompts run (serve_lane.SITES); None: in the steps

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__:
            if cls.name in BATCH_POLICIES:
                raise TypeError(f"policy name {cls.name!r} is already taken by {BATCH_POLICIES[cls.name].__qualname__}")
            BATCH_POLICIES[cls.name] = cls

    def next_step(self, running: list[RequestState], *, chunk_size: int) -> Step | None:
        raise NotImplementedError

    def next_remote(self, running: list[RequestState]) -> RequestState | None:
        """For a remote-prefill policy, with its prompt lane free: the request whose prompt starts there now."""
        return None


def as_step(work: list[Work]) -> Step | None:
    """A step of `work`: None for none, the part itself for one, else a Batch."""
    if not work:
        return None
    return work[0] if len(work) == 1 else Batch(tuple(work))


def decode_round(running: list[RequestState]) -> Step | None:
    """One decode for every ready request, as one step."""
    return as_step([Decode(r.name) for r in running if r.ready])


def first_waiting(running: list[RequestState]) -> RequestState | None:
    """The earliest-arrived request with prompt left."""
    return next((r for r in running if not r.prompt_done), None)


def chunk(r: RequestState, n: int) -> Prefill:
    return Prefill(r.name, min(n, r.prompt_tokens - r.prefilled))


class Eager(BatchPolicy):
    """Prompts first: a waiting prompt stalls every decode until it is in."""

    name = "eager"

    def next_step(self, running, *, chunk_size):
        w = first_waiting(running)
        return chunk(w, chunk_size) if w is not None else decode_round(running)


class Chunked(BatchPolicy):
    """Decodes first: a decode round, then one prompt chunk, and again; many short stalls instead of one long."""

    name = "chunked"

    def __init__(self):
        self._decode_turn = True  # a round opens with its decodes

    def next_step(self, running, *, chunk_size):
        decodes, w = decode_round(running), first_waiting(running)
        if self._decode_turn and decodes is not None or w is None:
            self._decode_turn = False
            return decodes
        self._decode_turn = True
        return chunk(w, chunk_size)


def mixed_step(running: list[RequestState], budget: int) -> Step | None:
    """Every ready decode plus prompt chunks of the waiting requests in arrival order, `budget` tokens in all."""
    work: list[Work] = [Decode(r.name) for r in running if r.ready]
    for r in running:
        if budget == 0:
            break
        if not r.prompt_done:
            c = chunk(r, budget)
            work.append(c)
            budget -= c.n
    return as_step(work)


class Mixed(BatchPolicy):
    """Stall-free batches: every ready decode rides with up to chunk_size prompt tokens, as one engine step."""

    name = "mixed"

    def next_step(self, running, *, chunk_size):
        return mixed_step(running, chunk_size)


class Slo(BatchPolicy):
    """mixed under a time budget: each step carries as many prompt tokens (at most chunk_size) as keep its
    predicted time under a time-between-tokens target; `budget(running)` says how many (pdlib/run/serve_slo.py:
    from a step cost fitted on the device, as Sarathi-Serve picks its token budget from the TBT SLO)."""

    name = "slo-mixed"
    needs_budget = True

    def __init__(self, budget: Callable[[list[RequestState]], int]):
        self.budget = budget

    def next_step(self, running, *, chunk_size):
        n = self.budget(running)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"the slo-mixed budget must be a whole number >= 1 of prompt tokens, got {n!r}")
        return mixed_step(running, min(n, chunk_size))


class Fifo(BatchPolicy):
    """The earliest-arrived unfinished request alone until it finishes: no request ever waits on a later one."""

    name = "fifo"

    def next_step(self, running, *, chunk_size):
        if not running:
            return None
        r = running[0]
        return chunk(r, chunk_size) if not r.prompt_done else Decode(r.name)


class Overlap(BatchPolicy):
    """Every step a decode round; prompts elsewhere, one at a time, earliest arrival first."""

    name = "overlap"
    remote_prefill = "stream"

    def next_step(self, running, *, chunk_size):
        return decode_round(running)

    def next_remote(self, running):
        return first_waiting(running)


class Partition(Overlap):
    """Overlap with the device's SMs split between the prompt and the decode rounds."""

    name = "partition"
    remote_prefill = "slice"


class Disagg(Overlap):
    """Overlap with the prompts on the prefill worker (a second GPU; the CPU's ring backend in CI), each one's
    K/V sent over when it is joined."""

    name = "disagg"
    remote_prefill = "worker"


class Turns:
    """A policy whose rounds of decodes go out one decode a step, in arrival order (as the two-request eager,
    chunked and overlap run A's and B's decodes in turn), every other step as the policy gives it."""

    def __init__(self, policy: BatchPolicy):
        self.policy, self.name, self.remote_prefill = policy, policy.name, policy.remote_prefill
        self._queue: list[Decode] = []

    def next_step(self, running, *, chunk_size):
        if not self._queue:
            step = self.policy.next_step(running, chunk_size=chunk_size)
            if not isinstance(step, Batch) or not all(isinstance(w, Decode) for w in step.work):
                return step
            self._queue = list(step.work)
        return self._queue.pop(0)

    def next_remote(self, running):
        return self.policy.next_remote(running)


DECODE_ROUNDS = ("batched", "turns")


def make_batch_policy(
    name: str, *, budget: Callable[[list[RequestState]], int] | None = None, decode_rounds: str = "batched"
) -> BatchPolicy:
    """A fresh policy; `budget` for the one that needs it (slo-mixed); `decode_rounds`: a round of decodes as one
    step (batched) or one decode a step in turn (turns: the two-request policies' steps on the pair)."""
    if name not in BATCH_POLICIES:
        raise InputError(f"unknown serving policy {name!r}; expected one of: {', '.join(BATCH_POLICIES)}")
    if decode_rounds not in DECODE_ROUNDS:
        raise InputError(f"decode_rounds must be one of {', '.join(DECODE_ROUNDS)}, got {decode_rounds!r}")
    cls = BATCH_POLICIES[name]
    if getattr(cls, "needs_budget", False):
        if budget is None:
            raise ValueError(f"serving policy {name!r} needs a budget (pdlib/run/serve_slo.py)")
        policy = cls(budget)
    else:
        policy = cls()
    return Turns(policy) if decode_rounds == "turns" else policy


def check_step(step: Step, states: dict[str, RequestState]) -> None:
    """Raise ValueError unless every part of `step` is legal now for a running request, one part per request."""
    names = [w.req for w in step.work]
    if len(set(names)) < len(names):
        raise ValueError(f"step {step} holds more than one part for a request")
    for w in step.work:
        if w.req not in states:
            raise ValueError(f"step {step} names {w.req!r}, which is not running")
        states[w.req].check(w)


def simulate(
    policy: str | BatchPolicy, requests: Sequence[tuple[str, int, int, int]], *, chunk_size: int
) -> list[Step]:
    """Every step a policy takes on `requests` (name, prompt_tokens, output_tokens, arrival), in arrival order,
    on a clock that counts steps: a request arriving at k is running before step k (the (k+1)-th step); when the
    policy has nothing to do, the clock jumps to the next arrival. Each step is checked legal before it is taken.
    A remote-prefill policy's prompt is done one step after it starts (its join is the next step)."""
    return list(iter_simulate(policy, requests, chunk_size=chunk_size))


def iter_simulate(
    policy: str | BatchPolicy, requests: Sequence[tuple[str, int, int, int]], *, chunk_size: int
) -> Iterator[Step]:
    check_int("chunk_size", chunk_size, 1)
    policy = make_batch_policy(policy) if isinstance(policy, str) else policy
    arrivals = [a for *_, a in requests]
    if any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise ValueError(f"requests must be in arrival order, got arrivals {arrivals}")
    states: dict[str, RequestState] = {}
    running: list[RequestState] = []
    nxt, clock = 0, 0
    lane = None  # a remote-prefill policy's prompt in flight: it is done one step after it starts
    while nxt < len(requests) or running:
        while nxt < len(requests) and requests[nxt][3] <= clock:
            name, p, o, _ = requests[nxt]
            states[name] = RequestState(name, p, o)
            running.append(states[name])
            nxt += 1
        step = None
        if lane is not None:
            step, lane = Prefill(lane.name, lane.prompt_tokens - lane.prefilled, remote=True), None
        elif policy.remote_prefill and (lane := policy.next_remote(running)) is not None:
            pass
        step = step or policy.next_step(running, chunk_size=chunk_size)
        if step is None and lane is not None:  # nothing else to do: the prompt is joined at once
            step, lane = Prefill(lane.name, lane.prompt_tokens - lane.prefilled, remote=True), None
        if step is None:
            if running:
                raise RuntimeError(f"policy {policy.name!r} stopped with requests running: {running}")
            clock = requests[nxt][3]
            continue
        check_step(step, states)
        yield step
        for w in step.work:
            states[w.req].apply(w)
        if any(states[w.req].finished for w in step.work):
            running = [r for r in running if not r.finished]
        clock += 1

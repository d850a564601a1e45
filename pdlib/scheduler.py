"""Who runs next when B's long prompt arrives while A is decoding: pure step logic, no arrays.

    from pdlib.scheduler import plan, t0_index
    steps = plan("chunked", prompt_tokens=4096, output_tokens=1024, chunk_size=512)
    setup, timed = steps[:t0_index(steps)], steps[t0_index(steps):]

A step is one request's work, `Prefill(req, n)` or `Decode(req)`, or a `Batch` of several requests' work
that runs as one unit; every step's `work` lists its parts. pdlib/run/executor.py runs a plan on the engine. A
new policy is one `Policy` subclass with a `name`; it registers itself in `POLICIES`.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar

from pdlib.errors import InputError


@dataclass(frozen=True)
class Prefill:
    req: str
    n: int  # the next n prompt tokens; the chunk that ends the prompt emits the first output
    remote: bool = field(default=False, repr=False)  # computed elsewhere (a worker, a stream), joined here

    @property
    def work(self) -> tuple["Work", ...]:
        return (self,)


@dataclass(frozen=True)
class Decode:
    req: str  # one decode step: one more output

    @property
    def work(self) -> tuple["Work", ...]:
        return (self,)


Work = Prefill | Decode


@dataclass(frozen=True)
class Batch:
    """Several requests' work as one step, at most one part per request: one engine step whose rows share the
    weight reads (e.g. every ready decode plus a prefill chunk); the tokens are observed after it."""

    work: tuple[Work, ...]

    def __post_init__(self):
        if not self.work or not all(isinstance(w, (Prefill, Decode)) for w in self.work):
            raise ValueError(f"a batch needs one or more Prefill/Decode parts, got {self.work!r}")


Step = Prefill | Decode | Batch


@dataclass
class RequestState:
    name: str
    prompt_tokens: int
    output_tokens: int
    prefilled: int = 0
    emitted: int = 0

    @property
    def prompt_done(self) -> bool:
        return self.prefilled == self.prompt_tokens

    @property
    def ready(self) -> bool:
        return self.prompt_done and self.emitted < self.output_tokens

    @property
    def finished(self) -> bool:
        return self.emitted == self.output_tokens

    def check(self, step: Work) -> None:
        """Raise ValueError if `step` is illegal now, so a buggy policy fails before the engine runs it."""
        if step.req != self.name:
            raise ValueError(f"step {step} is for {step.req!r}, not {self.name!r}")
        if isinstance(step, Prefill):
            if step.n < 1 or self.prefilled + step.n > self.prompt_tokens:
                raise ValueError(f"{step} is illegal: {self.name} has prefilled {self.prefilled}/{self.prompt_tokens}")
        elif not self.ready:
            raise ValueError(
                f"{step} is illegal: {self.name} is not ready ({self.prefilled}/{self.prompt_tokens} "
                f"prefilled, {self.emitted}/{self.output_tokens} emitted)"
            )

    def apply(self, step: Work) -> None:
        self.check(step)
        if isinstance(step, Prefill):
            self.prefilled += step.n
            self.emitted += self.prompt_done  # the final chunk yields the first output token
        else:
            self.emitted += 1


POLICIES: dict[str, type["Policy"]] = {}


class Policy:
    """Given both requests' states, return the next step (None when both are finished).
    May keep tiny private state, so make a fresh instance per run."""

    name: ClassVar[str]
    remote_prefill: ClassVar[str | None] = None  # where else B's prompt runs: "worker" (pdlib/disagg),
    # "stream" (pdlib/run/overlap.py) or "slice" (pdlib/run/partition.py); None: in the steps

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__:  # abstract helpers without a name stay out of the registry
            if cls.name in POLICIES:
                raise TypeError(f"policy name {cls.name!r} is already taken by {POLICIES[cls.name].__qualname__}")
            POLICIES[cls.name] = cls

    def next_step(self, a: RequestState, b: RequestState, *, chunk_size: int) -> Step | None:
        raise NotImplementedError


def _chunk(r: RequestState, chunk_size: int) -> Prefill:
    return Prefill(r.name, min(chunk_size, r.prompt_tokens - r.prefilled))


class Eager(Policy):
    """B's whole prompt back to back (A stalls once), then A and B decode in turn, A first."""

    name = "eager"

    def __init__(self):
        self._a_turn = True

    def next_step(self, a, b, *, chunk_size):
        if not b.prompt_done:
            return _chunk(b, chunk_size)
        first, second = (a, b) if self._a_turn else (b, a)
        r = first if first.ready else second if second.ready else None
        if r is None:
            return None
        self._a_turn = r is b  # the other one goes next
        return Decode(r.name)


class Chunked(Policy):
    """Rounds: one decode per ready request (A then B), then one B prefill chunk: many short stalls."""

    name = "chunked"

    def __init__(self):
        self._round: list[Step] = []

    def chunk(self, b: RequestState, chunk_size: int) -> Prefill:
        return _chunk(b, chunk_size)

    def next_step(self, a, b, *, chunk_size):
        if not self._round:  # planned from the round's start, so B's last chunk cannot add a B decode
            self._round = [Decode(r.name) for r in (a, b) if r.ready]
            if not b.prompt_done:
                self._round.append(self.chunk(b, chunk_size))
        return self._round.pop(0) if self._round else None


class Fifo(Policy):
    """A runs to completion, then B: A never stalls, B waits for all of A."""

    name = "fifo"

    def next_step(self, a, b, *, chunk_size):
        if a.ready:
            return Decode(a.name)
        if not b.prompt_done:
            return _chunk(b, chunk_size)
        return Decode(b.name) if b.ready else None


class Mixed(Policy):
    """Stall-free batching (Sarathi-Serve; vLLM's and SGLang's mixed chunked prefill): every step carries every
    ready decode plus, while B's prompt lasts, its next chunk, all as one engine step."""

    name = "mixed"

    def chunk(self, b: RequestState, chunk_size: int) -> Prefill:
        return _chunk(b, chunk_size)

    def next_step(self, a, b, *, chunk_size):
        work = [Decode(r.name) for r in (a, b) if r.ready]
        if not b.prompt_done:
            work.append(self.chunk(b, chunk_size))
        if not work:
            return None
        return work[0] if len(work) == 1 else Batch(tuple(work))


class _SloChunks:
    """Chunk sizes from a time-between-tokens target: `chunk_rule(prefilled)` is the largest chunk whose
    predicted gap for A stays under the target (pdlib/run/slo.py fits it); never more than chunk_size, the
    ceiling."""

    needs_chunk_rule = True

    def __init__(self, *, chunk_rule: Callable[[int], int]):
        super().__init__()
        self.chunk_rule = chunk_rule

    def chunk(self, b: RequestState, chunk_size: int) -> Prefill:
        n = self.chunk_rule(b.prefilled)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"chunk rule gave {n!r} at {b.prefilled}; expected an integer >= 1")
        return _chunk(b, min(n, chunk_size))


class SloChunked(_SloChunks, Chunked):
    """chunked, with each chunk as large as A's gap target allows."""

    name = "slo-chunked"


class SloMixed(_SloChunks, Mixed):
    """mixed, with each chunk as large as A's gap target allows."""

    name = "slo-mixed"


def needs_chunk_rule(name: str) -> bool:
    return getattr(POLICIES.get(name), "needs_chunk_rule", False)


class _PrefillElsewhere(Policy):
    """B's whole prompt runs elsewhere from t0 (`remote_prefill`: another worker or another stream) while A
    keeps decoding here. Once `ready()` says B's K/V and first output are done, one remote `Prefill` joins
    them (A's only pause); then A and B decode in turn, A first. If A runs out of work first, the remote
    prefill is issued anyway and waits. `ready` is a non-blocking probe; without one (a plan) B is ready at
    once, so the plan fixes each request's own sequence, not the interleaving (see `interleave`)."""

    def __init__(self, ready: Callable[[], bool] = lambda: True):
        self._ready, self._a_turn = ready, True

    def next_step(self, a, b, *, chunk_size):
        if not b.prompt_done:
            if a.ready and not self._ready():
                return Decode(a.name)
            return Prefill(b.name, b.prompt_tokens - b.prefilled, remote=True)
        first, second = (a, b) if self._a_turn else (b, a)
        r = first if first.ready else second if second.ready else None
        if r is None:
            return None
        self._a_turn = r is b
        return Decode(r.name)


class Disagg(_PrefillElsewhere):
    """Prefill/decode disaggregation (DistServe, Splitwise): B's prompt runs on a second worker
    (pdlib/disagg), its K/V comes back through a collective (the join)."""

    name = "disagg"
    remote_prefill = "worker"


class Overlap(_PrefillElsewhere):
    """B's whole prompt on a second stream of this device (pdlib/run/overlap.py), concurrent with A's decodes on
    the first: A is slowed by contention rather than stopped; joining costs no transfer."""

    name = "overlap"
    remote_prefill = "stream"


class Partition(_PrefillElsewhere):
    """B's whole prompt on a slice of the device's SMs (pdlib/run/partition.py) while A decodes on the rest:
    overlap's steps, with the cores split instead of shared, so B's prefill cannot take A's."""

    name = "partition"
    remote_prefill = "slice"


def interleave(live: Iterable[Step], validated: list[Step]) -> Iterator[Step]:
    """For a policy whose interleaving depends on timing (disagg, overlap, partition): the live steps, each
    part held to the validated plan *per request* (every token exactly once, in order); the order across
    requests is free.
    The gate's checks are per request, so this is what makes a timed run the validated one."""
    queues: dict[str, list[Work]] = {}
    for s in validated:
        for w in s.work:
            queues.setdefault(w.req, []).append(w)
    pos = {r: 0 for r in queues}
    for n, step in enumerate(live):
        for w in step.work:
            q, i = queues.get(w.req, []), pos.get(w.req, 0)
            if i >= len(q) or w != q[i]:
                raise RuntimeError(
                    f"step {n}: {w!r} is not {w.req}'s next validated part ({q[i] if i < len(q) else 'the end'!r})"
                )
            pos[w.req] = i + 1
        yield step
    short = {r: f"{pos[r]}/{len(q)}" for r, q in queues.items() if pos[r] != len(q)}
    if short:
        raise RuntimeError(f"the run ended with parts left of the validated plan: {short}")


def make_policy(name: str, *, chunk_rule: Callable[[int], int] | None = None) -> Policy:
    """A fresh policy; `chunk_rule` (prefilled -> chunk size) for the ones that need it (the slo ones)."""
    if name not in POLICIES:
        raise InputError(f"unknown policy {name!r}; expected one of: {', '.join(POLICIES)}")
    if needs_chunk_rule(name):
        if chunk_rule is None:
            raise ValueError(f"policy {name!r} needs a chunk rule (pdlib/run/slo.py)")
        return POLICIES[name](chunk_rule=chunk_rule)
    return POLICIES[name]()


def _positive(**kw) -> None:
    for k, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{k} must be an integer >= 1, got {v!r}")


def prefill_steps(req: RequestState, *, chunk_size: int) -> list[Prefill]:
    """The rest of req's prompt in chunks; A's untimed set-up before t0."""
    _positive(chunk_size=chunk_size)
    starts = range(req.prefilled, req.prompt_tokens, chunk_size)
    return [Prefill(req.name, min(chunk_size, req.prompt_tokens - s)) for s in starts]


def schedule(policy: Policy, a: RequestState, b: RequestState, *, chunk_size: int) -> Iterator[Step]:
    """Yield the policy's steps until both requests finish; states advance after each step is consumed."""
    states = {a.name: a, b.name: b}
    while not (a.finished and b.finished):
        step = policy.next_step(a, b, chunk_size=chunk_size)
        if step is None:
            raise RuntimeError(f"policy {policy.name!r} stopped before both requests finished: {a}, {b}")
        if any(w.req not in states for w in step.work):
            raise RuntimeError(f"policy {policy.name!r} made step {step} for an unknown request")
        trial = {name: replace(s) for name, s in states.items()}
        try:  # every legal part advances a counter, so legality is enough to guarantee progress
            for w in step.work:
                trial[w.req].apply(w)
        except ValueError as e:
            raise RuntimeError(f"policy {policy.name!r} made no progress: {e}") from e
        yield step
        for w in step.work:
            states[w.req].apply(w)


def iter_plan(
    policy_name: str,
    *,
    prompt_tokens: int,
    output_tokens: int,
    chunk_size: int,
    chunk_rule: Callable[[int], int] | None = None,
    policy: Policy | None = None,
) -> Iterator[Step]:
    """One experiment's full step sequence, decided as it is consumed: A's set-up prefill, then the policy's
    steps from t0. `policy`: an instance to use instead of a fresh one (disagg's or overlap's, bound to its prefill)."""
    _positive(prompt_tokens=prompt_tokens, output_tokens=output_tokens, chunk_size=chunk_size)
    policy = policy or make_policy(policy_name, chunk_rule=chunk_rule)
    a, b = (RequestState(n, prompt_tokens, output_tokens) for n in "AB")
    for s in prefill_steps(a, chunk_size=chunk_size):
        yield s
        a.apply(s)
    yield from schedule(policy, a, b, chunk_size=chunk_size)


def plan(
    policy_name: str,
    *,
    prompt_tokens: int,
    output_tokens: int,
    chunk_size: int,
    chunk_rule: Callable[[int], int] | None = None,
) -> list[Step]:
    """`iter_plan` as a list: what the validation gate checks."""
    return list(
        iter_plan(
            policy_name,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            chunk_size=chunk_size,
            chunk_rule=chunk_rule,
        )
    )


def follow(live: Iterable[Step], validated: list[Step]) -> Iterator[Step]:
    """The live policy's steps, each held to the validated plan: a step that differs stops the run."""
    n = 0
    for step in live:
        if n >= len(validated) or step != validated[n]:
            want = validated[n] if n < len(validated) else "the end"
            raise RuntimeError(f"step {n} is {step}, the validated plan has {want}")
        yield step
        n += 1
    if n != len(validated):
        raise RuntimeError(f"the run ended after {n} steps, the validated plan has {len(validated)}")


def is_setup(step: Step) -> bool:
    """A's untimed set-up steps are its prompt chunks (no policy prefills A)."""
    return isinstance(step, Prefill) and step.req == "A"


def t0_index(steps: list[Step]) -> int:
    """Index of the first timed step: A's set-up is the leading run of A prefills."""
    i = 0
    while i < len(steps) and is_setup(steps[i]):
        i += 1
    return i

"""The one executor of a plan: validation and timed trials are two uses of it, so the step sequence that is
timed is the one that was checked (a timed run's policy decides live and is held to the validated plan step
for step: `scheduler.follow`; `disagg`, whose interleaving depends on timing, per request:
`scheduler.interleave`, pdlib/run/disagg/remote.py).

    steps = plan("chunked", prompt_tokens=4096, output_tokens=1024, chunk_size=128)
    execute(engine, steps, logical_reset=True, hooks=[gate])                       # validation
    execute(engine, follow(iter_plan("chunked", ...), steps), logical_reset=True, hooks=[recorder])   # a trial

A run: reset A; run A's set-up steps; at t0 (the first step after A's set-up prefill) reset B; then every
step. A step is one engine call (a Batch's parts run as one ragged step); then the host observes each
output's token id (`Output.observe`: `.item()`, or the kernel's mailbox) and reads the clock right after it.
The step ends with its last token or, when a part yields none, when the host has waited for that part's own
arrays (its cache's K/V and write fence), so its time is its work's. The clock is also read when the engine
call returns (`WorkResult.t_issued`: the host has built and issued the step) and when the host starts waiting
for the step (`t_wait`), so a step whose time went to the host tells itself apart from one that waited on the
device; in between, a pipelined run issues the next step (and waits for the one before). The host thread's
CPU time during the engine call is kept too (`cpu_issue`): the rest of that call the thread was not running
(it waited: for MLX, which holds it while more than ten command buffers are in flight, for the GIL or a
blocking call; or the OS ran something else). Hooks see each step after it ran: its parts' results and the
clock readings.

Pipelined decodes (`pipeline=True`, RunParams.pipeline_decodes): a step of decodes only is issued before the
step before it is observed, whatever that step was; each decode's input token is on the device already, so
the host's launch work overlaps the device's (as mlx-lm's `generate` and vLLM's async scheduling run), and
after a prompt chunk A's decode is queued behind the chunk instead of launched once the host has seen the
chunk end. Hooks still see every step once, in order, after its tokens are observed; a pipelined step's
t_start then falls before the previous step's t_end, and the previous step's t_end (its last token, or its
arrays seen done) comes after the host's work to issue the pipelined one. A step with a prompt chunk is issued
after the tokens before it are observed, so a chunk's long dispatch never delays one; with `poll=True`
(RunParams.poll_during_chunks) and decodes ahead whose tokens can be looked at without waiting (`Output.peek`:
the persistent kernel's mailbox), it is issued at once instead, and the host looks for those tokens after
starting each of its layers (`Engine.batch`'s `between`) and observes them when it finds them, or when the
chunk is issued: the host builds the chunk while the device decodes, and a token waits for at most one
layer's build (a token's t_emit is when the host found it; its step's t_wait when the host first looked).

B's prefill elsewhere: a step source may carry a `remote` (`RemoteSteps`): disagg's prefill worker
(pdlib/run/disagg/remote.py) or overlap's second stream (pdlib/run/overlap.py). Then at t0, right after B's reset,
the executor starts it (`remote.start(engine)`), after issuing each timed step lets it dispatch its next
piece (`remote.advance()`: overlap's next layer), and a `Prefill(remote=True)` step joins it
(`remote.receive`): B's K/V are in B's cache and its first output is here after it, and the result records
the prefill's own times (and disagg's transfer). A remote with `issuing()` (partition's, pdlib/run/partition.py)
says where each step is issued: inside it, A's steps run on their slice of the SMs. Everything else is
unchanged.
"""

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

import mlx.core as mx

from pdlib.engine import Engine, Output, check_token
from pdlib.scheduler import POLICIES, Decode, Prefill, Step, Work, interleave, is_setup, iter_plan

now = time.perf_counter_ns
cpu_now = time.thread_time_ns  # this thread's CPU time


@dataclass
class WorkResult:
    work: Work
    start: int  # cache positions the part wrote: [start, stop)
    stop: int
    output: Output | None  # the output it yielded, if any (decodes, and a prompt's last chunk)
    done: tuple = ()  # without an output: the arrays that are ready when the part's work is done
    token: int | None = None  # the token id as the host observed it
    t_emit: int | None = None  # perf_counter_ns right after the host observed it
    t_issued: int | None = None  # perf_counter_ns when the engine call that ran the step returned
    t_wait: int | None = None  # perf_counter_ns when the host began waiting for the step's outputs
    cpu_issue: int | None = None  # ns of this thread's CPU time inside the engine call (of t_issued - t_start)
    remote: dict | None = None  # a remote prefill's record: site, t_dispatch, t_ready, t_start, t_end (ns), ...


class Hook:
    """What a use of the executor does around the steps; every method is optional."""

    def on_t0(self, t0: int, t_reset_end: int) -> None:
        """B arrived at t0 and its cache reset ended at t_reset_end (perf_counter_ns)."""

    def on_step(
        self, index: int, step: Step, results: list[WorkResult], t_start: int, t_end: int, *, timed: bool
    ) -> None:
        """Step `index` ran between t_start and t_end; `timed` is False for A's set-up before t0."""


class RemoteSteps:
    """A step source that carries where B's prefill runs (its `remote`): the executor looks for it."""

    def __init__(self, steps: Iterable[Step], remote):
        self.steps, self.remote = steps, remote

    def __iter__(self):
        return iter(self.steps)


def remote_walk(policy: str, params, remote, validated: list[Step]) -> RemoteSteps:
    """A remote-prefill policy (disagg, overlap, partition) deciding live, bound to `remote`'s `ready()` probe,
    held to the validated plan per request (`scheduler.interleave`)."""
    live = iter_plan(
        policy,
        prompt_tokens=params.prompt_tokens,
        output_tokens=params.output_tokens,
        chunk_size=params.chunk_size,
        policy=POLICIES[policy](ready=remote.ready),
    )
    return RemoteSteps(interleave(live, validated), remote)


def _receive(engine: Engine, step: Prefill, remote) -> list[WorkResult]:
    """A remote prefill step: join the prefill done elsewhere; its K/V end at the request's cache length."""
    if remote is None:
        raise ValueError(f"{step} needs a step source that prefills elsewhere (pdlib.run.disagg, pdlib.run.overlap)")
    out, record = remote.receive(engine, step.req, step.n)
    stop = engine.requests[step.req].length
    return [WorkResult(step, stop - step.n, stop, out, remote=record)]


def _issue(engine: Engine, step: Step, between=None) -> list[WorkResult]:
    """Run one step on the engine: a Batch as one engine step (its rows share the weight reads), a single
    decode on the engine's decode path. `between`: Engine.batch's."""
    starts = [engine.requests[w.req].length for w in step.work]
    if isinstance(step, Decode):
        outs = [engine.decode(step.req)]
    else:
        outs = engine.batch([(w.req, w.n if isinstance(w, Prefill) else None) for w in step.work], between=between)
    caches = [engine.requests[w.req].cache for w in step.work]
    # the layers' arrays as this step left them: the cache's lists change in place with later steps
    return [
        WorkResult(w, a, c.length, o, done=() if o is not None else (*c.k, *c.v, c.written))
        for w, a, c, o in zip(step.work, starts, caches, outs)
    ]


def _decodes_only(step: Step) -> bool:
    return all(isinstance(w, Decode) for w in step.work)


def _pollable(step: Step, results: list[WorkResult]) -> bool:
    """Decodes only, every token of which can be looked at without waiting (Output.peek)."""
    return _decodes_only(step) and all(r.output is not None and r.output.mailbox is not None for r in results)


def execute(
    engine: Engine,
    steps: Iterable[Step],
    *,
    logical_reset: bool,
    hooks: list[Hook] = (),
    pipeline: bool = False,
    poll: bool = False,
) -> None:
    """`steps`: a plan, or a policy deciding live (`scheduler.follow`), whose decisions then fall between
    steps, inside the timed run. `pipeline`: pipelined decodes; `poll`: with them, a prompt chunk issued
    while the decodes ahead are polled (above)."""
    timed = False
    remote = getattr(steps, "remote", None)  # where B's prefill runs, if not in the steps (RemoteSteps)
    # where a step is issued: partition's remote puts A's steps on its slice while B's prefill is out
    issuing = getattr(remote, "issuing", contextlib.nullcontext)
    pending = None  # a step issued whose tokens are not observed yet: (index, step, results, t_start, timed)

    def observe(
        index: int, step: Step, results: list[WorkResult], t_start: int, was_timed: bool, *, peek: bool = False
    ) -> bool:
        """Observe a step's tokens, then its hooks run; with `peek`, only if they are on the host already
        (those found are kept): whether the step was observed."""
        t_wait = now()
        for r in results:
            if r.t_wait is None:
                r.t_wait = t_wait
            if r.output is not None and r.token is None:
                token = r.output.peek() if peek else r.output.observe()
                if token is None:
                    return False
                r.token = check_token(token)
                r.t_emit = now()
        if all(r.output is not None for r in results):
            t_end = results[-1].t_emit  # the step ends when its last token is observed
        else:  # a chunk's K/V are written (a token may not have waited for them): the step ends. Its own
            # arrays, not the stream: a pipelined decode may be queued behind it
            mx.eval([r.done for r in results if r.output is None])
            t_end = now()
        for h in hooks:
            h.on_step(index, step, results, t_start, t_end, timed=was_timed)
        return True

    engine.reset("A", logical=logical_reset)
    for i, step in enumerate(steps):
        remote_step = isinstance(step, Prefill) and step.remote
        overlaps = pipeline and _decodes_only(step)
        polls = (
            poll
            and pending is not None
            and timed
            and not remote_step
            and not _decodes_only(step)
            and _pollable(pending[1], pending[2])
        )
        if pending is not None and not polls and (not overlaps or not timed and not is_setup(step)):
            observe(*pending)
            pending = None
        seen = False  # the decodes ahead were observed while this step was issued (polls)

        def look() -> None:
            nonlocal seen
            seen = seen or observe(*pending, peek=True)

        if not timed and not is_setup(step):
            timed = True
            mx.synchronize()  # nothing of the set-up may run into the timed part
            t = now()
            engine.reset("B", logical=logical_reset)
            mx.synchronize()
            t_reset = now()
            if remote is not None:
                remote.start(engine)  # B's prompt goes to the prefill worker / the second stream
            for h in hooks:
                h.on_t0(t, t_reset)
        t_start = now()
        cpu_start = cpu_now()
        with issuing():
            results = _receive(engine, step, remote) if remote_step else _issue(engine, step, look if polls else None)
        cpu_end, t_issued = cpu_now(), now()
        cpu_issue = min(cpu_end - cpu_start, t_issued - t_start)  # two clocks: the wall one may be slewed a few µs
        for r in results:
            r.t_issued, r.cpu_issue = t_issued, cpu_issue
        if timed and remote is not None and not remote_step:
            remote.advance()  # the remote prefill's next piece, dispatched while this step runs
        if pending is not None and not seen:
            observe(*pending)  # the step before, while this one is queued behind it on the device
        pending = (i, step, results, t_start, timed)
        if not pipeline:
            observe(*pending)
            pending = None
    if pending is not None:
        observe(*pending)

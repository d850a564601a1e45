"""`overlap`: B's prefill on a second stream of this device, concurrent with A's decodes on the first.

    session = OverlapSession(params)
    steps = session.walk(validated_plan)        # the live policy + its StreamPrefill, for execute()

The executor calls `prefill.start(engine)` at t0, after B's reset: B's whole prompt starts on the second
stream as one prefill, dispatched a layer at a time (`Engine.prefill_stages`): the first layer at t0, then
one more each time the executor calls `advance()`, which it does right after issuing each of A's steps,
while A's step runs. Dispatched as one graph, MLX held the host for the whole prefill (it keeps at most 10
command buffers in flight), which serialised A behind it. A waiter thread follows B's
layers as they finish (`mx.eval` of arrays already scheduled only waits for their event, with the GIL
released), which paces the dispatch, and stamps when the first output is done. Between A's steps the
`overlap` policy polls `ready()`, which never blocks; its `Prefill(remote=True)` step then joins the
prefill (`receive`): nothing moves, B's K/V are already in B's cache. B's first token is observed there.

Nothing is shared between the two streams but the read-only weights: each request has its own cache and
write fence, and B's later decodes on the first stream depend on the second's outputs through the arrays
(MLX orders that across streams) and, before any of them is issued, through the join. Whether the device
runs the two streams concurrently is the backend's business; each run records how many of A's tokens came
out while B's prefill was in flight, which is what was measured rather than assumed.
"""

import queue
import threading

import mlx.core as mx

from pdlib import settings
from pdlib.errors import RunFailure
from pdlib.run.executor import RemoteSteps, now, remote_walk
from pdlib.scheduler import Step

_streams: dict[str, mx.Stream] = {}
LAYER, LAST = "layer", "last"  # what the waiter is handed: one of B's layers, or the prefill's results


def second_stream() -> mx.Stream:
    """One extra stream per device for the process (MLX streams live as long as the process)."""
    key = str(mx.default_device())
    if key not in _streams:
        _streams[key] = mx.new_stream(mx.default_device())
    return _streams[key]


class StreamPrefill:
    """One run's prefill of B on the second stream: start (t0), advance (after each of A's steps), ready
    (poll), receive (the join). One of B's layers is on the device at a time: MLX's cap on work in flight is
    global, so a deeper queue of B's would stall A's dispatch behind it (on the CPU, where a task is ten
    operations, two layers of a long prompt already do); and the next is built only once the waiter is done
    with the last (`_idle`). A waiter thread counts B's layers done (`mx.eval` of arrays already scheduled
    only waits for their event, with the GIL released) and stamps when the last one is."""

    def __init__(self, req: str, n: int, *, stream: mx.Stream):
        self.req, self.n, self.stream = req, n, stream
        self.t_dispatch = self.t_ready = None
        self.output = self._error = None
        self.layers_dispatched = self.layers_done = 0
        self._stages = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._counted = threading.Condition()  # a layer counted done, or the waiter gone
        self._waiter = threading.Thread(target=self._wait, name="pdlib-overlap-waiter", daemon=True)

    def start(self, engine) -> None:
        if self.t_dispatch is not None:
            raise RuntimeError("a StreamPrefill serves one run")
        self.t_dispatch = now()
        r = engine.requests[self.req]
        if r.length != 0 or r.prompt.size != self.n:
            raise ValueError(
                f"the second stream prefills {self.req}'s whole {self.n}-token prompt from 0; "
                f"it holds {r.length} positions of a {r.prompt.size}-token prompt"
            )
        self._cache, self._stages = r.cache, engine.prefill_stages(self.req, self.n)
        self._waiter.start()
        self.advance()

    def advance(self, *, force: bool = False) -> None:
        """Dispatch B's next layer on the second stream once the waiter has counted the last one done (or
        `force`, with the waiter idle: a forced layer is not handed to it); after the last layer, the first
        output."""
        if self._stages is None or (not force and self.layers_done < self.layers_dispatched):
            return
        with self.place():
            try:
                arrays = next(self._stages)
            except StopIteration as done:
                self.output = done.value
            else:
                if not arrays:  # nothing to wait on: the waiter would count the layer done at once
                    self._stages = None
                    self._queue.put((LAST, []))  # let the waiter go
                    raise RuntimeError(
                        f"layer {self.layers_dispatched} of {self.req}'s prefill came without its arrays"
                    )
                self.layers_dispatched += 1
                if not force:
                    self._queue.put((LAYER, arrays))
                return
        self._stages = None
        c = self._cache
        self._queue.put((LAST, [self.output.token, self.output.logits, c.k, c.v, c.written]))

    def place(self):
        """Where B's layers are issued: the second stream."""
        return mx.stream(self.stream)

    def _wait(self) -> None:
        try:
            while True:
                what, arrays = self._queue.get()
                mx.eval(arrays)  # scheduled already (the engine's async_eval): this only waits for the device
                arrays = None  # counted done holding none of B's arrays: the main thread builds on them next
                if what is LAST:
                    break
                with self._counted:
                    self.layers_done += 1
                    self._counted.notify_all()
        except BaseException as e:  # handed to the main thread by receive()
            self._error = e
        self.t_ready = now()
        self._done.set()
        with self._counted:
            self._counted.notify_all()

    def _idle(self, timeout_s: float) -> bool:
        """Wait until the waiter has counted every layer handed to it (or is gone): from then on it touches
        none of B's arrays until it is handed the last. MLX's graph is not safe to build on from one thread
        while another waits on its arrays: a forced dispatch beside a waiting waiter crashed the process on
        CUDA."""
        with self._counted:
            return self._counted.wait_for(
                lambda: self.layers_done >= self.layers_dispatched or self._done.is_set(), timeout_s
            )

    def ready(self) -> bool:
        return self._done.is_set()

    def receive(self, engine, req: str, n: int):
        """Join B's prefill (wait for it if A ran out of work first); B's K/V are in its cache already."""
        if self.t_dispatch is None:
            raise RuntimeError("receive before start: the executor starts the second stream at t0")
        if (req, n) != (self.req, self.n):
            raise ValueError(
                f"a remote prefill of {n} tokens of {req}; the second stream prefilled {self.n} of {self.req}"
            )
        t_start = now()
        # B's prefill, t0 to its results on the host: a generous bound, so a hang becomes an error, not a stuck run
        timeout_s = settings.get("PDLIB_OVERLAP_TIMEOUT_S")
        if self._stages is not None:  # A ran out of steps first: the rest of B's layers now, the waiter idle
            if not self._idle(timeout_s):
                raise RunFailure(f"{self.req}'s layers on the second stream did not finish within {timeout_s:.0f} s")
            while self._stages is not None and self._error is None:
                self.advance(force=True)
        if not self._done.wait(timeout_s):
            raise RunFailure(f"B's prefill on the second stream did not finish within {timeout_s:.0f} s")
        self._waiter.join()
        if self._error is not None:
            raise RunFailure(f"B's prefill on the second stream failed: {self._error}") from self._error
        return self.output, {
            "site": "stream",
            "stream": str(self.stream),
            "t_dispatch": self.t_dispatch,
            "t_ready": self.t_ready,
            "t_start": t_start,
            "t_end": now(),
            "layers": self.layers_dispatched,
        }


class OverlapSession:
    """One experiment's `overlap` runs: the live policy bound to a fresh StreamPrefill per run."""

    def __init__(self, params):
        self.params = params
        self.stream = second_stream()

    def walk(self, validated: list[Step]) -> RemoteSteps:
        prefill = StreamPrefill("B", self.params.prompt_tokens, stream=self.stream)
        return remote_walk("overlap", self.params, prefill, validated)


__all__ = ["OverlapSession", "StreamPrefill", "second_stream"]

"""`overlap`: B's prefill on a second stream of this device, concurrent with A's decodes on the first.

    session = OverlapSession(params)
    steps = session.walk(validated_plan)        # the live policy + its StreamPrefill, for execute()

The executor calls `prefill.start(engine)` at t0, after B's reset: B's whole prompt is built as one engine
call on the second stream (one graph, so the host spends one prefill's graph-building there, not one per
chunk) and handed to the device; a waiter thread then blocks on its results (`mx.eval` of arrays already
scheduled only waits for their event, with the GIL released) and stamps when they are done. Between A's
steps the `overlap` policy polls `ready()`, which never blocks; its `Prefill(remote=True)` step then joins
the prefill (`receive`): nothing moves, B's K/V are already in B's cache. B's first token is observed there.

Nothing is shared between the two streams but the read-only weights: each request has its own cache and
write fences, and B's later decodes on the first stream depend on the second's outputs through the arrays
(MLX orders that across streams) and, before any of them is issued, through the join. Whether the device
runs the two streams concurrently is the backend's business; each run records how many of A's tokens came
out while B's prefill was in flight, which is what was measured rather than assumed.
"""

import os
import threading

import mlx.core as mx

from pdlib.executor import RemoteSteps, now
from pdlib.scheduler import Overlap, Step, interleave, iter_plan

# B's prefill, from t0 to its results on the host: generous, a hang becomes an error rather than a stuck run
PREFILL_TIMEOUT_S = float(os.environ.get("PDLIB_OVERLAP_TIMEOUT_S", 600.0))

_streams: dict[str, mx.Stream] = {}


def second_stream() -> mx.Stream:
    """One extra stream per device for the process (MLX streams live as long as the process)."""
    key = str(mx.default_device())
    if key not in _streams:
        _streams[key] = mx.new_stream(mx.default_device())
    return _streams[key]


class StreamPrefill:
    """One run's prefill of B on the second stream: start (t0), ready (poll), receive (the join)."""

    def __init__(self, req: str, n: int, *, stream: mx.Stream):
        self.req, self.n, self.stream = req, n, stream
        self.t_dispatch = self.t_ready = None
        self.output = self._error = None
        self._done = threading.Event()
        self._waiter: threading.Thread | None = None

    def start(self, engine) -> None:
        if self.t_dispatch is not None:
            raise RuntimeError("a StreamPrefill serves one run")
        self.t_dispatch = now()
        r = engine.requests[self.req]
        if r.length != 0 or r.prompt.size != self.n:
            raise ValueError(f"the second stream prefills {self.req}'s whole {self.n}-token prompt from 0; "
                             f"it holds {r.length} positions of a {r.prompt.size}-token prompt")
        with mx.stream(self.stream):
            self.output = engine.prefill_chunk(self.req, self.n)
        done = [self.output.token, self.output.logits, r.cache.k, r.cache.v, r.cache.written]
        self._waiter = threading.Thread(target=self._wait, args=(done,), name="pdlib-overlap-waiter", daemon=True)
        self._waiter.start()

    def _wait(self, arrays) -> None:
        try:
            mx.eval(arrays)  # scheduled already (the engine's async_eval): this only waits for the device
        except BaseException as e:  # handed to the main thread by receive()
            self._error = e
        self.t_ready = now()
        self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def receive(self, engine, req: str, n: int):
        """Join B's prefill (wait for it if A ran out of work first); B's K/V are in its cache already."""
        if self._waiter is None:
            raise RuntimeError("receive before start: the executor starts the second stream at t0")
        if (req, n) != (self.req, self.n):
            raise ValueError(f"a remote prefill of {n} tokens of {req}; the second stream prefilled {self.n} of {self.req}")
        t_start = now()
        if not self._done.wait(PREFILL_TIMEOUT_S):
            raise RuntimeError(f"B's prefill on the second stream did not finish within {PREFILL_TIMEOUT_S:.0f} s")
        self._waiter.join()
        if self._error is not None:
            raise RuntimeError(f"B's prefill on the second stream failed: {self._error}") from self._error
        return self.output, {"site": "stream", "stream": str(self.stream), "t_dispatch": self.t_dispatch,
                             "t_ready": self.t_ready, "t_start": t_start, "t_end": now()}


class OverlapSession:
    """One experiment's `overlap` runs: the live policy bound to a fresh StreamPrefill per run."""

    def __init__(self, params):
        self.params = params
        self.stream = second_stream()

    def walk(self, validated: list[Step]) -> RemoteSteps:
        p = self.params
        prefill = StreamPrefill("B", p.prompt_tokens, stream=self.stream)
        live = iter_plan("overlap", prompt_tokens=p.prompt_tokens, output_tokens=p.output_tokens,
                         chunk_size=p.chunk_size, policy=Overlap(ready=prefill.ready))
        return RemoteSteps(interleave(live, validated), prefill)


__all__ = ["OverlapSession", "StreamPrefill", "second_stream"]

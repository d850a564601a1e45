"""The prompt lane of a serving policy that prefills elsewhere (pdlib.batching's overlap, partition and disagg):
one prompt at a time, as one whole prefill dispatched a layer at a time, on a second stream of the device
(overlap: pdlib/run/overlap.py's StreamPrefill) or on slice B of the SMs (partition: pdlib/run/partition.py's
SlicePrefill), while the serving loop's decode rounds run on the first stream (partition: on slice A while a
prompt is out); or on the prefill worker, its K/V sent over on join (disagg: the `worker` given, a
pdlib/run/disagg/remote.py ServeSession).

    lane = PromptLane("stream")
    lane.start(engine, "r3", 812)        # r3's first layer goes out now
    with lane.issuing():                 # the loop's step, where the lane says
        outs = engine.batch(parts)
    lane.advance()                       # the prompt's next layer, while that step runs
    if lane.ready(): out, record = lane.join(engine)   # r3's K/V are in its cache; its first output
"""

import contextlib

from pdlib.run.overlap import StreamPrefill, second_stream
from pdlib.run.partition import SlicePrefill, slice_pair

SITES = ("stream", "slice", "worker")


class PromptLane:
    def __init__(self, site: str, *, worker=None):
        if site not in SITES:
            raise ValueError(f"a prompt lane runs on one of {', '.join(SITES)}, not {site!r}")
        if (site == "worker") != (worker is not None):
            raise ValueError("a prompt lane on the prefill worker needs the worker's session, and only it")
        self.site, self.worker = site, worker
        self.pair = slice_pair() if site == "slice" else None
        self.stream = second_stream() if site == "stream" else None
        self.current = None  # the prompt out: a StreamPrefill, a SlicePrefill or a RemotePrefill

    @property
    def busy(self) -> bool:
        return self.current is not None

    def start(self, engine, req: str, n: int) -> None:
        if self.current is not None:
            raise RuntimeError(f"the prompt lane is busy with {self.current.req}'s prompt")
        if self.worker is not None:
            lane = self.worker.prefill(req, n)
        elif self.pair is not None:
            lane = SlicePrefill(req, n, pair=self.pair)
        else:
            lane = StreamPrefill(req, n, stream=self.stream)
        lane.start(engine)
        self.current = lane

    @property
    def on_slice(self) -> bool:
        """A step issued now runs on slice A (a partition's prompt is out)."""
        return isinstance(self.current, SlicePrefill)

    def issuing(self):
        """Where the loop issues a step: slice A while a partition's prompt is out, else as it would."""
        return self.current.issuing() if self.on_slice else contextlib.nullcontext()

    def advance(self) -> None:
        if self.current is not None:
            self.current.advance()

    def ready(self) -> bool:
        return self.current is not None and self.current.ready()

    def join(self, engine):
        """The prompt's first output and its record (waiting for it, and dispatching what is left, if needed)."""
        lane, self.current = self.current, None
        return lane.receive(engine, lane.req, lane.n)


__all__ = ["PromptLane", "SITES"]

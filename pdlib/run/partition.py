"""`partition`: B's whole prompt on one slice of the GPU's SMs while A decodes on the other, so B's prefill
cannot take A's cores (overlap shares them: a 16K layer of B's held the device for ~26 ms).

    session = PartitionSession(params)
    steps = session.walk(validated_plan)        # the live policy + its SlicePrefill, for execute()

The steps are overlap's (scheduler.Partition): B's prompt goes out at t0 as one prefill, a layer at a time, on
slice B's stream; each of A's steps from t0 until B is joined is issued on slice A (`issuing()`, which the
executor enters around every step), where the persistent decode sizes its grid to the slice's SMs, so every
block stays resident. After the join both requests decode on the whole device again. Slice A has
PDLIB_PARTITION_SMS SMs (rounded up to the driver's group of 8), B the rest (kernels/slices.py: CUDA green
contexts). Nothing crosses the slices but arrays, whose order MLX keeps across streams: A's cache is read
and written on A's slice only, B's prefill writes B's cache on its own, and B's first decode, after the join,
depends on the prefill's outputs and fence.

Where there are no green contexts (the CPU, Metal), the policy runs the same steps on two plain streams of
the device with no split: what CI checks there is the policy's steps and streams through the gate, and each
run records which it was (`split`: false).
"""

import contextlib

import mlx.core as mx

from pdlib import settings
from pdlib.engine.kernels import BACKEND, slices
from pdlib.run.executor import RemoteSteps, remote_walk
from pdlib.run.overlap import StreamPrefill
from pdlib.scheduler import Step

SMS_ENV = "PDLIB_PARTITION_SMS"
_twins: dict[str, slices.SlicePair] = {}


def slice_pair() -> slices.SlicePair:
    """Slice A of PDLIB_PARTITION_SMS SMs and B of the rest on CUDA; elsewhere two plain streams, no split."""
    if BACKEND == "cuda":
        return slices.split(settings.get(SMS_ENV))
    key = str(mx.default_device())
    if key not in _twins:
        a, b = (slices.Slice(None, mx.new_stream(mx.default_device())) for _ in "ab")
        _twins[key] = slices.SlicePair(a, b, 0)
    return _twins[key]


class SlicePrefill(StreamPrefill):
    """StreamPrefill on slice B; `issuing()` puts A's steps on slice A until B is joined."""

    def __init__(self, req: str, n: int, *, pair: slices.SlicePair):
        super().__init__(req, n, stream=pair.b.stream)
        self.pair = pair
        self.joined = False

    def place(self):
        return self.pair.b.active()

    def issuing(self):
        """Where the executor issues a step: slice A while B's prefill is out, the whole device otherwise."""
        if self.t_dispatch is None or self.joined:
            return contextlib.nullcontext()
        return self.pair.a.active()

    def receive(self, engine, req: str, n: int):
        out, record = super().receive(engine, req, n)
        self.joined = True
        split = self.pair.a.sms is not None
        return out, {
            **record,
            "site": "slice",
            "split": split,
            "a_sms": self.pair.a.sms,
            "b_sms": self.pair.b.sms,
        }


class PartitionSession:
    """One experiment's `partition` runs: the live policy bound to a fresh SlicePrefill per run."""

    def __init__(self, params):
        self.params = params
        self.pair = slice_pair()

    def walk(self, validated: list[Step]) -> RemoteSteps:
        prefill = SlicePrefill("B", self.params.prompt_tokens, pair=self.pair)
        return remote_walk("partition", self.params, prefill, validated)


__all__ = ["PartitionSession", "SlicePrefill", "slice_pair"]

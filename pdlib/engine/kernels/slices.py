"""SM slices: the device's streaming multiprocessors split in two CUDA green contexts, an MLX stream on each.

    pair = split(48)              # 48 SMs (rounded up to the driver's group of 8) and the rest
    with pair.a.active():         # work issued here runs on A's SMs only; the persistent decode's grid
        engine.decode("A")        # is sized to them (sm_count), so its blocks stay co-resident

A stream created while a green context is current runs only on that context's SMs (seen on an H200 with MLX
0.32.4 for MLX's own elementwise kernels and matmuls, and arrays made on MLX's default stream read correctly
there; pdlib's custom kernels on a slice are what check-kernels' slice rows check). Arrays made on any stream
are read on either: MLX orders the two streams through the arrays' events. The driver is reached through
`cuda.bindings` (imported here only: CUDA machines carry it beside MLX; elsewhere split() says what is missing).
"""

import contextlib
import contextvars
from dataclasses import dataclass

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND
from pdlib.errors import InputError, RunFailure

GROUP = 8  # SMs per green-context group on sm_90 (the driver rounds a request up to it)
_current_sms: contextvars.ContextVar[int | None] = contextvars.ContextVar("pdlib_slice_sms", default=None)


def current_sms() -> int | None:
    """The SM count of the slice whose `active()` block the caller is in, else None (the whole device)."""
    return _current_sms.get()


@dataclass
class Slice:
    sms: int | None  # None: a plain stream of the device, no split (where there are no green contexts)
    stream: mx.Stream

    @contextlib.contextmanager
    def active(self):
        """Issue MLX work on this slice's stream, with kernels' grids sized to its SMs."""
        token = _current_sms.set(self.sms)
        try:
            with mx.stream(self.stream):
                yield self
        finally:
            _current_sms.reset(token)


@dataclass
class SlicePair:
    a: Slice  # the slice asked for
    b: Slice  # the rest of the device
    total: int


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise InputError(f"SM slices need the CUDA driver bindings (`pip install cuda-bindings`): {e}") from None
    return driver


def _ok(driver, result, what: str):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RunFailure(f"SM slices: {what} failed ({err})")
    return rest[0] if len(rest) == 1 else rest


_pairs: dict[int, SlicePair] = {}  # green contexts and MLX streams live as long as the process


def split(sms: int) -> SlicePair:
    """A slice of at least `sms` SMs (a multiple of GROUP) and one of the rest; made once per size."""
    if BACKEND != "cuda":
        raise InputError(f"SM slices need a CUDA GPU (MLX's CUDA backend); here the backend is {BACKEND}")
    if sms in _pairs:
        return _pairs[sms]
    d = _driver()
    mx.eval(mx.zeros(1))  # MLX's context is current on this thread from here
    _ok(d, d.cuInit(0), "cuInit")
    dev = _ok(d, d.cuDeviceGet(0), "cuDeviceGet")
    full = _ok(d, d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    total = full.sm.smCount
    if not GROUP <= sms <= total - GROUP:
        raise InputError(
            f"PDLIB_PARTITION_SMS={sms}: {GROUP} to {total - GROUP} leave both slices SMs on this {total}-SM device"
        )
    groups, _, rest = _ok(d, d.cuDevSmResourceSplitByCount(1, full, 0, sms), "cuDevSmResourceSplitByCount")
    slices = []
    for resource in (groups[0], rest):
        desc = _ok(d, d.cuDevResourceGenerateDesc([resource], 1), "cuDevResourceGenerateDesc")
        green = _ok(
            d, d.cuGreenCtxCreate(desc, dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate"
        )
        ctx = _ok(d, d.cuCtxFromGreenCtx(green), "cuCtxFromGreenCtx")
        old = _ok(d, d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        _ok(d, d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        try:
            stream = mx.new_stream(mx.gpu)  # MLX makes its CUDA stream in the current (green) context
            with mx.stream(stream):
                mx.eval(mx.zeros(1) + 1)  # its first work, so the stream exists before the context changes
        finally:
            _ok(d, d.cuCtxSetCurrent(old), "cuCtxSetCurrent")
        slices.append(Slice(resource.sm.smCount, stream))
    _pairs[sms] = SlicePair(slices[0], slices[1], total)
    return _pairs[sms]


__all__ = ["GROUP", "Slice", "SlicePair", "current_sms", "split"]

"""Where the persistent decode kernel leaves its token for the host to poll (CUDA; PDLIB_TOKEN_READ).

MLX's `.item()` waits on an event made with cudaEventBlockingSync, so the host thread sleeps through the
kernel and wakes on the GPU's completion interrupt (mlx/backend/cuda/event.cu), then a gather copies the token
out. Here the kernel's last block also stores the token with its position + 1, as one 64-bit word (one store:
the host never sees half of it), into pinned, device-mapped host memory; the host spins on that word and has
the token as soon as it lands. A request has an area of SLOTS words, one per position modulo SLOTS, so a
pipelined step can fill the next slot while the host reads this one. The request's barrier sync buffer holds
its area's device address (words SY_BOX, SY_BOX + 1; zero: no mailbox), so the kernel's text, and its compiled
code, are the same with a mailbox or without.

    box = region().take()                       # a request's area (one pinned region per process)
    sync = new_sync(box.address)                # the request's barrier buffer, naming it
    box.clear(pos)                              # before the launch that writes position pos's token
    token = box.wait(pos)                       # None past the timeout

A step that fails before its token (a barrier's timeout, a bad input) writes nothing: the wait times out and
`.item()` returns ERROR_TOKEN (Output.observe).
"""

import ctypes
import functools
import gc
import os
import time

import numpy as np

from pdlib import settings

SLOTS = 16  # positions an area holds (the kernel's pdp::MBOX_SLOTS)
AREAS = 64  # requests one region serves at once (8 KiB pinned)
TIMEOUT_NS = 5_000_000_000  # past the kernel's own ~1 s barrier timeout
SPIN_NS = 20_000  # spin this long holding the GIL, then yield it between reads
ENV = "PDLIB_TOKEN_READ"


def choice() -> str | None:
    """PDLIB_TOKEN_READ: `mailbox` polls the slot the persistent kernel writes (CUDA only; the default where
    that kernel decodes: an observed decode is faster than by `.item()`); `item` reads a decode's token by
    MLX's `.item()` (the default elsewhere). None: unset."""
    return settings.get(ENV)


def _token(words: np.ndarray, pos: int) -> int | None:
    """pos's token if its slot holds pos + 1 in its high half, else None."""
    word = int(words[pos % SLOTS])
    return word & 0xFFFFFFFF if word >> 32 == pos + 1 else None


class TokenMailbox:
    """One request's area: SLOTS words of (position + 1) << 32 | token, as the host sees them, at `address` as
    the device does."""

    def __init__(self, words: np.ndarray, address: int):
        if words.dtype != np.uint64 or words.shape != (SLOTS,):
            raise ValueError(f"a mailbox area is {SLOTS} uint64 words, got {words.dtype} {words.shape}")
        self.words, self.address = words, address

    def clear(self, pos: int) -> None:
        """Empty pos's slot before the launch that fills it. Its last writer (pos - SLOTS, or pos itself before a
        logical reset) was observed before this launch was issued, so it writes nothing after this."""
        self.words[pos % SLOTS] = 0

    def peek(self, pos: int) -> int | None:
        """Position pos's token if its slot holds pos + 1 in its high half now, else None."""
        return _token(self.words, pos)

    def wait(self, pos: int, timeout_ns: int | None = None) -> int | None:
        """Position pos's token once `peek` finds it; None after `timeout_ns` (TIMEOUT_NS). Spins, yielding the
        GIL after SPIN_NS (another thread, overlap's, may need it)."""
        start = time.perf_counter_ns()
        deadline = start + (TIMEOUT_NS if timeout_ns is None else timeout_ns)
        while True:
            if (token := _token(self.words, pos)) is not None:
                return token
            now = time.perf_counter_ns()
            if now > deadline:
                return None
            if now - start > SPIN_NS:
                os.sched_yield()


class MailboxRegion:
    """AREAS areas in one block of memory: `words` as the host sees it, `address` as the device does."""

    def __init__(self, words: np.ndarray, address: int):
        if words.dtype != np.uint64 or words.shape != (AREAS * SLOTS,):
            raise ValueError(f"a mailbox region is {AREAS * SLOTS} uint64 words, got {words.dtype} {words.shape}")
        self.words, self.address, self.free = words, address, list(range(AREAS))

    @classmethod
    def pinned(cls) -> "MailboxRegion":
        """Page-locked host memory the GPU writes directly (cuMemHostAlloc, PORTABLE | DEVICEMAP), kept for the
        process's life, on device 0's primary context (MLX's)."""
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(
                f"PDLIB_TOKEN_READ=mailbox: no CUDA driver to pin its memory ({e}); "
                f"PDLIB_TOKEN_READ=item reads tokens by MLX"
            ) from e
        host, device, ctx, dev = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_int()

        def check(name: str, rc: int) -> None:
            if rc != 0:
                raise RuntimeError(
                    f"PDLIB_TOKEN_READ=mailbox: {name} failed (CUDA error {rc}); "
                    f"PDLIB_TOKEN_READ=item reads tokens by MLX"
                )

        check("cuInit", cuda.cuInit(0))
        check("cuCtxGetCurrent", cuda.cuCtxGetCurrent(ctypes.byref(ctx)))
        if not ctx.value:  # no context on this thread yet: device 0's primary one, which MLX uses
            check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
            check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
            check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
        check(
            "cuMemHostAlloc",
            cuda.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(AREAS * SLOTS * 8), ctypes.c_uint(0x3)),
        )  # PORTABLE | DEVICEMAP
        check(
            "cuMemHostGetDevicePointer", cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(device), host, ctypes.c_uint(0))
        )
        words = np.ctypeslib.as_array(ctypes.cast(host, ctypes.POINTER(ctypes.c_uint64)), (AREAS * SLOTS,))
        words[:] = 0
        return cls(words, device.value)

    def take(self) -> TokenMailbox:
        """A free area, emptied (`give_back` returns it: Qwen3 does when the request's cache goes, so caches
        only a cycle still holds are collected first)."""
        if not self.free:
            gc.collect()
        if not self.free:
            raise RuntimeError(f"PDLIB_TOKEN_READ=mailbox: more than {AREAS} requests decode at once")
        area = self.free.pop(0)
        box = TokenMailbox(self.words[area * SLOTS : (area + 1) * SLOTS], self.address + 8 * SLOTS * area)
        box.words[:] = 0
        return box

    def give_back(self, box: TokenMailbox) -> None:
        self.free.append((box.address - self.address) // (8 * SLOTS))


@functools.cache
def region() -> MailboxRegion:
    """The process's region (pinned on first use: call after MLX has used the GPU)."""
    return MailboxRegion.pinned()

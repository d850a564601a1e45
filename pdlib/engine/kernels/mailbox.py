"""Where the persistent decode kernel leaves its token for the host to poll (CUDA, opt-in: PDLIB_TOKEN_READ).

MLX's `.item()` waits on an event made with cudaEventBlockingSync, so the host thread sleeps through the
kernel and wakes on the GPU's completion interrupt (mlx/backend/cuda/event.cu), then a gather copies the token
out. Here the kernel's last block also writes the token into pinned, device-mapped host memory, then, after a
system-wide fence, its sequence word (the position + 1); the host spins on that word and reads the token as
soon as it lands. A request has an area of SLOTS slots, one per position modulo SLOTS, so a pipelined step
can fill the next slot while the host reads this one; its barrier sync buffer names the area (SY_BOX), so one
region, one address and one compiled kernel serve every request of a process.

    region = MailboxRegion.pinned()             # once per process, after MLX has used the GPU
    box = region.take()                         # a request's area; sync = new_sync(box.area)
    box.clear(pos)                              # before the launch that writes position pos's token
    launch(..., sync, mailbox=region)           # the kernel writes (pos + 1, token) into slot pos % SLOTS
    token = box.wait(pos)                       # None past the timeout: then `.item()` says what happened

A step that fails before its token (a barrier's timeout, a bad input) writes nothing: the wait times out and
the caller falls back to `.item()`, which returns ERROR_TOKEN.
"""

import ctypes
import time

import numpy as np

from pdlib.engine.kernels.backend import env_choice

SLOTS = 16                   # positions a request's area holds (MBOX_SLOTS in the kernel)
AREAS = 8                    # requests a region serves at once (MBOX_AREAS); area 0 is never handed out: a
                             # sync buffer made without a mailbox names it, and no kernel writes it then
TIMEOUT_NS = 5_000_000_000   # past the kernel's own ~1 s barrier timeout
ENV, CHOICES = "PDLIB_TOKEN_READ", ("item", "mailbox")


def choice() -> str:
    """PDLIB_TOKEN_READ: `item` (the default) reads a decode's token by MLX's `.item()`; `mailbox` polls the
    slot the persistent kernel writes (notes/gpu.md, v30; CUDA only)."""
    return env_choice(ENV, CHOICES)


class TokenMailbox:
    """One request's area: SLOTS (sequence, token) pairs of uint32, as the host sees them."""

    def __init__(self, words: np.ndarray, area: int):
        if words.dtype != np.uint32 or words.shape != (2 * SLOTS,):
            raise ValueError(f"a mailbox area is {2 * SLOTS} uint32 words, got {words.dtype} {words.shape}")
        self.words, self.area = words, area

    def clear(self, pos: int) -> None:
        """Empty pos's slot before the launch that fills it (its last writer, pos - SLOTS, was read long ago)."""
        self.words[2 * (pos % SLOTS)] = 0

    def wait(self, pos: int, timeout_ns: int | None = None) -> int | None:
        """Position pos's token once its slot holds sequence pos + 1, spinning; None after `timeout_ns`
        (TIMEOUT_NS)."""
        seq, slot = np.uint32(pos + 1), 2 * (pos % SLOTS)
        words, deadline = self.words, time.perf_counter_ns() + (TIMEOUT_NS if timeout_ns is None else timeout_ns)
        while words[slot] != seq:
            if time.perf_counter_ns() > deadline:
                return None
        return int(words[slot + 1])


class MailboxRegion:
    """AREAS areas in one block of memory: `words` as the host sees it, `address` as the device does."""

    def __init__(self, words: np.ndarray, address: int):
        if words.dtype != np.uint32 or words.shape != (AREAS * 2 * SLOTS,):
            raise ValueError(f"a mailbox region is {AREAS * 2 * SLOTS} uint32 words, got {words.dtype} {words.shape}")
        self.words, self.address, self.free = words, address, list(range(1, AREAS))

    @classmethod
    def pinned(cls) -> "MailboxRegion":
        """Page-locked host memory the GPU writes directly (cuMemHostAlloc, PORTABLE | DEVICEMAP), kept for the
        process's life. Call after MLX has used the GPU (its context is then current on this thread)."""
        cuda = ctypes.CDLL("libcuda.so.1")
        host, device, size = ctypes.c_void_p(), ctypes.c_uint64(), AREAS * 8 * SLOTS
        rc = cuda.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(size), ctypes.c_uint(0x3))
        if rc == 0:
            rc = cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(device), host, ctypes.c_uint(0))
        if rc != 0:
            raise RuntimeError(f"PDLIB_TOKEN_READ=mailbox: the CUDA driver refused pinned mapped memory (error "
                               f"{rc}); PDLIB_TOKEN_READ=item reads tokens by MLX")
        words = np.ctypeslib.as_array(ctypes.cast(host, ctypes.POINTER(ctypes.c_uint32)), (AREAS * 2 * SLOTS,))
        words[:] = 0
        return cls(words, device.value)

    def template(self) -> list[tuple[str, int]]:
        """The kernel's compile-time values: the device address in two 31-bit halves (MLX's template values are
        ints and go into the kernel's name, so no sign), the areas and their slots."""
        return [("MBOX_HI", self.address >> 31), ("MBOX_LO", self.address & 0x7FFFFFFF), ("MBOX_AREAS", AREAS),
                ("MBOX_SLOTS", SLOTS)]

    def take(self) -> TokenMailbox:
        """A free area (`give_back` returns it: Qwen3 does when the request's cache goes)."""
        if not self.free:
            raise RuntimeError(f"PDLIB_TOKEN_READ=mailbox: more than {AREAS - 1} requests decode at once")
        area = self.free.pop(0)
        box = TokenMailbox(self.words[area * 2 * SLOTS: (area + 1) * 2 * SLOTS], area)
        box.words[:] = 0
        return box

    def give_back(self, area: int) -> None:
        self.free.append(area)

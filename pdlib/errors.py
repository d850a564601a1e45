"""The two error types the CLI reports as one line: bad input (exit 2) and a run that failed (exit 1); and how a
device that ran out of memory is told apart (MLX raises a plain RuntimeError for it)."""

import contextlib
import math


class InputError(ValueError):
    """Bad user input (a flag, a params file, a model spec, a path). The message names the bad value and
    what would be accepted."""


class RunFailure(RuntimeError):
    """A run that could not go on: a failed check (the gate, a replay, a token that differs), a device or
    worker that failed. The CLI prints its message as one line and exits with code 1; nothing is written."""


def is_number(x) -> bool:
    """An int or float read from input (JSON, YAML), not a bool."""
    return isinstance(x, int | float) and not isinstance(x, bool)


def is_finite(x) -> bool:
    """is_number and finite as a float: a 400-digit integer compares below inf, then overflows float()."""
    try:
        return is_number(x) and math.isfinite(x)
    except OverflowError:
        return False


INT_MAX = 2**31 - 1  # the largest integer input by default: counts and lengths, far past any a run can use
INT64_MAX = 2**63 - 1  # the largest a seed or a report's integer may be: numpy's int64, the charts' JSON reader


def check_int(name: str, value, lo: int, hi: int = INT_MAX) -> None:
    """An integer input in [lo, hi] (a bool is not one), or an InputError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InputError(f"{name} must be an integer >= {lo}, got {value!r}")
    if value > hi:
        raise InputError(f"{name} must be an integer <= {hi}, got {value!r}")


# what MLX's allocators say when the device has no memory left (CUDA's cudaMalloc*, Metal's malloc)
OUT_OF_MEMORY = ("out of memory", "[metal::malloc]", "maximum allowed buffer size")


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is MLX's failure to allocate device memory (a search records such a point as failed for
    memory; any other command stops with one line)."""
    return (
        isinstance(e, RuntimeError) and not isinstance(e, ChecksOutOfMemory) and any(s in str(e) for s in OUT_OF_MEMORY)
    )


class ChecksOutOfMemory(RunFailure):
    """The checks ran out of device memory (a replay, the FP32 references beside the engine's caches), not the run:
    a search stops rather than record the policy's point as failing for memory."""


@contextlib.contextmanager
def checks_memory(what: str):
    """Within it, MLX running out of device memory is `what`'s (the checks'), told so as a ChecksOutOfMemory."""
    try:
        yield
    except RuntimeError as e:
        if not out_of_memory(e):
            raise
        raise ChecksOutOfMemory(
            f"{what} ran out of device memory ({' '.join(str(e).split())}): the checks', not the run's; a smaller "
            f"PDLIB_KV_CACHE_GIB leaves them room beside the caches"
        ) from e

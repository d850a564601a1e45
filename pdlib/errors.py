"""The two error types the CLI reports as one line: bad input (exit 2) and a run that failed (exit 1)."""


class InputError(ValueError):
    """Bad user input (a flag, a params file, a model spec, a path). The message names the bad value and
    what would be accepted."""


class RunFailure(RuntimeError):
    """A run that could not go on: a failed check (the gate, a replay, a token that differs), a device or
    worker that failed. The CLI prints its message as one line and exits with code 1; nothing is written."""


def check_int(name: str, value, lo: int) -> None:
    """An integer input at least `lo` (a bool is not one), or an InputError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InputError(f"{name} must be an integer >= {lo}, got {value!r}")

"""The one error type for bad input: the CLI prints its message as one line and exits with code 2."""


class InputError(ValueError):
    """Bad user input (a flag, a params file, a model spec, a path). The message names the bad value and
    what would be accepted."""


def check_int(name: str, value, lo: int) -> None:
    """An integer input at least `lo` (a bool is not one), or an InputError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InputError(f"{name} must be an integer >= {lo}, got {value!r}")

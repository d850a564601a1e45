"""The one error type for bad input: the CLI prints its message as one line and exits with code 2."""


class InputError(ValueError):
    """Bad user input (a flag, a params file, a model spec, a path). The message names the bad value and
    what would be accepted."""

"""The first line of every notebook's cell after its parameters cell, run inside the kernel:

    from pdlib.publish import parameters
    parameters.check(In)   # a papermill parameter this notebook does not have is refused; InputError: one line

`papermill -p NAME VALUE` injects `NAME = VALUE` for any NAME, and only warns when the notebook has no such
parameter, so a typo would run with the default. Papermill runs the cells in order in a fresh kernel, so the
cell it injected (tagged injected-parameters, first line "# Parameters") is the one executed just before this
one, and the parameters cell the one before that: a name the first assigns and the second does not is
refused. Run by hand (JupyterLab, no injected cell) nothing is checked. From here on an InputError (a bad
value, a missing report) shows in the notebook as one line `error: ...`, not as a traceback.
"""

import ast
import difflib

from pdlib.errors import InputError

INJECTED = "# Parameters"  # papermill's first line of the cell it injects (translators.codify)
PAPERMILL = "PAPERMILL_"  # papermill's own parameters (--inject-paths): always accepted


def names(source: str) -> list[str]:
    """The names a cell of `NAME = literal` lines assigns, in order ([] if it is not Python)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return []
    return [t.id for s in body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)]


def unknown(history: list[str]) -> tuple[list[str], list[str]]:
    """(injected names the parameters cell lacks, the parameters cell's names) from IPython's input history
    `In` as seen by the cell after the injected one; ([], []) when the cell before is not papermill's."""
    if len(history) < 3 or history[-2].lstrip().split("\n", 1)[0].strip() != INJECTED:
        return [], []
    declared = names(history[-3])
    return [n for n in names(history[-2]) if n not in declared and not n.startswith(PAPERMILL)], declared


def check(history: list[str]) -> None:
    """Make an InputError one line in this kernel, then refuse a papermill parameter the notebook lacks."""
    one_line_errors()
    bad, declared = unknown(history)
    if bad:
        hints = [f"{n} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(n, declared, 1)) else n for n in bad]
        raise InputError(
            f"unknown parameter{'s' if len(bad) > 1 else ''} {', '.join(hints)}; "
            f"this notebook's parameters are {', '.join(declared)}"
        )


def _show_one_line(shell, etype, value, tb, tb_offset=None):
    value._render_traceback_ = lambda: [f"error: {value}"]  # IPython shows these lines instead of a traceback
    shell.showtraceback((etype, value, tb))


def one_line_errors() -> None:
    """In an IPython kernel, show an InputError raised by a cell as the line `error: MESSAGE` (name InputError
    kept, so papermill and `python -m pdlib notebooks` still see which error it was). Elsewhere a no-op."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.set_custom_exc((InputError,), _show_one_line)

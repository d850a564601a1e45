"""Ctrl-C that works while MLX computes: the CLI stops within about a second and leaves nothing half-written.

    with interruptible():          # in the CLI's main(); a no-op outside the main thread
        run_experiment(...)        # Ctrl-C: KeyboardInterrupt at the next Python line, or exit 130 anyway
    with patient(15, note="interrupted: ..."):  # the main thread only waits on other processes: 15 s to stop them
    with shielded():                            # cleanup that must not stop half-way: Ctrl-C is ignored

Python runs a SIGINT handler only between bytecodes of the main thread, and one `mx.eval` (a CPU reference
pass over a long prompt, say) can hold the main thread in C++ for minutes. The C-level handler still writes
the signal to a wakeup pipe at once, and MLX releases the GIL while it computes, so a watchdog thread sees
the signal immediately: it sets `stop_requested`, gives the main thread GRACE_S to raise KeyboardInterrupt
and clean up, and otherwise removes the temp files being written (report.PENDING) and exits with code 130.
Every output is written as a temp file linked into place, so an exit at any moment leaves no partial file.
"""

import contextlib
import os
import signal
import sys
import threading

from pdlib.report import io as report

GRACE_S = 1.0
EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a process killed by Ctrl-C
MESSAGE = "interrupted: nothing half-written is left"
stop_requested = threading.Event()
# The watchdog's wait and its last words; patient() changes them for its body.
_grace = {"seconds": GRACE_S, "note": f"{MESSAGE} (stopped during a computation)"}


def _hard_exit():
    for tmp in list(report.PENDING):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"\n{_grace['note']}\n")
        sys.stderr.flush()
    os._exit(EXIT_CODE)


def _watch(read_fd: int, done: threading.Event):
    while not done.is_set():
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data or done.is_set():
            return
        if signal.SIGINT in data:
            stop_requested.set()
            if not done.wait(_grace["seconds"]):  # the main thread did not unwind in time: it is stuck in C++
                _hard_exit()
            return


@contextlib.contextmanager
def interruptible():
    """Install the watchdog for the body (main thread only; elsewhere, e.g. under pytest-xdist, a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(read_fd, done), name="pdlib-interrupt", daemon=True)
    stop_requested.clear()
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous_handler)
        os.close(write_fd)  # wakes the watcher: read returns b""
        watcher.join(timeout=1)
        os.close(read_fd)


@contextlib.contextmanager
def patient(seconds: float, *, note: str):
    """For a body whose main thread only waits (on threads, child processes) and needs time to stop them on
    Ctrl-C: the watchdog waits `seconds` instead of GRACE_S, and if it exits anyway it prints `note`."""
    previous = dict(_grace)
    _grace.update(seconds=seconds, note=note)
    try:
        yield
    finally:
        _grace.update(previous)


@contextlib.contextmanager
def shielded():
    """Ctrl-C is ignored in the body (main thread only; elsewhere a no-op): cleanup that must not stop half-way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

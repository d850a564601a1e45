"""`python -m pdlib ...` with the main thread alone on one core (issue 12, after v36: a chunk step's build, all of it
the host thread's CPU time, took 7.8 ms in some trials and 14.9 ms in others for the same work; an untested guess is
that the thread sometimes shares a physical core with MLX's or the driver's busy threads). The main thread (the one
that builds and issues every step) runs on CORE; every other thread of the process, now and as they appear (MLX
makes its own as streams are first used), is kept off CORE and its hyperthread siblings; a watcher re-applies that
every 0.2 s. At the end it prints, on stderr, one line per thread: its id, name and the cores it may run on.

    python3 notes/gpu-session/pinned_run.py CORE run --params params/qwen3-0.6b-4096x1024.yaml --policies chunked ...
"""

import os
import sys
import threading
from pathlib import Path


def siblings(core: int) -> set[int]:
    """CORE and its hyperthread siblings (itself alone where the kernel does not say)."""
    path = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list")
    if not path.exists():
        return {core}
    out = set()
    for part in path.read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin(core: int, stop: threading.Event) -> None:
    main, rest = os.getpid(), set(os.sched_getaffinity(0)) - siblings(core)
    if not rest:
        raise SystemExit(f"pinned_run: no core is left for the other threads once {sorted(siblings(core))} are "
                         f"taken; allowed: {sorted(os.sched_getaffinity(0))}")
    while True:
        for tid in map(int, os.listdir("/proc/self/task")):
            want = {core} if tid == main else rest
            try:
                if set(os.sched_getaffinity(tid)) != want:
                    os.sched_setaffinity(tid, want)
            except (ProcessLookupError, PermissionError):   # a thread that ended meanwhile
                pass
        if stop.wait(0.2):
            return


def report() -> None:
    for tid in sorted(map(int, os.listdir("/proc/self/task"))):
        try:
            status = Path(f"/proc/self/task/{tid}/status").read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
        print(f"pinned_run: thread {tid} {fields.get('Name', '?').strip()}: cores "
              f"{fields.get('Cpus_allowed_list', '?').strip()}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 3 or not sys.argv[1].isdigit() or int(sys.argv[1]) not in os.sched_getaffinity(0):
        print(f"usage: pinned_run.py CORE PDLIB-ARGS... (CORE one of {sorted(os.sched_getaffinity(0))})",
              file=sys.stderr)
        raise SystemExit(2)
    core = int(sys.argv[1])
    stop = threading.Event()
    watcher = threading.Thread(target=pin, args=(core, stop), daemon=True, name="pinned_run")
    watcher.start()
    from pdlib.__main__ import main
    try:
        code = main(sys.argv[2:])
    finally:
        report()
        stop.set()
    raise SystemExit(code)

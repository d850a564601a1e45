"""Start the prefill worker (rank 1) and join the distributed group with it as rank 0; the side channel.

    worker = PrefillWorker.get()            # spawned once per process: MLX caches its group for good
    worker.send({"cmd": "setup", ...}); worker.wait_message("setup", timeout_s=120)
    worker.poll()                           # a message if one is waiting, else None: never blocks

The tensors travel only through MLX's collectives (transfer.py); the side channel is a pair of pipes carrying
one JSON object per line (commands down, "ready" and "setup" replies up). On the CPU the group is MLX's ring
backend over two localhost ports (MLX_RANK, MLX_HOSTFILE); on CUDA it is NCCL (MLX_WORLD_SIZE, MLX_RANK,
NCCL_HOST_IP, NCCL_PORT; the worker sees GPU 1 as its only device), which is written but not yet run.

MLX keeps the first group a process initialises (mlx/distributed/distributed.cpp: `init` returns the cached
one), so one worker serves every disagg run of this process, reconfigured by "setup"; if it dies, the group
is gone for good and later disagg runs in this process fail at once, saying so. Every wait has a timeout;
a failure kills the worker and raises `WorkerError` with one line.
"""

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import mlx.core as mx

from pdlib import settings
from pdlib.errors import RunFailure

SPAWN_TIMEOUT_S = 120.0  # the worker's imports and its "hello"
JOIN_TIMEOUT_S = 60.0  # mx.distributed.init on rank 0 (the ring's accept blocks while holding the GIL)


DIR_PREFIX, OWNER = "pdlib-disagg-", "owner.pid"


def _sweep_orphans() -> None:
    """Remove the folders of earlier parents killed between spawning their worker and joining the group (the
    only window in which one exists): those whose owner process is gone."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not name.startswith(DIR_PREFIX):
            continue
        try:
            with open(os.path.join(path, OWNER)) as f:
                os.kill(int(f.read()), 0)  # raises if no such process
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError):
            pass  # not ours to judge: no owner file, another user's, or being written


class WorkerError(RunFailure):
    """The prefill worker died, hung or broke the protocol; the message is one line for the CLI."""


def backend() -> str:
    return "nccl" if mx.cuda.is_available() else "ring"


def _second_gpu() -> str:
    """The GPU after ours: the second entry of our CUDA_VISIBLE_DEVICES, or 1 (rank 0 runs on the first)."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[1].strip() if len(visible) > 1 else "1"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def _alarm(seconds: float, what: str):
    """SIGALRM interrupts a blocking accept()/connect() in C++ (the ring's init holds the GIL, so no thread
    could); main thread only, elsewhere no guard."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def handler(signum, frame):
        fired.append(True)
        raise WorkerError(f"{what} took more than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except RuntimeError as e:
        if fired and not isinstance(e, WorkerError):
            raise WorkerError(f"{what} took more than {seconds:.0f} s ({e})") from e
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _hard_deadline(seconds: float | None):
    """NCCL's communicator set-up holds the GIL in C++ and ignores signals: if the worker dies after the id
    exchange, nothing in Python can run again. faulthandler's watchdog is a C thread: past the deadline it
    prints where the process is stuck and exits with code 1, so the run ends instead of hanging."""
    if seconds is None:
        yield
        return
    import faulthandler

    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class PrefillWorker:
    """The prefill worker process and the side channel to it, as seen from rank 0."""

    _instance: "PrefillWorker | None" = None

    @classmethod
    def get(cls) -> "PrefillWorker":
        if cls._instance is None:
            cls._instance = cls()
        elif cls._instance.broken:
            raise WorkerError(
                f"this process's prefill worker failed earlier ({cls._instance.broken}); MLX keeps "
                f"one distributed group per process, so start a new process for disagg"
            )
        return cls._instance

    def __init__(self):
        self.broken: str | None = None
        self.backend = backend()
        _sweep_orphans()
        # the hostfile and the worker's stderr live here only until the group is joined (_forget_files)
        self._dir = tempfile.TemporaryDirectory(prefix=DIR_PREFIX)
        with open(os.path.join(self._dir.name, OWNER), "w") as f:
            f.write(str(os.getpid()))
        # the worker's stderr; PDLIB_DISAGG_WORKER_LOG keeps it past the run (a GPU box's only trace of it)
        self._stderr = open(
            settings.get("PDLIB_DISAGG_WORKER_LOG") or os.path.join(self._dir.name, "worker.stderr"), "w+b"
        )
        down_r, self._down = os.pipe()  # commands, rank 0 -> worker
        self._up, up_w = os.pipe()  # replies, worker -> rank 0
        env = dict(os.environ, MLX_RANK="1", PYTHONUNBUFFERED="1")
        mine: dict[str, str] = {"MLX_RANK": "0"}
        if self.backend == "ring":
            hostfile = os.path.join(self._dir.name, "hosts.json")
            with open(hostfile, "w") as f:
                json.dump([[f"127.0.0.1:{p}"] for p in _free_ports(2)], f)
            env["MLX_HOSTFILE"] = mine["MLX_HOSTFILE"] = hostfile
        else:
            port = str(_free_ports(1)[0])
            for k, v in {"MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "127.0.0.1", "NCCL_PORT": port}.items():
                env[k] = mine[k] = v
            env["CUDA_VISIBLE_DEVICES"] = settings.get("PDLIB_PREFILL_GPU") or _second_gpu()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pdlib.run.disagg.worker",
                "--commands",
                str(down_r),
                "--replies",
                str(up_w),
                "--backend",
                self.backend,
            ],
            pass_fds=(down_r, up_w),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
        )
        os.close(down_r)
        os.close(up_w)
        self._buf = b""
        atexit.register(self.close)
        try:
            self.wait_message("hello", timeout_s=SPAWN_TIMEOUT_S)
            saved = {k: os.environ.get(k) for k in mine}
            os.environ.update(mine)
            try:
                with (
                    _alarm(JOIN_TIMEOUT_S, "joining the distributed group with the prefill worker"),
                    _hard_deadline(JOIN_TIMEOUT_S + 30 if self.backend == "nccl" else None),
                ):
                    self.group = mx.distributed.init(strict=True, backend=self.backend)
            finally:
                for k, v in saved.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            if self.group.size() != 2 or self.group.rank() != 0:
                self.fail(
                    f"the distributed group has rank {self.group.rank()} of {self.group.size()}, "
                    f"expected rank 0 of 2 (is MLX_RANK/MLX_HOSTFILE set by a launcher?)"
                )
        except BaseException as e:
            if not isinstance(e, WorkerError):
                self.kill()
            else:
                self.kill(str(e))
            raise
        finally:
            self._forget_files()

    def _forget_files(self) -> None:
        """Both ranks have read the hostfile, and the stderr file stays readable through its open handle: the
        folder goes now, so a parent killed later (SIGKILL included, which no handler sees) leaves nothing."""
        self._dir.cleanup()

    # -- side channel ------------------------------------------------------------------------------------
    def send(self, msg: dict) -> None:
        try:
            os.write(self._down, (json.dumps(msg) + "\n").encode())
        except OSError:
            self.fail(self._died("when sent a command"))

    def poll(self, when: str = "before replying") -> dict | None:
        """The next message if one is complete now, else None; raises WorkerError if the worker is gone."""
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self._up], [], [], 0)
            if not ready:
                return None
            data = os.read(self._up, 1 << 16)
            if not data:
                self.fail(self._died(when))
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        msg = json.loads(line)
        if "error" in msg:
            self.fail(f"prefill worker failed: {msg['error']}")
        return msg

    def wait_message(self, kind: str, *, timeout_s: float, what: str | None = None) -> dict:
        """Block (up to timeout_s) for the next message, which must be of `kind`."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self.poll(f"before its {kind!r} reply" + (f" ({what})" if what else ""))
            if msg is not None:
                if msg.get("kind") != kind:
                    self.fail(f"prefill worker sent {msg.get('kind')!r}, expected {kind!r}")
                return msg
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail(f"prefill worker sent no {kind!r} within {timeout_s:.0f} s" + (f" ({what})" if what else ""))
            select.select([self._up], [], [], min(left, 0.5))

    # -- failure -----------------------------------------------------------------------------------------
    def _died(self, when: str) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return f"the side channel to the prefill worker closed {when}"
        return f"prefill worker exited with code {code} {when}{self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            lines = [l for l in self._stderr.read().decode(errors="replace").splitlines() if l.strip()]
        except (OSError, ValueError):
            return ""
        return f" (its last words: {lines[-1].strip()[:300]})" if lines else ""

    def fail(self, message: str):
        self.kill(message)
        raise WorkerError(message)

    def kill(self, reason: str = "killed") -> None:
        """Kill the worker now (the group is unusable afterwards)."""
        self.broken = self.broken or reason
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def close(self) -> None:
        """At exit: ask the worker to quit, then make sure it is gone."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.write(self._down, b'{"cmd": "quit"}\n')
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.kill("closed")
        for fd in (self._down, self._up):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stderr.close()
        self._dir.cleanup()

"""The decode worker's view of disaggregation: what the one executor calls for a `disagg` run.

    session = DisaggSession(params, prompt_ids=..., config=model.config)    # the worker builds B's engine
    steps = session.walk(validated_plan)       # the live policy + its RemotePrefill, for execute()
    execute(engine, steps, logical_reset=True, hooks=[gate or recorder])

At t0 the executor calls `remote.start(engine)` (the prefill worker starts on that signal). Between A's steps the
`disagg` policy polls `remote.ready()`, which never blocks. When the worker has said "ready", the policy's
`Prefill(remote=True)` step makes the executor call `remote.receive()`: join the collective (A's only pause),
install B's K/V into its cache here, and return B's first output (logits and token from the worker's last
chunk) with the transfer's bytes and times on this clock. If A has nothing left first, `receive` waits.

How a timing-dependent interleaving is validated: the gate runs this same live mechanism (not a fixed plan)
and checks every output's logits and token, every K/V slot and B's received prefix; those checks are per
request, and neither request's numbers depend on the other's, so the order cannot change them. A timed run
is then held, through `scheduler.interleave`, to the validated plan *per request*: every part exactly once
and in order, any interleaving across requests; its tokens are checked against the gate's as for every
policy.
"""

import os
import sys
import threading
import time

import mlx.core as mx

from pdlib import settings
from pdlib.engine import Output
from pdlib.run.disagg import transfer
from pdlib.run.disagg.launch import PrefillWorker, WorkerError
from pdlib.run.executor import RemoteSteps, now, remote_walk
from pdlib.scheduler import Step

SETUP_TIMEOUT_S = 900.0  # the worker loads the weights and prefills B once (synthetic Qwen3-0.6B: ~11 s, CPU)
# From the signal to "ready" (B's whole prompt on the worker): READY_FACTOR times the worker's own untimed
# prefill of the same prompt at setup (which also compiled, so it is the slow one), at least READY_MIN_S.
# The collective itself: TRANSFER_TIMEOUT_S (then the worker is killed, which fails the collective).
# PDLIB_DISAGG_TIMEOUT_S overrides both.
READY_FACTOR, READY_MIN_S, TRANSFER_TIMEOUT_S = 20.0, 30.0, 120.0


def _timeout_s(default: float) -> float:
    return settings.get("PDLIB_DISAGG_TIMEOUT_S") or default


def ready_timeout_s(setup_prefill_s: float) -> float:
    """How long a silent worker may take to say "ready": scaled from its own prefill of B's prompt."""
    return _timeout_s(max(READY_MIN_S, READY_FACTOR * setup_prefill_s))


def transfer_mode() -> str:
    """PDLIB_DISAGG_TRANSFER picks the collective's shape (transfer.MODES; default the first, the faster on
    the CPU); every transfer event records the one used."""
    return settings.get("PDLIB_DISAGG_TRANSFER")


def prefill_chunk(params) -> int:
    """PDLIB_DISAGG_PREFILL_CHUNK: the prefill worker's chunk in tokens, or "whole" (the default): B's prompt
    in one step. The worker runs nothing else, so chunks would only bound its memory and cost B time (on the
    H200 a 4,096-token prompt took 0.20 s whole and 0.54 s in 128-token chunks back to back)."""
    n = settings.get("PDLIB_DISAGG_PREFILL_CHUNK")
    return params.prompt_tokens if n == "whole" else min(n, params.prompt_tokens)


class _TransferMonitor:
    """Watches the worker while this process sits in the collective: if it dies or the transfer outlasts
    TRANSFER_TIMEOUT_S, the worker is killed. On the ring that fails the collective here (a RuntimeError);
    NCCL never abandons a collective whose peer is gone, so there this process says why and exits (code 1,
    no report written), rather than hang."""

    def __init__(self, worker: PrefillWorker):
        self.worker, self.reason = worker, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pdlib-transfer-monitor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        limit_s = _timeout_s(TRANSFER_TIMEOUT_S)
        deadline = time.monotonic() + limit_s
        while not self._done.wait(0.5):
            if self.worker.proc.poll() is not None:
                self.reason = f"the prefill worker died mid-transfer{self.worker._stderr_tail()}"
            elif time.monotonic() > deadline:
                self.reason = f"timed out after {limit_s:.0f} s"
            else:
                continue
            self.worker.kill(self.reason)
            if self.worker.backend == "nccl":
                sys.stderr.write(
                    f"error: the K/V transfer from the prefill worker failed ({self.reason}); NCCL "
                    f"cannot abandon a collective, so this process exits\n"
                )
                sys.stderr.flush()
                os._exit(1)
            return

    def stop(self) -> None:
        self._done.set()


WAITING_FOR = "B's prefill on the worker"


class RemotePrefill:
    """One run's remote prefill of B: start (t0), ready (poll), receive (the transfer and install). `req`: a
    serving request's prompt instead (ServeSession), named in the command."""

    def __init__(
        self, worker: PrefillWorker, *, shape: tuple, vocab: int, mode: str, timeout_s: float, req: str | None = None
    ):
        self.worker, self.shape, self.vocab, self.mode, self.timeout_s = worker, shape, vocab, mode, timeout_s
        self.req, self.n = req, shape[3]
        self.t_dispatch = self.t_ready = self.token = None

    def start(self, engine=None) -> None:
        if self.t_dispatch is not None:
            raise RuntimeError("a RemotePrefill serves one run")
        self.worker.send({"cmd": "prefill"} if self.req is None else {"cmd": "prefill", "req": self.req})
        self.t_dispatch = now()

    def advance(self) -> None:
        """Nothing to dispatch here: the worker runs B's prompt on its own."""

    def ready(self) -> bool:
        if self.token is None and self.t_dispatch is not None:
            # worded as wait_message words it (receive), so a worker's death reads the same whichever notices it
            msg = self.worker.poll(when=f"before its 'ready' reply ({WAITING_FOR})")
            if msg is not None:
                self._got(msg)
        return self.token is not None

    def _got(self, msg: dict) -> None:
        if msg.get("kind") != "ready":
            self.worker.fail(f"prefill worker sent {msg.get('kind')!r}, expected 'ready'")
        self.token, self.t_ready = int(msg["token"]), now()

    def receive(self, engine, req: str, n: int) -> tuple[Output, dict]:
        if self.t_dispatch is None:
            raise RuntimeError("receive before start: the executor signals the prefill worker at t0")
        if n != self.shape[3] or self.req is not None and req != self.req:
            raise ValueError(
                f"a remote prefill of {req}'s {n} tokens; the worker prefills {self.req or 'B'}'s {self.shape[3]}"
            )
        if not self.ready():
            self._got(self.worker.wait_message("ready", timeout_s=self.timeout_s, what=WAITING_FOR))
        t_start = now()
        monitor = _TransferMonitor(self.worker)
        try:
            kv, logits = transfer.receive(self.shape, self.vocab, mode=self.mode, group=self.worker.group)
        except RuntimeError as e:  # the ring's "connection to a peer was lost"
            self.worker.fail(
                f"the K/V transfer from the prefill worker failed"
                f"{f' ({monitor.reason})' if monitor.reason else ''}: {str(e).splitlines()[0]}"
            )
        finally:
            monitor.stop()
        t_end = now()
        out = engine.install(req, kv, logits, mx.array(self.token, dtype=mx.uint32))
        return out, {
            "site": "worker",
            "bytes": transfer.payload_bytes(self.shape, self.vocab),
            "mode": self.mode,
            "t_dispatch": self.t_dispatch,
            "t_ready": self.t_ready,
            "t_start": t_start,
            "t_end": t_end,
        }


def workers_record(worker: PrefillWorker, mode: str, chunk, ready_timeout_s: float, prefill: dict) -> dict:
    """What a report records of the two workers: this process (rank 0, decode) and the prefill worker as its
    setup reply described itself."""
    return {
        "backend": worker.backend,
        "transfer": mode,
        "prefill_chunk": chunk,
        "ready_timeout_s": ready_timeout_s,
        "decode": {
            "rank": 0,
            "device": str(mx.default_device()),
            "pid": os.getpid(),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        },
        "prefill": {"rank": 1, **{k: v for k, v in prefill.items() if k != "kind"}},
    }


class DisaggSession:
    """One experiment's use of the (process-wide) prefill worker: B's prompt and shapes, set up once."""

    def __init__(self, params, *, prompt_ids, config):
        self.params, self.mode, self.prefill_chunk = params, transfer_mode(), prefill_chunk(params)
        self.worker = PrefillWorker.get()
        self.worker.send(
            {
                "cmd": "setup",
                "model": params.model,
                "prompt": [int(t) for t in prompt_ids],
                "capacity": params.prompt_tokens + params.output_tokens,
                "chunk_size": self.prefill_chunk,
                "lossless_decode_weights": params.lossless_decode_weights,
                "logical_reset": params.logical_cache_reset,
                "mode": self.mode,
            }
        )
        prefill = self.worker.wait_message(
            "setup", timeout_s=SETUP_TIMEOUT_S, what="loading the weights and prefilling B once"
        )
        self.ready_timeout_s = ready_timeout_s(prefill["prefill_s"])
        self.shape = (config.num_hidden_layers, 2, config.num_key_value_heads, params.prompt_tokens, config.head_dim)
        self.vocab = config.vocab_size
        self.workers = workers_record(self.worker, self.mode, self.prefill_chunk, self.ready_timeout_s, prefill)

    def walk(self, validated: list[Step]) -> RemoteSteps:
        """The live `disagg` policy bound to a fresh RemotePrefill, held to `validated` per request."""
        remote = RemotePrefill(
            self.worker, shape=self.shape, vocab=self.vocab, mode=self.mode, timeout_s=self.ready_timeout_s
        )
        return remote_walk("disagg", self.params, remote, validated)


class ServeSession:
    """The prefill worker for a serving run's `disagg` policy (pdlib.batching): every request's prompt sent at
    setup, then one prompt at a time on request (`prefill`), its K/V and first output installed here on join."""

    def __init__(self, model_spec: str, prompts: dict[str, list[int]], *, config, lossless_decode_weights: bool = True):
        self.mode, self.config = transfer_mode(), config
        chunk = settings.get("PDLIB_DISAGG_PREFILL_CHUNK")
        self.worker = PrefillWorker.get()
        self.lengths = {name: len(ids) for name, ids in prompts.items()}
        self.worker.send(
            {
                "cmd": "setup",
                "model": model_spec,
                "prompts": {name: [int(t) for t in ids] for name, ids in prompts.items()},
                "capacity": max(self.lengths.values()) + 1,
                "chunk_size": 0 if chunk == "whole" else chunk,
                "lossless_decode_weights": lossless_decode_weights,
                "logical_reset": True,
                "mode": self.mode,
            }
        )
        prefill = self.worker.wait_message(
            "setup", timeout_s=SETUP_TIMEOUT_S, what="loading the weights and prefilling the longest prompt once"
        )
        self.ready_timeout_s = ready_timeout_s(prefill["prefill_s"])
        self.workers = workers_record(self.worker, self.mode, chunk, self.ready_timeout_s, prefill)

    def prefill(self, req: str, n: int) -> RemotePrefill:
        """A RemotePrefill of `req`'s whole prompt (n tokens), not yet started."""
        if self.lengths.get(req) != n:
            raise ValueError(f"a remote prefill of {n} tokens of {req}; the worker holds {self.lengths.get(req)}")
        c = self.config
        shape = (c.num_hidden_layers, 2, c.num_key_value_heads, n, c.head_dim)
        return RemotePrefill(
            self.worker, shape=shape, vocab=c.vocab_size, mode=self.mode, timeout_s=self.ready_timeout_s, req=req
        )


__all__ = ["DisaggSession", "RemotePrefill", "ServeSession", "WorkerError"]

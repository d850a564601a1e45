"""The prefill worker (rank 1): B's prompt, whole or in chunks, on its own device; its K/V and first output go to the
decode worker through a collective (transfer.py). Started by launch.PrefillWorker, never by hand:

    python -m pdlib.run.disagg.worker --commands FD --replies FD --backend ring   # env: MLX_RANK=1, MLX_HOSTFILE

Side channel, one JSON object per line. Commands: {"cmd": "setup", model, prompt, capacity, chunk_size,
lossless_decode_weights, logical_reset, mode} builds the engine for B's prompt (the weights are loaded once per
model spec) and prefills it once, untimed, replying with that prefill's seconds (`prefill_s`); {"cmd":
"prefill"} resets B, runs its prompt in chunk_size chunks (the whole prompt by default: remote.prefill_chunk),
replies {"kind": "ready", "token"} once its K/V and first output are computed, then joins the transfer;
{"cmd": "quit"}. A closed command pipe also ends the worker.
Serving N requests (pdlib.batching's `disagg`): the setup carries `prompts` ({name: ids}) instead of `prompt`,
and each {"cmd": "prefill", "req": name} prefills that request's prompt into the engine's one cache (a pool of
one slot, the longest prompt's size; the setup's untimed prefill is the longest prompt's) and sends its K/V.
Any failure: {"kind": "error", "error": one line}, then exit code 1.
Test hook: PDLIB_DISAGG_WORKER_FAULT=exit@N makes the N-th prefill command exit with code 1 before
replying; hang@N makes it sleep instead (the decode worker's timeout must end the run).
"""

import argparse
import json
import os
import sys
import time


def _reply(out, **msg) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _prefill(engine, setup):
    """B reset, then its whole prompt in setup's chunks; the last chunk's Output, its token evaluated."""
    P, chunk = len(setup["prompt"]), setup["chunk_size"]
    engine.reset("B", logical=setup["logical_reset"])
    out = None
    for start in range(0, P, chunk):
        out = engine.prefill_chunk("B", min(chunk, P - start))
    out.token.item()
    return out


def _prefill_request(engine, setup, req: str):
    """A serving request's whole prompt (in setup's chunks; 0: whole) into the engine's one cache."""
    ids = setup["prompts"][req]
    chunk = setup["chunk_size"] or len(ids)
    engine.clear_requests()
    engine.add_request(req, ids)
    out = None
    for start in range(0, len(ids), chunk):
        out = engine.prefill_chunk(req, min(chunk, len(ids) - start))
    out.token.item()
    return out


def serve(commands, replies, *, backend: str) -> int:
    import mlx.core as mx

    from pdlib import settings
    from pdlib.engine import Engine
    from pdlib.engine.kernels import BACKEND
    from pdlib.report.io import environment
    from pdlib.run.disagg import transfer
    from pdlib.weights import load_model

    _reply(replies, kind="hello")
    group = mx.distributed.init(strict=True, backend=backend)
    assert group.rank() == 1 and group.size() == 2, (group.rank(), group.size())
    fault, _, fault_at = (settings.get("PDLIB_DISAGG_WORKER_FAULT") or "@0").partition("@")
    models, engine, setup, prefills = {}, None, None, 0
    for line in commands:
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        if cmd == "quit":
            return 0
        if cmd == "setup":
            setup = msg
            if msg["model"] not in models:
                models.clear()
                models[msg["model"]] = load_model(msg["model"])
            model = models[msg["model"]]
            # it only prefills: no decode weights for the persistent kernel to stack
            serving = "prompts" in msg
            engine = Engine(
                model,
                capacity=msg["capacity"],
                lossless_decode_weights=msg["lossless_decode_weights"],
                decode="kernels",
                token_read="item",
                slots=1 if serving else None,
            )  # it prefills only
            # one untimed prefill of B's prompt (serving: the longest): compiles what it needs, and its time scales
            # the decode worker's wait for a silent worker (remote.ready_timeout_s)
            if not serving:
                engine.add_request("B", msg["prompt"])
            t0 = time.perf_counter()
            if serving:
                _prefill_request(engine, setup, max(msg["prompts"], key=lambda k: len(msg["prompts"][k])))
            else:
                _prefill(engine, setup)
            prefill_s = time.perf_counter() - t0
            env = environment(BACKEND)
            _reply(
                replies,
                kind="setup",
                device=str(mx.default_device()),
                device_name=env["device_name"],
                backend=env["backend"],
                mlx=env["mlx"],
                pid=os.getpid(),
                # each process numbers its visible GPUs from 0: this says which of the host's it was
                CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES"),
                prefill_s=round(prefill_s, 6),
            )
        elif cmd == "prefill":
            prefills += 1
            if prefills == int(fault_at):
                print(f"test hook: {fault} at prefill {prefills}", file=sys.stderr, flush=True)
                if fault == "hang":
                    time.sleep(3600)
                os._exit(1)
            if "req" in msg:
                req = msg["req"]
                out = _prefill_request(engine, setup, req)
                kv = engine.kv(req, 0, len(setup["prompts"][req]))
            else:
                out = _prefill(engine, setup)
                kv = engine.kv("B", 0, len(setup["prompt"]))
            payload = transfer.pack(kv, out.logits, mode=setup["mode"])
            _reply(replies, kind="ready", token=out.token.item())
            transfer.send(payload, group=group)
        else:
            raise ValueError(f"unknown command {cmd!r}")
    return 0


def _die_with_parent() -> None:
    """If the decode worker dies without killing us (NCCL exits the process on an error), so do we: a worker
    left in a collective would hold its GPU for the next run."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv=None) -> int:
    _die_with_parent()
    p = argparse.ArgumentParser(prog="python -m pdlib.run.disagg.worker")
    p.add_argument("--commands", type=int, required=True)
    p.add_argument("--replies", type=int, required=True)
    p.add_argument("--backend", required=True)
    args = p.parse_args(argv)
    replies = os.fdopen(args.replies, "w")
    try:
        with os.fdopen(args.commands) as commands:
            return serve(commands, replies, backend=args.backend)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        try:
            _reply(replies, kind="error", error=msg)
        except OSError:
            pass
        raise


if __name__ == "__main__":
    sys.exit(main())

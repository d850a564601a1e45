"""The full gate on a serving run: its logged step sequence replayed from empty caches, untimed, with the
two-request gate's checks (pdlib/run/validate.py's Gate: every prefill chunk's K/V prefix, every output's
logits and token, every decode's K/V slot, the whole cache every `checkpoint_every` outputs, 1e-3) on a
sample of the run's requests.

    record = replay_gate(engine, model, run, prompt_ids, sample=4, seed=0, checkpoint_every=16)

A timed run's steps depend on when requests arrived, so each run is replayed as it ran: the same parts in the same
steps (`run["steps"]["work"]`), through the same Engine.batch (each request holding a cache from its first part to
its last token, within what it held in the run), those partition issued on slice A on it again (`steps["sliced"]`:
the persistent decode's grid, so the order of its sums, follows the slice). Every request's replayed tokens must
equal the run's (the replay is the run, or the check means nothing), and each sampled request is checked against a
reference that prefills its prompt alone and decodes it greedily (FP32, mlx-lm's Qwen3 on upcast weights): in a
batched step each row must compute what it would alone. The sample is drawn, seeded, from the requests whose tokens
matched the reference exactly (a near tie may flip a token, after which the continuation is the engine's own and no
reference step describes it; those requests are named and left out).
"""

import contextlib
import random
import time

import mlx.core as mx

from pdlib.engine import Engine, check_token
from pdlib.errors import RunFailure, checks_memory
from pdlib.run.executor import WorkResult
from pdlib.run.partition import slice_pair
from pdlib.run.reference import Reference
from pdlib.run.validate import Gate, ReferenceTrace, ValidationResult
from pdlib.scheduler import Decode, Prefill
from pdlib.weights import LoadedModel


def replay_gate(
    engine: Engine,
    model: LoadedModel,
    run: dict,
    prompt_ids: dict[str, list[int]],
    *,
    sample: int,
    seed: int = 0,
    checkpoint_every: int = 16,
    reference: Reference | None = None,
    join=None,
) -> dict:
    """Replay `run` on `engine` (its requests added) and check `sample` of its requests in full; the record
    says which were checked, how long it took and each check's count and worst error. A failed check raises
    ValidationError; a replay whose tokens differ from the run's raises RunFailure, one that runs out of device
    memory ChecksOutOfMemory (the checks', not the policy's: a search must not record it as the run's).
    `reference`: the FP32 model to check against, made once by a caller that replays many runs (else made here).
    `join(engine, name, n)`: how a logged join (`steps["joins"]`) is run again, returning its Output (disagg:
    through the prefill worker); else as one whole prefill here."""
    t = time.perf_counter()
    mx.clear_cache()  # the run's freed buffers go back: the reference's prompt passes need room beside the caches
    mx.reset_peak_memory()  # the run's own peak is read before its replay
    exact = [r["name"] for r in run["requests"] if r.get("check", {}).get("status") == "ok"]
    chosen = set(random.Random(seed).sample(exact, min(sample, len(exact))))
    with checks_memory(f"the replay of {run['policy']}'s steps (the full checks on {len(chosen)} of its requests)"):
        return _replay(engine, model, run, prompt_ids, exact, chosen, seed, checkpoint_every, reference, join, t)


def _replay(engine, model, run, prompt_ids, exact, chosen, seed, checkpoint_every, reference, join, t) -> dict:
    requests = run["requests"]
    skipped = [r["name"] for r in requests if r["name"] not in exact]
    reference = reference or Reference(model)
    traces = {name: ReferenceTrace(reference, prompt_ids[name]) for name in chosen}
    result = ValidationResult(f"{run['policy']} (replay)")
    gate = Gate(engine, traces, result, checkpoint_every=checkpoint_every)
    engine.detach_all([r["name"] for r in requests])
    ids: dict[str, list[int]] = {r["name"]: [] for r in requests}
    wanted = {r["name"]: len(r["output_ids"]) for r in requests}
    sliced = set(run["steps"].get("sliced", ()))
    joins = set(run["steps"].get("joins", ())) if join is not None else set()
    for index, parts in enumerate(run["steps"]["work"]):
        parts = [(name, n) for name, n in parts]
        for name, _ in parts:
            if engine.requests[name].cache is None:
                if engine.spare == 0:  # the run held at most what the engine has: not the run's steps
                    raise RunFailure(
                        f"the replay of {run['policy']}'s step {index} needs more caches than the engine holds: "
                        f"the steps logged are not the steps run"
                    )
                engine.attach(name)
        starts = [engine.requests[name].length for name, _ in parts]
        # a step that ran on partition's slice A runs there again: the decode's grid, so its sums, follow the slice
        if index in joins:
            outs = [join(engine, *parts[0])]
        else:
            with slice_pair().a.active() if index in sliced else contextlib.nullcontext():
                outs = engine.batch(parts)
        checked = []
        for (name, n), start, out in zip(parts, starts, outs):
            r = WorkResult(Decode(name) if n is None else Prefill(name, n), start, engine.requests[name].length, out)
            if out is not None:
                r.token = check_token(out.observe())
                ids[name].append(r.token)
            if name in chosen:
                checked.append(r)
        if checked:
            gate.on_step(index, None, checked, 0, 0, timed=False)
        for name, _ in parts:
            if len(ids[name]) == wanted[name]:  # its last token: its cache goes to the next, checked first
                if name in chosen:
                    gate.flush_decode_kv(name)
                    traces[name].release()  # its reference's cache, up to 1.7 GB, is not needed again
                engine.detach(name)
    gate.finish()
    for r in requests:
        if ids[r["name"]] != r["output_ids"]:
            raise RunFailure(
                f"the replay of {run['policy']}'s steps gave {r['name']} other tokens than the run "
                f"({_first_difference(ids[r['name']], r['output_ids'])}): the steps logged are not the steps run"
            )
    result.passed = True
    record = result.to_dict()
    for key in ("policy", "tokens"):
        record.pop(key, None)
    return {
        "requests": sorted(chosen, key=[r["name"] for r in requests].index),
        "skipped_near_ties": skipped,
        "seed": seed,
        "checkpoint_every": checkpoint_every,
        "seconds": time.perf_counter() - t,
        "peak_memory_bytes": mx.get_peak_memory(),  # the device's over the replay, the engine's caches included
        **record,
    }


def _first_difference(got: list[int], want: list[int]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"output {i}: {got[i] if i < len(got) else 'none'} against {want[i] if i < len(want) else 'none'}"


__all__ = ["replay_gate"]

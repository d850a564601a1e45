"""The peer: mlx-lm's own continuous batching (`mlx_lm.generate.BatchGenerator`, what `mlx_lm.server` runs) on the
same workload, weights and clock as the policies in the same run; timed, never gated.

    model = peer_model(load_model("synthetic:tiny"), "bf16")      # mlx-lm's Qwen3 on pdlib's weights, cast
    run = peer_once(model, workload, prompts, dtype="bf16", prefill_step_size=2048)   # serve_once's shape
    runs = run_peers(model, workload, prompts, refs, [("fp32", 2048), ("bf16", 32)], warmups=1)
    trials = pair_trials(model, prompts, 1024, [("fp32", 2048)], trials=5, warmups=1, reference_tokens=ref,
                         first_position=4)   # the two-request report's peer trials

The model is the reference's (pdlib/run/reference.py: mlx-lm's Qwen3 built from pdlib's weights): FP32 as it is,
or a fresh one cast to bf16, so the gate's FP32 reference is never touched. Sampling is greedy (an argmax), there
are no stop tokens, and each request's max_tokens is its output_tokens: every request emits exactly that many
tokens. completion_batch_size and prefill_batch_size are mlx_lm.server's defaults (--decode-concurrency 32,
--prompt-concurrency 8), what a user of mlx-lm's server runs: with more requests in their prompt at once, one
right-padded prompt pass of every one of them would hold N x prefill_step_size x the longest prompt's attention
scores (48 of the code trace's prompts at 2048 in FP32: ~47 GB a layer, and its softmax as much again).

A run: the generator is built before the clock starts at 0 (`time.perf_counter_ns`, serve.py's clock). Until every
request has ended: insert the requests whose arrival the clock has passed (one prompt, its max_tokens); when none
is in the generator, wait for the next arrival; else call `next()` once. One call is one step of mlx-lm's loop:
a decode of every generating request (GenerationBatch.next issues the forward for the next token and reads the
token the previous step computed), the requests whose prompt is done join generation (a one-token forward of the
prompt's last token, which samples the first output), then one prompt pass of at most prefill_step_size tokens
of every request still in its prompt (one right-padded batch). `next()` returns the step's tokens together,
after its prompt pass: each token is stamped then, when the host (and a server's loop) sees it. Each step is
logged as serve.py's are: decodes `[name, null]`, prompt tokens `[name, n]` (from the progress mlx-lm reports,
the join's one token included), start and end.

Agreement replaces the gate: per request, how many leading output ids equal the FP32 reference's
(pdlib.report.checks.agreement). A peer that loses or changes a token shows it there; a request the generator
drops (two empty steps in a row while it is unfinished) ends short, and the run goes on.
"""

import copy
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator

from pdlib.config import PEER_DTYPES, peer_name
from pdlib.errors import RunFailure, check_int
from pdlib.report.checks import agreement
from pdlib.report.serving import request_records, run_summary
from pdlib.run.clock import next_arrival, now
from pdlib.run.reference import Reference
from pdlib.weights import LoadedModel
from pdlib.workload import Workload

SYSTEM = "mlx-lm BatchGenerator"
BATCH_SIZES = {"completion": 32, "prefill": 8}  # mlx_lm.server's --decode-concurrency, --prompt-concurrency
DTYPES = dict(zip(PEER_DTYPES, (mx.float32, mx.bfloat16)))


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def model_dtype(model: nn.Module) -> str | None:
    """The PEER_DTYPES name of the model's floating parameters' one dtype, else None."""
    kinds = {v.dtype for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}
    names = [k for k, d in DTYPES.items() if kinds == {d}]
    return names[0] if names else None


def peer_model(model: LoadedModel, dtype: str) -> nn.Module:
    """A fresh reference model (its own arrays) in `dtype`."""
    ref = Reference(model).model
    if dtype != "fp32":
        ref.set_dtype(DTYPES[dtype])
    return ref


def peer_once(
    ref_model: nn.Module, workload: Workload, prompts, *, dtype: str, prefill_step_size: int, skip_idle: bool = False
) -> dict:
    """One timed run of mlx-lm's BatchGenerator on `workload` (module docstring), shaped like serve_once's result.
    `ref_model`: mlx-lm's model; when its parameters are not `dtype`, a copy is cast (peer_model's is not copied);
    `prompts`: {name: token ids}; `skip_idle`: an idle span skipped as serve_once skips it (pdlib/run/clock.py),
    once what the generator issued last has run."""
    if dtype not in DTYPES:
        raise ValueError(f"peer dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    check_int("prefill_step_size", prefill_step_size, 1)
    model = ref_model if model_dtype(ref_model) == dtype else _cast_copy(ref_model, dtype)
    names, n = workload.names, workload.n
    arrival = workload.arrival_ns.tolist()
    output = workload.output_tokens.tolist()
    token_lists = [list(prompts[name]) for name in names]  # insert's type, made before the clock starts
    gen = BatchGenerator(
        model,
        sampler=greedy,
        completion_batch_size=BATCH_SIZES["completion"],
        prefill_batch_size=BATCH_SIZES["prefill"],
        prefill_step_size=prefill_step_size,
    )
    ids: list[list[int]] = [[] for _ in names]
    emits: list[list[int]] = [[] for _ in names]
    admitted, lost = [0] * n, [False] * n
    index, progress, live = {}, {}, set()  # uid -> request; uid -> prompt tokens done; requests in the generator
    work_log, t_start_log, t_end_log = [], [], []
    idle_ns = skipped_ns = nxt = ended = empty = 0
    try:
        mx.synchronize(gen.stream)  # mlx-lm works on its own stream: nothing of a run before is left running
        mx.synchronize()
        mx.reset_peak_memory()
        t0 = now()
        while ended < n:
            t = now() - t0
            while nxt < n and arrival[nxt] <= t:
                (uid,) = gen.insert([token_lists[nxt]], max_tokens=[output[nxt]])
                index[uid], progress[uid], admitted[nxt] = nxt, 0, t
                live.add(nxt)
                nxt += 1
            if not live:
                if skip_idle:
                    mx.synchronize(gen.stream)  # the jump leaves nothing of the last request running
                t1 = next_arrival(t0, arrival[nxt], skip=skip_idle)
                skipped_ns, t0 = skipped_ns + t0 - t1, t1
                idle_ns += now() - t0 - t
                continue
            t_start = now() - t0
            prompt_out, gen_out = gen.next()
            t_end = now() - t0
            work = []
            for r in gen_out:
                i = index[r.uid]
                ids[i].append(int(r.token))
                emits[i].append(t_end)
                work.append([names[i], None])
                if r.finish_reason is not None:
                    live.discard(i)
                    ended += 1
            for r in prompt_out:
                work.append([names[index[r.uid]], r.progress[0] - progress[r.uid]])
                progress[r.uid] = r.progress[0]
            empty = 0 if work else empty + 1
            if empty == 2:  # the generator holds nothing, yet these never finished: they end short
                for i in live:
                    lost[i] = True
                ended += len(live)
                live.clear()
            if work:
                work_log.append(work)
                t_start_log.append(t_start)
                t_end_log.append(t_end)
        mx.synchronize(gen.stream)  # the forward issued after the last token is not left running into what follows
    finally:
        gen.close()
    requests = request_records(workload, admitted=admitted, emits=emits, ids=ids, lost=lost)
    return {
        "policy": peer_name(dtype, prefill_step_size),
        "peer": True,
        "system": SYSTEM,
        "dtype": dtype,
        "prefill_step_size": prefill_step_size,
        "batch_sizes": dict(BATCH_SIZES),
        "requests": requests,
        "steps": {"work": work_log, "t_start_ns": t_start_log, "t_end_ns": t_end_log},
        "idle_ns": idle_ns,
        "skipped_ns": skipped_ns,
        "makespan_ns": t_end_log[-1],
        "peak_memory_bytes": mx.get_peak_memory(),  # the device's, over the run (its model's included)
    }


def pair_run(ref_model: nn.Module, prompts: dict, output_tokens: int, *, dtype: str, prefill_step_size: int) -> dict:
    """The two-request workload on mlx-lm's BatchGenerator, shaped like a report trial (pdlib/report/schema.py)
    without its number, position and agreement: A's prompt goes in first and the generator runs until A's first
    output (A's set-up, untimed); at t0 B's prompt goes in, and the clock runs until both have all
    `output_tokens`. Each step's tokens are stamped when `next()` returns them; the events are B's prompt
    passes (kind prefill, its positions) and every decode that emitted a token (its cache position)."""
    if dtype not in DTYPES:
        raise ValueError(f"peer dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    check_int("prefill_step_size", prefill_step_size, 1)
    model = ref_model if model_dtype(ref_model) == dtype else _cast_copy(ref_model, dtype)
    gen = BatchGenerator(
        model, sampler=greedy, completion_batch_size=2, prefill_batch_size=2, prefill_step_size=prefill_step_size
    )
    names, lengths = {}, {r: len(prompts[r]) for r in ("A", "B")}
    ids, emits, events, done, progress = {"A": [], "B": []}, {"A": [], "B": []}, [], set(), {}
    try:
        (uid,) = gen.insert([list(prompts["A"])], max_tokens=[output_tokens])
        names[uid] = "A"
        empty = 0
        while not ids["A"]:  # A's set-up: its prompt and first output, before t0
            prompt_out, gen_out = gen.next()
            ids["A"] += [int(r.token) for r in gen_out]
            empty = _stalled(empty, prompt_out or gen_out, "A's set-up")
        mx.synchronize(gen.stream)
        t0 = now()
        (uid,) = gen.insert([list(prompts["B"])], max_tokens=[output_tokens])
        names[uid], progress[uid] = "B", 0
        while len(done) < 2:
            t_start = now() - t0
            prompt_out, gen_out = gen.next()
            t_end = now() - t0
            for r in prompt_out:
                req = names[r.uid]
                events.append(_event("prefill", req, progress[r.uid], r.progress[0], t_start, t_end))
                progress[r.uid] = r.progress[0]
            for r in gen_out:
                req = names[r.uid]
                position = lengths[req] + len(ids[req]) - 1  # where the step that made this token wrote
                ids[req].append(int(r.token))
                emits[req].append(t_end)
                if req == "A" or len(ids[req]) > 1:  # B's first token comes from its prompt pass
                    events.append(_event("decode", req, position, position + 1, t_start, t_end))
                if r.finish_reason is not None:
                    done.add(req)
            empty = _stalled(empty, prompt_out or gen_out, f"{sorted({'A', 'B'} - done)} unfinished")
        mx.synchronize(gen.stream)
    finally:
        gen.close()
    return {
        "policy": peer_name(dtype, prefill_step_size),
        "peer": True,
        "makespan_ns": max(emits["A"][-1], emits["B"][-1]),
        "requests": {
            "A": {"output_ids": ids["A"], "timed_from": 1, "emit_ns": emits["A"]},
            "B": {"output_ids": ids["B"], "timed_from": 0, "emit_ns": emits["B"]},
        },
        "events": events,
    }


def pair_trials(
    model: LoadedModel,
    prompts: dict,
    output_tokens: int,
    peers,
    *,
    trials: int,
    warmups: int,
    reference_tokens: dict,
    first_position: int,
    on_run=None,
) -> list[dict]:
    """Per peer (dtype, prefill_step_size): `warmups` untimed pair runs, then `trials` timed ones, each a report
    trial marked peer with its agreement (leading outputs equal to `reference_tokens`) and placed after the
    policies (`first_position` + its index)."""
    models: dict[str, nn.Module] = {}
    out = []
    for j, (dtype, step) in enumerate(peers):
        if dtype not in models:
            models[dtype] = peer_model(model, dtype)
        for i in range(warmups + trials):
            run = pair_run(models[dtype], prompts, output_tokens, dtype=dtype, prefill_step_size=step)
            if i >= warmups:
                ids = {r: run["requests"][r]["output_ids"] for r in ("A", "B")}
                run.update(
                    trial=i - warmups + 1,
                    position=first_position + j,
                    agreement={r: agreement(ids[r], reference_tokens[r]) for r in ids},
                )
                out.append(run)
            if on_run:
                on_run()
    return out


def _stalled(empty: int, progressed, what: str) -> int:
    """Steps in a row without progress; two of them: the generator holds nothing it will finish."""
    if progressed:
        return 0
    if empty + 1 == 2:
        raise RunFailure(f"mlx-lm's BatchGenerator stopped making progress: {what}")
    return empty + 1


def _event(kind: str, req: str, start: int, stop: int, t_start: int, t_end: int) -> dict:
    return {"kind": kind, "req": req, "start": start, "stop": stop, "t_start_ns": t_start, "t_end_ns": t_end}


def _cast_copy(model: nn.Module, dtype: str) -> nn.Module:
    out = copy.deepcopy(model)
    out.set_dtype(DTYPES[dtype])
    return out


def record_agreement(run: dict, refs: dict) -> None:
    """Each request's `agreement`: its leading output ids equal to the FP32 reference's (refs: serve_gate's)."""
    for r in run["requests"]:
        r["agreement"] = agreement(r["output_ids"], refs[r["name"]].tokens)


def run_peers(
    model: LoadedModel, workload: Workload, prompts, refs: dict, peers, *, warmups: int = 0, slos=None, skip_idle=False
) -> list[dict]:
    """One timed run per (dtype, prefill_step_size) in `peers`, each after `warmups` untimed ones, with its
    agreement and report.serving's summary (a request it lost counts, meeting no SLO);
    `skip_idle`: peer_once's."""
    models: dict[str, nn.Module] = {}
    runs = []
    for dtype, step in peers:
        if dtype not in models:
            models[dtype] = peer_model(model, dtype)
        t = time.perf_counter()
        for _ in range(warmups):
            peer_once(models[dtype], workload, prompts, dtype=dtype, prefill_step_size=step, skip_idle=skip_idle)
        warmup_s = time.perf_counter() - t
        run = peer_once(models[dtype], workload, prompts, dtype=dtype, prefill_step_size=step, skip_idle=skip_idle)
        record_agreement(run, refs)
        run["warmup_s"] = warmup_s
        run["summary"] = run_summary(run["requests"], slos or {})
        runs.append(run)
    return runs

"""Serving N requests that arrive over time on one Engine: each policy replays a workload's arrivals on the clock,
every token is stamped, and every request's ids must equal the FP32 reference's for that request alone.

    report = serve_params_file("params/serve-smoke-cpu.yaml", output="out/serve.json")   # the CLI's entry
    report = run_serving(load_model("synthetic:tiny"), workload, policy=["eager", "mixed"], chunk_size=32)
    print(summary_table(report))

A run: every request is added to the engine and the caches are allocated before the clock starts at 0
(`time.perf_counter_ns`). Then, until every request has finished: admit the requests whose arrival_ns the clock has
passed while a cache is free (Memory, below); ask the policy (pdlib.batching) for a step; if it has none, wait for
the next arrival (sleep, then spin; with `skip_idle`, the params' `idle: skip`, the clock jumps to it instead:
pdlib/run/clock.py); else run the step as one `Engine.batch`, observe each output token
(`Output.observe`) and stamp it with the clock; a step without a token ends when its parts' K/V are written. Each
step is logged (its parts `[name, n]` or `[name, null]` for a decode, its start and end). Pipelined decodes
(`pipeline`, the params' `pipeline_decodes`, on by default): a step of decodes only is issued before the tokens of
the step before it are observed (each decode's input token is on the device already, and which step comes next never
depends on a token's value), so the host's work overlaps the device's, as in the two-request runs; a step with a
prompt chunk, a join or a wait for an arrival first observes what is out. Warmups, when asked for, are whole runs
first, checked and then dropped.

A policy that prefills elsewhere (overlap, partition, disagg) has a prompt lane (serve_lane.py): when it is
free, the prompt the policy names starts there as one whole prefill (a layer dispatched after each step; or on
the prefill worker); the loop joins it (a `Prefill(remote=True)` step: its first token observed) at the first
step after it is done, or at once, waiting, when there is nothing else to run. The join is logged as `[name, n]`
and its index in `joins`; disagg's replay joins through the worker again, so the gate checks what arrived.

Memory: every cache has one capacity, max(prompt + output) over the workload (the last output is never fed
back, so that holds every position): one cache shape, so no step is compiled again for another. As many caches
as PDLIB_KV_CACHE_GIB (16 by default) holds, N at most, are allocated before the clock starts (`serving_capacity`;
a workload that one cache would not fit is refused). A request holds one from its admission to its last token:
it is admitted when the clock has passed its arrival and a cache is free, in arrival order (a request that
arrived waits behind an earlier one still waiting), and its cache goes back when its last step is issued (the
next owner's writes are ordered after it through the cache's fence, and its first step, a prompt's, waits for
every token out). A request's `cache_wait_ns` is how long it waited, arrived, for a cache.

The gate, after each run: every request's tokens against the FP32 reference (pdlib/run/serve_gate.py), then
the run's logged steps replayed, untimed, with the two-request gate's full checks (every output's logits, every
K/V slot, checkpoints, 1e-3) on `replay` sampled requests (pdlib/run/serve_replay.py). A failure stops
everything with one line and nothing is written. Peers (pdlib/run/peer.py: mlx-lm's BatchGenerator) run after
the policies on the same workload and clock; they are timed, not gated: each request records its agreement
with the reference.
"""

import datetime
import time
from collections.abc import Sequence
from dataclasses import asdict

import mlx.core as mx

from pdlib import settings
from pdlib.batching import BATCH_POLICIES, DECODE_ROUNDS, check_step, make_batch_policy
from pdlib.config import PEER_DTYPES, peer_name
from pdlib.engine import Engine, check_token, observe_all
from pdlib.engine.kernels import BACKEND
from pdlib.errors import InputError, checks_memory
from pdlib.report.io import claim_output, environment, source_hashes, write_report
from pdlib.report.serving import request_records, run_summary
from pdlib.run.clock import next_arrival, now
from pdlib.run.partition import slice_pair
from pdlib.run.peer import SYSTEM, run_peers
from pdlib.run.reference import Reference
from pdlib.run.serve_gate import NEAR_TIE_MARGIN, gate_run, reference_sequences
from pdlib.run.serve_lane import PromptLane
from pdlib.run.serve_params import ServeParams, load_serve_params
from pdlib.run.serve_replay import replay_gate
from pdlib.run.serve_replicas import resolve, serve_replicated
from pdlib.run.serve_slo import StepBudget, slo_budget
from pdlib.scheduler import Prefill, RequestState
from pdlib.weights import LoadedModel, load_model
from pdlib.workload import Workload, iter_prompts

SCHEMA = "pdlib.serve/1"


def serve_once(
    engine: Engine,
    workload: Workload,
    policy: str,
    *,
    chunk_size: int,
    budget=None,
    pipeline: bool = True,
    decode_rounds: str = "batched",
    worker=None,
    skip_idle: bool = False,
) -> dict:
    """One timed run of `policy` on `workload` (its requests already added to `engine`): per request its
    output ids, emit stamps and admission, and the step log; every stamp in ns since the clock's start.
    `budget`: the slo policy's (serve_slo.step_budget); `pipeline`: pipelined decodes (module docstring);
    `decode_rounds`: batching.make_batch_policy's; `worker`: disagg's prefill worker (prefill_worker);
    `skip_idle`: an idle span skipped, not waited (module docstring), its length summed in `skipped_ns`."""
    names, n = workload.names, workload.n
    arrival = workload.arrival_ns.tolist()
    prompt, output = workload.prompt_tokens.tolist(), workload.output_tokens.tolist()
    engine.detach_all(names)  # untimed: the caches are allocated once; a request takes one when it is admitted
    slots = engine.spare  # None: caches of their own, as many as requests (those detached now)
    if slots is not None:
        engine.reserve(slots)  # every cache the pool holds made now, none on the clock
    chooser = make_batch_policy(policy, budget=budget, decode_rounds=decode_rounds)
    learn = budget if policy == "slo-mixed" and isinstance(budget, StepBudget) else None  # learns the loop's cost
    if learn is not None:
        learn.start()
    site = chooser.remote_prefill
    lane = PromptLane(site, worker=worker if site == "worker" else None) if site else None
    joins: list[int] = []  # the steps that joined a prompt run on the lane
    sliced: list[int] = []  # the steps issued on slice A (partition, while a prompt was out)
    states: dict[str, RequestState] = {}
    running: list[RequestState] = []
    ids: dict[str, list[int]] = {name: [] for name in names}
    emits: dict[str, list[int]] = {name: [] for name in names}
    admitted, blocked = [0] * n, [None] * n  # blocked: when it was first seen arrived with no cache free
    noticed = 0  # the requests before it were admitted, or seen arrived while no cache was free
    work_log, t_start_log, t_issued_log, t_end_log = [], [], [], []
    idle_ns, skipped_ns, nxt, finished = 0, 0, 0, 0
    pending = None  # a step issued, its tokens not observed yet: (parts, outs, caches, start, issued, expected)

    def observe(parts, outs, caches, t_start, t_issued, expected) -> None:
        def seen(i: int, token: int) -> None:  # stamped as it is seen
            ids[parts[i][0]].append(check_token(token))
            emits[parts[i][0]].append(now() - t0)

        observe_all(outs, seen)
        if expected is not None:  # the longest gap the step ended, against its prediction
            gaps = [e[-1] - e[-2] for e in (emits[r] for r, k in parts if k is None) if len(e) > 1]
            if gaps:
                learn.observe(expected, max(gaps) / 1e6)
        quiet = []
        for out, c in zip(outs, caches):
            if out is None:
                quiet += c.lazy()
        if quiet:  # a chunk that yields no token is done when its K/V are
            mx.eval(quiet)
        work_log.append([list(p) for p in parts])
        t_start_log.append(t_start - t0)
        t_issued_log.append(t_issued - t0)
        t_end_log.append(now() - t0)

    mx.synchronize()
    mx.reset_peak_memory()
    t0 = now()
    while finished < n:
        t = now() - t0
        while nxt < n and arrival[nxt] <= t:
            if slots is not None and len(running) == slots:  # every cache held: it waits, and so do those behind it
                while noticed < n and arrival[noticed] <= t:
                    blocked[noticed], noticed = t, noticed + 1
                break
            engine.attach(names[nxt])
            noticed = max(noticed, nxt + 1)
            states[names[nxt]] = RequestState(names[nxt], prompt[nxt], output[nxt])
            running.append(states[names[nxt]])
            admitted[nxt] = t
            nxt += 1
        step = None
        if lane is not None:
            if lane.ready():
                step = _join(lane)
            elif not lane.busy and (r := chooser.next_remote(running)) is not None:
                lane.start(engine, r.name, r.prompt_tokens)  # its first layer goes out now
        step = step or chooser.next_step(running, chunk_size=chunk_size)
        if step is None and lane is not None and lane.busy:
            step = _join(lane)  # nothing else to do: wait for the prompt
        if step is None and pending is not None:  # what is issued is seen before waiting
            observe(*pending)
            pending = None
            continue
        if step is None:
            if running or nxt == n:
                raise RuntimeError(f"policy {policy!r} stopped with {len(running)} requests running")
            t1 = next_arrival(t0, arrival[nxt], skip=skip_idle)  # with nothing running every cache is free
            skipped_ns, t0 = skipped_ns + t0 - t1, t1
            idle_ns += now() - t0 - t
            continue
        check_step(step, states)
        parts = [(w.req, w.n if isinstance(w, Prefill) else None) for w in step.work]
        remote = isinstance(step, Prefill) and step.remote
        if pending is not None and not (pipeline and not remote and all(k is None for _, k in parts)):
            observe(*pending)  # a step with a prompt in it goes out once the tokens before it are seen
            pending = None
        index = len(work_log) + (pending is not None)  # this step's place in the log
        caches = [engine.requests[name].cache for name, _ in parts]  # held until the step is seen, reused after
        expected = learn.expect_step(running, parts) if learn is not None and not remote else None
        t_start = now()
        if remote:
            outs = [lane.join(engine)[0]]
            joins.append(index)
        elif lane is not None:
            if lane.on_slice:
                sliced.append(index)
            with lane.issuing():
                outs = engine.batch(parts)
            lane.advance()  # the prompt's next layer, while this step runs
        else:
            outs = engine.batch(parts)
        t_issued = now()  # the host's part of the step ends: built and started
        if pending is not None:  # the step before, seen while this one runs
            observe(*pending)
        pending = (parts, outs, caches, t_start, t_issued, expected)
        if not pipeline:
            observe(*pending)
            pending = None
        done = 0  # the states move now: which step comes next does not depend on the tokens
        for w in step.work:
            states[w.req].apply(w)
            if states[w.req].finished:
                engine.detach(w.req)  # free for the next admitted: its own first step waits for this one's
                done += 1
        if done:
            running = [r for r in running if not r.finished]
            finished += done
    if pending is not None:
        observe(*pending)
    requests = request_records(
        workload, admitted=admitted, emits=[emits[m] for m in names], ids=[ids[m] for m in names]
    )
    for r, a, b in zip(requests, admitted, blocked):
        r["cache_wait_ns"] = 0 if b is None else a - b
    steps = {"work": work_log, "t_start_ns": t_start_log, "t_issued_ns": t_issued_log, "t_end_ns": t_end_log}
    if lane is not None:
        steps["joins"] = joins  # these steps joined a prompt run on the lane (a whole prefill, replayed as one)
    if lane is not None and lane.site == "slice":
        steps["sliced"] = sliced  # these ran on slice A: its grid size, which the replay must use too
    run = {"policy": policy, "requests": requests, "steps": steps, "idle_ns": idle_ns, "makespan_ns": t_end_log[-1]}
    run["skipped_ns"] = skipped_ns
    if learn is not None:  # what slo-mixed learned the loop adds to a step, at the run's end
        run["slo_loop"] = {"loop_ms": learn.loop_ms, "overruns": list(learn.overruns)}
    return run | {"peak_memory_bytes": mx.get_peak_memory()}  # the device's over the run: model, caches, steps


def prefill_worker(model: LoadedModel, policies: Sequence[str], prompt_ids: dict[str, list[int]]):
    """The prefill worker set up with every prompt, if a policy runs its prompts there (disagg), else None. Its
    process is spawned once and kept (pdlib/run/disagg/launch.py); nothing of disagg is imported otherwise."""
    if not any(BATCH_POLICIES[p].remote_prefill == "worker" for p in policies):
        return None
    from pdlib.run.disagg.remote import ServeSession

    return ServeSession(model.source["spec"], prompt_ids, config=model.config)


def remote_join(worker):
    """For the replay: a logged join run again through `worker` (its prompt prefilled there, its K/V sent over),
    so the gate checks what arrives; None (no worker): the replay prefills it here."""
    if worker is None:
        return None

    def join(engine: Engine, req: str, n: int):
        lane = worker.prefill(req, n)
        lane.start(engine)
        return lane.receive(engine, req, n)[0]

    return join


def _join(lane: PromptLane) -> Prefill:
    return Prefill(lane.current.req, lane.current.n, remote=True)


def gated_run(engine, workload, name: str, *, refs: dict, how: dict, replay=None, ties: list | None = None) -> dict:
    """One run of `name` (a policy, or `<policy>-x<K>`: K replicas of it, serve_replicas.py, each checked before
    the next), its tokens gated, its near-ties added to `ties` and its steps replayed by `replay(run)` when
    given (a warmup passes neither); `how`: serve_once's settings."""
    base, replicas = resolve(name)

    def checked(run: dict) -> dict:
        run["policy"] = name  # a replica's run: named as the whole
        found = gate_run(run, refs)
        if ties is not None:
            ties.extend(found)
        if replay is not None:
            run["replay"] = replay(run)
        return run

    def one(w: Workload) -> dict:
        return serve_once(engine, w, base, **how)

    if replicas > 1:
        return serve_replicated(workload, base, replicas=replicas, serve=one, check=checked)
    return checked(one(workload))


def kv_cache_bytes(model: LoadedModel, *, requests: int, capacity: int) -> int:
    c = model.config
    return 2 * 4 * requests * capacity * c.num_hidden_layers * c.num_key_value_heads * c.head_dim  # K and V, FP32


def serving_capacity(model: LoadedModel, workload: Workload) -> tuple[int, int, int]:
    """(cache capacity, caches, their bytes) for `workload`: as many caches as PDLIB_KV_CACHE_GIB holds, N at
    most; InputError when the model or memory cannot hold one (module docstring)."""
    total = (workload.prompt_tokens + workload.output_tokens).tolist()
    capacity = max(total)
    limit = model.config.max_position_embeddings
    if capacity > limit:
        i = total.index(capacity)
        raise InputError(
            f"request {workload.names[i]}: prompt + output = {capacity} exceeds the model's "
            f"{limit} positions (lower max_total_tokens)"
        )
    one, limit_gib = kv_cache_bytes(model, requests=1, capacity=capacity), settings.get("PDLIB_KV_CACHE_GIB")
    slots = min(workload.n, int(limit_gib * 2**30 // one))
    if slots < 1:
        raise InputError(
            f"one cache of {capacity} positions needs {one / 2**30:.2f} GiB (over PDLIB_KV_CACHE_GIB={limit_gib:g}): "
            f"serve shorter requests (max_total_tokens) or raise it"
        )
    return capacity, slots, slots * one


def warm_engine(engine: Engine, workloads: Sequence[Workload], chunk_size: int, policies: Sequence[str] = ()) -> dict:
    """Each matmul kernel variant a step of these workloads can meet, compiled before anything is timed (a step
    carries at most a chunk, or a whole prompt, and a decode per request), and under PDLIB_DECODE_ROUND=compiled
    each round's trace (engine/round.py), on partition's slice A too where `policies` hold it (MLX keeps a trace
    per stream), and each launch size of several decodes (Engine.warm_groups): the row counts run, the rounds
    traced, the group sizes launched and the seconds."""
    t = time.perf_counter()
    most = engine.pool.shape[0] if engine.pool is not None else max(w.n for w in workloads)  # decodes in a step
    prompt_rows = [max(min(chunk_size, int(w.prompt_tokens.sum())), int(w.prompt_tokens.max())) for w in workloads]
    rows = engine.model.warm(max(p + min(w.n, most) for p, w in zip(prompt_rows, workloads)))
    sizes = range(3, min(max(w.n for w in workloads), most) + 1)  # a round's rows each hold a cache
    rounds = engine.rounds.trace(engine.pool, sizes) if engine.decode_round == "compiled" else []
    if rounds and any(BATCH_POLICIES[resolve(p)[0]].remote_prefill == "slice" for p in policies):
        with slice_pair().a.active():  # where partition issues its rounds while a prompt is out
            engine.rounds.trace(engine.pool, sizes)
    slots = None if engine.pool is None else engine.pool.shape[0]  # at most this many requests hold a cache at once
    warm = {"slots": slots, "warm_rows": rows, "warm_rounds": rounds, "warm_groups": engine.warm_groups(most)}
    return {**warm, "warm_s": time.perf_counter() - t}


def run_serving(
    model: LoadedModel,
    workload: Workload,
    *,
    policy: str | Sequence[str],
    chunk_size: int,
    slos=None,
    warmups: int = 0,
    refs: dict | None = None,
    params: dict | None = None,
    params_file=None,
    peers: Sequence[tuple[str, int]] = (),
    replay: int = 4,
    pipeline: bool = True,
    decode_rounds: str = "batched",
    skip_idle: bool = False,
) -> dict:
    """Serve `workload` under each policy named (one name or several, run in order on one engine; `<policy>-x<K>`:
    K replicas of it, serve_replicas.py), gate every run's tokens, then run each peer, and return the report
    (schema pdlib.serve/1; `summary_table` shows it). `slos`: a dict of report.serving.Slo for the attainment
    fields; `refs`: reference sequences already computed (serve_gate), else computed here and timed; `params`:
    what the report records as its params (the params file's); `peers`: (dtype, prefill_step_size) per mlx-lm
    peer run (peer.py), marked "peer": true in `runs`, with each request's agreement in place of the gate's
    check; `replay`: requests per run checked in full on a replay of its steps (0: none); `pipeline`: pipelined
    decodes (module docstring); `decode_rounds`: a round of decodes as one step or one decode a step
    (batching.make_batch_policy); `skip_idle`: idle spans skipped, the peers' too (pdlib/run/clock.py)."""
    policies = [policy] if isinstance(policy, str) else list(policy)
    for p in policies:  # refused before any work
        resolve(p, workload.n)
    if decode_rounds not in DECODE_ROUNDS:
        raise InputError(f"decode_rounds must be one of {', '.join(DECODE_ROUNDS)}, got {decode_rounds!r}")
    for dtype, step in peers:
        if dtype not in PEER_DTYPES or not isinstance(step, int) or step < 1:
            raise InputError(f"peer ({dtype!r}, {step!r}): expected a dtype of {', '.join(PEER_DTYPES)}, a size >= 1")
    cfg = model.config
    capacity, slots, cache_bytes = serving_capacity(model, workload)
    prompts = {p.name: p for p in iter_prompts(workload, vocab_size=cfg.vocab_size, tokenizer=model.tokenizer)}
    reference_s = None
    if refs is None:
        outputs = dict(zip(workload.names, workload.output_tokens.tolist()))
        refs, reference_s = reference_sequences(model, {k: p.token_ids for k, p in prompts.items()}, outputs)
    t = time.perf_counter()
    engine = Engine(model, capacity=capacity, slots=slots)
    for name in workload.names:
        engine.add_request(name, prompts[name].token_ids, cached=False)
    setup_s = time.perf_counter() - t
    warm = warm_engine(engine, [workload], chunk_size, policies)
    runs, near_ties, reference = [], [], None
    token_ids = {k: p.token_ids for k, p in prompts.items()}
    slos = slos or {}
    slo, budget = (
        slo_budget(engine, workload, chunk_size=chunk_size, slos=slos)
        if any(resolve(p)[0] == "slo-mixed" for p in policies)
        else ({}, None)
    )
    worker = prefill_worker(model, [resolve(p)[0] for p in policies], token_ids)
    how = dict(chunk_size=chunk_size, budget=budget, pipeline=pipeline, decode_rounds=decode_rounds, worker=worker)
    how["skip_idle"] = skip_idle
    for p in policies:

        def replayed(run: dict) -> dict:
            nonlocal reference
            with checks_memory("the FP32 reference of the replays"):
                reference = reference or Reference(model)
            join = remote_join(worker) if BATCH_POLICIES[resolve(p)[0]].remote_prefill == "worker" else None
            return replay_gate(
                engine, model, run, token_ids, sample=replay, seed=len(runs), reference=reference, join=join
            )

        t = time.perf_counter()
        for _ in range(warmups):
            gated_run(engine, workload, p, refs=refs, how=how)
        warmup_s = time.perf_counter() - t
        run = gated_run(engine, workload, p, refs=refs, how=how, replay=replayed if replay else None, ties=near_ties)
        run["warmup_s"] = warmup_s
        run["summary"] = run_summary(run["requests"], slos)
        runs.append(run)
    env = environment(BACKEND)
    env.update(engine.settings)
    if peers:
        engine.release()  # mlx-lm's caches need the memory the engine's took
    runs += run_peers(model, workload, token_ids, refs, peers, warmups=warmups, slos=slos, skip_idle=skip_idle)
    return {
        "schema": SCHEMA,
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": params
        or {
            "model": model.source.get("spec"),
            "chunk_size": chunk_size,
            "policies": policies,
            "peers": [peer_name(*p) for p in peers],
        },
        "workload": workload.to_dict(),
        "model": model.source,
        "prompts": {
            "tokenizer": next(iter(prompts.values())).tokenizer,
            "sha256": [p.sha256 for p in prompts.values()],
        },
        "slos": {k: asdict(s) for k, s in slos.items()},
        **({"slo_policy": slo} if slo else {}),
        "engine": {
            "capacity": capacity,
            "kv_cache_bytes": cache_bytes,
            "setup_s": setup_s,
            "warmups": warmups,
            **warm,
        },
        **({"workers": worker.workers} if worker is not None else {}),
        "gate": {
            "checks": "tokens, and in full on a replay" if replay else "tokens",  # module docstring
            "replay_requests": replay,
            "reference_s": reference_s,
            "near_tie_margin": NEAR_TIE_MARGIN,
            "near_ties": near_ties,
            "references": {name: refs[name].to_dict() for name in workload.names},
        },
        "environment": env,
        "sources": source_hashes(params_file),
        "runs": runs,
    }


def write_serving_report(path, report: dict):
    """The report through the one writer (atomic, never over an existing file; .gz compresses)."""
    if report.get("schema") != SCHEMA:
        raise ValueError(f"not a serving report: schema {report.get('schema')!r}")
    return write_report(path, report)


def serve_params_file(params_file, *, output=None, policies=None, peers=None) -> dict:
    """What `python -m pdlib serve --params FILE --output PATH` runs: the output path is claimed first (an
    existing one is refused before any work), then the run, then the report is written (nothing on failure).
    `policies`, `peers`: instead of the file's (--policies, --peers)."""
    if output is not None:
        output = claim_output(output)
    workload_params, params = load_serve_params(params_file, policies=policies, peers=peers)
    report = serve(workload_params, params, params_file=params_file)
    if output is not None:
        write_serving_report(output, report)
    return report


def serve(workload_params: dict, params: ServeParams, *, params_file=None, refs: dict | None = None) -> dict:
    """run_serving with a params file's values."""
    return run_serving(
        load_model(params.model),
        Workload.from_params(workload_params),
        policy=params.policies,
        chunk_size=params.chunk_size,
        slos=params.slos(),
        warmups=params.warmups,
        refs=refs,
        params={**params.to_dict(), "workload": workload_params},
        params_file=params_file,
        peers=params.peer_configs(),
        replay=params.replay_requests,
        pipeline=params.pipeline_decodes,
        decode_rounds=params.decode_rounds,
        skip_idle=params.skip_idle,
    )


def summary_table(report: dict) -> str:
    """One line per run: TTFT, TBT, TPOT, throughput, makespan, and its tokens: a policy's near-ties (gated), a
    peer's agreement with the reference (not gated); then the gate's time."""
    cols = ("ttft_p50_ms", "ttft_p90_ms", "tbt_p50_ms", "tbt_p99_ms", "tpot_p50_ms", "throughput_tok_s")
    width = max(8, *(len(run["policy"]) for run in report["runs"]))
    head = f"{'run':<{width}} {'steps':>6} " + " ".join(f"{c:>16}" for c in (*cols, "makespan_s")) + "  tokens"
    lines = [head]
    for run in report["runs"]:
        s = run["summary"]
        if run.get("peer"):
            agreed = sum(r["agreement"] for r in run["requests"])
            tokens = f"peer: {agreed}/{sum(r['output_tokens'] for r in run['requests'])} agree"
        else:
            tokens = f"gated: {sum(r['check']['status'] == 'near-tie' for r in run['requests'])} near-ties"
        vals = " ".join(f"{s[c]:>16.3f}" for c in cols)
        lines.append(
            f"{run['policy']:<{width}} {len(run['steps']['work']):>6} {vals} {run['makespan_ns'] / 1e9:>16.3f}  "
            f"{tokens}"
        )
    g, w = report["gate"], report["workload"]
    ref = "given" if g["reference_s"] is None else f"{g['reference_s']:.2f} s"
    lines.append(
        f"{w['requests']} requests over {w['duration_s']:.2f} s ({w['source']}); tokens gated against the FP32 "
        f"reference ({ref}), {len(g['near_ties'])} near-ties"
    )
    if any(run.get("peer") for run in report["runs"]):
        lines.append(f"peers ({SYSTEM}): timed, not gated; agree = leading tokens equal to the reference's")
    return "\n".join(lines)

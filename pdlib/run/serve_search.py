"""Capacity and goodput per policy and per peer: report.serving.search over the rate, one measured run per
(rate, rep), every run logged as it ends so a search resumes in a later command.

    report = search_params_file("params/serve-search-smoke-cpu.yaml", output="out/search.json", log="out/s.jsonl")
    print(search_table(report))                                 # search_report.py: what a search prints
    w = rep_workload(workload_params, rate=4.0, rep=1)          # the workload one point runs
    point = measure(bench, "mixed", 4.0, 1)     # {"summary", "gate", "warmups", "makespan_s", "wall_s"}

The rate and the reps: search_workload.py (rep_workload: the workload of one point; REP_RULE).

A measured point runs one policy (serve.serve_once, gated as `serve` gates: a token mismatch, or a failed check on
the replay of its steps, run on the first point of each policy and rate, stops the search in one line) or one peer
(peer.peer_once, timed, its agreement recorded) on that workload, and keeps report.serving.run_summary with both
SLOs' attainment, and the idle spans it skipped (`idle: skip`). The params' warmups run before a policy's (or
peer's) first point in a command only, at that rate or the search's start, the higher: with the matmuls compiled
first (serve.warm_engine), what a warmup compiles or allocates serves every later rate. What every point shares
is made once per search (`Bench`): the model, one Engine (the reps' largest capacity, as many caches as memory
holds, serve.py), each rep's prompts and FP32 references (once per rep and log), mlx-lm's models for the peers.

SLOs (report.serving.slos_from_step): strict and relaxed TBT/TPOT are 5x and 25x one decode step; TTFT is one
number for both. A `null` in `search.slo` is measured here (search_slo.calibrate: decode_ms at the median prompt,
ttft_ms TTFT_FACTOR times the p90 prompt's uncontended TTFT, Splitwise's P90 SLO), once: the log's header keeps it.

Searches: per run, per SLO (strict, relaxed) and per criterion (capacity: pooled P99 TBT and P90 TTFT within the
SLO, no request lost; goodput: >= 90% of requests meet TTFT and TPOT), report.serving.search over [lo, hi]. The
four searches of a run share one `known` cache of its summaries, seeded from the log (search_log.py), so no point
is measured twice; once all four have run, each is checked again for points contradicting a rep's bracket (a pass
above its failing rate, a fail below its passing one: report.serving.mark_not_monotone) that a later one measured.
A run whose rule has changed since some of a log's points (RULES: slo-mixed's budget; PEER_RULE: a peer's point
after the engine's memory is collected) keeps the rule in each point and search: the log's points made under
another rule are measured again (a peer's earlier points only where they ran out of memory). Each point keeps
where its run lost latency (report.serving_loss.run_loss), each result its `limit`: the failing point that bounds
it and why.
"""

import dataclasses
import gc
import math
import time
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx

from pdlib.batching import BATCH_POLICIES
from pdlib.config import peer_name
from pdlib.engine import Engine
from pdlib.engine.kernels import BACKEND
from pdlib.errors import InputError, checks_memory, out_of_memory
from pdlib.report.io import claim_output, environment, sha256_file, source_hashes, sources_hash, write_report
from pdlib.report.serving import (
    capacity_criterion,
    goodput_criterion,
    grid_rate,
    known_from_records,
    mark_not_monotone,
    run_summary,
    search,
    slos_from_step,
    start_rate,
)
from pdlib.report.serving_loss import limit_text, run_loss, search_limit
from pdlib.run import search_report
from pdlib.run.peer import peer_model, peer_once, record_agreement
from pdlib.run.reference import Reference
from pdlib.run.search_budget import Budget, BudgetSpent
from pdlib.run.search_log import SearchLog, utc_now
from pdlib.run.search_report import SCHEMA, SLO_NAMES, ci_text, memory_point, point_line, stderr_line, stopped_line
from pdlib.run.search_rules import Touched, counts_under, policy_rule, settings_note, usable_points
from pdlib.run.search_slo import TTFT_FACTOR, calibrate
from pdlib.run.search_starts import resolve_starts, start_key, start_rates, starts_from_report
from pdlib.run.search_workload import REP_RULE, rep_sample, rep_workload, warm_up
from pdlib.run.serve import gated_run, kv_cache_bytes, prefill_worker, remote_join, serving_capacity, warm_engine
from pdlib.run.serve_gate import kept_references, reference_sequences
from pdlib.run.serve_params import ServeParams, load_serve_params, search_settings
from pdlib.run.serve_replay import replay_gate
from pdlib.run.serve_replicas import resolve
from pdlib.run.serve_slo import kept_budget, slo_budget
from pdlib.weights import load_model
from pdlib.workload import Workload, iter_prompts

# ---- what every point shares ---------------------------------------------------------------------------------


class Bench:
    """What one search's points share (module docstring), each made on first use: a logged search loads nothing."""

    def __init__(self, workload_params: dict, params: ServeParams, reps: int):
        self.workload_params, self.params = workload_params, params
        self.samples = [rep_workload(workload_params, 1.0, r) for r in range(reps)]  # refuses a rep it can't make
        for p in params.policies:  # replicas for every rep's requests, or refused now
            resolve(p, min(w.n for w in self.samples))
        self.longest = max(self.samples, key=lambda w: int((w.prompt_tokens + w.output_tokens).max()))  # caches' size
        self.peers = {peer_name(*c): c for c in params.peer_configs()}
        self._model = self.engine = self.in_engine = self.worker = self.worker_key = None
        self.slos, self.prepared, self.peer_models = {}, {}, {}  # SLOs; reps' prompts and references; mlx-lm
        self.slo = None  # the slo policy's (record, budget), fitted once per log (serve_slo.py, slo_for)
        self.warm = None  # serve.warm_engine's record, once per command: compiled before any point is timed
        self.warmed, self.warm_rate = set(), 0.0  # warmed up in this command; warmups' lowest rate (measure)
        self.given_starts, self.starts = None, {}  # --start-from's report; each run's (search_starts.py)
        self.log = None  # the search's log: each rep's FP32 references are kept there (search_log.py)
        self.from_log = False  # a report of the log alone: no point is measured (search_params_file)
        self.references = {"computed": 0, "from_log": 0, "seconds": 0.0}  # reps' references, this command
        self.sources_hash, self.measured_with = None, {}  # this code's; and the code of each point a report uses
        self._reference, self.held_bytes = None, None  # device memory in use as the last point's run began
        self.during: dict = {}  # what the point being measured has run: its warmups, then its run (measure)

    @property
    def model(self):
        if self._model is None:
            self._model = load_model(self.params.model)
        return self._model

    def prepare(self, rep: int, w: Workload) -> dict:
        """rep's prompts and references, made once (its lengths are the same at every rate; keyed by them too): every
        rep's before the engine is made (engine_for)."""
        key = (rep, w.prompt_tokens.tobytes(), w.output_tokens.tobytes())
        if key not in self.prepared:
            serving_capacity(self.model, w)
            m = self.model
            made = list(iter_prompts(w, vocab_size=m.config.vocab_size, tokenizer=m.tokenizer))
            prompts = {p.name: p.token_ids for p in made}
            outputs = dict(zip(w.names, w.output_tokens.tolist()))
            logged = dict(rep=rep, model=m.source, prompts=[p.sha256 for p in made], outputs=list(outputs.values()))
            found = self.log.recall("references", logged) if self.log is not None else None
            if found is not None:
                refs = kept_references(found, outputs, where=f"search log {str(self.log.path)!r}")
                self.references["from_log"] += 1
            else:
                with checks_memory(f"rep {rep}'s FP32 references (the token gate's)"):
                    refs, seconds = reference_sequences(m, prompts, outputs)
                self.references["computed"] += 1
                self.references["seconds"] += seconds
                if self.log is not None:
                    self.log.keep("references", logged, {name: dataclasses.asdict(r) for name, r in refs.items()})
            self.prepared[key] = {"key": key, "prompts": prompts, "refs": refs}
        return self.prepared[key]

    def engine_for(self, prep: dict) -> Engine:
        """The one engine, holding `prep`'s requests (added again when the rep changes)."""
        if self.engine is None:
            for rep, w in enumerate(self.samples):  # every rep's references first: made beside the caches, rep 1's
                self.prepare(rep, w)  # ran out of memory on an H100 (50 GiB of caches)
            mx.clear_cache()  # what a peer's point left cached goes back before the engine's caches are made
            capacity, slots, _ = serving_capacity(self.model, self.longest)  # as many caches as memory holds
            self.engine = Engine(self.model, capacity=capacity, slots=slots)
            self.warm = warm_engine(self.engine, self.samples, self.params.chunk_size, self.params.policies)
        if self.in_engine != prep["key"]:
            self.engine.clear_requests(keep_caches=True)  # allocated, for the next rep's requests
            for name, ids in prep["prompts"].items():
                self.engine.add_request(name, ids, cached=False)
            self.in_engine = prep["key"]
        return self.engine

    def worker_for(self, prep: dict, policy: str):
        """disagg's prefill worker, set up with `prep`'s prompts (again when the rep changes), or None."""
        if BATCH_POLICIES[policy].remote_prefill != "worker":
            return None
        if self.worker_key != prep["key"]:
            self.worker, self.worker_key = prefill_worker(self.model, [policy], prep["prompts"]), prep["key"]
        return self.worker

    @property
    def reference(self) -> Reference:
        """The FP32 model the replays check against, made once (beside the engine's caches: the checks' memory)."""
        if self._reference is None:
            with checks_memory("the FP32 reference of the replays"):
                self._reference = Reference(self.model)
        return self._reference

    def replayed_at(self, policy: str, rate: float) -> bool:
        """Whether the log holds a point of `policy` at `rate` (any rep) whose steps were replayed: the full checks
        run on one step sequence per rate, the token gate on every point."""
        at = grid_rate(rate)
        recs = self.log.records if self.log is not None else ()
        return any(r["policy"] == policy and r["rate"] == at and "replay" in r.get("gate", {}) for r in recs)

    def slo_for(self, engine: Engine, w: Workload) -> tuple[dict, object]:
        """slo-mixed's (record, budget): fitted on the first point that needs it, kept in the log, so every point
        of the search, in any command, runs with the one fit."""
        if self.slo is None:
            chunk = self.params.chunk_size
            kept = self.log.recall("slo-fit", {"chunk_size": chunk}) if self.log is not None else None
            if kept is None:
                self.slo = slo_budget(engine, w, chunk_size=chunk, slos=self.slos)
                if self.log is not None:
                    self.log.keep("slo-fit", {"chunk_size": chunk}, self.slo[0])
            else:
                self.slo = kept_budget(kept, ceiling=chunk, where=f"search log {str(self.log.path)!r}")
        return self.slo

    def release_engine(self) -> None:
        """Before a peer's point: the engine's caches go (76 GiB on the code trace); a policy's point remakes it.
        Whatever a run left in reference cycles goes too (the engine's model, through its compiled methods)."""
        if self.engine is not None:
            self.engine.release()
            self.engine = self.in_engine = None
        gc.collect()
        mx.clear_cache()

    def peer_model(self, dtype: str):
        if dtype not in self.peer_models:
            self.peer_models[dtype] = peer_model(self.model, dtype)
        return self.peer_models[dtype]


def measure(bench: Bench, policy: str, rate: float, rep: int, admit=None) -> dict:
    """One point: `policy` (or a peer's name) on rep's workload at `rate`, after the params' warmups if it is the
    policy's first in this command; its summary (both SLOs' attainment), its gate (near-ties) or agreement (a
    peer), the warmups run first, makespan, wall time and `setup_s`, the part of it spent making what later points
    share (the model, the references, the engine's compiles, a fit). `admit(warmups)`, called once that is made
    and before any run, may refuse the point (search_budget.BudgetSpent)."""
    t, bench.held_bytes, bench.during = time.perf_counter(), None, {"out_of_memory_in": "its setup"}
    w = rep_workload(bench.workload_params, rate, rep)
    prep = bench.prepare(rep, w)
    refs, chunk = prep["refs"], bench.params.chunk_size
    warmups = 0 if policy in bench.warmed else bench.params.warmups
    warm_rate = max(rate, bench.warm_rate)  # a low rate's point warms up no longer than the start's
    w_warm = w if warm_rate == rate or not warmups else rep_workload(bench.workload_params, warm_rate, rep)
    if policy in bench.peers:
        dtype, step = bench.peers[policy]
        bench.release_engine()
        model = bench.peer_model(dtype)
    else:
        base = resolve(policy)[0]
        engine = bench.engine_for(prep)
        slo, budget = bench.slo_for(engine, w) if base == "slo-mixed" else (None, None)
        worker = bench.worker_for(prep, base)
    setup_s = time.perf_counter() - t
    bench.held_bytes = mx.get_active_memory()  # as the point's runs begin: models, references, caches
    mx.reset_peak_memory()  # an out-of-memory point's peak is its own (each run resets it again)
    if admit is not None:
        admit(warmups)
    bench.warmed.add(policy)
    bench.during = {"warmups": warmups, "warmup_rate": warm_rate, "out_of_memory_in": "a warmup"}  # a failure's
    if policy in bench.peers:
        how = dict(dtype=dtype, prefill_step_size=step, skip_idle=bench.params.skip_idle)

        def fall_back():  # a warmup above the point's rate ran out of memory: the rest at its rate
            bench.release_engine()
            bench.during["warmup_rate"] = rate

        warm_up(lambda x: peer_once(model, x, prep["prompts"], **how), warmups, w_warm, w, release=fall_back)
        warm_rate = bench.during["warmup_rate"]  # what the last warmup ran at
        bench.during["out_of_memory_in"] = "its run"
        run = peer_once(model, w, prep["prompts"], **how)
        record_agreement(run, refs)
        rs = run["requests"]
        check = {
            "peer": True,
            "agreement": sum(r["agreement"] for r in rs),
            "tokens": sum(r["output_tokens"] for r in rs),
            "lost": sum(bool(r.get("lost")) for r in rs),
        }
    else:
        how = dict(pipeline=bench.params.pipeline_decodes, decode_rounds=bench.params.decode_rounds, worker=worker)
        how.update(chunk_size=chunk, budget=budget, skip_idle=bench.params.skip_idle)
        check = {"checks": "tokens", "near_ties": []}

        def replayed(run: dict) -> dict:  # each point's own steps, replayed with the full checks
            check["checks"] = "tokens, and in full on a replay"
            return replay_gate(
                engine,
                bench.model,
                run,
                prep["prompts"],
                sample=bench.params.replay_requests,
                seed=rep,
                reference=bench.reference,
                join=remote_join(worker),
            )

        for _ in range(warmups):
            gated_run(engine, w_warm, policy, refs=refs, how=how)
        bench.during["out_of_memory_in"] = "its run"
        replay = replayed if bench.params.replay_requests and not bench.replayed_at(policy, rate) else None
        run = gated_run(engine, w, policy, refs=refs, how=how, replay=replay, ties=check["near_ties"])
        if "replay" in run:
            check["replay"] = run["replay"]
        if slo is not None:  # fitted once per log: each point says with what, and what its run learned
            check["slo_policy"] = slo
            check["slo_loop_ms"] = run.get("slo_loop", {}).get("loop_ms")
    summary = run_summary(run["requests"], bench.slos)
    kv_bytes = kv_cache_bytes(bench.model, requests=1, capacity=1)  # FP32 K and V a position; a bf16 peer's half
    if policy in bench.peers and dtype == "bf16":
        kv_bytes //= 2
    return {
        "summary": summary,
        "loss": run_loss(run, bench.slos, kv_bytes_per_position=kv_bytes) | {"held_gib": bench.held_bytes / 2**30},
        "gate": check,
        "warmups": warmups,
        "warmup_rate": warm_rate,
        "makespan_s": run["makespan_ns"] / 1e9,
        "skipped_s": run["skipped_ns"] / 1e9,
        "wall_s": time.perf_counter() - t,
        "setup_s": setup_s,
    }


# ---- the searches --------------------------------------------------------------------------------------------


def search_identity(workload_params: dict, params: ServeParams, settings: dict) -> dict:
    """What decides a point's numbers and how it was checked (search_log.py): a log made otherwise is refused."""
    env = environment(BACKEND)
    return {
        "model": params.model,
        "workload": {k: v for k, v in workload_params.items() if k not in ("rate", "rate_multiplier")},
        "chunk_size": params.chunk_size,
        "warmups": params.warmups,
        "replay_requests": params.replay_requests,
        "pipeline_decodes": params.pipeline_decodes,
        "decode_rounds": params.decode_rounds,
        "idle": params.idle,
        "slo": settings["slo"],
        "rep_rule": REP_RULE,
        "machine": {k: env.get(k) for k in ("backend", "device_name", "mlx", "mlx_lm", "settings")},
    }


def _run_searches(bench: Bench, name: str, peer: bool, settings: dict, budget: Budget, counts: dict, note, out):
    """One run's (policy or peer) searches, per SLO and criterion, on one `known` cache seeded from the log, each
    appended to `out` as it finishes; each new point admitted by the budget, appended to the log as it ends."""
    lg = bench.log
    rule = policy_rule(name)
    began = bench.starts.get(name)  # {"from": a report, "starts"}, or None: the params' start
    mine = usable_points(lg.records, name, note, from_log=bench.from_log)
    known = Touched(known_from_records(mine))
    records = {(grid_rate(r["rate"]), int(r["rep"])): r for r in mine}  # the points, for what bounds a search
    logged = set(records)

    def measured(rate, rep):
        if budget.stopped is not None:  # after the point where the budget stopped, none is prepared
            raise BudgetSpent(name, rate, rep, math.nan, budget.left())
        if bench.from_log:  # measuring nothing: a point not in the log is where the report stops
            raise BudgetSpent(name, rate, rep, math.nan, 0.0, reason="not in the log")
        t, oom = time.perf_counter(), None
        try:
            point = measure(bench, name, rate, rep, admit=lambda w: budget.admit(name, rate, rep, warmups=w))
            budget.record(rate, rep, point)
        except RuntimeError as e:  # the run's memory, not the search's failure: the point fails, named so
            if not out_of_memory(e):
                raise
            oom = (str(e), bench.held_bytes, mx.get_peak_memory())
        if oom is not None:  # released outside the except: its traceback holds the failed run's frames
            bench.release_engine()  # a policy's run stopped midway: the next point makes the engine again
            error, held, peak = oom
            wall_s = time.perf_counter() - t
            point = memory_point(error, bench.slos, requests=bench.samples[rep].n, wall_s=wall_s, held=held, peak=peak)
            point |= bench.during  # the warmups before it, and whether one of them or its run ran out
        record = {"policy": name, "rate": grid_rate(rate), "rep": rep, **point, "created_utc": utc_now()}
        record["sources_hash"] = bench.sources_hash  # what measured it: a report from the log names each
        if rule is not None:
            record["rule"] = rule
        lg.append(record)
        records[grid_rate(rate), rep] = record
        counts["measured"] += 1
        note(point_line(name, rate, rep, point))
        return point["summary"]

    first, judged = len(out), []  # judged: this run's searches, each with its criterion
    try:
        for slo_name in SLO_NAMES:
            for criterion in settings["criteria"]:
                entry = began["starts"].get(start_key(slo_name, criterion)) if began else None
                make = capacity_criterion if criterion == "capacity" else goodput_criterion
                meets = make(bench.slos[slo_name])
                result = search(
                    measured,
                    meets=meets,
                    **{k: settings[k] for k in ("lo", "hi", "reps", "precision", "max_per_rep", "floor")},
                    start=settings["start"] if entry is None else start_rates(entry, settings),
                    near=entry is not None,
                    known=known,
                )
                result["limit"] = search_limit(result, meets, bench.slos[slo_name], records)
                listed = {"policy": name, "peer": peer, "slo": slo_name, "criterion": criterion, "result": result}
                listed |= {"start_from": began["from"]} if entry is not None else {}
                out.append({**listed, "rule": rule} if rule is not None else listed)
                judged.append((out[-1], meets))
                lost = limit_text(result["limit"])
                note(f"{name}: {criterion} at the {slo_name} SLO: {result['text']} ({ci_text(result)}); {lost}")
        for listed, meets in judged:  # a point a later search measured, seen as a re-composition sees it
            was, listed["result"] = listed["result"], mark_not_monotone(listed["result"], known, meets)
            if listed["result"]["not_monotone"] != was["not_monotone"]:
                note(f"{name}: {listed['criterion']} at the {listed['slo']} SLO: {listed['result']['text']}")
    finally:  # the searches finished, also where the budget stopped the next
        search_report.tally_sources(out[first:], records, bench.measured_with)
        counts["reused"] += len(known.touched & logged)  # the log's points a search went through


def search_params_file(
    params_file,
    *,
    output=None,
    log,
    note=None,
    policies=None,
    peers=None,
    budget_s: float | None = None,
    from_log: bool = False,
    start_from=None,
) -> dict:
    """What `python -m pdlib serve --params FILE --search --output OUT --log LOG` runs: per policy and peer, per SLO
    and criterion, the rate search (module docstring); every measured point appended to `log` as it ends (made, or
    resumed); the report (schema pdlib.serve-search/1) written to `output` (claimed first: an existing one is
    refused before any work) and returned. `note`: where a line per point goes (stderr by default). `policies`,
    `peers`: instead of the file's (--policies, --peers; a log may be resumed with others). `budget_s`
    (--budget-s): no point starts that is not expected to end within it (search_budget.py); the report then
    holds the searches finished (later runs' too, where the log completes them) and says where it `stopped`.
    `from_log` (--from-log): measure nothing, on any machine; the report of the searches the log completes,
    with the log's machine and switches as its environment. `start_from` (--start-from): a search report whose
    values are where each run's searches begin (search_starts.py)."""
    t_start = time.perf_counter()
    budget = Budget(budget_s)  # its clock starts with the command; a bad value is refused before any work
    if from_log and budget_s is not None:
        raise InputError(f"--from-log measures nothing: drop --budget-s {budget_s:g}")
    if from_log and start_from is not None:
        raise InputError(f"--from-log takes each run's starts from the log: drop --start-from {start_from}")
    if from_log and not (Path(log).is_file() and Path(log).stat().st_size):
        raise InputError(f"--from-log: no search log at {str(log)!r} (a search command with --log makes one)")
    note = note or stderr_line
    if output is not None:
        output = claim_output(output)
    workload_params, params = load_serve_params(params_file, policies=policies, peers=peers)
    settings = params.search if params.search is not None else search_settings({})
    bench = Bench(workload_params, params, settings["reps"])
    bench.given_starts = None if start_from is None else starts_from_report(start_from)
    bench.warm_rate = budget.warm_rate = start_rate(settings["lo"], settings["hi"], settings["start"])
    bench.sources_hash = sources_hash(sources := source_hashes(params_file))
    budget.spans = [w.duration_s for w in bench.samples]
    budget.gaps = [w.arrival_s[1:] - w.arrival_s[:-1] for w in bench.samples] if params.skip_idle else None
    runs = [(p, False) for p in params.policies] + [(name, True) for name in bench.peers]
    identity = search_identity(workload_params, params, settings)
    with SearchLog(log, identity, note=note, any_machine=from_log) as lg:
        bench.log, bench.from_log = lg, from_log
        logged, cut = len(lg.records), lg.cut
        if lg.header is None:
            given, calib = settings["slo"], None
            if given["decode_ms"] is None or given["ttft_ms"] is None:
                calib = calibrate(bench.model, bench.samples[0], chunk_size=params.chunk_size)
                bench.release_engine()  # the calibration's engine (its model in cycles) goes before the search's
            slo = {
                "decode_ms": calib["decode_ms"] if given["decode_ms"] is None else given["decode_ms"],
                "ttft_ms": TTFT_FACTOR * calib["prefill_ms"] if given["ttft_ms"] is None else given["ttft_ms"],
                "measured": [k for k in ("decode_ms", "ttft_ms") if given[k] is None],
            }
            fields = {"params_file_sha256": sha256_file(params_file), "search": settings, "slo": slo}
            lg.start({**fields, "calibration": calib})
        header = lg.header
        settings_note(header, settings, note)
        slos = slos_from_step(header["slo"]["decode_ms"], header["slo"]["ttft_ms"])
        bench.slos = slos
        measured = {r["policy"] for r in lg.records if counts_under(policy_rule(r["policy"]), r)}
        names = [name for name, _ in runs]
        bench.starts = resolve_starts(lg, names, bench.given_starts, from_log=from_log, measured=measured)
        if bench.given_starts is not None and (lacks := [n for n in names if n not in bench.given_starts["runs"]]):
            note(f"--start-from {start_from}: no starts for {', '.join(lacks)}; they begin where the params say")
        counts, searches = {"measured": 0, "reused": 0}, []
        for name, peer in runs:
            try:
                _run_searches(bench, name, peer, settings, budget, counts, note, searches)
            except BudgetSpent as spent:
                if budget.stopped is None:  # the first refused point is where it stopped
                    budget.stopped = spent.record
                    note(stopped_line({"stopped": spent.record}))
        points, refs = len(lg.records), lg.kept_keys("references")  # keyed by the model: which weights, unloaded
    asked = bench.given_starts["from"] if bench.given_starts is not None else None
    report = {
        "schema": SCHEMA,
        "created_utc": utc_now(),
        "params": {**params.to_dict(), "workload": workload_params, "search": settings},
        "model": bench._model.source if bench._model is not None else refs[0]["model"] if refs else None,
        "workload": bench.samples[0].to_dict(),  # at rate 1
        "rep_rule": REP_RULE,
        "reps": [
            {"rep": r, **rep_sample(workload_params, r), "requests": w.n, "duration_s": w.duration_s}
            for r, w in enumerate(bench.samples)
        ],
        "slos": {k: asdict(s) for k, s in slos.items()},
        "decode_step_ms": header["slo"]["decode_ms"],
        "slo_measured": header["slo"]["measured"],
        "calibration": header.get("calibration"),
        "searches": searches,
        "stopped": budget.stopped,  # under --budget-s: the point it did not start (None: every search finished)
        "budget": budget.to_dict(),
        "measurements": {
            "new": counts["measured"],
            "reused": counts["reused"],
            "from_log": logged,
            "in_log": points,
            "cut_bytes": cut,
        },
        "log": {"path": str(log), "created_utc": header["created_utc"]},
        "wall_s": time.perf_counter() - t_start,
        "warm": bench.warm,
        "references": bench.references,
        "environment": search_report.log_environment(lg.identity["machine"]) if from_log else environment(BACKEND),
        "from_log": from_log,
        "start_from": asked if any(s.get("start_from") == asked for s in searches) else None,  # this command's
        "measured_with": bench.measured_with,  # sources hash -> the report's points measured by that code
        "sources": sources,
    }
    if output is not None:
        write_report(output, report)
    return report

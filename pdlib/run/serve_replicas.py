"""A serving policy as K data-parallel replicas: K independent servers, one GPU each, the requests dealt to them in
arrival order (request i to replica i mod K), as a load balancer in front of them would. It is the baseline a
two-GPU disagg is weighed against: the best single-GPU policy, twice.

    run = serve_replicated(workload, "mixed", replicas=2, serve=lambda w: serve_once(engine, w, "mixed", ...),
                           check=gate_and_replay)

The replicas share nothing, so each request's latencies are what its own server gives it; here the replicas run
one after another on this engine, each on its own requests at their own arrival times, and their records are
merged onto the one clock (each replica's clock starts at its first request's arrival). That assumes identical
GPUs and ignores the host they would share (separate processes, each with its own cores on a two-GPU host).
`check(sub_run)` gates each replica's run before the next starts (tokens, and the replay of its own steps).

The merged run is named `<policy>-x<K>` and carries `replicas`, `replica_of`, each request's `replica`, the
step log of every replica one after another with each step's `replica` (the analysis keeps a request's gaps to
its own replica's steps), each replica's `makespan_ns` and the largest as the run's.
"""

import numpy as np

from pdlib.batching import BATCH_POLICIES
from pdlib.errors import InputError
from pdlib.workload import Workload

SUFFIX = "-x"


def replicated_name(policy: str, replicas: int) -> str:
    return f"{policy}{SUFFIX}{replicas}"


def parse_replicated(name: str) -> tuple[str, int] | None:
    """(policy, replicas) of a `<policy>-x<K>` name, else None."""
    policy, sep, k = name.rpartition(SUFFIX)
    canonical = k.isascii() and k.isdigit() and k == str(int(k))  # "2", not "02" (the run is named by int(k))
    return (policy, int(k)) if sep and policy and canonical and int(k) >= 2 else None


def resolve(name: str, requests: int | None = None) -> tuple[str, int]:
    """(policy, replicas) of a serving run's name, a policy (one server) or `<policy>-x<K>`, or InputError; with
    `requests`, a K over them too (each replica needs one)."""
    policy, k = parse_replicated(name) or (name, 1)
    if policy not in BATCH_POLICIES:
        raise InputError(
            f"unknown serving policy {name!r}; expected one of: {', '.join(BATCH_POLICIES)} (or <policy>-x<K>: "
            f"K >= 2 replicas of it)"
        )
    if k > 1 and BATCH_POLICIES[policy].remote_prefill == "worker":
        raise InputError(f"serving policy {name!r}: {policy} already takes two GPUs; replicas of it are not built")
    if requests is not None and k > requests:
        raise InputError(f"serving policy {name!r}: {k} replicas for {requests} requests; each needs one")
    return policy, k


def deal(workload: Workload, replicas: int) -> list[tuple[Workload, int]]:
    """Each replica's requests (i mod K), as a workload whose clock starts at its first arrival, and that offset."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 2 <= replicas <= workload.n:
        raise InputError(
            f"replicas must be a whole number from 2 to the workload's {workload.n} requests, got {replicas!r}"
        )
    out = []
    for k in range(replicas):
        idx = np.arange(k, workload.n, replicas)
        offset = int(workload.arrival_ns[idx[0]])
        sub = Workload(
            workload.source,
            workload.arrival_ns[idx] - offset,
            workload.prompt_tokens[idx],
            workload.output_tokens[idx],
            names=tuple(workload.names[i] for i in idx),
            prompt_rule=workload.prompt_rule,
        )
        out.append((sub, offset))
    return out


def serve_replicated(workload: Workload, policy: str, *, replicas: int, serve, check=None) -> dict:
    """`policy` as `replicas` servers on `workload` (module docstring): `serve(sub_workload)` runs one replica's
    requests (serve.serve_once on the engine), `check(run)` gates it."""
    subs = []
    for sub, offset in deal(workload, replicas):
        run = serve(sub)
        if check is not None:
            check(run)
        subs.append((run, offset))
    return merged(workload, policy, subs)


def _shifted(values: list[int], offset: int) -> list[int]:
    return [v + offset for v in values]


def merged(workload: Workload, policy: str, subs: list[tuple[dict, int]]) -> dict:
    """One run of the replicas' runs, on the workload's clock."""
    by_name, makespans = {}, []
    steps = {"work": [], "t_start_ns": [], "t_issued_ns": [], "t_end_ns": [], "replica": []}
    joins, sliced = [], []
    for k, (run, offset) in enumerate(subs):
        for r in run["requests"]:
            r = dict(r, replica=k, arrival_ns=r["arrival_ns"] + offset, admitted_ns=r["admitted_ns"] + offset)
            r["emit_ns"] = _shifted(r["emit_ns"], offset)
            by_name[r["name"]] = r
        s, base = run["steps"], len(steps["work"])
        steps["work"] += s["work"]
        steps["t_start_ns"] += _shifted(s["t_start_ns"], offset)
        steps["t_issued_ns"] += _shifted(s["t_issued_ns"], offset)
        steps["t_end_ns"] += _shifted(s["t_end_ns"], offset)
        steps["replica"] += [k] * len(s["work"])
        joins += [base + i for i in s.get("joins", ())]
        sliced += [base + i for i in s.get("sliced", ())]
        makespans.append(run["makespan_ns"] + offset)
    if any("joins" in run["steps"] for run, _ in subs):
        steps["joins"] = joins
    if any("sliced" in run["steps"] for run, _ in subs):
        steps["sliced"] = sliced
    out = {
        "policy": replicated_name(policy, len(subs)),
        "replica_of": policy,
        "replicas": len(subs),
        "requests": [by_name[name] for name in workload.names],
        "steps": steps,
        "idle_ns": sum(run["idle_ns"] for run, _ in subs),  # every replica's waits for arrivals, summed
        "skipped_ns": sum(run["skipped_ns"] for run, _ in subs),  # and the idle spans they skipped
        "replica_makespan_ns": makespans,
        "makespan_ns": max(makespans),
        "peak_memory_bytes": max(run["peak_memory_bytes"] for run, _ in subs),  # one replica's (each alone on its GPU)
    }
    loops = [run["slo_loop"] for run, _ in subs if "slo_loop" in run]
    if loops:  # what each replica's slo-mixed learned, in replica order
        out["slo_loop"] = {k: [loop[k] for loop in loops] for k in ("loop_ms", "overruns")}
    replays = [run["replay"] for run, _ in subs if "replay" in run]
    if replays:
        out["replay"] = {
            "passed": all(r["passed"] for r in replays),
            "requests": [name for r in replays for name in r["requests"]],
            "seconds": sum(r["seconds"] for r in replays),
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in replays),  # one replay's, as the runs'
            "replicas": replays,
        }
    return out


__all__ = ["deal", "merged", "parse_replicated", "replicated_name", "resolve", "serve_replicated"]

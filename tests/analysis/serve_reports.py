"""Small hand-made serving reports (schema pdlib.serve/1) for tests: give each run's steps, get a valid report.

    from serve_reports import make_serve_report, synthetic_searches
    report = make_serve_report()                    # REQUESTS under chunked and fifo, and an mlx-lm peer
    report = make_serve_report(peer=False, slos=slos_from_step(2.0, 30.0))

A run is its steps [(t_start_ms, t_end_ms, [(request, prompt tokens or None), ...])]: a decode part emits a token
at the step's end, and so does the prompt part that completes its request's prompt, so the emits follow from the
steps. The schedules are plausible, not any policy's exact choices; the numbers they give are worked out in
test_serving_analysis.py.
"""

import math
from dataclasses import asdict

from pdlib.report.serving import capacity_criterion, goodput_criterion, run_summary, search
from pdlib.report.serving_loss import search_limit

MS = 1_000_000
REQUESTS = {"r0": (0, 64, 4), "r1": (10, 64, 3), "r2": (20, 32, 2)}  # name: arrival ms, prompt tokens, outputs
D = None  # a decode part
CHUNKED = [
    (0, 10, [("r0", 32)]),
    (10, 20, [("r0", 32)]),  # r0's first token at 20
    (20, 22, [("r0", D)]),
    (22, 32, [("r1", 32)]),
    (32, 34, [("r0", D)]),  # r0 waited 12 ms, across r1's chunk
    (34, 44, [("r1", 32)]),  # r1's first token at 44
    (44, 46, [("r0", D), ("r1", D)]),
    (46, 56, [("r2", 32)]),  # r2's first token at 56
    (56, 58, [("r1", D), ("r2", D)]),
]
FIFO = [
    (0, 10, [("r0", 32)]),
    (10, 20, [("r0", 32)]),
    (20, 22, [("r0", D)]),
    (22, 24, [("r0", D)]),
    (24, 26, [("r0", D)]),
    (26, 36, [("r1", 32)]),
    (36, 46, [("r1", 32)]),
    (46, 48, [("r1", D)]),
    (48, 50, [("r1", D)]),
    (50, 60, [("r2", 32)]),
    (60, 62, [("r2", D)]),
]
PEER = [  # mlx-lm-fp32@64: every prompt in one pass
    (0, 15, [("r0", 64)]),
    (15, 17, [("r0", D)]),
    (17, 31, [("r0", D), ("r1", 64)]),
    (31, 41, [("r0", D), ("r1", D), ("r2", 32)]),
    (41, 43, [("r1", D), ("r2", D)]),
]
PEER_AGREEMENT = {"r1": 2}  # r1's third output differs from the reference's


def make_run(policy, steps, requests=REQUESTS, *, peer=False, agreement=None, slos=None) -> dict:
    prompt_done = dict.fromkeys(requests, 0)
    emits = {name: [] for name in requests}
    for _, t1, parts in steps:
        for name, n in parts:
            if n is not None:
                prompt_done[name] += n
            if n is None or prompt_done[name] == requests[name][1]:
                emits[name].append(t1 * MS)
    reqs = []
    for i, (name, (arrival, prompt, output)) in enumerate(requests.items()):
        assert len(emits[name]) == output, (policy, name, emits[name])
        r = {
            "name": name,
            "arrival_ns": arrival * MS,
            "admitted_ns": arrival * MS + 1_000,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "emit_ns": emits[name],
            "output_ids": [(37 * i + 7 * k) % 500 for k in range(output)],
        }
        if peer:
            r["agreement"] = (agreement or {}).get(name, output)
        else:
            r["check"] = {"status": "ok", "checked": output}
        reqs.append(r)
    run = {
        "policy": policy,
        "requests": reqs,
        "steps": {
            "work": [[[name, n] for name, n in parts] for _, _, parts in steps],
            "t_start_ns": [t0 * MS for t0, _, _ in steps],
            "t_end_ns": [t1 * MS for _, t1, _ in steps],
        },
        "idle_ns": 0,
        "makespan_ns": steps[-1][1] * MS,
        "warmup_s": 0.0,
    }
    if peer:
        dtype, size = policy.removeprefix("mlx-lm-").split("@")
        run.update(peer=True, system="mlx-lm BatchGenerator", dtype=dtype, prefill_step_size=int(size))
        run["batch_sizes"] = {"completion": len(reqs), "prefill": len(reqs)}
    run["summary"] = run_summary([r for r in reqs if r["emit_ns"]], slos or {})
    return run


def make_serve_report(*, peer: bool = True, slos=None) -> dict:
    runs = [make_run("chunked", CHUNKED, slos=slos), make_run("fifo", FIFO, slos=slos)]
    if peer:
        runs.append(make_run("mlx-lm-fp32@64", PEER, peer=True, agreement=PEER_AGREEMENT, slos=slos))
    n = len(REQUESTS)
    return {
        "schema": "pdlib.serve/1",
        "created_utc": "2025-01-01T00:00:00Z",
        "params": {"model": "synthetic:tiny", "chunk_size": 32, "policies": ["chunked", "fifo"], "warmups": 0},
        "workload": {"source": "hand-made", "requests": n, "duration_s": 0.02, "prompt_rule": "hashed"},
        "model": {"spec": "synthetic:tiny@0", "source": "synthetic", "seed": 0, "preset": "tiny"},
        "prompts": {"tokenizer": "bytes", "sha256": ["0" * 64] * n},
        "slos": {k: asdict(s) for k, s in (slos or {}).items()},
        "engine": {"capacity": 68, "kv_cache_bytes": 1, "setup_s": 0.0, "warmups": 0},
        "gate": {"checks": "tokens", "reference_s": 0.1, "near_tie_margin": 0.002, "near_ties": [], "references": {}},
        "environment": {"device": "cpu", "device_name": "test CPU", "backend": "cpu", "mlx": "0"},
        "sources": {},
        "runs": runs,
    }


def fake_measure(scale: float):
    """A run's summary at a rate multiplier: latencies grow linearly with the rate (and a little with the rep),
    the share meeting the strict SLO falls; scale > 1 is a slower system."""

    def measure(rate, rep):
        k = rate * scale * (1 + 0.02 * rep)
        return {
            "tbt_p99_ms": 5.0 * k,
            "ttft_p90_ms": 40.0 * k,
            "n_lost": 0,
            "attain_strict": max(0.0, min(1.0, 1.2 - 0.1 * k)),
        }

    return measure


def fake_loss(rate: float, scale: float, name: str) -> dict:
    """A point's run_loss (report.serving_loss) at that rate: more gaps over the bound, most with a prompt."""
    k = rate * scale
    return {
        "prompt_steps_share": 0.5,
        "decode_steps_share": 0.3,
        "no_step_share": 0.2,
        "waiting_share": 0.1,
        "host_share": 0.25,
        f"tbt_over_{name}": int(10 * k),
        f"tbt_over_{name}_prompt": int(8 * k),
        f"ttft_over_{name}": int(2 * k),
        f"ttft_over_{name}_wait_share": 0.75,
        f"tpot_over_{name}": 0,
        f"tpot_over_{name}_prompt_share": math.nan,
        "peak_requests": 6,
        "peak_positions": 600,
    }


def synthetic_searches(slo, scales=(("chunked", 1.0), ("mlx-lm fp32 @64", 1.5)), *, reps: int = 3) -> dict:
    """{run label: [capacity search, goodput search]} of report.serving.search on fake_measure, sharing points,
    each with its limit (report.serving_loss.search_limit) from fake_loss."""
    out = {}
    for label, scale in scales:
        known, points, fake = {}, {}, fake_measure(scale)

        def measure(rate, rep, fake=fake, points=points, scale=scale):
            summary = fake(rate, rep)
            points[rate, rep] = {"summary": summary, "loss": fake_loss(rate, scale, slo.name)}
            return summary

        out[label] = []
        for crit in (capacity_criterion, goodput_criterion):
            result = search(measure, meets=crit(slo), lo=0.1, hi=64.0, reps=reps, known=known)
            result["limit"] = search_limit(result, crit(slo), slo, points)
            out[label].append(result)
    return out

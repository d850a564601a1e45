"""Small hand-made schema-1 reports for tests: give emission times (ns since t0), get a valid report.

    from reports import make_report, ms
    report = make_report(policies=("eager", "chunked"), trials=2,
                         a_emits=ms(2500, 2520), b_emits=ms(2400, 2510, 2530))

a_emits / b_emits may be one list (every trial), a dict {policy: list}, or a callable
(policy, trial) -> list. Every policy passed its gate and every trial's output ids equal reference_tokens.
Events are plausible, not a faithful schedule: B's reset at t0, B's prefill chunks spread over [t0, B's
first emission), and one decode ending at every later emission.
"""

import math

from pdlib.report.schema import REQUESTS, SCHEMA

MS = 1_000_000
DEFAULT_A = (2500, 2520, 2540, 2560)  # ms: one 2.5 s resumption gap, then 20 ms gaps
DEFAULT_B = (2400, 2510, 2530, 2550, 2570)  # ms: B's TTFT 2.4 s


def ms(*values) -> list:
    """Milliseconds -> integer ns."""
    return [round(v * MS) for v in values]


def _pick(spec, policy, trial):
    if callable(spec):
        return list(spec(policy, trial))
    if isinstance(spec, dict):
        return list(spec[policy])
    return list(spec)


def _ids(n, base):
    return [(base + 7 * i) % 1000 for i in range(n)]


def _events(a, b, *, prompt_tokens, chunk_size):
    events = [dict(kind="reset", req="B", start=0, stop=0, t_start_ns=0, t_end_ns=1_000)]
    n_chunks = math.ceil(prompt_tokens / chunk_size)
    span = max(b[0] - 1_000, n_chunks)
    for k in range(n_chunks):
        t0, t1 = 1_000 + k * span // n_chunks, 1_000 + (k + 1) * span // n_chunks
        events.append(
            dict(
                kind="prefill",
                req="B",
                start=k * chunk_size,
                stop=min((k + 1) * chunk_size, prompt_tokens),
                t_start_ns=t0,
                t_end_ns=t1,
            )
        )
    # A's timed token i writes the cache at prompt + i; B's token i >= 1 at prompt + i - 1.
    for name, emits in (("A", a), ("B", b[1:])):
        for i, e in enumerate(emits):
            events.append(
                dict(
                    kind="decode",
                    req=name,
                    start=prompt_tokens + i,
                    stop=prompt_tokens + i + 1,
                    t_start_ns=max(e - 500_000, 0),
                    t_end_ns=e,
                )
            )
    return sorted(events, key=lambda ev: ev["t_start_ns"])


def _order(policies, trial):
    return list(policies) if trial % 2 else list(reversed(policies))


def make_report(
    *, policies=("eager", "chunked"), trials=1, a_emits=None, b_emits=None, prompt_tokens=256, chunk_size=64
) -> dict:
    """A valid report; trial t runs the policies in order, reversed on even trials (as the runner
    alternates them), and trials are listed in run order."""
    a_emits = ms(*DEFAULT_A) if a_emits is None else a_emits
    b_emits = ms(*DEFAULT_B) if b_emits is None else b_emits
    order = [(t, pos, policy) for t in range(1, trials + 1) for pos, policy in enumerate(_order(policies, t))]
    emits = {(t, policy): (_pick(a_emits, policy, t), _pick(b_emits, policy, t)) for t, _, policy in order}
    # Every trial's outputs equal the reference, as a real report's do: a trial given fewer emissions than
    # the longest has the rest as untimed outputs ahead of its timed ones.
    reference = {
        "A": _ids(max(len(a) for a, _ in emits.values()) + 1, 11),
        "B": _ids(max(len(b) for _, b in emits.values()), 500),
    }
    runs = []
    for t, pos, policy in order:
        a, b = emits[t, policy]
        runs.append(
            {
                "policy": policy,
                "trial": t,
                "position": pos,
                "makespan_ns": max(a[-1], b[-1]),
                "requests": {
                    r: {"output_ids": list(reference[r]), "timed_from": len(reference[r]) - len(e), "emit_ns": e}
                    for r, e in (("A", a), ("B", b))
                },
                "events": _events(a, b, prompt_tokens=prompt_tokens, chunk_size=chunk_size),
            }
        )
    return {
        "schema": SCHEMA,
        "created_utc": "2026-01-01T00:00:00Z",
        "params": {
            "prompt_tokens": prompt_tokens,
            "output_tokens": len(reference["B"]),
            "chunk_size": chunk_size,
            "policies": list(policies),
            "trials": trials,
            "warmups": 0,
            "stall_threshold_ms": 100.0,
            "seed": 0,
        },
        "model": {
            "spec": "synthetic:tiny@0",
            "source": "synthetic",
            "preset": "tiny",
            "seed": 0,
            "path": None,
            "revision": None,
            "config": {},
        },
        "prompts": {r: {"tokens": prompt_tokens, "sha256": "0" * 64, "tokenizer": "bytes"} for r in REQUESTS},
        "environment": {
            "device": "cpu",
            "device_name": "test",
            "backend": "cpu",
            "mlx": "0",
            "mlx_lm": "0",
            "python": "3",
            "platform": "test",
            "git_commit": None,
        },
        "sources": {},
        "validation": {p: {"passed": True, "tokens": {r: list(ids) for r, ids in reference.items()}} for p in policies},
        "reference_tokens": {r: list(ids) for r, ids in reference.items()},
        "trials": runs,
    }

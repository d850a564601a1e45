"""Per-trial metrics from one report trial record, in numpy only (the CLI summary on a GPU box needs no
pandas); `analysis.py` builds its frames from the same function.

    m = trial_metrics(report["trials"][0], stall_threshold_ms=100.0)
    m["a_gap_max_ms"], m["b_ttft_ms"], m["makespan_ms"]

Gaps are differenced in integer ns and converted once, so a gap of exactly the threshold never turns into a
stall through rounding. Percentiles are numpy's default linear interpolation.
"""

import numpy as np

from pdlib.text import text_table

NS_PER_MS = 1e6


def _overlaps(prev, emit, lo, hi):
    # A gap [prev, emit] meets [lo, hi] when they share a stretch of positive length; touching ends don't.
    return (prev < hi) & (emit > lo)


def _max_ms(gaps):
    return gaps.max() / NS_PER_MS if gaps.size else np.nan


def trial_metrics(t: dict, *, stall_threshold_ms: float = 100.0) -> dict:
    threshold_ns = stall_threshold_ms * NS_PER_MS
    a = np.asarray(t["requests"]["A"]["emit_ns"], dtype=np.int64)
    b = np.asarray(t["requests"]["B"]["emit_ns"], dtype=np.int64)
    gap = np.diff(a, prepend=0)  # A's first gap runs from t0: its initial resumption gap
    prev = a - gap
    # B's prefill: from its first prefill chunk (t0 under eager and chunked, after A under fifo; reports
    # without events: t0) to its last chunk's end, or where B's prompt ran elsewhere, when that was seen done
    chunks = [e for e in t.get("events", ()) if e["req"] == "B" and e["kind"] == "prefill"]
    prefill_start = min((e["t_start_ns"] for e in chunks), default=0)
    prefill_end = max((e["t_end_ns"] for e in chunks), default=b[0])
    in_prefill = _overlaps(prev, a, prefill_start, b[0])
    in_service = _overlaps(prev, a, 0, b[-1])  # B's service: t0 until B's last token
    stall = gap > threshold_ns  # a gap exactly at the threshold is not a stall
    p50, p95, p99 = np.percentile(gap, [50, 95, 99]) / NS_PER_MS
    worst = int(np.argmax(gap))  # first of tied maxima
    return {
        "a_gap_p50_ms": p50,
        "a_gap_p95_ms": p95,
        "a_gap_p99_ms": p99,
        "a_gap_max_ms": gap[worst] / NS_PER_MS,
        "a_resume_gap_ms": a[0] / NS_PER_MS,
        # The eager stall starts in B's prefill and ends after B's first token: it still counts as prefill.
        "a_max_gap_phase": "b_prefill" if in_prefill[worst] else "decode",
        "b_prefill_gaps": int(in_prefill.sum()),
        "b_prefill_gap_max_ms": _max_ms(gap[in_prefill]),
        "b_service_gaps": int(in_service.sum()),
        "b_service_gap_max_ms": _max_ms(gap[in_service]),
        "stalls": int(stall.sum()),
        "stall_excess_ms": float((gap[stall] - threshold_ns).sum()) / NS_PER_MS,
        # A's tokens out while B's prompt was being prefilled: 0 where the prefill stops A (eager, fifo, and
        # overlap where the backend runs the two streams serially), many under chunked, overlap, disagg
        "a_tokens_in_b_prefill": int(((a > prefill_start) & (a < prefill_end)).sum()),
        "b_prefill_start_ms": prefill_start / NS_PER_MS,
        "b_prefill_end_ms": prefill_end / NS_PER_MS,
        "b_ttft_ms": b[0] / NS_PER_MS,
        "a_completion_ms": a[-1] / NS_PER_MS,
        "makespan_ms": t["makespan_ns"] / NS_PER_MS,
        "throughput_tok_s": (a.size + b.size) / (t["makespan_ns"] / 1e9) if t["makespan_ns"] else np.nan,
    }


SUMMARY_COLUMNS = (
    ("a_gap_max_ms", "A max gap ms"),
    ("a_gap_p99_ms", "A p99 gap ms"),
    ("b_ttft_ms", "B TTFT ms"),
    ("makespan_ms", "makespan ms"),
    ("throughput_tok_s", "tok/s"),
)


def summary_table(trials: list[dict], policies, *, stall_threshold_ms: float = 100.0) -> str:
    """Median over trials per policy, as a plain-text table for the CLI."""
    head = ["policy", "trials", *(label for _, label in SUMMARY_COLUMNS)]
    rows = []
    for policy in policies:
        ms = [trial_metrics(t, stall_threshold_ms=stall_threshold_ms) for t in trials if t["policy"] == policy]
        rows.append([policy, str(len(ms)), *(f"{np.median([m[k] for m in ms]):.3f}" for k, _ in SUMMARY_COLUMNS)])
    return text_table(head, rows, right_from=1)


GOAL = 1.5  # the partition issue's bar: A's worst gap and B's TTFT each within 1.5x of the request alone


def goal_table(report: dict, policies) -> str | None:
    """Per policy, its medians over the solo references (report["solo"], run/solo.py): A's worst gap over A's
    decode step alone, B's first token over B's whole prefill alone; None for a report without them."""
    solo = report.get("solo")
    if not solo:
        return None
    head = ["policy", "A max gap / solo decode", "B TTFT / solo prefill", f"both <= {GOAL:g}x"]
    rows = []
    for policy in policies:
        ms = [trial_metrics(t) for t in report["trials"] if t["policy"] == policy]
        if not ms:
            continue
        a = np.median([m["a_gap_max_ms"] for m in ms]) / solo["a_decode_ms"]
        b = np.median([m["b_ttft_ms"] for m in ms]) / (solo["b_prefill_s"] * 1e3)
        rows.append([policy, f"{a:.2f}", f"{b:.2f}", "yes" if a <= GOAL and b <= GOAL else "no"])
    line = f"alone: A's decode step {solo['a_decode_ms']:.3g} ms, B's whole prefill {solo['b_prefill_s'] * 1e3:.4g} ms"
    return line + "\n" + text_table(head, rows, right_from=1)


def overlap_line(trials: list[dict], policy: str = "overlap") -> str | None:
    """What overlap's second stream (or partition's slice) did, measured: how many of A's tokens came out while
    B's prefill was in flight. That says A was not stopped; whether the device ran both at once shows in A's
    gaps and in B's prefill time against a policy that runs it alone."""
    ms = [trial_metrics(t) for t in trials if t["policy"] == policy]
    if not ms:
        return None
    during = [m["a_tokens_in_b_prefill"] for m in ms]
    prefill = np.median([m["b_prefill_end_ms"] - m["b_prefill_start_ms"] for m in ms])
    where = "on the second stream" if policy == "overlap" else f"on its {_slice(trials, policy)}"
    if max(during) == 0:
        return (
            f"{policy}: A emitted no token while B's prefill was in flight {where} (median "
            f"{prefill:.1f} ms) in any of {len(ms)} trials: A waited for all of it"
        )
    return (
        f"{policy}: A emitted a median {np.median(during):g} tokens (min {min(during)}, max {max(during)}) while "
        f"B's prefill was in flight {where} (median {prefill:.1f} ms)"
    )


def _slice(trials: list[dict], policy: str) -> str:
    """B's slice as partition's trials recorded it: its SMs, or that the backend had no split."""
    for t in trials:
        for e in t["events"] if t["policy"] == policy else ():
            if e.get("site") == "slice":
                split = e.get("split")
                return f"slice of {e['b_sms']} SMs (A's: {e['a_sms']})" if split else "stream (no SM split here)"
    return "slice"


def chunk_gaps(trials: list[dict], chunks: list[dict]) -> list[list[float]]:
    """A's observed gap across each of B's chunks in every trial record of `trials` (one policy's): the gap
    ending at A's first token after the chunk's step began (in a chunked round A's next decode, in a mixed step
    A's own row; none once A has finished)."""
    observed = [[] for _ in chunks]
    for t in trials:
        a = np.asarray(t["requests"]["A"]["emit_ns"], dtype=np.int64)
        gap = np.diff(a, prepend=0)
        steps = [e for e in t["events"] if e["kind"] == "prefill" and e["req"] == "B"]
        for k, e in enumerate(steps[: len(chunks)]):
            # not "every gap overlapping the step": a mixed step's token is stamped just before the step's
            # end, so the next step's gap overlaps it too, and a small chunk took its big neighbour's gap
            after = int(np.searchsorted(a, e["t_start_ns"], side="right"))
            if after < a.size:
                observed[k].append(gap[after] / NS_PER_MS)
    return observed


def slo_chunks(report: dict) -> list[dict]:
    """Per slo policy and B chunk: its size, predicted gap, and A's observed gap across it in every trial
    (chunk_gaps), with whether the target held. [] without slo."""
    slo = report.get("slo")
    if not slo:
        return []
    target, rows = slo["tbt_slo_ms"], []
    for policy, chunks in slo["chunks"].items():
        observed = chunk_gaps([t for t in report["trials"] if t["policy"] == policy], chunks)
        for k, (c, obs) in enumerate(zip(chunks, observed)):
            rows.append(
                {
                    "policy": policy,
                    "chunk": k,
                    "start": c["start"],
                    "n": c["n"],
                    "predicted_gap_ms": c["predicted_gap_ms"],
                    "observed_gap_ms": obs,
                    "held": [x <= target for x in obs],
                }
            )
    return rows


def slo_summary(report: dict) -> list[dict]:
    """Per slo policy: its chunks and their sizes, the worst predicted gap, and over the chunks A was still
    decoding across (per trial): how many gaps were observed, their median and worst, and the share under
    the target. One summary for the CLI's text table and the notebook's."""
    rows, target = [], report["slo"]["tbt_slo_ms"]
    chunks = slo_chunks(report)
    for policy in dict.fromkeys(c["policy"] for c in chunks):
        mine = [c for c in chunks if c["policy"] == policy]
        obs = [g for c in mine for g in c["observed_gap_ms"]]
        held = [h for c in mine for h in c["held"]]
        rows.append(
            {
                "policy": policy,
                "chunks": len(mine),
                "sizes": f"{min(c['n'] for c in mine)}-{max(c['n'] for c in mine)}",
                "worst predicted (ms)": round(max(c["predicted_gap_ms"] for c in mine), 3),
                "gaps observed": len(obs),
                "median observed (ms)": round(float(np.median(obs)), 3) if obs else None,
                "worst observed (ms)": round(max(obs), 3) if obs else None,
                f"under {target:.3g} ms": f"{sum(held) / len(held):.0%}" if held else "-",
            }
        )
    return rows


def slo_table(report: dict) -> str:
    """slo_summary as plain text for the CLI; "" without slo policies."""
    rows = slo_summary(report) if report.get("slo") else []
    if not rows:
        return ""
    head = list(rows[0])
    body = [["-" if r[k] is None else str(r[k]) for k in head] for r in rows]
    return f"A's gap target {report['slo']['tbt_slo_ms']:.3g} ms\n" + text_table(head, body, right_from=1)

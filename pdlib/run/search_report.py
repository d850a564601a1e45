"""What a search (serve_search.py) reports and prints: its schema, the SLOs it names, a line per measured point
(one that ran out of device memory: `memory_point`), the CI of a result, a from-log report's environment, the
code that measured its points (`tally_sources`), and the table of every run's searches,
the best policy against mlx-lm and where each value is lost.

    print(search_table(report))
"""

import math
import sys

from pdlib.engine.kernels import BACKEND
from pdlib.report.io import environment
from pdlib.report.serving import ci_text as serving_ci_text
from pdlib.report.serving import run_summary
from pdlib.report.serving_loss import limit_text
from pdlib.report.serving_versus import versus, versus_line

SCHEMA = "pdlib.serve-search/1"
SLO_NAMES = ("strict", "relaxed")


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def memory_point(
    error: BaseException | str, slos: dict, *, requests: int, wall_s: float, held: int | None = None, peak=None
) -> dict:
    """A point whose run ran out of device memory: it meets no bound (every latency NaN, no request attained), its
    loss names memory (serving_loss's causes) with the device memory in use as the point's runs began (`held`,
    bytes) and at most before it failed (`peak`), where known, and its gate keeps the error."""
    fields = run_summary([{"arrival_ns": 0, "emit_ns": [1]}], slos)  # the summary's fields, as a run has them
    summary = {k: 0.0 if k.startswith("attain_") else math.nan for k in fields}
    summary |= {"n_requests": requests, "n_lost": requests}
    error = " ".join(str(error).split())
    loss = {"out_of_memory": True}
    if held is not None and peak is not None:
        loss |= {"held_gib": held / 2**30, "peak_memory_gib": max(peak, held) / 2**30}
    return {"summary": summary, "loss": loss, "gate": {"out_of_memory": error}, "wall_s": wall_s}


def point_line(policy: str, rate: float, rep: int, point: dict) -> str:
    if "out_of_memory" in point.get("gate", {}):
        return f"{policy} rate {rate:g} rep {rep}: out of device memory ({point['wall_s']:.1f} s)"
    s = point["summary"]
    attain = " ".join(f"{n} {s[f'attain_{n}']:.2f}" for n in SLO_NAMES if f"attain_{n}" in s)
    return (
        f"{policy} rate {rate:g} rep {rep}: TTFT p90 {s['ttft_p90_ms']:.1f} ms, TBT p99 {s['tbt_p99_ms']:.1f} ms, "
        f"attained {attain} ({point['wall_s']:.1f} s)"
    )


def ci_text(result: dict) -> str:
    """A search result's CI with its coverage (report.serving.ci_text: 50% at 2 reps)."""
    return serving_ci_text(result["ci"], result.get("ci_level"))


def search_table(report: dict) -> str:
    """One line per run: each (criterion, SLO) search's value and CI; then the SLOs and the measurement counts, the
    best policy against mlx-lm's FP32 peer per search, and where each value is lost."""
    if report.get("schema") != SCHEMA:
        raise ValueError(f"not a search report: schema {report.get('schema')!r}")
    cols = list(dict.fromkeys((s["criterion"], s["slo"]) for s in report["searches"]))
    by_run: dict = {}
    for s in report["searches"]:
        by_run.setdefault(s["policy"], {})[(s["criterion"], s["slo"])] = s["result"]
    rows = [["run", *(f"{c} {s}" for c, s in cols)]]
    for run, results in by_run.items():
        rows.append([run, *(f"{r['text']} {ci_text(r)}" if (r := results.get(c)) else "-" for c in cols)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]
    slo = report["slos"]["strict"]
    m = report["measurements"]
    w = report["workload"]
    unit = "requests/s" if w["source"] == "poisson" else "rate multiplier"
    if w.get("pace_gap_ms"):  # paced: 1x is the trace's mean request rate
        unit += f" (1x: {1000 / w['pace_gap_ms']:.3g} requests/s, the trace's mean)"
    lines.append(
        f"rate = {unit}; decode step "
        f"{report['decode_step_ms']:.3g} ms, TBT/TPOT strict {slo['tbt_ms']:.3g} ms, relaxed "
        f"{report['slos']['relaxed']['tbt_ms']:.3g} ms, TTFT {slo['ttft_ms']:.3g} ms; "
        f"{m['new']} runs measured, {m['reused']} of the log's {m['from_log']} reused; {report['wall_s']:.1f} s"
    )
    began: dict = {}  # search_starts.py: the report each run's searches began from
    for s in report["searches"]:
        if s.get("start_from"):
            began.setdefault(s["start_from"]["path"], []).append(s["policy"])
    for path, runs in began.items():
        lines.append(f"searches began at each rep's value in {path}: {', '.join(dict.fromkeys(runs))}")
    rows = versus({run: list(results.values()) for run, results in by_run.items()})
    if rows:
        lines.append("the best policy against mlx-lm fp32 (report.serving_versus):")
        lines += [f"  {versus_line(r)}" for r in rows]
    lost = [
        f"  {s['policy']} {s['criterion']} {s['slo']}: {limit_text(s['result']['limit'])}"
        for s in report["searches"]
        if "limit" in s["result"]
    ]
    return "\n".join(lines + (["where each value is lost (report.serving_loss):", *lost] if lost else []))


def stopped_line(report: dict) -> str | None:
    """Where a command under --budget-s (or --from-log) stopped, if it did, and how it goes on."""
    s = report.get("stopped")
    if not s:
        return None
    if s.get("reason") == "not in the log":
        return (
            f"from the log: it stops before {s['policy']} at {s['rate']:g} rep {s['rep']}, not in the log; a search "
            "command with this --log on its machine measures it"
        )
    return (
        f"stopped before {s['policy']} at {s['rate']:g} rep {s['rep']}: expected {s['expected_s']:.0f} s, "
        f"{s['left_s']:.0f} s left of --budget-s; the same command with the same --log goes on from there"
    )


def log_environment(machine: dict) -> dict:
    """A from-log report's environment: the log's machine and switches, and where the report was composed."""
    here = environment(BACKEND)
    device = "cpu" if machine.get("backend") == "cpu" else "gpu"
    return {"device": device, **machine, "composed_on": {k: here[k] for k in ("device_name", "platform", "git_commit")}}


def tally_sources(entries: list[dict], records: dict, tally: dict) -> None:
    """Count into `tally` the sources hash (report.io.sources_hash) of the code that measured each point the
    searches in `entries` used, once a point ("unrecorded": a point logged before points kept it)."""
    used = {(float(q["rate"]), int(q["rep"])) for e in entries for q in e["result"]["points"]}
    for key in used:
        h = records.get(key, {}).get("sources_hash", "unrecorded")
        tally[h] = tally.get(h, 0) + 1


__all__ = [
    "SCHEMA",
    "SLO_NAMES",
    "ci_text",
    "log_environment",
    "point_line",
    "search_table",
    "stderr_line",
    "stopped_line",
    "tally_sources",
]

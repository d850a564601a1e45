"""One serving report (`python -m pdlib serve`, schema pdlib.serve/1) as frames, a table and findings; its charts
are in serving_charts. Notebook 05 shows them.

    from pdlib.analysis import serving as sv
    report = sv.load_serving_report("/tmp/serve.json.gz")   # .json or .json.gz; InputError: one line
    sv.requests_frame(report)    # one row per run and request: TTFT, E2E, TPOT, prompt span, check
    sv.gaps_frame(report)        # one row per inter-token gap, with the prompt work that ran inside it
    sv.summary_frame(report)     # one row per run: report.serving.run_summary's numbers, and the check
    print(sv.findings(report))   # Markdown, every sentence from a number of the frames above

A run is a pdlib policy or a peer (`"peer": true`: mlx-lm's BatchGenerator on the same workload and clock). A
peer is labelled by its system, dtype and prefill step ("mlx-lm fp32 @2048"), drawn like a policy and flagged
as a peer in the tables; its requests carry `agreement` (leading output ids equal to the FP32 reference's)
instead of the gate's `check`, and a request it lost may end short or emit nothing: it counts in the run and
meets no SLO, its latencies (if any) among those of the requests that emitted, as in the report's own summary.
Times are integer ns since each run's clock start, differenced in ns and converted to ms once; percentiles are
report.serving's (numpy's linear).
"""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from pdlib.analysis.search_results import check_searches
from pdlib.analysis.serving_time import time_frame, time_line
from pdlib.errors import InputError, is_number
from pdlib.report.io import read_text
from pdlib.report.serving import NS_PER_MS, Slo, request_metrics, run_summary, slos_from_step
from pdlib.report.serving_loss import gap_work

SCHEMA = "pdlib.serve/1"  # pdlib.run.serve's; analysis never imports a run module
SEARCH_SCHEMA = "pdlib.serve-search/1"  # pdlib.run.serve_search's
STEP_KEYS = ("work", "t_start_ns", "t_end_ns")


# ---- reading a report ----------------------------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_serving_report(report, *, where: str = "report") -> dict:
    """`report` if it has what this module reads, else InputError, one line naming `where` and the problem."""

    def need(ok, message):
        if not ok:
            raise InputError(f"{where}: {message}")

    need(isinstance(report, dict), "not a JSON object")
    schema = report.get("schema")
    need(schema == SCHEMA, f"schema {schema!r} is not a serving report's ({SCHEMA!r}, from `python -m pdlib serve`)")
    for key in ("workload", "gate", "model", "environment"):
        need(isinstance(report.get(key), dict), f"{key} is missing or not an object")
    for key in ("params", "slos"):
        need(isinstance(report.get(key, {}), dict), f"{key} is not an object")
    w = report["workload"]
    need(_is_int(w.get("requests")) and is_number(w.get("duration_s")), "workload lacks requests or duration_s")
    need(isinstance(report["gate"].get("near_ties", []), list), "gate.near_ties is not a list")
    runs = report.get("runs")
    need(isinstance(runs, list) and runs, "runs must be a non-empty list")
    for i, run in enumerate(runs):
        need(isinstance(run, dict) and isinstance(run.get("policy"), str), f"runs[{i}] has no policy name")
        at = f"runs[{i}] ({run['policy']})"
        reqs, steps = run.get("requests"), run.get("steps")
        need(isinstance(reqs, list) and reqs, f"{at}: requests must be a non-empty list")
        need(isinstance(steps, dict) and all(isinstance(steps.get(k), list) for k in STEP_KEYS), f"{at}: no step log")
        need(len({len(steps[k]) for k in STEP_KEYS}) == 1, f"{at}: the step log's lists differ in length")
        replicas = steps.get("replica")  # a run of replicas: each step's, and each request's (serve_replicas.py)
        fits = isinstance(replicas, list) and len(replicas) == len(steps["work"])
        ok = replicas is None or fits and all(_is_int(k) and k >= 0 for k in replicas)
        need(ok, f"{at}: steps.replica must give each step's replica (a whole number >= 0)")
        known = set(replicas or ())
        names = set()
        for j, r in enumerate(reqs):
            need(isinstance(r, dict) and isinstance(r.get("name"), str), f"{at}: request {j} has no name")
            name, emit = r["name"], r.get("emit_ns")
            need(name not in names, f"{at}: request {name} appears twice")
            names.add(name)
            need(_is_int(r.get("arrival_ns")) and r["arrival_ns"] >= 0, f"{at}: request {name}: bad arrival_ns")
            need(isinstance(emit, list) and all(_is_int(e) for e in emit), f"{at}: request {name}: bad emit_ns")
            need(emit or r.get("lost"), f"{at}: request {name} emitted nothing and is not marked lost")
            need(not emit or emit[0] >= r["arrival_ns"], f"{at}: request {name}: first emit before its arrival")
            need(all(a <= b for a, b in zip(emit, emit[1:])), f"{at}: request {name}: emit_ns not sorted")
            need(isinstance(r.get("check", {}), dict), f"{at}: request {name}: check is not an object")
            need(
                replicas is None or _is_int(r.get("replica")) and r["replica"] in known or not r["emit_ns"],
                f"{at}: request {name}: its replica is none of the step log's",
            )
        need(run.get("makespan_ns") is None or _is_int(run["makespan_ns"]), f"{at}: makespan_ns is not an integer")
        for k, (work, t0, t1) in enumerate(zip(*(steps[key] for key in STEP_KEYS))):
            need(_is_int(t0) and _is_int(t1) and t0 <= t1, f"{at}: step {k}: bad start or end")
            need(
                isinstance(work, list)
                and all(
                    isinstance(p, list)
                    and len(p) == 2
                    and isinstance(p[0], str)
                    and p[0] in names
                    and (p[1] is None or (_is_int(p[1]) and p[1] >= 0))
                    for p in work
                ),
                f"{at}: step {k}: parts must be [request, prompt tokens or null] of this run's requests",
            )
    labels = [run_label(run) for run in runs]
    need(len(set(labels)) == len(labels), f"two runs share a label: {', '.join(labels)}")
    try:  # what the notebook reads later: refused now, before a kernel starts
        report_slos(report)
        if "searches" in report:
            check_searches(report["searches"])
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return report


def load_search_report(path) -> dict:
    """A report of `python -m pdlib serve --search` (pdlib.serve-search/1) as {run: [its searches' results]},
    the shape the rate charts take; InputError, one line, naming the file otherwise."""
    where = str(path)
    try:
        report = json.loads(read_text(path))
    except (OSError, ValueError) as e:
        raise InputError(f"{where}: cannot read a search report ({e})") from None
    if (
        not isinstance(report, dict)
        or report.get("schema") != SEARCH_SCHEMA
        or not isinstance(report.get("searches"), list)
    ):
        raise InputError(f"{where}: not a search report (expected schema {SEARCH_SCHEMA!r} with a searches list)")
    grouped: dict = {}
    for i, s in enumerate(report["searches"]):
        if not isinstance(s, dict) or not isinstance(s.get("policy"), str) or "result" not in s:
            raise InputError(f"{where}: searches[{i}] must hold a policy and a result")
        got = s["result"].get("criterion") if isinstance(s["result"], dict) else None
        kind, slo = str(got).split("_", 1) if "_" in str(got) else (got, None)
        if s.get("criterion", kind) != kind or s.get("slo", slo) != slo:  # listed as what it is
            raise InputError(
                f"{where}: searches[{i}] is listed as {s.get('criterion')} at slo {s.get('slo')}, its result is {got}"
            )
        grouped.setdefault(s["policy"], []).append(s["result"])
    try:
        return check_searches(grouped)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def load_search_slos(path) -> dict:
    """{name: Slo}: the SLOs a search report's criteria held (its `slos`), for the bounds its charts draw."""
    try:
        return report_slos(json.loads(read_text(path)))
    except InputError as e:
        raise InputError(f"{path}: {e}") from None


def load_serving_report(path) -> dict:
    """Read (.json or .json.gz) and check a serving report; every problem is one InputError naming the file."""
    path = Path(path)
    text = read_text(path, what="serving report")
    try:
        report = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}") from None
    return check_serving_report(report, where=str(path))


def run_label(run: dict) -> str:
    """A policy's name, or a peer's system, dtype and prefill step: "mlx-lm fp32 @2048"."""
    if not run.get("peer"):
        return run["policy"]
    system = str(run.get("system") or "peer").split()[0]
    dtype, step = run.get("dtype"), run.get("prefill_step_size")
    return f"{system} {dtype} @{step}" if dtype and step else run["policy"]


def labels(report: dict) -> list[str]:
    return [run_label(run) for run in report["runs"]]


def find_run(report: dict, name) -> dict:
    """The run labelled `name` (or of policy `name`); None: the first. InputError listing the labels."""
    if name is None:
        return report["runs"][0]
    for run in report["runs"]:
        if name in (run_label(run), run["policy"]):
            return run
    raise InputError(f"no run {name!r} in this report; its runs are {', '.join(labels(report))}")


def report_slos(report: dict, slo: dict | None = None) -> dict:
    """{name: Slo}: `slo` ({decode_ms, ttft_ms}: report.serving.slos_from_step) if given, else the report's own."""
    if slo is not None:
        if not isinstance(slo, dict) or set(slo) != {"decode_ms", "ttft_ms"}:
            raise InputError(f"slo must be None or {{decode_ms: D, ttft_ms: T}}, got {slo!r}")
        return slos_from_step(slo["decode_ms"], slo["ttft_ms"])
    try:
        return {k: Slo(**v) for k, v in (report.get("slos") or {}).items()}
    except (TypeError, AttributeError) as e:  # not a mapping of mappings with Slo's fields
        raise InputError(f"the report's slos are malformed: {e}") from None


def _emitted(run: dict) -> list[dict]:
    return [r for r in run["requests"] if r["emit_ns"]]


# ---- frames ---------------------------------------------------------------------------------------------------
def steps_frame(report: dict) -> pd.DataFrame:
    """One row per step part: run, step, request, prompt_tokens (NaN for a decode), t_start_ms, t_end_ms."""
    rows = [
        (run_label(run), k, name, np.nan if n is None else n, t0 / NS_PER_MS, t1 / NS_PER_MS)
        for run in report["runs"]
        for k, (work, t0, t1) in enumerate(zip(*(run["steps"][key] for key in STEP_KEYS)))
        for name, n in work
    ]
    return pd.DataFrame(rows, columns=["run", "step", "request", "prompt_tokens", "t_start_ms", "t_end_ms"])


def _check_text(r: dict) -> str:
    if "agreement" in r:
        return f"agrees {r['agreement']}/{r.get('output_tokens')}"
    check = r.get("check") or {}
    return check.get("text") or check.get("status") or "-"


def requests_frame(report: dict) -> pd.DataFrame:
    """One row per run and request, in arrival order: run, peer, request, order, arrival_ms, prompt_tokens,
    output_tokens, emitted, prefill_start_ms / prefill_end_ms (its first prompt step's start, its last one's end),
    first_emit_ms, last_emit_ms, ttft_ms, e2e_ms, tpot_ms (NaN for one token), tbt_max_ms, check (the gate's, or a
    peer's agreement), agreement (NaN for a policy), lost. Metrics are NaN for a request that emitted nothing."""
    parts = []
    for run in report["runs"]:
        reqs = run["requests"]
        spans = {}
        for work, t0, t1 in zip(*(run["steps"][key] for key in STEP_KEYS)):
            for name, n in work:
                if n:  # a prompt chunk (None: a decode)
                    lo, _ = spans.get(name, (t0, t1))
                    spans[name] = (lo, t1)
        df = pd.DataFrame(
            {
                "run": run_label(run),
                "peer": bool(run.get("peer")),
                "request": [r["name"] for r in reqs],
                "order": range(len(reqs)),
                "arrival_ms": [r["arrival_ns"] / NS_PER_MS for r in reqs],
                "prompt_tokens": [r.get("prompt_tokens") for r in reqs],
                "output_tokens": [r.get("output_tokens") for r in reqs],
                "emitted": [len(r["emit_ns"]) for r in reqs],
                "prefill_start_ms": [spans.get(r["name"], (np.nan,))[0] / NS_PER_MS for r in reqs],
                "prefill_end_ms": [spans.get(r["name"], (0, np.nan))[1] / NS_PER_MS for r in reqs],
            }
        )
        for col in ("first_emit_ms", "last_emit_ms", "ttft_ms", "e2e_ms", "tpot_ms", "tbt_max_ms"):
            df[col] = np.nan
        done = df["emitted"].to_numpy() > 0
        m = request_metrics(_emitted(run))
        df.loc[done, "first_emit_ms"] = (m["arrival_ns"] + m["ttft_ns"]) / NS_PER_MS
        df.loc[done, "last_emit_ms"] = m["last_ns"] / NS_PER_MS
        df.loc[done, "ttft_ms"] = m["ttft_ns"] / NS_PER_MS
        df.loc[done, "e2e_ms"] = m["e2e_ns"] / NS_PER_MS
        df.loc[done, "tpot_ms"] = m["tpot_ns"] / NS_PER_MS
        df.loc[done, "tbt_max_ms"] = [g.max() / NS_PER_MS if g.size else np.nan for g in m["gaps_ns"]]
        df["check"] = [_check_text(r) for r in reqs]
        df["agreement"] = [r.get("agreement", np.nan) for r in reqs]
        df["lost"] = [bool(r.get("lost")) for r in reqs]
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def gaps_frame(report: dict) -> pd.DataFrame:
    """One row per inter-token gap: run, peer, request, index (the output it ends at, from 1), emit_ms, gap_ms,
    and the prompt work that ran inside it: prompt_steps and prompt_tokens of the steps that started within
    [previous emit, this emit), i.e. every step after the one that emitted the previous token, up to and
    including the one that emitted this token (a token is stamped inside or at the end of its own step). A run of
    replicas (serve_replicas.py) counts only the steps of the request's own replica."""
    parts = [
        pd.DataFrame(
            {
                "run": run_label(run),
                "peer": bool(run.get("peer")),
                "request": g["name"],
                "index": np.arange(1, g["gaps_ns"].size + 1),
                "emit_ms": g["emit_ns"] / NS_PER_MS,
                "gap_ms": g["gaps_ns"] / NS_PER_MS,
                "prompt_steps": g["prompt_steps"],
                "prompt_tokens": g["prompt_tokens"],
            }
        )
        for run in report["runs"]
        for g in gap_work(run)
    ]
    cols = ["run", "peer", "request", "index", "emit_ms", "gap_ms", "prompt_steps", "prompt_tokens"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def summary_frame(report: dict, slos: dict | None = None) -> pd.DataFrame:
    """One row per run, in the report's order: run, peer, system, steps, requests, lost, makespan_s, then
    report.serving.run_summary (latencies over the requests that emitted a token; attain_<name> per Slo of
    `slos`, default the report's own), then near_ties (a policy's) or agree_all (a peer's requests whose every
    output equals the reference's; NaN for a policy)."""
    slos = report_slos(report) if slos is None else slos
    rows = []
    for run in report["runs"]:
        peer = bool(run.get("peer"))
        reqs = run["requests"]
        summary = run_summary(reqs, slos)
        row = {
            "run": run_label(run),
            "peer": peer,
            "system": run.get("system") if peer else "pdlib",
            "steps": len(run["steps"]["work"]),
            "requests": len(reqs),
            "lost": summary["n_lost"],
            "makespan_s": run.get("makespan_ns", max(run["steps"]["t_end_ns"], default=0)) / 1e9,
            **summary,
            "near_ties": np.nan if peer else sum((r.get("check") or {}).get("status") == "near-tie" for r in reqs),
            "agree_all": sum(r.get("agreement") == r.get("output_tokens") for r in reqs) if peer else np.nan,
        }
        rows.append(row)
    return pd.DataFrame(rows)


# ---- what the notebook prints --------------------------------------------------------------------------------
def fmt_ms(v) -> str:
    if v is None or pd.isna(v):
        return "-"
    if abs(v) >= 1000:
        return f"{v / 1000:.2f} s"
    return f"{v:.1f} ms" if abs(v) >= 10 else f"{v:.3g} ms"


def _num(v) -> str:
    if pd.isna(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def run_line(report: dict) -> str:
    """One line: model, device, workload, the runs, and the gate."""
    w, g, env = report["workload"], report["gate"], report["environment"]
    runs = report["runs"]
    policies = [run_label(r) for r in runs if not r.get("peer")]
    peers = [run_label(r) for r in runs if r.get("peer")]
    chunk = (report.get("params") or {}).get("chunk_size")
    return (
        f"{report['model'].get('spec')} on {env.get('device_name') or env.get('device')}: "
        f"{w.get('requests')} requests over {w.get('duration_s', math.nan):.2f} s ({w.get('source')}), "
        f"policies {', '.join(policies) or 'none'}"
        + (f" (chunk {chunk})" if chunk else "")
        + (f", peers {', '.join(peers)}" if peers else "")
        + f"; policies' tokens gated against the FP32 reference, {len(g.get('near_ties') or [])} near-ties"
    )


SUMMARY_COLUMNS = {  # summary_frame column -> header
    "ttft_p50_ms": "TTFT p50 (ms)",
    "ttft_p90_ms": "TTFT p90 (ms)",
    "ttft_p99_ms": "TTFT p99 (ms)",
    "tbt_p50_ms": "TBT p50 (ms)",
    "tbt_p99_ms": "TBT p99 (ms)",
    "tbt_max_ms": "TBT max (ms)",
    "tbt_req_p99_p50_ms": "own p99 gap, median (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "e2e_p90_ms": "E2E p90 (ms)",
    "throughput_tok_s": "throughput (tok/s)",
}


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """summary_frame for reading: one row per run, rounded, units in the headers, attainment in %, the check."""
    out = pd.DataFrame(index=pd.Index(summary["run"], name="run"))
    out["kind"] = ["peer" if p else "policy" for p in summary["peer"]]
    out["steps"] = summary["steps"].to_numpy()
    for col, head in SUMMARY_COLUMNS.items():
        out[head] = [_num(v) for v in summary[col]]
    for col in [c for c in summary if c.startswith("attain_")]:
        out[f"{col[len('attain_') :]} SLO met"] = [f"{v:.0%}" for v in summary[col]]
    out["makespan (s)"] = [f"{v:.3g}" for v in summary["makespan_s"]]
    out["tokens"] = [
        f"{r.agree_all:.0f}/{r.requests} agree, {r.lost} lost" if r.peer else f"gated, {r.near_ties:.0f} near-ties"
        for r in summary.itertuples()
    ]
    return out


def _ranked(summary: pd.DataFrame, col: str, *, high: bool = False) -> list[tuple[str, float]]:
    s = summary[["run", col]].dropna()
    return list(s.sort_values(col, ascending=not high, kind="stable").itertuples(index=False, name=None))


def _ranking(summary, col, what, fmt, *, high=False) -> str | None:
    ranked = _ranked(summary, col, high=high)
    if not ranked:
        return None
    (best, v), rest = ranked[0], ranked[1:]
    tied = [r for r, x in rest if x == v]  # exactly equal: a tie; equal only when rounded is not claimed as one
    head = " and ".join(f"**{r}**" for r in [best, *tied]) + (" (tied)" if tied else "")
    then = f" (then {', '.join(f'{r} {fmt(x)}' for r, x in rest if r not in tied)})" if len(rest) > len(tied) else ""
    return f"**{'Highest' if high else 'Lowest'} {what}:** {head}, {fmt(v)}{then}."


def _stalls(gaps: pd.DataFrame, run: str) -> str | None:
    g = gaps[gaps["run"] == run]
    if g.empty:
        return None
    inside = g["prompt_tokens"] > 0
    worst = g.loc[g["gap_ms"].idxmax()]
    text = f"**{run}**: {int(inside.sum())} of {len(g)} gaps ({inside.mean():.0%}) had prompt work run inside them"
    if inside.any() and (~inside).any():
        text += (
            f"; their median is {fmt_ms(g.loc[inside, 'gap_ms'].median())} against "
            f"{fmt_ms(g.loc[~inside, 'gap_ms'].median())} for the rest"
        )
    n, k = int(worst["prompt_tokens"]), int(worst["prompt_steps"])
    held = f"{n} prompt tokens in {k} step{'s' if k > 1 else ''}" if n else "no prompt work"
    return text + (
        f". The longest, {fmt_ms(worst['gap_ms'])} (request {worst['request']}, before its output "
        f"{int(worst['index'])}, at {fmt_ms(worst['emit_ms'])}), held {held}."
    )


def _versus(peer, best, col, what, *, high=False) -> str:
    r = peer[col] / best[col] if best[col] else math.nan
    times = "-" if pd.isna(r) else f"{r:.0f}x" if r >= 10 else f"{r:.1f}x" if r >= 2 else f"{r:.2f}x"
    fmt = (lambda v: f"{_num(v)} tok/s") if high else fmt_ms
    return f"{what} {fmt(peer[col])}, {times} {best['run']}'s {fmt(best[col])}"


def findings(report: dict, slos: dict | None = None) -> str:
    """Markdown bullets read off summary_frame and gaps_frame: the lowest TTFT p90 and pooled TBT p99, the
    highest throughput and attainment per SLO (each with every run's value), where long gaps happen (prompt work
    inside a gap), where each run's time went (serving_time.py), and each peer against the best policy on each of
    these. Nothing else is claimed."""
    slos = report_slos(report) if slos is None else slos
    s = summary_frame(report, slos)
    w, g = report["workload"], report["gate"]
    n_pol, n_peer = int((~s["peer"]).sum()), int(s["peer"].sum())
    lines = [
        f"{w.get('requests')} requests over {w.get('duration_s', math.nan):.2f} s ({w.get('source')}); "
        f"{n_pol} {'policy' if n_pol == 1 else 'policies'}, every token gated against the FP32 reference "
        f"({len(g.get('near_ties') or [])} near-ties)"
        + (f", and {n_peer} {'peer' if n_peer == 1 else 'peers'} (timed, not gated)." if n_peer else ".")
    ]
    lines.append(_ranking(s, "ttft_p90_ms", "TTFT p90", fmt_ms))
    lines.append(_ranking(s, "tbt_p99_ms", "pooled TBT p99", fmt_ms))
    lines.append(_ranking(s, "tbt_req_p99_p50_ms", "median of each request's p99 gap", fmt_ms))
    lines.append(_ranking(s, "throughput_tok_s", "throughput", lambda v: f"{_num(v)} tok/s", high=True))
    for name, slo in slos.items():
        lines.append(
            _ranking(
                s,
                f"attain_{name}",
                f"share meeting the {name} SLO (TTFT <= {slo.ttft_ms:g} ms and TPOT <= {slo.tpot_ms:g} ms)",
                lambda v: f"{v:.0%}",
                high=True,
            )
        )
    gaps, times = gaps_frame(report), time_frame(report, label=run_label)
    lines += [_stalls(gaps, run) for run in s["run"]] + [time_line(times, run) for run in s["run"]]
    policies = s[~s["peer"]]
    for _, peer in s[s["peer"]].iterrows():
        if policies.empty:
            break
        parts = [
            _versus(peer, policies.loc[policies[col].idxmin()], col, what)
            for col, what in (("ttft_p90_ms", "TTFT p90"), ("tbt_p99_ms", "pooled TBT p99"))
            if policies[col].notna().any() and pd.notna(peer[col])
        ]
        fastest = policies.loc[policies["throughput_tok_s"].idxmax()]
        parts.append(_versus(peer, fastest, "throughput_tok_s", "throughput", high=True))
        lines.append(
            f"**{peer['run']}** (peer): {'; '.join(parts)}. {peer['agree_all']:.0f} of {peer['requests']} requests "
            f"equal the FP32 reference in every output; {peer['lost']} lost."
        )
    return "\n".join(f"- {line}" for line in lines if line) + "\n"

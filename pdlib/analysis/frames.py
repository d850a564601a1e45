"""Turn a report.json into tidy pandas frames, per-trial metrics and paired policy ratios.

    from pdlib.analysis import frames as an
    report = an.load_report("outputs/smoke-cpu/report.json.gz")    # InputError (one line) if malformed
    tokens = an.tokens_frame(report)       # one row per timed output token: emit_ms, gap_ms
    events = an.events_frame(report)       # one row per scheduling event
    steps = an.step_times(an.steps_frame(report))  # per trial: a step's time, the host's part, the wait
    metrics = an.metrics_frame(report, stall_threshold_ms=100.0)  # one row per (policy, trial)
    summary = an.summary_frame(metrics)    # median / min / max / n per policy and metric
    per_trial, ratios = an.paired_ratios(metrics, numerator="eager", denominator="chunked")
    print(an.metrics_markdown(summary, ratios=ratios))

Report times are integer ns since t0; frames use float ms. Gaps are differenced in integer ns and
converted once, so a gap of exactly the threshold never turns into a stall through rounding.
Percentiles are numpy's default linear interpolation (pandas' default too): p of n sorted gaps is read
at position p/100 * (n - 1), between the two nearest gaps. Rows follow params.policies, then trial.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pdlib.errors import InputError
from pdlib.report.checks import check_report  # shape and claims: tokens, gate, event stamps
from pdlib.report.io import read_text
from pdlib.report.metrics import NS_PER_MS, slo_chunks, trial_metrics  # numpy-only, shared with the CLI summary
from pdlib.report.schema import REQUESTS

RATIO_METRICS = ("a_gap_max_ms", "a_gap_p99_ms", "b_ttft_ms", "makespan_ms", "throughput_tok_s")
MIN_BOOT_TRIALS = 5  # fewer paired trials make a bootstrap CI of the median meaningless
# steps_frame's parts of a step's time, by column, with the name tables and charts give each
STEP_PARTS = {
    "issue_ms": "host issuing",
    "issue_cpu_ms": "of it on the CPU",
    "between_ms": "between",
    "wait_ms": "waiting",
}


# ---- loading and checking ---------------------------------------------------------------------------
def load_report(path) -> dict:
    """Read and check a report file (.json, or gzip-compressed .json.gz); every problem is an InputError naming
    the file."""
    path = Path(path)
    text = read_text(path, what="report")  # .json or .json.gz alike
    try:
        report = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}") from e
    check_report(report, where=str(path))
    return report


def _expect(ok, message):
    """For how the library is called (a programming error, not bad input): ValueError."""
    if not ok:
        raise ValueError(message)


def policy_order(report: dict) -> list:
    """Policies as params.policies lists them (first = numerator of the default ratio), then any others."""
    seen = list(dict.fromkeys(t["policy"] for t in report["trials"]))
    params = report.get("params")
    declared = (params.get("policies") or []) if isinstance(params, dict) else []
    first = [p for p in declared if p in seen]
    return first + [p for p in seen if p not in first]


def _trials(report):
    check_report(report)
    rank = {p: i for i, p in enumerate(policy_order(report))}
    return sorted(report["trials"], key=lambda t: (rank[t["policy"]], t["trial"]))


# ---- frames ----------------------------------------------------------------------------------------
def tokens_frame(report: dict) -> pd.DataFrame:
    """One row per timed output: policy, trial, request, index, token_id, emit_ms, gap_ms."""
    parts = []
    for t in _trials(report):
        for name in REQUESTS:
            req = t["requests"][name]
            emit = np.asarray(req["emit_ns"], dtype=np.int64)
            start = req["timed_from"]
            parts.append(
                pd.DataFrame(
                    {
                        "policy": t["policy"],
                        "trial": t["trial"],
                        "request": name,
                        "index": np.arange(start, start + emit.size),
                        "token_id": req["output_ids"][start:],
                        "emit_ms": emit / NS_PER_MS,
                        "gap_ms": np.diff(emit, prepend=0) / NS_PER_MS,
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)


def slo_frame(report: dict) -> pd.DataFrame:
    """One row per slo policy, B chunk and trial: the chunk (start, n), its predicted gap and A's observed gap
    across it, and whether that stayed under the report's target. Empty without slo policies."""
    rows = [
        (c["policy"], c["chunk"], c["start"], c["n"], c["predicted_gap_ms"], trial + 1, obs, held)
        for c in slo_chunks(report)
        for trial, (obs, held) in enumerate(zip(c["observed_gap_ms"], c["held"]))
    ]
    return pd.DataFrame(
        rows, columns=["policy", "chunk", "start", "n", "predicted_gap_ms", "trial", "observed_gap_ms", "held"]
    )


def events_frame(report: dict) -> pd.DataFrame:
    """One row per scheduling event: policy, trial, kind, req, start, stop, t_start_ms, t_end_ms, dur_ms."""
    rows = [
        (t["policy"], t["trial"], e["kind"], e["req"], e["start"], e["stop"], e["t_start_ns"], e["t_end_ns"])
        for t in _trials(report)
        for e in t["events"]
    ]
    df = pd.DataFrame(rows, columns=["policy", "trial", "kind", "req", "start", "stop", "t0", "t1"])
    df["t_start_ms"], df["t_end_ms"] = df.pop("t0") / NS_PER_MS, df.pop("t1") / NS_PER_MS
    df["dur_ms"] = df["t_end_ms"] - df["t_start_ms"]
    return df


def steps_frame(report: dict) -> pd.DataFrame:
    """One row per step run here (its parts share its clock readings; B's prefill run elsewhere is left out):
    policy, trial, kind ("prompt" if it carried a prompt chunk, else "decode"), rows, prompt_start (the chunk's
    first prompt position; NaN for decodes), t_start_ms, dur_ms, and
    where the time went: issue_ms (the host building and issuing it), between_ms (until the host began waiting
    for it: in a pipelined run, issuing the next step and waiting for the one before; under overlap, also
    dispatching B's next layer) and wait_ms (the host waiting for its outputs: the device). issue_ms includes
    any wait MLX imposes inside the call while more than ten command buffers are in flight, so a device that
    falls behind lengthens it too; a wait_ms near zero says the device had finished the step by the time the
    host began waiting for it. Of issue_ms, issue_cpu_ms is the host thread's CPU time: the rest it waited
    (for MLX, the GIL or a blocking call) or another thread or process ran. With polling during chunks
    (RunParams.poll_during_chunks), a decode step ahead of a chunk is waited for from the host's first look for
    its token, between the chunk's layers, to the look that found it: its wait_ms also holds the chunk's
    building in between (the device's part at most). NaN for these in reports that predate the readings."""
    rows = []
    for t in _trials(report):
        steps = {}
        for e in t["events"]:
            if e["kind"] in ("prefill", "decode") and not e.get("remote"):
                steps.setdefault((e["t_start_ns"], e["t_end_ns"]), []).append(e)
        for (t0, t1), parts in steps.items():
            ti, tw, cpu = (parts[0].get(k, np.nan) for k in ("t_issued_ns", "t_wait_ns", "cpu_issue_ns"))
            chunk = next((e["start"] for e in parts if e["kind"] == "prefill"), np.nan)
            rows.append(
                (
                    t["policy"],
                    t["trial"],
                    "decode" if np.isnan(chunk) else "prompt",
                    sum(e["stop"] - e["start"] for e in parts),
                    chunk,
                    t0 / NS_PER_MS,
                    (t1 - t0) / NS_PER_MS,
                    (ti - t0) / NS_PER_MS,
                    cpu / NS_PER_MS,
                    (tw - ti) / NS_PER_MS,
                    (t1 - tw) / NS_PER_MS,
                )
            )
    return pd.DataFrame(
        rows, columns=["policy", "trial", "kind", "rows", "prompt_start", "t_start_ms", "dur_ms", *STEP_PARTS]
    )


def step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """Per policy, trial and kind of step: how many, and the medians of dur_ms, issue_ms, issue_cpu_ms,
    between_ms and wait_ms (each its own median: they need not add up). Steps whose wait_ms is near zero were
    bound by the host (the device had finished them by the time the host began waiting); a large wait_ms, by
    the device."""
    out = (
        steps.groupby(["policy", "trial", "kind"], sort=False)
        .agg(steps=("dur_ms", "size"), **{c: (c, "median") for c in ("dur_ms", *STEP_PARTS)})
        .reset_index()
    )
    out["p"], out["k"] = pd.factorize(out["policy"])[0], out["kind"].map({"prompt": 0, "decode": 1})
    return out.sort_values(["p", "trial", "k"], kind="stable").drop(columns=["p", "k"]).reset_index(drop=True)


def remote_frame(report: dict) -> pd.DataFrame:
    """One row per trial whose B prompt ran elsewhere (overlap: a second stream; disagg: the prefill worker):
    where, B's prefill span (dispatch or signal to seen done), A's tokens emitted inside it, and disagg's
    transfer (ms, MB, GB/s, mode; NaN/None for overlap). Empty when no such trial."""
    rows = []
    for t in _trials(report):
        remote = [e for e in t["events"] if e["req"] == "B" and e["kind"] == "prefill" and e.get("remote")]
        if not remote:
            continue
        (e,) = remote
        moved = next((m for m in t["events"] if m["kind"] == "transfer"), None)
        ms = (moved["t_end_ns"] - moved["t_start_ns"]) / NS_PER_MS if moved else np.nan
        mb = moved["bytes"] / 1e6 if moved else np.nan
        rows.append(
            {
                "policy": t["policy"],
                "trial": t["trial"],
                "site": e.get("site"),
                "prefill_ms": (e["t_end_ns"] - e["t_start_ns"]) / NS_PER_MS,
                "a_tokens_during": trial_metrics(t)["a_tokens_in_b_prefill"],
                "transfer_ms": ms,
                "transfer_mb": mb,
                "transfer_gb_s": mb / ms if moved else np.nan,
                "transfer_mode": moved.get("mode") if moved else None,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "policy",
            "trial",
            "site",
            "prefill_ms",
            "a_tokens_during",
            "transfer_ms",
            "transfer_mb",
            "transfer_gb_s",
            "transfer_mode",
        ],
    )


def metrics_frame(report: dict, *, stall_threshold_ms: float = 100.0) -> pd.DataFrame:
    """One row per (policy, trial). A's gaps include the resumption gap from t0. A gap "overlaps" an
    interval when they share positive length: b_prefill_* over B's prefill (its first prefill chunk to its
    first token), b_service_* over [t0, B's last token] (max NaN if none). a_max_gap_phase is "b_prefill"
    when A's largest gap overlaps B's prefill (so eager's stall, which ends just after it, counts), else
    "decode".
    stalls / stall_excess_ms: gaps strictly above the threshold. Throughput: timed outputs / makespan."""
    _expect(
        np.isfinite(stall_threshold_ms) and stall_threshold_ms >= 0,
        f"stall_threshold_ms must be a finite number >= 0, got {stall_threshold_ms!r}",
    )
    rows = [
        {
            "policy": t["policy"],
            "trial": t["trial"],
            "peer": bool(t.get("peer")),  # timed beside the policies, never gated, its trials after theirs
            **trial_metrics(t, stall_threshold_ms=stall_threshold_ms),
        }
        for t in _trials(report)
    ]
    return pd.DataFrame(rows)


# ---- summaries and ratios --------------------------------------------------------------------------
def metric_columns(metrics: pd.DataFrame) -> list:
    """The numeric metric columns (everything but policy, trial, the peer flag and the phase label)."""
    return [c for c in metrics.select_dtypes("number").columns if c not in ("trial", "peer")]


def summary_frame(metrics: pd.DataFrame) -> pd.DataFrame:
    """Tidy: policy, metric, median, min, max, n (trials with a value; NaN maxima are left out)."""
    rows = []
    for policy, sub in metrics.groupby("policy", sort=False):
        for col in metric_columns(metrics):
            v = sub[col]
            rows.append(
                {
                    "policy": policy,
                    "metric": col,
                    "median": v.median(),
                    "min": v.min(),
                    "max": v.max(),
                    "n": int(v.count()),
                }
            )
    return pd.DataFrame(rows, columns=["policy", "metric", "median", "min", "max", "n"])


def paired_ratios(
    metrics: pd.DataFrame,
    *,
    numerator: str,
    denominator: str,
    columns=RATIO_METRICS,
    n_boot: int = 2000,
    seed: int = 0,
    ci: float = 0.95,
):
    """Ratios numerator/denominator paired by trial number; returns (per_trial, summary) frames.

    summary has the median ratio over trials and a bootstrap percentile CI of that median (NaN, with
    ci_note saying why, below MIN_BOOT_TRIALS finite ratios). Each metric resamples from its own
    default_rng(seed), so a CI does not depend on which other metrics are asked for."""
    known = list(metrics["policy"].unique())
    for name in (numerator, denominator):
        _expect(name in known, f"unknown policy {name!r}; the metrics have {', '.join(map(str, known))}")
    bad = [c for c in columns if c not in metric_columns(metrics)]
    _expect(not bad, f"unknown metric(s) {', '.join(bad)}; choose from {metric_columns(metrics)}")
    _expect(0 < ci < 1 and n_boot >= 1, f"need 0 < ci < 1 and n_boot >= 1, got ci={ci}, n_boot={n_boot}")
    num, den = (metrics[metrics["policy"] == p].set_index("trial")[list(columns)] for p in (numerator, denominator))
    paired = num.index.intersection(den.index).sort_values()
    _expect(not paired.empty, f"no trial number has both {numerator!r} and {denominator!r}")
    ratio = num.loc[paired] / den.loc[paired]
    per_trial = pd.DataFrame(
        [
            {
                "numerator": numerator,
                "denominator": denominator,
                "metric": c,
                "trial": tr,
                "numerator_value": num.at[tr, c],
                "denominator_value": den.at[tr, c],
                "ratio": ratio.at[tr, c],
            }
            for c in columns
            for tr in paired
        ]
    )
    summary = pd.DataFrame(
        [
            {
                "numerator": numerator,
                "denominator": denominator,
                "metric": c,
                **_median_ci(ratio[c].to_numpy(float), n_boot=n_boot, seed=seed, ci=ci),
            }
            for c in columns
        ]
    )
    return per_trial, summary


def median_ci(values, *, n_boot: int = 2000, seed: int = 0, ci: float = 0.95) -> dict:
    """The median of `values` (NaN and inf dropped) and a bootstrap percentile CI of it, as paired_ratios
    computes for ratios: {n, median, ci_low, ci_high, ci_level, ci_note}; no CI below MIN_BOOT_TRIALS values."""
    out = _median_ci(np.asarray(values, dtype=float), n_boot=n_boot, seed=seed, ci=ci)
    out["median"] = out.pop("median_ratio")
    out["ci_note"] = out["ci_note"].replace("paired trials", "trials")
    return out


def _median_ci(r, *, n_boot, seed, ci):
    r = r[np.isfinite(r)]  # a zero denominator says nothing about the typical ratio
    out = {
        "n": r.size,
        "median_ratio": np.median(r) if r.size else np.nan,
        "ci_low": np.nan,
        "ci_high": np.nan,
        "ci_level": ci,
        "ci_note": "",
    }
    if r.size < MIN_BOOT_TRIALS:
        out["ci_note"] = f"{r.size} paired trials < {MIN_BOOT_TRIALS}: no bootstrap CI"
        return out
    rng = np.random.default_rng(seed)
    medians = np.median(r[rng.integers(0, r.size, size=(n_boot, r.size))], axis=1)
    out["ci_low"], out["ci_high"] = np.percentile(medians, [50 * (1 - ci), 50 * (1 + ci)])
    return out

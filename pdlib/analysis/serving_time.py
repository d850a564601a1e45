"""Where a serving run's time goes, from its step log: the span covered by steps that carry prompt tokens, by
decode-only steps, and by no step at all (the host between steps, or the loop waiting for the next arrival),
and the host's part: how long it spent building and starting steps (`t_issued_ns - t_start_ns`, recorded by
`serve`; a peer's or an older report's runs have none).

    frame = time_frame(report, label=serving.run_label)   # one row per run
    table = time_table(frame)                              # the same as shares of each makespan, for reading
    line = time_line(frame, "mixed")

A step covers [t_start, t_end]: from the host starting to build it to its tokens seen. Pipelined steps overlap
(the next is issued before the one before is seen), so each kind's time is the measure of its intervals'
union, and a decode-only step's time under a prompt step counts as the prompt step's. Against the run's
makespan these say whether prompt work (prefill stalls), the host, or the arrivals (an idle server) took it;
`host_share` is the host's building time over the time some step was in flight: near 1, steps wait on the host.
Under overlap, partition and disagg a prompt runs beside the steps (on a second stream, a slice, a worker): only
the step that joins it carries its tokens, so their prompt work shows as that step's wait and as the decode
steps it slows.
"""

import numpy as np
import pandas as pd

from pdlib.report.serving import NS_PER_MS
from pdlib.report.serving_loss import time_split

COLUMNS = [
    "run",
    "peer",
    "makespan_ms",
    "prompt_steps_ms",
    "decode_steps_ms",
    "no_step_ms",
    "waiting_ms",
    "host_ms",
    "host_share",
]


def time_frame(report: dict, label=lambda run: run["policy"]) -> pd.DataFrame:
    """One row per run, named by `label(run)` (analysis.serving.run_label, as its tables name runs): its makespan
    and where it went (report.serving_loss.time_split), in ms; waiting_ms is NaN for a run of replicas (each
    replica waits on its own), host_ms and host_share NaN where the steps have no issue times."""
    rows = []
    for i, run in enumerate(report["runs"]):
        t = time_split(run, f"runs[{i}] ({run['policy']})")
        ms = {k: np.nan if v is None else v / NS_PER_MS for k, v in t.items()}
        rows.append(
            {
                "run": label(run),
                "peer": bool(run.get("peer")),
                "makespan_ms": ms["makespan"],
                "prompt_steps_ms": ms["prompt_steps"],
                "decode_steps_ms": ms["decode_steps"],
                "no_step_ms": ms["no_step"],
                "waiting_ms": ms["waiting"],
                "host_ms": ms["host"],
                "host_share": ms["host"] / ms["busy"] if t["busy"] and t["host"] is not None else np.nan,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def time_table(frame: pd.DataFrame) -> pd.DataFrame:
    """time_frame for reading: the makespan in s and each part as a share of it; the host's share of the busy
    time; "-" where unknown."""
    pct = lambda v, m: "-" if pd.isna(v) or not m > 0 else f"{v / m:.0%}"  # noqa: E731
    out = pd.DataFrame({"run": frame["run"], "makespan (s)": [f"{m / 1000:.3g}" for m in frame["makespan_ms"]]})
    for col, head in (
        ("prompt_steps_ms", "prompt steps"),
        ("decode_steps_ms", "decode-only steps"),
        ("no_step_ms", "no step"),
        ("waiting_ms", "of which waiting"),
    ):
        out[head] = [pct(v, m) for v, m in zip(frame[col], frame["makespan_ms"])]
    out["host, of busy"] = ["-" if pd.isna(v) else f"{v:.0%}" for v in frame["host_share"]]
    return out


def time_line(frame: pd.DataFrame, run: str) -> str:
    """One finding: the run's makespan split into prompt steps, decode-only steps and no step, and the host's
    share of the time a step was in flight."""
    r = frame[frame["run"] == run].iloc[0]
    m = r["makespan_ms"]
    if not m > 0:
        return f"**{run}**: no time recorded."
    pct = lambda v: f"{v / m:.0%}"  # noqa: E731
    wait = "" if pd.isna(r["waiting_ms"]) else f", {pct(r['waiting_ms'])} waiting for arrivals"
    text = (
        f"**{run}**: of its {m / 1000:.3g} s, {pct(r['prompt_steps_ms'])} in steps with prompt tokens, "
        f"{pct(r['decode_steps_ms'])} in decode-only steps, {pct(r['no_step_ms'])} with no step in flight{wait}"
    )
    if pd.notna(r["host_share"]):
        text += f"; the host spent {r['host_share']:.0%} of the time a step was in flight building steps"
    return text + "."


__all__ = ["COLUMNS", "time_frame", "time_line", "time_table"]

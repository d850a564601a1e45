"""Tables of rate searches that notebook 05 shows: pdlib's best policy against mlx-lm per criterion
(report.serving_versus), and where each searched value is lost (each result's `limit`,
report.serving_loss.search_limit).

    table = versus_table(searches)      # searches: analysis.serving.load_search_report's {run: [results]}
    frame = limits_frame(searches)
    table = limits_table(frame)         # for reading

    line, provenance = search_header(path)   # for a notebook reading a search report alone

A row per run and search that failed somewhere: the value, the rate it was lost at (its median rep's lowest
failing rate), the bounds broken there, the cause named by the rule in report.serving_loss, and the numbers
behind it: of the gaps over the TBT bound, the share with prompt work inside; of the late requests' TTFT, the
share spent waiting for their first prompt step; the host's share of busy time; the most requests at once.
"""

import json
import math

import pandas as pd

from pdlib.analysis.present import provenance
from pdlib.errors import InputError
from pdlib.report.io import read_text
from pdlib.report.serving_loss import limit_text
from pdlib.report.serving_versus import ratio_text, side_text, versus

COLUMNS = [
    "run",
    "search",
    "value",
    "lost_at",
    "failed",
    "causes",
    "stall_share",
    "wait_share",
    "host_share",
    "peak_requests",
    "text",
]


def versus_table(searches: dict, dtype: str = "fp32") -> pd.DataFrame:
    """Per criterion searched for both: the best policy's value and CI, the best `dtype` mlx-lm peer's, their
    ratio with its interval, and whether it meets the target (report.serving_versus)."""
    rows = [
        {
            "search": r["criterion"],
            "best policy": side_text(r, "policy"),
            f"mlx-lm {dtype}": side_text(r, "peer"),
            "ratio": ratio_text(r),
            f"{r['target']:g}x": "met" if r["meets"] else "not met",
        }
        for r in versus(searches, dtype=dtype)
    ]
    return pd.DataFrame(rows)


def _limit(run: str, search: str, lim) -> dict | None:
    if lim is None:
        return None
    keys = ("rate", "rep", "slo", "failed", "causes", "loss")
    if not isinstance(lim, dict) or any(k not in lim for k in keys) or not isinstance(lim["failed"], list):
        raise InputError(f"searches[{run!r}] {search}: limit must hold {', '.join(keys)}")
    return lim


def _ratio(part, whole) -> float:
    return part / whole if whole else math.nan


def limits_frame(searches: dict) -> pd.DataFrame:
    """One row per run and search whose value is lost within the searched rates (module docstring); a result
    without a `limit` (a report from before limits were kept) gives no row."""
    rows = []
    for run, results in searches.items():
        for r in results:
            lim = _limit(run, r["criterion"], r.get("limit"))
            if lim is None:
                continue
            loss, n = lim["loss"] or {}, lim["slo"]
            failed = ", ".join(f["field"] for f in lim["failed"])
            rows.append(
                {
                    "run": run,
                    "search": r["criterion"],
                    "value": r.get("text", f"{r['value']:.4g}"),
                    "lost_at": lim["rate"],
                    "failed": failed,
                    "causes": ", ".join(lim["causes"]) or "-",
                    "stall_share": _ratio(loss.get(f"tbt_over_{n}_prompt", 0), loss.get(f"tbt_over_{n}", 0)),
                    "wait_share": loss.get(f"ttft_over_{n}_wait_share", math.nan),
                    "host_share": loss.get("host_share", math.nan),
                    "peak_requests": loss.get("peak_requests", math.nan),
                    "text": limit_text(lim),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def limits_table(frame: pd.DataFrame) -> pd.DataFrame:
    """limits_frame for reading: shares as percentages, "-" where unknown."""
    pct = lambda v: "-" if pd.isna(v) else f"{v:.0%}"  # noqa: E731
    return pd.DataFrame(
        {
            "run": frame["run"],
            "search": frame["search"],
            "value": frame["value"],
            "lost at": [f"{v:.4g}" for v in frame["lost_at"]],
            "failed": frame["failed"],
            "cause": frame["causes"],
            "over-TBT gaps with a prompt": [pct(v) for v in frame["stall_share"]],
            "late TTFT waiting": [pct(v) for v in frame["wait_share"]],
            "host, of busy": [pct(v) for v in frame["host_share"]],
            "peak requests": ["-" if pd.isna(v) else f"{v:g}" for v in frame["peak_requests"]],
        }
    )


def search_header(path) -> tuple[str, str]:
    """A search report's one line (model and device, its reps, its runs, its SLOs) and its provenance paragraph;
    InputError naming the file where it cannot be read."""
    try:
        report = json.loads(read_text(path))
        env, params, reps = report.get("environment") or {}, report.get("params") or {}, report.get("reps") or []
        runs = list(dict.fromkeys(s["policy"] for s in report["searches"]))
        slos = report.get("slos") or {}
        bounds = [f"{n} TBT/TPOT {s['tbt_ms']:.3g} ms" for n, s in slos.items()]
        ttft = [f"TTFT {s['ttft_ms']:.3g} ms" for s in slos.values()][:1]
        source = (params.get("workload") or {}).get("source")
        line = (
            f"{params.get('model')} on {env.get('device_name') or env.get('device')}: rate searches over "
            f"{len(reps)} reps of {'/'.join(str(r.get('requests')) for r in reps)} requests ({source}), "
            f"runs {', '.join(runs) or 'none'}; SLOs " + ", ".join(bounds + ttft)
        )
        return line, provenance(report)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise InputError(f"{path}: cannot read a search report's header ({e})") from None


__all__ = ["COLUMNS", "limits_frame", "limits_table", "search_header", "versus_table"]

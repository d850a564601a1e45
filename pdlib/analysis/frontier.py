"""The chunk-size frontier from a sweep folder, in pandas only (no MLX): per-point medians with bootstrap CIs,
and the Pareto set on (B's TTFT, A's gap), lower is better for both.

    from pdlib.analysis import frontier as fr
    sweep = fr.load_sweep("outputs/local/sweep")     # index.json + every report it lists; InputError if malformed
    metrics = fr.sweep_metrics(sweep)                # one row per (point, trial): analysis.metrics_frame's columns
    points = fr.with_frontiers(fr.point_summary(metrics))   # one row per point, medians + CIs + frontier flags

A point is one policy at one chunk size (one report). The frontier is computed over the swept points only:
the reference policies (eager, fifo, ...) ran at one chunk size and are a different kind of choice, so they
are drawn beside it, and `dominated_by_*` says whether some swept point beats them on both axes.
Medians are over a point's trials; its CIs are bootstrap intervals of that median (analysis.median_ci), not
paired: each point is its own run.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pdlib.analysis import frames as an
from pdlib.analysis import present
from pdlib.errors import InputError
from pdlib.report.io import read_text, report_file
from pdlib.report.schema import SWEEP_INDEX as INDEX
from pdlib.report.schema import SWEEP_SCHEMA
from pdlib.report.schema import sweep_report_name as report_name

POINT_METRICS = ("a_gap_max_ms", "a_gap_p99_ms", "b_ttft_ms", "makespan_ms", "throughput_tok_s")
X = "b_ttft_ms"
FRONTIERS = {"max_gap": "a_gap_max_ms", "p99_gap": "a_gap_p99_ms"}  # name -> y metric, each against X
POINT_KEYS = ("policy", "chunk_size", "role", "report", "passed", "trials")


def load_sweep(folder) -> dict:
    """{"dir", "index", "reports": {file name: report}} for a folder `sweep` wrote (each report read as the
    index names it, or compressed beside it as <name>.gz, as published folders keep them); InputError (one line)
    when the index is missing or malformed, or a listed report is missing, malformed or not the point it claims."""
    folder = Path(folder)
    path = folder / INDEX
    if not path.is_file():
        raise InputError(f"{folder}: no {INDEX} (not a sweep folder, or the sweep was interrupted before its end)")
    try:
        index = json.loads(read_text(path, what="the sweep index"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: cannot read the sweep index ({e})") from None
    if not isinstance(index, dict) or index.get("schema") != SWEEP_SCHEMA:
        raise InputError(
            f"{path}: schema is {index.get('schema') if isinstance(index, dict) else None!r}, expected {SWEEP_SCHEMA!r}"
        )
    points = index.get("points")
    if not isinstance(points, list) or not points:
        raise InputError(f"{path}: lists no completed points")
    reports = {}
    for i, pt in enumerate(points):
        if not isinstance(pt, dict) or any(k not in pt for k in POINT_KEYS):
            raise InputError(f"{path}: points[{i}] needs keys {', '.join(POINT_KEYS)}")
        if pt["report"] != report_name(pt["policy"], pt["chunk_size"]) or pt["role"] not in ("swept", "reference"):
            raise InputError(f"{path}: points[{i}] ({pt['report']!r}, role {pt['role']!r}) is not a sweep point")
        report = an.load_report(report_file(folder / pt["report"]))  # a published sweep's: <name>.json.gz
        params = report["params"]
        if params.get("policies") != [pt["policy"]] or params.get("chunk_size") != pt["chunk_size"]:
            raise InputError(
                f"{folder / pt['report']}: ran {params.get('policies')} at chunk "
                f"{params.get('chunk_size')}, not the index's {pt['policy']} at {pt['chunk_size']}"
            )
        reports[pt["report"]] = report
    return {"dir": folder, "index": index, "reports": reports}


def stall_threshold(sweep: dict, override=None) -> float:
    """present.stall_threshold for the sweep's params (every point ran with them)."""
    return present.stall_threshold({"params": sweep["index"].get("params") or {}}, override)


def sweep_metrics(sweep: dict, *, stall_threshold_ms: float = 100.0) -> pd.DataFrame:
    """analysis.metrics_frame of every point's report, stacked, with chunk_size, role and report columns;
    rows in the index's order (references first, then by chunk size)."""
    parts = []
    for pt in sweep["index"]["points"]:
        m = an.metrics_frame(sweep["reports"][pt["report"]], stall_threshold_ms=stall_threshold_ms)
        parts.append(m.assign(chunk_size=pt["chunk_size"], role=pt["role"], report=pt["report"]))
    return pd.concat(parts, ignore_index=True)


def label(policy: str, chunk_size: int) -> str:
    return f"{policy} c={chunk_size}"


def point_summary(
    metrics: pd.DataFrame, *, columns=POINT_METRICS, n_boot: int = 2000, seed: int = 0, ci: float = 0.95
) -> pd.DataFrame:
    """One row per (policy, chunk_size, role): trials, and per metric M its median M with M_lo, M_hi (the
    bootstrap CI of the median; NaN below analysis.MIN_BOOT_TRIALS trials, ci_note says so)."""
    rows = []
    for (policy, chunk, role), g in metrics.groupby(["policy", "chunk_size", "role"], sort=False):
        row = {
            "policy": policy,
            "chunk_size": int(chunk),
            "role": role,
            "label": label(policy, chunk),
            "trials": int(g["trial"].nunique()),
        }
        for c in columns:
            m = an.median_ci(g[c].to_numpy(float), n_boot=n_boot, seed=seed, ci=ci)
            row.update({c: m["median"], f"{c}_lo": m["ci_low"], f"{c}_hi": m["ci_high"]})
        row["ci_note"] = m["ci_note"]
        rows.append(row)
    return pd.DataFrame(rows)


def pareto_mask(x, y) -> np.ndarray:
    """True where no other point is at least as good on both (lower x and y) and strictly better on one.
    Equal points do not dominate each other, so ties stay on the frontier together; NaN is never on it."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    le = (x[None, :] <= x[:, None]) & (y[None, :] <= y[:, None])  # [i, j]: j at least as good as i
    lt = (x[None, :] < x[:, None]) | (y[None, :] < y[:, None])
    dominated = (le & lt & ok[None, :]).any(axis=1)
    return ok & ~dominated


def dominators(points: pd.DataFrame, *, x: str = X, y: str) -> list[str]:
    """For each row, the labels of the swept points that dominate it ('' if none), joined by ', '."""
    swept = points[points["role"] == "swept"]
    out = []
    for _, p in points.iterrows():
        better = swept[(swept[x] <= p[x]) & (swept[y] <= p[y]) & ((swept[x] < p[x]) | (swept[y] < p[y]))]
        out.append(", ".join(better["label"]))
    return out


def with_frontiers(points: pd.DataFrame) -> pd.DataFrame:
    """`points` plus, for each FRONTIERS name N: on_frontier_N (swept points only) and dominated_by_N."""
    out = points.copy()
    swept = (out["role"] == "swept").to_numpy()
    for name, y in FRONTIERS.items():
        flag = np.zeros(len(out), dtype=bool)
        flag[swept] = pareto_mask(out.loc[swept, X], out.loc[swept, y])
        out[f"on_frontier_{name}"] = flag
        out[f"dominated_by_{name}"] = dominators(out, y=y)
    return out


def reading(points: pd.DataFrame) -> str:
    """A few Markdown lines: the frontier (max gap) from lowest TTFT to lowest gap, and each reference point's
    place against it. Medians; whether two close points really differ is for their CIs to say."""
    swept = points[points["role"] == "swept"]
    front = swept[swept["on_frontier_max_gap"]].sort_values(X, kind="stable")
    lines = [
        f"- **Frontier (A's max gap against B's TTFT):** {len(front)} of {len(swept)} swept points: "
        + "; ".join(f"{r['label']} ({_ms(r[X])} TTFT, {_ms(r['a_gap_max_ms'])} max gap)" for _, r in front.iterrows())
        + "."
    ]
    p99 = swept[swept["on_frontier_p99_gap"]].sort_values(X, kind="stable")
    lines.append(f"- **With A's p99 gap instead:** {', '.join(p99['label'])}.")
    for _, r in points[points["role"] == "reference"].iterrows():
        by = r["dominated_by_max_gap"]
        where = f"dominated by {by}" if by else "not dominated by any swept point"
        lines.append(
            f"- **{r['policy']}** (reference, c={r['chunk_size']}): {_ms(r[X])} TTFT, "
            f"{_ms(r['a_gap_max_ms'])} max gap: {where}."
        )
    span = points["makespan_ms"]
    lines.append(f"- **Makespan** ranges {_ms(span.min())} to {_ms(span.max())} over all points (medians).")
    return "\n".join(lines) + "\n"


def _ms(v) -> str:
    return "-" if pd.isna(v) else f"{v / 1000:.3g} s" if abs(v) >= 1000 else f"{v:.3g} ms"


def tables(metrics: pd.DataFrame, points: pd.DataFrame) -> dict:
    """sweep_metrics.csv (one row per point and trial), frontier.csv (one row per point: medians, CIs, flags)
    and frontier.md (the frontier, then every point), by file name, for plots.write_tables."""
    md = (
        "## Frontier (A's max gap against B's TTFT)\n\n"
        f"{present.markdown(present.frontier_table(points, only_frontier=True))}"
        f"\n\n## Every point\n\n{present.markdown(present.frontier_table(points))}\n\n"
        f"Medians over each point's trials; brackets: 95% bootstrap CI of the median "
        f"({an.MIN_BOOT_TRIALS} or more trials).\n"
    )
    return {"sweep_metrics.csv": metrics, "frontier.csv": points, "frontier.md": md}

"""What the notebooks show, from a finished report's dict alone: checks, one-line summaries, tables, notes
and charts. Presentation never reaches into the engine: nothing here imports MLX, mlx-lm or transformers.

    from pdlib.analysis import present
    report = present.check_report_file("outputs/smoke-cpu/report.json.gz")   # .json or .json.gz; InputError: one line
    print(present.run_line(report)); print(present.validation_table(report))
    present.headline_table(summary)       # compact per-policy medians, units in the headers
    present.show_chart(chart)             # live Altair in JupyterLab, PNG + alt text in HTML
"""

from dataclasses import fields

import pandas as pd

from pdlib import text
from pdlib.analysis import findings
from pdlib.analysis import frames as an
from pdlib.config import RunParams
from pdlib.errors import InputError, is_finite
from pdlib.report.metrics import slo_summary


# ---- reading a report ------------------------------------------------------------------------------
def stall_threshold(report: dict, override=None) -> float:
    """The stall threshold in ms: `override` (a notebook parameter) if given, else the report's
    params.stall_threshold_ms, 100 for reports that lack it. Checked here, once, as user input."""
    value = (report.get("params") or {}).get("stall_threshold_ms", 100.0) if override is None else override
    if not (is_finite(value) and value > 0):
        raise InputError(f"stall_threshold_ms must be a finite number > 0, got {value!r:.60}")
    return float(value)


def report_params(report: dict, *, where: str = "report") -> RunParams:
    """A report's params as RunParams; InputError (one line) when this pdlib cannot read them."""
    params = report["params"]
    if not isinstance(params, dict):
        raise InputError(f"{where}: params is not an object")
    unknown = sorted(set(params) - {f.name for f in fields(RunParams)})
    if unknown:
        raise InputError(f"{where}: params has unknown key(s) {', '.join(unknown)}")
    try:  # a report from before pipelined decodes (or polling in chunks) were recorded ran without them
        return RunParams(**{"pipeline_decodes": False, "poll_during_chunks": False, **params})
    except InputError as e:
        raise InputError(f"{where}: params: {e}") from None


def check_report_file(path) -> dict:
    """analysis.load_report, plus everything the notebooks read from it: InputError before any kernel starts."""
    report = an.load_report(path)
    report_params(report, where=str(path))
    stall_threshold(report)
    validation_table(report, where=str(path))
    for key in ("model", "environment"):
        if not isinstance(report[key], dict):
            raise InputError(f"{path}: {key} is not an object")
    _check_prompts(report["prompts"], where=str(path))
    try:
        run_line(report)
    except KeyError as e:
        raise InputError(f"{path}: lacks {e} for the run summary") from None
    except TypeError as e:  # a field of the wrong kind, named by what Python could not do with it
        raise InputError(f"{path}: the run summary cannot read model, environment or params ({e})") from None
    return report


def _check_prompts(prompts, *, where: str) -> None:
    """The report's prompts (null in reports made without them): each request's prompt an object naming the
    tokenizer that made it, as the run summary reads it."""
    if prompts is None:
        return
    if not isinstance(prompts, dict):
        raise InputError(f"{where}: prompts is {prompts!r:.60}; expected an object mapping each request to its prompt")
    for name, prompt in prompts.items():
        if not isinstance(prompt, dict) or not isinstance(prompt.get("tokenizer"), str):
            raise InputError(
                f"{where}: prompts.{name} is {prompt!r:.60}; expected an object with its tokenizer's name (a string)"
            )


# ---- lines and tables ------------------------------------------------------------------------------
run_line = text.run_line


def validation_table(report: dict, *, where: str = "report") -> str:
    """The gate's per-policy table a run prints, from the report's validation dicts."""
    try:
        return text.validation_table(report["validation"])
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: validation results are malformed ({type(e).__name__}: {e})") from None


def environment_table(report: dict) -> pd.DataFrame:
    """Where and on what the report was made: model, weights source, then its environment block."""
    rows = {
        "model": report["model"].get("spec"),
        "weights": weights(report),
        "created (UTC)": report.get("created_utc"),
        **(report.get("environment") or {}),
    }
    return pd.DataFrame({"value": ["" if v is None else str(v) for v in rows.values()]}, index=list(rows))


def weights(report: dict) -> str:
    src = report.get("model")
    if not src:  # a search report written before reports named their weights
        return "not recorded in this report"
    if src.get("source") == "synthetic":
        text = f"synthetic (random, seed {src.get('seed')})"
        return text + (f", instead of {src['fallback_from']}" if src.get("fallback_from") else "")
    return f"{src.get('source')} {src.get('path')}" + (f" @ {src['revision']}" if src.get("revision") else "")


def provenance(report: dict) -> str:
    """One Markdown paragraph: what ran where, and what synthetic weights mean for the numbers."""
    env, model = report.get("environment") or {}, report.get("model") or {}
    spec = model.get("spec") or (report.get("params") or {}).get("model")  # a search report without `model`
    text = (
        f"**Provenance:** {spec} on {env.get('device_name') or env.get('device')} "
        f"({env.get('backend')}, MLX {env.get('mlx')}), report created {report.get('created_utc')}; "
        f"weights: {weights(report)}."
    )
    if model.get("source") == "synthetic":
        text += (
            " The weights are random with the model's shapes: the arithmetic, and so the timings, are "
            "the real model's, but the token sequences are not, and the tokens' top-1 margins are not "
            "those real weights would leave."
        )
    return text


HEADLINE_COLUMNS = {  # metric -> (column header with unit, scale from the frame's unit)
    "a_gap_max_ms": ("A's max gap (ms)", 1.0),
    "a_gap_p99_ms": ("A's p99 gap (ms)", 1.0),
    "b_ttft_ms": ("B's TTFT (ms)", 1.0),
    "makespan_ms": ("makespan (s)", 1e-3),
    "throughput_tok_s": ("throughput (tok/s)", 1.0),
    "stalls": ("stalls", 1.0),
}


def _round(v: float) -> str:
    """Three significant figures, at most one decimal above 10 (no 6-decimal floats in a table)."""
    if pd.isna(v):
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def headline_table(summary: pd.DataFrame, *, stall_threshold_ms: float = 100.0) -> pd.DataFrame:
    """One row per policy: trials, then the headline metrics' medians over trials, rounded, units in the
    headers (as strings: this is for reading, metrics.csv has the full numbers)."""
    med = summary.pivot(index="policy", columns="metric", values="median")
    med = med.loc[list(summary["policy"].unique())]
    out = pd.DataFrame(index=med.index)
    out["trials"] = summary.groupby("policy", sort=False)["n"].max().astype(int)
    for metric, (label, scale) in HEADLINE_COLUMNS.items():
        label = f"stalls > {stall_threshold_ms:g} ms" if metric == "stalls" else label
        out[label] = [_round(v * scale) for v in med[metric]]
    out.index.name, out.columns.name = "policy", None
    return out


def markdown(df: pd.DataFrame, **kw) -> str:
    """A frame as a Markdown table (text right-aligned like numbers: every cell here is a number)."""
    return df.to_markdown(stralign="right", disable_numparse=True, **kw)


def ratio_table(ratios: pd.DataFrame) -> pd.DataFrame:
    """The paired ratios for reading: metric, median ratio, CI, and what the CI says (a CI that spans 1
    is no measurable difference)."""
    r0 = ratios.iloc[0]
    words = {
        "higher": f"{r0['numerator']} higher",
        "lower": f"{r0['numerator']} lower",
        "same": "no measurable difference",
        "unknown": "too few trials for a CI",
    }
    labels = {k: v[0] for k, v in HEADLINE_COLUMNS.items()}
    return pd.DataFrame(
        {
            "metric": [labels.get(m, m) for m in ratios["metric"]],
            f"{r0['numerator']} / {r0['denominator']}": [_round(v) for v in ratios["median_ratio"]],
            f"{r0['ci_level']:.0%} CI": [
                "-" if pd.isna(lo) else f"[{_round(lo)}, {_round(hi)}]"
                for lo, hi in zip(ratios["ci_low"], ratios["ci_high"])
            ],
            "reading": [words[findings.verdict(r)] for _, r in ratios.iterrows()],
        }
    ).set_index("metric")


# ---- charts ----------------------------------------------------------------------------------------
def show_chart(chart, *, alt: str | None = None):
    """Display a chart as one bundle: live Vega-Lite (tooltips) where the front end renders it, as in
    JupyterLab, and a PNG (png.render, the bytes plots.save_chart saves) with alt text where it does not, as
    in the offline HTML export. A published notebook keeps the PNG alone (publish.notebooks drops the
    Vega-Lite copy), and where its folder holds those bytes as a file, refers to the file instead
    (publish.charts), so no chart is stored twice. `alt` defaults to the chart's description."""
    import base64

    from IPython.display import display

    from pdlib.analysis import png

    spec = chart.to_dict()
    alt = alt or spec.get("description") or "chart"
    data = png.render(spec)
    width, height = png.size(data)
    bundle = {
        "application/vnd.vegalite.v5+json": spec,
        "image/png": base64.b64encode(data).decode(),
        "text/plain": f"<chart: {alt}>",
    }
    display(
        bundle,
        metadata={"image/png": {"width": width // png.SCALE, "height": height // png.SCALE, "alt": alt}},
        raw=True,
    )  # the PNG is rendered at 2x: shown at the chart's own size


# ---- the chunk-size sweep (notebook 04) ------------------------------------------------------------
def _with_ci(v, lo, hi, scale=1.0) -> str:
    return _round(v * scale) + ("" if pd.isna(lo) else f" [{_round(lo * scale)}, {_round(hi * scale)}]")


def frontier_table(points: pd.DataFrame, *, only_frontier: bool = False) -> pd.DataFrame:
    """One row per sweep point (frontier.with_frontiers), for reading: medians with their 95% CIs in brackets
    (where there are enough trials), units in the headers, and where each point stands. With only_frontier,
    the swept points on the max-gap frontier, by B's TTFT."""
    if only_frontier:
        points = points[points["on_frontier_max_gap"]].sort_values("b_ttft_ms", kind="stable")
    cols = {
        "b_ttft_ms": ("B's TTFT (ms)", 1.0),
        "a_gap_max_ms": ("A's max gap (ms)", 1.0),
        "a_gap_p99_ms": ("A's p99 gap (ms)", 1.0),
        "makespan_ms": ("makespan (s)", 1e-3),
    }
    out = pd.DataFrame(index=pd.Index(points["label"], name="point"))
    out["trials"] = points["trials"].to_numpy()
    for metric, (title, scale) in cols.items():
        out[title] = [_with_ci(r[metric], r[f"{metric}_lo"], r[f"{metric}_hi"], scale) for _, r in points.iterrows()]

    def where(r, name):
        if r["role"] == "reference":
            return "reference" + (f"; dominated by {r[f'dominated_by_{name}']}" if r[f"dominated_by_{name}"] else "")
        return "frontier" if r[f"on_frontier_{name}"] else f"dominated by {r[f'dominated_by_{name}']}"

    out["max gap vs TTFT"] = [where(r, "max_gap") for _, r in points.iterrows()]
    if not only_frontier:
        out["p99 gap vs TTFT"] = [where(r, "p99_gap") for _, r in points.iterrows()]
    return out


def slo_table(report: dict) -> pd.DataFrame:
    """metrics.slo_summary as a frame: the notebook's view of the slo policies' chunks and gaps."""
    return pd.DataFrame(slo_summary(report))


def step_table(times: pd.DataFrame) -> pd.DataFrame:
    """analysis.step_times for reading: per policy, trial and kind of step, how many and the medians in ms
    ("-" where the report predates the host's clock readings inside a step)."""
    return pd.DataFrame(
        {
            "policy": times["policy"],
            "trial": times["trial"].astype(str),
            "steps": times["kind"],
            "n": times["steps"].astype(int).astype(str),
            "ms": times["dur_ms"].map(_round),
            **{name: times[c].map(_round) for c, name in an.STEP_PARTS.items()},
        }
    )


def remote_table(remote: pd.DataFrame) -> pd.DataFrame:
    """analysis.remote_frame per policy: medians with [min, max] over trials (transfer columns for disagg)."""

    def cell(v: pd.Series, fmt) -> str:
        v = v.dropna()
        return "-" if v.empty else f"{fmt(v.median())} [{fmt(v.min())}, {fmt(v.max())}]"

    rows = {}
    for policy, sub in remote.groupby("policy", sort=False):
        rows[policy] = {
            "where": sub["site"].iloc[0],
            "trials": len(sub),
            "B's prefill (ms)": cell(sub["prefill_ms"], _round),
            "A's tokens during it": cell(sub["a_tokens_during"], lambda x: f"{x:g}"),
            "transfer (ms)": cell(sub["transfer_ms"], _round),
            "transfer (MB)": cell(sub["transfer_mb"], _round),
            "transfer (GB/s)": cell(sub["transfer_gb_s"], _round),
        }
    return pd.DataFrame.from_dict(rows, orient="index")

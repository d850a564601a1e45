"""Altair figures from the analysis frames, and one call that renders everything for a report.

    from pdlib.analysis import plots, frames as an
    report = an.load_report("outputs/smoke-cpu/report.json.gz")
    paths = plots.render_all(report, "outputs/smoke-cpu/figures")   # never overwrites
    # or one chart at a time, in a notebook:
    plots.headline_chart(an.metrics_frame(report))

Charts carry their rows inline (alt.InlineData), so Altair's 5,000-row guard never trips. Each chart is saved
once, as a PNG (analysis.png: 2x pixels, losslessly compacted), the same bytes present.show_chart shows, so a
published notebook and its page refer to this file (publish.charts) rather than store it again; no per-chart
HTML or SVG (each would carry the chart's data again, the HTML the ~1 MB vega bundle too). Only notebooks and
the render command import this module; the GPU path never does.
"""

import os
import tempfile
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

from pdlib.analysis import findings, png
from pdlib.analysis import frames as an
from pdlib.errors import InputError
from pdlib.report.io import write_new

HEADLINE = {
    "a_gap_max_ms": "A's max gap (ms)",
    "a_gap_p99_ms": "A's p99 gap (ms)",
    "b_ttft_ms": "B's TTFT (ms)",
    "makespan_ms": "makespan (ms)",
    "throughput_tok_s": "throughput (tok/s)",
}
FORMATS = ("png",)  # one file per chart
ECDF_POINTS = 2000  # per policy; thinning keeps the smallest and the largest gap


def inline(df: pd.DataFrame) -> alt.InlineData:
    # NaN is not JSON; None becomes null, which Vega-Lite skips.
    return alt.InlineData(values=df.astype(object).where(df.notna(), None).to_dict("records"))


def _policies(frame):
    return list(frame["policy"].unique())  # analysis frames are already in declared policy order


def headline_chart(metrics: pd.DataFrame) -> alt.FacetChart:
    """One panel per headline metric (own y scale): a dot per trial, a black tick at the median."""
    policies = _policies(metrics)
    long = metrics.melt(id_vars=["policy", "trial"], value_vars=list(HEADLINE), var_name="metric")
    long["label"] = long["metric"].map(HEADLINE)
    x = alt.X("policy:N", sort=policies, title=None)
    # Every panel starts at zero: a within-noise difference in makespan or throughput must look small.
    dots = (
        alt.Chart()
        .mark_circle(size=60, opacity=0.6)
        .encode(
            x=x,
            y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=True)),
            color=alt.Color("policy:N", sort=policies, legend=None),
            tooltip=["policy:N", "trial:Q", alt.Tooltip("value:Q", format=".4~g")],
        )
    )
    median = (
        alt.Chart().mark_tick(color="black", thickness=2, size=28).encode(x=x, y=alt.Y("median(value):Q", title=None))
    )
    return (
        alt.layer(dots, median, data=inline(long))
        .properties(width=110, height=220)
        .facet(column=alt.Column("label:N", sort=list(HEADLINE.values()), title=None))
        .resolve_scale(y="independent")
        .properties(
            title="Per-trial headline metrics (dot: one trial; tick: median; linear axes from 0)",
            description=f"Dot plot, one panel per metric ({', '.join(HEADLINE.values())}), "
            f"one dot per trial for each of the policies {', '.join(policies)}, "
            f"a black tick at each policy's median.",
        )
    )


def gap_timeline_chart(
    tokens: pd.DataFrame,
    events: pd.DataFrame,
    metrics: pd.DataFrame,
    *,
    trial: int = 1,
    stall_threshold_ms: float = 100.0,
) -> alt.FacetChart:
    """A's gaps against emission time, one row per policy, for one trial. Light shade: B's prefill
    interval (its first prefill chunk to its first token); darker stripes: B's prefill chunks; dashed red:
    the threshold."""
    a = tokens[(tokens["trial"] == trial) & (tokens["request"] == "A")]
    if a.empty:
        raise ValueError(f"no tokens for trial {trial}; trials present: {sorted(tokens['trial'].unique().tolist())}")
    policies = _policies(a)
    m = metrics[metrics["trial"] == trial]
    chunks = events[(events["trial"] == trial) & (events["req"] == "B") & (events["kind"] == "prefill")]
    data = pd.concat(
        [
            pd.DataFrame(
                {"policy": m["policy"], "layer": "b_prefill", "x": m["b_prefill_start_ms"], "x2": m["b_ttft_ms"]}
            ),
            pd.DataFrame(
                {"policy": chunks["policy"], "layer": "chunk", "x": chunks["t_start_ms"], "x2": chunks["t_end_ms"]}
            ),
            pd.DataFrame(
                {"policy": a["policy"], "layer": "gap", "x": a["emit_ms"], "y": a["gap_ms"], "index": a["index"]}
            ),
            pd.DataFrame({"policy": policies, "layer": "threshold", "y": float(stall_threshold_ms)}),
        ],
        ignore_index=True,
    )

    def only(layer):
        return alt.Chart().transform_filter(alt.datum.layer == layer)

    x = alt.X("x:Q", title="emission time since t0 (ms)")
    # Log y, with the threshold well inside the plot (a "nice" log domain can end exactly on it).
    positive = a["gap_ms"][a["gap_ms"] > 0]
    lo = min(positive.min(), stall_threshold_ms) / 2 if not positive.empty else stall_threshold_ms / 10
    hi = max(positive.max() if not positive.empty else 0, stall_threshold_ms) * 3
    y = alt.Y("y:Q", scale=alt.Scale(type="log", domain=[lo, hi], nice=False), title="A's gap (ms, log scale)")
    shade = only("b_prefill").mark_rect(color="orange", opacity=0.15).encode(x=x, x2="x2:Q")
    stripes = only("chunk").mark_rect(color="orange", opacity=0.35).encode(x=x, x2="x2:Q")
    gaps = (
        only("gap")
        .transform_filter(alt.datum.y > 0)
        .mark_point(filled=True, size=14)
        .encode(
            x=x, y=y, tooltip=["index:Q", alt.Tooltip("x:Q", title="emit (ms)"), alt.Tooltip("y:Q", title="gap (ms)")]
        )
    )
    rule = only("threshold").mark_rule(color="red", strokeDash=[4, 4]).encode(y=y)
    return (
        alt.layer(shade, stripes, gaps, rule, data=inline(data))
        .properties(width=640, height=150)
        .facet(row=alt.Row("policy:N", sort=policies, title=None))
        .properties(
            title=f"A's inter-token gaps, trial {trial} (log y; shaded: B's prefill; "
            f"dashed: {stall_threshold_ms:g} ms stall threshold)",
            description=f"Scatter plot per policy ({', '.join(policies)}) of A's inter-token gap "
            f"in ms on a log scale against emission time since t0, trial {trial}; "
            f"a shaded band from B's first prefill chunk to B's first token, stripes "
            f"for B's prefill chunks, a dashed line at {stall_threshold_ms:g} ms.",
        )
    )


def gap_ecdf_chart(tokens: pd.DataFrame) -> alt.HConcatChart:
    """A's gaps per policy, all trials pooled: the ECDF (log x), and beside it the tail, the fraction of
    gaps >= x on log y, where a 1-in-1024 stall is as visible as the bulk."""
    policies, parts = _policies(tokens), []
    for policy, g in tokens[tokens["request"] == "A"].groupby("policy", sort=False):
        s = np.sort(g["gap_ms"].to_numpy())
        keep = np.unique(np.linspace(0, s.size - 1, min(s.size, ECDF_POINTS)).round().astype(int))
        parts.append(
            pd.DataFrame(
                {"policy": policy, "gap_ms": s[keep], "ecdf": (keep + 1) / s.size, "tail": (s.size - keep) / s.size}
            )
        )  # fraction >= x: never 0
    data = pd.concat(parts, ignore_index=True)
    x = alt.X("gap_ms:Q", scale=alt.Scale(type="log"), title="A's gap (ms, log scale)")
    color = alt.Color("policy:N", sort=policies)
    tip = ["policy:N", alt.Tooltip("gap_ms:Q", format=".4~g", title="gap (ms)")]
    base = alt.Chart().mark_line(interpolate="step-after").properties(width=340, height=260)
    ecdf = base.encode(
        x=x,
        y=alt.Y("ecdf:Q", title="fraction of A's gaps <= x"),
        color=color,
        tooltip=[*tip, alt.Tooltip("ecdf:Q", format=".4f")],
    ).properties(title="ECDF (linear y)")
    tail = base.encode(
        x=x,
        y=alt.Y("tail:Q", scale=alt.Scale(type="log"), title="fraction of A's gaps >= x (log scale)"),
        color=color,
        tooltip=[*tip, alt.Tooltip("tail:Q", format=".2e")],
    ).properties(title="Tail: 1 - ECDF (log y)")
    return alt.hconcat(ecdf, tail, data=inline(data)).properties(
        title="A's inter-token gaps, all trials pooled",
        description=f"Two step-line charts per policy ({', '.join(policies)}) over A's gap in ms on a log "
        f"axis: left, the fraction of gaps at most x; right, the fraction at least x on a log "
        f"axis, which shows rare long gaps.",
    )


FRONTIER_Y = {"max_gap": ("a_gap_max_ms", "A's max gap"), "p99_gap": ("a_gap_p99_ms", "A's p99 gap")}


def slo_chart(frame: pd.DataFrame, *, tbt_slo_ms: float) -> alt.FacetChart:
    """Per slo policy: each B chunk's predicted gap for A (line) and the observed ones (a dot per trial)
    against B's prefilled positions, with the target as a dashed rule."""
    policies = _policies(frame)
    pred = frame.drop_duplicates(["policy", "chunk"]).assign(
        kind="predicted", gap=lambda d: d["predicted_gap_ms"], trial=None, held=None
    )
    obs = frame.assign(kind="observed", gap=frame["observed_gap_ms"])
    data = pd.concat([pred, obs])[["policy", "kind", "start", "n", "trial", "gap", "held"]].assign(target=tbt_slo_ms)
    x = alt.X("start:Q", title="B's prefilled positions before the chunk")
    y = alt.Y("gap:Q", title="A's gap across the chunk (ms)", scale=alt.Scale(zero=True))
    line = (
        alt.Chart()
        .transform_filter(alt.datum.kind == "predicted")
        .mark_line(point=True, color="black")
        .encode(x=x, y=y, tooltip=["start:Q", "n:Q", alt.Tooltip("gap:Q", format=".3~g", title="predicted ms")])
    )
    dots = (
        alt.Chart()
        .transform_filter(alt.datum.kind == "observed")
        .mark_circle(size=40, opacity=0.6)
        .encode(
            x=x,
            y=y,
            color=alt.Color(
                "held:N", title="under target", scale=alt.Scale(domain=[True, False], range=["#4c78a8", "#e45756"])
            ),
            tooltip=["start:Q", "n:Q", "trial:Q", alt.Tooltip("gap:Q", format=".3~g", title="observed ms")],
        )
    )
    rule = alt.Chart().mark_rule(strokeDash=[6, 4], color="gray").encode(y="mean(target):Q")
    return (
        alt.layer(line, dots, rule, data=inline(data))
        .properties(width=360, height=220)
        .facet(column=alt.Column("policy:N", sort=policies, title=None))
        .properties(
            title=f"A's gap across each B chunk: predicted (line) and observed (dots); "
            f"dashed: the {tbt_slo_ms:.3g} ms target",
            description=f"Per slo policy ({', '.join(policies)}): the predicted gap for A across "
            f"each B prefill chunk as a line, one dot per trial for the observed gap, "
            f"coloured by whether it stayed under the {tbt_slo_ms:.3g} ms target.",
        )
    )


def step_chart(steps: pd.DataFrame) -> alt.FacetChart | None:
    """Each prompt-chunk step's time (analysis.steps_frame) against B's prompt position it started at (the
    context its attention reads), one row per policy, one colour per trial: a trial whose steps ran slower
    stands apart. None when no prompt step ran here."""
    d = steps[steps["kind"] == "prompt"]
    if d.empty:
        return None
    policies = _policies(d)
    d = d[["policy", "trial", "rows", "prompt_start", "dur_ms", *an.STEP_PARTS]]
    ms = [alt.Tooltip(f"{c}:Q", format=".3~g", title=t) for c, t in {"dur_ms": "step ms", **an.STEP_PARTS}.items()]
    dots = (
        alt.Chart(inline(d.astype({"trial": str})))
        .mark_circle(size=30, opacity=0.7)
        .encode(
            x=alt.X("prompt_start:Q", title="B's prompt position the chunk starts at"),
            y=alt.Y("dur_ms:Q", title="step time (ms)", scale=alt.Scale(zero=True)),
            color=alt.Color("trial:N", title="trial"),
            tooltip=["trial:N", "prompt_start:Q", "rows:Q", *ms],
        )
    )
    return (
        dots.properties(width=520, height=140)
        .facet(row=alt.Row("policy:N", sort=policies, title=None))
        .properties(
            title="Each prompt-chunk step's time, per trial",
            description=f"Per policy ({', '.join(policies)}): one dot per step that carried a prompt "
            f"chunk, its time against the prompt position it starts at, coloured by "
            f"trial.",
        )
    )


def _log_span(d: pd.DataFrame, col: str) -> alt.Scale:
    """A log scale just around the data and its whiskers (a "nice" log domain pads to whole decades)."""
    v = d[[col, f"{col}_lo", f"{col}_hi"]].to_numpy(float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return alt.Scale(type="log")
    return alt.Scale(type="log", domain=[v.min() / 1.3, v.max() * 1.3], nice=False)


def _frontier_panel(points: pd.DataFrame, name: str, policies: list) -> alt.LayerChart:
    y_col, y_title = FRONTIER_Y[name]
    d = pd.DataFrame(
        {
            "label": points["label"],
            "policy": points["policy"],
            "role": points["role"],
            "chunk_size": points["chunk_size"],
            "trials": points["trials"],
            "x": points["b_ttft_ms"],
            "x_lo": points["b_ttft_ms_lo"],
            "x_hi": points["b_ttft_ms_hi"],
            "y": points[y_col],
            "y_lo": points[f"{y_col}_lo"],
            "y_hi": points[f"{y_col}_hi"],
            "makespan_ms": points["makespan_ms"],
            "on_frontier": points[f"on_frontier_{name}"],
            "dominated_by": points[f"dominated_by_{name}"],
        }
    )
    x = alt.X("x:Q", scale=_log_span(d, "x"), title="B's TTFT (ms, log scale)")
    y = alt.Y("y:Q", scale=_log_span(d, "y"), title=f"{y_title} (ms, log scale)")
    color = alt.Color("policy:N", sort=policies, title="policy", legend=alt.Legend(symbolOpacity=1))
    swept = alt.Chart().transform_filter(alt.datum.role == "swept")
    path = swept.mark_line(opacity=0.35, strokeWidth=1).encode(x=x, y=y, color=color, order="chunk_size:Q")
    front = (
        swept.transform_filter(alt.datum.on_frontier)
        .mark_line(interpolate="step-after", color="black", strokeWidth=1.5)
        .encode(x=x, y=y, order="x:Q")
    )
    whisker = alt.Chart().mark_rule(strokeWidth=1.2, opacity=0.6)
    x_ci = whisker.transform_filter("isValid(datum.x_lo)").encode(x="x_lo:Q", x2="x_hi:Q", y=y, color=color)
    y_ci = whisker.transform_filter("isValid(datum.y_lo)").encode(x=x, y="y_lo:Q", y2="y_hi:Q", color=color)
    marks = (
        alt.Chart()
        .mark_point(filled=True, opacity=0.9)
        .encode(
            x=x,
            y=y,
            color=color,
            shape=alt.Shape(
                "role:N", scale=alt.Scale(domain=["swept", "reference"], range=["circle", "diamond"]), title="point"
            ),
            # from zero: makespans that barely differ must look alike
            size=alt.Size("makespan_ms:Q", scale=alt.Scale(zero=True, range=[10, 300]), title="makespan (ms)"),
            tooltip=[
                "label:N",
                "role:N",
                "trials:Q",
                alt.Tooltip("x:Q", title="B's TTFT (ms)", format=".4~g"),
                alt.Tooltip("y:Q", title=f"{y_title} (ms)", format=".4~g"),
                alt.Tooltip("makespan_ms:Q", title="makespan (ms)", format=".4~g"),
                "on_frontier:N",
                "dominated_by:N",
            ],
        )
    )
    chunk_text = swept.mark_text(align="left", dx=6, dy=-6, fontSize=10).encode(x=x, y=y, text="chunk_size:Q")
    ref_text = (
        alt.Chart()
        .transform_filter(alt.datum.role == "reference")
        .mark_text(align="left", dx=7, dy=8, fontSize=10, fontStyle="italic")
        .encode(x=x, y=y, text="label:N")
    )
    return alt.layer(path, front, x_ci, y_ci, marks, chunk_text, ref_text, data=inline(d)).properties(
        width=360, height=300, title=f"{y_title} against B's TTFT"
    )


def frontier_chart(points: pd.DataFrame) -> alt.HConcatChart:
    """The chunk-size frontier (points from frontier.with_frontiers): per (policy, chunk size) its medians of B's
    TTFT (x) and A's max gap (left) or p99 gap (right), log axes, CI whiskers where there are enough trials,
    size = makespan, the chunk size as a label; the black staircase joins the swept points no other swept point
    beats on both axes. Reference policies are labelled diamonds, outside the frontier."""
    policies = list(dict.fromkeys([*points.loc[points["role"] == "swept", "policy"], *points["policy"]]))
    swept = points[points["role"] == "swept"]
    refs = points[points["role"] == "reference"]
    sizes = ", ".join(map(str, sorted(swept["chunk_size"].unique())))
    return alt.hconcat(*(_frontier_panel(points, n, policies) for n in FRONTIER_Y)).properties(
        title="Chunk-size frontier: A's gaps against B's first token (medians; lower left is better)",
        description=f"Two scatter plots on log-log axes, B's time to first token in ms against A's max gap "
        f"(left) and A's p99 gap (right), one point per swept policy "
        f"({', '.join(swept['policy'].unique())}) and chunk size ({sizes}), labelled with the chunk "
        f"size, sized by makespan, with confidence-interval whiskers where there are enough trials; a "
        f"black staircase joins the non-dominated points; reference policies "
        f"({', '.join(refs['label']) or 'none'}) are labelled diamonds.",
    )


def refuse_existing(paths):
    # Before writing anything; write_new then refuses atomically a file that appears meanwhile.
    for path in paths:
        if path.exists():
            raise InputError(f"{path} already exists; refusing to overwrite (pick a new folder)")


def save_chart(chart, out_dir, name: str) -> list:
    """Write name.png (png.render: the bytes present.show_chart shows, so a published notebook refers to this
    file); refuses if it exists."""
    out = Path(out_dir)
    paths = [out / f"{name}.{fmt}" for fmt in FORMATS]
    refuse_existing(paths)
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        write_new(path, png.render(chart), what="figure")
    return paths


def charts(
    tokens: pd.DataFrame, events: pd.DataFrame, metrics: pd.DataFrame, *, stall_threshold_ms: float = 100.0
) -> dict:
    """The three figures by file stem (the timeline shows the first trial)."""
    return {
        "headline": headline_chart(metrics),
        "gap_timeline": gap_timeline_chart(
            tokens, events, metrics, trial=int(metrics["trial"].min()), stall_threshold_ms=stall_threshold_ms
        ),
        "gap_ecdf": gap_ecdf_chart(tokens),
    }


def report_charts(report: dict, *, stall_threshold_ms: float = 100.0) -> dict:
    """charts() for a report: the three figures render_all and notebook 03 draw."""
    return charts(
        an.tokens_frame(report),
        an.events_frame(report),
        an.metrics_frame(report, stall_threshold_ms=stall_threshold_ms),
        stall_threshold_ms=stall_threshold_ms,
    )


def default_ratios(metrics: pd.DataFrame):
    """(per_trial, summary) ratios of the first declared policy over the second; (None, None) with one."""
    policies = _policies(metrics)
    if len(policies) < 2:
        return None, None
    return an.paired_ratios(metrics, numerator=policies[0], denominator=policies[1])


def tables(metrics: pd.DataFrame, summary: pd.DataFrame, ratios: pd.DataFrame | None = None) -> dict:
    """metrics.csv, summary.csv, summary.md (+ ratios.csv), by file name."""
    out = {
        "metrics.csv": metrics,
        "summary.csv": summary,
        "summary.md": findings.metrics_markdown(summary, ratios=ratios),
    }
    if ratios is not None:
        out["ratios.csv"] = ratios
    return out


def out_folder(out_dir) -> Path:
    """render's --out, checked before anything is drawn: InputError (one line) where it is a file, lies under
    one, or its nearest existing folder takes no new entry (a read-only disk, /proc). Leaves nothing behind."""
    out = Path(out_dir)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise InputError(f"--out {str(out)!r} is an existing file, not a folder; give a folder")
    base = out  # os.path rather than Path: no stat error (a folder that cannot be read) escapes as a traceback
    while not os.path.isdir(base):
        if os.path.lexists(base) or base == base.parent:
            raise InputError(
                f"--out {str(out)!r} lies under {str(base)!r}, an existing file, not a folder; give a folder"
            )
        base = base.parent
    try:  # a write permission bit says nothing for root or for a pseudo file system: try making an entry
        os.rmdir(tempfile.mkdtemp(prefix=".pdlib-probe-", dir=base))
    except OSError as e:
        raise InputError(
            f"--out {str(out)!r}: cannot create a folder in {str(base)!r} ({e.strerror}); give a writable folder"
        ) from None
    return out


def write_tables(out_dir, named: dict, *, refuse: bool = True) -> list:
    """Each table (DataFrame -> CSV, str -> text) atomically; refuses before writing if one exists."""
    out = out_folder(out_dir)
    if refuse:
        refuse_existing([out / name for name in named])
    out.mkdir(parents=True, exist_ok=True)
    for name, table in named.items():
        write_new(out / name, table if isinstance(table, str) else table.to_csv(index=False), what="table")
    return [out / name for name in named]


def render_all(report: dict, out_dir, *, stall_threshold_ms: float = 100.0) -> list:
    """Every figure and table for one report into out_dir; refuses before writing if any exists.

    ratios.csv (first declared policy / second, paired by trial) is written with >= 2 policies."""
    out = out_folder(out_dir)
    metrics = an.metrics_frame(report, stall_threshold_ms=stall_threshold_ms)
    named = tables(metrics, an.summary_frame(metrics), default_ratios(metrics)[1])
    figures = report_charts(report, stall_threshold_ms=stall_threshold_ms)
    refuse_existing([out / f"{name}.{fmt}" for name in figures for fmt in FORMATS] + [out / n for n in named])
    written = write_tables(out, named, refuse=False)
    for name, chart in figures.items():
        written += save_chart(chart, out, name)
    return written

"""Altair charts of one serving report (analysis.serving) and of rate searches (report.serving.search).

    from pdlib.analysis import serving as sv, serving_charts as sc
    sc.latency_chart(report)                          # TTFT and TBT ECDFs per run, and TBT's tail
    sc.timeline_chart(report, "chunked", first=0, n=12)   # requests as rows: arrival, prompt steps, tokens
    sc.attainment_chart(report)                       # throughput, and the share meeting each SLO
    sc.rate_curves_chart(searches); sc.capacity_chart(searches)   # searches: {run label: [search(...), ...]}

Every run keeps one colour across the charts (the report's order); a peer is drawn like a policy, dashed where
a line is drawn. A search result is report.serving.search's dict: criterion, value, ci, status, text, hi,
ci_level and its points {rate, rep, metric: {field: value}, pass}.
"""

import math

import altair as alt
import numpy as np
import pandas as pd

from pdlib.analysis import serving as sv
from pdlib.analysis.plots import ECDF_POINTS, inline
from pdlib.errors import InputError

FIGURES = ("latency", "timeline", "attainment")  # notebook 05's PNGs, by file stem
SEARCH_FIGURES = ("rate_curves", "capacity")  # only for a report that holds searches
METRIC_TITLES = {"tbt_p99_ms": "pooled TBT p99 (ms)", "ttft_p90_ms": "TTFT p90 (ms)"}
TIMELINE = {"lifetime": "#c7c7c7", "prompt step": "#4c78a8", "arrival": "#000000", "token": "#e45756"}


def _color(runs: list) -> alt.Color:
    return alt.Color("run:N", sort=runs, scale=alt.Scale(domain=runs), title="run")


def _dash() -> alt.StrokeDash:
    return alt.StrokeDash("kind:N", sort=["policy", "peer"], scale=alt.Scale(domain=["policy", "peer"]), title=None)


def _ecdf(values: np.ndarray, **cols) -> pd.DataFrame:
    """The ECDF and tail (fraction >= x, never 0) at up to ECDF_POINTS values, the smallest and largest kept."""
    s = np.sort(values)
    keep = np.unique(np.linspace(0, s.size - 1, min(s.size, ECDF_POINTS)).round().astype(int))
    return pd.DataFrame({**cols, "x": s[keep], "ecdf": (keep + 1) / s.size, "tail": (s.size - keep) / s.size})


def latency_chart(report: dict) -> alt.HConcatChart:
    """Per run: the ECDF of TTFT over requests, the ECDF of every inter-token gap pooled, and the gaps' tail on a
    log y (the fraction >= x, where a one-in-a-thousand stall is as visible as the bulk). Log x throughout."""
    runs = sv.labels(report)
    req, gaps = sv.requests_frame(report), sv.gaps_frame(report)
    parts = []
    for run in runs:
        kind = "peer" if req.loc[req["run"] == run, "peer"].iloc[0] else "policy"
        ttft = req.loc[(req["run"] == run) & req["ttft_ms"].notna(), "ttft_ms"].to_numpy()
        gap = gaps.loc[gaps["run"] == run, "gap_ms"].to_numpy()
        for metric, values in (("ttft", ttft), ("tbt", gap)):
            if values.size:
                parts.append(_ecdf(values, run=run, kind=kind, metric=metric))
    data = pd.concat(parts, ignore_index=True)
    data = data[data["x"] > 0]  # a log axis: the fractions were computed over every value

    def panel(metric, y, x_title, y_title, title, log_y=False):
        tip = ["run:N", alt.Tooltip("x:Q", format=".4~g", title="ms"), alt.Tooltip(f"{y}:Q", format=".3~g")]
        return (
            alt.Chart()
            .transform_filter(alt.datum.metric == metric)
            .mark_line(interpolate="step-after")
            .encode(
                x=alt.X("x:Q", scale=alt.Scale(type="log"), title=x_title),
                y=alt.Y(f"{y}:Q", scale=alt.Scale(type="log") if log_y else alt.Scale(), title=y_title),
                color=_color(runs),
                strokeDash=_dash(),
                tooltip=tip,
            )
            .properties(width=260, height=230, title=title)
        )

    return alt.hconcat(
        panel("ttft", "ecdf", "TTFT (ms, log scale)", "fraction of requests <= x", "TTFT ECDF"),
        panel("tbt", "ecdf", "inter-token gap (ms, log scale)", "fraction of gaps <= x", "TBT ECDF, pooled"),
        panel("tbt", "tail", "inter-token gap (ms, log scale)", "fraction of gaps >= x (log)", "TBT tail", True),
        data=inline(data),
    ).properties(
        title="Latency per run: time to first token and the gaps between tokens",
        description=f"Three step-line charts, one line per run ({', '.join(runs)}; peers dashed), log x in ms: "
        f"the fraction of requests whose time to first token is at most x; the fraction of all inter-token "
        f"gaps at most x; and the fraction of gaps at least x on a log y, which shows rare long stalls.",
    )


def timeline_chart(report: dict, policy=None, *, first: int = 0, n: int = 12) -> alt.LayerChart:
    """Requests first .. first + n - 1 of one run (a label or policy name; None: the first run) as rows in
    arrival order: a triangle at the arrival, a grey line to the last token, a bar per step that ran a chunk of
    the request's prompt (from the step log), a tick per emitted token. x: ms since the run's clock start."""
    run = sv.find_run(report, policy)
    label, reqs = sv.run_label(run), run["requests"]
    for name, v, lo in (("first", first, 0), ("n", n, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputError(f"timeline {name} must be an integer >= {lo}, got {v!r}")
    if first >= len(reqs):
        raise InputError(f"timeline first = {first}, but {label} has {len(reqs)} requests (0 .. {len(reqs) - 1})")
    picked = reqs[first : first + n]
    names = [r["name"] for r in picked]
    rows = []
    for r in picked:
        a = r["arrival_ns"] / sv.NS_PER_MS
        rows.append({"what": "arrival", "request": r["name"], "x": a})
        if r["emit_ns"]:
            rows.append({"what": "lifetime", "request": r["name"], "x": a, "x2": r["emit_ns"][-1] / sv.NS_PER_MS})
        for k, e in enumerate(r["emit_ns"]):
            rows.append({"what": "token", "request": r["name"], "x": e / sv.NS_PER_MS, "index": k})
    steps = run["steps"]
    wanted = set(names)
    for work, t0, t1 in zip(steps["work"], steps["t_start_ns"], steps["t_end_ns"]):
        for name, k in work:
            if k and name in wanted:  # a prompt chunk (None: a decode)
                rows.append(
                    {"what": "prompt step", "request": name, "x": t0 / sv.NS_PER_MS, "x2": t1 / sv.NS_PER_MS, "n": k}
                )
    data = pd.DataFrame(rows)
    y = alt.Y("request:N", sort=names, title=None)
    color = alt.Color(
        "what:N", scale=alt.Scale(domain=list(TIMELINE), range=list(TIMELINE.values())), title=None, legend=None
    )
    x = alt.X("x:Q", title=f"time since {label}'s clock start (ms)")

    def only(what):
        return alt.Chart().transform_filter(alt.datum.what == what)

    layers = [
        only("lifetime").mark_rule(strokeWidth=1).encode(x=x, x2="x2:Q", y=y, color=color),
        only("prompt step")
        .mark_bar(height=10)
        .encode(
            x=x,
            x2="x2:Q",
            y=y,
            color=color,
            tooltip=["request:N", alt.Tooltip("n:Q", title="prompt tokens"), alt.Tooltip("x:Q", format=".1f")],
        ),
        only("arrival")
        .mark_point(shape="triangle-right", filled=True, size=60)
        .encode(x=x, y=y, color=color, tooltip=["request:N", alt.Tooltip("x:Q", format=".2f", title="arrival")]),
        only("token")
        .mark_tick(thickness=1.5, size=14)
        .encode(x=x, y=y, color=color, tooltip=["request:N", "index:Q", alt.Tooltip("x:Q", format=".2f")]),
    ]
    last = first + len(picked) - 1
    return alt.layer(*layers, data=inline(data)).properties(
        width=720,
        height=max(22 * len(picked), 80),
        title=f"{label}: requests {first}-{last} of {len(reqs)} (triangle: arrival; blue: prompt steps; "
        f"red ticks: tokens)",
        description=f"Timeline of {label}, one row per request ({', '.join(names)}), x in ms since the run's "
        f"start: a black triangle at the arrival, a grey line to the last token, a blue bar for each step that "
        f"ran a chunk of the request's prompt, and a red tick at each emitted token.",
    )


def attainment_chart(report: dict, slos: dict | None = None) -> alt.HConcatChart:
    """Per run: output tokens per second over the run (first arrival to last token), and for each SLO (default the
    report's own) the share of requests meeting both its TTFT and its TPOT bound."""
    slos = sv.report_slos(report) if slos is None else slos
    s = sv.summary_frame(report, slos)
    runs = list(s["run"])
    rows = [{"panel": "throughput", "run": r.run, "value": r.throughput_tok_s} for r in s.itertuples()]
    for name in slos:
        rows += [{"panel": name, "run": run, "value": v} for run, v in zip(s["run"], s[f"attain_{name}"])]
    data = pd.DataFrame(rows)
    x = alt.X("run:N", sort=runs, title=None)

    def bars(panel, title, y_title, fmt, scale):
        return (
            alt.Chart()
            .transform_filter(alt.datum.panel == panel)
            .mark_bar()
            .encode(
                x=x,
                y=alt.Y("value:Q", title=y_title, scale=scale, axis=alt.Axis(format=fmt)),
                color=_color(runs),
                tooltip=["run:N", alt.Tooltip("value:Q", format=fmt)],
            )
            .properties(width=max(40 * len(runs), 160), height=220, title=title)
        )

    panels = [bars("throughput", "Throughput", "output tokens/s", ",.4~g", alt.Scale(zero=True))]
    for name, slo in slos.items():
        title = f"{name} SLO: TTFT <= {slo.ttft_ms:g} ms, TPOT <= {slo.tpot_ms:g} ms"
        panels.append(bars(name, title, "share of requests meeting it", ".0%", alt.Scale(domain=[0, 1])))
    said = f" and the share of requests meeting each SLO ({', '.join(slos)})" if slos else " (no SLO in the report)"
    return alt.hconcat(*panels, data=inline(data)).properties(
        title="Throughput" + (" and SLO attainment" if slos else "") + " per run",
        description=f"Bar charts, one bar per run ({', '.join(runs)}): output tokens per second from the first "
        f"arrival to the last token{said}.",
    )


# ---- rate searches ---------------------------------------------------------------------------------------------
def search_points(searches: dict) -> pd.DataFrame:
    """One row per run, measured point and metric field (n_lost aside): run, criterion, rate, rep, metric, value,
    passed (of that criterion). A point measured for two criteria (they share measurements) appears once per
    criterion."""
    rows = [
        {"run": run, "criterion": r["criterion"], "rate": p["rate"], "rep": p["rep"], "metric": k, "value": v,
         "passed": bool(p["pass"])}
        for run, results in sv.check_searches(searches).items()
        for r in results
        for p in r["points"]
        for k, v in (p.get("metric") or {}).items()  # None: a `meets` without .metric
        if k != "n_lost"  # a count, not a curve: a point that lost requests shows as failed
    ]  # fmt: skip
    cols = ["run", "criterion", "rate", "rep", "metric", "value", "passed"]
    return pd.DataFrame(rows, columns=cols).drop_duplicates(["run", "criterion", "metric", "rate", "rep"])


def search_values(searches: dict) -> pd.DataFrame:
    """One row per run and search: run, criterion, value, status, text, ci_low, ci_high (the search's hi where
    unbounded, then bounded False), ci_level."""
    rows = []
    for run, results in sv.check_searches(searches).items():
        for r in results:
            lo, hi = r["ci"]
            rows.append(
                {
                    "run": run,
                    "criterion": r["criterion"],
                    "value": r["value"],
                    "status": r.get("status"),
                    "text": r.get("text") or f"{r['value']:.4g}",
                    "ci_low": lo,
                    "ci_high": r.get("hi", r["value"]) if hi is None else hi,
                    "bounded": hi is not None,
                    "ci_level": math.nan if r.get("ci_level") is None else r["ci_level"],
                }
            )
    return pd.DataFrame(rows)


def _metric_title(metric: str) -> str:
    if metric.startswith("attain_"):
        return f"share meeting the {metric[len('attain_') :]} SLO"
    return METRIC_TITLES.get(metric, metric)


def slo_bounds(slos: dict, share: float = 0.9) -> pd.DataFrame:
    """The bounds the searches' criteria hold each metric to, from {name: Slo}: metric, bound, value (the pooled
    TBT p99 under each SLO's tbt_ms, the TTFT p90 under its ttft_ms, the share meeting an SLO at least `share`,
    goodput's); one row per distinct value of a metric, its label naming every SLO that sets it."""
    rows: dict = {}
    for name, slo in slos.items():
        for metric, value in (("tbt_p99_ms", slo.tbt_ms), ("ttft_p90_ms", slo.ttft_ms), (f"attain_{name}", share)):
            rows.setdefault((metric, value), []).append(name)

    def label(metric, names):
        return f"goodput's {share:.0%}" if metric.startswith("attain_") else f"{' and '.join(names)} bound"

    out = [{"metric": m, "bound": label(m, names), "value": v} for (m, v), names in rows.items()]
    return pd.DataFrame(out, columns=["metric", "bound", "value"])


def rate_curves_chart(searches: dict, slos: dict | None = None) -> alt.HConcatChart:
    """One panel per metric the searches measured (latency: TTFT p90, pooled TBT p99; goodput: the share meeting
    an SLO) against the rate multiplier, log x: a dot per measured (rate, rep), a cross where it failed its
    criterion, a line through the median over reps at each rate, and a dashed rule at each search's value; with
    `slos` ({name: Slo}, the search's), a grey rule at each bound a metric is held to (slo_bounds)."""
    points, values = search_points(searches), search_values(searches)
    bounds = slo_bounds(slos or {})
    runs = list(searches)
    metrics = list(dict.fromkeys(points["metric"]))
    found = points[["criterion", "metric"]].drop_duplicates()
    rules = values.merge(found, on="criterion")[["run", "metric", "value"]]
    rules = rules[rules["value"] > 0]
    x = alt.X("rate:Q", scale=alt.Scale(type="log"), title="rate multiplier (log scale)")
    color = _color(runs)
    panels = []
    for metric in metrics:
        d = points[(points["metric"] == metric) & points["value"].notna()].assign(
            result=lambda f: np.where(f["passed"], "pass", "fail")
        )
        log_y = not metric.startswith("attain_") and bool((d["value"] > 0).all())
        y = alt.Y("value:Q", title=_metric_title(metric), scale=alt.Scale(type="log" if log_y else "linear"))
        tip = ["run:N", "criterion:N", "rep:Q", alt.Tooltip("rate:Q", format=".4~g")]
        tip.append(alt.Tooltip("value:Q", format=".4~g"))
        dots = (
            alt.Chart(inline(d))
            .mark_point(filled=True, size=40, opacity=0.7)
            .encode(
                x=x,
                y=y,
                color=color,
                shape=alt.Shape("result:N", scale=alt.Scale(domain=["pass", "fail"], range=["circle", "cross"])),
                tooltip=tip,
            )
        )
        line = alt.Chart(inline(d)).mark_line(opacity=0.6).encode(x=x, y=alt.Y("median(value):Q"), color=color)
        rule = (
            alt.Chart(inline(rules[rules["metric"] == metric]))
            .mark_rule(strokeDash=[4, 3])
            .encode(x=alt.X("value:Q"), color=color, tooltip=["run:N", alt.Tooltip("value:Q", format=".4~g")])
        )
        b = bounds[bounds["metric"] == metric]
        bound = (
            alt.Chart(inline(b))
            .mark_rule(color="gray", strokeWidth=1)
            .encode(y=alt.Y("value:Q"), tooltip=["bound:N", alt.Tooltip("value:Q", format=".4~g")])
        )
        label = (
            alt.Chart(inline(b))
            .mark_text(align="left", dx=3, dy=-6, color="gray", fontSize=10)
            .encode(x=alt.value(0), y=alt.Y("value:Q"), text="bound:N")
        )
        layers = (line, dots, rule, bound, label) if len(b) else (line, dots, rule)
        panels.append(alt.layer(*layers).properties(width=260, height=230, title=_metric_title(metric)))
    return alt.hconcat(*panels).properties(
        title="Latency and goodput against the offered rate (each search's measured points)",
        description=f"Scatter plots with median lines, one per metric ({', '.join(map(_metric_title, metrics))}), "
        f"against the rate multiplier on a log axis, one colour per run ({', '.join(runs)}): a dot per measured "
        f"rate and repetition, a cross where it failed its criterion, a dashed vertical rule at each search's "
        f"capacity or goodput" + (", a grey horizontal rule at each SLO bound." if len(bounds) else "."),
    )


def capacity_chart(searches: dict) -> alt.FacetChart:
    """Per criterion (capacity, goodput, per SLO) one row of runs: the search's value (the lower median over
    reps) as a dot labelled with its text, and its CI as a line, dashed to the search's hi where unbounded."""
    values = search_values(searches)
    runs = list(searches)
    level = values["ci_level"].min()
    coverage = "" if pd.isna(level) else f" (coverage >= {level:.0%})"
    y = alt.Y("run:N", sort=runs, title=None)
    x = alt.X("ci_low:Q", title="rate multiplier", scale=alt.Scale(zero=True))
    tip = ["run:N", "criterion:N", "text:N", "status:N", alt.Tooltip("ci_low:Q", format=".4~g"),
           alt.Tooltip("ci_high:Q", format=".4~g"), "bounded:N"]  # fmt: skip
    ci = (
        alt.Chart()
        .mark_rule(strokeWidth=2)
        .encode(
            x=x,
            x2="ci_high:Q",
            y=y,
            color=_color(runs),
            strokeDash=alt.StrokeDash("bounded:N", scale=alt.Scale(domain=[True, False], range=[[1, 0], [4, 3]]),
                                      legend=None),
            tooltip=tip,
        )
    )  # fmt: skip
    dot = alt.Chart().mark_point(filled=True, size=80, color="black").encode(x=alt.X("value:Q"), y=y, tooltip=tip)
    label = alt.Chart().mark_text(align="left", dx=8, dy=-8).encode(x=alt.X("value:Q"), y=y, text="text:N")
    return (
        alt.layer(ci, dot, label, data=inline(values))
        .properties(width=520, height=max(24 * len(runs), 60))
        .facet(row=alt.Row("criterion:N", title=None, sort=list(dict.fromkeys(values["criterion"]))))
        .properties(
            title=f"Capacity and goodput per run: lower median over reps, CI over every rep's bracket{coverage}",
            description=f"Dot and interval chart, one row per run ({', '.join(runs)}) for each criterion "
            f"({', '.join(dict.fromkeys(values['criterion']))}): a black dot at the highest rate multiplier "
            f"meeting it (the lower median over repetitions), labelled, and a line over its confidence "
            f"interval, dashed where the interval has no upper end.",
        )
    )

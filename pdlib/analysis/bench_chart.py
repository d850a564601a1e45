"""bench-step's JSON as charts and a table: pdlib's decode and prefill times beside its peers' and the floor, and
its decode rounds (N requests a step) in each mode beside their floor.

from pdlib.analysis import bench_chart
bench_chart.render_bench(bench_result, "outputs/x")   # bench_step.png, bench_step.md (and bench_rounds.png)
"""

import altair as alt
import pandas as pd

from pdlib.analysis import plots


def bench_frames(result: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """bench-step's medians as rows: decode (engine, context, how, ms, the byte floor's ms) and prefill
    (engine, what, s); engines in the result's order, those that failed left out."""
    from pdlib.report.bench import DECODES, PAIRS, PREFILLS

    engines = {n: e for n, e in result["engines"].items() if "error" not in e}
    chunk = result.get("settings", {}).get("chunk", "?")
    decode, prefill = [], []
    for name, e in engines.items():
        for how, key in DECODES.items():
            for ctx, ms in (e.get(key) or {}).items():
                decode.append(
                    {
                        "engine": name,
                        "context": f"{int(ctx):,} context",
                        "how": how,
                        "ms": ms,
                        "floor_ms": result["floors"][ctx]["floor_ms"],
                    }
                )
        # two requests decoded in one launch: a step's time per token ("pdlib, pair"), beside the single's floor
        for (key, _), how in zip(PAIRS.items(), DECODES):
            for ctx, ms in (e.get(key) or {}).items():
                decode.append(
                    {
                        "engine": f"{name}, pair",
                        "context": f"{int(ctx):,} context",
                        "how": how,
                        "ms": ms / 2,
                        "floor_ms": result["floors"][ctx]["floor_ms"],
                    }
                )
        for key, what in PREFILLS.items():
            if key in e:
                prefill.append({"engine": name, "what": what.format(chunk=chunk), "s": e[key]})
    return pd.DataFrame(decode), pd.DataFrame(prefill)


def bench_chart(result: dict) -> alt.VConcatChart:
    """Decode: ms per token by engine, observed and pipelined, one panel per context, the byte floor as a
    black rule; prefill: seconds per engine for the whole prompt, in chunks, and in chunks each synced."""
    decode, prefill = bench_frames(result)
    engines = list(dict.fromkeys(decode["engine"]))
    hows = list(dict.fromkeys(decode["how"]))
    bars = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=alt.X("engine:N", sort=engines, title=None),
            xOffset=alt.XOffset("how:N", sort=hows),
            y=alt.Y("ms:Q", title="ms per token", scale=alt.Scale(zero=True)),
            color=alt.Color("engine:N", sort=engines, legend=None),
            opacity=alt.Opacity(
                "how:N", sort=hows, scale=alt.Scale(range=[1.0, 0.45]), legend=alt.Legend(title="token", orient="top")
            ),
            tooltip=["engine:N", "how:N", "context:N", alt.Tooltip("ms:Q", format=".4~g")],
        )
    )
    floor = (
        alt.Chart()
        .mark_rule(color="black", strokeDash=[4, 3])
        .encode(y="mean(floor_ms):Q", tooltip=[alt.Tooltip("mean(floor_ms):Q", title="byte floor (ms)", format=".3~g")])
    )
    contexts = list(dict.fromkeys(decode["context"]))
    top = (
        alt.layer(bars, floor, data=plots.inline(decode))
        .properties(width=60 * len(engines), height=220)
        .facet(column=alt.Column("context:N", sort=contexts, title=None))
        .properties(title="Decode, ms per token (dashed: the bytes a step reads at the run's copy rate)")
    )
    bottom = (
        alt.Chart(plots.inline(prefill))
        .mark_bar()
        .encode(
            x=alt.X("engine:N", sort=engines, title=None),
            y=alt.Y("s:Q", title="seconds", scale=alt.Scale(zero=True)),
            color=alt.Color("engine:N", sort=engines, legend=None),
            column=alt.Column("what:N", sort=list(dict.fromkeys(prefill["what"])), title=None),
            tooltip=["engine:N", "what:N", alt.Tooltip("s:Q", format=".4~g")],
        )
        .properties(width=40 * len(engines), height=160, title="Prefill of one prompt, seconds")
    )
    env, model = result.get("environment", {}), result.get("model", "?")
    model = model.get("spec", "?") if isinstance(model, dict) else model
    return alt.vconcat(top, bottom).properties(
        title=f"bench-step: {model} on {env.get('device_name', env.get('device', '?'))}",
        description=f"Bar charts. Top: milliseconds per decoded token for the engines {', '.join(engines)} at "
        f"each context, observed and pipelined ('pdlib, pair': two requests in one launch, its step "
        f"time halved), with the byte floor as a dashed line. Bottom: "
        f"seconds to prefill one prompt whole, in chunks, and in chunks each synced.",
    )


def rounds_frame(result: dict) -> pd.DataFrame:
    """A decode round's medians as rows (mode, rows, ms, how, floor_ms, ratio): pipelined where the mode was
    timed so (as serve runs its rounds), observed otherwise; modes in the result's order."""
    r = result["rounds"]
    out = []
    for mode, observed in r["ms"].items():
        piped = r.get("pipelined_ms", {}).get(mode)
        for n in r["rows"]:
            ms, floor = (piped or observed)[str(n)], r["floor_ms"][str(n)]
            how = "pipelined" if piped else "observed"
            out.append({"mode": mode, "rows": n, "ms": ms, "how": how, "floor_ms": floor, "ratio": ms / floor})
    return pd.DataFrame(out)


def rounds_chart(result: dict) -> alt.LayerChart:
    """ms per decode round against its row count, a line per mode, the byte floor as a dashed black line (the
    weights once plus every row's K/V at the run's copy rate)."""
    frame = rounds_frame(result)
    modes = list(dict.fromkeys(frame["mode"]))
    rows = result["rounds"]["rows"]
    y = alt.Scale(type="log", domain=[0.8 * frame["floor_ms"].min(), 1.25 * frame["ms"].max()], nice=False)
    x = alt.X(
        "rows:Q",
        title="requests in the round",
        scale=alt.Scale(type="log", base=2, nice=False),
        axis=alt.Axis(values=rows, format="d"),
    )
    lines = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("ms:Q", title="ms per round (log)", scale=y),
            color=alt.Color("mode:N", sort=modes, legend=alt.Legend(title="mode", orient="top")),
            tooltip=[
                "mode:N",
                "rows:Q",
                "how:N",
                alt.Tooltip("ms:Q", format=".4~g"),
                alt.Tooltip("ratio:Q", title="x floor", format=".2f"),
            ],
        )
    )
    floor = (
        alt.Chart()
        .transform_filter(alt.datum.mode == modes[0])
        .mark_line(color="black", strokeDash=[4, 3])
        .encode(
            x=x,
            y=alt.Y("floor_ms:Q", scale=y),
            tooltip=["rows:Q", alt.Tooltip("floor_ms:Q", title="byte floor (ms)", format=".3~g")],
        )
    )
    r, env = result["rounds"], result.get("environment", {})
    device = env.get("device_name", env.get("device", "?"))
    return alt.layer(lines, floor, data=plots.inline(frame)).properties(
        width=420,
        height=260,
        title=f"Decode rounds at {r['context']:,} positions on {device}: ms per round (dashed: the byte floor)",
        description=f"Line chart: milliseconds per decode round of {', '.join(map(str, r['rows']))} requests "
        f"at {r['context']} positions, one line per mode ({', '.join(modes)}), pipelined where timed so, "
        f"with the byte floor (weights once plus every row's K/V) as a dashed black line.",
    )


def render_bench(result: dict, out_dir) -> list:
    """bench_step.png and bench_step.md (the table bench-step prints), and bench_rounds.png where the result has
    decode rounds; refuses existing files."""
    from pdlib.report.bench import format_table

    out = plots.out_folder(out_dir)
    charts = {"bench_step": bench_chart(result)}
    if result.get("rounds"):
        charts["bench_rounds"] = rounds_chart(result)
    plots.refuse_existing([out / f"{name}.{fmt}" for name in charts for fmt in plots.FORMATS] + [out / "bench_step.md"])
    written = plots.write_tables(out, {"bench_step.md": "```\n" + format_table(result) + "\n```\n"}, refuse=False)
    for name, chart in charts.items():
        written += plots.save_chart(chart, out, name)
    return written

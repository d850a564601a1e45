"""bench-step's JSON as a chart and a table: pdlib's decode and prefill times beside its peers' and the floor.

from pdlib.analysis import bench_chart
bench_chart.render_bench(bench_result, "outputs/x")   # bench_step.png and bench_step.md, never overwritten
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


def render_bench(result: dict, out_dir) -> list:
    """bench_step.png and bench_step.md (the table bench-step prints); refuses existing files."""
    from pdlib.report.bench import format_table

    out = plots.out_folder(out_dir)
    plots.refuse_existing([out / f"bench_step.{fmt}" for fmt in plots.FORMATS] + [out / "bench_step.md"])
    written = plots.write_tables(out, {"bench_step.md": "```\n" + format_table(result) + "\n```\n"}, refuse=False)
    return written + plots.save_chart(bench_chart(result), out, "bench_step")

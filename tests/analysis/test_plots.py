"""pdlib.analysis.plots: each chart's Vega-Lite spec, and render_all's files (one PNG per chart, the tables);
pdlib.analysis.png: the same pixels in fewer bytes."""

import re

import numpy as np
import pandas as pd
import pytest
from reports import make_report, ms

from pdlib.analysis import frames as an
from pdlib.analysis import plots, png
from pdlib.errors import InputError

pytest.importorskip("vl_convert")


@pytest.fixture(scope="module")
def report():
    a = {"eager": ms(2500, 2520, 2540, 2560), "chunked": ms(30, 150, 180, 300, 330)}
    b = {"eager": ms(2400, 2510, 2530, 2550, 2570), "chunked": ms(320, 340, 360, 380, 400)}
    return make_report(policies=("eager", "chunked"), trials=2, a_emits=a, b_emits=b)


@pytest.fixture(scope="module")
def frames(report):
    return an.tokens_frame(report), an.events_frame(report), an.metrics_frame(report)


def mark(spec):
    m = spec["mark"]
    return m if isinstance(m, str) else m["type"]


def rows(spec):
    (values,) = spec["datasets"].values()
    return pd.DataFrame(values)


def test_headline_chart(frames):
    d = plots.headline_chart(frames[2]).to_dict()
    assert d["facet"]["column"]["field"] == "label"
    assert d["resolve"]["scale"]["y"] == "independent"
    dots, median = d["spec"]["layer"]
    assert (mark(dots), mark(median)) == ("circle", "tick")
    assert dots["encoding"]["x"]["field"] == "policy" and dots["encoding"]["x"]["sort"] == ["eager", "chunked"]
    assert median["encoding"]["y"] == {"aggregate": "median", "field": "value", "title": None, "type": "quantitative"}
    assert dots["encoding"]["y"]["scale"] == {"zero": True}  # makespan/throughput panels start at zero
    assert "one dot per trial" in d["description"]  # alt text for the SVG and the notebook PNG
    data = rows(d)
    assert set(data.metric) == set(plots.HEADLINE) and len(data) == 5 * 2 * 2  # metrics x policies x trials


def test_gap_timeline_chart(frames):
    tokens, events, metrics = frames
    d = plots.gap_timeline_chart(tokens, events, metrics, trial=2, stall_threshold_ms=100.0).to_dict()
    assert d["facet"]["row"]["field"] == "policy"
    shade, stripes, gaps, rule = d["spec"]["layer"]
    assert [mark(x) for x in (shade, stripes, gaps, rule)] == ["rect", "rect", "point", "rule"]
    y = gaps["encoding"]["y"]
    assert y["scale"]["type"] == "log" and "log scale" in y["title"] and gaps["encoding"]["x"]["field"] == "x"
    assert rule["encoding"]["y"]["field"] == "y" and rule["encoding"]["y"]["scale"] == y["scale"]
    lo, hi = y["scale"]["domain"]  # the threshold well inside the plot, not on its border
    assert y["scale"]["nice"] is False and lo < 100 / 2 and hi >= 3 * 2500
    assert "log y" in d["title"] and "log scale" in d["description"]
    data = rows(d)
    prefill = data[data.layer == "b_prefill"].set_index("policy")
    # the band starts at B's first prefill chunk (1 us after t0 in the hand-built report)
    assert prefill.x.tolist() == [0.001, 0.001] and prefill.x2.to_dict() == {"eager": 2400, "chunked": 320}
    assert data[data.layer == "threshold"].y.tolist() == [100, 100]
    assert (data.layer == "gap").sum() == 4 + 5 and (data.layer == "chunk").sum() == 2 * 4


def test_gap_timeline_unknown_trial(frames):
    with pytest.raises(ValueError, match="no tokens for trial 9") as err:
        plots.gap_timeline_chart(*frames, trial=9)
    assert type(err.value) is ValueError  # a caller's mistake, not bad user input


def test_gap_ecdf_chart(frames):
    d = plots.gap_ecdf_chart(frames[0]).to_dict()
    ecdf, tail = d["hconcat"]
    for panel in (ecdf, tail):
        assert mark(panel) == "line" and panel["encoding"]["x"]["scale"]["type"] == "log"
        assert "log scale" in panel["encoding"]["x"]["title"] and panel["encoding"]["color"]["field"] == "policy"
    assert ecdf["encoding"]["y"]["field"] == "ecdf" and "scale" not in ecdf["encoding"]["y"]
    assert tail["encoding"]["y"]["field"] == "tail" and tail["encoding"]["y"]["scale"]["type"] == "log"
    data = rows(d)
    assert data.groupby("policy").ecdf.max().tolist() == [1.0, 1.0]
    eager = data[data.policy == "eager"]
    assert eager.gap_ms.max() == 2500  # the tail survives thinning
    # 1 - ECDF as "fraction >= x": eager's 2.5 s gaps (one per trial, 2 of 8) at 2/8, nothing at 0 (log y)
    assert eager.loc[eager.gap_ms.idxmax(), "tail"] == pytest.approx(2 / 8) and (data["tail"] > 0).all()


def test_save_chart_refuses_to_overwrite(frames, tmp_path):
    chart = plots.gap_ecdf_chart(frames[0])
    paths = plots.save_chart(chart, tmp_path, "ecdf")
    assert [p.name for p in paths] == ["ecdf.png"]  # each chart once: no .html (vega bundle) or .svg beside it
    with pytest.raises(InputError, match=r"ecdf\.png already exists"):
        plots.save_chart(chart, tmp_path, "ecdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ecdf.png"]


def test_render_all(report, tmp_path):
    out = tmp_path / "figs"
    paths = plots.render_all(report, out)
    names = {p.name for p in paths}
    charts = plots.report_charts(report)
    for fig in ("headline", "gap_timeline", "gap_ecdf"):
        assert (out / f"{fig}.png").read_bytes() == png.render(charts[fig])  # what show_chart embeds
    assert names == {
        "headline.png",
        "gap_timeline.png",
        "gap_ecdf.png",
        "metrics.csv",
        "summary.csv",
        "summary.md",
        "ratios.csv",
    }
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temp files left behind
    ratios = pd.read_csv(out / "ratios.csv").set_index("metric")
    assert ratios.loc["b_ttft_ms", "median_ratio"] == pytest.approx(2400 / 320)
    assert (ratios.numerator == "eager").all() and (ratios.denominator == "chunked").all()
    assert len(pd.read_csv(out / "metrics.csv")) == 4
    with pytest.raises(InputError, match="already exists"):
        plots.render_all(report, out)


def test_render_all_one_policy_has_no_ratios(tmp_path):
    paths = plots.render_all(make_report(policies=("fifo",)), tmp_path)
    assert "ratios.csv" not in {p.name for p in paths}
    assert re.match(r"\| metric +\| fifo +\|", (tmp_path / "summary.md").read_text())


def test_render_all_refuses_any_existing_table(report, tmp_path):
    (tmp_path / "summary.md").write_text("keep me")
    with pytest.raises(InputError, match=r"summary\.md already exists"):
        plots.render_all(report, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]


def test_step_chart_shows_each_prompt_step_per_trial(report):
    steps = an.steps_frame(report)
    d = plots.step_chart(steps).to_dict()
    assert d["facet"]["row"]["field"] == "policy" and d["facet"]["row"]["sort"] == ["eager", "chunked"]
    enc = d["spec"]["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"], enc["color"]["field"]) == ("prompt_start", "dur_ms", "trial")
    data = rows(d)
    assert len(data) == (steps.kind == "prompt").sum() == 2 * 2 * 4  # policies x trials x chunks
    assert sorted(set(data.prompt_start)) == [0, 64, 128, 192]
    assert "one dot per step that carried a prompt chunk" in d["description"]


def test_step_chart_without_prompt_steps_is_none(report):
    steps = an.steps_frame(report)
    assert plots.step_chart(steps[steps.kind == "decode"]) is None


def _png(rgba, color=6):
    """An RGBA array as a plain PNG of colour type 6 (RGBA) with the Sub filter, as vl-convert writes."""
    import struct
    import zlib

    h, w, _ = rgba.shape
    x = rgba.astype(np.int16).reshape(h, w * 4)
    x = np.concatenate([x[:, :4], x[:, 4:] - x[:, :-4]], axis=1) % 256
    rows = np.concatenate([np.ones((h, 1), np.int16), x], axis=1).astype(np.uint8)
    chunk = lambda k, b: struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b))  # noqa: E731
    return (
        png.SIGNATURE
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("colours", [5, 300])  # a palette, and RGB
def test_compact_png_keeps_every_pixel(colours):
    rng = np.random.default_rng(0)
    palette = rng.integers(0, 256, (colours, 3))
    rgb = palette[rng.integers(0, colours, (40, 30))]
    rgba = np.concatenate([rgb, np.full((40, 30, 1), 255)], axis=2).astype(np.uint8)
    data = _png(rgba)
    assert (png.decode(data) == rgba).all()
    small = png.compact(data)
    assert (png.decode(small) == rgba).all() and png.size(small) == (30, 40)
    assert small[25] == (3 if colours <= 256 else 2)  # the IHDR's colour type
    see_through = rgba.copy()
    see_through[0, 0, 3] = 0
    assert png.compact(_png(see_through)) == _png(see_through)  # transparency: kept as it is


def test_a_chart_png_is_small_and_the_same_pixels(report, frames):
    import vl_convert as vlc

    spec = plots.gap_ecdf_chart(frames[0]).to_dict()
    raw = vlc.vegalite_to_png(spec, scale=png.SCALE)
    data = png.render(spec)
    assert (png.decode(data) == png.decode(raw)).all() and len(data) < len(raw) / 3

"""`python -m pdlib render REPORT --out DIR`: every table and figure from a committed report, no rerun;
bad reports and existing files are one-line errors with exit code 2.

tests/data/small-report.json was made with the real CLI:
    python -m pdlib run --model synthetic:tiny --prompt-tokens 64 --output-tokens 8 --chunk-size 16 \\
        --policies eager chunked --trials 2 --warmups 0 --output tests/data/small-report.json --quiet
"""

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from pdlib.__main__ import main
from pdlib.analysis import bench_chart, findings, png, present
from pdlib.analysis import frames as an
from pdlib.analysis.plots import FORMATS
from pdlib.errors import InputError
from pdlib.publish.notebooks import FIGURES, TABLES

pytest.importorskip("vl_convert")

REPORT = Path(__file__).parents[1] / "data" / "small-report.json"
EXPECTED = {*TABLES, *(f"{name}.{fmt}" for name in FIGURES for fmt in FORMATS)}


def render(capsys, *args):
    code = main(["render", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / "figs"
    assert main(["render", str(REPORT), "--out", str(out)]) == 0
    return out


def test_render_writes_every_table_and_figure(rendered):
    assert {p.name for p in rendered.iterdir()} == EXPECTED
    assert FORMATS == ("png",)  # each chart once
    for name in FIGURES:
        assert (rendered / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_compressed_report_renders_exactly_like_its_json_twin(rendered, tmp_path, capsys):
    from pdlib.report.io import copy_report, write_report

    gz = copy_report(REPORT, tmp_path / "report.json.gz")
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and gzip.decompress(gz.read_bytes()) == REPORT.read_bytes()
    assert copy_report(REPORT, tmp_path / "again.json.gz").read_bytes() == gz.read_bytes()  # deterministic
    written = write_report(tmp_path / "written.json.gz", an.load_report(REPORT))
    assert an.load_report(written) == an.load_report(gz) == an.load_report(REPORT)
    code, out, err = render(capsys, gz, "--out", tmp_path / "figs")
    assert code == 0 and err == ""
    assert {p.name: p.read_bytes() for p in (tmp_path / "figs").iterdir()} == {
        p.name: p.read_bytes() for p in rendered.iterdir()
    }
    named_json = tmp_path / "gzip-named.json"  # the magic bytes decide, not the name
    named_json.write_bytes(gz.read_bytes())
    assert an.load_report(named_json) == an.load_report(REPORT)


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b[:30] + bytes(40) + b[70:]])
def test_a_damaged_gz_report_is_one_line(tmp_path, capsys, damage):
    good = gzip.compress(REPORT.read_bytes(), mtime=0)
    bad = tmp_path / "report.json.gz"
    bad.write_bytes(damage(good))
    code, out, err = render(capsys, bad, "--out", tmp_path / "out")
    assert code == 2 and "cannot read report" in one_line_error(err) and str(bad) in err and out == ""
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="cannot read report"):
        present.check_report_file(bad)


def test_render_tables_match_the_analysis(rendered):
    report = an.load_report(REPORT)
    metrics = an.metrics_frame(report, stall_threshold_ms=report["params"]["stall_threshold_ms"])
    read = lambda name: pd.read_csv(rendered / name)  # noqa: E731
    pd.testing.assert_frame_equal(read("metrics.csv"), metrics, rtol=0, atol=1e-9)  # pandas < 3 may parse 1 ulp off
    summary = an.summary_frame(metrics)
    pd.testing.assert_frame_equal(read("summary.csv"), summary, rtol=0, atol=1e-9)
    _, ratios = an.paired_ratios(metrics, numerator="eager", denominator="chunked")
    assert (rendered / "summary.md").read_text() == findings.metrics_markdown(summary, ratios=ratios)
    got = read("ratios.csv")
    assert list(got["metric"]) == list(an.RATIO_METRICS)
    assert got["median_ratio"].tolist() == ratios["median_ratio"].tolist()


def test_render_refuses_existing_files(rendered, capsys):
    before = {p.name: p.read_bytes() for p in rendered.iterdir()}
    code, out, err = render(capsys, REPORT, "--out", rendered)
    assert code == 2 and "already exists" in one_line_error(err) and out == ""
    assert {p.name: p.read_bytes() for p in rendered.iterdir()} == before


def test_render_beside_the_report_is_fine(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_bytes(REPORT.read_bytes())
    code, out, _ = render(capsys, report, "--out", tmp_path)
    assert code == 0 and f"wrote {len(EXPECTED)} files" in out
    assert {p.name for p in tmp_path.iterdir()} == EXPECTED | {"report.json"}


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text[: len(text) // 2], "not valid JSON (truncated?)"),
        (lambda text: json.dumps({**json.loads(text), "schema": "pdlib.report/0"}), "schema is 'pdlib.report/0'"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "trials"}), "missing top-level"),
    ],
)
def test_bad_reports_are_one_line_errors(tmp_path, capsys, damage, message):
    bad = tmp_path / "bad.json"
    bad.write_text(damage(REPORT.read_text()))
    code, out, err = render(capsys, bad, "--out", tmp_path / "out")
    assert code == 2 and message in one_line_error(err) and out == ""
    assert not (tmp_path / "out").exists()


def test_missing_report_and_missing_out(tmp_path, capsys):
    code, _, err = render(capsys, tmp_path / "nope.json", "--out", tmp_path / "out")
    assert code == 2 and "cannot read report" in one_line_error(err)
    code, _, err = render(capsys, REPORT)
    assert code == 2 and "--out" in one_line_error(err)


def test_render_into_an_existing_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "not-a-folder"
    target.write_text("x")
    assert main(["render", str(Path(__file__).parents[1] / "data" / "small-report.json"), "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "existing file" in err[0] and target.read_text() == "x"


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory, tiny):
    """bench-step's JSON as the command writes it, from the tiny model on the CPU (the command itself refuses
    the CPU; its pieces do not)."""
    from pdlib.tools.bench import bench_step, write_json

    path = tmp_path_factory.mktemp("bench") / "bench-step.json"
    write_json(
        path,
        bench_step(
            tiny,
            contexts=(32, 48),
            tokens=3,
            warmup=1,
            prefill_tokens=40,
            chunk=16,
            repeats=1,
            peers=False,
            log=lambda *a: None,
        ),
    )
    return path


def test_render_draws_bench_steps_json_and_its_table(bench_json, tmp_path, capsys):
    from pdlib.report.bench import format_table

    code, out, err = render(capsys, bench_json, "--out", tmp_path / "b")
    names = {"bench_step.md", *(f"{n}.{fmt}" for n in ("bench_step", "bench_rounds") for fmt in FORMATS)}
    assert code == 0 and err == "" and {p.name for p in (tmp_path / "b").iterdir()} == names
    assert (tmp_path / "b" / "bench_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert format_table(json.loads(bench_json.read_text())) in (tmp_path / "b" / "bench_step.md").read_text()
    chart = bench_chart.bench_chart(json.loads(bench_json.read_text()))
    assert "pipelined" in json.dumps(chart.to_dict()) and "mlx-lm" in json.dumps(chart.to_dict())
    assert (tmp_path / "b" / "bench_step.png").read_bytes() == png.render(chart)
    rounds = bench_chart.rounds_chart(json.loads(bench_json.read_text()))
    assert (tmp_path / "b" / "bench_rounds.png").read_bytes() == png.render(rounds)
    gz = tmp_path / "bench-step.json.gz"  # compressed, read alike
    gz.write_bytes(gzip.compress(bench_json.read_bytes()))
    assert render(capsys, gz, "--out", tmp_path / "gz")[0] == 0
    assert (tmp_path / "gz" / "bench_step.png").read_bytes() == (tmp_path / "b" / "bench_step.png").read_bytes()
    before = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    code, out, err = render(capsys, bench_json, "--out", tmp_path / "b")  # never over an existing file
    assert code == 2 and "already exists" in one_line_error(err)
    assert {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()} == before


def test_rounds_frame_takes_each_modes_pipelined_round_else_its_observed_one():
    result = {
        "rounds": {
            "context": 2048,
            "rows": [3, 8],
            "ms": {"compiled": {"3": 4.0, "8": 5.0}, "groups": {"3": 2.0, "8": 6.0}},
            "pipelined_ms": {"compiled": {"3": 3.5, "8": 4.5}},
            "floor_ms": {"3": 1.0, "8": 2.0},
        }
    }
    frame = bench_chart.rounds_frame(result)
    got = {(r.mode, r.rows): (r.ms, r.how, r.ratio) for r in frame.itertuples()}
    assert got == {
        ("compiled", 3): (3.5, "pipelined", 3.5),
        ("compiled", 8): (4.5, "pipelined", 2.25),
        ("groups", 3): (2.0, "observed", 2.0),
        ("groups", 8): (6.0, "observed", 3.0),
    }


def test_a_bench_json_without_rounds_draws_no_rounds_chart(bench_json, tmp_path, capsys):
    data = json.loads(bench_json.read_text())
    del data["rounds"]
    path = tmp_path / "no-rounds.json"
    path.write_text(json.dumps(data))
    code, out, err = render(capsys, path, "--out", tmp_path / "b")
    assert code == 0 and {p.name for p in (tmp_path / "b").iterdir()} == {"bench_step.md", "bench_step.png"}


@pytest.mark.parametrize(
    "spoil, named",
    [
        (lambda r: r["ms"]["compiled"].pop("8"), "rounds ms['compiled'] needs a positive number at rows 3, 8"),
        (lambda r: r["floor_ms"].update({"3": "x"}), "rounds floor_ms needs a positive number at rows 3, 8"),
        (lambda r: r.update(rows=[]), "rounds need a context, rows (request counts), ms per mode and floor_ms per row"),
        (lambda r: r.update(rows=[3, 0.5]), "rounds need a context, rows"),
        (lambda r: r.pop("context"), "rounds need a context, rows"),
    ],
)
def test_a_bench_json_with_broken_rounds_is_a_one_line_error(spoil, named, tmp_path):
    from pdlib.report.bench import check_result

    rounds = {"context": 2048, "rows": [3, 8], "ms": {"compiled": {"3": 4.0, "8": 5.0}}, "floor_ms": {"3": 1, "8": 2}}
    result = {"schema": "pdlib.bench-step/1", "engines": {"pdlib": {"decode_ms_median": {"2048": 1.0}}}}
    result |= {"floors": {"2048": {"floor_ms": 0.6, "bytes": 1}}, "rounds": rounds}
    assert check_result(result, where="r.json") is result  # whole, it passes
    spoil(rounds)
    with pytest.raises(InputError, match=re.escape(f"r.json: {named}")):
        check_result(result, where="r.json")


def test_a_bench_json_without_its_numbers_is_a_one_line_error(bench_json, tmp_path, capsys):
    data = json.loads(bench_json.read_text())
    del data["engines"]["mlx-lm"]["decode_ms_median"]["48"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    code, out, err = render(capsys, bad, "--out", tmp_path / "out")
    assert code == 2 and "engine 'mlx-lm' lacks decode_ms_median at contexts 32, 48" in one_line_error(err)
    assert not (tmp_path / "out").exists()


def _spoil(path, change):
    """A copy of the JSON at `path` with `change` applied to its dict."""

    def spoiled(tmp_path):
        data = json.loads(Path(path).read_text())
        change(data)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(data))
        return bad

    return spoiled


def _set(*keys, value):
    def change(d):
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


def _refused_before_writing(capsys, tmp_path, bad, named):
    out = tmp_path / "out"
    code, stdout, err = render(capsys, bad, "--out", out)
    assert code == 2 and named in one_line_error(err) and stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(
    "change, named",
    [
        (_set("prompts", value="x"), "prompts is 'x'; expected an object"),
        (_set("prompts", "A", value=None), "prompts.A is None; expected an object with its tokenizer's name"),
        (_set("trials", 0, "trial", value=None), "trials[0]: trial is None; expected an integer >= 1"),
        (_set("trials", 0, "trial", value="x"), "trials[0]: trial is 'x'; expected an integer >= 1"),
        (_set("trials", 0, "trial", value=10**30), f"trials[0]: trial is {10**30}; expected an integer >= 1"),
        (_set("trials", 0, "policy", value=[1]), "trials[0]: policy is [1]; expected a policy name"),
        (
            lambda r: r["trials"][0]["requests"]["A"]["emit_ns"].__setitem__(-1, 10**400),
            "request A: emit_ns must be non-negative, non-decreasing integer ns (below 2**63)",
        ),
    ],
)
def test_a_damaged_report_field_is_one_line_and_writes_nothing(tmp_path, capsys, change, named):
    _refused_before_writing(capsys, tmp_path, _spoil(REPORT, change)(tmp_path), named)


@pytest.mark.parametrize(
    "change, named",
    [
        (_set("engines", "pdlib", value=1), "engine 'pdlib' is 1; expected an object of its medians"),
        (_set("engines", "pdlib", value=None), "engine 'pdlib' is None; expected an object"),
        (_set("engines", "pdlib", value="error"), "engine 'pdlib' is 'error'; expected an object"),
        (_set("engines", "pdlib", value={"error": "x"}), "engine 'pdlib' is {'error': 'x'}; expected an object"),
        (_set("engines", "mlx-lm", value=[]), "engine 'mlx-lm' is []; expected an object of its medians (or"),
        (_set("engines", "pdlib", "decode_ms_median", "32", value="x"), "engine 'pdlib' lacks decode_ms_median"),
        (_set("engines", "pdlib", "decode_ms_median", "32", value=None), "engine 'pdlib' lacks decode_ms_median"),
        (_set("engines", "pdlib", "decode_ms_median", "32", value=0), "engine 'pdlib' lacks decode_ms_median"),
        (_set("engines", "pdlib", "decode_ms_median", "32", value=10**400), "lacks decode_ms_median"),
        (_set("engines", "mlx-lm", "decode_pipelined_ms_median", "48", value=-1), "lacks decode_pipelined_ms_median"),
        (_set("engines", "pdlib", "pair_step_ms_median", value={"99": 1.0}), "pair_step_ms_median needs positive"),
        (_set("engines", "pdlib", "prefill_whole_s", value="x"), "engine 'pdlib' prefill_whole_s is 'x'"),
        (_set("floors", "32", value=1), "floors['32'] is 1; expected a positive context mapped to an object"),
        (_set("floors", "32", "bytes", value="x"), "floors['32'] needs bytes and floor_ms, positive finite"),
        (_set("settings", value=None), "settings is None; expected an object"),
        (_set("environment", value=None), "environment is None; expected an object"),
        (_set("rounds", "host_ms", value="x"), "rounds host_ms is 'x'; expected an object of modes"),
    ],
)
def test_a_damaged_bench_json_field_is_one_line_and_writes_nothing(bench_json, tmp_path, capsys, change, named):
    _refused_before_writing(capsys, tmp_path, _spoil(bench_json, change)(tmp_path), named)


@pytest.mark.parametrize("source", ["report", "bench"])
@pytest.mark.parametrize("under", ["file", "proc"])
def test_an_out_folder_that_cannot_be_made_is_one_line_naming_out(bench_json, tmp_path, capsys, source, under):
    if under == "proc" and not Path("/proc/version").is_file():
        pytest.skip("no /proc here")
    blocker = tmp_path / "x.json"
    blocker.write_text("x")
    out = blocker / "sub" if under == "file" else Path("/proc/version/sub")
    code, stdout, err = render(capsys, REPORT if source == "report" else bench_json, "--out", out)
    assert code == 2 and stdout == "" and "--out" in one_line_error(err) and "existing file" in err
    assert blocker.read_text() == "x"


def test_an_out_folder_where_no_entry_can_be_made_is_refused_and_left_as_it_was(tmp_path):
    from pdlib.analysis.plots import out_folder

    assert out_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b" and list(tmp_path.iterdir()) == []
    if Path("/proc/version").is_file():  # a pseudo file system takes no folder, whatever the permission bits say
        with pytest.raises(InputError, match=r"^--out '/proc/pdlib-x': cannot create a folder in '/proc'"):
            out_folder("/proc/pdlib-x")

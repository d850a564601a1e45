"""The three notebooks, executed with papermill as `python -m pdlib notebooks` runs them (smoke params,
smaller): the report, tables, figures and offline HTML land in a fresh folder, the tables agree with
pdlib.analysis recomputed on the same report and with `render`, and nothing is ever overwritten."""

import ast
import json
import re

import nbformat
import pandas as pd
import pytest
import yaml

from pdlib import analysis as an
from pdlib import notebooks as nbk
from pdlib import plots
from pdlib.__main__ import main
from pdlib.errors import InputError

pytest.importorskip("papermill")
pytest.importorskip("vl_convert")

PARAMS = {"model": "synthetic:tiny", "prompt_tokens": 64, "output_tokens": 8, "chunk_size": 16,
          "policies": ["eager", "chunked", "fifo"], "trials": 2, "warmups": 0, "logical_cache_reset": True}
FIGURE_FILES = {f"{name}.{fmt}" for name in nbk.FIGURES for fmt in plots.FORMATS}


@pytest.fixture(scope="module")
def params_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("params") / "tiny-notebooks.yaml"
    path.write_text(yaml.safe_dump(PARAMS))
    return path


@pytest.fixture(scope="module")
def run(params_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "tiny"
    log = []
    result = nbk.run_notebooks(params_file, out=out, quiet=True, log=log.append)
    return result, log, out


@pytest.fixture(scope="module")
def report(run):
    return an.load_report(run[0]["report"])


def test_source_notebooks_are_clean():
    for name in nbk.NOTEBOOKS:
        nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        assert nb.cells[0].cell_type == "markdown"  # says what the notebook does
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs"
        first = code[0]
        assert "parameters" in first.metadata.get("tags", []), f"{name}: first code cell is not tagged"
        for stmt in ast.parse(first.source).body:  # literals only
            assert isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant), ast.dump(stmt)


def test_run_writes_everything(run):
    result, log, out = run
    assert result["out_dir"] == out and log[0] == f"writing to {out}"
    names = {p.name for p in out.iterdir()}
    expected = ({"report.json", *nbk.TABLES, *FIGURE_FILES}
                | {f"{n}.{ext}" for n in nbk.NOTEBOOKS for ext in ("ipynb", "html")})
    assert names == expected
    assert result["html"] == [out / f"{n}.html" for n in nbk.NOTEBOOKS]


def test_executed_notebooks_ran_clean_with_the_given_paths(run, params_file):
    out = run[2]
    for name in nbk.NOTEBOOKS:
        nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert len(injected) == 1 and str(out) in injected[0].source
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                assert o.output_type != "error", f"{name}: {o.get('ename')}: {o.get('evalue')}"
                assert not (o.output_type == "stream" and o.name == "stderr"), f"{name}: {o.text}"
    assert str(params_file) in (out / "01_run_trials.ipynb").read_text()


def test_tables_agree_with_the_analysis(run, report):
    out = run[2]
    metrics = an.metrics_frame(report, stall_threshold_ms=report["params"]["stall_threshold_ms"])
    summary = an.summary_frame(metrics)
    read = lambda name: pd.read_csv(out / name)  # noqa: E731
    pd.testing.assert_frame_equal(read("metrics.csv"), metrics, rtol=0, atol=1e-9)
    pd.testing.assert_frame_equal(read("summary.csv"), summary, rtol=0, atol=1e-9)
    assert list(metrics["policy"].unique()) == PARAMS["policies"]
    assert (metrics.groupby("policy")["trial"].nunique() == PARAMS["trials"]).all()
    # The prose in 02 is analysis.findings on the same numbers.
    nb = nbformat.read(out / "02_analyze_gaps.ipynb", as_version=4)
    shown = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if "findings" in c.source and "text/markdown" in o.get("data", {})]
    assert shown == [an.findings(metrics, summary)]


def test_run_01_shows_where_it_ran(run, report):
    html = (run[2] / "01_run_trials.html").read_text()
    env = report["environment"]
    assert "Where it ran" in html and env["backend"] in html and env["mlx"] in html
    assert str(env["device_name"]) in html and "no trials run here" not in html


def test_notebooks_and_render_write_the_same_files(run, report, tmp_path):
    out = run[2]
    written = plots.render_all(report, tmp_path, stall_threshold_ms=nbk.stall_threshold(report))
    assert {p.name for p in written} == set(nbk.TABLES) | FIGURE_FILES
    for name in nbk.TABLES:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_html_is_offline_and_shows_the_charts(run):
    out = run[2]
    for name in nbk.NOTEBOOKS:
        html = (out / f"{name}.html").read_text()
        assert not re.search(r"<script[^>]*src=[\"']?https?:", html), name
    assert len(re.findall(r"<img[^>]*src=\"data:image/png;base64,", (out / "03_figures.html").read_text())) \
        == len(nbk.FIGURES)


def test_second_run_goes_to_a_new_folder_and_says_where_to_look(run, params_file, capsys):
    first = run[2]
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert main(["notebooks", "--params", str(params_file), "--out", str(first), "--quiet"]) == 0
    second = first.with_name(first.name + "-2")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{first} already holds files from an earlier run; this run writes to {second}"
    assert [ln.strip() for ln in lines[-4:-1]] == [str(second / f"{n}.html") for n in nbk.NOTEBOOKS]
    assert (second / "report.json").is_file() and (second / "03_figures.html").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


def test_fresh_dir(tmp_path):
    assert nbk.fresh_dir(tmp_path / "a") == tmp_path / "a"       # made
    assert nbk.fresh_dir(tmp_path / "a") == tmp_path / "a"       # still empty: reused
    (tmp_path / "a" / "x").touch()
    (tmp_path / "a-2").mkdir()
    (tmp_path / "a-2" / "y").touch()
    assert nbk.fresh_dir(tmp_path / "a") == tmp_path / "a-3"


def test_bad_params_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("prompt_tokens: 64\nbogus: 1\n")
    assert main(["notebooks", "--params", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown key(s) bogus" in err
    assert main(["notebooks", "--params", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before any folder or kernel
    with pytest.raises(InputError):
        nbk.run_notebooks(bad, out=tmp_path / "o")


def test_error_inside_a_notebook_is_one_line(tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({**PARAMS, "model": "synthetic:nosuch"}))
    assert main(["notebooks", "--params", str(params), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "01_run_trials failed: InputError: unknown model preset 'nosuch'" in err
    assert (tmp_path / "o" / "01_run_trials.html").is_file()  # the traceback is kept
    assert not (tmp_path / "o" / "report.json").exists()


# ---- a report made elsewhere (e.g. `python -m pdlib run` on a GPU box without Jupyter) -----------------
SMALL_REPORT = nbk.ROOT / "tests" / "data" / "small-report.json"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("rendered") / "small"
    log = []
    result = nbk.run_notebooks(report=SMALL_REPORT, out=out, quiet=True, log=log.append)
    return result, log, out


def test_report_renders_the_same_folder_without_running(rendered, tmp_path):
    result, log, out = rendered
    assert result["out_dir"] == out and log[0] == f"writing to {out}"
    expected = ({"report.json", *nbk.TABLES, *FIGURE_FILES}
                | {f"{n}.{ext}" for n in nbk.NOTEBOOKS for ext in ("ipynb", "html")})
    assert {p.name for p in out.iterdir()} == expected
    assert (out / "report.json").read_bytes() == SMALL_REPORT.read_bytes()
    report = an.load_report(SMALL_REPORT)
    plots.render_all(report, tmp_path, stall_threshold_ms=nbk.stall_threshold(report))
    for name in nbk.TABLES:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name
    for name in nbk.NOTEBOOKS:
        nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                assert o.output_type != "error", f"{name}: {o.get('ename')}: {o.get('evalue')}"
                assert not (o.output_type == "stream" and o.name == "stderr"), f"{name}: {o.text}"
    nb = nbformat.read(out / "01_run_trials.ipynb", as_version=4)
    (injected,) = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert "params_file = None" in injected.source and "small-report.json" in injected.source


def test_report_01_shows_what_a_run_shows_and_where_it_ran(rendered):
    out = rendered[2]
    report = an.load_report(SMALL_REPORT)
    html = (out / "01_run_trials.html").read_text()
    assert report["environment"]["device_name"] in html
    assert report["environment"]["mlx"] in html and report["model"]["spec"] in html
    assert "no trials run here" in html
    assert "warmups+trials" not in html and not re.search(r"\d+%\|", html)  # no progress bar
    nb = nbformat.read(out / "01_run_trials.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert nbk.validation_table(report) in text and nbk.run_line(report) in text
    for policy in report["params"]["policies"]:
        assert re.search(rf"^{policy}\s+pass\s", text, re.M)  # one validation row per policy
    tables = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "headline_medians" in c.source and "text/html" in o.get("data", {})]
    metrics = an.metrics_frame(report, stall_threshold_ms=nbk.stall_threshold(report))
    assert tables == [nbk.headline_medians(an.summary_frame(metrics))._repr_html_()]


def test_report_second_render_goes_to_a_new_folder(rendered, capsys):
    first = rendered[2]
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert main(["notebooks", "--report", str(SMALL_REPORT), "--out", str(first), "--quiet"]) == 0
    second = first.with_name(first.name + "-2")
    assert capsys.readouterr().out.splitlines()[0] == \
        f"{first} already holds files from an earlier run; this run writes to {second}"
    assert (second / "report.json").read_bytes() == SMALL_REPORT.read_bytes()
    assert (second / "03_figures.html").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


def test_bad_report_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    text, report = SMALL_REPORT.read_text(), an.load_report(SMALL_REPORT)
    bad = {"truncated.json": (text[: len(text) // 2], "not valid JSON (truncated?)"),
           "schema.json": (json.dumps({**report, "schema": "pdlib.report/0"}), "schema is 'pdlib.report/0'"),
           "params.json": (json.dumps({**report, "params": {**report["params"], "bogus": 1}}),
                           "params has unknown key(s) bogus"),
           "validation.json": (json.dumps({**report, "validation": {"eager": {"checks": 1}}}),
                               "validation results are malformed")}
    out = tmp_path / "o"
    for name, (content, message) in bad.items():
        (tmp_path / name).write_text(content)
        assert main(["notebooks", "--report", str(tmp_path / name), "--out", str(out)]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
        with pytest.raises(InputError):
            nbk.run_notebooks(report=tmp_path / name, out=out)
    assert main(["notebooks", "--report", str(SMALL_REPORT)]) == 2  # --out is required with --report
    assert "needs --out" in capsys.readouterr().err
    assert main(["notebooks", "--report", str(SMALL_REPORT), "--params", "params/smoke-cpu.yaml",
                 "--out", str(out)]) == 2
    assert "not allowed with" in capsys.readouterr().err
    assert not out.exists()  # refused before any folder or kernel


def test_load_or_run_copies_once_and_never_overwrites(tmp_path, capsys):
    dest = tmp_path / "x" / "report.json"
    report = nbk.load_or_run(report_source=SMALL_REPORT, output=dest)
    assert dest.read_bytes() == SMALL_REPORT.read_bytes() and report == an.load_report(SMALL_REPORT)
    assert nbk.load_or_run(report_source=dest, output=dest) == report  # already in place: shown, not copied
    assert "no trials run here" in capsys.readouterr().out
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(InputError, match="already exists"):
        nbk.load_or_run(report_source=SMALL_REPORT, output=other)
    assert other.read_text() == "{}"


def test_environment_table_says_device_and_weights():
    report = an.load_report(SMALL_REPORT)
    report["environment"].update(device="gpu", device_name="NVIDIA H200", backend="cuda")
    report["model"] = {**report["model"], "spec": "synthetic:qwen3-0.6b@0",
                       "fallback_from": "Qwen/Qwen3-0.6B (not in the local Hugging Face cache)"}
    table = nbk.environment_table(report)["value"]
    assert table["device_name"] == "NVIDIA H200" and table["backend"] == "cuda" and table["mlx"] == "0.32.4"
    assert table["weights"].startswith("synthetic") and "Qwen/Qwen3-0.6B" in table["weights"]
    assert nbk.run_line(report).startswith("model synthetic:qwen3-0.6b@0 (synthetic, Qwen/Qwen3-0.6B")
    checkpoint = {**report["model"], "source": "checkpoint", "path": "/hf/qwen3", "revision": "abc"}
    checkpoint.pop("fallback_from")
    assert nbk.environment_table({**report, "model": checkpoint})["value"]["weights"] == "checkpoint /hf/qwen3 @ abc"

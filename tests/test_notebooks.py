"""The three notebooks, executed with papermill as `python -m pdlib notebooks` runs them (smoke params,
smaller): the report, tables, figures and offline HTML land in a fresh folder, the tables agree with
pdlib.analysis recomputed on the same report and with `render`, and nothing is ever overwritten."""

import ast
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

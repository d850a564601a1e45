"""The three notebooks: executed as `python -m pdlib notebooks` runs them, as papermill's own CLI runs them
from the repository root (-p and -f), and as shipped (Run All, no parameters, kernel in notebooks/). The
report, tables, figures and offline HTML land in fresh folders, overrides reach the report, and nothing
is ever overwritten."""

import ast
import gzip
import json
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml
from publish.folders import assert_each_chart_once  # tests/ is on sys.path (conftest.py)

from pdlib.__main__ import main
from pdlib.analysis import findings, plots, present
from pdlib.analysis import frames as an
from pdlib.config import RunParams
from pdlib.errors import InputError
from pdlib.publish import notebooks as nbk
from pdlib.publish import runs

pytest.importorskip("papermill")
pytest.importorskip("vl_convert")

PARAMS = {
    "model": "synthetic:tiny",
    "prompt_tokens": 64,
    "output_tokens": 8,
    "chunk_size": 16,
    "policies": ["eager", "chunked", "fifo"],
    "trials": 2,
    "warmups": 0,
    "logical_cache_reset": True,
}
FIGURE_FILES = {f"{name}.{fmt}" for name in nbk.FIGURES for fmt in plots.FORMATS}
EVERYTHING = {runs.REPORT, *nbk.TABLES, *FIGURE_FILES} | {
    f"{n}.{ext}" for n in nbk.NOTEBOOKS for ext in ("ipynb", "html")
}
PAPERMILL = [str(Path(sys.executable).with_name("papermill")), "--log-level", "ERROR", "--no-progress-bar"]


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


def parameters_cell(name):
    nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return cell


def outputs(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def assert_ran_clean(nb_path):
    for o in outputs(nb_path):
        assert o.output_type != "error", f"{nb_path.name}: {o.get('ename')}: {o.get('evalue')}"
        assert not (o.output_type == "stream" and o.name == "stderr"), f"{nb_path.name}: {o.text}"


# ---- the notebooks as committed --------------------------------------------------------------------
def test_source_notebooks_are_clean_with_literal_parameters():
    for name in (*nbk.NOTEBOOKS, nbk.SERVE_NOTEBOOK):
        nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        assert nb.cells[0].cell_type == "markdown"  # says what the notebook does
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs"
        assert "parameters" in code[0].metadata.get("tags", []), f"{name}: first code cell is not tagged"
        for stmt in ast.parse(code[0].source).body:  # literals only, one name each
            assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1, ast.dump(stmt)
            ast.literal_eval(stmt.value)


def test_01_has_one_parameter_per_runparams_field_set_to_the_smoke_params():
    values = nbk.defaults("01_run_trials")
    smoke = RunParams.from_yaml(runs.ROOT / "params" / "smoke-cpu.yaml").to_dict()
    assert {k: values[k] for k in smoke} == smoke
    assert values["output_dir"] is None and values["report_source"] is None  # fresh folder by default
    for name in ("02_analyze_gaps", "03_figures"):
        assert nbk.defaults(name) == {"report_path": None, "output_dir": None, "stall_threshold_ms": None}


def test_params_files_are_complete_papermill_parameter_files():
    """`papermill -f params/X.yaml` sets every RunParams field, so nothing of the notebook's defaults leaks in."""
    names = {f.name for f in fields(RunParams)}
    for path in sorted((runs.ROOT / "params").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "workload" in data:  # a serving run's params (pdlib/run/serve_params.py), not RunParams
            continue
        assert set(data) == names, f"{path.name}: {sorted(names ^ set(data))}"
        RunParams(**data)


# ---- python -m pdlib notebooks ---------------------------------------------------------------------
def test_run_writes_everything(run):
    result, log, out = run
    assert result["out_dir"] == out and log[0] == f"writing to {out}"
    assert {p.name for p in out.iterdir()} == EVERYTHING
    assert result["html"] == [out / f"{n}.html" for n in nbk.NOTEBOOKS]


def test_executed_notebooks_ran_clean_with_every_parameter_injected(run, params_file):
    out = run[2]
    for name in nbk.NOTEBOOKS:
        nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
        (injected,) = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        values = {s.targets[0].id: ast.literal_eval(s.value) for s in ast.parse(injected.source).body}
        assert set(values) == set(nbk.defaults(name)), name  # every parameter: the page needs no other cell
        assert_ran_clean(out / f"{name}.ipynb")
    first = nbformat.read(out / "01_run_trials.ipynb", as_version=4)
    assert str(params_file) in first.cells[2].source and "chunk_size = 16" in first.cells[2].source


def test_html_has_one_parameters_cell_is_offline_and_shows_the_charts_with_alt_text(run):
    out = run[2]
    for name in nbk.NOTEBOOKS:
        html = (out / f"{name}.html").read_text()
        assert not re.search(r"<script[^>]*src=[\"']?https?:", html), name
        assert len(re.findall(r'output_dir</span>\s*<span class="o">=</span>', html)) == 1, name  # one parameters cell
    imgs = re.findall(r"<img[^>]*>", (out / "03_figures.html").read_text())
    assert len(imgs) == len(nbk.FIGURES)
    for img, figure in zip(imgs, nbk.FIGURES):  # each the file beside the page
        assert f'src="{figure}.png"' in img and re.search(r'alt="[^"]{40,}"', img), img[:200]
    page = (out / "02_analyze_gaps.html").read_text()
    alts = re.findall(r'<img[^>]*alt="([^"]*)"', page)
    assert len(alts) == 3  # headline, timeline and the prompt steps' times inline
    assert any("one dot per step that carried a prompt chunk" in a for a in alts)
    assert "Provenance:" in page and "synthetic" in page and "PosixPath" not in page
    for name in nbk.NOTEBOOKS:  # titled as the notebook, its first heading
        title = nbformat.read(nbk.NOTEBOOK_DIR / f"{name}.ipynb", as_version=4).cells[0].source.splitlines()[0][2:]
        assert f"<title>{title}</title>" in (out / f"{name}.html").read_text() and title.startswith(name[:2])


def test_each_chart_is_stored_once(run):
    out = run[2]
    for name in nbk.NOTEBOOKS:
        for o in outputs(out / f"{name}.ipynb"):
            assert not [m for m in o.get("data", {}) if m.startswith(nbk.CHART_MIMES)], name  # the PNG alone
    # the files are the one copy: 03's three charts and 02's headline and timeline (03 writes them after 02 ran)
    # refer to them; 02's prompt steps' times, which no file holds, are inline
    assert assert_each_chart_once(out) == {"references": 5, "inline": 1}


def test_the_page_keeps_the_styles_it_uses(run):
    from pdlib.publish.export import pruned_styles

    page = (run[2] / "02_analyze_gaps.html").read_text()
    assert sum(map(len, re.findall(r"<style[^>]*>(.*?)</style>", page, re.S))) < 30_000  # not JupyterLab's 250 kB
    assert ".jp-RenderedHTMLCommon table" in page and ".jp-InputPrompt" in page and "--jp-content-font-color1:" in page
    assert pruned_styles(page) == page  # nothing left that no element can use
    assert ".jp-Toolbar" not in page and "--jp-icon-" not in page


def test_tables_agree_with_the_analysis(run, report):
    out = run[2]
    metrics = an.metrics_frame(report, stall_threshold_ms=report["params"]["stall_threshold_ms"])
    summary = an.summary_frame(metrics)
    read = lambda name: pd.read_csv(out / name)  # noqa: E731
    pd.testing.assert_frame_equal(read("metrics.csv"), metrics, rtol=0, atol=1e-9)
    pd.testing.assert_frame_equal(read("summary.csv"), summary, rtol=0, atol=1e-9)
    assert list(metrics["policy"].unique()) == PARAMS["policies"]
    shown = [
        o["data"]["text/markdown"]
        for o in outputs(out / "02_analyze_gaps.ipynb")
        if "text/markdown" in o.get("data", {})
    ]
    assert findings.findings(metrics, summary) in shown  # the prose is analysis.findings on the same numbers
    assert present.markdown(present.headline_table(summary)) in shown


def test_run_01_shows_where_it_ran(run, report):
    html = (run[2] / "01_run_trials.html").read_text()
    env = report["environment"]
    assert "Where it ran" in html and env["backend"] in html and env["mlx"] in html
    assert str(env["device_name"]) in html and "no trials run here" not in html


def test_notebooks_and_render_write_the_same_files(run, report, tmp_path):
    out = run[2]
    written = plots.render_all(report, tmp_path, stall_threshold_ms=present.stall_threshold(report))
    assert {p.name for p in written} == set(nbk.TABLES) | FIGURE_FILES
    for name in nbk.TABLES:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_second_run_goes_to_a_new_folder_and_says_where_to_look(run, params_file, capsys):
    first = run[2]
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert main(["notebooks", "--params", str(params_file), "--out", str(first), "--quiet"]) == 0
    second = first.with_name(first.name + "-2")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{first} already exists; this run writes to {second}"
    assert [ln.strip() for ln in lines[-4:-1]] == [str(second / f"{n}.html") for n in nbk.NOTEBOOKS]
    assert (second / runs.REPORT).is_file() and (second / "03_figures.html").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


def test_bad_params_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("prompt_tokens: 64\nbogus: 1\n")
    assert main(["notebooks", "--params", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "unknown key(s) bogus" in err
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
    assert err.count("\n") == 1 and err.startswith("error: notebook 01_run_trials: unknown model preset 'nosuch'")
    assert (tmp_path / "o" / "01_run_trials.html").is_file()  # the error is kept
    (error,) = [o for o in outputs(tmp_path / "o" / "01_run_trials.ipynb") if o.output_type == "error"]
    assert error.traceback == [f"error: {error.evalue}"]  # one line in the notebook too
    assert not (tmp_path / "o" / runs.REPORT).exists()


# ---- papermill's own interface, from the repository root -------------------------------------------
def papermill(name, out_nb, *args):
    proc = subprocess.run(
        [*PAPERMILL, f"notebooks/{name}.ipynb", str(out_nb), *map(str, args)],
        cwd=runs.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unknown parameter" not in proc.stderr.lower(), proc.stderr
    assert_ran_clean(out_nb)


def test_papermill_p_overrides_reach_the_report_and_the_tables(tmp_path):
    o1 = tmp_path / "o1"
    papermill(
        "01_run_trials",
        tmp_path / "01.ipynb",
        "-p",
        "chunk_size",
        24,
        "-p",
        "prompt_tokens",
        72,
        "-p",
        "output_tokens",
        6,
        "-p",
        "trials",
        1,
        "-p",
        "warmups",
        0,
        "-p",
        "output_dir",
        o1,
    )
    params = an.load_report(o1 / runs.REPORT)["params"]
    assert (params["chunk_size"], params["prompt_tokens"], params["output_tokens"], params["trials"]) == (24, 72, 6, 1)
    assert params["model"] == "synthetic:tiny" and params["validation_checkpoint_every"] == 8  # the rest: smoke
    o2 = tmp_path / "o2"
    for name in ("02_analyze_gaps", "03_figures"):
        papermill(
            name,
            tmp_path / f"{name}.ipynb",
            "-p",
            "report_path",
            o1 / runs.REPORT,
            "-p",
            "stall_threshold_ms",
            2.5,
            "-p",
            "output_dir",
            o2,
        )
    shown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs(tmp_path / "02_analyze_gaps.ipynb"))
    assert "stalls > 2.5 ms" in shown and "longer than 2.5 ms" in shown
    metrics = an.metrics_frame(an.load_report(o1 / runs.REPORT), stall_threshold_ms=2.5)
    pd.testing.assert_frame_equal(pd.read_csv(o2 / "metrics.csv"), metrics, rtol=0, atol=1e-9)
    alts = [
        o["metadata"]["image/png"]["alt"]
        for o in outputs(tmp_path / "03_figures.ipynb")
        if "image/png" in o.get("data", {})
    ]
    assert any("a dashed line at 2.5 ms" in a for a in alts)
    assert {p.name for p in o2.iterdir()} == set(nbk.TABLES) | FIGURE_FILES


def test_papermill_f_params_file(tmp_path):
    values = {
        **RunParams.from_yaml(runs.ROOT / "params" / "smoke-cpu.yaml").to_dict(),
        **PARAMS,
        "chunk_size": 32,
        "trials": 1,
    }
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(values))
    papermill("01_run_trials", tmp_path / "01.ipynb", "-f", f, "-p", "output_dir", tmp_path / "o")
    assert an.load_report(tmp_path / "o" / runs.REPORT)["params"] == values


def test_papermill_params_file_must_match_the_values(tmp_path):
    proc = subprocess.run(
        [
            *PAPERMILL,
            "notebooks/01_run_trials.ipynb",
            str(tmp_path / "o.ipynb"),
            "-p",
            "params_file",
            "params/smoke-cpu.yaml",
            "-p",
            "chunk_size",
            "64",
            "-p",
            "output_dir",
            str(tmp_path / "o"),
        ],
        cwd=runs.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0 and "chunk_size 64 (file: 32)" in proc.stderr
    assert not (tmp_path / "o" / runs.REPORT).exists()


# ---- Run All as shipped: no parameters, the kernel in notebooks/ as JupyterLab starts it ---------------
def test_run_all_as_shipped_fills_one_fresh_local_folder(tmp_path):
    from nbclient import NotebookClient

    env = {**os.environ, "PDLIB_LOCAL_OUTPUTS": str(tmp_path / "local")}
    for name in nbk.NOTEBOOKS:
        nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        NotebookClient(
            nb,
            kernel_name=nbk.KERNEL,
            resources={"metadata": {"path": str(nbk.NOTEBOOK_DIR)}},
            extra_arguments=nbk.KERNEL_ARGS,
        ).execute(env=env)
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        assert_ran_clean(tmp_path / f"{name}.ipynb")
    (folder,) = (tmp_path / "local").iterdir()
    assert folder.name == "run"
    assert {p.name for p in folder.iterdir()} == {runs.REPORT, *nbk.TABLES, *FIGURE_FILES}
    assert an.load_report(folder / runs.REPORT)["params"]["trials"] == 5  # the smoke values
    # a second Run All of 02 writes beside, never over
    nb = nbformat.read(nbk.NOTEBOOK_DIR / "02_analyze_gaps.ipynb", as_version=4)
    NotebookClient(nb, kernel_name=nbk.KERNEL, extra_arguments=nbk.KERNEL_ARGS).execute(env=env)
    assert (tmp_path / "local" / "run-analysis" / "summary.md").is_file()


# ---- a report made elsewhere (e.g. `python -m pdlib run` on a GPU box without Jupyter) -----------------
SMALL_REPORT = runs.ROOT / "tests" / "data" / "small-report.json"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("rendered") / "small"
    log = []
    result = nbk.run_notebooks(report=SMALL_REPORT, out=out, quiet=True, log=log.append)
    return result, log, out


def test_report_renders_the_same_folder_without_running(rendered, tmp_path):
    result, log, out = rendered
    assert result["out_dir"] == out and log[0] == f"writing to {out}"
    assert {p.name for p in out.iterdir()} == EVERYTHING
    assert gzip.decompress((out / runs.REPORT).read_bytes()) == SMALL_REPORT.read_bytes()
    report = an.load_report(SMALL_REPORT)
    plots.render_all(report, tmp_path, stall_threshold_ms=present.stall_threshold(report))
    for name in nbk.TABLES:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name
    for name in nbk.NOTEBOOKS:
        assert_ran_clean(out / f"{name}.ipynb")
    assert assert_each_chart_once(out)["references"] == 5  # the folder's PNG files, each stored once
    nb = nbformat.read(out / "01_run_trials.ipynb", as_version=4)
    (injected,) = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    # the folder's own copy, never the path it came from
    assert "params_file = None" in injected.source and "small-report.json" not in injected.source
    assert f'report_source = "{runs.for_notebook(out / runs.REPORT)}"' in injected.source
    assert f"chunk_size = {report['params']['chunk_size']}" in injected.source  # the report's own values


def test_report_01_shows_what_a_run_shows_and_where_it_ran(rendered):
    out = rendered[2]
    report = an.load_report(SMALL_REPORT)
    html = (out / "01_run_trials.html").read_text()
    assert report["environment"]["device_name"] in html
    assert report["environment"]["mlx"] in html and report["model"]["spec"] in html
    assert "no trials run here" in html and "note:" not in html
    assert "warmups+trials" not in html and not re.search(r"\d+%\|", html)  # no progress bar
    text = "".join(o.get("text", "") for o in outputs(out / "01_run_trials.ipynb"))
    assert present.validation_table(report) in text and present.run_line(report) in text
    for policy in report["params"]["policies"]:
        assert re.search(rf"^{policy}\s+pass\s", text, re.M)  # one validation row per policy


def test_report_second_render_goes_to_a_new_folder(rendered, capsys):
    first = rendered[2]
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert main(["notebooks", "--report", str(SMALL_REPORT), "--out", str(first), "--quiet"]) == 0
    second = first.with_name(first.name + "-2")
    assert capsys.readouterr().out.splitlines()[0] == f"{first} already exists; this run writes to {second}"
    assert (second / runs.REPORT).read_bytes() == (first / runs.REPORT).read_bytes()
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


def test_bad_report_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    text, report = SMALL_REPORT.read_text(), an.load_report(SMALL_REPORT)
    bad = {
        "truncated.json": (text[: len(text) // 2], "not valid JSON (truncated?)"),
        "schema.json": (json.dumps({**report, "schema": "pdlib.report/0"}), "schema is 'pdlib.report/0'"),
        "params.json": (
            json.dumps({**report, "params": {**report["params"], "bogus": 1}}),
            "params has unknown key(s) bogus",
        ),
        "threshold.json": (
            json.dumps({**report, "params": {**report["params"], "stall_threshold_ms": -1}}),
            "stall_threshold_ms must be",
        ),
        "validation.json": (
            json.dumps({**report, "validation": {"eager": {"checks": 1}}}),
            "validation results are malformed",
        ),
    }
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
    assert (
        main(["notebooks", "--report", str(SMALL_REPORT), "--params", "params/smoke-cpu.yaml", "--out", str(out)]) == 2
    )
    assert "not allowed with" in capsys.readouterr().err
    assert not out.exists()  # refused before any folder or kernel


# ---- the helpers ------------------------------------------------------------------------------------
def test_load_or_run_copies_once_and_never_overwrites(tmp_path, capsys):
    dest = tmp_path / "x" / "report.json"
    params = present.report_params(an.load_report(SMALL_REPORT))
    report = runs.load_or_run(params, report_source=SMALL_REPORT, output=dest)
    assert dest.read_bytes() == SMALL_REPORT.read_bytes() and report == an.load_report(SMALL_REPORT)
    assert runs.load_or_run(params, report_source=dest, output=dest) == report  # in place: shown, not copied
    gz = tmp_path / "z" / runs.REPORT  # a run folder's: compressed, the JSON byte for byte
    assert runs.load_or_run(params, report_source=SMALL_REPORT, output=gz) == report
    assert gzip.decompress(gz.read_bytes()) == SMALL_REPORT.read_bytes()
    out = capsys.readouterr().out
    assert "no trials run here" in out and "note:" not in out
    runs.load_or_run(
        RunParams(**{**params.to_dict(), "chunk_size": 99}), report_source=SMALL_REPORT, output=tmp_path / "y.json"
    )
    assert "chunk_size 99 (report: 16)" in capsys.readouterr().out  # the report's own values are shown
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(InputError, match="already exists"):
        runs.load_or_run(params, report_source=SMALL_REPORT, output=other)
    assert other.read_text() == "{}"


def test_fresh_dir(tmp_path):
    assert runs.fresh_dir(tmp_path / "a") == tmp_path / "a"  # made
    assert runs.fresh_dir(tmp_path / "a") == tmp_path / "a-2"  # exists, even empty: never shared
    (tmp_path / "a-3").touch()  # a file is in the way too
    assert runs.fresh_dir(tmp_path / "a") == tmp_path / "a-4"
    assert runs.fresh_dir(tmp_path / "new" / "b") == tmp_path / "new" / "b"  # parents made


def test_paths_resolve_from_the_repository_root(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert runs.repo_path("params/smoke-cpu.yaml") == runs.ROOT / "params" / "smoke-cpu.yaml"
    assert runs.repo_path(tmp_path / "x") == tmp_path / "x"


def test_environment_table_and_provenance_say_device_and_weights():
    report = an.load_report(SMALL_REPORT)
    report["environment"].update(device="gpu", device_name="NVIDIA H200", backend="cuda")
    report["model"] = {
        **report["model"],
        "spec": "synthetic:qwen3-0.6b@0",
        "fallback_from": "Qwen/Qwen3-0.6B (not in the local Hugging Face cache)",
    }
    table = present.environment_table(report)["value"]
    assert table["device_name"] == "NVIDIA H200" and table["backend"] == "cuda" and table["mlx"] == "0.32.4"
    assert table["weights"].startswith("synthetic") and "Qwen/Qwen3-0.6B" in table["weights"]
    assert present.run_line(report).startswith("model synthetic:qwen3-0.6b@0 (synthetic, Qwen/Qwen3-0.6B")
    assert "NVIDIA H200" in present.provenance(report) and "token sequences are not" in present.provenance(report)
    checkpoint = {**report["model"], "source": "checkpoint", "path": "/hf/qwen3", "revision": "abc"}
    checkpoint.pop("fallback_from")
    assert (
        present.environment_table({**report, "model": checkpoint})["value"]["weights"] == "checkpoint /hf/qwen3 @ abc"
    )
    assert "random" not in present.provenance({**report, "model": checkpoint})

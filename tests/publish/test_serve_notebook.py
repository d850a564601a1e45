"""Notebook 05 on a serving report: `python -m pdlib notebooks --serve REPORT --out DIR` copies the report in, runs
05 on that copy into the fresh folder with its offline page, the tables and one PNG per chart (the rate-search
charts too when the report holds searches); `--search-report` alone renders the search sections of a search
report; a bad report or a missing --out is one line, exit 2, no folder."""

import ast
import gzip
import json
import re
from dataclasses import asdict

import nbformat
import pandas as pd
import pytest
from analysis.serve_reports import make_serve_report, synthetic_searches  # tests/ is on sys.path (conftest.py)
from publish.folders import assert_each_chart_once

from pdlib.__main__ import main
from pdlib.analysis import present
from pdlib.analysis import serving as sv
from pdlib.analysis import serving_charts as sc
from pdlib.analysis import serving_search as ss
from pdlib.publish import notebooks as nbk
from pdlib.publish import runs
from pdlib.publish.charts import REFERENCE
from pdlib.report.serving import slos_from_step

pytest.importorskip("papermill")
pytest.importorskip("vl_convert")

SLOS = slos_from_step(2.0, 30.0)


def test_05_has_a_required_report_and_the_house_parameters():
    assert nbk.defaults(nbk.SERVE_NOTEBOOK) == {
        "report_path": None,
        "search_path": None,
        "output_dir": None,
        "slo": None,
        "timeline_run": None,
        "timeline_first": 0,
        "timeline_requests": 12,
    }
    assert set(nbk.SERVE_FIGURES) == set(sc.FIGURES)


def test_notebooks_serve_renders_the_report_into_a_fresh_folder(tmp_path, capsys):
    report = make_serve_report(slos=SLOS)
    report["searches"] = synthetic_searches(SLOS["strict"])
    source = tmp_path / "serve.json"
    source.write_text(json.dumps(report))
    out = tmp_path / "o"
    assert main(["notebooks", "--serve", str(source), "--out", str(out), "--quiet"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"writing to {out}" and said[-1] == f"report, tables and figures: {out}/"
    figures = [*sc.FIGURES, *sc.SEARCH_FIGURES]
    assert {p.name for p in out.iterdir()} == {
        runs.REPORT,
        *nbk.SERVE_TABLES,
        *nbk.SEARCH_TABLES,
        *(f"{n}.png" for n in figures),
        "05_serving.ipynb",
        "05_serving.html",
    }
    assert gzip.decompress((out / runs.REPORT).read_bytes()) == source.read_bytes()  # the JSON byte for byte

    nb = nbformat.read(out / "05_serving.ipynb", as_version=4)
    (injected,) = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    values = {s.targets[0].id: ast.literal_eval(s.value) for s in ast.parse(injected.source).body}
    assert set(values) == set(nbk.defaults(nbk.SERVE_NOTEBOOK))
    assert values["report_path"] == str(out / runs.REPORT) and values["output_dir"] == str(out)  # the folder's copy
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    for o in outputs:
        assert o.output_type != "error" and not (o.output_type == "stream" and o.name == "stderr"), o
    assert not [m for o in outputs for m in o.get("data", {}) if m.startswith(nbk.CHART_MIMES)]
    refs = [ref for o in outputs if (ref := o.get("metadata", {}).get("text/html", {}).get(REFERENCE))]
    assert refs == [f"{name}.png" for name in figures]  # each chart once: the saved file, shown from the folder
    assert assert_each_chart_once(out) == {"references": len(figures), "inline": 0}
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert sv.findings(report, SLOS) in markdown  # the prose is analysis.serving.findings on the same numbers
    assert present.markdown(ss.versus_table(report["searches"])) in markdown  # the best policy against mlx-lm
    limits = ss.limits_frame(report["searches"])  # where each value is lost: the table and a line per search
    assert len(limits) == 4 and present.markdown(ss.limits_table(limits)) in markdown
    assert any(f"- **chunked**, capacity_strict: {limits['text'][0]}" in m for m in markdown)
    assert pd.read_csv(out / "serving_limits.csv")["lost_at"].tolist() == pytest.approx(limits["lost_at"].tolist())

    html = (out / "05_serving.html").read_text()
    assert not re.search(r"<script[^>]*src=[\"']?https?:", html)
    assert "<title>05 · Serving a trace</title>" in html
    assert len(re.findall(r'output_dir</span>\s*<span class="o">=</span>', html)) == 1  # one parameters cell
    imgs = re.findall(r"<img[^>]*>", html)
    assert len(imgs) == len(figures) and all(re.search(r'alt="[^"]{40,}"', img) for img in imgs)
    summary = pd.read_csv(out / "serving_summary.csv")
    assert summary["run"].tolist() == ["chunked", "fifo", "mlx-lm fp32 @64"]
    assert summary["ttft_p90_ms"].tolist() == pytest.approx(sv.summary_frame(report)["ttft_p90_ms"].tolist())


def test_notebooks_serve_refuses_a_bad_report_in_one_line(tmp_path, capsys):
    bad = tmp_path / "two-request.json"
    bad.write_text(json.dumps({"schema": "pdlib.report/1"}))
    out = tmp_path / "o"
    assert main(["notebooks", "--serve", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}: schema 'pdlib.report/1' is not a serving report")
    assert main(["notebooks", "--serve", str(bad)]) == 2
    assert capsys.readouterr().err == "error: notebooks --serve needs --out DIR\n"
    assert not out.exists()


def search_report(searches: dict) -> dict:
    """A report as `serve --search` writes it, holding `searches` ({run: [results]})."""
    return {
        "schema": sv.SEARCH_SCHEMA,
        "created_utc": "2026-12-05T14:00:07Z",
        "params": {"model": "synthetic:tiny", "workload": {"source": "azure-conv"}},
        "model": {"spec": "synthetic:tiny@0", "source": "synthetic", "seed": 0},
        "reps": [{"rep": r, "requests": 8} for r in range(3)],
        "slos": {k: asdict(v) for k, v in SLOS.items()},
        "environment": {"device_name": "a test CPU", "backend": "cpu", "mlx": "0"},
        "searches": [
            {
                "policy": run,
                "peer": run.startswith("mlx-lm"),
                "slo": "strict",
                "criterion": r["criterion"].split("_")[0],
                "result": r,
            }
            for run, results in searches.items()
            for r in results
        ],
    }


def test_notebooks_search_report_alone_renders_the_search_sections(tmp_path, capsys):
    searches = synthetic_searches(SLOS["strict"])
    source = tmp_path / "search.json"
    source.write_text(json.dumps(search_report(searches)))
    out = tmp_path / "o"
    assert main(["notebooks", "--search-report", str(source), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report, tables and figures: {out}/"
    figures = sc.SEARCH_FIGURES
    assert {p.name for p in out.iterdir()} == {
        nbk.SEARCH_REPORT,
        *nbk.SEARCH_TABLES,
        *(f"{n}.png" for n in figures),
        "05_serving.ipynb",
        "05_serving.html",
    }
    assert gzip.decompress((out / nbk.SEARCH_REPORT).read_bytes()) == source.read_bytes()
    nb = nbformat.read(out / "05_serving.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    for o in outputs:
        assert o.output_type != "error" and not (o.output_type == "stream" and o.name == "stderr"), o
    refs = [ref for o in outputs if (ref := o.get("metadata", {}).get("text/html", {}).get(REFERENCE))]
    assert refs == [f"{name}.png" for name in figures]
    assert assert_each_chart_once(out) == {"references": len(figures), "inline": 0}
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    line, provenance = ss.search_header(out / nbk.SEARCH_REPORT)
    assert line in text and "runs chunked, mlx-lm fp32 @64" in line and "3 reps of 8/8/8 requests" in line
    assert text.count("No serve report:") == 6  # each per-run section says why it is empty
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert provenance in markdown and "synthetic (random, seed 0)" in provenance
    assert present.markdown(ss.versus_table(searches)) in markdown
    assert present.markdown(ss.limits_table(ss.limits_frame(searches))) in markdown


def test_notebooks_search_report_refuses_what_it_cannot_render_in_one_line(tmp_path, capsys):
    bad = tmp_path / "serve.json"
    bad.write_text(json.dumps({"schema": "pdlib.serve/1"}))
    out = tmp_path / "o"
    assert main(["notebooks", "--search-report", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}: not a search report")
    assert main(["notebooks", "--search-report", str(bad)]) == 2
    assert capsys.readouterr().err == "error: notebooks --search-report needs --out DIR\n"
    assert main(["notebooks"]) == 2
    assert capsys.readouterr().err.startswith("error: notebooks needs one of --params, --report, --sweep, --serve")
    assert not out.exists()


def test_a_search_report_whose_slos_cannot_be_drawn_is_refused_before_its_folder(tmp_path, capsys):
    report = search_report(synthetic_searches(SLOS["strict"]))
    report["slos"]["strict"]["ttft_ms"] = -1.0
    bad = tmp_path / "search.json"
    bad.write_text(json.dumps(report))
    out = tmp_path / "o"
    assert main(["notebooks", "--search-report", str(bad), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}: ") and "ttft_ms" in err
    assert not out.exists()  # refused before the folder or a kernel


def test_a_search_report_written_without_its_weights_says_so():
    report = search_report({})
    del report["model"]  # as written before search reports named their weights
    text = present.provenance(report)
    assert text.startswith("**Provenance:** synthetic:tiny on a test CPU (cpu, MLX 0)")
    assert "weights: not recorded in this report." in text and "random with the model's shapes" not in text

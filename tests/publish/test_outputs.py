"""The published folders under outputs/: small (a cap that holds as results are added), each page intact,
reports compressed, each chart stored once (its PNG file, which notebooks and pages refer to), pages titled,
parameters naming the repository's own paths.

PDLIB_PUBLISHED=/some/outputs points these tests at another tree (e.g. folders being regenerated before they
are swapped in); the default is the repository's outputs/ (outputs/local/, git-ignored, is not published).
"""

import ast
import base64
import hashlib
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from publish.folders import assert_each_chart_once  # tests/ is on sys.path (conftest.py)

from pdlib.analysis import frontier, present
from pdlib.publish import runs
from pdlib.publish.export import title
from pdlib.publish.notebooks import CHART_MIMES, NOTEBOOKS, SWEEP_NOTEBOOK, SWEEP_REPORTS
from pdlib.report.schema import SCHEMA

PUBLISHED = Path(os.environ.get("PDLIB_PUBLISHED") or runs.ROOT / "outputs")
CAP_BYTES = 15 * 2**20
PATH_PARAMETERS = ("report_path", "report_source", "sweep_dir", "output_dir")
FOLDERS = sorted(p for p in PUBLISHED.iterdir() if p.is_dir() and p.name != "local") if PUBLISHED.is_dir() else []


def published_files():
    return [p for p in PUBLISHED.rglob("*") if p.is_file() and "local" not in p.relative_to(PUBLISHED).parts[:1]]


def notebooks(folder):
    return sorted(folder.glob("*.ipynb"))


def injected(nb) -> dict:
    (cell,) = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    return {s.targets[0].id: ast.literal_eval(s.value) for s in ast.parse(cell.source).body}


def test_published_outputs_fit_the_cap():
    sizes = {str(p.relative_to(PUBLISHED)): p.stat().st_size for p in published_files()}
    assert FOLDERS, f"no published folders in {PUBLISHED}"
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= CAP_BYTES, f"{PUBLISHED}: {total / 2**20:.1f} MB > {CAP_BYTES / 2**20:.0f} MB; largest {biggest}"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_each_chart_is_one_png_and_every_html_is_a_notebook_page(folder):
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert not [p.name for p in files if p.suffix == ".svg"]
    pages = {p.stem for p in files if p.suffix == ".html"}
    assert pages == {p.stem for p in notebooks(folder)}, "a .html that is not a notebook's page, or a page missing"
    assert not [p.name for p in files if p.name.startswith(".")], "a hidden working file was left behind"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_reports_are_compressed_and_read(folder):
    for path in folder.rglob("*.json"):  # index.json, bench-step.json, check-kernels.json: small results
        data = json.loads(path.read_text())
        assert not (isinstance(data, dict) and data.get("schema") == SCHEMA), f"{path.name}: an uncompressed report"
    names = {p.stem for p in notebooks(folder)}
    if names & set(NOTEBOOKS):
        assert names == set(NOTEBOOKS)
        present.check_report_file(folder / runs.REPORT)
    if SWEEP_NOTEBOOK in names:
        frontier.load_sweep(folder / SWEEP_REPORTS)
    for raw in ("bench-step.json", "check-kernels.json"):  # published results, beside the report they belong to
        if (folder / raw).exists():
            assert (folder / runs.REPORT).is_file(), raw
    if (folder / "bench-step.json").exists():
        assert (folder / "bench_step.png").is_file() and (folder / "bench_step.md").is_file()


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_notebook_stores_each_chart_once(folder):
    for path in notebooks(folder):
        nb = nbformat.read(path, as_version=4)
        seen = set()
        for o in (o for c in nb.cells if c.cell_type == "code" for o in c.outputs):
            data = o.get("data", {})
            charts = [m for m in data if m.startswith(CHART_MIMES)]
            assert not charts, f"{path.name}: a chart stored as {charts} (the page needs its PNG alone)"
            if "image/png" in data:
                digest = hashlib.sha256(base64.b64decode(data["image/png"])).hexdigest()
                assert digest not in seen, f"{path.name}: the same PNG twice"
                seen.add(digest)
                assert o.get("metadata", {}).get("image/png", {}).get("alt"), f"{path.name}: a PNG without alt text"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_each_chart_file_is_its_one_copy(folder):
    """A chart's PNG file is not stored again in a notebook or page: they refer to it, with its alt text."""
    assert_each_chart_once(folder)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_page_is_titled_as_its_notebook(folder):
    for path in notebooks(folder):
        page = path.with_suffix(".html").read_text()
        (shown,) = re.findall(r"<title>(.*?)</title>", page, re.S)
        expected = title(nbformat.read(path, as_version=4))
        assert shown != "Notebook" and shown == expected.replace("&", "&amp;"), (path.name, shown)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_parameters_name_the_folder_in_the_repository(folder):
    """What ran, as the repository has it: outputs/<folder>/..., never a scratch path of the machine that
    rendered it."""
    for path in notebooks(folder):
        nb = nbformat.read(path, as_version=4)
        values = injected(nb)
        for name, value in values.items():
            if isinstance(value, str):
                assert not value.startswith(("/", "~")) and "/tmp" not in value, f"{path.name}: {name} = {value!r}"
        for name in PATH_PARAMETERS:
            if values.get(name) is not None:
                where = Path(values[name]).parts[:2]
                assert where == ("outputs", folder.name), f"{path.name}: {name} = {values[name]!r}"
                assert (runs.ROOT / values[name]).exists() or PUBLISHED != runs.ROOT / "outputs", values[name]
        meta = nb.metadata.get("papermill", {})
        assert meta.get("output_path") == f"outputs/{folder.name}/{path.name}", meta.get("output_path")

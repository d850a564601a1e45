"""The chunk-size sweep: one report per point and an index, a refused output folder, a failing point that stops
the sweep with a truthful index, the Pareto frontier on a hand-made table, and notebook 04 on a tiny sweep."""

import ast
import json
import re

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml
from publish.folders import assert_each_chart_once  # tests/ is on sys.path (conftest.py)

from pdlib.__main__ import main
from pdlib.analysis import frontier as fr
from pdlib.analysis import plots, present
from pdlib.publish import notebooks as nbk
from pdlib.report.schema import SWEEP_INDEX as INDEX
from pdlib.report.schema import SWEEP_SCHEMA
from pdlib.report.schema import sweep_report_name as report_name

PARAMS = {
    "model": "synthetic:tiny",
    "prompt_tokens": 64,
    "output_tokens": 6,
    "chunk_size": 16,
    "policies": ["eager", "chunked", "fifo"],
    "trials": 5,
    "warmups": 0,
    "logical_cache_reset": True,
}
SWEEP = ["--chunk-sizes", "32", "16", "64", "--policies", "chunked", "--trials", "2", "--quiet"]
REFERENCES = ["eager", "fifo", "overlap", "slo-chunked", "slo-mixed"]
REPORTS = [*(f"{p}-c0016.json" for p in REFERENCES), "chunked-c0016.json", "chunked-c0032.json", "chunked-c0064.json"]


@pytest.fixture(scope="module")
def params_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("params") / "tiny-sweep.yaml"
    path.write_text(yaml.safe_dump(PARAMS))
    return path


@pytest.fixture(scope="module")
def sweep_dir(params_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    assert main(["sweep", "--params", str(params_file), *SWEEP, "--output", str(out)]) == 0
    return out


# ---- python -m pdlib sweep -------------------------------------------------------------------------
def test_sweep_writes_one_report_per_point_and_the_index(sweep_dir, params_file):
    assert sorted(p.name for p in sweep_dir.iterdir()) == sorted([*REPORTS, INDEX])
    index = json.loads((sweep_dir / INDEX).read_text())
    assert index["schema"] == SWEEP_SCHEMA and index["complete"] and index["stopped"] is None
    assert index["params"]["policies"] == ["chunked"] and index["params"]["trials"] == 2
    assert index["reference_policies"] == REFERENCES and index["chunk_sizes"] == [16, 32, 64]
    assert [p["report"] for p in index["points"]] == REPORTS  # references first, then by chunk size
    assert [p["role"] for p in index["points"]] == ["reference"] * 5 + ["swept"] * 3
    for pt in index["points"]:
        report = json.loads((sweep_dir / pt["report"]).read_text())
        assert report["params"]["policies"] == [pt["policy"]] and report["params"]["chunk_size"] == pt["chunk_size"]
        assert pt["passed"] and report["validation"][pt["policy"]]["passed"]
        assert pt["trials"] == 2 == len(report["trials"])
        assert report["params"]["warmups"] == 0 and report["params"]["prompt_tokens"] == 64
        assert report["sources"]["params_file"] is not None  # the params file's hash, as `run` records it


def test_refuses_a_non_empty_output_folder(params_file, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["sweep", "--params", str(params_file), *SWEEP, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "not an empty folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_bad_sweep_input_is_one_line_exit_2(params_file, tmp_path, capsys):
    cases = {
        ("--chunk-sizes", "16", "16"): "must not repeat",
        ("--chunk-sizes", "0"): "chunk sizes must be an integer >= 1",
        ("--reference-policies", "chunked"): "both swept",
        ("--reference-policies", "nosuch"): "unknown policy 'nosuch'",
    }
    for extra, message in cases.items():
        argv = [
            "sweep",
            "--params",
            str(params_file),
            "--chunk-sizes",
            "16",
            "--policies",
            "chunked",
            "--output",
            str(tmp_path / "o"),
            *extra,
        ]
        assert main(argv) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert main(["sweep", "--params", str(params_file), "--chunk-sizes", "16", "--output", str(tmp_path / "o")]) == 2
    assert "needs --policies" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_failing_point_stops_the_sweep_and_the_index_lists_completed_points(
    params_file, tmp_path, capsys, monkeypatch
):
    from pdlib.run import experiment
    from pdlib.run.validate import ValidationError, ValidationResult
    from pdlib.scheduler import Prefill

    real = experiment.validate_policy

    def planted(policy, *, steps, **kw):  # a fault in chunked at chunk size 32 only
        if policy == "chunked" and any(isinstance(w, Prefill) and w.n == 32 for s in steps for w in s.work):
            raise ValidationError(
                "logits mismatch (planted): request B output 0, worst |x - ref| 1", ValidationResult(policy)
            )
        return real(policy, steps=steps, **kw)

    monkeypatch.setattr(experiment, "validate_policy", planted)
    out = tmp_path / "s"
    assert main(["sweep", "--params", str(params_file), *SWEEP, "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: sweep stopped at chunked c=32 (ValidationError: logits")
    done = len(REFERENCES) + 1  # the references, then chunked at 16
    assert f"lists {done} completed points" in err
    assert sorted(p.name for p in out.iterdir()) == sorted([*REPORTS[:done], INDEX])
    index = json.loads((out / INDEX).read_text())
    assert not index["complete"] and [p["report"] for p in index["points"]] == REPORTS[:done]
    assert index["stopped"]["report"] == report_name("chunked", 32) and "planted" in index["stopped"]["error"]
    assert f"only the {done} points before it are listed; 1 more were not run" in index["note"]
    assert fr.load_sweep(out)["reports"].keys() == set(REPORTS[:done])  # a partial sweep still reads


# ---- the frontier, pandas only ---------------------------------------------------------------------
def test_pareto_mask_excludes_dominated_points_and_keeps_ties():
    x = [1.0, 2.0, 3.0, 2.0, 2.0, 4.0, 1.0, np.nan]
    y = [5.0, 3.0, 1.0, 3.0, 4.0, 4.0, 6.0, 0.5]
    # (2, 3) twice: equal points do not dominate each other; (2, 4) loses to (2, 3) on y alone; (4, 4) to
    # (2, 3) on both; (1, 6) to (1, 5) on y; NaN is never on the frontier and dominates nothing
    assert fr.pareto_mask(x, y).tolist() == [True, True, True, True, False, False, False, False]
    assert fr.pareto_mask([], []).tolist() == []


def hand_points():
    rows = [
        ("eager", 16, "reference", 100.0, 50.0),
        ("fifo", 16, "reference", 900.0, 2.0),
        ("chunked", 16, "swept", 400.0, 10.0),
        ("chunked", 32, "swept", 250.0, 20.0),
        ("chunked", 64, "swept", 300.0, 30.0),
        ("mixed", 32, "swept", 250.0, 20.0),
        ("mixed", 64, "swept", 120.0, 40.0),
    ]
    metrics = pd.DataFrame(
        [
            {
                "policy": p,
                "chunk_size": c,
                "role": r,
                "trial": t,
                "b_ttft_ms": ttft * (1 + 0.01 * t),
                "a_gap_max_ms": gap,
                "a_gap_p99_ms": gap / 2,
                "makespan_ms": 1000.0,
                "throughput_tok_s": 10.0,
            }
            for p, c, r, ttft, gap in rows
            for t in range(1, 6)
        ]
    )
    return fr.with_frontiers(fr.point_summary(metrics))


def test_frontier_of_a_hand_made_sweep():
    points = hand_points().set_index("label")
    front = points.index[points["on_frontier_max_gap"]].tolist()
    assert front == ["chunked c=16", "chunked c=32", "mixed c=32", "mixed c=64"]  # the tie stays, twice
    assert points.at["chunked c=64", "dominated_by_max_gap"] == "chunked c=32, mixed c=32"
    assert not points.loc[["eager c=16", "fifo c=16"], "on_frontier_max_gap"].any()  # references stay out
    assert (
        points.at["eager c=16", "dominated_by_max_gap"] == "" and points.at["fifo c=16", "dominated_by_max_gap"] == ""
    )
    assert points["on_frontier_p99_gap"].tolist() == points["on_frontier_max_gap"].tolist()
    assert points.at["chunked c=32", "b_ttft_ms"] == pytest.approx(250 * 1.03)  # the median of 5 trials
    assert points.at["chunked c=32", "b_ttft_ms_lo"] < points.at["chunked c=32", "b_ttft_ms_hi"]  # 5 trials: a CI
    table = present.frontier_table(hand_points(), only_frontier=True)
    assert list(table.index) == ["mixed c=64", "chunked c=32", "mixed c=32", "chunked c=16"]  # by B's TTFT
    assert "mixed c=64 (124 ms TTFT" in fr.reading(hand_points())
    chart = plots.frontier_chart(hand_points()).to_dict()
    assert "log" in json.dumps(chart) and "eager c=16" in chart["description"]


# ---- notebook 04 -----------------------------------------------------------------------------------
def test_04_source_is_clean_with_literal_parameters():
    nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{nbk.SWEEP_NOTEBOOK}.ipynb", as_version=4)
    assert nb.cells[0].cell_type == "markdown"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", [])
    for stmt in ast.parse(code[0].source).body:
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        ast.literal_eval(stmt.value)
    assert nbk.defaults(nbk.SWEEP_NOTEBOOK)["sweep_dir"] is None


def test_04_renders_the_sweep_into_a_fresh_folder(sweep_dir, tmp_path, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in sweep_dir.iterdir()}
    out = tmp_path / "f"
    assert main(["notebooks", "--sweep", str(sweep_dir), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"writing to {out}"
    figures = {f"{n}.{x}" for n in nbk.SWEEP_FIGURES for x in plots.FORMATS}
    assert {p.name for p in out.iterdir()} == {
        *nbk.SWEEP_TABLES,
        *figures,
        nbk.SWEEP_REPORTS,
        "04_chunk_sweep.ipynb",
        "04_chunk_sweep.html",
    }
    assert {p.name: p.stat().st_mtime_ns for p in sweep_dir.iterdir()} == before  # the sweep is only read
    # the published folder carries the sweep: its index as it is, each listed report compressed
    copied = out / nbk.SWEEP_REPORTS
    listed = [pt["report"] for pt in fr.load_sweep(sweep_dir)["index"]["points"]]
    assert {p.name for p in copied.iterdir()} == {"index.json", *(f"{n}.gz" for n in listed)}
    assert (copied / "index.json").read_bytes() == (sweep_dir / "index.json").read_bytes()
    assert fr.load_sweep(copied)["reports"] == fr.load_sweep(sweep_dir)["reports"]
    nb = nbformat.read(out / "04_chunk_sweep.ipynb", as_version=4)
    (injected,) = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert f'sweep_dir = "{copied}"' in injected.source  # the folder's own copy, never the scratch sweep
    for o in (o for c in nb.cells if c.cell_type == "code" for o in c.outputs):
        assert o.output_type != "error" and not (o.output_type == "stream" and o.name == "stderr"), o
    swept = fr.load_sweep(sweep_dir)
    points = fr.with_frontiers(fr.point_summary(fr.sweep_metrics(swept)))
    cols = [
        "label",
        "chunk_size",
        "trials",
        "a_gap_max_ms",
        "a_gap_p99_ms",
        "b_ttft_ms",
        "makespan_ms",
        "on_frontier_max_gap",
        "on_frontier_p99_gap",
    ]
    pd.testing.assert_frame_equal(pd.read_csv(out / "frontier.csv")[cols], points[cols], rtol=0, atol=1e-9)
    html = (out / "04_chunk_sweep.html").read_text()
    (img,) = re.findall(r"<img[^>]*>", html)
    assert re.search(r'alt="Two scatter plots on log-log axes[^"]{40,}"', img) and 'src="frontier.png"' in img
    assert assert_each_chart_once(out) == {"references": 1, "inline": 0}  # the file, stored once
    assert not re.search(r"<script[^>]*src=[\"']?https?:", html)
    assert "frontier" in (out / "frontier.md").read_text()


def test_04_refuses_a_folder_that_is_not_a_sweep(tmp_path, capsys):
    assert main(["notebooks", "--sweep", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no index.json" in capsys.readouterr().err
    assert main(["notebooks", "--sweep", str(tmp_path)]) == 2
    assert "needs --out" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_04_run_all_as_shipped_sweeps_the_smoke_experiment_into_a_fresh_local_folder(tmp_path):
    import os

    from nbclient import NotebookClient

    env = {**os.environ, "PDLIB_LOCAL_OUTPUTS": str(tmp_path / "local")}
    nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{nbk.SWEEP_NOTEBOOK}.ipynb", as_version=4)
    NotebookClient(
        nb,
        kernel_name=nbk.KERNEL,
        resources={"metadata": {"path": str(nbk.NOTEBOOK_DIR)}},
        extra_arguments=nbk.KERNEL_ARGS,
    ).execute(env=env)
    for o in (o for c in nb.cells if c.cell_type == "code" for o in c.outputs):
        assert o.output_type != "error" and not (o.output_type == "stream" and o.name == "stderr"), o
    (folder,) = (tmp_path / "local").iterdir()
    index = fr.load_sweep(folder)["index"]
    assert folder.name == "sweep" and index["complete"] and index["params"]["trials"] == 5  # the smoke values
    assert (folder / "frontier.png").is_file() and (folder / "frontier.csv").is_file()


def test_default_references_are_the_policies_not_swept():
    from pdlib.run.sweep import reference_policies

    assert reference_policies(("chunked", "mixed")) == ("eager", "fifo", "overlap", "slo-chunked", "slo-mixed")
    assert reference_policies(("slo-mixed",)) == ("eager", "fifo", "overlap", "slo-chunked")

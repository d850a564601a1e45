"""Bad input to a notebook is one line, and a notebooks run never leaves a half-written folder: a papermill
parameter the notebook lacks, or a bad value, is refused in one line (in the notebook, and as `error: ...`
from the CLI); two runs never claim one folder; Ctrl-C removes the run's folder or marks it incomplete, as
its one message says, with no kernel traceback and no kernel connection file left behind."""

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from pdlib.__main__ import main
from pdlib.errors import InputError
from pdlib.publish import notebooks as nbk
from pdlib.publish import parameters, runs

pytest.importorskip("papermill")

PAPERMILL = [str(Path(sys.executable).with_name("papermill")), "--log-level", "ERROR", "--no-progress-bar"]
SMALL_REPORT = runs.ROOT / "tests" / "data" / "small-report.json"


def errors(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]


# ---- the check, without a kernel --------------------------------------------------------------------
PARAMETERS_CELL = 'chunk_size = 32  # prefill chunk\nmodel = "synthetic:tiny"\n'


def test_unknown_is_what_papermill_injected_beyond_the_parameters_cell():
    injected = "# Parameters\nchunk_sise = 64\nmodel = 'x'\n"
    assert parameters.unknown(["", PARAMETERS_CELL, injected, "check"]) == (["chunk_sise"], ["chunk_size", "model"])
    assert parameters.unknown(["", PARAMETERS_CELL, "check"]) == ([], [])  # Run All: nothing was injected
    assert parameters.unknown(["", "# Parameters are below\nx = 1", "check"]) == ([], [])  # not papermill's
    with pytest.raises(InputError) as e:
        parameters.check(["", PARAMETERS_CELL, injected, "check"])
    assert str(e.value) == (
        "unknown parameter chunk_sise (did you mean chunk_size?); this notebook's parameters are chunk_size, model"
    )
    known = "# Parameters\nchunk_size = 64\nPAPERMILL_INPUT_PATH = 'in.ipynb'\n"  # papermill's own: accepted
    parameters.check(["", PARAMETERS_CELL, known, "check"])


def test_every_notebook_checks_its_parameters_before_anything_else():
    for name in (*nbk.NOTEBOOKS, nbk.SWEEP_NOTEBOOK, nbk.SERVE_NOTEBOOK):
        nb = nbformat.read(nbk.NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in cells[0].metadata.get("tags", [])
        body = [
            s
            for s in ast.parse(cells[1].source).body  # the cell papermill runs right after its injected one
            if not isinstance(s, ast.Import | ast.ImportFrom) and "warnings.filterwarnings" not in ast.unparse(s)
        ]
        assert ast.unparse(body[0]) == "parameters.check(In)", name


# ---- bare papermill: the notebook's error output is one line ------------------------------------------
@pytest.mark.parametrize(
    "name, args, line",
    [
        (
            "01_run_trials",
            ["-p", "chunk_sise", "64"],
            "error: unknown parameter chunk_sise (did you mean chunk_size?); "
            "this notebook's parameters are model, prompt_tokens, ",
        ),
        ("01_run_trials", ["-p", "chunk_size", "-5"], "error: chunk_size must be an integer >= 1, got -5"),
        (
            "02_analyze_gaps",
            ["-p", "report", str(SMALL_REPORT)],
            "error: unknown parameter report (did you mean report_path?); "
            "this notebook's parameters are report_path, output_dir, stall_threshold_ms",
        ),
    ],
)
def test_bare_papermill_refuses_in_one_line(tmp_path, name, args, line):
    out_nb, out = tmp_path / "o.ipynb", tmp_path / "out"
    proc = subprocess.run(
        [*PAPERMILL, f"notebooks/{name}.ipynb", str(out_nb), *args, "-p", "output_dir", str(out)],
        cwd=runs.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    (error,) = errors(out_nb)
    assert error.ename == "InputError" and len(error.traceback) == 1 and error.traceback[0].startswith(line)
    assert error.traceback[0] in proc.stderr  # what papermill prints of the notebook's error: that line
    assert not out.exists()  # refused before anything ran


# ---- python -m pdlib notebooks: one line `error: ...`, exit 2 ----------------------------------------
def test_cli_prints_a_notebooks_refusal_in_one_line_exit_2(tmp_path, capsys, monkeypatch):
    defaults = nbk.defaults  # the runner injecting a parameter the notebook lacks (e.g. one renamed there)
    monkeypatch.setattr(nbk, "defaults", lambda name: {**defaults(name), "bogus": 1})
    out = tmp_path / "o"
    assert main(["notebooks", "--report", str(SMALL_REPORT), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(
        "error: notebook 01_run_trials: unknown parameter bogus; this notebook's parameters are model, "
    )
    (error,) = errors(out / "01_run_trials.ipynb")
    assert error.traceback == [f"error: {error.evalue}"]


# ---- a run folder is claimed atomically ---------------------------------------------------------------
def test_concurrent_claims_never_share_a_folder(tmp_path):
    base = tmp_path / "run"
    base.mkdir()  # an existing empty folder is taken too: two runs could both think it theirs
    n = 8
    start, got = threading.Barrier(n), []

    def claim():
        start.wait()
        got.append(runs.fresh_dir(base))

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(tmp_path / f"run-{k}" for k in range(2, n + 2))
    assert not any(base.iterdir())


# ---- Ctrl-C ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("during", ["01_run_trials", "02_analyze_gaps"])
def test_ctrl_c_leaves_no_partial_run_no_traceback_no_kernel_files(tmp_path, during):
    out, scratch, runtime = tmp_path / "out", tmp_path / "tmp", tmp_path / "runtime"
    scratch.mkdir()
    runtime.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "JUPYTER_RUNTIME_DIR": str(runtime)}
    cmd = [sys.executable, "-m", "pdlib", "notebooks", "--params", "params/smoke-cpu.yaml", "--out", str(out)]
    proc = subprocess.Popen(
        cmd, cwd=runs.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        working, deadline = out / f".{during}.running.ipynb", time.monotonic() + 300
        while not working.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(1.0)  # the kernel is starting or running the notebook
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the terminal signals the foreground group
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    if during == "01_run_trials":
        assert stderr == f"interrupted: removed the unfinished run folder {out}\n"
        assert not out.exists()
    else:
        assert (
            stderr == f"interrupted: {out} keeps 01_run_trials (finished) and is marked incomplete (INCOMPLETE.txt)\n"
        )
        assert {p.name for p in out.iterdir()} == {
            "01_run_trials.ipynb",
            "01_run_trials.html",
            runs.REPORT,
            nbk.INCOMPLETE,
        }
        assert "interrupted while 02_analyze_gaps ran" in (out / nbk.INCOMPLETE).read_text()
    left = [p.name for p in scratch.rglob("*") if p.suffix == ".json" or p.name.startswith("pdlib-kernel-")]
    assert not left and not list(runtime.iterdir())  # no kernel connection file anywhere (MLX may cache in TMPDIR)
    # and no kernel left running: killed before the command returned, not left to notice its parent has gone
    kernels = subprocess.run(["pgrep", "-f", str(scratch)], capture_output=True, text=True).stdout.split()
    assert kernels == [], kernels


def test_stop_kills_the_kernel_until_the_worker_says_it_is_done(tmp_path, monkeypatch):
    """After Ctrl-C, _stop kills the running kernel's process group until the worker thread has unwound, by the
    worker's own `done`: on Python 3.11 a join that Ctrl-C cut short leaves is_alive() False while the thread
    still runs (bpo-45274), which must not stop the killing (the kernel would be left running)."""
    killed = []

    class Process:
        def poll(self):
            return None  # still running

        def kill(self):
            killed.append("kill")

    class Kernel:
        provisioner = type("Provisioner", (), {"process": Process(), "pgid": 4242})()

    class Stale:  # what Python 3.11 reports for the worker after the interrupted join
        def is_alive(self):
            return False

    state = {"finished": [], "running": "", "kernels": [Kernel()], "stop": threading.Event(), "done": threading.Event()}

    def killpg(pgid, sig):
        killed.append((pgid, sig))
        state["done"].set()  # the worker unwinds once its kernel is gone

    monkeypatch.setattr(nbk.os, "killpg", killpg)
    out = tmp_path / "run"
    out.mkdir()
    said = nbk._stop(Stale(), out, state)
    assert killed == [(4242, signal.SIGKILL)] and state["stop"].is_set()
    assert said.startswith("removed the unfinished run folder") and not out.exists()

"""Run the three notebooks with papermill for one params file (or one finished report) into a fresh folder;
or notebook 04 alone for a chunk-size sweep, or 05 alone for a serving report.

    python -m pdlib notebooks --params params/smoke-cpu.yaml          # -> outputs/local/smoke-cpu[-N]/
    python -m pdlib notebooks --report h200.json --out outputs/h200   # a report run elsewhere: no trials
    python -m pdlib notebooks --sweep sweeps/h200 --out outputs/h200-sweep   # 04: the frontier of a sweep folder
    python -m pdlib notebooks --serve serve.json.gz --out outputs/h200-serve  # 05: a `serve` report
    from pdlib.publish.notebooks import run_notebooks
    run = run_notebooks("params/smoke-cpu.yaml", out="/tmp/x")        # {"out_dir", "report", "html", ...}

Every parameter of each notebook is injected (the params file's values, repository-relative paths), so the
executed notebook's one parameters cell says exactly what ran. The folder is `out`, or
outputs/local/<params stem> (git-ignored), or `-2`, `-3`, ... when that one exists (said on stdout; nothing is
ever overwritten): creating the folder claims it, so two runs at once never share one (runs.fresh_dir).
Each executed notebook is stored and exported to offline HTML (pdlib.publish.export) as it finishes.
With a report, it is first copied into the folder as report.json.gz (the JSON byte for byte, compressed), and
the notebooks read it there, so their parameters name the folder's own report, never a scratch path; 01 then
shows what a run shows instead of running trials. A published notebook stores no chart itself where the folder
holds it: the Vega-Lite copy that JupyterLab draws live is dropped, and a PNG whose bytes equal a .png file of the
folder becomes a reference to that file (<img src="name.png"> with its alt text; charts.refer_to_files), which
JupyterLab and the HTML page show from the folder. A PNG with no such file stays inline, with its alt text; once
every notebook has run, an earlier one showing a chart a later one saved (02 shows two of 03's) refers to it too.

Layout of the folder (the same names as `python -m pdlib render REPORT --out DIR`, i.e. plots.render_all):
report.json.gz; metrics.csv, summary.csv, summary.md, ratios.csv (02); headline.png, gap_timeline.png and
gap_ecdf.png (03); 0N_*.ipynb and 0N_*.html. For a sweep (04): reports/ (index.json and each point's
report as <name>.json.gz, copied from the sweep folder, which is only read), sweep_metrics.csv, frontier.csv,
frontier.md, frontier.png, 04_chunk_sweep.ipynb and .html. For a serving report (05): report.json.gz,
serving_summary.csv, serving_requests.csv, serving_time.csv, latency.png, timeline.png, attainment.png (and
rate_curves.png, capacity.png when the report holds rate searches), 05_serving.ipynb and .html.

To republish a committed folder from a new report (nothing is overwritten, so move the old folder away first):
    python -m pdlib notebooks --report new/report.json --out outputs/qwen3-0.6b-h200

Ctrl-C: papermill runs in a worker thread, so the interrupt reaches the caller at once; it kills the kernel,
then removes the folder if no notebook had finished, else keeps the finished ones and marks the folder with
INCOMPLETE.txt, and raises Interrupted saying which. Each kernel's connection file and stderr (its log lines,
a crash's traceback) go to a temp folder removed after the run, not to /tmp or the terminal.
"""

import ast
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from pdlib import interrupt
from pdlib.errors import InputError
from pdlib.publish import runs
from pdlib.publish.runs import ROOT, shown
from pdlib.report.io import copy_file, copy_report, report_file, write_new

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = ("01_run_trials", "02_analyze_gaps", "03_figures")
TABLES = ("metrics.csv", "summary.csv", "summary.md", "ratios.csv")
FIGURES = ("headline", "gap_timeline", "gap_ecdf")
SWEEP_NOTEBOOK = "04_chunk_sweep"  # run on its own, for a sweep folder: `notebooks --sweep DIR --out OUT`
SWEEP_TABLES = ("sweep_metrics.csv", "frontier.csv", "frontier.md")
SWEEP_FIGURES = ("frontier",)
SWEEP_REPORTS = "reports"  # a sweep's published folder: its index and reports, beside 04's page
SEARCH_REPORT = "search.json.gz"  # a search report's copy in notebook 05's folder
SERVE_NOTEBOOK = "05_serving"  # run on its own, for a serving report: `notebooks --serve REPORT --out OUT`
SERVE_TABLES = ("serving_summary.csv", "serving_requests.csv", "serving_time.csv")
SEARCH_TABLES = ("serving_limits.csv",)  # with searches whose values are lost within their rates
SERVE_FIGURES = ("latency", "timeline", "attainment")  # analysis.serving_charts.FIGURES
KERNEL = "python3"
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]  # not its per-start warning about plain-TCP transport
# Exit codes by the exception a notebook raised: bad input is 2, as everywhere in the CLI.
EXIT_CODES = {"InputError": 2}
STOP_S = 10.0  # after Ctrl-C, the most the killed kernel's notebook gets to unwind before the folder is cleaned
INCOMPLETE = "INCOMPLETE.txt"  # in a folder whose run was interrupted after some notebooks finished


class NotebookFailed(Exception):
    """A notebook raised; `code` is the CLI exit code, the message is one line naming the notebook."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run after its folder was cleaned up; the message says what is left."""


def defaults(name: str) -> dict:
    """The notebook's parameters cell as {name: value} (literals only, by convention and test)."""
    import nbformat

    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return {s.targets[0].id: ast.literal_eval(s.value) for s in ast.parse(cell.source).body}


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def run_notebooks(params_file=None, *, report=None, out=None, quiet: bool = False, log=print) -> dict:
    """Execute the three notebooks for `params_file`, or for a finished `report` (then `out` is required
    and 01 runs nothing), into a fresh folder (see the module docstring).

    Returns {"out_dir", "report", "notebooks", "html", "seconds"}. Raises InputError for a bad params
    file or report (before any folder is made or kernel starts) and NotebookFailed when a notebook raises;
    the folder then keeps the failed notebook and its HTML, with its error (one line for an InputError, else
    the traceback). Interrupted on Ctrl-C, after cleaning the folder up."""
    from pdlib.analysis import present
    from pdlib.config import RunParams

    if (params_file is None) == (report is None):
        raise InputError("give exactly one of a params file and a report")
    if report is not None:
        report = Path(report)
        if out is None:
            raise InputError("a report needs an output folder (--out DIR)")
        values = present.report_params(present.check_report_file(report), where=str(report)).to_dict()
        first = {"params_file": None}  # report_source: the folder's copy, below
    else:
        params_file = Path(params_file)
        if not params_file.is_file():
            raise InputError(f"params file {str(params_file)!r} does not exist")
        values = RunParams.from_yaml(params_file).to_dict()  # bad keys or values: before any kernel starts
        first = {"params_file": runs.for_notebook(params_file), "report_source": None}
    missing = [n for n in NOTEBOOKS if not (NOTEBOOK_DIR / f"{n}.ipynb").is_file()]
    if missing:
        raise InputError(f"notebooks {', '.join(missing)} not found in {NOTEBOOK_DIR} (run from a checkout)")
    out_dir = _claim(Path(out) if out is not None else runs.LOCAL / params_file.stem, log)
    folder, report_path = runs.for_notebook(out_dir), runs.for_notebook(out_dir / runs.REPORT)
    if report is not None:  # 01 shows it in place: its parameters name the published file
        first["report_source"] = report_path
    ours = {
        "01_run_trials": {**values, **first, "output_dir": folder, "quiet": True},
        "02_analyze_gaps": {"report_path": report_path, "output_dir": folder},
        "03_figures": {"report_path": report_path, "output_dir": folder},
    }

    def copy():
        if report is not None:
            copy_report(report, out_dir / runs.REPORT)

    run = _run(ours, out_dir, before=copy, quiet=quiet, log=log)
    return {**run, "report": out_dir / runs.REPORT}


def _claim(base: Path, log) -> Path:
    out_dir = runs.fresh_dir(base).absolute()  # cleanup after Ctrl-C must not depend on the cwd
    if out_dir != base.absolute():
        log(f"{shown(base)} already exists; this run writes to {shown(out_dir)}")
    else:
        log(f"writing to {shown(out_dir)}")
    return out_dir


def run_sweep_notebook(sweep_dir, *, out, quiet: bool = False, log=print) -> dict:
    """Execute 04_chunk_sweep for a folder `python -m pdlib sweep` wrote, into a fresh folder (`out`, or
    `-2`, ...): reports/ (the sweep's index.json and its listed reports, compressed), then the executed
    notebook, which reads that copy, and its HTML, SWEEP_TABLES and the frontier figure. The sweep folder is
    read, never written. Returns {"out_dir", "notebooks", "html", "seconds"}; InputError before any kernel
    starts when the sweep folder cannot be read."""
    from pdlib.analysis import frontier
    from pdlib.report.schema import SWEEP_INDEX

    sweep_dir = Path(sweep_dir)
    sweep = frontier.load_sweep(sweep_dir)
    if not (NOTEBOOK_DIR / f"{SWEEP_NOTEBOOK}.ipynb").is_file():
        raise InputError(f"notebook {SWEEP_NOTEBOOK} not found in {NOTEBOOK_DIR} (run from a checkout)")
    out_dir = _claim(Path(out), log)
    reports = out_dir / SWEEP_REPORTS

    def copy():
        copy_file(sweep_dir / SWEEP_INDEX, reports / SWEEP_INDEX)
        for name in sweep["reports"]:
            copy_report(report_file(sweep_dir / name), reports / f"{name}.gz")

    ours = {
        SWEEP_NOTEBOOK: {
            "sweep_dir": runs.for_notebook(reports),
            "output_dir": runs.for_notebook(out_dir),
            "quiet": True,
        }
    }
    return _run(ours, out_dir, before=copy, quiet=quiet, log=log)


def run_serve_notebook(report, *, out, search=None, quiet: bool = False, log=print) -> dict:
    """Execute 05_serving for a report `python -m pdlib serve` wrote, a report of its searches, or both (one may be
    None), into a fresh folder (`out`, or `-2`, ...): the reports copied in as report.json.gz and search.json.gz,
    then the executed notebook, which reads those copies, its HTML, its tables and the figures. Returns {"out_dir",
    "report", "notebooks", "html", "seconds"} ("report": the serve report's copy, or None); InputError before any
    folder is made or kernel starts when a report cannot be read."""
    from pdlib.analysis import serving

    if report is None and search is None:
        raise InputError("notebook 05 needs a serve report, a search report, or both")
    if report is not None:
        report = Path(report)
        serving.load_serving_report(report)
    if search is not None:
        serving.load_search_report(search)
        serving.load_search_slos(search)  # the bounds its charts draw
    if not (NOTEBOOK_DIR / f"{SERVE_NOTEBOOK}.ipynb").is_file():
        raise InputError(f"notebook {SERVE_NOTEBOOK} not found in {NOTEBOOK_DIR} (run from a checkout)")
    out_dir = _claim(Path(out), log)
    dest = out_dir / runs.REPORT if report is not None else None
    params = {"output_dir": runs.for_notebook(out_dir)}
    search_dest = out_dir / SEARCH_REPORT
    if report is not None:
        params["report_path"] = runs.for_notebook(dest)
    if search is not None:  # copied beside the report, so the folder holds what its page shows
        params["search_path"] = runs.for_notebook(search_dest)

    def before():
        if report is not None:
            copy_report(report, dest)
        if search is not None:
            copy_report(search, search_dest)

    run = _run({SERVE_NOTEBOOK: params}, out_dir, before=before, quiet=quiet, log=log)
    return {**run, "report": dest}


def _run(ours: dict, out_dir: Path, *, before, quiet: bool, log) -> dict:
    """`before()` then _execute, in a worker thread; this thread waits, so Ctrl-C reaches it at once: it then
    stops the run (_stop) and raises Interrupted saying what is left. Any other error is re-raised here."""
    state = {"finished": [], "running": "", "kernels": [], "stop": threading.Event(), "done": threading.Event()}
    result = {}

    def work():
        try:
            before()
            result["run"] = _execute(ours, out_dir, state, quiet=quiet, log=log)
        except BaseException as e:  # re-raised in the calling thread
            result["error"] = e
        finally:
            state["done"].set()

    worker = threading.Thread(target=work, name="pdlib-notebooks", daemon=True)
    note = f"interrupted: stopped before cleaning up; {shown(out_dir)} may hold an unfinished run"
    with interrupt.patient(STOP_S + 5, note=note):
        try:
            worker.start()
            while worker.is_alive():
                worker.join(0.1)
        except KeyboardInterrupt:
            with interrupt.shielded():
                raise Interrupted(_stop(worker, out_dir, state)) from None
    if "error" in result:
        raise result["error"]
    return result["run"]


def _stop(worker: threading.Thread, out_dir: Path, state: dict) -> str:
    """Kill the kernel (and one that starts meanwhile), give the worker STOP_S to unwind, clean the folder. The
    worker's own `done` says when it has unwound: on Python 3.11 a join that Ctrl-C cut short can leave
    is_alive() False while the thread still runs (bpo-45274), and the kernel would then be left running."""
    state["stop"].set()
    deadline = time.monotonic() + STOP_S
    while not state["done"].is_set() and time.monotonic() < deadline:
        for km in state["kernels"]:
            _kill(km)
        state["done"].wait(0.1)
    return _clean(out_dir, state["finished"], state["running"])


def _kill(km) -> None:
    """SIGKILL a kernel's process group (it runs in its own session): no traceback, nothing left running."""
    provisioner = getattr(km, "provisioner", None)
    process = getattr(provisioner, "process", None)
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(OSError):
        if getattr(provisioner, "pgid", None) and hasattr(os, "killpg"):
            os.killpg(provisioner.pgid, signal.SIGKILL)
        else:
            process.kill()


def _clean(out_dir: Path, finished: list, running: str) -> str:
    """After Ctrl-C: remove the folder (made by this run) when no notebook finished; else keep the finished
    ones, drop the working files (hidden: papermill's copy, temp files) and write INCOMPLETE. Says which."""
    if not finished:
        shutil.rmtree(out_dir, ignore_errors=True)
        if not out_dir.exists():
            return f"removed the unfinished run folder {shown(out_dir)}"
        return f"could not remove all of {shown(out_dir)}: it holds an unfinished run"
    for path in out_dir.glob(".*"):
        with contextlib.suppress(OSError):
            path.unlink()
    write_new(
        out_dir / INCOMPLETE,
        f"This run was interrupted while {running or 'finishing'} ran: only {', '.join(finished)} finished "
        f"(each notebook with its HTML and files); the files of the rest are missing or partial.\n",
        what="note",
    )
    return f"{shown(out_dir)} keeps {', '.join(finished)} (finished) and is marked incomplete ({INCOMPLETE})"


def _kernel_manager(runtime: Path, started: list):
    """nbclient's kernel manager class, with the kernel's connection file and stderr in `runtime` and its
    working directory notebooks/; each instance is appended to `started`, for _stop."""
    from jupyter_client.manager import AsyncKernelManager

    class Manager(AsyncKernelManager):
        def __init__(self, **kw):
            super().__init__(**{"connection_file": str(runtime / f"kernel-{len(started) + 1}.json"), **kw})
            self.stderr_path = runtime / f"kernel-{len(started) + 1}.stderr"
            started.append(self)

        async def start_kernel(self, **kw):
            with open(self.stderr_path, "ab") as stderr:
                await super().start_kernel(**{"cwd": str(NOTEBOOK_DIR), "stderr": stderr, **kw})

    return Manager


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        return _one_line("\n".join(reversed(path.read_text(errors="replace").splitlines())))
    return ""


def _execute(ours: dict, out_dir: Path, state: dict, *, quiet: bool, log) -> dict:
    """Run each notebook named in `ours` (in order) with its defaults overridden by `ours[name]`, into out_dir,
    and export each to HTML; NotebookFailed on the first that raises. Papermill writes a hidden working copy;
    the notebook is then stored once (_store), through write_new; when all have run, refer_again. After _stop,
    nothing is written."""
    import papermill as pm
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from pdlib.publish.export import export_html

    progress = not quiet and sys.stderr.isatty()
    quiet_log = logging.getLogger("papermill")  # nbclient logs through it: "Kernel died ...", said below anyway
    if not quiet_log.handlers:
        quiet_log.addHandler(logging.NullHandler())  # else Python's last-resort handler prints it to stderr
    done, html, t_start = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pdlib-kernel-") as runtime:
        manager = _kernel_manager(Path(runtime), state["kernels"])
        for name, values in ours.items():
            if state["stop"].is_set():
                raise KeyboardInterrupt
            state["running"] = name
            nb_out, working = out_dir / f"{name}.ipynb", out_dir / f".{name}.running.ipynb"
            t0 = time.perf_counter()
            try:
                # shown(): papermill records these paths in the notebook; _store sets them repository-relative
                pm.execute_notebook(
                    shown(NOTEBOOK_DIR / f"{name}.ipynb"),
                    shown(working),
                    parameters={**defaults(name), **values},
                    kernel_name=KERNEL,
                    progress_bar=progress,
                    extra_arguments=KERNEL_ARGS,
                    kernel_manager_class=manager,  # its kernel starts in notebooks/, as papermill's cwd= would
                )
            except PapermillExecutionError as e:
                if state["stop"].is_set():
                    raise
                page = export_html(_store(working, nb_out, name)) if working.exists() else nb_out
                raise NotebookFailed(
                    f"notebook {name}: {_one_line(e.evalue)} (see {shown(page)})"
                    if e.ename in EXIT_CODES
                    else f"notebook {name} failed: {e.ename}: {_one_line(e.evalue)} (traceback in {shown(page)})",
                    EXIT_CODES.get(e.ename, 1),
                ) from None
            except DeadKernelError:
                if state["stop"].is_set():
                    raise
                said = _last_line(state["kernels"][-1].stderr_path)
                raise NotebookFailed(
                    f"the kernel died while running {name} (out of memory, or a crash in MLX?); "
                    f"the partial notebook is {shown(nb_out)}" + (f"; the kernel's last line: {said}" if said else "")
                ) from None
            finally:  # done or died: the notebook as far as it ran; stopped by Ctrl-C: nothing
                if state["stop"].is_set():
                    working.unlink(missing_ok=True)
                elif working.exists():
                    _store(working, nb_out, name)
            done.append(nb_out)
            html.append(export_html(nb_out))
            state["finished"].append(name)
            log(f"{name}: {time.perf_counter() - t0:.1f} s")
    state["running"] = ""
    refer_again(done)
    return {"out_dir": out_dir, "notebooks": done, "html": html, "seconds": time.perf_counter() - t_start}


def refer_again(notebooks: list) -> list:
    """Once a run's notebooks have all run: each stored one still holding a PNG whose file a later notebook saved
    (02 shows two of 03's charts) refers to that file too (charts.refer_to_files). Its notebook and page, this
    run's own files, are each replaced at once (os.replace of a hidden copy: an interruption leaves the stored
    version, charts inline). Returns the notebooks replaced."""
    import nbformat

    from pdlib.publish.charts import refer_to_files
    from pdlib.publish.export import export_html

    replaced = []
    for nb_path in map(Path, notebooks):
        nb = nbformat.read(nb_path, as_version=4)
        if not refer_to_files(nb, nb_path.parent):
            continue
        hidden = nb_path.with_name(f".{nb_path.stem}.referring.ipynb")
        hidden.unlink(missing_ok=True)
        hidden.with_suffix(".html").unlink(missing_ok=True)
        write_new(hidden, nbformat.writes(nb), what="notebook")
        os.replace(export_html(hidden), nb_path.with_suffix(".html"))
        os.replace(hidden, nb_path)
        replaced.append(nb_path)
    return replaced


CHART_MIMES = ("application/vnd.vegalite", "application/vnd.vega")


def one_copy_per_chart(nb) -> int:
    """Drop the Vega-Lite copy of every chart output that also holds its PNG (present.show_chart's bundle):
    the published notebook and its page keep the PNG with its alt text (a reference to the folder's file of it,
    where there is one: charts.refer_to_files). Returns how many were dropped."""
    dropped = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                for mime in [m for m in data if m.startswith(CHART_MIMES)]:
                    del data[mime]
                    dropped += 1
    return dropped


def _store(working: Path, nb_out: Path, name: str) -> Path:
    """papermill's working copy as the published notebook: each chart once (its PNG file in the folder, where
    the folder has it: charts.refer_to_files), paths repository-relative."""
    import nbformat

    from pdlib.publish.charts import refer_to_files

    nb = nbformat.read(working, as_version=4)
    one_copy_per_chart(nb)
    refer_to_files(nb, nb_out.parent)
    meta = nb.metadata.get("papermill")
    if meta is not None:
        meta["input_path"] = runs.for_notebook(NOTEBOOK_DIR / f"{name}.ipynb")
        meta["output_path"] = runs.for_notebook(nb_out)
    write_new(nb_out, nbformat.writes(nb), what="notebook")
    working.unlink()
    return nb_out

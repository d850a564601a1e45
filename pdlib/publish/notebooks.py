"""Run the three notebooks with papermill for one params file (or one finished report) into a fresh folder;
or notebook 04 alone for a chunk-size sweep.

    python -m pdlib notebooks --params params/smoke-cpu.yaml          # -> outputs/local/smoke-cpu[-N]/
    python -m pdlib notebooks --report h200.json --out outputs/h200   # a report run elsewhere: no trials
    python -m pdlib notebooks --sweep sweeps/h200 --out outputs/h200-sweep   # 04: the frontier of a sweep folder
    from pdlib.publish.notebooks import run_notebooks
    run = run_notebooks("params/smoke-cpu.yaml", out="/tmp/x")        # {"out_dir", "report", "html", ...}

Every parameter of each notebook is injected (the params file's values, repository-relative paths), so the
executed notebook's one parameters cell says exactly what ran. The folder is `out`, or
outputs/local/<params stem> (git-ignored), or `-2`, `-3`, ... when that one already holds files (said on
stdout; nothing is ever overwritten). Each executed notebook is exported to offline HTML (pdlib.publish.export).
With a report, it is first copied into the folder as report.json.gz (the JSON byte for byte, compressed), and
the notebooks read it there, so their parameters name the folder's own report, never a scratch path; 01 then
shows what a run shows instead of running trials. A published notebook stores each chart once: its PNG (with
alt text), the Vega-Lite copy that JupyterLab draws live is dropped.

Layout of the folder (the same names as `python -m pdlib render REPORT --out DIR`, i.e. plots.render_all):
report.json.gz; metrics.csv, summary.csv, summary.md, ratios.csv (02); headline.png, gap_timeline.png and
gap_ecdf.png (03); 0N_*.ipynb and 0N_*.html. For a sweep (04): reports/ (index.json and each point's
report as <name>.json.gz, copied from the sweep folder, which is only read), sweep_metrics.csv, frontier.csv,
frontier.md, frontier.png, 04_chunk_sweep.ipynb and .html.

To republish a committed folder from a new report (nothing is overwritten, so move the old folder away first):
    python -m pdlib notebooks --report new/report.json --out outputs/qwen3-0.6b-h200
"""

import ast
import sys
import time
from pathlib import Path

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
KERNEL = "python3"
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]  # not its per-start warning about plain-TCP transport
# Exit codes by the exception a notebook raised: bad input is 2, as everywhere in the CLI.
EXIT_CODES = {"InputError": 2}


class NotebookFailed(Exception):
    """A notebook raised; `code` is the CLI exit code, the message is one line naming the notebook."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


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
    the folder then keeps the failed notebook and its HTML, with the traceback."""
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
    base = Path(out) if out is not None else runs.LOCAL / params_file.stem
    out_dir = runs.fresh_dir(base)
    if out_dir != base:
        log(f"{shown(base)} already holds files from an earlier run; this run writes to {shown(out_dir)}")
    else:
        log(f"writing to {shown(out_dir)}")
    folder, report_path = runs.for_notebook(out_dir), runs.for_notebook(out_dir / runs.REPORT)
    if report is not None:  # 01 shows it in place: its parameters name the published file
        copy_report(report, out_dir / runs.REPORT)
        first["report_source"] = report_path
    ours = {
        "01_run_trials": {**values, **first, "output_dir": folder, "quiet": True},
        "02_analyze_gaps": {"report_path": report_path, "output_dir": folder},
        "03_figures": {"report_path": report_path, "output_dir": folder},
    }
    run = _execute(ours, out_dir, quiet=quiet, log=log)
    return {**run, "report": out_dir / runs.REPORT}


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
    out_dir = runs.fresh_dir(Path(out))
    log(
        f"{shown(out)} already holds files; this run writes to {shown(out_dir)}"
        if out_dir != Path(out)
        else f"writing to {shown(out_dir)}"
    )
    reports = out_dir / SWEEP_REPORTS
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
    return _execute(ours, out_dir, quiet=quiet, log=log)


def _execute(ours: dict, out_dir: Path, *, quiet: bool, log) -> dict:
    """Run each notebook named in `ours` (in order) with its defaults overridden by `ours[name]`, into out_dir,
    and export each to HTML; NotebookFailed on the first that raises. Papermill writes a hidden working copy;
    the notebook is then stored once (one_copy_per_chart), through write_new."""
    import papermill as pm
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from pdlib.publish.export import export_html

    progress = not quiet and sys.stderr.isatty()
    done, html, t_start = [], [], time.perf_counter()
    for name, values in ours.items():
        nb_out, working = out_dir / f"{name}.ipynb", out_dir / f".{name}.running.ipynb"
        t0 = time.perf_counter()
        try:
            # shown(): papermill records these paths in the notebook; _store sets them repository-relative
            pm.execute_notebook(
                shown(NOTEBOOK_DIR / f"{name}.ipynb"),
                shown(working),
                parameters={**defaults(name), **values},
                kernel_name=KERNEL,
                cwd=str(NOTEBOOK_DIR),
                progress_bar=progress,
                extra_arguments=KERNEL_ARGS,
            )
        except PapermillExecutionError as e:
            page = export_html(_store(working, nb_out, name)) if working.exists() else nb_out
            raise NotebookFailed(
                f"notebook {name} failed: {e.ename}: {_one_line(e.evalue)} (traceback in {shown(page)})",
                EXIT_CODES.get(e.ename, 1),
            ) from None
        except DeadKernelError:
            raise NotebookFailed(
                f"the kernel died while running {name} (out of memory, or a crash in MLX?); "
                f"the partial notebook is {shown(nb_out)}"
            ) from None
        finally:  # done, died or interrupted: the notebook as far as it ran
            if working.exists():
                _store(working, nb_out, name)
        done.append(nb_out)
        html.append(export_html(nb_out))
        log(f"{name}: {time.perf_counter() - t0:.1f} s")
    return {"out_dir": out_dir, "notebooks": done, "html": html, "seconds": time.perf_counter() - t_start}


CHART_MIMES = ("application/vnd.vegalite", "application/vnd.vega")


def one_copy_per_chart(nb) -> int:
    """Drop the Vega-Lite copy of every chart output that also holds its PNG (present.show_chart's bundle):
    the published notebook and its page keep the PNG with its alt text. Returns how many were dropped."""
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
    """papermill's working copy as the published notebook: each chart once, paths repository-relative."""
    import nbformat

    nb = nbformat.read(working, as_version=4)
    one_copy_per_chart(nb)
    meta = nb.metadata.get("papermill")
    if meta is not None:
        meta["input_path"] = runs.for_notebook(NOTEBOOK_DIR / f"{name}.ipynb")
        meta["output_path"] = runs.for_notebook(nb_out)
    write_new(nb_out, nbformat.writes(nb), what="notebook")
    working.unlink()
    return nb_out

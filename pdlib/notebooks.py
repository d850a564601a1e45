"""Run the three notebooks for one params file (or one finished report), and the helpers their cells call.

    python -m pdlib notebooks --params params/smoke-cpu.yaml          # -> outputs/smoke-cpu/
    python -m pdlib notebooks --report h200.json --out outputs/h200   # a report run elsewhere: no trials
    from pdlib.notebooks import run_notebooks
    run = run_notebooks("params/smoke-cpu.yaml", out="/tmp/x")        # {"out_dir", "report", "html", ...}
    run = run_notebooks(report="h200.json", out="/tmp/y")

The notebooks (notebooks/01_run_trials, 02_analyze_gaps, 03_figures) are executed with papermill, with
absolute paths as parameters, into a fresh folder: `outputs/<params stem>/`, or `-2`, `-3`, ... when that
one already holds files (said on stdout; nothing is ever overwritten). Each executed notebook is exported
to HTML; charts are shown as PNGs inside it, so the HTML needs no network. With a report (e.g. from
`python -m pdlib run` on a GPU machine without Jupyter), 01 copies it byte for byte into the folder and
shows what a run shows (validation table, per-policy summary, where it ran) instead of running trials.

Layout of the folder (the same names as `python -m pdlib render REPORT --out DIR`, i.e. plots.render_all):
report.json; metrics.csv, summary.csv, summary.md, ratios.csv (02); headline, gap_timeline and gap_ecdf
as .html/.png/.svg (03); 0N_*.ipynb and 0N_*.html.
"""

import os
import sys
import time
from pathlib import Path

from pdlib.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = ("01_run_trials", "02_analyze_gaps", "03_figures")
TABLES = ("metrics.csv", "summary.csv", "summary.md", "ratios.csv")
FIGURES = ("headline", "gap_timeline", "gap_ecdf")
KERNEL = "python3"
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]  # not its per-start warning about plain-TCP transport
# Exit codes by the exception a notebook raised: bad input is 2, as everywhere in the CLI.
EXIT_CODES = {"InputError": 2}


class NotebookFailed(Exception):
    """A notebook raised; `code` is the CLI exit code, the message is one line naming the notebook."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# ---- helpers the notebook cells call ---------------------------------------------------------------
def stall_threshold(report: dict) -> float:
    """The run's stall threshold (params.stall_threshold_ms), 100 ms for reports that lack it."""
    value = (report.get("params") or {}).get("stall_threshold_ms", 100.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InputError(f"report params.stall_threshold_ms must be a number > 0, got {value!r}")
    return float(value)


def default_ratios(metrics):
    """(per_trial, summary) ratios of the first declared policy over the second, as render_all writes
    them to ratios.csv; (None, None) with fewer than two policies."""
    from pdlib import plots
    return plots.default_ratios(metrics)


def headline_medians(summary):
    """Wide view for a notebook: one row per policy, the headline metrics' medians over trials."""
    from pdlib.plots import HEADLINE
    wide = summary[summary["metric"].isin(list(HEADLINE))].pivot(index="policy", columns="metric",
                                                                 values="median")
    wide = wide.loc[list(summary["policy"].unique()), list(HEADLINE)].rename(columns=HEADLINE)
    wide.insert(0, "trials", summary.groupby("policy", sort=False)["n"].max())
    wide.columns.name = None
    return wide.round(3)


def write_tables(out_dir, *, metrics, summary, ratios=None) -> list:
    """metrics.csv, summary.csv, summary.md (+ ratios.csv): byte for byte what render_all writes.
    Refuses before writing anything if one of them exists."""
    from pdlib import plots
    return plots.write_tables(out_dir, plots.tables(metrics, summary, ratios))


def charts(report: dict) -> dict:
    """The three charts render_all draws, by file stem (the timeline shows the first trial)."""
    from pdlib import analysis as an
    from pdlib import plots
    threshold = stall_threshold(report)
    metrics = an.metrics_frame(report, stall_threshold_ms=threshold)
    return plots.charts(an.tokens_frame(report), an.events_frame(report), metrics, stall_threshold_ms=threshold)


def show(paths):
    """The PNG among a chart's saved files, as a static image (embedded in the HTML export)."""
    from IPython.display import Image
    (png,) = [p for p in map(Path, paths) if p.suffix == ".png"]
    return Image(filename=str(png), retina=True)  # saved at 2x: show at the chart's own size


def run_params(params_file=None, *, report_source=None):
    """The RunParams 01 shows: the params file's, or with `report_source` those the report was run with."""
    from pdlib import analysis as an
    from pdlib.config import RunParams
    if report_source is None:
        return RunParams.from_yaml(params_file)
    return report_params(an.load_report(report_source), where=str(report_source))


def report_params(report: dict, *, where: str = "report"):
    """A checked report's params as RunParams; InputError (one line) when this pdlib cannot read them."""
    from dataclasses import fields

    from pdlib.config import RunParams
    params = report["params"]
    if not isinstance(params, dict):
        raise InputError(f"{where}: params is not an object")
    unknown = sorted(set(params) - {f.name for f in fields(RunParams)})
    if unknown:
        raise InputError(f"{where}: params has unknown key(s) {', '.join(unknown)}")
    try:
        return RunParams(**params)
    except InputError as e:
        raise InputError(f"{where}: params: {e}") from None


def run_line(report: dict) -> str:
    """The line `run_experiment` prints first (model and its source, backend, sizes), from a report."""
    from pdlib.runner import run_line as line
    return line(report["model"], report["environment"]["backend"], report["params"], report.get("prompts"))


def validation_table(report: dict, *, where: str = "report") -> str:
    """validate.format_table of the report's validation results: the table a run prints after its gate."""
    from pdlib.validate import CheckStats, ValidationResult, format_table
    results = {}
    try:
        for policy, d in report["validation"].items():
            d = {k: v for k, v in d.items() if k != "tolerance"}  # a constant, added by to_dict
            d["checks"] = {k: CheckStats(**c) for k, c in d["checks"].items()}
            results[policy] = ValidationResult(**d)
        return format_table(results)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: validation results are malformed ({type(e).__name__}: {e})") from None


def environment_table(report: dict):
    """Where and on what the report was made: model, weights source, then its environment block."""
    import pandas as pd
    src = report["model"]
    if src.get("source") == "synthetic":
        weights = f"synthetic (random, seed {src.get('seed')})"
        if src.get("fallback_from"):
            weights += f", instead of {src['fallback_from']}"
    else:
        weights = f"{src.get('source')} {src.get('path')}" + (f" @ {src['revision']}" if src.get("revision") else "")
    rows = {"model": src.get("spec"), "weights": weights, "created (UTC)": report.get("created_utc"),
            **(report.get("environment") or {})}
    return pd.DataFrame({"value": ["" if v is None else str(v) for v in rows.values()]}, index=list(rows))


def check_report_file(path) -> dict:
    """load_report, and everything 01 reads from it in report mode: InputError before any kernel starts."""
    from pdlib import analysis as an
    report = an.load_report(path)
    report_params(report, where=str(path))
    validation_table(report, where=str(path))
    for key in ("model", "environment"):
        if not isinstance(report[key], dict):
            raise InputError(f"{path}: {key} is not an object")
    try:
        run_line(report)
    except (KeyError, TypeError) as e:
        raise InputError(f"{path}: lacks {e} for the run summary") from None
    return report


def copy_report(source, dest) -> Path:
    """Byte-for-byte copy of `source` to `dest`, atomic (temp file, then link) and never over a file."""
    from pdlib.report import claim_output
    dest = claim_output(dest)
    data = Path(source).read_bytes()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        try:
            os.link(tmp, dest)  # unlike rename, never replaces a file that appeared meanwhile
        except FileExistsError:
            raise InputError(f"output {str(dest)!r} appeared meanwhile; the report is not copied") from None
        except OSError:  # a filesystem without hard links
            if os.path.lexists(dest):
                raise InputError(f"output {str(dest)!r} appeared meanwhile; the report is not copied") from None
            os.rename(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def load_or_run(params_file=None, *, report_source=None, output, quiet: bool = False, log=print) -> dict:
    """01's one call. Without `report_source`: run_experiment (gate, warmups, trials) with the params file,
    writing the report to `output`. With it: nothing runs; the report is checked, copied to `output` byte
    for byte (unless it is that file already) and the lines a run prints are printed from it."""
    output = Path(output)
    if report_source is None:
        from pdlib.runner import run_experiment
        return run_experiment(run_params(params_file), output=output, params_file=params_file, quiet=quiet,
                              log=log)
    source = Path(report_source)
    report = check_report_file(source)
    if not (output.exists() and output.samefile(source)):
        copy_report(source, output)
    log(f"report {source} (created {report['created_utc']}) loaded as it is: no trials run here")
    log(run_line(report))
    log(validation_table(report))
    return report


# ---- running the notebooks -------------------------------------------------------------------------
def fresh_dir(base) -> Path:
    """`base` if it is missing or empty, else the first of base-2, base-3, ... that is (created here)."""
    base = Path(base)
    for k in range(1, 10_000):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir(parents=True)  # atomic: two concurrent runs never get the same folder
            return path
        except FileExistsError:
            if path.is_dir() and not any(path.iterdir()):
                return path
        except OSError as e:
            raise InputError(f"cannot create output folder {str(path)!r}: {e.strerror}") from None
    raise InputError(f"no free folder next to {str(base)!r}")


# JupyterLab's page without its CDN scripts (require.js, MathJax, mermaid): the notebooks use none of
# them, and without them the page loads nothing from the network.
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def export_html(nb_path) -> Path:
    """nb_path with .html: the executed notebook as one offline page (images inline); never overwrites."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter
    nb_path = Path(nb_path)
    exporter = HTMLExporter(extra_loaders=[DictLoader({"pdlib_offline.html.j2": OFFLINE_TEMPLATE})],
                            template_file="pdlib_offline.html.j2")
    body, _ = exporter.from_filename(str(nb_path))
    html = nb_path.with_suffix(".html")
    with open(html, "x", encoding="utf-8") as f:  # "x": never over an existing file
        f.write(body)
    return html


def _for_notebook(path: Path) -> str:
    """Paths inside the checkout relative to notebooks/ (the kernel's cwd), so executed notebooks read
    like their defaults and name no local folder; anything else absolute."""
    path = path.resolve()
    return os.path.relpath(path, NOTEBOOK_DIR) if path.is_relative_to(ROOT) else str(path)


def shown(path) -> str:
    """A path as the user should read it: relative to the current folder when inside it."""
    path = Path(path).resolve()
    return os.path.relpath(path) if path.is_relative_to(Path.cwd().resolve()) else str(path)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def run_notebooks(params_file=None, *, report=None, out=None, quiet: bool = False, log=print) -> dict:
    """Execute the three notebooks for `params_file`, or for a finished `report` (then `out` is required
    and 01 runs nothing), into a fresh folder (see the module docstring).

    Returns {"out_dir", "report", "notebooks", "html", "seconds"}. Raises InputError for a bad params
    file or report (before any folder is made or kernel starts) and NotebookFailed when a notebook raises;
    the folder then keeps the failed notebook and its HTML, with the traceback."""
    import papermill as pm
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from pdlib.config import RunParams
    if (params_file is None) == (report is None):
        raise InputError("give exactly one of a params file and a report")
    if report is not None:
        report = Path(report)
        if out is None:
            raise InputError("a report needs an output folder (--out DIR)")
        check_report_file(report)  # truncated, wrong schema, ...: one line, before any kernel starts
    else:
        params_file = Path(params_file)
        if not params_file.is_file():
            raise InputError(f"params file {str(params_file)!r} does not exist")
        RunParams.from_yaml(params_file)  # bad keys or values: one line, before any kernel starts
    missing = [n for n in NOTEBOOKS if not (NOTEBOOK_DIR / f"{n}.ipynb").is_file()]
    if missing:
        raise InputError(f"notebooks {', '.join(missing)} not found in {NOTEBOOK_DIR} (run from a checkout)")
    base = Path(out) if out is not None else ROOT / "outputs" / params_file.stem
    out_dir = fresh_dir(base)
    if out_dir != base:
        log(f"{shown(base)} already holds files from an earlier run; this run writes to {shown(out_dir)}")
    else:
        log(f"writing to {shown(out_dir)}")
    folder, report_path = _for_notebook(out_dir), _for_notebook(out_dir / "report.json")
    first = ({"params_file": None, "report_source": _for_notebook(report)} if report is not None
             else {"params_file": _for_notebook(params_file)})
    parameters = {
        "01_run_trials": {**first, "output_dir": folder, "quiet": True},
        "02_analyze_gaps": {"report_path": report_path, "output_dir": folder},
        "03_figures": {"report_path": report_path, "output_dir": folder},
    }
    progress = not quiet and sys.stderr.isatty()
    done, html, t_start = [], [], time.perf_counter()
    for name in NOTEBOOKS:
        nb_out = out_dir / f"{name}.ipynb"
        t0 = time.perf_counter()
        try:
            # shown(): papermill records these paths in the notebook; keep local folders out of it
            pm.execute_notebook(shown(NOTEBOOK_DIR / f"{name}.ipynb"), shown(nb_out), parameters=parameters[name],
                                kernel_name=KERNEL, cwd=str(NOTEBOOK_DIR), progress_bar=progress,
                                extra_arguments=KERNEL_ARGS)
        except PapermillExecutionError as e:
            page = export_html(nb_out) if nb_out.exists() else nb_out
            raise NotebookFailed(f"notebook {name} failed: {e.ename}: {_one_line(e.evalue)} "
                                 f"(traceback in {shown(page)})", EXIT_CODES.get(e.ename, 1)) from None
        except DeadKernelError:
            raise NotebookFailed(f"the kernel died while running {name} (out of memory, or a crash in MLX?); "
                                 f"the partial notebook is {shown(nb_out)}") from None
        done.append(nb_out)
        html.append(export_html(nb_out))
        log(f"{name}: {time.perf_counter() - t0:.1f} s")
    return {"out_dir": out_dir, "report": out_dir / "report.json", "notebooks": done, "html": html,
            "seconds": time.perf_counter() - t_start}

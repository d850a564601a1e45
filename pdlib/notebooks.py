"""Run the three notebooks for one params file, and the helpers their cells call.

    python -m pdlib notebooks --params params/smoke-cpu.yaml          # -> outputs/smoke-cpu/
    from pdlib.notebooks import run_notebooks
    run = run_notebooks("params/smoke-cpu.yaml", out="/tmp/x")        # {"out_dir", "report", "html", ...}

The notebooks (notebooks/01_run_trials, 02_analyze_gaps, 03_figures) are executed with papermill, with
absolute paths as parameters, into a fresh folder: `outputs/<params stem>/`, or `-2`, `-3`, ... when that
one already holds files (said on stdout; nothing is ever overwritten). Each executed notebook is exported
to HTML; charts are shown as PNGs inside it, so the HTML needs no network.

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
    from pdlib import analysis as an
    policies = list(metrics["policy"].unique())
    if len(policies) < 2:
        return None, None
    return an.paired_ratios(metrics, numerator=policies[0], denominator=policies[1])


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
    from pdlib import analysis as an
    from pdlib.plots import _refuse_existing, _replace_from_tmp  # the same atomic, never-overwrite writes
    tables = {"metrics.csv": metrics, "summary.csv": summary,
              "summary.md": an.metrics_markdown(summary, ratios=ratios)}
    if ratios is not None:
        tables["ratios.csv"] = ratios
    out = Path(out_dir)
    _refuse_existing([out / name for name in tables])
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        if isinstance(table, str):
            _replace_from_tmp(out / name, lambda tmp, text=table: tmp.write_text(text))
        else:
            _replace_from_tmp(out / name, lambda tmp, df=table: df.to_csv(tmp, index=False))
    return [out / name for name in tables]


def charts(report: dict) -> dict:
    """The three charts render_all draws, by file stem (the timeline shows the first trial)."""
    from pdlib import analysis as an
    from pdlib import plots
    threshold = stall_threshold(report)
    tokens, events = an.tokens_frame(report), an.events_frame(report)
    metrics = an.metrics_frame(report, stall_threshold_ms=threshold)
    return {"headline": plots.headline_chart(metrics),
            "gap_timeline": plots.gap_timeline_chart(tokens, events, metrics, trial=int(metrics["trial"].min()),
                                                     stall_threshold_ms=threshold),
            "gap_ecdf": plots.gap_ecdf_chart(tokens)}


def show(paths):
    """The PNG among a chart's saved files, as a static image (embedded in the HTML export)."""
    from IPython.display import Image
    (png,) = [p for p in map(Path, paths) if p.suffix == ".png"]
    return Image(filename=str(png), retina=True)  # saved at 2x: show at the chart's own size


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


def run_notebooks(params_file, *, out=None, quiet: bool = False, log=print) -> dict:
    """Execute the three notebooks for `params_file` into a fresh folder (see the module docstring).

    Returns {"out_dir", "report", "notebooks", "html", "seconds"}. Raises InputError for a bad params
    file (before any kernel starts) and NotebookFailed when a notebook raises; the folder then keeps the
    failed notebook and its HTML, with the traceback."""
    import papermill as pm
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from pdlib.config import RunParams
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
    folder, report = _for_notebook(out_dir), _for_notebook(out_dir / "report.json")
    parameters = {
        "01_run_trials": {"params_file": _for_notebook(params_file), "output_dir": folder, "quiet": True},
        "02_analyze_gaps": {"report_path": report, "output_dir": folder},
        "03_figures": {"report_path": report, "output_dir": folder},
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

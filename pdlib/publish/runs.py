"""Where runs live, and notebook 01's one call: paths from the repository root, fresh run folders, run-or-copy.

    runs.repo_path("params/smoke-cpu.yaml")     # absolute, whatever the kernel's working directory
    runs.fresh_dir(runs.LOCAL / "run")          # outputs/local/run, or run-2, run-3, ... (made here, atomically)
    report = runs.load_or_run(params, output=out / runs.REPORT)

Runs nobody asked to keep go to outputs/local/ (git-ignored); the committed folders under outputs/ are
written only on purpose, with an explicit folder (`python -m pdlib notebooks --report R --out outputs/X`).
A run folder holds its report as report.json.gz: a run folder is what gets published, and compressed the
report is a fifth of its size (`run --output PATH` writes the plain JSON the user names).
"""

import os
from pathlib import Path

from pdlib import settings
from pdlib.errors import InputError
from pdlib.report.io import report_file

ROOT = Path(__file__).resolve().parents[2]  # the repository
LOCAL = Path(settings.get("PDLIB_LOCAL_OUTPUTS") or ROOT / "outputs" / "local")  # tests: a temp folder
REPORT = "report.json.gz"  # a run folder's report (io.write_report compresses by the suffix)
# committed: what 02/03 show before any run (report_file: the plain report.json of a folder not yet republished)
DEFAULT_REPORT = report_file(ROOT / "outputs" / "smoke-cpu" / REPORT)


def repo_path(path) -> Path:
    """`path` as an absolute path; a relative one is taken from the repository root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else ROOT / path


def shown(path) -> str:
    """A path as the user should read it: relative to the current folder when inside it."""
    path = Path(path).resolve()
    return os.path.relpath(path) if path.is_relative_to(Path.cwd().resolve()) else str(path)


def for_notebook(path) -> str:
    """A path as a notebook parameter: repository-relative inside the checkout (executed notebooks then
    name no local folder), else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def fresh_dir(base) -> Path:
    """A folder made here: `base`, else the first of base-2, base-3, ... that does not exist. Creating it is
    the claim (mkdir fails atomically on an existing name), so two concurrent runs never share a folder; an
    existing folder, even an empty one, is never written into."""
    base = Path(base)
    for k in range(1, 10_000):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise InputError(f"cannot create output folder {str(path)!r}: {e.strerror}") from None
    raise InputError(f"no free folder next to {str(base)!r}")


def latest_report() -> Path:
    """The newest outputs/local/*/report.json[.gz] (the run 01 just made), else the committed smoke report."""
    found = sorted([*LOCAL.glob(f"*/{REPORT}"), *LOCAL.glob("*/report.json")], key=lambda p: p.stat().st_mtime)
    return found[-1] if found else DEFAULT_REPORT


def output_dir_for(report_path: Path, output_dir=None, *, files=()) -> Path:
    """Where a notebook that reads `report_path` writes `files`: `output_dir` if given; else the report's
    own folder when it is a local run that lacks them (Run All on 01, 02, 03 fills one folder); else the
    first outputs/local/<report folder>-analysis[-N]/ that lacks them (02 and 03 then share it). Never a
    committed folder by default, never over a file."""
    if output_dir is not None:
        return repo_path(output_dir)
    folder = Path(report_path).resolve().parent
    if folder.is_relative_to(LOCAL.resolve()) and not any((folder / f).exists() for f in files):
        return folder
    base = LOCAL / f"{folder.name}-analysis"
    for k in range(1, 10_000):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        if not any((path / f).exists() for f in files):
            path.mkdir(parents=True, exist_ok=True)
            return path
    raise InputError(f"no free folder next to {str(base)!r}")


def run_params(namespace: dict, *, params_file=None):
    """RunParams from the notebook's parameter literals (the RunParams field names in `namespace`). With
    `params_file`, the values must be that file's (so the hash the report records is the truth): pass
    `-f params/X.yaml` to take a file's values."""
    from dataclasses import fields

    from pdlib.config import RunParams

    params = RunParams(**{f.name: namespace[f.name] for f in fields(RunParams) if f.name in namespace})
    if params_file is not None:
        given = RunParams.from_yaml(repo_path(params_file)).to_dict()
        differ = [f"{k} {v!r} (file: {given[k]!r})" for k, v in params.to_dict().items() if v != given[k]]
        if differ:
            raise InputError(
                f"params_file {str(params_file)!r} differs from the parameters: {', '.join(differ)}; "
                f"use -f {params_file} to take the file's values, or leave params_file unset"
            )
    return params


def new_output_dir(output_dir=None, *, name: str = "run") -> Path:
    """01's folder: `output_dir` (from the repository root when relative), else a fresh outputs/local/<name>[-N]."""
    return repo_path(output_dir) if output_dir is not None else fresh_dir(LOCAL / name)


def load_or_run(params, *, output, report_source=None, params_file=None, quiet: bool = False, log=print) -> dict:
    """01's one call. Without `report_source`: the experiment (gate, warmups, trials) with `params`, the
    report written to `output`. With it: nothing runs; the report is checked (a note lists where its params
    differ from `params`), copied to `output` byte for byte (unless it is that file), and the lines a run
    prints are printed from it. The copy is compressed when `output` ends in .gz (the JSON inside is the
    source's byte for byte)."""
    from pdlib.analysis import present
    from pdlib.report.io import copy_report

    output = Path(output)
    if report_source is None:
        from pdlib.run.runner import run_experiment  # the engine: only when something runs

        return run_experiment(params, output=output, params_file=params_file, quiet=quiet, log=log)
    source = Path(report_source)
    report = present.check_report_file(source)
    ran = present.report_params(report, where=str(source))
    differ = [f"{k} {v!r} (report: {ran.to_dict()[k]!r})" for k, v in params.to_dict().items() if v != ran.to_dict()[k]]
    if differ:
        log(f"note: the report ran with other parameters than the notebook's; its own are shown: {', '.join(differ)}")
    if not (output.exists() and output.samefile(source)):
        copy_report(source, output)
    log(f"report {source} (created {report['created_utc']}) loaded as it is: no trials run here")
    log(present.run_line(report))
    log(present.validation_table(report))
    return report

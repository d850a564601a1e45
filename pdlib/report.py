"""The report: one JSON file (schema in report_schema.py), written atomically and never over an existing one.

    path = claim_output(args.output)          # refuses before any work if the path exists or can't be made
    write_report(path, build_report(...))     # temp file + rename: an interrupted run leaves nothing
"""

import datetime
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from pdlib.errors import InputError
from pdlib.report_schema import SCHEMA

PACKAGE_DIR = Path(__file__).resolve().parent


def claim_output(path) -> Path:
    """Check, before doing any work, that `path` can be written without overwriting anything. Creates
    nothing: folders are made only when the report is written."""
    path = Path(path)
    if os.path.lexists(path):
        raise InputError(f"output {str(path)!r} already exists; pdlib never overwrites a report: choose a new path")
    parent = path.parent.resolve()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot create the folder of output {str(path)!r}: {str(parent)!r} is not a writable folder")
    return path


def write_report(path, report: dict) -> Path:
    """Atomic: the JSON goes to a temp file in the same folder, then is linked into place; the link fails
    rather than replace a file that appeared meanwhile."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a report is an ordinary file
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # unlike rename, never replaces an existing file
        except FileExistsError:
            raise InputError(f"output {str(path)!r} appeared while the run was going; the report is not written") from None
        except OSError:  # a filesystem without hard links: rename, after one last check
            if os.path.lexists(path):
                raise InputError(f"output {str(path)!r} appeared while the run was going; the report is not written") from None
            os.rename(tmp, path)
            return path
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return path


def sha256_file(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def source_hashes(params_file=None) -> dict:
    """SHA-256 of every pdlib source (kernels included) and data file, and of the params file."""
    files = sorted(p for p in PACKAGE_DIR.rglob("*") if p.is_file() and p.suffix in (".py", ".gz", ".txt", ".cu", ".metal"))
    out = {str(p.relative_to(PACKAGE_DIR.parent)): sha256_file(p) for p in files}
    out["params_file"] = sha256_file(params_file) if params_file else None
    return out


def git_commit() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=5)
        # "-dirty" means the code or params that ran differ from the commit (outputs being rewritten don't count)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", "../params"],
                               cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment(backend: str) -> dict:
    import mlx.core as mx
    try:
        from importlib.metadata import version
        mlx_lm = version("mlx-lm")
    except Exception:
        mlx_lm = None
    try:
        device_name = mx.device_info().get("device_name")
    except Exception:
        device_name = platform.processor() or None
    return {"device": "cpu" if backend == "cpu" else "gpu", "device_name": device_name, "backend": backend,
            "mlx": mx.__version__, "mlx_lm": mlx_lm, "python": platform.python_version(),
            "platform": platform.platform(), "machine": platform.machine(), "git_commit": git_commit(),
            "MLX_ENABLE_TF32": os.environ.get("MLX_ENABLE_TF32")}


def build_report(*, params: dict, model: dict, prompts: dict, backend: str, validation: dict,
                 reference_tokens: dict, trials: list, params_file=None) -> dict:
    return {"schema": SCHEMA,
            "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "params": params, "model": model, "prompts": prompts, "environment": environment(backend),
            "sources": source_hashes(params_file), "validation": validation,
            "reference_tokens": reference_tokens, "trials": trials}

"""The report: one JSON file (schema in report_schema.py), and the one writer for everything pdlib writes:
atomic and never over an existing file.

    path = claim_output(args.output)          # refuses before any work if the path exists or can't be made
    write_report(path, build_report(...))     # temp file + link: an interrupted run leaves nothing
    write_new("out/summary.md", text)         # the same never-overwrite writer for every other output
    write_report("out/report.json.gz", report)  # a name ending .gz is written gzip-compressed (deterministic)
    report = json.loads(read_text("out/report.json.gz"))   # .json or .json.gz alike (gzip's magic bytes)
"""

import datetime
import gzip
import hashlib
import json
import os
import platform
import subprocess
import tempfile
import zlib
from pathlib import Path

from pdlib import settings
from pdlib.errors import InputError
from pdlib.report.schema import SCHEMA

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # pdlib/


def claim_output(path) -> Path:
    """Check, before doing any work, that `path` can be written without overwriting anything. Creates
    nothing: folders are made only when the report is written."""
    if str(path).endswith(("/", os.sep)):
        raise InputError(f"output {str(path)!r} names a folder: give the report's file name")
    path = Path(path)
    if os.path.lexists(path):
        raise InputError(f"output {str(path)!r} already exists; pdlib never overwrites a report: choose a new path")
    parent = path.parent.resolve()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot create the folder of output {str(path)!r}: {str(parent)!r} is not a writable folder")
    return path


# Temp files being written now: an interrupt that cannot wait for cleanup (pdlib.interrupt) removes them.
PENDING: set[str] = set()


def write_new(path, data=None, *, write=None, what: str = "file") -> Path:
    """The one writer for every file pdlib produces: `data` (str or bytes), or `write(tmp_path)`, goes to a
    temp file beside `path`, which is then hard-linked into place. The link is atomic and fails if `path`
    exists, so a reader never sees half a file and nothing is ever overwritten, even by a file that
    appears meanwhile. InputError if `path` exists (before or after the write)."""
    path = Path(path)
    if (data is None) == (write is None):
        raise ValueError("write_new needs exactly one of data and write")
    if os.path.lexists(path):
        raise InputError(f"output {str(path)!r} already exists; pdlib never overwrites: choose a new path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    PENDING.add(tmp)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; outputs are ordinary files
        with os.fdopen(fd, "wb") as f:
            if data is not None:
                f.write(data.encode() if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        if write is not None:
            write(Path(tmp))
        try:
            os.link(tmp, path)  # unlike rename, never replaces an existing file
        except FileExistsError:
            raise InputError(
                f"output {str(path)!r} appeared while pdlib was writing it; the {what} is not written"
            ) from None
        except OSError:  # a filesystem without hard links: an exclusive create, then a copy
            with open(path, "xb") as dst, open(tmp, "rb") as src:
                dst.write(src.read())
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        PENDING.discard(tmp)
    return path


GZIP_MAGIC = b"\x1f\x8b"


def gzip_bytes(data: bytes) -> bytes:
    """gzip with mtime 0 and no file name: the same bytes in give the same file out."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def write_report(path, report: dict) -> Path:
    """The report as compact JSON, through write_new (atomic, never over an existing file); gzip-compressed
    when `path` ends in .gz."""
    path = Path(path)
    if path.suffix == ".gz":
        return write_new(path, gzip_bytes(json.dumps(report, separators=(",", ":")).encode()), what="report")

    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(report, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())

    return write_new(path, write=dump, what="report")


def read_bytes(path, *, what: str = "file") -> bytes:
    """A file's content, gunzipped when it is gzip (by its magic bytes, whatever its name). InputError, one
    line naming the file, when it cannot be read or is a damaged gzip."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{path}: cannot read {what}: a damaged gzip file (truncated?): {e}") from None


def read_text(path, *, what: str = "file") -> str:
    """read_bytes as UTF-8 text; InputError (one line) when it is not."""
    try:
        return read_bytes(path, what=what).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: cannot read {what} (not UTF-8: {e.reason} at byte {e.start})") from None


def report_file(path) -> Path:
    """`path`, or its compressed twin `path.gz` when only that exists (and `path` without .gz when only that
    does): a published folder holds report.json.gz where a run's holds report.json."""
    path = Path(path)
    twin = path.with_name(path.name[:-3]) if path.name.endswith(".gz") else path.with_name(path.name + ".gz")
    return twin if not path.exists() and twin.exists() else path


def copy_file(source, dest) -> Path:
    """Byte-for-byte copy of `source` to `dest`, through write_new."""
    return write_new(dest, Path(source).read_bytes(), what="copy")


def copy_report(source, dest) -> Path:
    """`source` (.json or .json.gz) to `dest`, compressed when `dest` ends in .gz, else plain: the JSON text
    is the source's byte for byte either way. Through write_new."""
    data, dest = Path(source).read_bytes(), Path(dest)
    if (data[:2] == GZIP_MAGIC) != (dest.suffix == ".gz"):
        data = gzip_bytes(data) if dest.suffix == ".gz" else read_bytes(source)
    return write_new(dest, data, what="report")


def sha256_file(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def source_hashes(params_file=None) -> dict:
    """SHA-256 of every pdlib source (kernels included) and data file, and of the params file."""
    files = sorted(
        p for p in PACKAGE_DIR.rglob("*") if p.is_file() and p.suffix in (".py", ".gz", ".txt", ".cu", ".cuh", ".metal")
    )
    out = {str(p.relative_to(PACKAGE_DIR.parent)): sha256_file(p) for p in files}
    out["params_file"] = sha256_file(params_file) if params_file else None
    return out


def sources_hash(sources: dict) -> str:
    """The 12 hex digits docs/results.md calls a report's sources hash: the pdlib files' SHA-256s, condensed."""
    lines = "".join(f"{k} {v}\n" for k, v in sorted(sources.items()) if k.startswith("pdlib/"))
    return hashlib.sha256(lines.encode()).hexdigest()[:12]


def git_commit() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=5)
        # "-dirty" means the code or params that ran differ from the commit (outputs being rewritten don't count)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", "../params"],
            cwd=PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=5,
        )
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
    return {
        "device": "cpu" if backend == "cpu" else "gpu",
        "device_name": device_name,
        "backend": backend,
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "git_commit": git_commit(),
        "MLX_ENABLE_TF32": os.environ.get("MLX_ENABLE_TF32"),
        **{k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        "settings": settings.current(settings.ENGINE),
        "cpu_cores": _cores(),
    }


# Recorded when set (absent: the default). MLX's CUDA graph commit size and use decide how long dispatching
# a big graph holds the host; the GPU a process was given (and its cores, `_cores`) say which of a shared
# host's runs side by side this was. The engine's PDLIB_* switches are recorded under "settings", always.
RECORDED_ENV = ("MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER", "MLX_USE_CUDA_GRAPHS", "CUDA_VISIBLE_DEVICES")


def _cores() -> str:
    """Cores this process may run on, of the host's ("16 of 32"): a pinned run shows it."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        usable = os.cpu_count()
    return f"{usable} of {os.cpu_count()}"


def build_report(
    *,
    params: dict,
    model: dict,
    prompts: dict,
    backend: str,
    validation: dict,
    reference_tokens: dict,
    trials: list,
    params_file=None,
    slo: dict | None = None,
    workers: dict | None = None,
    settings: dict | None = None,
    solo: dict | None = None,
) -> dict:
    env = environment(backend)
    env.update(settings or {})  # what the engine ran as (Engine.settings: decode, prefill arithmetic, token read)
    if workers:  # a disagg run's two workers
        env["workers"] = workers
    report = {
        "schema": SCHEMA,
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": params,
        "model": model,
        "prompts": prompts,
        "environment": env,
        "sources": source_hashes(params_file),
        "validation": validation,
        "reference_tokens": reference_tokens,
        "trials": trials,
    }
    if slo is not None:  # only when an slo policy ran (report_schema.py)
        report["slo"] = slo
    if solo is not None:  # each request alone on the device, before the trials (run/solo.py)
        report["solo"] = solo
    return report

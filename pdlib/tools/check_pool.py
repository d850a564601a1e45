"""check-kernels' families side by side (`--jobs N`). On a fresh GPU machine check-kernels spends most of its time
compiling kernels (NVRTC, one module at a time within a process); worker processes compile and check several
families at once, the slowest first. Each worker has its own MLX kernel cache, so no worker reads a module another
is still writing; after them every worker's modules are copied into this process's cache (MLX's CUDA backend names
a module by its source, so a later command on the machine reads them instead of compiling). GPUs run one process's
kernels at a time (without MPS): a launch that needs every SM (a persistent decode) still has them all.

    rows = run_families(families, seed=0, jobs=4, done=print_family)   # rows in the families' order
"""

import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

CACHE_ENV = "MLX_PTX_CACHE_DIR"  # read by MLX (jit_module.cpp's ptx_cache_dir) when it first compiles a module


def worker_cache(base: str) -> None:
    """A worker's own kernel cache under `base` (a pool initializer: before the worker compiles anything)."""
    os.environ[CACHE_ENV] = str(Path(base) / f"worker-{os.getpid()}")


def run_family(family, seed: int) -> tuple[list[dict], float]:
    t = time.perf_counter()
    rows = family(seed)
    return rows, time.perf_counter() - t


def mlx_cache_dir() -> Path:
    """Where MLX's CUDA backend keeps compiled modules for this process: $MLX_PTX_CACHE_DIR, or <temp>/mlx/<MLX
    version>/ptx."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    import mlx.core as mx

    return Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "ptx"


def merge_caches(base: Path, into: Path) -> int:
    """Every worker's modules (name.ptx with its name.txt and name.cu, long names in nested folders) into `into`,
    a module already there kept; the .ptx last and each file by rename, so a reader never meets half a module.
    Returns the modules added."""
    added = 0
    for worker in sorted(p for p in base.iterdir() if p.is_dir()):
        for ptx in sorted(worker.rglob("*.ptx")):
            dest = into / ptx.relative_to(worker)
            if dest.exists():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            for ext in (".txt", ".cu", ".ptx"):
                src, target = ptx.with_suffix(ext), dest.with_suffix(ext)
                if src.exists():
                    part = target.with_name(target.name + ".part")
                    shutil.copyfile(src, part)
                    os.replace(part, target)
            added += 1
    return added


def run_families(families: list, *, seed: int, jobs: int, first: tuple[str, ...] = (), done=None) -> list[dict]:
    """Each family (a picklable function seed -> rows) in one of `jobs` worker processes, the families named in
    `first` (by name without check_) started first; done(name, rows, seconds) as each ends. The rows, in the
    order of `families`; a family that raised raises here, after the others have ended."""
    names = [f.__name__.removeprefix("check_") for f in families]
    order = sorted(range(len(families)), key=lambda i: first.index(names[i]) if names[i] in first else len(first))
    results: dict[int, list[dict]] = {}
    failure = None
    with tempfile.TemporaryDirectory(prefix="pdlib-check-caches-") as base:
        context = multiprocessing.get_context("spawn")  # a fresh MLX in each worker, not a copy of this one
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=worker_cache, initargs=(base,)) as pool:
            futures = {pool.submit(run_family, families[i], seed): i for i in order}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    rows, seconds = future.result()
                except Exception as e:  # the others still finish: their modules are worth keeping
                    failure = failure or e
                    continue
                results[i] = rows
                if done is not None:
                    done(names[i], rows, seconds)
        into = mlx_cache_dir()
        into.mkdir(parents=True, exist_ok=True)
        merge_caches(Path(base), into)
    if failure is not None:
        raise failure
    return [row for i in range(len(families)) for row in results[i]]

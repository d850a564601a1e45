"""check-kernels --jobs on the CPU, with stand-in families that write modules into their kernel cache as MLX does:
rows come back in the families' order whatever order they end in, each worker has its own cache, every worker's
modules reach this process's cache (an existing one is kept), and a family that raises stops the command after
the others have ended and their modules were kept."""

import os
import time
from pathlib import Path

import pytest

from pdlib.__main__ import main
from pdlib.tools.check_pool import CACHE_ENV, merge_caches, run_families

LONG = "m" * 300  # longer than MLX's 245-character file names: a folder, then the rest


def compile_module(name: str) -> str:
    """What MLX's CUDA backend leaves per module (jit_module.cpp): name.ptx, name.txt, name.cu."""
    cache = Path(os.environ[CACHE_ENV])
    path = cache / (name[:245] + "/" + name[245:] if len(name) > 245 else name)
    path.parent.mkdir(parents=True, exist_ok=True)
    for ext in (".txt", ".cu", ".ptx"):
        path.with_name(path.name + ext).write_text(f"{name}{ext} by {os.getpid()}")
    return str(cache)


def check_slow(seed):
    time.sleep(1.0)  # ends last, listed first
    return [{"kernel": "slow", "seed": seed, "cache": compile_module("slow_mod")}]


def check_fast(seed):
    return [{"kernel": "fast", "cache": compile_module(LONG)}, {"kernel": "fast2", "cache": ""}]


def check_shared(seed):
    return [{"kernel": "shared", "cache": compile_module("kept_mod")}]


def check_broken(seed):
    compile_module("before_failing")
    raise RuntimeError("a family failed")


def test_rows_in_family_order_each_worker_its_cache_and_every_module_merged(tmp_path, monkeypatch):
    into = tmp_path / "cache"
    into.mkdir()
    (into / "kept_mod.ptx").write_text("already here")
    monkeypatch.setenv(CACHE_ENV, str(into))
    ended = []
    rows = run_families(
        [check_slow, check_fast, check_shared],
        seed=7,
        jobs=3,
        first=("fast",),
        done=lambda name, new, took: ended.append((name, len(new), took >= 0)),
    )
    assert [r["kernel"] for r in rows] == ["slow", "fast", "fast2", "shared"]
    assert rows[0]["seed"] == 7
    assert ended[-1] == ("slow", 1, True) and sorted(n for n, _, _ in ended) == ["fast", "shared", "slow"]
    caches = {rows[0]["cache"], rows[1]["cache"], rows[3]["cache"]}
    assert len(caches) == 3 and not any(c.startswith(str(into)) for c in caches)  # each worker its own
    assert (into / "slow_mod.ptx").read_text().startswith("slow_mod.ptx by")
    assert (into / "slow_mod.txt").exists() and (into / "slow_mod.cu").exists()
    assert (into / LONG[:245] / (LONG[245:] + ".ptx")).exists()
    assert (into / "kept_mod.ptx").read_text() == "already here"
    assert not list(into.rglob("*.part"))


def test_a_family_that_raises_raises_after_the_others_and_their_modules_are_kept(tmp_path, monkeypatch):
    into = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(into))
    with pytest.raises(RuntimeError, match="a family failed"):
        run_families([check_broken, check_slow], seed=0, jobs=2)
    assert (into / "slow_mod.ptx").exists() and (into / "before_failing.ptx").exists()


def test_merge_adds_only_whole_modules_it_lacks(tmp_path):
    worker = tmp_path / "base" / "worker-1"
    worker.mkdir(parents=True)
    (worker / "a.ptx").write_text("a")
    (worker / "a.txt").write_text("names")
    (worker / "b.ptx").write_text("b new")
    into = tmp_path / "into"
    into.mkdir()
    (into / "b.ptx").write_text("b old")
    assert merge_caches(tmp_path / "base", into) == 1
    assert (into / "a.ptx").read_text() == "a" and (into / "a.txt").read_text() == "names"
    assert (into / "b.ptx").read_text() == "b old" and not (into / "a.cu").exists()


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_check_kernels_refuses_jobs_under_one_in_one_line(capsys, jobs):
    assert main(["check-kernels", "--jobs", jobs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--jobs" in err[0] and jobs in err[0]

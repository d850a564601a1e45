"""`make device-parts` (the Makefile): MLX's CUDA wheel re-split so that staging it on a GPU machine takes one call
beside this checkout's tree, not two: the parts put back together are the wheel, each transfer fits 64 MiB with
the tree, and a wheel that two calls cannot hold, or none at all, is refused in one line.

    .venv/bin/python -m pytest -q tests/tools/test_device_parts.py
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def stage(tmp_path: Path, size: int) -> Path:
    d = tmp_path / "device"
    (d / "p3").mkdir(parents=True)
    with open(d / "mlx_cuda_13-0.0.0-py3-none-manylinux_2_35_x86_64.whl", "wb") as f:
        f.truncate(size)  # sparse: its bytes do not matter, where they go does
        f.seek(size // 3)
        f.write(b"middle")  # a part cut or put back in the wrong place would move these
        f.seek(size - 4)
        f.write(b"last")
    (d / "p3" / "mlx-0.0.0-cp312-cp312-manylinux_2_35_x86_64.whl").write_bytes(b"m" * 1000)
    (d / "p3" / "mlx_lm-0.0.0-py3-none-any.whl").write_bytes(b"l" * 500)
    return d


def parts(d: Path, *args) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("no make")
    return subprocess.run(
        ["make", "-s", "device-parts", f"DEVICE_DIR={d}", *args], cwd=ROOT, capture_output=True, text=True
    )


def tree_bytes() -> int:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


def test_the_parts_are_the_wheel_and_each_transfer_fits_beside_the_tree(tmp_path):
    d = stage(tmp_path, 60 * MIB)
    done = parts(d)
    assert done.returncode == 0, done.stderr
    (wheel,) = d.glob("mlx_cuda_13-*.whl")
    again = b"".join((d / p).read_bytes() for p in ("p1/part.aa", "p2/part.ab", "p3/part.ac"))
    assert again == wheel.read_bytes() and (d / "p2/part.ab").stat().st_size == 0
    tree = tree_bytes()
    first = sum(f.stat().st_size for f in (d / "p1").iterdir()) + tree
    second = sum(f.stat().st_size for f in (d / "p3").iterdir()) + tree
    assert first <= 62 * MIB and second <= 62 * MIB  # 64 MiB a call, 2 spare (DEVICE_MARGIN_MIB)
    assert first > 61 * MIB  # the first call takes all it can: the second carries the least


@pytest.mark.parametrize("size, message", [(140 * MIB, "does not fit two calls"), (None, "run ../shared/gpu/fetch-")])
def test_a_wheel_too_big_or_none_is_refused_in_one_line(tmp_path, size, message):
    d = stage(tmp_path, size) if size else tmp_path / "empty"
    done = parts(d)
    first, *rest = done.stderr.splitlines()  # then make's own line, naming the target
    assert done.returncode == 2 and first.startswith("error: ") and message in first and not (d / "p1").exists()
    assert all("error:" not in line for line in rest)

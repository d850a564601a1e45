"""The presentation side reads reports and never reaches into the engine; every file goes through one
never-overwrite writer; Ctrl-C stops a command within about a second, leaving no partial file."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdlib.errors import InputError
from pdlib.report.io import PENDING, write_new

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "data" / "small-report.json"


def test_presenting_a_report_loads_no_mlx(tmp_path):
    """Importing analysis, plots and the presentation modules (the sweep's frontier included), and rendering a
    report through them and the CLI, must not import MLX, mlx-lm, transformers or torch."""
    script = textwrap.dedent(f"""
        import sys
        from pdlib.analysis import frames as analysis
        from pdlib.publish import export
        from pdlib.analysis import frontier
        from pdlib.publish import notebooks
        from pdlib.analysis import plots, present
        from pdlib.publish import runs
        from pdlib.run import sweep
        from pdlib import text
        from pdlib.__main__ import main
        report = present.check_report_file({str(REPORT)!r})
        present.validation_table(report); present.run_line(report); present.environment_table(report)
        points = frontier.with_frontiers(frontier.point_summary(
            analysis.metrics_frame(report).assign(chunk_size=16, role="swept")))  # each policy as a sweep point
        plots.frontier_chart(points).to_dict(); present.frontier_table(points); frontier.reading(points)
        assert main(["render", {str(REPORT)!r}, "--out", {str(tmp_path / "figs")!r}]) == 0
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("mlx", "mlx_lm", "transformers", "torch"))
        assert not heavy, heavy
        print("clean")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and "clean" in proc.stdout, proc.stderr[-2000:]


def test_write_new_never_overwrites_even_a_file_that_appears_meanwhile(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    assert write_new(path, "one") == path and path.read_text() == "one"
    with pytest.raises(InputError, match="already exists"):
        write_new(path, "two")

    def racing(tmp):  # another writer gets there first, while this one is writing
        tmp.write_text("mine")
        (tmp_path / "b.txt").write_text("theirs")

    with pytest.raises(InputError, match="appeared while"):
        write_new(tmp_path / "b.txt", write=racing)
    assert path.read_text() == "one" and (tmp_path / "b.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.txt", "sub"]  # no temp left
    assert not PENDING
    with pytest.raises(ValueError):
        write_new(tmp_path / "c", "x", write=lambda tmp: None)


def _interrupt(argv, *, ready: str, tmp_path, wait_s: float = 3.0):
    """Start `argv`, send SIGINT once `ready` is on stdout, return (exit code, seconds to exit, stderr)."""
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 300
        while ready not in (proc.stdout.readline() or ""):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.5)  # well inside the work
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=wait_s + 30)
        return code, time.monotonic() - t0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_stops_a_long_mlx_computation_within_a_second_or_two(tmp_path):
    """One mx.eval that runs for minutes holds the main thread in C++: Python's own handler would wait."""
    script = textwrap.dedent("""
        import mlx.core as mx
        from pdlib.interrupt import interruptible
        x = mx.random.normal((1024, 1024))
        with interruptible():
            y = x
            for _ in range(20000):
                y = (y @ x) / 1024
            print("ready", flush=True)
            mx.eval(y)
        print("finished: the interrupt was missed")
    """)
    code, seconds, err = _interrupt([sys.executable, "-c", script], ready="ready", tmp_path=tmp_path)
    assert code == 130 and seconds < 3.0, (code, seconds, err)
    assert "interrupted" in err


def test_ctrl_c_during_a_run_exits_130_and_writes_nothing(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "pdlib",
        "run",
        "--model",
        "synthetic:tiny",
        "--prompt-tokens",
        "2000",
        "--output-tokens",
        "200",
        "--chunk-size",
        "64",
        "--trials",
        "50",
        "--warmups",
        "0",
        "--output",
        "out/report.json",
    ]
    code, seconds, err = _interrupt(argv, ready="model synthetic:tiny", tmp_path=tmp_path)
    assert code == 130 and seconds < 3.0, (code, seconds, err)
    assert err.strip().splitlines()[-1].startswith("interrupted")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_report_from_before_pipelining_was_recorded_reads_as_unpipelined():
    """Reports written before `pipeline_decodes` existed ran every step observed first: reading them must not
    take today's default (pipelined), as the run line (text.run_line) does not."""
    from pdlib.analysis.present import report_params
    from pdlib.config import RunParams

    params = RunParams(pipeline_decodes=False).to_dict()
    del params["pipeline_decodes"]
    assert report_params({"params": params}).pipeline_decodes is False
    assert report_params({"params": {**params, "pipeline_decodes": True}}).pipeline_decodes is True
    # nor had reports before polling during chunks
    del params["poll_during_chunks"]
    assert report_params({"params": params}).poll_during_chunks is False
    assert report_params({"params": {**params, "poll_during_chunks": True}}).poll_during_chunks is True

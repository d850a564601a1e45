"""`disagg` (the CPU path) runs B's prompt in a second process (the prefill worker, rank 1) and
receives its K/V over MLX's ring backend on localhost; the gate checks what arrived, trials record the
transfer; a planted transfer fault fails the gate; a dead or hung worker ends the run with one error line."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlx.core as mx
import pytest

import pdlib.run.disagg.transfer as transfer
from pdlib.config import RunParams
from pdlib.run.experiment import Experiment
from pdlib.run.trial import check_tokens, run_once
from pdlib.run.validate import ValidationError
from pdlib.scheduler import Decode, Disagg, Prefill, interleave, plan

PROMPT, OUTPUTS, CHUNK = 40, 6, 16
ROOT = Path(__file__).resolve().parents[2]


def experiment(tiny, policies=("chunked", "disagg")):
    params = RunParams(
        model="synthetic:tiny@0",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=CHUNK,
        policies=policies,
        logical_cache_reset=True,
        validation_checkpoint_every=4,
    )
    return Experiment(params, model=tiny)


@pytest.mark.parametrize("mode", transfer.MODES)
def test_disagg_passes_the_gate_and_a_trial_records_the_transfer(tiny, monkeypatch, mode):
    monkeypatch.setenv("PDLIB_DISAGG_TRANSFER", mode)
    exp = experiment(tiny)
    results = exp.validate()
    d = results["disagg"]
    assert d.passed and d.tokens == results["chunked"].tokens
    # B's prefix is checked once, as received; every output's logits and token and every decode slot as usual
    setup_chunks = -(-PROMPT // CHUNK)
    assert d.checks["prefix_kv"].count == setup_chunks + 1
    assert d.checks["token"].count == d.checks["logits"].count == 2 * OUTPUTS
    assert d.checks["decode_kv"].count == 2 * (OUTPUTS - 1)
    run = run_once(exp.engine, "disagg", steps=exp.walk("disagg"), logical_reset=True)
    check_tokens(run, d.tokens, what="trial")
    b = [e for e in run.events if e["req"] == "B" and e["kind"] in ("prefill", "transfer")]
    assert [e["kind"] for e in b] == ["prefill", "transfer"]
    prefill, moved = b
    L, H, Dh = tiny.config.num_hidden_layers, tiny.config.num_key_value_heads, tiny.config.head_dim
    assert moved["bytes"] == 4 * (L * 2 * H * PROMPT * Dh + tiny.config.vocab_size) and moved["mode"] == mode
    assert prefill["remote"] and (prefill["start"], prefill["stop"]) == (0, PROMPT)
    # on the decode worker's clock: signalled at t0, ready, then the transfer, then B's first token
    assert 0 <= prefill["t_start_ns"] <= prefill["t_end_ns"] <= moved["t_start_ns"] < moved["t_end_ns"]
    assert moved["t_end_ns"] < run.emit_ns["B"][0]
    # A kept decoding while B's prompt ran elsewhere: its decodes before the transfer are ordinary ones
    a_before = [e for e in run.events if e["req"] == "A" and e["t_end_ns"] <= moved["t_start_ns"]]
    assert all(e["kind"] == "decode" for e in a_before)
    w = exp.workers()
    assert w["backend"] == "ring" and w["transfer"] == mode
    assert w["decode"]["pid"] == os.getpid() and w["prefill"]["pid"] != os.getpid()
    # the wait for a silent worker, scaled from its own prefill of B at setup
    assert w["prefill"]["prefill_s"] > 0 and w["ready_timeout_s"] == max(30.0, 20 * w["prefill"]["prefill_s"])


def test_the_wait_for_a_silent_worker_scales_with_its_prefill(monkeypatch):
    from pdlib.run.disagg.remote import ready_timeout_s

    monkeypatch.delenv("PDLIB_DISAGG_TIMEOUT_S", raising=False)
    assert ready_timeout_s(0.01) == 30.0 and ready_timeout_s(4.0) == 80.0
    monkeypatch.setenv("PDLIB_DISAGG_TIMEOUT_S", "3")
    assert ready_timeout_s(4.0) == 3.0


def test_orphaned_folders_of_dead_parents_are_swept(tmp_path, monkeypatch):
    import tempfile

    from pdlib.run.disagg import launch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folders = {}
    for name, pid in (("dead", gone.stdout.strip()), ("alive", str(os.getpid())), ("unowned", None)):
        folders[name] = tmp_path / f"{launch.DIR_PREFIX}{name}"
        folders[name].mkdir()
        if pid is not None:
            (folders[name] / launch.OWNER).write_text(pid)
    (tmp_path / "other").mkdir()
    launch._sweep_orphans()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["other", f"{launch.DIR_PREFIX}alive", f"{launch.DIR_PREFIX}unowned"]
    )


@pytest.mark.parametrize(
    "setting, chunk", [(None, PROMPT), ("", PROMPT), ("whole", PROMPT), ("16", 16), ("1000", PROMPT)]
)
def test_the_prefill_worker_takes_b_whole_unless_told_a_chunk(tiny, monkeypatch, setting, chunk):
    if setting is None:
        monkeypatch.delenv("PDLIB_DISAGG_PREFILL_CHUNK", raising=False)
    else:
        monkeypatch.setenv("PDLIB_DISAGG_PREFILL_CHUNK", setting)
    exp = experiment(tiny, policies=("disagg",))
    assert exp.validate()["disagg"].passed
    assert exp.workers()["prefill_chunk"] == chunk


@pytest.mark.parametrize("setting", ["0", "-3", "half", "2.5"])
def test_a_bad_prefill_chunk_is_one_clear_error(tiny, monkeypatch, setting):
    from pdlib.errors import InputError
    from pdlib.run.disagg.remote import prefill_chunk

    monkeypatch.setenv("PDLIB_DISAGG_PREFILL_CHUNK", setting)
    with pytest.raises(
        InputError, match=f"PDLIB_DISAGG_PREFILL_CHUNK must be whole or a whole number >= 1, got {setting!r}"
    ):
        prefill_chunk(RunParams(model="synthetic:tiny", prompt_tokens=PROMPT))


def test_a_kv_block_shifted_in_the_transfer_is_caught(tiny, monkeypatch):
    real = transfer.receive

    def shifted(shape, vocab, *, mode, group=None):
        kv, logits = real(shape, vocab, mode=mode, group=group)
        kv = mx.concatenate(
            [
                kv[:1],
                mx.concatenate([kv[1:2, ..., :16, :], kv[1:2, ..., 15:31, :], kv[1:2, ..., 32:, :]], axis=-2),
                kv[2:],
            ]
        )
        return kv, logits

    monkeypatch.setattr(transfer, "receive", shifted)
    with pytest.raises(ValidationError, match=r"prefix_kv check, request B, position (1[6-9]|2\d|3[01]), layer 1:"):
        experiment(tiny, ("disagg",)).validate()


def test_the_policy_waits_for_the_probe_and_interleave_holds_each_request():
    validated = plan("disagg", prompt_tokens=8, output_tokens=3, chunk_size=4)
    assert validated[2:] == [Prefill("B", 8, remote=True), Decode("A"), Decode("B"), Decode("A"), Decode("B")]
    assert Prefill("B", 8, remote=True) != Prefill("B", 8)
    polls = iter([False, True])
    from pdlib.scheduler import iter_plan

    live = list(
        interleave(
            iter_plan(
                "disagg", prompt_tokens=8, output_tokens=3, chunk_size=4, policy=Disagg(ready=lambda: next(polls))
            ),
            validated,
        )
    )
    assert live[2:] == [Decode("A"), Prefill("B", 8, remote=True), Decode("A"), Decode("B"), Decode("B")]
    with pytest.raises(RuntimeError, match=r"Decode\(req='B'\) is not B's next validated part"):
        list(interleave(validated[:2] + [Decode("B")] + validated[2:], validated))
    with pytest.raises(RuntimeError, match=r"parts left of the validated plan: \{'A': '3/4'\}"):
        list(interleave(validated[:-2] + validated[-1:], validated))


def _run_cli(tmp_path, fault: str, marker: str, **env):
    out = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "pdlib",
        "run",
        "--model",
        "synthetic:tiny",
        "--prompt-tokens",
        "64",
        "--output-tokens",
        "8",
        "--chunk-size",
        "16",
        "--policies",
        "disagg",
        "--trials",
        "1",
        "--warmups",
        "1",
        "--logical-cache-reset",
        "--quiet",
        "--output",
        str(out),
    ]
    p = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        env=dict(os.environ, PDLIB_DISAGG_WORKER_FAULT=fault, PDLIB_TEST_MARKER=marker, **env),
    )
    return p, out


def _marked_processes(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and f"PDLIB_TEST_MARKER={marker}".encode() in (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize(
    "fault, says",
    [
        # the same words whether A's steps (RemotePrefill.ready) or the wait for B (receive) notice the death first
        (
            "exit@2",
            "prefill worker exited with code 1 before its 'ready' reply (B's prefill on the worker) (its last "
            "words: test hook: exit at prefill 2)",
        ),
        ("hang@2", "prefill worker sent no 'ready' within 3 s (B's prefill on the worker)"),
    ],
)
def test_a_worker_that_dies_or_hangs_mid_run_ends_it_cleanly(tmp_path, fault, says):
    """Prefill 1 is the gate's, 2 the warmup's: one error line, exit 1, no report, no process left."""
    marker = uuid.uuid4().hex
    p, out = _run_cli(tmp_path, fault, marker, PDLIB_DISAGG_TIMEOUT_S="3")
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 1 and errors == [f"error: {says}"], p.stderr
    assert not out.exists() and not list(tmp_path.iterdir())
    assert _marked_processes(marker) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_parent_killed_mid_run_leaves_no_folder_and_no_worker(tmp_path, sig):
    """Killed while the worker hangs in the warmup's prefill (after the group was joined): nothing of the
    run's is left in the temp folder, and the worker follows its parent."""
    marker, tmp, log = uuid.uuid4().hex, tmp_path / "tmp", tmp_path / "worker.log"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "pdlib", "run", "--model", "synthetic:tiny", "--prompt-tokens", "64"]
    cmd += ["--output-tokens", "8", "--chunk-size", "16", "--policies", "disagg", "--trials", "1", "--quiet"]
    env = dict(os.environ, TMPDIR=str(tmp), PDLIB_DISAGG_WORKER_FAULT="hang@2", PDLIB_DISAGG_TIMEOUT_S="120")
    env.update(PDLIB_DISAGG_WORKER_LOG=str(log), PDLIB_TEST_MARKER=marker)
    p = subprocess.Popen(cmd + ["--output", str(tmp_path / "r.json")], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while not (log.exists() and "hang at prefill 2" in log.read_text()):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
        time.sleep(0.2)
    p.send_signal(sig)
    p.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked_processes(marker) == []
    assert [f.name for f in tmp.iterdir() if f.name.startswith("pdlib-disagg-")] == []
    assert not (tmp_path / "r.json").exists()

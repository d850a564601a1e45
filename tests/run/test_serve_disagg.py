"""Serving N requests with disagg (pdlib.batching's Disagg): every prompt on the prefill worker (MLX's ring backend
on the CPU), its K/V sent over on join; the token gate, and a replay whose joins go through the worker again so
the full checks see what arrived; a planted fault in the transfer fails it; a worker that dies ends the serve with
one line, nothing written and no process left."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from pdlib.run.disagg import transfer
from pdlib.run.serve import run_serving
from pdlib.run.serve_lane import PromptLane
from pdlib.run.validate import ValidationError
from pdlib.workload import Workload

ROOT = Path(__file__).parents[2]
MS = 1_000_000


@pytest.fixture
def workload():
    return Workload(
        "disagg", np.array([0, 0, 2 * MS, 5 * MS, 6 * MS]), np.array([16, 24, 20, 12, 30]), np.array([8, 6, 7, 5, 9])
    )


def test_disagg_serves_every_prompt_from_the_worker_and_its_replay_checks_what_arrived(tiny, workload, monkeypatch):
    real, received = transfer.receive, []
    monkeypatch.setattr(transfer, "receive", lambda *a, **k: received.append(a[0][3]) or real(*a, **k))
    report = run_serving(tiny, workload, policy=["disagg"], chunk_size=16, replay=4, warmups=1)
    # every prompt crossed in the warmup, in the timed run and in its replay: none was prefilled here
    assert sorted(received) == sorted(workload.prompt_tokens.tolist() * 3)
    (run,) = report["runs"]
    assert all(r["check"]["status"] == "ok" for r in run["requests"])
    joins = [run["steps"]["work"][i][0] for i in run["steps"]["joins"]]  # a step of one part each
    assert sorted(joins) == sorted([[n, p] for n, p in zip(workload.names, workload.prompt_tokens.tolist())])
    replay = run["replay"]
    assert replay["passed"] and len(replay["requests"]) == 4 and replay["checks"]["prefix_kv"]["count"] >= 4
    workers = report["workers"]
    assert workers["transfer"] in transfer.MODES and workers["prefill"]["rank"] == 1 and workers["prefill_chunk"]


def test_a_kv_block_shifted_in_the_transfer_fails_the_replay(tiny, workload, monkeypatch):
    """Layer 1's K/V from position 8 on arrive one position late. Whatever the tokens do, the replay's joins
    receive through the worker too, and its prefix check names the layer."""
    real = transfer.receive

    def shifted(shape, vocab, *, mode, group=None):
        kv, logits = real(shape, vocab, mode=mode, group=group)
        late = mx.concatenate([kv[1:2, ..., :8, :], kv[1:2, ..., 7 : shape[3] - 1, :]], axis=-2)
        return mx.concatenate([kv[:1], late, kv[2:]]), logits

    monkeypatch.setattr(transfer, "receive", shifted)

    def tokens_unchecked(run, refs):  # the tokens' check is not what is shown here: every request passes it
        for r in run["requests"]:
            r["check"] = {"status": "ok"}
        return []

    monkeypatch.setattr("pdlib.run.serve.gate_run", tokens_unchecked)
    with pytest.raises(ValidationError, match=r"prefix_kv check, request r\d, position \d+, layer 1:"):
        run_serving(tiny, workload, policy=["disagg"], chunk_size=16, replay=5)


def test_a_lane_on_the_worker_needs_its_session_and_only_it():
    with pytest.raises(ValueError, match="needs the worker's session, and only it"):
        PromptLane("worker")
    with pytest.raises(ValueError, match="needs the worker's session, and only it"):
        PromptLane("stream", worker=object())


def test_a_worker_that_dies_mid_serve_ends_it_with_one_line(tmp_path):
    """Prefill commands 1-5 are the warmup's; the third dies: one error line, exit 1, nothing written, no process
    left behind."""
    params = tmp_path / "p.yaml"
    params.write_text(
        "model: synthetic:tiny\nworkload: {source: poisson, rate: 200, n: 5, seed: 1, prompt: 24, output: 6}\n"
        "chunk_size: 16\npolicies: [disagg]\nwarmups: 1\nslo: null\npeers: []\n"
    )
    out, marker = tmp_path / "r.json", uuid.uuid4().hex
    cmd = [sys.executable, "-m", "pdlib", "serve", "--params", str(params), "--output", str(out)]
    env = dict(os.environ, PDLIB_DISAGG_WORKER_FAULT="exit@3", PDLIB_TEST_MARKER=marker)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 1 and len(errors) == 1, p.stderr
    assert "prefill worker exited with code 1" in errors[0] and "exit at prefill 3" in errors[0]
    assert not out.exists()
    from test_disagg import _marked_processes

    assert _marked_processes(marker) == []


def test_a_search_of_disagg_sets_the_worker_up_for_each_rep_and_gates_every_point(tmp_path):
    import json

    from pdlib.run.serve_search import search_params_file

    params = tmp_path / "d.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [disagg]\n"
        "workload: {source: poisson, rate: 1.0, n: 4, seed: 0, prompt: {dist: uniform, lo: 12, hi: 40}, output: 3}\n"
        "search: {lo: 40, hi: 160, reps: 2, precision: 1.0, max_per_rep: 2, criteria: [capacity]}\n"
    )
    log = tmp_path / "log.jsonl"
    search_params_file(params, output=tmp_path / "out.json.gz", log=log, note=lambda _: None)
    points = [p for p in map(json.loads, log.read_text().splitlines()[1:]) if "policy" in p]  # not kept values
    assert {pt["rep"] for pt in points} == {0, 1}  # each rep's prompts (their lengths differ) on the worker,
    # each point's tokens gated against its rep's references; the full checks on the first point of each rate
    assert {pt["rate"] for pt in points} == {pt["rate"] for pt in points if "replay" in pt["gate"]}
    for pt in points:
        if "replay" not in pt["gate"]:
            assert pt["gate"]["checks"] == "tokens"
            continue
        replay = pt["gate"]["replay"]
        assert replay["passed"] and replay["checks"]["prefix_kv"]["count"] >= len(replay["requests"]) > 0

"""Serving with a prompt lane (pdlib/run/serve_lane.py): overlap and partition run each prompt elsewhere as one
whole prefill while the decode rounds go on, join it whole, pass the token gate and the full replay; a prompt
corrupted on the lane is caught."""

import mlx.core as mx
import numpy as np
import pytest

import pdlib.run.overlap as overlap
from pdlib.run.serve import run_serving
from pdlib.run.trial import TokenMismatch

MS = 1_000_000


@pytest.fixture(scope="module")
def workload():
    from pdlib.workload import Workload

    # r0 decodes for a while; the long prompts of r1-r3 arrive while it does
    return Workload(
        "lane", np.array([0, 1 * MS, 2 * MS, 3 * MS]), np.array([16, 200, 160, 120]), np.array([40, 6, 5, 4])
    )


@pytest.fixture(scope="module")
def report(tiny, workload):
    return run_serving(tiny, workload, policy=["overlap", "partition"], chunk_size=32, replay=4)


@pytest.mark.parametrize("policy", ["overlap", "partition"])
def test_each_prompt_is_joined_whole_once_in_arrival_order_with_decodes_in_between(report, workload, policy):
    (run,) = [r for r in report["runs"] if r["policy"] == policy]
    work, joins = run["steps"]["work"], run["steps"]["joins"]
    joined = [work[i][0] for i in joins]
    assert joined == [[n, p] for n, p in zip(workload.names, workload.prompt_tokens.tolist())]
    assert all(len(work[i]) == 1 for i in joins)  # a join is a step of its own
    prompts = [part for step in work for part in step if part[1] is not None]
    assert prompts == joined  # no prompt token anywhere else
    # r0 went on decoding while r1's prompt was out: decode rounds between r0's join and r1's
    between = work[joins[0] + 1 : joins[1]]
    assert between and all(part == ["r0", None] for step in between for part in step)
    assert run["replay"]["passed"] and len(run["replay"]["requests"]) == 4
    assert all(r["check"]["status"] == "ok" for r in run["requests"])


def test_a_prompt_corrupted_on_the_lane_is_caught(tiny, workload, monkeypatch):
    real = overlap.StreamPrefill.start

    def start(self, engine):  # the lane prefills the prompt with its 10th token changed
        r = engine.requests[self.req]
        good = r.prompt
        r.prompt = mx.concatenate([good[:10], (good[10:11] + 1) % tiny.config.vocab_size, good[11:]])
        try:
            real(self, engine)
        finally:
            r.prompt = good

    monkeypatch.setattr(overlap.StreamPrefill, "start", start)
    with pytest.raises(TokenMismatch, match="request r0 differs from the validated reference"):
        run_serving(tiny, workload, policy="overlap", chunk_size=32, replay=4)

"""Serving with a prompt lane (pdlib/run/serve_lane.py): overlap and partition run each prompt elsewhere as one
whole prefill while the decode rounds go on, join it whole, pass the token gate and the full replay; a prompt
corrupted on the lane is caught."""

import mlx.core as mx
import numpy as np
import pytest
from plants import plant_prompt_token

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
    plant_prompt_token(monkeypatch, overlap.StreamPrefill, tiny.config.vocab_size, 10)  # on the lane
    with pytest.raises(TokenMismatch, match="request r0 differs from the validated reference"):
        run_serving(tiny, workload, policy="overlap", chunk_size=32, replay=4)


def test_partitions_rounds_run_on_slice_a_while_a_prompt_is_out_and_are_logged(tiny, workload, monkeypatch):
    from pdlib.engine import Engine
    from pdlib.run.partition import slice_pair

    seen = []  # the stream each Engine.batch call was issued on
    real = Engine.batch

    def spy(self, parts, **kw):
        seen.append(mx.default_stream(mx.default_device()))
        return real(self, parts, **kw)

    monkeypatch.setattr(Engine, "batch", spy)
    run = run_serving(tiny, workload, policy="partition", chunk_size=32, replay=0)["runs"][0]
    steps = run["steps"]
    issued = [i for i in range(len(steps["work"])) if i not in steps["joins"]]  # a join issues nothing
    assert len(seen) == len(issued)
    on_a = [i for i, s in zip(issued, seen) if s == slice_pair().a.stream]
    assert on_a and on_a == steps["sliced"]  # exactly the steps issued while a prompt was out
    default = mx.default_stream(mx.default_device())
    assert all(s == default for i, s in zip(issued, seen) if i not in on_a)

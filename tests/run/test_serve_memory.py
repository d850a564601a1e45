"""Serving more requests than memory holds caches for (pdlib/run/serve.py, Memory): the requests wait, arrived,
for a free cache, every policy still passes the token gate and the replay, no more requests hold a cache at once
than there are, and the runs record the waits (run_loss: cache_waits, the TTFT spent waiting, "memory").

    .venv/bin/python -m pytest -q tests/run/test_serve_memory.py
"""

import numpy as np
import pytest

from pdlib.batching import BATCH_POLICIES
from pdlib.engine import Engine
from pdlib.report.serving import slos_from_step
from pdlib.report.serving_loss import run_loss
from pdlib.run.serve import kv_cache_bytes, run_serving
from pdlib.workload import Workload

SLOTS, CHUNK = 2, 16


@pytest.fixture(scope="module")
def workload():
    return Workload("test", np.zeros(5, np.int64), np.array([40, 24, 56, 30, 33]), np.array([5, 6, 3, 4, 5]))


@pytest.fixture(scope="module")
def report(tiny, workload):
    capacity = int((workload.prompt_tokens + workload.output_tokens).max())
    with pytest.MonkeyPatch.context() as m:  # memory for two caches: three requests wait at first
        m.setenv("PDLIB_KV_CACHE_GIB", str(kv_cache_bytes(tiny, requests=SLOTS, capacity=capacity) / 2**30))
        return run_serving(tiny, workload, policy=list(BATCH_POLICIES), chunk_size=CHUNK, replay=2)


def held(run: dict) -> int:
    """The most requests between their first logged part and their last at any step."""
    spans = {}
    for i, step in enumerate(run["steps"]["work"]):
        for name, _ in step:
            spans[name] = (spans.get(name, (i, i))[0], i)
    return max(sum(a <= i <= b for a, b in spans.values()) for i in range(len(run["steps"]["work"])))


def test_requests_wait_for_a_cache_and_every_policy_passes_the_gate(tiny, report, workload):
    assert report["engine"]["slots"] == SLOTS
    assert report["engine"]["kv_cache_bytes"] == kv_cache_bytes(tiny, requests=SLOTS, capacity=56 + 3)
    for run in report["runs"]:
        assert [r["check"]["status"] for r in run["requests"]] == ["ok"] * workload.n, run["policy"]
        assert run["replay"]["passed"] and len(run["replay"]["requests"]) == 2
        assert held(run) <= SLOTS, run["policy"]
        waits = [r["cache_wait_ns"] for r in run["requests"]]
        assert waits[:SLOTS] == [0, 0] and all(w > 0 for w in waits[SLOTS:]), run["policy"]  # all arrived at 0
        admitted = [r["admitted_ns"] for r in run["requests"]]
        assert admitted == sorted(admitted)  # in arrival order


def test_the_waits_are_counted_where_latency_is_lost(report):
    slos = slos_from_step(decode_ms=1e-3, ttft_ms=1e-3)  # every request late
    for run in report["runs"]:
        loss = run_loss(run, slos)
        assert loss["cache_waits"] == 3
        assert loss["peak_memory_gib"] == run["peak_memory_bytes"] / 2**30 > 0  # the caches at least
        for n in ("strict", "relaxed"):
            assert 0 < loss[f"ttft_over_{n}_memory_share"] <= loss[f"ttft_over_{n}_wait_share"] <= 1


def test_a_cache_handed_on_unemptied_fails_the_run(tiny, workload, monkeypatch):
    """The planted fault: attach hands on a cache still holding its last owner's positions."""
    capacity = int((workload.prompt_tokens + workload.output_tokens).max())
    monkeypatch.setenv("PDLIB_KV_CACHE_GIB", str(kv_cache_bytes(tiny, requests=1, capacity=capacity) / 2**30))
    attach = Engine.attach

    def unemptied(self, name):
        cache = self.idle[0] if self.idle else None
        length = cache.length if cache is not None else 0
        attach(self, name)
        if cache is not None:
            cache.advance(length)  # its positions back

    monkeypatch.setattr(Engine, "attach", unemptied)
    with pytest.raises(ValueError, match="overruns r1's 24-token prompt"):
        run_serving(tiny, workload, policy="chunked", chunk_size=CHUNK, replay=0)

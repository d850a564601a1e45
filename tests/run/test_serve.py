"""Serving N requests with arrivals (pdlib.run.serve) on the tiny synthetic model (CPU, seconds): every policy
passes the token gate, stamps follow arrivals, the summary is report.serving's, planted wrong tokens and
near-ties are told apart, fifo's order, and the params file.

    .venv/bin/python -m pytest -q tests/run/test_serve.py

One report of a 6-request workload under every policy is made once per module (`good`) and shared; the smoke
params file's own run (~60 s, mlx-lm peers included) is listed as slow in tests/conftest.py.
"""

import copy
import dataclasses
import json
import math
import re
import time

import mlx.core as mx
import numpy as np
import pytest

from pdlib.batching import BATCH_POLICIES
from pdlib.errors import InputError
from pdlib.report.io import read_text
from pdlib.report.serving import run_summary
from pdlib.run.serve import SCHEMA, run_serving, serve_params_file, summary_table, write_serving_report
from pdlib.run.serve_gate import NEAR_TIE_MARGIN, ReferenceSeq, check_request, reference_sequences
from pdlib.run.serve_params import load_serve_params
from pdlib.run.trial import TokenMismatch
from pdlib.scheduler import Decode, Prefill, RequestState
from pdlib.workload import Workload, iter_prompts

MS = 1_000_000
LATE = 1_500 * MS  # r5 arrives after the others are done, with room on a busy CPU: the run waits for it
CHUNK = 16
POLICIES = list(BATCH_POLICIES)


@pytest.fixture(scope="module")
def workload():
    return Workload(
        "test",
        np.array([0, 5 * MS, 10 * MS, 12 * MS, 30 * MS, LATE]),
        np.array([40, 70, 24, 56, 33, 48]),
        np.array([5, 4, 6, 3, 1, 5]),
    )


@pytest.fixture(scope="module")
def refs(tiny, workload):
    prompts = {p.name: p.token_ids for p in iter_prompts(workload, vocab_size=tiny.config.vocab_size)}
    out, _ = reference_sequences(tiny, prompts, dict(zip(workload.names, workload.output_tokens.tolist())))
    return out


@pytest.fixture(scope="module")
def good(tiny, workload):
    return run_serving(tiny, workload, policy=POLICIES, chunk_size=CHUNK)


def runs(report):
    return {r["policy"]: r for r in report["runs"]}


def test_every_policy_passes_the_token_gate(good, refs, workload):
    assert good["schema"] == SCHEMA and [r["policy"] for r in good["runs"]] == POLICIES
    assert good["gate"]["reference_s"] > 0 and good["gate"]["near_ties"] == []
    for run in good["runs"]:
        for r, n in zip(run["requests"], workload.output_tokens.tolist()):
            assert r["check"] == {"status": "ok", "checked": n}
            assert r["output_ids"] == refs[r["name"]].tokens and len(r["emit_ns"]) == n
    assert good["engine"]["capacity"] == 70 + 4 and good["engine"]["slots"] == 6
    assert good["engine"]["warm_rows"] == [1] and good["engine"]["warm_s"] > 0  # every matmul MLX's here
    for run in good["runs"]:  # the host's part of each step: from its start to its issue, before its end
        s = run["steps"]
        assert all(a <= t <= b for a, t, b in zip(s["t_start_ns"], s["t_issued_ns"], s["t_end_ns"], strict=True))
    json.dumps(good, allow_nan=True)  # the report is plain JSON
    assert "mixed" in summary_table(good)


def first_step(run, name):
    return next(i for i, w in enumerate(run["steps"]["work"]) if any(p[0] == name for p in w))


def test_emits_follow_arrivals_and_the_summary_is_report_servings(good):
    for run in good["runs"]:
        steps = run["steps"]
        for r in run["requests"]:
            assert r["admitted_ns"] >= r["arrival_ns"]
            assert steps["t_start_ns"][first_step(run, r["name"])] >= r["arrival_ns"]  # not served before it arrives
            assert r["emit_ns"][0] >= r["arrival_ns"] and r["emit_ns"] == sorted(r["emit_ns"])
        again = run_summary([{"arrival_ns": r["arrival_ns"], "emit_ns": r["emit_ns"]} for r in run["requests"]])
        assert again.keys() == run["summary"].keys()
        for k, v in again.items():
            assert v == run["summary"][k] or math.isnan(v) and math.isnan(run["summary"][k]), k
        assert run["summary"]["n_requests"] == 6 and run["summary"]["n_output_tokens"] == 24
        assert run["makespan_ns"] == steps["t_end_ns"][-1] >= max(r["emit_ns"][-1] for r in run["requests"])


def test_a_late_request_waits_for_its_arrival(good):
    for run in good["runs"]:
        i = first_step(run, "r5")
        assert run["steps"]["t_start_ns"][i] >= LATE
        assert all(max(r["emit_ns"]) < LATE for r in run["requests"][:5])  # the rest were done: the run idled
        assert run["idle_ns"] > 0 and run["skipped_ns"] == 0  # waited, not skipped: `idle: wait` is the default


LULL = 60_000 * MS  # a minute with no request in the system


def test_an_idle_span_skipped_jumps_the_clock_and_changes_no_request(tiny, workload, refs):
    w = dataclasses.replace(workload, arrival_ns=np.where(workload.arrival_ns == LATE, LULL, workload.arrival_ns))
    t = time.perf_counter()
    report = run_serving(tiny, w, policy=["chunked", "fifo"], chunk_size=CHUNK, refs=refs, skip_idle=True, replay=2)
    assert time.perf_counter() - t < 30  # the minute was not waited
    for run in report["runs"]:  # each passed the gate (run_serving raises otherwise) and its replay
        assert LULL - run["skipped_ns"] < 10_000 * MS  # what was skipped: the lull less the busy time before it
        assert run["idle_ns"] >= run["skipped_ns"]  # idle on the trace's clock, skipped or not
        assert run["steps"]["t_start_ns"][first_step(run, "r5")] >= LULL and run["makespan_ns"] > LULL
        for r in run["requests"]:  # no request was in the system while the clock jumped: no gap holds the lull
            assert r["emit_ns"][0] >= r["arrival_ns"] and max(np.diff(r["emit_ns"]), default=0) < 5_000 * MS
            assert r["output_ids"] == refs[r["name"]].tokens


def test_the_idle_rule_is_refused_unless_wait_or_skip(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("idle: never\nworkload: {source: pair, prompt_tokens: 8, output_tokens: 2}\n")
    with pytest.raises(InputError, match=r"^idle must be one of wait, skip, got 'never'$"):
        load_serve_params(path)
    path.write_text("idle: skip\nworkload: {source: pair, prompt_tokens: 8, output_tokens: 2}\n")
    assert load_serve_params(path)[1].idle == "skip"


def test_the_step_log_replays_legally_with_the_policys_rounds(good, workload):
    for run in good["runs"]:
        states = {
            n: RequestState(n, p, o)
            for n, p, o in zip(workload.names, *(a.tolist() for a in (workload.prompt_tokens, workload.output_tokens)))
        }
        steps = run["steps"]
        for work, a, b in zip(steps["work"], steps["t_start_ns"], steps["t_end_ns"]):
            assert a <= b
            for name, n in work:
                states[name].apply(Prefill(name, n) if n is not None else Decode(name))
            if run["policy"] == "mixed":
                assert sum(n for _, n in work if n is not None) <= CHUNK
        assert all(s.finished for s in states.values())
        assert all(len(r["output_ids"]) == states[r["name"]].emitted for r in run["requests"])
        assert steps["t_start_ns"] == sorted(steps["t_start_ns"])


def test_fifo_serves_requests_one_at_a_time_in_arrival_order(good):
    order = [w[0][0] for w in runs(good)["fifo"]["steps"]["work"]]
    assert all(len(w) == 1 for w in runs(good)["fifo"]["steps"]["work"])
    assert order == sorted(order, key=lambda r: int(r[1:]))
    firsts = [r["emit_ns"][0] for r in runs(good)["fifo"]["requests"]]
    assert firsts == sorted(firsts)


def test_eager_and_mixed_decode_every_ready_request_in_one_step(good):
    for policy in ("eager", "mixed"):
        assert any(sum(n is None for _, n in w) > 1 for w in runs(good)[policy]["steps"]["work"])


# ---- the gate -----------------------------------------------------------------------------------------------


def seq(tokens, runner_up=None, margin=None):
    n = len(tokens)
    return ReferenceSeq(list(tokens), list(runner_up or [0] * n), list(margin or [1.0] * n))


def test_check_request_tells_a_near_tie_from_a_mismatch():
    ref = seq([5, 6, 7, 8], runner_up=[1, 9, 2, 3], margin=[1.0, NEAR_TIE_MARGIN / 4, 1.0, 1.0])
    assert check_request("r0", [5, 6, 7, 8], ref, policy="eager") == {"status": "ok", "checked": 4}
    tie = check_request("r0", [5, 9, 1, 1], ref, policy="eager")  # later tokens differ legitimately
    assert tie["status"] == "near-tie" and tie["text"] == "diverged at near-tie 1"
    assert (tie["output"], tie["got"], tie["expected"], tie["checked"]) == (1, 9, 6, 1)
    with pytest.raises(
        TokenMismatch,
        match=r"^policy 'eager': request r0 differs from the validated reference "
        r"at output 1: got 4, expected 6$",
    ):
        check_request("r0", [5, 4, 7, 8], ref, policy="eager")  # not the runner-up
    far = seq([5, 6], runner_up=[1, 9], margin=[1.0, 2 * NEAR_TIE_MARGIN])
    with pytest.raises(TokenMismatch, match="at output 1: got 9, expected 6"):
        check_request("r0", [5, 9], far, policy="eager")  # the runner-up, but not near
    with pytest.raises(TokenMismatch, match="at output 1: got nothing, expected 6"):
        check_request("r0", [5], ref, policy="eager")


def test_a_planted_wrong_token_stops_the_run_and_nothing_is_written(tmp_path, monkeypatch):
    params = tmp_path / "serve.yaml"
    params.write_text(
        "model: synthetic:tiny\nchunk_size: 16\npolicies: [mixed]\n"
        "workload: {source: poisson, rate: 200.0, n: 3, seed: 0, prompt: 20, output: 4}\n"
    )
    import pdlib.run.serve

    real, calls = pdlib.run.serve.check_token, []

    def flipped(token):  # the sixth token the run observes comes back wrong
        calls.append(1)
        token = real(token)
        return token ^ 1 if len(calls) == 6 else token

    monkeypatch.setattr(pdlib.run.serve, "check_token", flipped)
    out = tmp_path / "report.json"
    with pytest.raises(TokenMismatch) as e:
        serve_params_file(params, output=out)
    msg = str(e.value)
    assert "\n" not in msg
    assert re.fullmatch(
        r"policy 'mixed': request r\d differs from the validated reference at output \d: "
        r"got \d+, expected \d+",
        msg,
    ), msg
    got, want = (int(x) for x in re.findall(r"got (\d+), expected (\d+)", msg)[0])
    assert got == want ^ 1
    assert not out.exists() and list(tmp_path.iterdir()) == [params]


def test_a_planted_near_tie_is_reported_and_a_planted_far_one_fails(tiny, workload, refs):
    planted = copy.deepcopy(refs)
    r = planted["r1"]
    pick = r.tokens[2]
    r.tokens[2], r.runner_up[2], r.margin[2] = pick ^ 1, pick, NEAR_TIE_MARGIN / 2  # pdlib's pick as runner-up
    report = run_serving(tiny, workload, policy="mixed", chunk_size=CHUNK, refs=planted)
    (tie,) = report["gate"]["near_ties"]
    assert (tie["policy"], tie["request"], tie["output"], tie["got"], tie["expected"]) == (
        "mixed",
        "r1",
        2,
        pick,
        pick ^ 1,
    )
    checks = {x["name"]: x["check"] for x in report["runs"][0]["requests"]}
    assert checks["r1"]["text"] == "diverged at near-tie 2"
    assert all(c["status"] == "ok" for n, c in checks.items() if n != "r1")
    assert report["gate"]["reference_s"] is None  # given, not computed
    r.margin[2] = 4 * NEAR_TIE_MARGIN
    with pytest.raises(TokenMismatch, match=f"request r1 differs .* at output 2: got {pick}, expected {pick ^ 1}"):
        run_serving(tiny, workload, policy="mixed", chunk_size=CHUNK, refs=planted)


# ---- params, the report file --------------------------------------------------------------------------------


def test_the_smoke_params_load(tmp_path):
    w, p = load_serve_params("params/serve-smoke-cpu.yaml")
    assert Workload.from_params(w).n == 20 and p.policies == tuple(BATCH_POLICIES)  # every policy, in CI
    assert p.chunk_size == 32 and p.model == "synthetic:tiny"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "model: synthetic:tiny\nbatch: 4\nworkload: {source: pair, prompt_tokens: 8, output_tokens: 2}\n",
            "unknown key(s) batch; accepted: workload, model, chunk_size, policies, warmups, slo",
        ),
        (
            "policies: [eager, lifo]\nworkload: {source: pair, prompt_tokens: 8, output_tokens: 2}\n",
            "unknown serving policy 'lifo'; expected one of: " + ", ".join(BATCH_POLICIES),
        ),
        ("workload: {source: azure-code, first: 3, rate: 2}\n", "unknown key(s) rate for source azure-code"),
        ("chunk_size: 16\n", "needs a workload"),
        (
            "slo: {decode_ms: 0, ttft_ms: 5}\nworkload: {source: pair, prompt_tokens: 8, output_tokens: 2}\n",
            "decode_ms must be a positive finite number",
        ),
        ("[1, 2]\n", "must hold a mapping"),
    ],
)
def test_bad_params_are_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load_serve_params(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_policy_is_refused_before_any_work(tiny, workload):
    with pytest.raises(InputError, match="unknown serving policy 'lifo'"):
        run_serving(tiny, workload, policy=["eager", "lifo"], chunk_size=CHUNK)


def test_the_report_is_written_once(tmp_path, good):
    path = write_serving_report(tmp_path / "serve.json.gz", good)
    assert json.loads(read_text(path))["runs"][0]["policy"] == "eager"
    with pytest.raises(InputError, match="already exists"):
        write_serving_report(path, good)


def test_the_smoke_params_serve_every_policy_through_the_gate(tmp_path):
    report = serve_params_file("params/serve-smoke-cpu.yaml", output=tmp_path / "serve.json")
    gated = [r["policy"] for r in report["runs"] if not r.get("peer")]
    assert gated == list(BATCH_POLICIES)
    assert all(r["replay"]["passed"] and len(r["replay"]["requests"]) == 4 for r in report["runs"] if not r.get("peer"))
    peers = [r["policy"] for r in report["runs"] if r.get("peer")]  # after the policies, never gated
    assert peers == ["mlx-lm-fp32@2048", "mlx-lm-fp32@32", "mlx-lm-bf16@2048", "mlx-lm-bf16@32"]
    assert all(r["summary"]["n_requests"] == 20 for r in report["runs"])
    assert all(r["peak_memory_bytes"] > 0 for r in report["runs"])  # policies' and peers' alike
    assert (tmp_path / "serve.json").exists()


def test_the_caches_memory_cap_is_a_setting_and_refused_in_one_line(tiny, workload, monkeypatch):
    from pdlib.run.serve import serving_capacity

    capacity, slots, total = serving_capacity(tiny, workload)
    assert capacity == 70 + 4 and slots == 6  # the longest prompt + output holds every request; one cache each
    monkeypatch.setenv("PDLIB_KV_CACHE_GIB", str(total / 2**30 / 2))  # half of what the six caches need
    assert serving_capacity(tiny, workload) == (capacity, 3, total // 2)  # three, requests waiting for them
    monkeypatch.setenv("PDLIB_KV_CACHE_GIB", str(total / 2**30 / 7))
    with pytest.raises(InputError, match=r"^one cache of 74 positions needs .* \(over PDLIB_KV_CACHE_GIB=.*raise it$"):
        serving_capacity(tiny, workload)


def test_pipelined_decodes_run_the_same_steps_and_overlap_the_host(tiny):
    from pdlib.engine import Engine
    from pdlib.run.serve import serve_once

    w = Workload("p", np.zeros(4, np.int64), np.array([30, 12, 20, 9]), np.array([9, 7, 8, 6]))
    e = Engine(tiny, capacity=40)
    for p in iter_prompts(w, vocab_size=tiny.config.vocab_size):
        e.add_request(p.name, p.token_ids)
    runs = {pipe: serve_once(e, w, "mixed", chunk_size=16, pipeline=pipe) for pipe in (False, True)}
    assert runs[True]["steps"]["work"] == runs[False]["steps"]["work"]  # arrivals at 0: the same steps
    assert [r["output_ids"] for r in runs[True]["requests"]] == [r["output_ids"] for r in runs[False]["requests"]]
    for pipe, run in runs.items():
        s = run["steps"]
        issued_early = [b < a for a, b in zip(s["t_end_ns"], s["t_start_ns"][1:])]  # issued before the last was seen
        decodes_only = [all(n is None for _, n in step) for step in s["work"][1:]]
        assert any(issued_early) == pipe
        assert all(d for d, early in zip(decodes_only, issued_early) if early)  # only decode rounds go early


@pytest.mark.parametrize("name", ["serve-azure-code-h200", "serve-azure-conv-h200"])
def test_the_h200_trace_params_load_and_say_what_their_caches_need(name):
    from types import SimpleNamespace

    from pdlib.config import preset
    from pdlib.run.serve import kv_cache_bytes

    w, p = load_serve_params(f"params/{name}.yaml")
    work = Workload.from_params(w)
    one_gpu = tuple(k for k, c in BATCH_POLICIES.items() if c.remote_prefill != "worker")  # disagg needs two
    assert p.policies == one_gpu and p.search["reps"] == 2 and work.n == 48
    qwen = SimpleNamespace(config=preset("qwen3-0.6b"))  # the shapes the header's GiB figure is for
    capacity = int((work.prompt_tokens + work.output_tokens).max())
    gib = kv_cache_bytes(qwen, requests=48, capacity=capacity) / 2**30
    header = open(f"params/{name}.yaml").read().split("\nmodel:")[0]
    assert f"{capacity:,} positions: 48 caches take {gib:.1f} GiB" in header
    assert w["pace"] == "trace" and f"{work.duration_s:.1f} s of arrivals at 1x for every rep" in header


def test_decode_rounds_in_turns_pass_the_gate_with_one_decode_a_step(tiny, workload, refs):
    report = run_serving(
        tiny, workload, policy=["eager", "chunked"], chunk_size=CHUNK, refs=refs, decode_rounds="turns"
    )
    for run in report["runs"]:
        assert all(r["check"]["status"] == "ok" for r in run["requests"]) and run["replay"]["passed"]
        assert all(sum(n is None for _, n in step) <= 1 for step in run["steps"]["work"])
    with pytest.raises(InputError, match="decode_rounds must be one of batched, turns"):
        run_serving(tiny, workload, policy="eager", chunk_size=CHUNK, decode_rounds="rounds")


@pytest.mark.parametrize("policies", [["chunked"], ["chunked", "partition"]])
def test_compiled_rounds_are_traced_on_each_stream_a_round_can_run_on(tiny, workload, monkeypatch, policies):
    """Under PDLIB_DECODE_ROUND=compiled warm_engine traces every round size on the default stream, and on
    partition's slice A where a policy prefills on a slice (MLX keeps a trace per stream)."""
    from pdlib.engine import Engine
    from pdlib.run.partition import slice_pair
    from pdlib.run.serve import warm_engine

    engine = Engine(tiny, capacity=128, slots=workload.n)
    engine.decode_round = "compiled"
    seen = []

    def trace(pool, sizes):
        seen.append((mx.default_stream(mx.default_device()), list(sizes)))
        return list(sizes)  # as where the rows kernel runs (the CPU traces none)

    monkeypatch.setattr(engine.rounds, "trace", trace)
    warm = warm_engine(engine, [workload], CHUNK, policies)
    assert warm["warm_rounds"] == [3, 4, 5, 6]  # 3 rows up to one a request
    streams = [s for s, _ in seen]
    want = [mx.default_stream(mx.default_device())]
    if "partition" in policies:
        want.append(slice_pair().a.stream)
    assert streams == want and all(sizes == [3, 4, 5, 6] for _, sizes in seen)
    engine.decode_round = "step"
    seen.clear()
    assert warm_engine(engine, [workload], CHUNK, policies)["warm_rounds"] == [] and not seen
    fewer = Engine(tiny, capacity=128, slots=workload.n - 2)  # 4 caches: no round of 5 or 6 can run
    fewer.decode_round = "compiled"
    monkeypatch.setattr(fewer.rounds, "trace", trace)
    assert warm_engine(fewer, [workload], CHUNK, policies)["warm_rounds"] == [3, 4]


@pytest.mark.parametrize("chunk, rows", [(CHUNK, 70 + 6), (100, 100 + 6), (2**31 - 1, 271 + 6)])
def test_the_engine_warms_each_step_size_a_workload_can_meet_and_no_more(tiny, workload, monkeypatch, chunk, rows):
    """A step carries at most a chunk (of one prompt or several) or a whole prompt (eager), never more prompt rows
    than the workload holds (271), plus a decode per request: a chunk past them all warms 271 rows, not its own."""
    from pdlib.engine import Engine
    from pdlib.run.serve import warm_engine

    engine = Engine(tiny, capacity=128, slots=workload.n)
    asked = []
    monkeypatch.setattr(engine.model, "warm", lambda max_rows: asked.append(max_rows) or [1])
    warm_engine(engine, [workload], chunk)
    assert asked == [rows]
    few = dataclasses.replace(workload, prompt_tokens=np.array([4, 4, 4, 4, 4, 4]))  # 24 prompt rows in all
    warm_engine(engine, [few], 2**31 - 1)
    assert asked[-1] == 24 + 6

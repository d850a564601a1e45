"""mlx-lm's BatchGenerator as the serving peer (pdlib.run.peer) on the tiny synthetic model (CPU, seconds): every
request gets exactly its output tokens, stamped after its arrival; the agreement with the FP32 reference is
recorded (full in FP32 here: see below); bf16 runs on a cast copy; prefill_step_size bounds every prompt pass, and
mlx_lm.server's prompt concurrency the requests in one; the
serve report marks peer runs and does not gate them; a planted broken peer is recorded, not a crash.

    .venv/bin/python -m pytest -q tests/run/test_peer.py

Full agreement in FP32 is what the tiny model gives, and why: its reference's smallest top-2 logit margin over
these requests is ~0.1 (asserted), while batching, right-padding and chunking the prompt move FP32 logits by
rounding only (~1e-6), so every greedy pick is the reference's. On a real model a near-tie could flip one; the
agreement would show it, and nothing fails.
"""

import dataclasses
import importlib
import math
import time

import numpy as np
import pytest
from mlx_lm.models import qwen3

from pdlib.config import RunParams
from pdlib.errors import InputError
from pdlib.report.checks import agreement
from pdlib.report.serving import run_summary
from pdlib.run.peer import BATCH_SIZES, SYSTEM, model_dtype, peer_model, peer_once, record_agreement
from pdlib.run.serve import run_serving, summary_table
from pdlib.run.serve_gate import reference_sequences
from pdlib.run.serve_params import ServeParams, load_serve_params
from pdlib.workload import Workload, iter_prompts

generate = importlib.import_module("mlx_lm.generate")  # the package's `generate` attribute is the function

MS = 1_000_000
STEP = 16  # a prefill_step_size below the longer prompts, so they take several passes


@pytest.fixture(scope="module")
def workload():
    return Workload(
        "test",
        np.array([0, 2 * MS, 4 * MS, 6 * MS, 25 * MS]),
        np.array([40, 70, 24, 56, 33]),
        np.array([5, 4, 6, 3, 1]),
    )


@pytest.fixture(scope="module")
def prompts(tiny, workload):
    return {p.name: p.token_ids for p in iter_prompts(workload, vocab_size=tiny.config.vocab_size)}


@pytest.fixture(scope="module")
def refs(tiny, workload, prompts):
    out, _ = reference_sequences(tiny, prompts, dict(zip(workload.names, workload.output_tokens.tolist())))
    return out


@pytest.fixture(scope="module")
def fp32(tiny):
    return peer_model(tiny, "fp32")


@pytest.fixture(scope="module")
def report(tiny, workload, refs):
    return run_serving(
        tiny, workload, policy="mixed", chunk_size=STEP, refs=refs, peers=[("fp32", 2048), ("bf16", STEP)]
    )


def test_the_fp32_peer_emits_every_token_after_its_arrival_and_agrees_with_the_reference(fp32, workload, prompts, refs):
    run = peer_once(fp32, workload, prompts, dtype="fp32", prefill_step_size=2048)
    assert (run["peer"], run["system"], run["dtype"], run["prefill_step_size"]) == (True, SYSTEM, "fp32", 2048)
    assert run["policy"] == "mlx-lm-fp32@2048" and run["batch_sizes"] == {"completion": 32, "prefill": 8}
    steps = run["steps"]
    for r, n in zip(run["requests"], workload.output_tokens.tolist()):
        assert len(r["output_ids"]) == len(r["emit_ns"]) == n and "lost" not in r
        assert r["admitted_ns"] >= r["arrival_ns"] and r["emit_ns"][0] >= r["arrival_ns"]
        assert r["emit_ns"] == sorted(r["emit_ns"]) and set(r["emit_ns"]) <= set(steps["t_end_ns"])
        first = next(i for i, w in enumerate(steps["work"]) if any(p[0] == r["name"] for p in w))
        assert steps["t_start_ns"][first] >= r["arrival_ns"]  # not served before it arrives
    assert run["makespan_ns"] == steps["t_end_ns"][-1] == max(r["emit_ns"][-1] for r in run["requests"])
    record_agreement(run, refs)
    assert min(min(refs[n].margin) for n in workload.names) > 0.05  # the premise of full agreement (docstring)
    assert [r["agreement"] for r in run["requests"]] == workload.output_tokens.tolist()
    assert all(r["output_ids"] == refs[r["name"]].tokens for r in run["requests"])


def test_the_peer_skips_an_idle_span_as_the_policies_do(fp32, workload, prompts, refs):
    lull = 60_000 * MS  # the last request a minute after the others, which end long before
    w = dataclasses.replace(
        workload, arrival_ns=np.where(np.arange(workload.n) == workload.n - 1, lull, workload.arrival_ns)
    )
    t = time.perf_counter()
    run = peer_once(fp32, w, prompts, dtype="fp32", prefill_step_size=STEP, skip_idle=True)
    assert time.perf_counter() - t < 30 and lull - run["skipped_ns"] < 10_000 * MS and run["makespan_ns"] > lull
    for r in run["requests"]:
        assert r["emit_ns"][0] >= r["arrival_ns"] and max(np.diff(r["emit_ns"]), default=0) < 5_000 * MS
    record_agreement(run, refs)
    assert [r["agreement"] for r in run["requests"]] == w.output_tokens.tolist()
    assert peer_once(fp32, workload, prompts, dtype="fp32", prefill_step_size=STEP)["skipped_ns"] == 0  # waits


def test_the_step_log_holds_every_prompt_token_and_decode(fp32, workload, prompts):
    run = peer_once(fp32, workload, prompts, dtype="fp32", prefill_step_size=STEP)
    fed = dict.fromkeys(workload.names, 0)
    decodes = dict.fromkeys(workload.names, 0)
    for work in run["steps"]["work"]:
        for name, n in work:
            if n is None:
                decodes[name] += 1
            else:
                assert decodes[name] == 0 and 1 <= n <= STEP  # a prompt pass is at most prefill_step_size
                fed[name] += n
    assert list(fed.values()) == workload.prompt_tokens.tolist()  # the join's one-token pass included
    assert list(decodes.values()) == workload.output_tokens.tolist()


def test_prefill_step_size_bounds_every_forward_pass(fp32, workload, prompts, monkeypatch):
    real, widths = qwen3.Model.__call__, []

    def spy(self, inputs, *args, **kwargs):
        widths.append(inputs.shape[1])
        return real(self, inputs, *args, **kwargs)

    monkeypatch.setattr(qwen3.Model, "__call__", spy)
    peer_once(fp32, workload, prompts, dtype="fp32", prefill_step_size=STEP)
    assert max(widths) == STEP and min(widths) == 1  # 40- and 70-token prompts were split, decodes are 1 wide
    widths.clear()
    peer_once(fp32, workload, prompts, dtype="fp32", prefill_step_size=2048)
    assert max(widths) > STEP  # at the default a whole prompt is one pass


def test_bf16_runs_on_a_cast_copy_and_records_agreement(tiny, fp32, workload, prompts, refs):
    assert model_dtype(fp32) == "fp32" and model_dtype(peer_model(tiny, "bf16")) == "bf16"
    run = peer_once(fp32, workload, prompts, dtype="bf16", prefill_step_size=2048)  # casts a copy
    assert model_dtype(fp32) == "fp32"  # the FP32 model is left as it was
    record_agreement(run, refs)
    for r, n in zip(run["requests"], workload.output_tokens.tolist()):
        assert len(r["output_ids"]) == n
        assert r["agreement"] == agreement(r["output_ids"], refs[r["name"]].tokens)
        assert isinstance(r["agreement"], int) and 0 <= r["agreement"] <= n
    with pytest.raises(ValueError, match="peer dtype 'fp16'"):
        peer_once(fp32, workload, prompts, dtype="fp16", prefill_step_size=2048)


def test_the_serve_report_marks_peer_runs_and_does_not_gate_them(report, workload):
    policy, *peers = report["runs"]
    assert policy["policy"] == "mixed" and "peer" not in policy and all("check" in r for r in policy["requests"])
    assert [(p["policy"], p["dtype"], p["prefill_step_size"]) for p in peers] == [
        ("mlx-lm-fp32@2048", "fp32", 2048),
        ("mlx-lm-bf16@16", "bf16", STEP),
    ]
    for run in peers:
        assert run["peer"] is True and run["system"] == SYSTEM
        assert all("check" not in r and isinstance(r["agreement"], int) for r in run["requests"])
        again = run_summary(run["requests"])
        for k, v in again.items():
            assert v == run["summary"][k] or math.isnan(v) and math.isnan(run["summary"][k]), k
    assert report["params"]["peers"] == ["mlx-lm-fp32@2048", "mlx-lm-bf16@16"]
    table = summary_table(report).splitlines()
    assert table[1].startswith("mixed") and table[1].endswith("gated: 0 near-ties")
    assert table[2].startswith("mlx-lm-fp32@2048") and table[2].endswith("peer: 19/19 agree")
    assert table[3].startswith("mlx-lm-bf16@16") and "peer: " in table[3] and "not gated" in table[-1]


def drop(monkeypatch, name_uid: int, at: int):
    """GenerationBatch.next loses request uid `name_uid`'s response `at` (0-based) on the host's side."""
    real, seen = generate.GenerationBatch.next, {}

    def lossy(self):
        out = real(self)
        for r in list(out):
            if r.uid == name_uid:
                seen[r.uid] = seen.get(r.uid, -1) + 1
                if seen[r.uid] == at:
                    out.remove(r)
        return out

    monkeypatch.setattr(generate.GenerationBatch, "next", lossy)


def test_a_peer_that_drops_a_token_is_recorded_as_lower_agreement(tiny, workload, refs, monkeypatch):
    drop(monkeypatch, 1, at=1)  # r1's second token (uids count from 0 in insertion order, one generator per run)
    report = run_serving(tiny, workload, policy="mixed", chunk_size=STEP, refs=refs, peers=[("fp32", 2048)])
    peer = {r["name"]: r for r in report["runs"][1]["requests"]}
    want = refs["r1"].tokens
    assert peer["r1"]["output_ids"] == want[:1] + want[2:] and want[1] != want[2]
    assert peer["r1"]["agreement"] == 1 and "lost" not in peer["r1"]
    assert all(peer[n]["agreement"] == len(refs[n].tokens) for n in peer if n != "r1")
    assert "peer: 16/19 agree" in summary_table(report)


def test_a_peer_that_loses_a_requests_last_token_ends_it_short(tiny, workload, prompts, fp32, refs, monkeypatch):
    drop(monkeypatch, 1, at=3)  # r1's last (fourth) token: mlx-lm has finished it, the host never hears so
    run = peer_once(fp32, workload, prompts, dtype="fp32", prefill_step_size=2048)
    record_agreement(run, refs)
    r1 = run["requests"][1]
    assert r1["lost"] is True and r1["output_ids"] == refs["r1"].tokens[:3] and r1["agreement"] == 3
    assert all(len(r["output_ids"]) == r["output_tokens"] for r in run["requests"] if r["name"] != "r1")


# ---- params ---------------------------------------------------------------------------------------------------


def test_the_smoke_params_name_fp32_and_bf16_peers_at_2048_and_at_the_chunk():
    _, p = load_serve_params("params/serve-smoke-cpu.yaml")
    assert p.peer_configs() == [("fp32", 2048), ("fp32", 32), ("bf16", 2048), ("bf16", 32)]
    assert ServeParams().peers == () and ServeParams().to_dict()["peers"] == []


@pytest.mark.parametrize(
    "peers, message",
    [
        (
            ["mlx-lm-fp16@2048"],
            "unknown peer 'mlx-lm-fp16@2048'; expected mlx-lm-<fp32|bf16>@<prefill_step_size|chunk>",
        ),
        (["vllm-fp32@2048"], "unknown peer 'vllm-fp32@2048'"),
        (["mlx-lm-fp32"], "unknown peer 'mlx-lm-fp32'"),
        (["mlx-lm-fp32@-1"], "unknown peer 'mlx-lm-fp32@-1'"),
        (["mlx-lm-bf16@0"], "'mlx-lm-bf16@0' needs a prefill_step_size in [1, 2147483647]"),
        (["mlx-lm-bf16@2147483648"], "'mlx-lm-bf16@2147483648' needs a prefill_step_size in [1, 2147483647]"),
        (["mlx-lm-fp32@32", "mlx-lm-fp32@chunk"], "peers must not repeat (chunk is 32)"),
        ("mlx-lm-fp32@32", "peers must be a list"),
    ],
)
@pytest.mark.parametrize("params", [ServeParams, RunParams])
def test_bad_peers_are_refused_in_one_line(peers, message, params):
    with pytest.raises(InputError) as e:
        params(chunk_size=32, peers=peers)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_peer_is_refused_by_run_serving_before_any_work(tiny, workload):
    with pytest.raises(InputError, match=r"peer \('fp16', 2048\)"):
        run_serving(tiny, workload, policy="mixed", chunk_size=STEP, peers=[("fp16", 2048)])


def test_a_prompt_pass_holds_at_most_the_servers_prompt_concurrency(tiny, fp32):
    """12 prompts at once: mlx_lm.server's limit of 8 a pass holds the other 4 back (one pass of all 12 is what ran
    an H200 out of memory on 48 of the code trace's), and every request still gets all its tokens."""
    n = 12
    w = Workload("test", np.zeros(n, np.int64), np.full(n, 3 * STEP), np.full(n, 2))
    made = {p.name: p.token_ids for p in iter_prompts(w, vocab_size=tiny.config.vocab_size)}
    run = peer_once(fp32, w, made, dtype="fp32", prefill_step_size=STEP)
    passes = [{name for name, k in step if k is not None and k > 1} for step in run["steps"]["work"]]
    assert BATCH_SIZES["prefill"] == 8 and max(len(p) for p in passes) == 8
    assert len(set().union(*passes)) == n and all(len(r["output_ids"]) == 2 for r in run["requests"])


def test_serve_gives_the_engines_caches_back_before_its_peers(tiny, workload, refs, monkeypatch):
    from pdlib.engine import Engine
    from pdlib.run import peer as peer_module

    events, release, once = [], Engine.release, peer_module.peer_once
    monkeypatch.setattr(Engine, "release", lambda engine: (events.append("release"), release(engine))[1])
    monkeypatch.setattr(peer_module, "peer_once", lambda *a, **kw: (events.append("peer"), once(*a, **kw))[1])
    report = run_serving(tiny, workload, policy="mixed", chunk_size=STEP, refs=refs, peers=[("fp32", 2048)])
    assert events == ["release", "peer"] and report["runs"][-1]["peer"]

"""mlx-lm's BatchGenerator as a peer in the two-request report (pdlib.run.peer.pair_run / pair_trials): A's
set-up before t0 as the policies have it, B inserted at t0, every token stamped when the generator returns
it, B's prompt passes and the decodes as events; the trials are marked peer, carry their agreement, sit
after the policies, and the report holding them passes the checks made on every report read; `run --peers`
prints their rows."""

import json

import pytest

from pdlib.__main__ import main
from pdlib.config import RunParams
from pdlib.prompts import make_prompts
from pdlib.report.checks import check_report
from pdlib.report.io import read_text
from pdlib.run.peer import pair_run, pair_trials, peer_model
from pdlib.run.runner import run_experiment

PROMPT, OUTPUTS, STEP = 40, 6, 16


@pytest.fixture(scope="module")
def prompts(tiny):
    return {k: p.token_ids for k, p in make_prompts(n_tokens=PROMPT, vocab_size=tiny.config.vocab_size).items()}


def test_a_pair_run_is_a_trial_of_the_two_request_workload(tiny, prompts):
    run = pair_run(peer_model(tiny, "fp32"), prompts, OUTPUTS, dtype="fp32", prefill_step_size=STEP)
    a, b = run["requests"]["A"], run["requests"]["B"]
    assert run["policy"] == "mlx-lm-fp32@16" and run["peer"] is True
    assert len(a["output_ids"]) == len(b["output_ids"]) == OUTPUTS
    assert (a["timed_from"], b["timed_from"]) == (1, 0) and len(a["emit_ns"]) == OUTPUTS - 1
    assert len(b["emit_ns"]) == OUTPUTS and run["makespan_ns"] == max(a["emit_ns"][-1], b["emit_ns"][-1])
    for emits in (a["emit_ns"], b["emit_ns"]):
        assert 0 < emits[0] and all(x <= y for x, y in zip(emits, emits[1:]))
    prefills = [e for e in run["events"] if e["kind"] == "prefill"]
    assert prefills[0]["start"] == 0 and prefills[-1]["stop"] == PROMPT and all(e["req"] == "B" for e in prefills)
    assert all(e["stop"] - e["start"] <= STEP for e in prefills)  # prefill_step_size bounds each pass
    assert all(x["stop"] == y["start"] for x, y in zip(prefills, prefills[1:]))
    assert prefills[-1]["t_end_ns"] <= b["emit_ns"][0]  # B's first token comes out of its prompt's last pass
    decodes = {r: [e["start"] for e in run["events"] if e["kind"] == "decode" and e["req"] == r] for r in "AB"}
    assert decodes == {"A": list(range(PROMPT, PROMPT + OUTPUTS - 1)), "B": list(range(PROMPT, PROMPT + OUTPUTS - 1))}


def test_peer_trials_carry_agreement_sit_after_the_policies_and_pass_the_report_checks(tiny, prompts, tmp_path):
    params = RunParams(
        model="synthetic:tiny",
        prompt_tokens=PROMPT,
        output_tokens=OUTPUTS,
        chunk_size=STEP,
        policies=["chunked", "fifo"],
        trials=2,
        warmups=0,
        validation_checkpoint_every=4,
        peers=["mlx-lm-fp32@chunk", "mlx-lm-bf16@2048"],
    )
    report = run_experiment(params, output=tmp_path / "report.json", model=tiny, log=lambda _: None, quiet=True)
    check_report(json.loads(read_text(tmp_path / "report.json")))
    peers = [t for t in report["trials"] if t.get("peer")]
    assert sorted({t["policy"] for t in peers}) == ["mlx-lm-bf16@2048", "mlx-lm-fp32@16"]
    assert {(t["policy"], t["position"]) for t in peers} == {("mlx-lm-fp32@16", 2), ("mlx-lm-bf16@2048", 3)}
    assert sorted(t["trial"] for t in peers) == [1, 1, 2, 2] and "mlx-lm-fp32@16" not in report["validation"]
    fp32 = [t for t in peers if t["policy"] == "mlx-lm-fp32@16"]
    assert all(t["agreement"] == {"A": OUTPUTS, "B": OUTPUTS} for t in fp32)  # FP32: the reference's picks
    tampered = [dict(t, agreement={"A": 0}) if t.get("peer") else t for t in report["trials"]]
    with pytest.raises(Exception, match="agreement"):
        check_report({**report, "trials": tampered})


def test_pair_trials_count_warmups_and_trials(tiny, prompts):
    calls = []
    out = pair_trials(
        tiny,
        prompts,
        3,
        [("fp32", 2048)],
        trials=2,
        warmups=1,
        reference_tokens={"A": [0] * 3, "B": [0] * 3},
        first_position=1,
        on_run=lambda: calls.append(1),
    )
    assert len(calls) == 3 and [t["trial"] for t in out] == [1, 2] and {t["position"] for t in out} == {1}


def test_run_peers_print_their_rows_and_a_bad_one_is_refused(capsys, tmp_path):
    argv = ["run", "--model", "synthetic:tiny", "--prompt-tokens", "24", "--output-tokens", "3", "--trials", "1"]
    argv += ["--warmups", "0", "--chunk-size", "8", "--policies", "chunked", "--quiet"]
    assert main([*argv, "--peers", "mlx-lm-fp32@4", "--output", str(tmp_path / "r.json")]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.split()]
    assert "chunked" in rows and "mlx-lm-fp32@4" in rows
    assert main([*argv, "--peers", "vllm@1", "--output", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown peer 'vllm@1'" in err[0] and not (tmp_path / "s.json").exists()

"""The trial runner and the `run` CLI end to end on the tiny synthetic model (CPU, seconds): report contents,
warmups, paired rotating trials, token checks, atomic never-overwriting reports and one-line input errors.

    .venv/bin/python -m pytest -q tests/run/test_trial.py

One good report is made once per module (`good`) and shared; other tests run the CLI on even smaller jobs.
"""

import contextlib
import hashlib
import importlib
import io
import json
import platform
import sys
import types
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import pdlib.engine.model
import pdlib.report.io
import pdlib.run.experiment
import pdlib.run.trial
from pdlib.__main__ import main
from pdlib.engine.kernels import BACKEND
from pdlib.engine.model import Qwen3
from pdlib.prompts import make_prompts
from pdlib.report.schema import EVENT_KINDS, SCHEMA, TOP_LEVEL_KEYS
from pdlib.run.trial import RunRecord, TokenMismatch, check_tokens, trial_orders
from pdlib.scheduler import Prefill, plan, t0_index

for _name in ("pdlib.run.runner",):  # where the CLI's work may live; imported now so `patch` reaches its names
    with contextlib.suppress(ImportError):
        importlib.import_module(_name)

P, OUT, CHUNK = 48, 6, 16
POLICIES = ["eager", "chunked", "fifo"]
TRIALS, WARMUPS = 3, 1
SHAPE = [
    "--model",
    "synthetic:tiny",
    "--prompt-tokens",
    str(P),
    "--output-tokens",
    str(OUT),
    "--chunk-size",
    str(CHUNK),
    "--logical-cache-reset",
    "--quiet",
]
SMALL = ["run", *SHAPE, "--policies", "eager", "--trials", "1", "--warmups", "0"]  # cheapest full run
# trial 1: p0, p1, p2; trial 2: p1, p2, p0; trial 3: p2, p0, p1 (written out, not computed)
ROTATION = [
    (1, 0, "eager"),
    (1, 1, "chunked"),
    (1, 2, "fifo"),
    (2, 0, "chunked"),
    (2, 1, "fifo"),
    (2, 2, "eager"),
    (3, 0, "fifo"),
    (3, 1, "eager"),
    (3, 2, "chunked"),
]


def cli(argv):
    """main(argv) -> (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def patch(mp, module, name, value):
    """Replace module.name and every pdlib module's imported copy of it (`from pdlib.run.trial import run_trials`
    binds the function where it is imported, so patching pdlib.run.trial alone may miss the caller)."""
    original = getattr(module, name)
    mp.setattr(module, name, value)
    for m in list(sys.modules.values()):
        if m is not module and getattr(m, "__name__", "").startswith("pdlib") and getattr(m, name, None) is original:
            mp.setattr(m, name, value)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree(folder: Path) -> dict:
    """Every path under folder -> its bytes (None for folders): a snapshot to prove nothing was written."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, f"expected one line on stderr, got {err!r}"
    return err


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """One full run (3 policies x (1 warmup + 3 trials)), counting run_once calls on the way."""
    path = tmp_path_factory.mktemp("good") / "report.json"
    model_py = Path(pdlib.engine.model.__file__)
    model_sha_before = sha256(model_py)
    real, calls = pdlib.run.trial.run_once, []

    def counting(engine, policy, **kw):
        calls.append(policy)
        return real(engine, policy, **kw)

    with pytest.MonkeyPatch.context() as mp:
        patch(mp, pdlib.run.trial, "run_once", counting)
        rc, out, err = cli(
            ["run", *SHAPE, "--policies", *POLICIES, "--trials", TRIALS, "--warmups", WARMUPS, "--output", path]
        )
    assert rc == 0, err
    return types.SimpleNamespace(
        path=path,
        rc=rc,
        out=out,
        err=err,
        calls=calls,
        bytes=path.read_bytes(),
        report=json.loads(path.read_text()),
        model_sha={model_sha_before, sha256(model_py)},
    )


# ---- the good run ----------------------------------------------------------------------------------


def test_run_succeeds_and_prints_a_summary_row_per_policy(good):
    assert good.rc == 0 and good.err == ""
    lines = good.out.splitlines()
    assert lines[-1] == f"report: {good.path}"
    head = next(i for i, line in enumerate(lines) if "B TTFT ms" in line)
    assert lines[head].split()[:2] == ["policy", "trials"] and set(lines[head + 1]) <= {"-", " "}
    rows = [line.split() for line in lines[head + 2 : head + 2 + len(POLICIES)]]
    assert [r[0] for r in rows] == POLICIES and all(r[1] == str(TRIALS) for r in rows)
    # The printed medians are the report's numbers, recomputed here from the raw emissions.
    for row in rows:
        ts = [t for t in good.report["trials"] if t["policy"] == row[0]]
        a = [np.asarray(t["requests"]["A"]["emit_ns"], dtype=np.int64) for t in ts]
        b = [t["requests"]["B"]["emit_ns"] for t in ts]
        max_gap = [np.diff(x, prepend=0).max() / 1e6 for x in a]
        ttft = [x[0] / 1e6 for x in b]
        makespan = [t["makespan_ns"] / 1e6 for t in ts]
        tok_s = [(2 * OUT - 1) / (t["makespan_ns"] / 1e9) for t in ts]
        assert row[2] == f"{np.median(max_gap):.3f}"
        assert row[4] == f"{np.median(ttft):.3f}"
        assert row[5] == f"{np.median(makespan):.3f}"
        assert row[6] == f"{np.median(tok_s):.3f}"


def test_report_header(good):
    r = good.report
    assert r["schema"] == SCHEMA == "pdlib.report/1"
    assert list(r)[: len(TOP_LEVEL_KEYS)] == list(TOP_LEVEL_KEYS) and list(r)[len(TOP_LEVEL_KEYS) :] == ["solo"]
    solo = r["solo"]  # each request alone, after the gate: A's decode step and B's whole prefill
    assert solo["a_decode_ms"] > 0 and solo["b_prefill_s"] > 0 and solo["a_decode_steps"] == min(64, OUT - 1)
    p = r["params"]
    assert (p["model"], p["prompt_tokens"], p["output_tokens"], p["chunk_size"]) == ("synthetic:tiny", P, OUT, CHUNK)
    assert (p["policies"], p["trials"], p["warmups"], p["logical_cache_reset"]) == (POLICIES, TRIALS, WARMUPS, True)
    assert r["model"]["source"] == "synthetic" and r["model"]["preset"] == "tiny"
    assert r["model"]["config"]["max_position_embeddings"] == 4096
    want = make_prompts(n_tokens=P, vocab_size=r["model"]["config"]["vocab_size"], names=("A", "B"))
    for name in ("A", "B"):
        assert r["prompts"][name]["tokens"] == P
        assert r["prompts"][name]["sha256"] == want[name].sha256
        assert len(r["prompts"][name]["sha256"]) == 64
    assert r["prompts"]["A"]["sha256"] != r["prompts"]["B"]["sha256"]
    env = r["environment"]
    assert env["mlx"] == mx.__version__ and env["python"] == platform.python_version()
    assert env["backend"] == BACKEND
    assert r["sources"]["pdlib/engine/model.py"] in good.model_sha
    assert r["sources"]["params_file"] is None
    assert {"pdlib/run/trial.py", "pdlib/report/io.py", "pdlib/scheduler.py"} <= set(r["sources"])


def test_validation_for_every_policy_passed_with_the_reference_tokens(good):
    r = good.report
    assert sorted(r["reference_tokens"]) == ["A", "B"]
    assert [len(r["reference_tokens"][k]) for k in "AB"] == [OUT, OUT]
    assert list(r["validation"]) == POLICIES
    for policy, v in r["validation"].items():
        assert v["policy"] == policy and v["passed"] is True and v["failure"] is None
        assert v["steps"] == len(plan(policy, prompt_tokens=P, output_tokens=OUT, chunk_size=CHUNK))
        assert v["tokens"] == r["reference_tokens"]
        assert v["checks"]["token"]["count"] == 2 * OUT
        assert v["tolerance"] == {"atol": 1e-3, "rtol": 1e-3}


def test_trials_rotate_the_policy_order(good):
    trials = good.report["trials"]
    assert [(t["trial"], t["position"], t["policy"]) for t in trials] == ROTATION


def test_warmups_are_run_untimed_then_the_trials(good):
    # run_once: every policy's warmups first (policy order), then the trials in rotating order; only the
    # trials are in the report.
    assert len(good.calls) == len(POLICIES) * (WARMUPS + TRIALS)
    assert good.calls == POLICIES + [policy for _, _, policy in ROTATION]
    assert len(good.report["trials"]) == TRIALS * len(POLICIES)


@pytest.mark.parametrize("index", range(len(ROTATION)))
def test_trial_record(good, index):
    t = good.report["trials"][index]
    ref = good.report["reference_tokens"]
    a, b = t["requests"]["A"], t["requests"]["B"]
    assert (a["timed_from"], len(a["output_ids"]), len(a["emit_ns"])) == (1, OUT, OUT - 1)
    assert (b["timed_from"], len(b["output_ids"]), len(b["emit_ns"])) == (0, OUT, OUT)
    assert a["output_ids"] == ref["A"] and b["output_ids"] == ref["B"]
    for e in (a["emit_ns"], b["emit_ns"]):
        assert all(isinstance(x, int) for x in e)
        assert e[0] > 0 and all(x < y for x, y in zip(e, e[1:]))
    assert t["makespan_ns"] == max(a["emit_ns"][-1], b["emit_ns"][-1])

    ev = t["events"]
    assert all(e["kind"] in EVENT_KINDS and e["req"] in ("A", "B") for e in ev)
    assert ev[0] == {**ev[0], "kind": "reset", "req": "B", "start": 0, "stop": 0, "t_start_ns": 0}
    assert [e["kind"] for e in ev].count("reset") == 1
    assert all(0 <= e["t_start_ns"] <= e["t_end_ns"] for e in ev)
    # in order, observed in order, no overlap but a pipelined one: a step of decodes issued before the step
    # before it was observed (RunParams.pipeline_decodes, on by default)
    assert all(x["t_start_ns"] <= y["t_start_ns"] and x["t_end_ns"] <= y["t_end_ns"] for x, y in zip(ev, ev[1:]))
    assert all(x["t_end_ns"] <= y["t_start_ns"] or y["kind"] == "decode" for x, y in zip(ev, ev[1:]))
    assert ev[-1]["t_end_ns"] == t["makespan_ns"]
    # B's prompt is covered once, in order; A's set-up prefill is untimed, so never an event.
    pre = [(e["req"], e["start"], e["stop"]) for e in ev if e["kind"] == "prefill"]
    assert pre == [("B", 0, 16), ("B", 16, 32), ("B", 32, 48)]
    for r in "AB":  # one decode per later output, writing cache slots P, P+1, ..
        dec = [(e["start"], e["stop"]) for e in ev if e["kind"] == "decode" and e["req"] == r]
        assert dec == [(P + i, P + i + 1) for i in range(OUT - 1)]
    # Each emission is stamped at the end of the step that produced it.
    assert [e["t_end_ns"] for e in ev if e["kind"] == "decode" and e["req"] == "A"] == a["emit_ns"]
    b_out = [e for e in ev if e["req"] == "B" and (e["kind"] == "decode" or e["stop"] == P)]
    assert [e["t_end_ns"] for e in b_out] == b["emit_ns"]
    # The executed steps are the policy's plan from t0, and the policies differ as they should.
    steps = plan(t["policy"], prompt_tokens=P, output_tokens=OUT, chunk_size=CHUNK)
    want = [("prefill" if isinstance(s, Prefill) else "decode", s.req) for s in steps[t0_index(steps) :]]
    assert [(e["kind"], e["req"]) for e in ev[1:]] == want
    if t["policy"] == "fifo":
        assert a["emit_ns"][-1] < b["emit_ns"][0]
    elif t["policy"] == "eager":
        assert b["emit_ns"][0] < a["emit_ns"][0]
    else:
        assert a["emit_ns"][0] < b["emit_ns"][0] < a["emit_ns"][-1]


def test_metrics_follow_the_protocol(good):
    from pdlib.report.metrics import trial_metrics

    for t in good.report["trials"]:
        a, b = t["requests"]["A"]["emit_ns"], t["requests"]["B"]["emit_ns"]
        m = trial_metrics(t)
        assert m["b_ttft_ms"] == b[0] / 1e6
        assert m["a_completion_ms"] == a[-1] / 1e6
        assert m["a_resume_gap_ms"] == a[0] / 1e6
        assert m["makespan_ms"] == max(a[-1], b[-1]) / 1e6


def test_analysis_accepts_the_report(good):
    try:
        from pdlib.analysis.frames import load_report
    except Exception as e:  # noqa: BLE001 - analysis is optional here
        pytest.skip(f"pdlib.analysis.frames does not import: {e}")
    assert load_report(good.path) == good.report


# ---- never overwrite, never leave a partial report -------------------------------------------------


def test_refuses_an_existing_output_before_any_work(good, monkeypatch):
    def no_work(*a, **kw):
        raise AssertionError("Experiment built although the output exists")

    monkeypatch.setattr(pdlib.run.experiment.Experiment, "__init__", no_work)
    rc, out, err = cli(["run", *SHAPE, "--policies", *POLICIES, "--output", good.path])
    assert rc == 2 and out == ""
    assert str(good.path) in one_line(err) and "exists" in err
    assert good.path.read_bytes() == good.bytes
    assert sorted(p.name for p in good.path.parent.iterdir()) == ["report.json"]


def test_interrupted_run_leaves_nothing(tmp_path, monkeypatch):
    def interrupt(*a, **kw):
        raise KeyboardInterrupt

    patch(monkeypatch, pdlib.run.trial, "run_trials", interrupt)
    path = tmp_path / "sub" / "report.json"
    rc, out, err = cli([*SMALL, "--output", path])
    assert rc == 130 and "interrupted" in err
    assert not path.exists()
    assert not path.parent.exists() or list(path.parent.iterdir()) == []  # no folder or temp file either


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch, exc):
    def dump_half(obj, f, **kw):
        f.write(json.dumps(obj, **kw)[:200])  # part of the JSON is in the temp file when it fails
        raise exc

    monkeypatch.setattr(pdlib.report.io, "json", types.SimpleNamespace(dump=dump_half, dumps=json.dumps))
    path = tmp_path / "report.json"
    if isinstance(exc, KeyboardInterrupt):
        rc, _, err = cli([*SMALL, "--output", path])
        assert rc == 130 and "interrupted" in err
    else:
        rc, _, err = cli([*SMALL, "--output", path])
        assert rc == 1 and "No space left" in err and len(err.strip().splitlines()) == 1
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


# ---- bad input: exit 2, one line naming the value, nothing written ----------------------------------


def _params_file(d, text):
    f = d / "params.yaml"
    f.write_text(text)
    return f


BAD = {
    "chunk-size 0": lambda d: (["--chunk-size", 0], ["chunk_size", "got 0"]),
    "prompt-tokens 0": lambda d: (["--prompt-tokens", 0], ["prompt_tokens", "got 0"]),
    "output-tokens 0": lambda d: (["--output-tokens", 0], ["output_tokens", "got 0"]),
    "beyond positions": lambda d: (["--prompt-tokens", 4000, "--output-tokens", 200], ["4200", "4096"]),
    "unknown policy": lambda d: (["--policies", "eager", "nope"], ["'nope'"]),
    "repeated policy": lambda d: (["--policies", "eager", "eager"], ["repeat", "eager eager"]),
    "trials 0": lambda d: (["--trials", 0], ["trials", "got 0"]),
    "warmups -1": lambda d: (["--warmups", -1], ["warmups", "got -1"]),
    "trials not an int": lambda d: (["--trials", "two"], ["--trials", "'two'"]),
    "missing params file": lambda d: (["--params", d / "nope.yaml"], [str(d / "nope.yaml")]),
    "unknown params key": lambda d: (
        ["--params", _params_file(d, "chunk_size: 16\nbogus_key: 3\n")],
        ["bogus_key", "params.yaml"],
    ),
    "output under a file": lambda d: (
        (d / "afile").write_text("x") and ["--output", d / "afile" / "report.json"],
        [str(d / "afile" / "report.json")],
    ),
    "existing output": lambda d: (
        (d / "old.json").write_text("{}") and ["--output", d / "old.json"],
        [str(d / "old.json"), "exists"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(tmp_path, case):
    extra, needles = BAD[case](tmp_path)
    before = tree(tmp_path)
    rc, out, err = cli([*SMALL, "--output", tmp_path / "report.json", *extra])  # the last flag wins
    assert rc == 2, (out, err)
    one_line(err)
    assert err.startswith("error: ")
    for needle in needles:
        assert needle in err
    assert tree(tmp_path) == before


def test_bad_input_creates_no_folder(tmp_path):
    rc, _, err = cli(
        [*SMALL, "--prompt-tokens", 4000, "--output-tokens", 200, "--output", tmp_path / "new" / "dir" / "report.json"]
    )
    assert rc == 2 and "4200" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_dangling_symlink_before_any_work(tmp_path, monkeypatch):
    def no_work(*a, **kw):
        raise AssertionError("Experiment built although the output path is taken by a symlink")

    monkeypatch.setattr(pdlib.run.experiment.Experiment, "__init__", no_work)
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    rc, _, err = cli([*SMALL, "--output", link])
    assert rc == 2 and str(link) in one_line(err)
    assert link.is_symlink() and not (tmp_path / "elsewhere.json").exists()


# ---- params files, --validate-only -----------------------------------------------------------------


def test_params_file_with_a_flag_overriding_it(tmp_path):
    f = _params_file(
        tmp_path,
        "model: synthetic:tiny\nprompt_tokens: 48\noutput_tokens: 6\nchunk_size: 16\n"
        "policies: [fifo, eager]\ntrials: 1\nwarmups: 1\nlogical_cache_reset: false\n",
    )
    path = tmp_path / "out" / "report.json"
    rc, out, err = cli(["run", "--params", f, "--chunk-size", 24, "--quiet", "--output", path])
    assert rc == 0, err
    r = json.loads(path.read_text())
    p = r["params"]
    assert (p["model"], p["prompt_tokens"], p["output_tokens"]) == ("synthetic:tiny", 48, 6)
    assert (p["policies"], p["trials"], p["warmups"], p["logical_cache_reset"]) == (["fifo", "eager"], 1, 1, False)
    assert p["chunk_size"] == 24  # the flag beats the file's 16
    assert r["sources"]["params_file"] == sha256(f)
    assert [(t["trial"], t["position"], t["policy"]) for t in r["trials"]] == [(1, 0, "fifo"), (1, 1, "eager")]
    for t in r["trials"]:  # physical cache reset this time; the tokens still match
        assert [(e["start"], e["stop"]) for e in t["events"] if e["kind"] == "prefill"] == [(0, 24), (24, 48)]
        assert t["requests"]["B"]["output_ids"] == r["reference_tokens"]["B"]


def _no_trials(monkeypatch):
    def boom(*a, **kw):
        raise AssertionError("validate-only ran a trial")

    patch(monkeypatch, pdlib.run.trial, "run_once", boom)


def test_validate_only_writes_a_report_without_trials(tmp_path, monkeypatch):
    _no_trials(monkeypatch)
    path = tmp_path / "report.json"
    rc, out, err = cli(["run", *SHAPE, "--policies", *POLICIES, "--validate-only", "--output", path])
    assert rc == 0, err
    assert "B TTFT" not in out and out.splitlines()[-1] == f"report: {path}"
    r = json.loads(path.read_text())
    assert r["schema"] == SCHEMA and r["trials"] == []
    assert list(r["validation"]) == POLICIES and all(v["passed"] for v in r["validation"].values())


def test_validate_only_without_output_writes_nothing(tmp_path, monkeypatch):
    _no_trials(monkeypatch)
    monkeypatch.chdir(tmp_path)

    def no_write(*a, **kw):
        raise AssertionError("a report was written")

    patch(monkeypatch, pdlib.report.io, "write_report", no_write)
    rc, out, err = cli(["run", *SHAPE, "--policies", "eager", "fifo", "--validate-only"])
    assert rc == 0, err
    rows = [line.split()[:2] for line in out.splitlines()]
    assert ["eager", "pass"] in rows and ["fifo", "pass"] in rows and "report:" not in out
    assert list(tmp_path.iterdir()) == []


# ---- token checks: warmups and trials must reproduce the validated tokens ---------------------------


def test_engine_fault_after_validation_aborts_the_run(tmp_path, monkeypatch):
    real_validate, real_decode, planted = pdlib.run.experiment.Experiment.validate, Qwen3.decode, {}

    def validate_then_break(self, *a, **kw):
        results = real_validate(self, *a, **kw)
        ref = results[self.params.policies[0]].tokens
        bad = planted["token"] = next(i for i in range(self.model.config.vocab_size) if i not in ref["A"] + ref["B"])

        def decode(model, *a, **kw):  # every decode now picks `bad`
            logits, _ = real_decode(model, *a, **kw)
            logits = logits + 1e4 * (mx.arange(logits.shape[0]) == bad)
            return logits, mx.argmax(logits)

        monkeypatch.setattr(Qwen3, "decode", decode)
        return results

    monkeypatch.setattr(pdlib.run.experiment.Experiment, "validate", validate_then_break)
    path = tmp_path / "report.json"
    rc, out, err = cli(
        ["run", *SHAPE, "--policies", "chunked", "eager", "--trials", 1, "--warmups", 1, "--output", path]
    )
    assert rc == 1
    assert "chunked  pass" in out  # validation passed before the fault
    one_line(err)
    for needle in ("warmup 1", "'chunked'", "request A", "at output 1:", f"got {planted['token']}"):
        assert needle in err
    assert not path.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad_call, what, policy", [(0, "warmup 1", "eager"), (3, "trial 1", "fifo")])
def test_a_run_that_differs_from_the_reference_aborts(tmp_path, monkeypatch, bad_call, what, policy):
    real, calls = pdlib.run.trial.run_once, []

    def corrupt(engine, policy, **kw):
        run = real(engine, policy, **kw)
        if len(calls) == bad_call:
            run.output_ids["B"][2] += 1
        calls.append(policy)
        return run

    patch(monkeypatch, pdlib.run.trial, "run_once", corrupt)
    path = tmp_path / "report.json"
    rc, out, err = cli(["run", *SHAPE, "--policies", "eager", "fifo", "--trials", 1, "--warmups", 1, "--output", path])
    assert rc == 1 and len(calls) == bad_call + 1  # nothing runs after the mismatch
    for needle in (f"{what}: policy {policy!r}", "request B", "at output 2:"):
        assert needle in one_line(err)
    assert not path.exists() and list(tmp_path.iterdir()) == []


# ---- units -----------------------------------------------------------------------------------------


def test_trial_orders():
    assert trial_orders(["eager", "chunked", "fifo"], 4) == [
        ["eager", "chunked", "fifo"],
        ["chunked", "fifo", "eager"],
        ["fifo", "eager", "chunked"],
        ["eager", "chunked", "fifo"],
    ]
    assert trial_orders(["eager", "chunked"], 3) == [["eager", "chunked"], ["chunked", "eager"], ["eager", "chunked"]]
    assert trial_orders(["fifo"], 2) == [["fifo"], ["fifo"]]


def _run(a, b):
    return RunRecord("eager", {"A": a, "B": b}, {"A": [], "B": []}, [], 0)


def test_check_tokens():
    ref = {"A": [1, 2, 3], "B": [4, 5, 6]}
    check_tokens(_run([1, 2, 3], [4, 5, 6]), ref, what="trial 1")  # equal: no error
    cases = [
        (([1, 2, 9], [4, 5, 6]), "request A differs from the validated reference at output 2: got 9, expected 3"),
        (([1, 2, 3], [7, 5, 6]), "request B differs from the validated reference at output 0: got 7, expected 4"),
        (([1, 2, 3], [4, 5]), "request B differs from the validated reference at output 2: got nothing, expected 6"),
        (([1, 2, 3, 8], [4, 5, 6]), "at output 3: got 8, expected nothing"),
        (([9, 9, 9], [9, 9, 9]), "request A differs from the validated reference at output 0"),
    ]
    for (a, b), msg in cases:
        with pytest.raises(TokenMismatch) as e:
            check_tokens(_run(a, b), ref, what="warmup 2")
        assert str(e.value).startswith("warmup 2: policy 'eager', ") and msg in str(e.value)

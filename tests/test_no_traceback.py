"""Generated inputs at the public entry points: params files (validate, run), report files (render), papermill
parameter sets (notebook 01's first cells) and checkpoint directories (validate --model DIR). Each must end in
exit 0 or exactly one `error: ...` line with exit 2, never a traceback, and nothing half-written.

A generated input that is valid runs only the tiny model for a few tokens, so the whole file stays within about
two minutes on two cores; the example counts are set below (hypothesis' database off: every CI run starts over).
"""

import contextlib
import copy
import gzip
import io
import json
import keyword
import tempfile
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pdlib.__main__ import main
from pdlib.config import RunParams
from pdlib.errors import InputError

DATA = Path(__file__).parent / "data"
SMALL_REPORT = json.loads((DATA / "small-report.json").read_text())
FIELDS = [f.name for f in fields(RunParams)]
QUICK = settings(deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# ---- values ------------------------------------------------------------------------------------------------------
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
small_int = st.integers(-2, 12)
# for counts a run repeats (trials, warmups), a huge valid count would run for ever: never positive here
not_a_count = junk.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v > 2))
# values a field may take: mostly near the valid range (so many inputs run), else anything
FIELD_VALUES = {
    "model": st.sampled_from(["synthetic:tiny", "synthetic:tiny@3", "tiny", "no-such-model", "", "synthetic:"]),
    "prompt_tokens": st.one_of(st.integers(0, 24), junk),
    "output_tokens": st.one_of(st.integers(0, 5), junk),
    "chunk_size": st.one_of(small_int, junk),
    "policies": st.one_of(
        st.lists(st.sampled_from(["eager", "chunked", "fifo", "mixed", "overlap", "slo-chunked", "nope"]), max_size=3),
        junk,
    ),
    "trials": st.one_of(st.integers(0, 2), not_a_count),
    "warmups": st.one_of(st.integers(-1, 1), not_a_count),
    "validation_checkpoint_every": st.one_of(small_int, junk),
    "stall_threshold_ms": st.one_of(st.floats(-1, 200), junk),
    "tbt_slo_ms": st.one_of(st.none(), st.floats(-1, 100), junk),
}


def field_value(name):
    return FIELD_VALUES.get(name, st.one_of(st.booleans(), junk))


VALID = {
    "model": st.just("synthetic:tiny"),
    "prompt_tokens": st.integers(4, 24),
    "output_tokens": st.integers(2, 5),
    "chunk_size": st.integers(1, 12),
    "policies": st.lists(st.sampled_from(["eager", "chunked", "fifo", "mixed"]), min_size=1, max_size=2, unique=True),
    "trials": st.integers(1, 2),
    "warmups": st.integers(0, 1),
    "validation_checkpoint_every": st.integers(1, 4),
}


@st.composite
def params_mapping(draw):
    """A valid small experiment with up to two fields spoiled, or fields drawn near and far from their range."""
    if draw(st.booleans()):
        out = {k: draw(v) for k, v in VALID.items()}
        for k in draw(st.lists(st.sampled_from([*FIELDS, "chunk_sise", "1"]), max_size=2)):
            out[k] = draw(field_value(k))
        return out
    # model and the two lengths always appear: their defaults are Qwen3-0.6B at 4096x1024, minutes on a CPU
    keys = ["model", "prompt_tokens", "output_tokens"] + draw(st.lists(st.sampled_from(FIELDS), max_size=6))
    out = {k: draw(field_value(k)) for k in keys}
    if draw(st.booleans()) and draw(st.booleans()):
        out[draw(st.sampled_from(["chunk_sise", "polices", "1", "trails"]))] = draw(junk)
    return out


params_text = st.one_of(
    params_mapping().map(lambda m: yaml.safe_dump(m, sort_keys=False)),
    st.sampled_from(["", "# only a comment\n", "null\n", "[1, 2]\n", "1: 2\nmodel: synthetic:tiny\n", "{a: [\n", "7"]),
)


def call(argv) -> tuple[int, str]:
    """main(argv) with stderr captured; argparse's own exits count as returns."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def assert_clean(code, err, what):
    """Exit 0, or exit 2 with exactly one line, `error: ...`; a traceback or a second line is a defect."""
    assert "Traceback" not in err, f"{what}: {err}"
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), f"{what}: exit {code}: {err!r}"


# ---- params files --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["validate", "serve"])
def test_a_params_file_nested_past_pythons_recursion_limit_is_refused_in_one_line(tmp_path, command):
    path = tmp_path / "p.yaml"
    path.write_text("workload: " + "[" * 5000 + "]" * 5000 + "\n")
    code, err = call([command, "--params", path])
    assert code == 2 and err == f"error: cannot read params file {str(path)!r}: its values nest too deeply\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


@settings(QUICK, max_examples=80)
@given(text=params_text, command=st.sampled_from(["validate", "run"]))
def test_a_params_file_runs_or_is_refused_in_one_line(text, command):
    with tempfile.TemporaryDirectory() as d:
        path, out = Path(d) / "p.yaml", Path(d) / "r.json"
        path.write_text(text)
        argv = [command, "--params", path, "--quiet"] + (["--output", out] if command == "run" else [])
        code, err = call(argv)
        event(f"{command} exit {code}")  # pytest --hypothesis-show-statistics: how many ran, how many refused
        assert_clean(code, err, text)
        if command == "run":
            assert out.exists() == (code == 0), err  # a report only from a run that succeeded
        assert sorted(p.name for p in Path(d).iterdir()) == sorted(
            ["p.yaml"] + (["r.json"] if code == 0 and command == "run" else [])
        )


# ---- report files --------------------------------------------------------------------------------------------------
def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):  # the first few of each list reach every kind of entry
            yield from _paths(v, (*prefix, i))


REPORT_PATHS = [p for p in _paths(SMALL_REPORT) if p]


@st.composite
def report_bytes(draw):
    report = copy.deepcopy(SMALL_REPORT)
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from(REPORT_PATHS))
        parent = report
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                del parent[path[-1]]
            elif isinstance(parent, dict | list):
                parent[path[-1]] = draw(junk)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed the path
    data = json.dumps(report, allow_nan=True).encode()
    form = draw(st.sampled_from(["json", "gz", "cut", "cut-gz"]))
    if form.startswith("cut"):
        data = data[: draw(st.integers(0, len(data) - 1))]
    return gzip.compress(data, mtime=0) if form.endswith("gz") else data, form.endswith("gz")


@settings(QUICK, max_examples=80)
@given(case=report_bytes())
def test_a_report_file_renders_or_is_refused_in_one_line(case):
    data, gz = case
    with tempfile.TemporaryDirectory() as d:
        path, out = Path(d) / ("r.json.gz" if gz else "r.json"), Path(d) / "figs"
        path.write_bytes(data)
        code, err = call(["render", path, "--out", out])
        event(f"render exit {code}")
        assert_clean(code, err, data[:200])
        if code != 0:
            assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


# ---- checkpoint directories ---------------------------------------------------------------------------------------
def _tiny_checkpoint() -> tuple[bytes, bytes]:
    """(config.json, model.safetensors) of the tiny synthetic model, as a checkpoint directory holds them."""
    import mlx.core as mx

    from pdlib.config import PRESETS
    from pdlib.weights import synthetic_model

    with tempfile.TemporaryDirectory() as d:
        mx.save_safetensors(f"{d}/m.safetensors", dict(synthetic_model("tiny", seed=0).weights))
        weights = Path(f"{d}/m.safetensors").read_bytes()
    return json.dumps(PRESETS["tiny"].to_hf_dict()).encode(), weights


CONFIG, WEIGHTS = _tiny_checkpoint()
CONFIG_KEYS = list(json.loads(CONFIG))


@st.composite
def checkpoint_files(draw):
    """The tiny checkpoint with its config's values spoiled or dropped, either file cut or bytes overwritten."""
    config = json.loads(CONFIG)
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=2)):
        if draw(st.booleans()):
            config.pop(key, None)
        else:
            config[key] = draw(st.one_of(st.integers(-2, 3), junk))
    cfg, weights = json.dumps(config).encode(), WEIGHTS
    damage = draw(st.sampled_from(["none", "none", "cut-config", "cut-weights", "poke-weights", "no-weights"]))
    if damage == "cut-config":
        cfg = cfg[: draw(st.integers(0, len(cfg) - 1))]
    elif damage == "cut-weights":
        weights = weights[: draw(st.integers(0, len(weights) - 1))]
    elif damage == "poke-weights":  # inside the 8-byte length or the JSON header, where a loader trusts most
        at = draw(st.integers(0, 8 + int.from_bytes(weights[:8], "little") - 1))
        weights = weights[:at] + bytes([draw(st.integers(0, 255))]) + weights[at + 1 :]
    elif damage == "no-weights":
        weights = None
    return cfg, weights


@settings(QUICK, max_examples=40)
@given(files=checkpoint_files())
def test_a_checkpoint_directory_runs_or_is_refused_in_one_line(files):
    cfg, weights = files
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_bytes(cfg)
        if weights is not None:
            (Path(d) / "model.safetensors").write_bytes(weights)
        argv = ["validate", "--model", d, "--prompt-tokens", 6, "--output-tokens", 2, "--chunk-size", 3]
        code, err = call([*argv, "--policies", "chunked", "--quiet"])
        event(f"checkpoint exit {code}")
        assert_clean(code, err, (cfg[:120], None if weights is None else len(weights)))


# ---- papermill parameter sets (notebook 01's first two cells, as the kernel runs them) -----------------------------
def _notebook_cells():
    nb = json.loads((Path(__file__).parent.parent / "notebooks" / "01_run_trials.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


PARAMETERS_CELL = _notebook_cells()[0]


@settings(QUICK, max_examples=150)
@given(
    values=st.dictionaries(
        st.one_of(
            st.sampled_from(FIELDS + ["output_dir", "params_file", "quiet"]),
            # a keyword fails in papermill's own injected cell, before any of the notebook's code runs
            st.from_regex(r"[a-z_]{1,10}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n)),
        ),
        st.one_of(*[v for v in FIELD_VALUES.values()], junk),
        max_size=4,
    )
)
def test_papermill_parameters_are_taken_or_refused_in_one_line(values):
    """papermill's own translation of `-p NAME VALUE` into the injected cell, then the checks notebook 01 runs
    before anything else: its unknown-parameter check and RunParams; any refusal is an InputError."""
    from papermill.translators import translate_parameters

    from pdlib.publish import parameters, runs

    injected = translate_parameters("python3", "python", values, "Parameters")
    namespace: dict = {}
    exec(PARAMETERS_CELL, namespace)  # noqa: S102 - the notebook's own literals
    exec(injected, namespace)  # noqa: S102 - papermill's rendering of generated literals
    history = ["", PARAMETERS_CELL, injected, "parameters.check(In)"]
    try:
        parameters.check(history)
        runs.run_params(
            namespace, params_file=None if namespace.get("params_file") is None else "params/smoke-cpu.yaml"
        )
    except InputError as e:
        assert "\n" not in str(e), str(e)
    bad = [k for k in values if k not in parameters.names(PARAMETERS_CELL) and not k.startswith("PAPERMILL_")]
    if bad:
        with pytest.raises(InputError, match="unknown parameter"):
            parameters.check(history)


def test_the_property_tests_see_a_traceback():
    """The checks above fail on an input that crashes: a planted error that is not an InputError."""
    with pytest.raises(AssertionError):
        assert_clean(1, "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n", "x")
    with pytest.raises(AssertionError):
        assert_clean(2, "error: one\nerror: two\n", "x")
    assert_clean(2, "error: one line\n", "x")


def test_a_device_out_of_memory_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """MLX's allocator failing (a RuntimeError, as mlx-lm's batching met it on an H100) ends any command in one
    `error:` line, exit 1; any other RuntimeError is not taken for it."""
    from pdlib.run import serve

    def out_of_memory(*args, **kw):
        raise RuntimeError("[malloc] cudaMallocAsync(&data, size, stream) failed:\n out of memory")

    monkeypatch.setattr(serve, "serve_params_file", out_of_memory)
    out = tmp_path / "r.json"
    assert main(["serve", "--params", "params/serve-smoke-cpu.yaml", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "error: the device ran out of memory: [malloc] cudaMallocAsync(&data, size, stream) failed: out of memory\n"
    )
    assert not out.exists()
    monkeypatch.setattr(serve, "serve_params_file", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):
        main(["serve", "--params", "params/serve-smoke-cpu.yaml"])


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["run", "--params", "", "--output", "x.json"], "--params"),
        (["validate", "--params", ""], "--params"),
        (["run", "--params", "params/smoke-cpu.yaml", "--output", ""], "--output"),
        (["render", "", "--out", "x"], "report"),
        (["render", "tests/data/small-report.json", "--out", ""], "--out"),
        (["notebooks", "--report", "x.json", "--out", ""], "--out"),
        (["sweep", "--params", "params/smoke-cpu.yaml", "--chunk-sizes", "16", "--output", ""], "--output"),
        (["serve", "--params", "params/serve-smoke-cpu.yaml", "--output", ""], "--output"),
        (["bench-step", "--output", ""], "--output"),
    ],
)
def test_an_empty_path_is_refused_not_taken_as_not_given(argv, flag, capsys, tmp_path, monkeypatch):
    """'' used to mean "no params file" (the full default experiment ran) or the current folder (files written
    there); it is one line, exit 2, before any work, and nothing is written."""
    monkeypatch.chdir(Path(__file__).parent.parent)
    before = sorted(Path().iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f": {flag} is an empty path" in err
    assert sorted(Path().iterdir()) == before


def test_a_flags_prefix_is_not_taken_for_it(capsys):
    """`validate --out 5` used to set --output-tokens 5 (argparse's abbreviations): now an unknown flag."""
    assert main(["validate", "--params", "params/smoke-cpu.yaml", "--out", "5"]) == 2
    assert capsys.readouterr().err == "error: python -m pdlib: unrecognized arguments: --out 5\n"

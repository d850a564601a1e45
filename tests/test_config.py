"""Config: presets, RunParams validation and params files, and the CLI's bad-input contract (one line on
stderr, exit code 2)."""

from dataclasses import fields

import pytest

from pdlib.__main__ import main
from pdlib.config import PRESETS, ModelConfig, RunParams, preset
from pdlib.errors import InputError
from pdlib.scheduler import POLICIES

TINY = PRESETS["tiny"]
FIELDS = sorted(f.name for f in fields(RunParams))


# -- presets -----------------------------------------------------------------------------------------


def test_presets_have_the_documented_shapes():
    q = preset("qwen3-0.6b")
    assert (
        q.hidden_size,
        q.num_hidden_layers,
        q.num_attention_heads,
        q.num_key_value_heads,
        q.head_dim,
        q.intermediate_size,
        q.vocab_size,
        q.max_position_embeddings,
    ) == (1024, 28, 16, 8, 128, 3072, 151936, 40960)
    assert q.tie_word_embeddings and q.rope_theta == 1e6 and q.rms_norm_eps == 1e-6
    t = preset("tiny")
    assert (
        t.hidden_size,
        t.num_hidden_layers,
        t.num_attention_heads,
        t.num_key_value_heads,
        t.head_dim,
        t.intermediate_size,
        t.vocab_size,
        t.max_position_embeddings,
    ) == (64, 3, 4, 2, 16, 128, 512, 4096)
    assert t.num_attention_heads // t.num_key_value_heads == q.num_attention_heads // q.num_key_value_heads


def test_unknown_preset_lists_presets():
    with pytest.raises(InputError) as e:
        preset("nope")
    msg = str(e.value)
    assert "'nope'" in msg
    assert all(name in msg for name in PRESETS)


def test_model_config_rejects_bad_gqa_ratio():
    with pytest.raises(InputError, match="num_key_value_heads=3"):
        ModelConfig(**{**TINY.to_dict(), "num_key_value_heads": 3})


def test_model_config_hf_dict_roundtrip():
    assert ModelConfig.from_hf_dict(TINY.to_hf_dict()) == TINY
    assert TINY.to_hf_dict()["model_type"] == "qwen3"


# Qwen/Qwen3-0.6B's config.json as published (transformers 4.51 layout): every key in it must be accepted.
QWEN3_06B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_published_qwen3_config_is_accepted():
    assert ModelConfig.from_hf_dict(QWEN3_06B_CONFIG) == PRESETS["qwen3-0.6b"]
    v5 = {
        **TINY.to_hf_dict(),
        "layer_types": ["full_attention"] * 3,
        "attention_dropout": 0.1,
        "dtype": "float32",
        "rope_parameters": {"rope_type": "default", "rope_theta": TINY.rope_theta},
        "sliding_window": None,
    }
    del v5["rope_theta"]
    assert ModelConfig.from_hf_dict(v5) == TINY


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"model_type": "llama"}, "model_type='llama'"),
        ({"model_type": None}, "model_type=None"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window=True"),
        (
            {"layer_types": ["full_attention", "sliding_attention", "full_attention"]},
            "layer_types=['full_attention', 'sliding_attention']",
        ),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling={'type': 'yarn', 'factor': 4.0}"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters={'rope_type': 'linear'"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "llama3", "factor": 8.0}}},
            "rope_parameters.full_attention={'rope_type': 'llama3'",
        ),
        (
            {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
            "rope_parameters.partial_rotary_factor=0.5",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config={'quant_method': 'fp8'}"),
        ({"quantization": {"group_size": 64, "bits": 4}}, "quantization={'group_size': 64"),
        ({"rope_theta": None}, "lacks rope_theta"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "conflicting rope_theta values [10000.0, "),
        ({"head_dim": None}, "lacks head_dim"),
    ],
)
def test_hf_config_option_pdlib_does_not_implement_is_refused_by_name(change, needle):
    d = {**QWEN3_06B_CONFIG, **change}
    if change.get("head_dim", 0) is None:
        del d["head_dim"]
    with pytest.raises(InputError) as e:
        ModelConfig.from_hf_dict(d)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads must be an integer >= 1, got 0"),
        ({"num_attention_heads": -16}, "num_attention_heads must be an integer >= 1, got -16"),
        ({"hidden_size": "1024"}, "hidden_size must be an integer >= 1, got '1024'"),
        ({"num_hidden_layers": 2.5}, "num_hidden_layers must be an integer >= 1, got 2.5"),
        ({"vocab_size": True}, "vocab_size must be an integer >= 1, got True"),
        ({"max_position_embeddings": 0}, "max_position_embeddings must be an integer >= 1, got 0"),
        ({"intermediate_size": None}, "intermediate_size must be an integer >= 1, got None"),
        ({"head_dim": 127}, "head_dim must be an even integer, got 127"),
        ({"num_key_value_heads": 3}, "num_attention_heads=16 is not a multiple of num_key_value_heads=3"),
        ({"rope_theta": 0}, "rope_theta must be a finite number > 0, got 0"),
        ({"rope_theta": float("inf")}, "rope_theta must be a finite number > 0, got inf"),
        ({"rope_theta": [1e6]}, "rope_theta=[1000000.0]; expected a number"),
        ({"rope_theta": "1e6"}, "rope_theta='1e6'; expected a number"),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps must be a finite number > 0, got nan"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a finite number > 0, got -1e-06"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false, got 'yes'"),
        ({"layer_types": "full_attention"}, "layer_types='full_attention'"),
        ({"layer_types": [{"a": 1}]}, "layer_types=[{'a': 1}]"),
    ],
)
def test_hf_config_bad_value_names_the_key_and_what_is_accepted(change, needle):
    with pytest.raises(InputError) as e:
        ModelConfig.from_hf_dict({**QWEN3_06B_CONFIG, **change})
    msg = str(e.value)
    assert msg.startswith("checkpoint config.json") and needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize("value", [[1, 2], "qwen3", None, 3])
def test_hf_config_that_is_not_an_object_is_refused(value):
    with pytest.raises(InputError, match="expected an object of option: value"):
        ModelConfig.from_hf_dict(value)


# -- RunParams -----------------------------------------------------------------------------------------


def test_defaults_are_the_documented_workload():
    p = RunParams()
    assert (p.model, p.prompt_tokens, p.output_tokens) == ("qwen3-0.6b", 4096, 1024)
    assert p.policies == ("eager", "chunked")
    p.check_positions(PRESETS["qwen3-0.6b"])  # 5,120 positions fit in 40,960


@pytest.mark.parametrize(
    "field, value",
    [
        ("chunk_size", 0),
        ("prompt_tokens", -1),
        ("output_tokens", 0),
        ("output_tokens", 1),  # A's only output would be its untimed first
        ("trials", 0),
        ("warmups", -1),
        ("validation_checkpoint_every", 0),
        ("chunk_size", 16.0),
        ("prompt_tokens", True),
        ("policies", ("eager", "nope")),
        ("policies", ("eager", "eager")),
        ("policies", ()),
        ("logical_cache_reset", "yes"),
        ("logical_cache_reset", 1),
        ("lossless_decode_weights", None),
        ("stall_threshold_ms", 0),
        ("stall_threshold_ms", -5.0),
        ("stall_threshold_ms", True),
        ("model", ""),
    ],
)
def test_bad_value_names_the_field(field, value):
    with pytest.raises(InputError) as e:
        RunParams(**{field: value})
    msg = str(e.value)
    assert field in msg or (field == "policies" and "policy" in msg), msg
    assert "\n" not in msg


def test_unknown_policy_lists_known_ones():
    with pytest.raises(InputError) as e:
        RunParams(policies=["eager", "nope"])
    assert "'nope'" in str(e.value)
    assert all(p in str(e.value) for p in POLICIES)


def test_good_values_pass_and_list_becomes_tuple():
    p = RunParams(
        model="synthetic:tiny",
        prompt_tokens=1,
        output_tokens=2,
        chunk_size=1,
        trials=1,
        warmups=0,
        policies=["fifo", "eager", "chunked"],
        logical_cache_reset=True,
        stall_threshold_ms=0.5,
    )
    assert p.policies == ("fifo", "eager", "chunked")
    assert RunParams(**p.to_dict()) == p
    assert p.to_dict()["policies"] == ["fifo", "eager", "chunked"]


def test_check_positions():
    RunParams(prompt_tokens=4000, output_tokens=96).check_positions(TINY)  # exactly 4096: fits
    with pytest.raises(InputError) as e:
        RunParams(prompt_tokens=4000, output_tokens=97).check_positions(TINY)
    assert "4097" in str(e.value) and "4096" in str(e.value)


# -- params files ---------------------------------------------------------------------------------------


def test_from_yaml_reads_and_overrides_win(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(
        "model: synthetic:tiny\nprompt_tokens: 300\nchunk_size: 64\npolicies: [eager, fifo]\n"
        "logical_cache_reset: true\n"
    )
    p = RunParams.from_yaml(f)
    assert (p.model, p.prompt_tokens, p.chunk_size, p.policies, p.logical_cache_reset) == (
        "synthetic:tiny",
        300,
        64,
        ("eager", "fifo"),
        True,
    )
    assert p.output_tokens == RunParams().output_tokens  # unset keys keep defaults
    q = RunParams.from_yaml(str(f), chunk_size=32, policies=["chunked"])
    assert (q.chunk_size, q.policies, q.prompt_tokens) == (32, ("chunked",), 300)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "null\n", "~\n", "{}\n"])
def test_from_yaml_refuses_an_empty_file(tmp_path, text):
    """Every default is the full workload (minutes of device time): an empty file is a mistake, not a request."""
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        RunParams.from_yaml(f)
    msg = str(e.value)
    assert f"params file {str(f)!r} is empty" in msg and "leave out --params" in msg
    assert all(name in msg.split("accepted:", 1)[1] for name in FIELDS)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("1: 2\n", "has key 1 of type int"),
        ("chunk_size: 8\n1: 2\n", "has key 1 of type int"),
        ("chunk_size: 8\ntrue: 1\nbogus: 2\n", "has key True of type bool"),
        ("~: 1\n", "has key None of type NoneType"),
        ("1.5: 1\nchunksize: 2\n", "has key 1.5 of type float"),
    ],
)
def test_from_yaml_refuses_a_key_that_is_not_a_name(tmp_path, text, needle):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        RunParams.from_yaml(f)
    msg = str(e.value)
    assert needle in msg and "keys are parameter names" in msg and "chunk_size" in msg.split("accepted:", 1)[1]


def test_from_yaml_syntax_error_names_the_problem_and_the_place(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("chunk_size: 8\n? [1, 2]\n: 3\n")
    with pytest.raises(InputError, match="found unhashable key at line 2, column 3"):
        RunParams.from_yaml(f)


@pytest.mark.parametrize("value", [5, [[1]], [1, 2], {"eager": 1}])
def test_policies_that_are_not_a_list_of_names_are_refused(value):
    with pytest.raises(InputError, match="policies must be a list of policy names"):
        RunParams(policies=value)


def test_from_yaml_rejects_unknown_keys_listing_accepted_ones(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("chunk_size: 64\nchunksize: 32\nbogus: 1\n")
    with pytest.raises(InputError) as e:
        RunParams.from_yaml(f)
    msg = str(e.value)
    assert "bogus" in msg and "chunksize" in msg
    accepted = msg.split("accepted:", 1)[1]
    assert all(name in accepted for name in FIELDS)


def test_from_yaml_bad_value_is_input_error(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("chunk_size: 0\n")
    with pytest.raises(InputError, match="chunk_size"):
        RunParams.from_yaml(f)


def test_from_yaml_unreadable_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(InputError) as e:
        RunParams.from_yaml(missing)
    assert "cannot read params file" in str(e.value) and "missing.yaml" in str(e.value)
    with pytest.raises(InputError, match="cannot read params file"):
        RunParams.from_yaml(tmp_path)  # a directory
    broken = tmp_path / "broken.yaml"
    broken.write_text("chunk_size: [1, 2\n")
    with pytest.raises(InputError) as e:
        RunParams.from_yaml(broken)
    assert "cannot read params file" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["- eager\n- chunked\n", "just a string\n", "42\n", "[]\n", "false\n"])
def test_from_yaml_rejects_non_mapping(tmp_path, text):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match="must hold a mapping of parameter: value \\(accepted: chunk_size"):
        RunParams.from_yaml(f)


# -- CLI ----------------------------------------------------------------------------------------------


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert out == ""
    return lines[0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["validate", "--chunk-size", "0"], "chunk_size"),
        (["validate", "--model", "synthetic:nope"], "unknown model preset 'nope'"),
        (["validate", "--bogus"], "--bogus"),
        (["validate", "--chunk-size", "x"], "--chunk-size"),
        (["validate", "--policies", "eager", "eager"], "must not repeat"),
        (["validate", "--model", "synthetic:tiny", "--prompt-tokens", "4090", "--output-tokens", "8"], "4098"),
        (["validate", "--output-tokens", "1"], "output_tokens must be an integer >= 2"),
        (["bench-step", "--warmup", "-1"], "--warmup must be an integer >= 0"),
        (["bench-step", "--model", "synthetic:tiny"], "needs a GPU backend"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, needle):
    assert main(argv) == 2
    assert needle in _one_error_line(capsys)


def test_cli_alone_lists_its_commands_and_every_flag_says_its_default(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in (
        "validate",
        "run",
        "notebooks",
        "render",
        "sweep",
        "check-kernels",
        "bench-step",
        "profile-step",
        "partition-curve",
    ):
        assert f"    {command}" in out
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("pdlib ")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "slo-mixed disagg overlap" in text and "(default: the params file's, else 4096)" in text
    with pytest.raises(SystemExit):
        main(["bench-step", "--help"])
    assert "(default: 200)" in " ".join(capsys.readouterr().out.split())


def test_cli_params_file_errors_exit_2(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("bogus: 1\n")
    assert main(["validate", "--params", str(f)]) == 2
    assert "bogus" in _one_error_line(capsys)
    assert main(["validate", "--params", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read params file" in _one_error_line(capsys)


@pytest.mark.parametrize(
    "text, needle",
    [("", "is empty; it must set at least one parameter"), ("1: 2\n", "has key 1 of type int")],
    ids=["empty", "number key"],
)
def test_cli_params_file_empty_or_with_a_number_key_exits_2(tmp_path, capsys, text, needle):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    assert main(["validate", "--params", str(f)]) == 2
    assert needle in _one_error_line(capsys)


def test_cli_params_file_not_utf8_exits_2_writing_nothing(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_bytes(b"model: \xff\xfe\n")
    out = tmp_path / "x"
    assert main(["run", "--params", str(f), "--output", str(out)]) == 2
    line = _one_error_line(capsys)
    assert str(f) in line and "not UTF-8 text" in line
    assert not out.exists()


def test_cli_validate_passes_on_tiny(capsys):
    argv = [
        "validate",
        "--model",
        "synthetic:tiny",
        "--prompt-tokens",
        "64",
        "--output-tokens",
        "8",
        "--chunk-size",
        "16",
        "--policies",
        "eager",
        "chunked",
        "fifo",
        "--quiet",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""  # --quiet: no progress bar
    lines = out.strip().splitlines()
    assert "synthetic:tiny@0" in lines[0] and "prompts 64 tokens" in lines[0] and "chunk 16" in lines[0]
    assert lines[1].split()[:2] == ["policy", "result"]
    rows = {ln.split()[0]: ln.split() for ln in lines[3:]}
    assert set(rows) == {"eager", "chunked", "fifo"}
    for policy, cols in rows.items():
        assert cols[1] == "pass", (policy, cols)
        assert "FAIL" not in " ".join(cols)


def test_cli_check_kernels_without_a_gpu_is_one_line(capsys):
    from pdlib.engine.kernels import BACKEND

    if BACKEND != "cpu":
        pytest.skip("a GPU backend is present")
    assert main(["check-kernels"]) == 2
    assert "no GPU backend" in _one_error_line(capsys)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["check-kernels", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["check-kernels", "--seed", str(2**32)], "--seed must be an integer <= 4294967295"),
        (["check-kernels", "--output", "README.md"], "output 'README.md' already exists"),
        (["profile-step", "--rows", "-1"], "--rows must be an integer >= 0, got -1"),
    ],
)
def test_gpu_commands_check_their_flags_before_any_work(argv, said, capsys):
    """Checked first on any machine: a GPU used to meet a bad --seed as a traceback, and an existing --output
    only after minutes of kernels; --rows went unchecked without --chunk."""
    assert main(argv) == 2
    assert said in _one_error_line(capsys)


def test_cli_flag_turns_a_params_file_setting_off(tmp_path):
    import argparse

    from pdlib.cli import params_from, run_options

    f = tmp_path / "p.yaml"
    f.write_text("logical_cache_reset: true\n")
    parser = argparse.ArgumentParser()
    run_options(parser)
    assert params_from(parser.parse_args(["--params", str(f)])).logical_cache_reset is True
    assert params_from(parser.parse_args(["--params", str(f), "--no-logical-cache-reset"])).logical_cache_reset is False


@pytest.mark.parametrize("name", ["stall_threshold_ms", "tbt_slo_ms"])
@pytest.mark.parametrize("value", [float("inf"), 10**400, float("nan"), 0, -1.0, True, "5"])
def test_a_threshold_must_be_a_finite_float_above_zero(name, value):
    """inf used to pass stall_threshold_ms (a report with Infinity that render then refused), and a 400-digit
    integer both fields (an OverflowError later, with the report half-written)."""
    with pytest.raises(InputError, match=f"^{name} must be a finite number > 0, got "):
        RunParams(**{name: value})
    assert getattr(RunParams(**{name: 7}), name) == 7


def test_a_params_file_is_a_regular_file_of_unique_keys(tmp_path, capsys):
    """A FIFO used to block and /dev/zero to read until the machine ran out of memory; a repeated key used to
    win silently (YAML's last-wins). Each is one line naming the file, for run/validate and serve alike."""
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    twice = tmp_path / "twice.yaml"
    twice.write_text("trials: 1\nmodel: synthetic:tiny\ntrials: 2\n")
    big = tmp_path / "big.yaml"
    big.write_text("# x\n" * 300_000)
    cases = {
        fifo: "not a regular file",
        "/dev/zero": "not a regular file",
        twice: "key 'trials' appears twice at line 3, column 1",
        big: "larger than 1048576 bytes, not a params file",
    }
    for path, said in cases.items():
        for command in ("validate", "serve"):
            assert main([command, "--params", str(path)]) == 2
            assert capsys.readouterr().err == f"error: cannot read params file {str(path)!r}: {said}\n"
    nested = tmp_path / "nested.yaml"
    nested.write_text("model: synthetic:tiny\npeers: [{a: 1, a: 2}]\n")
    with pytest.raises(InputError, match="key 'a' appears twice"):
        RunParams.from_yaml(nested)


def test_a_peers_step_and_a_synthetic_seed_are_bounded():
    """A 26-digit prefill_step_size used to pass validate; `synthetic:tiny@٣` (an Arabic-Indic digit) ran as seed 3."""
    from pdlib.weights import load_model

    with pytest.raises(InputError, match=r"^peers: 'mlx-lm-fp32@9{26}' needs a prefill_step_size in \[1, 2147483647\]"):
        RunParams(peers=["mlx-lm-fp32@" + "9" * 26])
    assert RunParams(peers=["mlx-lm-fp32@2147483647"]).peers == ("mlx-lm-fp32@2147483647",)
    for spec in ("synthetic:tiny@٣", "synthetic:tiny@9223372036854775808"):
        with pytest.raises(InputError, match=r"^bad model spec .*SEED 0 to 2\^63 - 1"):
            load_model(spec)
    assert load_model("synthetic:tiny@9223372036854775807").source["seed"] == 2**63 - 1


def test_is_finite_takes_an_integer_past_float_range_as_not_finite():
    """One check for every finite-number input: `0 < x < inf` passes 10**400, which float() then overflows."""
    from pdlib.analysis.present import stall_threshold
    from pdlib.errors import is_finite

    assert is_finite(1) and is_finite(2.5) and not is_finite(10**400) and not is_finite(float("nan"))
    assert not is_finite(True) and not is_finite("1")
    with pytest.raises(InputError, match="^stall_threshold_ms must be a finite number > 0, got 1000"):
        stall_threshold({"params": {"stall_threshold_ms": 10**400}})

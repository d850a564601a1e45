"""Weights: seeded synthetic weights, lossless bf16 packing, model specs and checkpoint directories.

Nothing here materialises the 0.6B weights: the fallback logic is checked with a cheap stub."""

import json

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import pdlib.weights as W
from pdlib.config import PRESETS, ModelConfig
from pdlib.errors import InputError
from pdlib.weights import (
    HF_CACHE_HELP,
    LoadedModel,
    bf16_exact,
    expected_shapes,
    layer_names,
    load_model,
    pack_bf16,
    synthetic_model,
)

TINY = PRESETS["tiny"]


def _bits(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).view(np.uint32)


def _is_bf16_exact(a: mx.array) -> bool:
    """bf16 is the top 16 bits of FP32: representable iff the low 16 bits are zero."""
    return bool(np.all(_bits(a) & 0xFFFF == 0))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(_bits(a[k]), _bits(b[k])) for k in a)


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path, monkeypatch):
    """No test may see (or depend on) a real Hugging Face cache."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture(scope="module")
def tiny0() -> LoadedModel:
    return synthetic_model("tiny", seed=0)


def _write_checkpoint(directory, weights: dict, cfg: ModelConfig = TINY, *, config=True):
    directory.mkdir(parents=True, exist_ok=True)
    if weights:
        mx.save_safetensors(str(directory / "model.safetensors"), dict(weights))
    if config:
        (directory / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return directory


# -- shapes ------------------------------------------------------------------------------------------


def test_expected_shapes_tiny():
    shapes = expected_shapes(TINY)
    assert len(shapes) == 2 + 11 * TINY.num_hidden_layers  # embed + final norm, 11 per layer; lm_head tied
    assert "lm_head.weight" not in shapes
    assert shapes["model.embed_tokens.weight"] == (512, 64)
    assert shapes["model.norm.weight"] == (64,)
    n = layer_names(2)
    assert shapes[n["wq"]] == (4 * 16, 64)
    assert shapes[n["wk"]] == shapes[n["wv"]] == (2 * 16, 64)
    assert shapes[n["wo"]] == (64, 4 * 16)
    assert shapes[n["q_norm"]] == shapes[n["k_norm"]] == (16,)
    assert shapes[n["w_gate"]] == shapes[n["w_up"]] == (128, 64)
    assert shapes[n["w_down"]] == (64, 128)
    assert n["wq"] == "model.layers.2.self_attn.q_proj.weight"


def test_expected_shapes_untied_adds_lm_head():
    cfg = ModelConfig(**{**TINY.to_dict(), "tie_word_embeddings": False})
    assert expected_shapes(cfg)["lm_head.weight"] == (512, 64)


# -- synthetic weights ---------------------------------------------------------------------------------


def test_synthetic_shapes_dtype_and_source(tiny0):
    assert tiny0.config == TINY
    assert {k: tuple(v.shape) for k, v in tiny0.weights.items()} == expected_shapes(TINY)
    assert all(v.dtype == mx.float32 for v in tiny0.weights.values())
    assert tiny0.source["source"] == "synthetic"
    assert tiny0.source["spec"] == "synthetic:tiny@0"
    assert (tiny0.source["preset"], tiny0.source["seed"]) == ("tiny", 0)
    assert tiny0.source["config"] == TINY.to_dict()
    assert tiny0.tokenizer is None


def test_synthetic_is_deterministic_per_seed(tiny0):
    assert _same(tiny0.weights, synthetic_model("tiny", seed=0).weights)
    other = synthetic_model("tiny", seed=1).weights
    assert other.keys() == tiny0.weights.keys()
    differ = [k for k in other if not np.array_equal(_bits(other[k]), _bits(tiny0.weights[k]))]
    assert differ == list(other), "every tensor should change with the seed"


def test_synthetic_values_are_bf16_exact_and_finite(tiny0):
    for name, w in tiny0.weights.items():
        assert _is_bf16_exact(w), name
        assert bool(mx.all(mx.isfinite(w)).item()), name
    # norms near but not at 1 (a swapped norm must show), final norm large (logits spread)
    n = layer_names(0)
    q_norm = np.array(tiny0.weights[n["q_norm"]])
    assert abs(q_norm.mean() - 1) < 0.1 and q_norm.std() > 0.01
    assert np.array(tiny0.weights["model.norm.weight"]).mean() > 10


def test_pack_bf16_accepts_synthetic_weights(tiny0):
    for name, w in tiny0.weights.items():
        p = pack_bf16(w, name=name)
        assert p.dtype == mx.bfloat16 and p.shape == w.shape
        assert np.array_equal(_bits(p), _bits(w)), name


def test_pack_bf16_rejects_non_representable_value_naming_the_weight(tiny0):
    w = mx.array(np.array([[0.5, 1 + 2**-12], [-2.0, 0.0]], dtype=np.float32))
    with pytest.raises(InputError) as e:
        pack_bf16(w, name="model.layers.0.mlp.up_proj.weight")
    msg = str(e.value)
    assert "model.layers.0.mlp.up_proj.weight" in msg
    assert "bf16" in msg and "--no-lossless-decode-weights" in msg
    assert "0.000244" in msg  # the rounding error, 2**-12


@settings(max_examples=40, deadline=None)
@given(
    arrays(
        np.float32,
        st.integers(1, 32),
        elements=st.floats(
            -(2.0**100), 2.0**100, allow_nan=False, allow_infinity=False, allow_subnormal=False, width=32
        ),
    )
)
def test_bf16_exact_output_always_packs(x):
    w = bf16_exact(x)
    assert w.dtype == mx.float32 and _is_bf16_exact(w)
    assert np.array_equal(_bits(pack_bf16(w, name="w")), _bits(w))
    # nearest rounding: never further than half a bf16 ulp (2**-8 relative)
    got = np.array(w).astype(np.float64)
    assert np.all(np.abs(got - x) <= np.abs(x.astype(np.float64)) * 2**-8)


# -- specs -------------------------------------------------------------------------------------------


def test_bare_preset_name_gives_synthetic_weights(tiny0):
    m = load_model("tiny")
    assert m.source["source"] == "synthetic" and m.source["spec"] == "synthetic:tiny@0"
    assert "fallback_from" not in m.source
    assert _same(m.weights, tiny0.weights)


def test_synthetic_spec_default_seed_and_explicit_seed(tiny0):
    assert _same(load_model("synthetic:tiny").weights, tiny0.weights)
    m = load_model("synthetic:tiny@7")
    assert m.source["seed"] == 7 and m.source["spec"] == "synthetic:tiny@7"
    assert _same(m.weights, synthetic_model("tiny", seed=7).weights)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("synthetic:nope", "unknown model preset 'nope'"),
        ("synthetic:tiny@x", "synthetic:PRESET[@SEED]"),
        ("synthetic:", "synthetic:PRESET[@SEED]"),
        ("no/such/dir/at/all", "neither a preset"),
    ],
)
def test_bad_specs_raise_input_error(spec, needle):
    with pytest.raises(InputError) as e:
        load_model(spec)
    assert needle in str(e.value)
    if "preset" in needle:
        assert "tiny" in str(e.value)  # names what would be accepted


def test_repo_id_not_in_cache_says_how_to_populate_it(empty_hf_cache):
    with pytest.raises(InputError) as e:
        load_model("Foo/Bar")
    msg = str(e.value)
    assert "'Foo/Bar'" in msg and "not in the local Hugging Face cache" in msg
    assert HF_CACHE_HELP in msg
    assert "huggingface-cli download" in msg and "HF_HOME" in msg
    assert str(empty_hf_cache) in msg


def test_preset_falls_back_to_synthetic_when_not_cached(monkeypatch):
    calls = []

    def stub(preset_name, *, seed=0):  # stands in for the 0.6B synthetic weights (too slow to build here)
        calls.append((preset_name, seed))
        return LoadedModel(PRESETS[preset_name], {}, {"spec": f"synthetic:{preset_name}@{seed}", "source": "synthetic"})

    monkeypatch.setattr(W, "synthetic_model", stub)
    m = load_model("qwen3-0.6b")
    assert calls == [("qwen3-0.6b", 0)]
    assert m.config == PRESETS["qwen3-0.6b"]
    assert m.source["source"] == "synthetic"
    assert "Qwen/Qwen3-0.6B" in m.source["fallback_from"]
    assert "not in the local Hugging Face cache" in m.source["fallback_from"]


def test_preset_uses_cached_checkpoint_when_present(tmp_path, monkeypatch, tiny0):
    """The other branch of the fallback: a preset whose repo is cached loads that checkpoint."""
    d = _write_checkpoint(tmp_path / "snapshots" / "abc123", tiny0.weights)
    monkeypatch.setitem(W.PRESET_REPOS, "tiny", "Local/Tiny")
    monkeypatch.setattr(W, "resolve_cached_repo", lambda repo: d if repo == "Local/Tiny" else None)
    monkeypatch.setattr(W, "synthetic_model", lambda *a, **k: pytest.fail("must not fall back"))
    m = load_model("tiny")
    assert m.source["source"] == "checkpoint"
    assert m.source["spec"] == "Local/Tiny" and m.source["revision"] == "abc123"
    assert "fallback_from" not in m.source
    assert _same(m.weights, tiny0.weights)


# -- checkpoint directories ----------------------------------------------------------------------------


def test_checkpoint_roundtrip_is_bit_identical(tmp_path, tiny0):
    d = _write_checkpoint(tmp_path / "ckpt", tiny0.weights)
    m = load_model(str(d))
    assert m.config == TINY
    assert _same(m.weights, tiny0.weights)
    assert all(v.dtype == mx.float32 for v in m.weights.values())
    assert m.source["source"] == "checkpoint"
    assert m.source["path"] == str(d.resolve()) and m.source["spec"] == str(d)
    assert m.source["config"] == TINY.to_dict()
    assert m.tokenizer is None


def _write_shards(d, tiny0, extra: dict):
    """Two shards, the first stored in bf16; `extra` tensors go into the second."""
    d.mkdir()
    names = sorted(tiny0.weights)
    half = len(names) // 2
    shard1 = {k: tiny0.weights[k].astype(mx.bfloat16) for k in names[:half]}
    shard2 = {**{k: tiny0.weights[k] for k in names[half:]}, **extra}
    mx.save_safetensors(str(d / "model-00001-of-00002.safetensors"), shard1)
    mx.save_safetensors(str(d / "model-00002-of-00002.safetensors"), shard2)
    (d / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    return d


def test_checkpoint_sharded_bf16_with_tied_head_copy(tmp_path, tiny0):
    """Shards merge; bf16 storage widens exactly to FP32; a tied lm_head equal to the embedding is accepted (and
    not kept: pdlib uses the embedding)."""
    embed = tiny0.weights["model.embed_tokens.weight"]
    d = _write_shards(tmp_path / "sharded", tiny0, {"lm_head.weight": embed.astype(mx.bfloat16)})
    m = load_model(str(d))
    assert _same(m.weights, tiny0.weights)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"lm_head.weight": "embed*2"}, "lm_head.weight differs from model.embed_tokens.weight"),
        ({"model.rotary_emb.inv_freq": mx.ones((8,))}, "tensor(s) that pdlib does not use: model.rotary_emb.inv_freq"),
        (
            {f"model.layers.{i}.self_attn.q_proj.bias": mx.ones((64,)) for i in range(3)} | {"x": mx.ones((1,))},
            "4 tensor(s) that pdlib does not use: model.layers.0.self_attn.q_proj.bias, model.layers.1",
        ),
    ],
)
def test_checkpoint_with_unused_tensors_is_refused_by_name(tmp_path, tiny0, extra, needle):
    """Nothing in a checkpoint is silently dropped: a tensor pdlib does not compute with is refused."""
    extra = {k: tiny0.weights["model.embed_tokens.weight"] * 2 if isinstance(v, str) else v for k, v in extra.items()}
    d = _write_shards(tmp_path / "extras", tiny0, extra)
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert needle in str(e.value) and str(d) in str(e.value) and "\n" not in str(e.value)


def test_checkpoint_tensor_stored_twice_is_refused(tmp_path, tiny0):
    name = layer_names(0)["wq"]
    d = _write_shards(tmp_path / "twice", tiny0, {name: tiny0.weights[name] * 2})
    with pytest.raises(InputError, match=f"tensor {name} is stored in more than one file"):
        load_model(str(d))


def test_checkpoint_config_with_nested_rope_parameters(tmp_path, tiny0):
    """transformers >= 5 writes rope_theta under rope_parameters."""
    hf = TINY.to_hf_dict()
    theta = hf.pop("rope_theta")
    hf["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    d = _write_checkpoint(tmp_path / "ckpt", tiny0.weights, config=False)
    (d / "config.json").write_text(json.dumps(hf))
    assert load_model(str(d)).config == TINY


def test_directory_without_config_json(tmp_path, tiny0):
    d = _write_checkpoint(tmp_path / "noconfig", tiny0.weights, config=False)
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert "config.json" in str(e.value) and "found config.json: False" in str(e.value)


def test_directory_without_safetensors(tmp_path):
    d = _write_checkpoint(tmp_path / "noweights", {}, config=True)
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert "safetensors files: 0" in str(e.value)


def test_checkpoint_with_wrong_shape_names_the_weight(tmp_path, tiny0):
    name = layer_names(1)["w_down"]
    bad = dict(tiny0.weights)
    bad[name] = bad[name].T
    d = _write_checkpoint(tmp_path / "wrongshape", bad)
    with pytest.raises(InputError) as e:
        load_model(str(d))
    msg = str(e.value)
    assert name in msg and "(128, 64)" in msg and "expected (64, 128)" in msg


def test_checkpoint_with_missing_weight_names_it(tmp_path, tiny0):
    name = layer_names(2)["k_norm"]
    d = _write_checkpoint(tmp_path / "missing", {k: v for k, v in tiny0.weights.items() if k != name})
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert name in str(e.value) and "missing" in str(e.value)


def test_checkpoint_config_missing_fields(tmp_path, tiny0):
    hf = TINY.to_hf_dict()
    del hf["intermediate_size"]
    d = _write_checkpoint(tmp_path / "badcfg", tiny0.weights, config=False)
    (d / "config.json").write_text(json.dumps(hf))
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert "intermediate_size" in str(e.value)


# -- broken checkpoint files: one InputError naming the file, before anything is loaded -----------------------


def _safetensors_bytes(tensors: dict, tmp_path) -> bytes:
    f = tmp_path / "scratch.safetensors"
    mx.save_safetensors(str(f), tensors)
    return f.read_bytes()


def _header_length(data: bytes) -> int:
    return int.from_bytes(data[:8], "little")


def _with_header(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def _broken(tmp_path, tiny0, name: str, make):
    """A good tiny checkpoint whose file `name` is replaced by make(original bytes)."""
    d = _write_checkpoint(tmp_path / "broken", tiny0.weights)
    original = (d / name).read_bytes()
    (d / name).write_bytes(make(original))
    return d


BROKEN = {
    "config cut in half": ("config.json", lambda b: b[: len(b) // 2], ["config.json", "not valid JSON", "truncated"]),
    "config empty": ("config.json", lambda b: b"", ["config.json", "is empty", "expected a JSON object"]),
    "config a list": ("config.json", lambda b: b"[1, 2]", ["config.json", "JSON array [1, 2]", "a JSON object"]),
    "config not utf-8": ("config.json", lambda b: b"\xff" + b, ["config.json", "not UTF-8"]),
    "config kv heads 0": (
        "config.json",
        lambda b: json.dumps({**json.loads(b), "num_key_value_heads": 0}).encode(),
        ["num_key_value_heads must be an integer >= 1, got 0"],
    ),
    "weights cut in half": (
        "model.safetensors",
        lambda b: b[: len(b) // 2],
        ["model.safetensors is truncated", "of the data section, which holds"],
    ),
    "weights cut in the header": (
        "model.safetensors",
        lambda b: b[: 8 + _header_length(b) // 2],
        ["model.safetensors is cut inside its header", "a truncated file"],
    ),
    "weights cut in the length": (
        "model.safetensors",
        lambda b: b[:5],
        ["cut short (5 bytes)", "8-byte header length"],
    ),
    "weights empty": ("model.safetensors", lambda b: b"", ["model.safetensors is empty (0 bytes)"]),
    "weights header not json": (
        "model.safetensors",
        lambda b: (4).to_bytes(8, "little") + b"{{{{" + b[8:],
        ["header that is not JSON", "data_offsets"],
    ),
    "weights header a list": ("model.safetensors", lambda b: _with_header([1]), ["JSON array for a header"]),
    "weights offsets too short": (
        "model.safetensors",
        lambda b: _with_header(
            {"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 8]}}, b"\0" * 8
        ),
        ["tensor model.norm.weight is F32 (64,) (256 bytes)", "span 8"],
    ),
    "weights malformed entry": (
        "model.safetensors",
        lambda b: _with_header({"model.norm.weight": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}),
        ["tensor model.norm.weight has the header entry", "sizes >= 0"],
    ),
    "weights fp8": (
        "model.safetensors",
        lambda b: _with_header(
            {"model.norm.weight": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4
        ),
        ["dtype 'F8_E4M3'", "reads F32, F16, BF16 only"],
    ),
    "tokenizer broken": ("tokenizer.json", lambda b: b"{", ["cannot load its tokenizer", "AutoTokenizer"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoint_file_is_one_input_error(tmp_path, tiny0, case, monkeypatch):
    """No tensor is read from a checkpoint whose files are broken: the error names the file and the fault."""
    name, make, needles = BROKEN[case]
    if name == "tokenizer.json":
        d = _write_checkpoint(tmp_path / "broken", tiny0.weights)
        (d / name).write_bytes(make(b""))
    else:
        d = _broken(tmp_path, tiny0, name, make)
    monkeypatch.setattr(W.mx, "load", lambda *a, **k: pytest.fail("a tensor was loaded"))
    with pytest.raises(InputError) as e:
        load_model(str(d))
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_config_with_more_layers_than_stored_is_refused_before_listing_them(tmp_path, tiny0):
    """A huge num_hidden_layers is refused by count, not by building a name for every layer."""
    d = _broken(
        tmp_path, tiny0, "config.json", lambda b: json.dumps({**json.loads(b), "num_hidden_layers": 10**9}).encode()
    )
    with pytest.raises(InputError, match=r"num_hidden_layers=1000000000 but the checkpoint stores 3 layer\(s\)"):
        load_model(str(d))


def test_sharded_index_naming_an_absent_shard_is_refused(tmp_path, tiny0):
    d = _write_shards(tmp_path / "sharded", tiny0, {})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in tiny0.weights}
    weight_map["model.norm.weight"] = "model-00002-of-00003.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(InputError, match="names shard model-00002-of-00003.safetensors, which is not in"):
        load_model(str(d))
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    with pytest.raises(InputError, match="index.json is not valid JSON"):
        load_model(str(d))


def test_sharded_index_and_metadata_of_a_whole_checkpoint_pass(tmp_path, tiny0):
    d = _write_shards(tmp_path / "sharded", tiny0, {})
    weight_map = {k: f.name for f in sorted(d.glob("*.safetensors")) for k in mx.load(str(f))}
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map})
    )
    assert _same(load_model(str(d)).weights, tiny0.weights)


CLI_CASES = [
    "config cut in half",
    "config a list",
    "config kv heads 0",
    "weights cut in half",
    "weights cut in the header",
    "weights empty",
]


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_broken_checkpoint_is_one_line_and_exit_2(tmp_path, tiny0, case, capsys):
    from pdlib.__main__ import main

    name, make, needles = BROKEN[case]
    d = _broken(tmp_path, tiny0, name, make)
    argv = ["validate", "--model", str(d), "--prompt-tokens", "24", "--output-tokens", "4", "--chunk-size", "8"]
    assert main([*argv, "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and needles[0] in err

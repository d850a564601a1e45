"""Checkpoints saved by transformers that pdlib does not implement are refused by name; with that refusal bypassed,
the gate still fails, because the reference is mlx-lm's own loader on the directory (not pdlib's reading of it).

Tiny models (hidden 64, 2 layers, vocab 512), built once per module with transformers on the CPU.
"""

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

import pdlib.config  # noqa: E402
import pdlib.weights  # noqa: E402
from pdlib.__main__ import main  # noqa: E402
from pdlib.config import ModelConfig, RunParams  # noqa: E402
from pdlib.errors import InputError  # noqa: E402
from pdlib.run.experiment import Experiment  # noqa: E402
from pdlib.run.reference import Reference  # noqa: E402
from pdlib.run.validate import ValidationError  # noqa: E402
from pdlib.weights import LoadedModel, load_model  # noqa: E402

SHAPES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
VARIANTS = {
    "plain": {},
    "bias": {"attention_bias": True},
    "yarn": {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 1e6,
            "original_max_position_embeddings": 1024,
        }
    },
    "sliding": {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
}


def _redraw(model, seed: int = 0) -> None:
    """HF's init (std 0.02, norms exactly 1) gives near-ties; draw projections ~ 1/sqrt(fan_in), norms near 1, a
    large final norm, biases that matter, all bf16-exact (so the lossless decode packing applies)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name == "model.norm.weight":
                p.copy_(4.0 / (p.shape[0] ** 0.5 * 0.02) + 0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def _save_qwen3(path, **options):
    options.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 1e6})
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPES, **options))
    _redraw(model)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """name -> checkpoint directory: the Qwen3 variants, one with an extra tensor, and a Qwen2."""
    root = tmp_path_factory.mktemp("hf_ckpts")
    dirs = {name: _save_qwen3(root / name, **json.loads(json.dumps(opts))) for name, opts in VARIANTS.items()}
    extra = shutil.copytree(dirs["plain"], root / "extra")
    tensors = mx.load(str(extra / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.bias"] = mx.ones((64,))
    mx.save_safetensors(str(extra / "model.safetensors"), tensors)
    dirs["extra"] = extra
    qwen2_shapes = {k: v for k, v in SHAPES.items() if k != "head_dim"}
    qwen2 = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**qwen2_shapes))
    qwen2.save_pretrained(str(root / "qwen2"))
    dirs["qwen2"] = root / "qwen2"
    return dirs


@pytest.fixture
def bypass(monkeypatch):
    """pdlib's refusals switched off: the loader then reads what it implements and drops the rest, as it used to."""
    monkeypatch.setattr(pdlib.config, "check_supported", lambda d: None)
    monkeypatch.setattr(pdlib.weights, "check_all_used", lambda *a, **k: None)


def _experiment(model_or_dir, *, policies=("chunked",)) -> Experiment:
    model = model_or_dir if isinstance(model_or_dir, LoadedModel) else load_model(str(model_or_dir))
    params = RunParams(
        model="unused",
        prompt_tokens=24,
        output_tokens=4,
        chunk_size=8,
        policies=policies,
        validation_checkpoint_every=2,
    )
    return Experiment(params, model=model)


# -- the loader refuses what it does not implement, by name --------------------------------------------------


@pytest.mark.parametrize(
    "name, needles",
    [
        ("bias", ["attention_bias=True"]),
        ("yarn", ["rope_parameters=", "'rope_type': 'yarn'", "'factor': 4.0"]),
        ("sliding", ["use_sliding_window=True", "sliding_window=16"]),
        ("extra", ["model.layers.0.self_attn.q_proj.bias", "does not use"]),
        ("qwen2", ["model_type='qwen2'"]),
    ],
)
def test_loader_refuses_unimplemented_options_by_name(ckpt, name, needles):
    with pytest.raises(InputError) as e:
        load_model(str(ckpt[name]))
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_cli_refusal_is_one_line_and_exit_2(ckpt, capsys):
    argv = [
        "validate",
        "--model",
        str(ckpt["yarn"]),
        "--prompt-tokens",
        "24",
        "--output-tokens",
        "4",
        "--chunk-size",
        "8",
        "--quiet",
    ]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and "rope_type': 'yarn'" in err


# -- the gate: built from the directory, it sees what pdlib would drop ----------------------------------------


def test_plain_transformers_checkpoint_loads_and_passes_the_gate(ckpt):
    model = load_model(str(ckpt["plain"]))
    assert model.config == ModelConfig(**SHAPES, rope_theta=1e6)
    exp = _experiment(model, policies=("eager", "chunked", "fifo"))
    results = exp.validate()
    assert all(r.passed for r in results.values())
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(exp._reference.model.parameters()))


def test_the_reference_reads_the_directory_not_pdlibs_arrays(ckpt):
    """Change pdlib's copy of one weight after loading: the checkpoint's reference must disagree."""
    model = load_model(str(ckpt["plain"]))
    model.weights["model.norm.weight"] = model.weights["model.norm.weight"] * 1.01
    with pytest.raises(ValidationError, match="logits check"):
        _experiment(model).validate()


def test_yarn_checkpoint_fails_the_gate_when_the_refusal_is_bypassed(ckpt, bypass):
    model = load_model(str(ckpt["yarn"]))
    assert model.config.rope_theta == 1e6  # pdlib read the base and dropped YaRN
    as_before = LoadedModel(model.config, model.weights, {**model.source, "source": "pdlib's view"})
    assert _experiment(as_before).validate()["chunked"].passed  # a reference built from pdlib's config agrees
    with pytest.raises(ValidationError) as e:
        _experiment(model).validate()
    assert "prefix_kv check" in str(e.value)


def test_bias_checkpoint_fails_the_gate_when_the_refusal_is_bypassed(ckpt, bypass):
    """mlx-lm's Qwen3 has no bias parameters and loads strictly: the reference refuses the checkpoint."""
    model = load_model(str(ckpt["bias"]))
    assert not any(k.endswith("bias") for k in model.weights)  # pdlib dropped them
    as_before = LoadedModel(model.config, model.weights, {**model.source, "source": "pdlib's view"})
    assert _experiment(as_before).validate()["chunked"].passed
    with pytest.raises(InputError) as e:
        _experiment(model).validate()
    msg = str(e.value)
    assert "mlx-lm" in msg and "cannot load checkpoint" in msg and "self_attn.q_proj.bias" in msg
    assert "\n" not in msg


def test_reference_that_mlx_lm_cannot_load_is_an_error_not_a_fallback(ckpt, tmp_path):
    """pdlib reads any *.safetensors; mlx-lm only model*.safetensors: the reference says so instead of guessing."""
    d = shutil.copytree(ckpt["plain"], tmp_path / "renamed")
    (d / "model.safetensors").rename(d / "weights.safetensors")
    model = load_model(str(d))
    with pytest.raises(InputError, match="cannot load checkpoint .*FileNotFoundError"):
        Reference(model)

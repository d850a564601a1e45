"""Cross-check pdlib's engine against an implementation nobody here wrote: transformers' Qwen3ForCausalLM
(PyTorch, CPU, FP32, eager attention), saved as a Hugging Face checkpoint and loaded by pdlib from disk.

Covers the whole path: HF config.json -> ModelConfig, safetensors names -> pdlib weights, prefill chunks,
bf16-packed (or FP32) decode, greedy tokens and every logits row at the validation tolerance.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mlx.core as mx  # noqa: E402

from pdlib.config import PRESETS  # noqa: E402
from pdlib.engine import Engine  # noqa: E402
from pdlib.prompts import make_prompts  # noqa: E402
from pdlib.weights import expected_shapes, load_model  # noqa: E402

RTOL = ATOL = 1e-3
PROMPT_TOKENS = 40
NEW_TOKENS = 12
CHUNK = 16
SEED = 6  # a seed whose 12-token greedy run visits 6 distinct tokens with margins > 0.3


def _bf16(t: "torch.Tensor") -> "torch.Tensor":
    return t.to(torch.bfloat16).to(torch.float32)


def _hf_model():
    """A seeded, random transformers Qwen3 with the `tiny` preset's shapes; every parameter bf16-exact."""
    tiny = PRESETS["tiny"]
    hf_cfg = transformers.Qwen3Config(
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_hidden_layers,
        num_attention_heads=tiny.num_attention_heads,
        num_key_value_heads=tiny.num_key_value_heads,
        head_dim=tiny.head_dim,
        intermediate_size=tiny.intermediate_size,
        vocab_size=tiny.vocab_size,
        max_position_embeddings=tiny.max_position_embeddings,
        rope_theta=tiny.rope_theta,
        rms_norm_eps=tiny.rms_norm_eps,
        tie_word_embeddings=True,
        torch_dtype="float32",
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    # HF's default init (std 0.02 everywhere, norms exactly 1) leaves the residual stream dominated by the
    # tied embedding, so greedy would mostly echo the input token. Re-draw: projections ~ 1/sqrt(fan_in),
    # norms near (not at) 1 so a swapped norm shows, and a large final norm so logits spread over units.
    g = torch.Generator().manual_seed(SEED)
    D, emb_std = tiny.hidden_size, 0.02
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * emb_std)
            elif name == "model.norm.weight":
                p.copy_(4.0 / (D**0.5 * emb_std) + 0.05 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                scale = 0.5 if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * (scale / p.shape[1] ** 0.5))
        for p in model.parameters():
            p.data = _bf16(p.data)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    return model


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    model = _hf_model()
    path = tmp_path_factory.mktemp("hf_qwen3_tiny")
    model.save_pretrained(str(path), safe_serialization=True)
    return model, path


@pytest.fixture(scope="module")
def prompt_ids():
    ids = list(make_prompts(n_tokens=PROMPT_TOKENS, vocab_size=PRESETS["tiny"].vocab_size)["A"].token_ids)
    assert len(ids) == PROMPT_TOKENS and all(0 <= i < 256 for i in ids)
    return ids


@pytest.fixture(scope="module")
def hf_greedy(hf_checkpoint, prompt_ids):
    """transformers' greedy continuation: a full-sequence forward per step (no KV cache involved), the last
    position's logits each step. Output 0 is the prompt's own; NEW_TOKENS outputs in all."""
    model, _ = hf_checkpoint
    ids = list(prompt_ids)
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            out = model(torch.tensor([ids]), use_cache=False).logits[0, -1].to(torch.float32).numpy()
            t = int(out.argmax())
            tokens.append(t)
            logits.append(out.copy())
            ids.append(t)
    return tokens, np.stack(logits)


@pytest.fixture(scope="module")
def loaded(hf_checkpoint):
    _, path = hf_checkpoint
    return load_model(str(path))


def test_hf_checkpoint_loads_as_tiny_preset(loaded, hf_checkpoint):
    model, path = hf_checkpoint
    tiny = PRESETS["tiny"]
    assert loaded.config == tiny
    assert loaded.source["source"] == "checkpoint"
    assert loaded.tokenizer is None  # no tokenizer files were saved: prompts use the byte mapping
    assert {k: tuple(v.shape) for k, v in loaded.weights.items()} == expected_shapes(tiny)
    # pdlib holds the very values transformers computes with (names map one to one, tied head dropped)
    hf_params = dict(model.named_parameters())
    for name, w in loaded.weights.items():
        assert w.dtype == mx.float32
        np.testing.assert_array_equal(np.array(w), hf_params[name].detach().numpy(), err_msg=name)


def test_hf_greedy_is_not_degenerate(hf_greedy):
    """The cross-check is only meaningful if greedy picks differ and have clear margins."""
    tokens, logits = hf_greedy
    assert len(set(tokens)) >= 3, tokens
    assert logits.std(axis=1).min() > 0.5
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 0.05, "a near-tie would make the token check flaky"


@pytest.mark.parametrize("lossless", [True, False], ids=["bf16-decode", "fp32-decode"])
def test_engine_matches_transformers(loaded, prompt_ids, hf_greedy, lossless):
    ref_tokens, ref_logits = hf_greedy
    engine = Engine(loaded, capacity=PROMPT_TOKENS + NEW_TOKENS + 4, lossless_decode_weights=lossless)
    engine.add_request("A", prompt_ids)
    engine.reset("A", logical=False)

    outs = []
    done = 0
    while done < PROMPT_TOKENS:
        n = min(CHUNK, PROMPT_TOKENS - done)
        out = engine.prefill_chunk("A", n)
        done += n
        if done < PROMPT_TOKENS:
            assert out is None
    assert out is not None
    outs.append(out)
    for _ in range(NEW_TOKENS - 1):
        outs.append(engine.decode("A"))
    assert engine.requests["A"].length == PROMPT_TOKENS + NEW_TOKENS - 1

    tokens = [int(o.token.item()) for o in outs]
    logits = np.stack([np.array(o.logits) for o in outs])
    assert logits.shape == ref_logits.shape == (NEW_TOKENS, PRESETS["tiny"].vocab_size)
    assert tokens == ref_tokens
    for i, (row, ref) in enumerate(zip(logits, ref_logits)):
        err = np.abs(row - ref)
        assert np.allclose(row, ref, rtol=RTOL, atol=ATOL), (
            f"output {i}: worst |x-ref| {err.max():.3g} at vocab id {int(err.argmax())}"
        )

"""Weights: a local Hugging Face checkpoint or seeded synthetic ones, plus the bf16 packing for decode.

    model = load_model("synthetic:tiny@0")       # or "Qwen/Qwen3-0.6B" (local HF cache only) or a directory
    model.config, model.weights["model.norm.weight"], model.source

Weights use the Hugging Face / mlx-lm names, in FP32. A checkpoint must be exactly what pdlib runs: a config
option or a tensor it does not implement is refused by name, never dropped, since the reference loads the same
directory with mlx-lm's own loader and would otherwise compute a different model.
"""

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from pdlib.checkpoint import check_safetensors_files, read_json_object
from pdlib.config import PRESETS, ModelConfig, preset
from pdlib.errors import INT64_MAX, InputError

HF_CACHE_HELP = (
    "populate the cache on a machine with network (`huggingface-cli download REPO`), copy "
    "~/.cache/huggingface here (or set HF_HOME), or pass a directory holding config.json and "
    "*.safetensors; or use synthetic weights: --model synthetic:qwen3-0.6b"
)


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, mx.array]  # HF names -> FP32 arrays
    source: dict  # what was loaded, for the report
    tokenizer: object | None = field(default=None, repr=False)


def layer_names(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    return {
        k: p + v
        for k, v in {
            "wq": "self_attn.q_proj.weight",
            "wk": "self_attn.k_proj.weight",
            "wv": "self_attn.v_proj.weight",
            "wo": "self_attn.o_proj.weight",
            "q_norm": "self_attn.q_norm.weight",
            "k_norm": "self_attn.k_norm.weight",
            "in_norm": "input_layernorm.weight",
            "post_norm": "post_attention_layernorm.weight",
            "w_gate": "mlp.gate_proj.weight",
            "w_up": "mlp.up_proj.weight",
            "w_down": "mlp.down_proj.weight",
        }.items()
    }


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    D, F, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = {
        "wq": (Hq * Dh, D),
        "wk": (Hkv * Dh, D),
        "wv": (Hkv * Dh, D),
        "wo": (D, Hq * Dh),
        "q_norm": (Dh,),
        "k_norm": (Dh,),
        "in_norm": (D,),
        "post_norm": (D,),
        "w_gate": (F, D),
        "w_up": (F, D),
        "w_down": (D, F),
    }
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, D)
    for i in range(cfg.num_hidden_layers):
        shapes.update({name: per_layer[k] for k, name in layer_names(i).items()})
    return shapes


PRESET_REPOS = {"qwen3-0.6b": "Qwen/Qwen3-0.6B"}


def load_model(spec: str) -> LoadedModel:
    """`synthetic:PRESET[@SEED]`, a directory with config.json + *.safetensors, a HF repo id that is already in
    the local cache (never downloaded), or a bare preset name: its real checkpoint when cached, otherwise
    synthetic weights of the same shapes (the source records which)."""
    if spec in PRESETS:
        repo = PRESET_REPOS.get(spec)
        if repo is None:
            return synthetic_model(spec)
        try:
            directory = resolve_cached_repo(repo)
        except InputError:  # only a missing checkpoint falls back; a broken one is an error
            model = synthetic_model(spec)
            model.source["fallback_from"] = f"{repo} (not in the local Hugging Face cache)"
            return model
        return checkpoint_model(directory, spec=repo, revision=directory.name)
    if spec.startswith("synthetic:"):
        m = re.fullmatch(r"synthetic:([\w.\-]+)(?:@([0-9]+))?", spec, flags=re.ASCII)  # @٣ is no seed
        if not m or m.group(2) and int(m.group(2)) > INT64_MAX:
            raise InputError(
                f"bad model spec {spec!r}; expected synthetic:PRESET[@SEED] (SEED 0 to 2^63 - 1), e.g. synthetic:tiny@0"
            )
        return synthetic_model(m.group(1), seed=int(m.group(2) or 0))
    path = Path(spec).expanduser()
    if path.is_dir():
        return checkpoint_model(path, spec=spec, revision=None)
    if re.fullmatch(r"[\w.\-]+/[\w.\-]+", spec):
        directory = resolve_cached_repo(spec)
        return checkpoint_model(directory, spec=spec, revision=directory.name)
    raise InputError(
        f"model {spec!r} is neither a preset ({', '.join(PRESETS)}), synthetic:PRESET[@SEED], "
        f"an existing directory, nor a Hugging Face repo id (owner/name)"
    )


def resolve_cached_repo(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        return Path(
            snapshot_download(
                repo_id, local_files_only=True, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]
            )
        )
    except Exception:
        raise InputError(
            f"checkpoint {repo_id!r} is not in the local Hugging Face cache ({HF_CACHE_HELP}; looked in {HF_HUB_CACHE})"
        ) from None


def checkpoint_model(directory: Path, *, spec: str, revision: str | None) -> LoadedModel:
    config_path = directory / "config.json"
    files = sorted(directory.glob("*.safetensors"))
    if not config_path.is_file() or not files:
        raise InputError(
            f"checkpoint directory {str(directory)!r} needs config.json and *.safetensors "
            f"(found config.json: {config_path.is_file()}, safetensors files: {len(files)})"
        )
    # Everything is checked before a tensor is read: a broken file fails here, not inside MLX's loader
    cfg = ModelConfig.from_hf_dict(read_json_object(config_path))
    check_safetensors_files(directory, files)
    tokenizer = load_tokenizer(directory)
    tensors = read_tensors(files, where=str(directory))
    check_layer_count(cfg, tensors, where=str(directory))
    check_shapes(cfg, tensors, where=str(directory))
    check_all_used(cfg, tensors, where=str(directory))
    weights = {k: tensors[k].astype(mx.float32) for k in expected_shapes(cfg)}
    source = {
        "spec": spec,
        "source": "checkpoint",
        "path": str(directory.resolve()),
        "revision": revision,
        "preset": None,
        "seed": None,
        "config": cfg.to_dict(),
    }
    return LoadedModel(cfg, weights, source, tokenizer=tokenizer)


def load_tokenizer(directory: Path):
    """The checkpoint's own tokenizer when it ships one; None means prompts use the byte mapping."""
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as e:  # tokenizers and transformers raise many types for a broken file
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(
            f"{directory}: cannot load its tokenizer ({type(e).__name__}: {first}); a checkpoint's tokenizer.json "
            f"and tokenizer_config.json must load with transformers' AutoTokenizer, or be absent (byte prompts)"
        ) from None


def read_tensors(files: list[Path], *, where: str) -> dict[str, mx.array]:
    """Every tensor of every shard; a name stored twice is refused, since only one copy could be used."""
    tensors = {}
    for f in files:
        try:
            shard = mx.load(str(f))
        except (RuntimeError, ValueError) as e:  # past the header checks: a fault they do not foresee
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise InputError(f"{where}: MLX cannot load {f.name} ({first})") from None
        twice = sorted(tensors.keys() & shard.keys())
        if twice:
            raise InputError(f"{where}: tensor {twice[0]} is stored in more than one file (again in {f.name})")
        tensors.update(shard)
    return tensors


def check_layer_count(cfg: ModelConfig, tensors: dict, *, where: str) -> None:
    """num_hidden_layers against the layers stored, before `expected_shapes` lists every layer's names."""
    stored = {int(m.group(1)) for k in tensors if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    if cfg.num_hidden_layers > len(stored):
        raise InputError(
            f"{where}: config.json sets num_hidden_layers={cfg.num_hidden_layers} but the checkpoint stores "
            f"{len(stored)} layer(s); expected the two to match"
        )


def check_all_used(cfg: ModelConfig, tensors: dict, *, where: str) -> None:
    """Refuse any tensor pdlib does not compute with (a bias, a buffer, an adapter, a quantization scale): dropping
    it would run a different model than the checkpoint's. Call after `check_shapes`."""
    unused = sorted(tensors.keys() - expected_shapes(cfg).keys())
    # A tied checkpoint may store the head too: accepted (and dropped) only when it is the embedding, bit for bit;
    # mlx-lm drops it whatever it holds, and which copy transformers would use is not obvious.
    if cfg.tie_word_embeddings and "lm_head.weight" in unused:
        head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
        if head.shape != embed.shape or not mx.array_equal(head.astype(mx.float32), embed.astype(mx.float32)).item():
            raise InputError(
                f"{where}: tie_word_embeddings is true but the checkpoint's lm_head.weight differs from "
                f"model.embed_tokens.weight; pdlib would use the embedding"
            )
        unused.remove("lm_head.weight")
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise InputError(f"{where}: {len(unused)} tensor(s) that pdlib does not use: {', '.join(unused[:3])}{more}")


def check_shapes(cfg: ModelConfig, weights: dict, *, where: str) -> None:
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise InputError(f"{where}: weight {name} is missing")
        if tuple(weights[name].shape) != shape:
            raise InputError(f"{where}: weight {name} has shape {tuple(weights[name].shape)}, expected {shape}")


def synthetic_model(preset_name: str, *, seed: int = 0, layers: int | None = None) -> LoadedModel:
    """Seeded weights with the preset's shapes. Every value is exactly representable in bf16 (so packing is
    lossless) and the final norm is scaled so logits spread over ~4 units: greedy picks have clear margins.
    `layers`: fewer layers than the preset's (check-kernels' small engines); the source records them."""
    cfg = preset(preset_name)
    if layers is not None:
        cfg = replace(cfg, num_hidden_layers=layers)
    rng = np.random.default_rng(seed)
    D = cfg.hidden_size
    emb_std = 0.02

    def normal(shape, std, mean=0.0):
        return bf16_exact(rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean))

    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if name == "model.embed_tokens.weight" or name == "lm_head.weight":
            weights[name] = normal(shape, emb_std)
        elif name == "model.norm.weight":
            weights[name] = normal(shape, 0.05, mean=4.0 / (math.sqrt(D) * emb_std))
        elif len(shape) == 1:  # per-layer norms: near 1, but not 1, so a swapped norm is visible
            weights[name] = normal(shape, 0.1, mean=1.0)
        else:
            fan_in = shape[1]
            scale = 0.5 if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
            weights[name] = normal(shape, scale / math.sqrt(fan_in))
    source = {
        "spec": f"synthetic:{preset_name}@{seed}" + ("" if layers is None else f" ({layers} layers)"),
        "source": "synthetic",
        "path": None,
        "revision": None,
        "preset": preset_name,
        "seed": seed,
        "config": cfg.to_dict(),
    }
    return LoadedModel(cfg, weights, source)


def bf16_exact(x: np.ndarray) -> mx.array:
    """Round FP32 values to the nearest bf16 value, kept in FP32."""
    return mx.array(x).astype(mx.bfloat16).astype(mx.float32)


def pack_bf16(w: mx.array, *, name: str) -> mx.array:
    """A bf16 copy that is bit-exact to the FP32 weight, or a clear error: packing must be lossless."""
    packed = w.astype(mx.bfloat16)
    if not mx.array_equal(packed.astype(mx.float32), w).item():
        err = mx.max(mx.abs(packed.astype(mx.float32) - w)).item()
        raise InputError(
            f"weight {name} is not exactly representable in bf16 (max rounding error {err:.3g}); "
            f"run with --no-lossless-decode-weights"
        )
    return packed

"""Model presets: the Qwen3 shapes pdlib runs, as one small dataclass.

    from pdlib.config import preset
    cfg = preset("qwen3-0.6b")          # or "tiny" for fast CPU tests
"""

from dataclasses import asdict, dataclass, fields

from pdlib.errors import InputError


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise InputError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_hf_dict(self) -> dict:
        """The Hugging Face / mlx-lm config.json view (what the reference model is built from)."""
        return {"model_type": "qwen3", **asdict(self)}

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        if d.get("rope_theta") is None:  # transformers >= 5 nests it under rope_parameters
            d["rope_theta"] = (d.get("rope_parameters") or {}).get("rope_theta", 1e6)
        d.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        d.setdefault("tie_word_embeddings", False)
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names if n not in d)
        if missing:
            raise InputError(f"checkpoint config.json lacks {', '.join(missing)}")
        return cls(**{k: d[k] for k in names})


PRESETS = {
    "qwen3-0.6b": ModelConfig(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                              num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                              vocab_size=151936, max_position_embeddings=40960),
    # Same structure (GQA 2:1, q/k-norm, tied embeddings), small enough for CPU tests in seconds.
    "tiny": ModelConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=128,
                        vocab_size=512, max_position_embeddings=4096),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise InputError(f"unknown model preset {name!r}; expected one of: {', '.join(PRESETS)}")
    return PRESETS[name]

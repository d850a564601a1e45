"""Model presets: the Qwen3 shapes pdlib runs, as one small dataclass.

from pdlib.config import preset
cfg = preset("qwen3-0.6b")          # or "tiny" for fast CPU tests
"""

from dataclasses import asdict, dataclass, fields

from pdlib.errors import INT_MAX, InputError, check_int, is_finite

POLICY_ALIASES = {"slo": "slo-chunked"}
PEER_SYSTEM = "mlx-lm"  # a peer: a system timed beside the policies on the same workload, never gated
PEER_DTYPES = ("fp32", "bf16")


# Sizes, head counts and the layer count: each an integer >= 1
SIZE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


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
        for name in SIZE_FIELDS:
            check_int(name, getattr(self, name), 1)
        if self.head_dim % 2:  # RoPE rotates the two halves of each head
            raise InputError(f"head_dim must be an even integer, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise InputError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; each key/value head serves a whole group of heads"
            )
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not (is_finite(value) and value > 0):
                raise InputError(f"{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise InputError(f"tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_hf_dict(self) -> dict:
        """The Hugging Face / mlx-lm config.json view (what the reference model is built from)."""
        return {"model_type": "qwen3", **asdict(self)}

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        """A Qwen3 config.json (transformers 4.x or 5.x layout); every option pdlib does not implement is refused
        by name (`check_supported`), and values transformers would default differently are required."""
        if not isinstance(d, dict):
            raise InputError(f"checkpoint config.json holds {d!r:.60}; expected an object of option: value")
        check_supported(d)
        d = dict(d, rope_theta=rope_theta(d))
        d.setdefault("tie_word_embeddings", False)  # transformers' Qwen3Config default
        # head_dim is required: transformers defaults it to 128, not hidden_size // heads
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names if n not in d)
        if missing:
            raise InputError(f"checkpoint config.json lacks {', '.join(missing)}")
        try:
            return cls(**{k: d[k] for k in names})
        except InputError as e:
            raise InputError(f"checkpoint config.json: {e}") from None


def _refuse(option: str, value, note: str):
    raise InputError(f"checkpoint config.json sets {option}={value!r}, which pdlib does not implement ({note})")


def rope_dicts(d: dict) -> list[tuple[str, dict]]:
    """Every RoPE settings dict in a config: legacy `rope_scaling`, transformers 5's `rope_parameters`, and the
    per-layer-type dicts that either may nest."""
    out = []
    for key in ("rope_scaling", "rope_parameters"):
        r = d.get(key)
        if r is None:
            continue
        if not isinstance(r, dict):
            _refuse(key, r, "a mapping with rope_type 'default' only")
        nested = {k: v for k, v in r.items() if isinstance(v, dict)}
        out += [(f"{key}.{k}", v) for k, v in nested.items()] if nested else [(key, r)]
    return out


def rope_theta(d: dict) -> float:
    """The one RoPE base: top-level or under rope_parameters; missing or conflicting values are refused (transformers
    would default to 1e4, mlx-lm refuses, so guessing would run a different model)."""
    found = [("rope_theta", d.get("rope_theta"))] + [(f"{k}.rope_theta", r.get("rope_theta")) for k, r in rope_dicts(d)]
    for where, value in found:  # checked here, since a list or a string would not hash or sort with the rest
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"checkpoint config.json sets {where}={value!r}; expected a number")
    thetas = {value for _, value in found if value is not None}
    if not thetas:
        raise InputError("checkpoint config.json lacks rope_theta (neither top-level nor under rope_parameters)")
    if len(thetas) > 1:
        raise InputError(f"checkpoint config.json has conflicting rope_theta values {sorted(thetas)}")
    return thetas.pop()


def check_supported(d: dict) -> None:
    """Refuse, by name, each config.json option that changes a Qwen3's outputs (as transformers 5.x or mlx-lm read
    it) and that pdlib's engine does not implement. Keys that change nothing at inference pass: dtype (pdlib
    computes in FP32), attention_dropout (off in eval), token ids, initializer_range, use_cache, max_window_layers
    (only with sliding windows)."""
    if d.get("model_type") != "qwen3":
        _refuse("model_type", d.get("model_type"), "qwen3 only")
    if d.get("attention_bias"):
        _refuse("attention_bias", d["attention_bias"], "attention projections without bias only")
    if d.get("hidden_act", "silu") != "silu":
        _refuse("hidden_act", d["hidden_act"], "silu only")
    if d.get("use_sliding_window"):
        _refuse(
            "use_sliding_window",
            d["use_sliding_window"],
            f"sliding_window={d.get('sliding_window')!r}; pdlib runs full attention in every layer",
        )
    layer_types = d.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types)
    ):
        _refuse("layer_types", layer_types, "a list of 'full_attention', one per layer")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        _refuse("layer_types", sorted(set(layer_types)), "full_attention in every layer only")
    for where, r in rope_dicts(d):
        kind = r.get("rope_type") or r.get("type") or "default"
        if kind != "default":
            _refuse(where, r, "rope_type 'default' only")
        if r.get("partial_rotary_factor", 1.0) not in (None, 1.0):
            _refuse(f"{where}.partial_rotary_factor", r["partial_rotary_factor"], "RoPE over the whole head only")
    if d.get("partial_rotary_factor", 1.0) not in (None, 1.0):
        _refuse("partial_rotary_factor", d["partial_rotary_factor"], "RoPE over the whole head only")
    for key in ("quantization", "quantization_config", "model_file"):  # mlx-lm would quantize or run custom code
        if d.get(key) is not None:
            _refuse(key, d[key], "unquantized weights, stock Qwen3 code only")


PRESETS = {
    "qwen3-0.6b": ModelConfig(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        max_position_embeddings=40960,
    ),
    # Same structure (GQA 2:1, q/k-norm, tied embeddings), small enough for CPU tests in seconds.
    "tiny": ModelConfig(
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=4096,
    ),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise InputError(f"unknown model preset {name!r}; expected one of: {', '.join(PRESETS)}")
    return PRESETS[name]


# -- run parameters: one schema for the CLI, the params/*.yaml files and the notebooks ----------------


def peer_name(dtype: str, prefill_step_size: int) -> str:
    return f"{PEER_SYSTEM}-{dtype}@{prefill_step_size}"


def parse_peer(spec, chunk_size: int) -> tuple[str, int]:
    """(dtype, prefill_step_size) of a peer's spelling, `mlx-lm-<dtype>@<prefill_step_size>` (dtype fp32 or
    bf16, the size a positive integer or `chunk`: the params' chunk_size), or InputError, one line."""
    expected = f"expected {PEER_SYSTEM}-<{'|'.join(PEER_DTYPES)}>@<prefill_step_size|chunk>, e.g. mlx-lm-fp32@2048"
    head, _, size = spec.partition("@") if isinstance(spec, str) else ("", "", "")
    system, _, dtype = head.rpartition("-")
    if system != PEER_SYSTEM or dtype not in PEER_DTYPES or not (size == "chunk" or size.isascii() and size.isdigit()):
        raise InputError(f"peers: unknown peer {spec!r}; {expected}")
    step = chunk_size if size == "chunk" else int(size)
    if not 1 <= step <= INT_MAX:
        raise InputError(f"peers: {spec!r} needs a prefill_step_size in [1, {INT_MAX}]")
    return dtype, step


_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


@dataclass(frozen=True)
class RunParams:
    model: str = "qwen3-0.6b"  # preset (local checkpoint if cached, else synthetic), repo id, dir
    prompt_tokens: int = 4096
    output_tokens: int = 1024
    chunk_size: int = 128
    policies: tuple[str, ...] = ("eager", "chunked")
    trials: int = 5
    warmups: int = 1
    logical_cache_reset: bool = False
    lossless_decode_weights: bool = True
    validation_checkpoint_every: int = 64
    stall_threshold_ms: float = 100.0
    tbt_slo_ms: float | None = None  # A's gap target for the slo policies; None: 5x decode (pdlib/run/slo.py)
    pipeline_decodes: bool = True  # issue a step of decodes before the one before it is observed (executor.py)
    poll_during_chunks: bool = True  # with them, issue a prompt chunk at once and poll the decodes ahead (ditto)
    peers: tuple[str, ...] = ()  # mlx-lm's BatchGenerator timed beside the policies, e.g. mlx-lm-fp32@2048

    def __post_init__(self):
        if not isinstance(self.policies, (list, tuple)) or not all(isinstance(p, str) for p in self.policies):
            raise InputError(f"policies must be a list of policy names, got {self.policies!r}")
        # `slo` is short for slo-chunked (pdlib/run/slo.py)
        object.__setattr__(self, "policies", tuple(POLICY_ALIASES.get(p, p) for p in self.policies))
        for name in ("prompt_tokens", "chunk_size", "trials", "validation_checkpoint_every"):
            check_int(name, getattr(self, name), 1)
        check_int("output_tokens", self.output_tokens, 2)  # A's first output is untimed: it needs a second
        check_int("warmups", self.warmups, 0)
        for name in ("logical_cache_reset", "lossless_decode_weights", "pipeline_decodes", "poll_during_chunks"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.model, str) or not self.model:
            raise InputError(f"model must be a non-empty string, got {self.model!r}")
        if not (is_finite(self.stall_threshold_ms) and self.stall_threshold_ms > 0):
            raise InputError(f"stall_threshold_ms must be a finite number > 0, got {self.stall_threshold_ms!r:.60}")
        from pdlib.scheduler import POLICIES  # pure logic, no MLX

        if not self.policies:
            raise InputError("policies must name at least one of: " + ", ".join(POLICIES))
        for p in self.policies:
            if p not in POLICIES:
                raise InputError(f"policies: unknown policy {p!r}; expected one of: {', '.join(POLICIES)}")
        if len(set(self.policies)) != len(self.policies):
            raise InputError(f"policies must not repeat, got {' '.join(self.policies)}")
        if not isinstance(self.peers, (list, tuple)):
            raise InputError(f"peers must be a list like [mlx-lm-fp32@2048, mlx-lm-bf16@chunk], got {self.peers!r}")
        object.__setattr__(self, "peers", tuple(self.peers))
        names = [peer_name(*self.peer_config(p)) for p in self.peers]
        if len(set(names)) != len(names):
            raise InputError(f"peers must not repeat (chunk is {self.chunk_size}), got {' '.join(self.peers)}")
        if self.tbt_slo_ms is not None and not (is_finite(self.tbt_slo_ms) and self.tbt_slo_ms > 0):
            raise InputError(f"tbt_slo_ms must be a finite number > 0, got {self.tbt_slo_ms!r:.60}")

    def peer_config(self, spec: str) -> tuple[str, int]:
        """(dtype, prefill_step_size) of one of `peers`."""
        return parse_peer(spec, self.chunk_size)

    def check_positions(self, cfg: ModelConfig) -> None:
        if self.prompt_tokens + self.output_tokens > cfg.max_position_embeddings:
            raise InputError(
                f"prompt_tokens + output_tokens = {self.prompt_tokens + self.output_tokens} exceeds "
                f"the model's {cfg.max_position_embeddings} positions"
            )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["policies"] = list(self.policies)
        d["peers"] = list(self.peers)
        return d

    @classmethod
    def from_yaml(cls, path, **overrides) -> "RunParams":
        """Read a params file (keys = field names); `overrides` (e.g. from CLI flags) win."""
        from pdlib.params_file import read_yaml

        data = read_yaml(path)
        known = {f.name for f in fields(cls)}
        accepted = f"accepted: {', '.join(sorted(known))}"
        # Refused rather than run: every default is the full workload, minutes to hours of device time
        if data is None or data == {}:
            raise InputError(
                f"params file {str(path)!r} is empty; it must set at least one parameter ({accepted}), "
                f"or leave out --params to run the defaults"
            )
        if not isinstance(data, dict):
            raise InputError(
                f"params file {str(path)!r} holds {_KINDS.get(type(data), type(data).__name__)} {data!r:.60}; "
                f"it must hold a mapping of parameter: value ({accepted})"
            )
        odd = [k for k in data if not isinstance(k, str)]
        if odd:
            raise InputError(
                f"params file {str(path)!r} has key {odd[0]!r} of type {type(odd[0]).__name__}; keys are parameter "
                f"names ({accepted})"
            )
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"params file {str(path)!r} has unknown key(s) {', '.join(unknown)}; {accepted}")
        return cls(**{**data, **overrides})

"""The reference: mlx-lm's own Qwen3 model class, unmodified, in FP32, loaded with the very same weights.

    ref = Reference(load_model("synthetic:tiny"))
    stream = ref.stream(prompt_ids)          # whole-prompt prefill; stream.logits is the first output's
    stream.kv(layer)                         # K, V (Hkv, length, Dh) after RoPE, like pdlib's cache
    stream.step()                            # feed the last greedy token: new logits + one K/V slot

On CUDA it must run with TF32 disabled (MLX_ENABLE_TF32=0, set before MLX initialises); `Reference`
refuses otherwise, since TF32 matmuls are ~1e-3 off and would fail the gate for the wrong reason.
"""

import os

import mlx.core as mx
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3 import Model, ModelArgs

from pdlib.errors import InputError
from pdlib.weights import LoadedModel


class Reference:
    def __init__(self, model: LoadedModel):
        if mx.cuda.is_available() and os.environ.get("MLX_ENABLE_TF32") != "0":
            raise InputError("the FP32 reference needs TF32 off on CUDA: export MLX_ENABLE_TF32=0 before starting")
        self.config = model.config
        self.model = Model(ModelArgs.from_dict(model.config.to_hf_dict()))
        self.model.load_weights(list(model.weights.items()), strict=True)
        self.model.eval()

    def stream(self, prompt_ids) -> "ReferenceStream":
        return ReferenceStream(self, prompt_ids)


class ReferenceStream:
    """One request's greedy continuation under the reference model, advanced one output at a time."""

    def __init__(self, ref: Reference, prompt_ids):
        self.model = ref.model
        self.cache = [KVCache() for _ in range(ref.config.num_hidden_layers)]
        prompt = mx.array(list(prompt_ids), dtype=mx.int32)
        self.logits = self.model(prompt[None], cache=self.cache)[0, -1]
        self.token = mx.argmax(self.logits)
        mx.eval(self.logits, self.token)

    @property
    def length(self) -> int:
        return self.cache[0].offset

    def kv(self, layer: int) -> tuple[mx.array, mx.array]:
        c = self.cache[layer]
        return c.keys[0, :, : c.offset, :], c.values[0, :, : c.offset, :]

    def step(self) -> mx.array:
        """Feed the current greedy token; returns the next output's logits (V,)."""
        self.logits = self.model(self.token.reshape(1, 1), cache=self.cache)[0, -1]
        self.token = mx.argmax(self.logits)
        mx.eval(self.logits, self.token)
        return self.logits

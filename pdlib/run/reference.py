"""The reference: mlx-lm's own Qwen3, unmodified, in FP32. For a checkpoint it is mlx-lm's loader on the checkpoint
directory as it is (its config.json, every tensor), so nothing pdlib's loader misreads leaks into it; synthetic
weights, which exist nowhere else, go through pdlib's config.

    ref = Reference(load_model("synthetic:tiny"))
    stream = ref.stream(prompt_ids)          # whole-prompt prefill; stream.logits is the first output's
    stream.kv(layer)                         # K, V (Hkv, length, Dh) after RoPE, like pdlib's cache
    stream.step()                            # feed the last greedy token: new logits + one K/V slot

On CUDA it must run with TF32 disabled (MLX_ENABLE_TF32=0, set before MLX initialises); `Reference`
refuses otherwise, since TF32 matmuls are ~1e-3 off and would fail the gate for the wrong reason.
"""

import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3 import Model, ModelArgs

from pdlib.errors import InputError
from pdlib.weights import LoadedModel


class Reference:
    def __init__(self, model: LoadedModel):
        if mx.cuda.is_available() and os.environ.get("MLX_ENABLE_TF32") != "0":
            raise InputError("the FP32 reference needs TF32 off on CUDA: export MLX_ENABLE_TF32=0 before starting")
        self.config = model.config
        if model.source.get("source") == "checkpoint":
            self.model = checkpoint_reference(Path(model.source["path"]))
        else:
            self.model = synthetic_reference(model)
        self.model.eval()

    def stream(self, prompt_ids) -> "ReferenceStream":
        return ReferenceStream(self, prompt_ids)


def synthetic_reference(model: LoadedModel) -> nn.Module:
    """Synthetic weights exist only in pdlib, so its config and arrays are all there is to build from."""
    ref = Model(ModelArgs.from_dict(model.config.to_hf_dict()))
    ref.load_weights(list(model.weights.items()), strict=True)
    return ref


def checkpoint_reference(directory: Path) -> nn.Module:
    """mlx-lm's loader on the directory, strict, cast to FP32. If mlx-lm cannot load it, that is the answer: a clear
    error, never a fall-back to pdlib's reading of the checkpoint."""
    from mlx_lm import __version__ as mlx_lm_version
    from mlx_lm.utils import load_model

    try:
        ref, _ = load_model(directory, strict=True)
    except Exception as e:  # mlx-lm raises ValueError, TypeError, FileNotFoundError, ... for what it cannot load
        detail = " ".join(f"{type(e).__name__}: {e}".split())
        detail = detail if len(detail) <= 400 else detail[:400] + " ..."
        raise InputError(
            f"the reference (mlx-lm {mlx_lm_version}) cannot load checkpoint {str(directory)!r}: {detail}"
        ) from e
    ref.set_dtype(mx.float32)  # floating parameters only; anything left (quantized) is refused below
    other = [k for k, v in tree_flatten(ref.parameters()) if v.dtype != mx.float32]
    if other:
        raise InputError(
            f"the reference cannot run checkpoint {str(directory)!r} in FP32: parameter {other[0]} "
            f"is not floating point"
        )
    return ref


def last_logits(model: nn.Module, inputs: mx.array, cache) -> mx.array:
    """The logits of the last position of `inputs` (1, T): mlx-lm's Qwen3 as its __call__ runs it, the head applied
    to that position alone (a 7K-token prompt's every row would be 4.5 GB of FP32 logits nobody reads)."""
    hidden = model.model(inputs, cache)[:, -1:]
    head = model.model.embed_tokens.as_linear if model.args.tie_word_embeddings else model.lm_head
    return head(hidden)[0, -1]


class ReferenceStream:
    """One request's greedy continuation under the reference model, advanced one output at a time."""

    def __init__(self, ref: Reference, prompt_ids):
        self.model = ref.model
        self.cache = [KVCache() for _ in self.model.layers]
        prompt = mx.array(list(prompt_ids), dtype=mx.int32)
        self.logits = last_logits(self.model, prompt[None], self.cache)
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

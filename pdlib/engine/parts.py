"""The forward pass's pieces of data: a layer's weights, one request's rows in a step, and `drain`, which runs
a step's layers to the end."""

from dataclasses import dataclass

import mlx.core as mx

from pdlib.engine.cache import KVCache


@dataclass
class Layer:
    wq: mx.array
    wk: mx.array
    wv: mx.array
    wo: mx.array
    q_norm: mx.array
    k_norm: mx.array
    in_norm: mx.array
    post_norm: mx.array
    w_gate: mx.array
    w_up: mx.array
    w_down: mx.array
    # decode copies: fused q|k|v and gate|up rows, bf16 when packing is on
    d_qkv: mx.array = None
    d_o: mx.array = None
    d_gate_up: mx.array = None
    d_down: mx.array = None
    # prefill, made once: each matrix as its (in, out) transposed view (q|k|v and gate|up fused into one
    # each), and the q and k norms' weights stacked per head (Hq + Hkv, Dh)
    t: dict = None


@dataclass
class Segment:
    """One request's rows in a step: `tokens` at positions start.., written into `cache`; `emits` when its
    last row yields an output (a decode, or the chunk that finishes a prompt)."""

    cache: KVCache
    tokens: mx.array  # (T,) token ids, on the device
    start: int
    emits: bool

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def drain(stages):
    """Run a generator of a step's layers (`Qwen3.stages`, `Engine._layer_by_layer`) to its end; its return
    value."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value

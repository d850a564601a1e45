"""B's K/V and first output from the prefill worker to the decode worker, through MLX's collectives only.

    send(kv, logits, mode="whole")            # prefill worker (rank 1): kv (L, 2, Hkv, T, Dh), logits (V,)
    kv, logits = receive(shape, vocab, mode="whole")    # decode worker (rank 0), between two of A's steps

`send`/`recv` have no CUDA implementation in MLX 0.32.4, so the transfer is an `all_sum` in which the decode
worker contributes zeros: x + 0 is x exactly in FP32 (and NaN stays NaN), so what arrives is bit for bit what
was sent. Two shapes, both measured (notes/disagg.md): "whole", one collective over K/V and logits packed
into one FP32 vector; "layers", one collective per layer's K/V and one for the logits. Both sides must use
the same mode and shapes (the "setup" message fixes them). `MODES[0]` is the default.
"""

import mlx.core as mx

MODES = ("whole", "layers")


def payload_bytes(shape: tuple, vocab: int) -> int:
    """FP32 bytes that cross: K/V of shape (L, 2, Hkv, T, Dh) and one logits row."""
    kv = 1
    for d in shape:
        kv *= d
    return 4 * (kv + vocab)


def _check(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"transfer mode {mode!r}; expected one of {MODES}")


def send(kv: mx.array, logits: mx.array, *, mode: str) -> None:
    """The prefill worker's side: its data into the sum (blocks until the decode worker has joined)."""
    _check(mode)
    kv, logits = kv.astype(mx.float32), logits.astype(mx.float32)
    if mode == "whole":
        mx.eval(mx.distributed.all_sum(mx.concatenate([kv.reshape(-1), logits.reshape(-1)])))
    else:
        for i in range(kv.shape[0]):
            mx.eval(mx.distributed.all_sum(kv[i]))
        mx.eval(mx.distributed.all_sum(logits))


def receive(shape: tuple, vocab: int, *, mode: str) -> tuple[mx.array, mx.array]:
    """The decode worker's side: zeros into the sum; returns (kv (L, 2, Hkv, T, Dh), logits (V,)), evaluated."""
    _check(mode)
    L = shape[0]
    if mode == "whole":
        n = payload_bytes(shape, vocab) // 4
        flat = mx.distributed.all_sum(mx.zeros((n,), mx.float32))
        mx.eval(flat)
        kv, logits = unpack(flat, shape)
    else:
        layers = []
        for _ in range(L):
            layer = mx.distributed.all_sum(mx.zeros(shape[1:], mx.float32))
            mx.eval(layer)
            layers.append(layer)
        logits = mx.distributed.all_sum(mx.zeros((vocab,), mx.float32))
        mx.eval(logits)
        kv = mx.stack(layers)
    return kv, logits


def unpack(flat: mx.array, shape: tuple) -> tuple[mx.array, mx.array]:
    """The "whole" vector back into K/V (L, 2, Hkv, T, Dh) and logits."""
    kv_size = payload_bytes(shape, 0) // 4
    return flat[:kv_size].reshape(shape), flat[kv_size:]

"""B's K/V and first output from the prefill worker to the decode worker, through MLX's collectives only.

    payload = pack(kv, logits, mode="whole")    # prefill worker (rank 1): kv (L, 2, Hkv, T, Dh), logits (V,)
    send(payload, group=group)                # ... after saying "ready"
    kv, logits = receive(shape, vocab, mode="whole", group=group)   # decode worker (rank 0), between A's steps

`send`/`recv` have no CUDA implementation in MLX 0.32.4, so the transfer is an `all_sum` in which the decode
worker contributes zeros: x + 0 is x exactly in FP32 (and NaN stays NaN), so what arrives is bit for bit what
was sent. Two shapes, both measured (docs/gpu.md): "whole", one collective over K/V and logits packed
into one FP32 vector; "layers", one collective per layer's K/V and one for the logits. Both sides must use
the same mode and shapes (the "setup" message fixes them). `MODES[0]` is the default. The payload is packed
and evaluated before the worker says "ready", so A's pause is the collective alone; both sides name their
group (MLX keeps the first group a process makes as its default, and a stray default would sum nothing).
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


def pack(kv: mx.array, logits: mx.array, *, mode: str) -> list[mx.array]:
    """The prefill worker's arrays for the collectives, in order, evaluated."""
    _check(mode)
    kv, logits = kv.astype(mx.float32), logits.astype(mx.float32)
    parts = (
        [mx.concatenate([kv.reshape(-1), logits.reshape(-1)])]
        if mode == "whole"
        else [kv[i] for i in range(kv.shape[0])] + [logits]
    )
    mx.eval(parts)
    return parts


def send(parts: list[mx.array], *, group=None) -> None:
    """The prefill worker's side: its packed data into the sums (blocks until the decode worker has joined)."""
    for x in parts:
        mx.eval(mx.distributed.all_sum(x, group=group))


def receive(shape: tuple, vocab: int, *, mode: str, group=None) -> tuple[mx.array, mx.array]:
    """The decode worker's side: zeros into the sum; returns (kv (L, 2, Hkv, T, Dh), logits (V,)), evaluated."""
    _check(mode)
    L = shape[0]
    if mode == "whole":
        n = payload_bytes(shape, vocab) // 4
        flat = mx.distributed.all_sum(mx.zeros((n,), mx.float32), group=group)
        mx.eval(flat)
        kv, logits = unpack(flat, shape)
    else:
        layers = []
        for _ in range(L):
            layer = mx.distributed.all_sum(mx.zeros(shape[1:], mx.float32), group=group)
            mx.eval(layer)
            layers.append(layer)
        logits = mx.distributed.all_sum(mx.zeros((vocab,), mx.float32), group=group)
        mx.eval(logits)
        kv = mx.stack(layers)
    return kv, logits


def unpack(flat: mx.array, shape: tuple) -> tuple[mx.array, mx.array]:
    """The "whole" vector back into K/V (L, 2, Hkv, T, Dh) and logits."""
    kv_size = payload_bytes(shape, 0) // 4
    return flat[:kv_size].reshape(shape), flat[kv_size:]

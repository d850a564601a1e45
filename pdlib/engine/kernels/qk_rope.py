"""What a prompt chunk's q|k|v projection needs before attention, in one kernel: q and k RMSNorm per head, RoPE
at each row's position, q laid out per head for attention, and k and v stored into the layer's cache.

    q, k_cache, v_cache, written = qk_rope_store(raw, q_norm, k_norm, inv_freq, positions, k_cache, v_cache,
                                                 written, start=start, heads=Hq, kv_heads=Hkv, eps=eps)

raw: (T, Hq + 2 Hkv, Dh), the projection as the GEMM left it; positions: (T,) int32, the rows' positions
start.. (the kernel reads them; the twin stores at the host's `start`); q: (Hq, T, Dh), normed and rotated.
MLX's ops take six kernels for this (the norm, its weights, two RoPEs, the copy of v into (Hkv, T, Dh), the
store), each a small launch of a chunk step. The kernel writes the cache in place, as kv_store.py's install
does, and outputs the next fence (fence.py); the ops twin stores functionally and returns the fence as it
came.
"""

import mlx.core as mx

from pdlib import settings
from pdlib.engine.kernels.backend import float_bits, kernel_or_none, source
from pdlib.engine.kernels.decode_attention import stores_kv_in_place
from pdlib.engine.kernels.kv_store import store_kv_ops
from pdlib.engine.kernels.rope import rope_rotate, rope_tables

SOURCE = source("qk_rope.cu")

_kernel = kernel_or_none(
    "pdlib_qk_rope_store", ["raw", "qn", "kn", "inv_freq", "pos", "kc", "vc", "after"], ["q", "written"], source=SOURCE
)

ENV = "PDLIB_PREFILL_QK"


def enabled(head_dim: int) -> bool:
    """PDLIB_PREFILL_QK: `kernel` (the default) runs this kernel where the caches are written in place (a GPU,
    head_dim 128; the flash prefill decides where a chunk step uses it); `ops` runs MLX's ops everywhere."""
    return settings.get(ENV) == "kernel" and _kernel is not None and stores_kv_in_place(head_dim)


def qk_rope_store_ops(
    raw,
    q_norm,
    k_norm,
    inv_freq,
    positions,
    k_cache,
    v_cache,
    written,
    *,
    start: int,
    heads: int,
    kv_heads: int,
    eps: float,
    **_,
):
    """The oracle, as the model's ops path computes it (Qwen3._qkv under RoPE by tables), stored by slice_update
    at `start`; the fence returned as it came."""
    T, H, Dh = raw.shape
    qk = mx.fast.rms_norm(raw[:, : heads + kv_heads], None, eps)
    q = (qk[:, :heads] * q_norm).swapaxes(0, 1)
    k = (qk[:, heads:] * k_norm).swapaxes(0, 1)
    v = raw[:, heads + kv_heads :].swapaxes(0, 1)
    cos, sin = rope_tables(positions, inv_freq)
    k_cache, v_cache, _, _, _ = store_kv_ops(rope_rotate(k, cos, sin), v, k_cache, v_cache, written, start=start)
    return rope_rotate(q, cos, sin), k_cache, v_cache, written


def qk_rope_store_kernel(
    raw,
    q_norm,
    k_norm,
    inv_freq,
    positions,
    k_cache,
    v_cache,
    written,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    start: int | None = None,
    poison: bool = False,
):
    """The caches come back as they went in, written in place at `positions` (`start` goes unused); `poison`
    fills q with NaN first, so a check sees any element the kernel skipped."""
    T, H, Dh = raw.shape
    if (
        H != heads + 2 * kv_heads
        or k_cache.shape != v_cache.shape
        or k_cache.shape[0] != kv_heads
        or k_cache.shape[2] != Dh
        or Dh != 128
        or positions.shape != (T,)
        or positions.dtype != mx.int32
        or {raw.dtype, k_cache.dtype, v_cache.dtype} != {mx.float32}
    ):
        raise ValueError(
            f"qk_rope_store takes FP32 raw (T, {heads} + 2 x {kv_heads}, 128), caches ({kv_heads}, "
            f"capacity, 128) and int32 positions (T,); got raw {raw.dtype} {raw.shape}, caches "
            f"{k_cache.dtype} {k_cache.shape} {v_cache.shape}, positions {positions.dtype} "
            f"{positions.shape}"
        )
    q, written = _kernel(
        inputs=[raw, q_norm, k_norm, inv_freq, positions, k_cache, v_cache, written],
        template=[
            ("HQ", heads),
            ("HKV", kv_heads),
            ("DH", Dh),
            ("CAP", k_cache.shape[1]),
            ("EPS_BITS", float_bits(eps)),
        ],
        grid=(-(-T * H * 32 // 128) * 128, 1, 1),
        threadgroup=(128, 1, 1),
        output_shapes=[(heads, T, Dh), written.shape],
        output_dtypes=[mx.float32, written.dtype],
        init_value=float("nan") if poison else None,
    )
    return q, k_cache, v_cache, written


def qk_rope_store(raw, q_norm, k_norm, inv_freq, positions, k_cache, v_cache, written, **kw):
    """The kernel where enabled(), else the ops twin."""
    if enabled(raw.shape[-1]):
        return qk_rope_store_kernel(raw, q_norm, k_norm, inv_freq, positions, k_cache, v_cache, written, **kw)
    return qk_rope_store_ops(raw, q_norm, k_norm, inv_freq, positions, k_cache, v_cache, written, **kw)

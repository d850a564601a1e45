"""Prefill attention as one flash-style kernel (CUDA only), FP32-accurate: T new queries of one request over its
cache, read in place, the scores never materialised.

    o = flash_attention(q, k_cache, v_cache, positions, written, scale=s, length=n)
    # q (Hq, T, Dh) FP32; k_cache, v_cache (Hkv, capacity, Dh), the layer's cache as it lies, the chunk's rows
    # already written in place (kv_store.install_kv) behind `written`; positions (T,) int32, the queries'
    # positions; n = the host's start + T -> o (Hq, T, Dh)

Why: MLX's ops materialise (Hkv, rep T, S) FP32 scores and run them through a mask, a softmax and two batched
matmuls, after a kernel copied the cache's whole prefix out for them (kv_store.store_kv): most of a chunk
step's attention time at 4K context is those round trips and copies, and a whole prompt's scores are 1 GB a
layer, half of them masked.

Each block takes 64 query rows of one head and a range of 64-key tiles of its KV head. Q, K and V arrive by
`cp.async` as they lie (rows of 128 floats, their 16-byte chunks XOR-swizzled so a warp's reads spread over
the banks): the tile's V is requested as its scores are made and the next tile's K as its values are summed,
so the loads hide behind the arithmetic. Each thread owns RT rows x 4 keys of the scores and RT rows x 8 dims
of the output (RT 8: 128 threads; 4: 256), with a running max and sum per row (online softmax). A key is read
only when some row of the block may see it (key <= that row's position), so stale slots past the request's
length are never touched. Where the row blocks are too few to fill the GPU (a 128-row chunk: 2 per head), the
keys are split across blocks and a second kernel merges the partial results by their maxima; with one split
the first kernel normalises its own output. The row blocks run latest first (most keys first: a whole prompt's
tail of blocks is its lightest). A zero fence (its writer never ran) makes the output NaN, as
fence.read_after does. A second kernel, SOURCE_TF32X3 (the engine's default), does the same on the tensor
cores: the products by the 3xTF32 split (gemm.py), each warp 16 rows in mma.m16n8k8 fragments.
"""

import mlx.core as mx

from pdlib import settings
from pdlib.engine.kernels.attention import attention_ops, causal_mask
from pdlib.engine.kernels.backend import BACKEND, CUDA_CP_ASYNC, cuda_launch_bounds, cuda_sm_count, float_bits, source
from pdlib.engine.kernels.gemm import HEADER as TF32X3_HEADER

BR, BC, DH = 64, 64, 128
SHARED_BYTES = 4 * (BR * DH + 2 * BC * DH + BC * BR)  # Q, K, V (rows of DH), P (keys of BR rows): 112 KB
# rows per thread the kernel is built for, the first the default (check-kernels checks each)
ROW_TILES = (8, 4)
TF32X3_THREADS = 128  # the tensor-core kernel: 4 warps of 16 rows

TILES = source("flash_tiles.cuh")  # the one tile loader of both kernels
SOURCE = source("flash_prefill.cu")

# QK^T and PV by 3xTF32 on the tensor cores (gemm.py's split and mma), the engine's default (`flash-tf32x3`):
# faster than the FP32 kernel, its logits as close to the reference's
SOURCE_TF32X3 = source("flash_prefill_tf32x3.cu")

MERGE = source("flash_merge.cu")


def threads_for(rows_per_thread: int) -> int:
    """A block's threads: 16 per 4-key column group, one per RT rows of the block's 64."""
    return 16 * BR // rows_per_thread


def header(rows_per_thread: int) -> str:
    """The FP32 kernel's header for one row tile: cp.async, and registers bounded to two blocks an SM (the most
    its shared memory allows)."""
    return CUDA_CP_ASYNC + TILES + cuda_launch_bounds(threads_for(rows_per_thread), 2)


HEADER_TF32X3 = TF32X3_HEADER + TILES + cuda_launch_bounds(TF32X3_THREADS, 2)  # the tensor-core kernel's


def _build(name: str, source: str, header_text: str):
    return mx.fast.cuda_kernel(
        name=name,
        input_names=["q", "kc", "vc", "pos", "after"],
        output_names=["part", "stats"],
        source=source,
        header=header_text,
        shared_memory=SHARED_BYTES,
    )


_kernels = (
    {
        **{rt: _build(f"pdlib_flash_prefill_rt{rt}", SOURCE, header(rt)) for rt in ROW_TILES},
        "tf32x3": _build("pdlib_flash_prefill_tf32x3", SOURCE_TF32X3, HEADER_TF32X3),
    }
    if BACKEND == "cuda"
    else {}
)
_merge = (
    mx.fast.cuda_kernel(name="pdlib_flash_merge", input_names=["part", "stats"], output_names=["o"], source=MERGE)
    if BACKEND == "cuda"
    else None
)

ENV = "PDLIB_PREFILL_ATTENTION"


def enabled(head_dim: int) -> bool:
    """PDLIB_PREFILL_ATTENTION: `flash-tf32x3` (the default) runs prefill attention here where the kernels exist
    (CUDA, head_dim 128: where the caches are written in place), on the tensor cores; `flash` the same with
    the FP32 kernel (arithmetic()); `ops` runs MLX's ops (attention.py) everywhere."""
    return settings.get(ENV) != "ops" and bool(_kernels) and head_dim == DH


def arithmetic() -> str:
    """flash_attention's `arithmetic` under PDLIB_PREFILL_ATTENTION: fp32 for `flash`, else tf32x3."""
    return "fp32" if settings.get(ENV) == "flash" else "tf32x3"


def key_splits(rows: int, heads: int, length: int, sms: int) -> int:
    """Blocks per row block along the keys: as many as two per SM hold at once (two fit by shared memory), at
    most half the `length` keys' 64-key tiles (a 128-row chunk of 16 heads at 4K: 8; a whole prompt: 1). A
    row block whose last row sits early sees fewer tiles, so its last splits may be empty."""
    blocks = -(-rows // BR) * heads
    return max(1, min(2 * sms // blocks, -(-length // BC) // 2))


def flash_attention(
    q: mx.array,
    k_cache: mx.array,
    v_cache: mx.array,
    positions: mx.array,
    written: mx.array,
    *,
    scale: float,
    length: int,
    splits: int | None = None,
    rows_per_thread: int = ROW_TILES[0],
    arithmetic: str = "fp32",
    poison: bool = False,
) -> mx.array:
    """o (Hq, T, Dh) of q's rows over the cache (module docstring). `length` (start + T on the host) only sizes
    the key split; `splits` overrides key_splits; `rows_per_thread` is one of ROW_TILES; `arithmetic`
    "tf32x3" runs the tensor-core kernel instead (SOURCE_TF32X3; rows_per_thread unused); `poison` fills the
    outputs with NaN first, so a test sees any element the kernels skipped."""
    Hq, T, Dh = q.shape
    Hkv = k_cache.shape[0]
    if (
        Dh != DH
        or k_cache.shape != v_cache.shape
        or k_cache.shape[2] != DH
        or Hq % Hkv
        or positions.shape != (T,)
        or {q.dtype, k_cache.dtype, v_cache.dtype} != {mx.float32}
        or positions.dtype != mx.int32
        or rows_per_thread not in ROW_TILES
        or arithmetic not in ("fp32", "tf32x3")
    ):
        raise ValueError(
            f"flash_attention takes FP32 q (Hq, T, {DH}) and caches (Hkv, capacity, {DH}), Hq a multiple "
            f"of Hkv, int32 positions (T,); got q {q.dtype} {q.shape}, caches {k_cache.dtype} "
            f"{k_cache.shape} {v_cache.shape}, positions {positions.dtype} {positions.shape}, "
            f"rows per thread {rows_per_thread} (one of {ROW_TILES}), arithmetic {arithmetic!r} (fp32 "
            f"or tf32x3)"
        )
    z = key_splits(T, Hq, length, cuda_sm_count()) if splits is None else splits
    nan = float("nan") if poison else None
    tc = arithmetic == "tf32x3"
    threads = TF32X3_THREADS if tc else threads_for(rows_per_thread)
    part, stats = _kernels["tf32x3" if tc else rows_per_thread](
        inputs=[q, k_cache, v_cache, positions, written],
        template=[("SCALE_BITS", float_bits(scale)), ("RT", rows_per_thread)],
        grid=(Hq * threads, -(-T // BR), z),
        threadgroup=(threads, 1, 1),
        output_shapes=[(z, Hq, T, Dh), (z, Hq, T, 2)],
        output_dtypes=[mx.float32, mx.float32],
        init_value=nan,
    )
    return merged(part, stats, poison=poison)


def merged(part: mx.array, stats: mx.array, *, poison: bool = False) -> mx.array:
    """o (Hq, T, Dh) from the key splits' partial results part (z, Hq, T, Dh) and their (max, sum) stats: the
    one split's own (normalised by the kernel) or the MERGE kernel's, which lies as (T, Hq, Dh), the layout
    o_proj reads (Qwen3._out_mlp's reshape is then no copy). `poison` as flash_attention's."""
    z, Hq, T, Dh = part.shape
    if z == 1:
        return part.reshape(Hq, T, Dh)
    (o,) = _merge(
        inputs=[part, stats],
        grid=(Hq * T * Dh, 1, 1),
        threadgroup=(Dh, 1, 1),
        output_shapes=[(T, Hq, Dh)],
        output_dtypes=[mx.float32],
        init_value=float("nan") if poison else None,
    )
    return o.swapaxes(0, 1)


def flash_attention_ops(
    q: mx.array,
    k_cache: mx.array,
    v_cache: mx.array,
    positions: mx.array,
    written: mx.array,
    *,
    scale: float,
    length: int,
    **_,
) -> mx.array:
    """The oracle, with flash_attention's signature: the reference's masked softmax over the cache's first
    `length` slots (attention.attention_ops)."""
    k, v = k_cache[:, :length], v_cache[:, :length]
    return attention_ops(q, k, v, mask=causal_mask(positions, length), scale=scale)

"""The prefill's matmuls in FP32 accuracy on tensor cores, by splitting the operands (CUDA only).

A TF32 product keeps 10 of FP32's 23 mantissa bits. Splitting each operand x = hi + lo, both TF32 (hi is x
rounded to TF32, lo the rounded remainder), and summing the three products that matter, lo*hi + hi*lo +
hi*hi, in FP32 accumulators leaves an error of ~2^-21 relative per product (the dropped lo*lo, and lo's own
rounding), against FP32's 2^-24: far inside the gate's 1e-3, on the tensor cores rather than the CUDA cores.
A bf16 weight (the decode copies: pdlib checks at load that they equal the FP32 weights bit for bit) is exact
in TF32, so its lo is zero: two products, lo*w + hi*w, and half the bytes to read.

Each block computes a BM x BN tile of y = x @ w.T with warps of WM x WN (mma.m16n8k8), over 32-deep slices of
x and w that `cp.async` brings into a ring of STAGES buffers in shared memory, STAGES - 1 slices ahead of the
one being multiplied, so the loads' latency hides behind the tensor cores' work. The operands are split as
each fragment is read. Where the tiles are too few to fill the GPU, K is split and the slices' partial sums
are added afterwards in a fixed order. It runs the prefill's matmuls of 16 rows and more on bf16 weights; on
FP32 weights only a chunk's (up to 256 rows): MLX's FP32 matmul is faster on a whole prompt's there.
SOURCE_BF16X3 (PDLIB_PREFILL_GEMM=bf16x3, the default on bf16 weights) splits x instead into three bf16
parts, which hold it exactly, and multiplies them by the bf16 weights (mma.m16n8k16): three products per 16
columns of K, against the TF32 split's four. SOURCE_WGMMA does the TF32 split by Hopper's warpgroup mma
(PDLIB_PREFILL_GEMM=wgmma, opt-in): each slice is split once per block into the hi and lo copies the tensor
cores read from shared memory.

    y = tf32x3_matmul(x, w)       # x (M, K) FP32, w (N, K) FP32 or bf16, row-contiguous -> x @ w.T, (M, N) FP32
    K.linear_t(x, w_t, w_bf16)    # this on CUDA unless PDLIB_PREFILL_GEMM=fp32: on w_bf16 (16 rows and more) or
                                  # on w_t.T, the weight as loaded (a chunk's rows); else x @ w_t
    K.linear_t(x, w_t, w_bf16, add=h)        # h + x @ w_t; swiglu=True: silu(g) * u of its halves [g | u]
"""

from typing import NamedTuple

import mlx.core as mx

from pdlib import settings
from pdlib.engine.kernels.backend import BACKEND, CUDA_CP_ASYNC, cuda_sm_count, float_bits, source

BK = 32  # a slice's depth
PITCH, WGMMA_PITCH, BF16X3_PITCH = 40, 36, 48  # a staged row's floats, or halves for bf16 w (the pad spreads
# a warp's reads over the banks)
MIN_ROWS = 16  # fewer rows (the LM head's, a decode's) waste most of a tile: plain FP32 there


class Tiles(NamedTuple):
    """A launch shape: the block's tile (bm x bn), a warp's (wm x wn), the ring's slices in flight (stages),
    and the fewest columns of K a split may keep (min_ks). `wgmma`: the Hopper kernel instead (SOURCE_WGMMA:
    one warpgroup per 64-row tile, bm 64, wm and wn unused); `bf16x3`: SOURCE_BF16X3 (bf16 weights only)."""

    bm: int
    bn: int
    wm: int
    stages: int
    min_ks: int
    wgmma: bool = False
    wn: int = 32
    bf16x3: bool = False

    @property
    def threads(self) -> int:
        return 128 if self.wgmma else (self.bm // self.wm) * (self.bn // self.wn) * 32

    def shared_bytes(self, weight_bytes: int = 4) -> int:
        """The ring (x's rows at PITCH floats, w's at PITCH floats or halves; BF16X3_PITCH for that kernel), or
        the wgmma kernel's (rows at WGMMA_PITCH floats) and its hi and lo copies of a slice."""
        if self.wgmma:
            return self.stages * 4 * (self.bm + self.bn) * WGMMA_PITCH + 8 * (self.bm + self.bn) * BK
        return self.stages * (BF16X3_PITCH if self.bf16x3 else PITCH) * (4 * self.bm + weight_bytes * self.bn)

    @property
    def label(self) -> str:
        if self.wgmma:
            return f"wgmma {self.bm}x{self.bn}/s{self.stages}/k{self.min_ks}"
        tile = f"{self.bm}x{self.bn}/w{self.wm}x{self.wn}/s{self.stages}/k{self.min_ks}"
        return f"bf16x3 {tile}" if self.bf16x3 else tile


# the launch shapes check-kernels checks. Warps of 32 x 64 split each x element half as often as 32 x 32 ones
# (splitting x is most of a warp's instructions per mma); four of them on a 64x128 tile are the chunk's shape.
# Then the default's, bf16x3's, on that tile, bf16x3 on 16-row tiles (a decode round's, opt-in), and the wgmma
# kernel's (PDLIB_PREFILL_GEMM=wgmma: exact, opt-in).
CANDIDATES = (
    Tiles(64, 128, 32, 3, 256, wn=64),
    Tiles(128, 64, 32, 3, 256, wn=64),
    Tiles(64, 64, 32, 3, 256),
    Tiles(128, 128, 64, 3, 128),
    Tiles(64, 128, 32, 3, 256, wn=64, bf16x3=True),
    Tiles(16, 128, 16, 3, 256, wn=32, bf16x3=True),
    Tiles(64, 64, 0, 3, 256, wgmma=True),
)
CHUNK_TILES = CANDIDATES[0]
BF16X3_TILES = CANDIDATES[-3]  # the default's on bf16 weights (PDLIB_PREFILL_GEMM=bf16x3)
# a decode round's rows (PDLIB_ROUND_GEMM=tiles16): 16-row tiles of bf16x3, one warp row of four 16 x 32 warps,
# so 8 or 32 rows waste a half or none of a tile where 64-row ones waste 7/8 or 1/2; from one row up to ROUND_ROWS
ROUND_TILES = CANDIDATES[-2]
ROUND_ROWS = 32
WGMMA_TILES = CANDIDATES[-1]  # PDLIB_PREFILL_GEMM=wgmma's
MAX_ROWS = 256  # on FP32 weights more rows (a whole prompt's) run MLX's FP32 matmul, faster there; on
# bf16 ones the kernel runs at every row count


HEADER = CUDA_CP_ASYNC + source("gemm.cuh")

SOURCE = source("gemm_tf32x3.cu")


# x as three bf16 parts times the bf16 weights (PDLIB_PREFILL_GEMM=bf16x3, the default): the split is exact,
# so only the accumulators round; 3 mma per 16 columns of K against tf32x2's 4, and w's fragments are read as
# they lie
SOURCE_BF16X3 = source("gemm_bf16x3.cu")


# the Hopper kernel's header: HEADER's split, shared-memory descriptors, the warpgroup's fences and its mma
HEADER_WGMMA = HEADER + source("gemm_wgmma.cuh")

SOURCE_WGMMA = source("gemm_wgmma.cu")

_kernels: dict = {}


def _kernel(tiles: Tiles, weight_bytes: int):
    """One compiled kernel per launch shape and weight type (the ring's dynamic shared memory is fixed at
    creation)."""
    if (tiles, weight_bytes) not in _kernels:
        kind = "wgmma" if tiles.wgmma else "bf16x3" if tiles.bf16x3 else f"tf32x{3 if weight_bytes == 4 else 2}"
        warps = "" if tiles.wgmma else f"w{tiles.wm}x{tiles.wn}"
        source = SOURCE_WGMMA if tiles.wgmma else SOURCE_BF16X3 if tiles.bf16x3 else SOURCE
        _kernels[tiles, weight_bytes] = mx.fast.cuda_kernel(
            name=f"pdlib_gemm_{kind}_{tiles.bm}x{tiles.bn}{warps}s{tiles.stages}",
            input_names=["x", "w"],
            output_names=["y"],
            source=source,
            header=HEADER_WGMMA if tiles.wgmma else HEADER,
            shared_memory=tiles.shared_bytes(weight_bytes),
        )
    return _kernels[tiles, weight_bytes]


GEMM_ENV = "PDLIB_PREFILL_GEMM"


def choice() -> str:
    """PDLIB_PREFILL_GEMM: `bf16x3` (the default) runs the prefill's matmuls here on CUDA on the bf16 decode
    copies where the model has them, x in three bf16 parts (SOURCE_BF16X3), else as `tf32x3`: a chunk's on the
    FP32 weights; `tf32x2` as bf16x3 with x in two TF32 parts (SOURCE, two products); `wgmma` tf32x3 by the
    Hopper kernel (opt-in, slower); `fp32` runs MLX's."""
    return settings.get(GEMM_ENV)


def enabled() -> bool:
    """Whether any of the prefill's matmuls run here: on CUDA, unless PDLIB_PREFILL_GEMM=fp32."""
    return choice() != "fp32" and BACKEND == "cuda"


def chunk_tiles() -> Tiles:
    """The launch shape a chunk's matmuls run in, under PDLIB_PREFILL_GEMM."""
    return WGMMA_TILES if choice() == "wgmma" else CHUNK_TILES


def bf16_weights() -> bool:
    """Whether the prefill's matmuls read the bf16 decode copies of the weights (PDLIB_PREFILL_GEMM=tf32x2 or
    bf16x3)."""
    return choice() in ("tf32x2", "bf16x3")


def tiles(M: int, K: int, N: int, bf16: bool = False) -> bool:
    """Whether the engine's matmul of these shapes runs here: not a decode's rows, nor a whole prompt's on FP32
    weights; whole tiles across N and 32-deep slices."""
    return MIN_ROWS <= M and (bf16 or M <= MAX_ROWS) and N % CHUNK_TILES.bn == 0 and K % BK == 0


def k_split(M: int, K: int, N: int, sms: int, shape: Tiles = CHUNK_TILES) -> int:
    """Slices of K: doubled while the grid stays within two blocks per SM and each slice keeps min_ks columns
    and whole 32-deep steps (CHUNK_TILES at M=128: o_proj and down split 8 ways, q|k|v 4, gate|up 2)."""
    blocks, split = -(-M // shape.bm) * (N // shape.bn), 1
    while blocks * split * 2 <= 2 * sms and K % (2 * split * BK) == 0 and K // (2 * split) >= shape.min_ks:
        split *= 2
    return split


def template(shape: Tiles, K: int, N: int, split: int, weight_bytes: int) -> list[tuple[str, int]]:
    """The kernel's compile-time values for a launch (the wgmma kernel's tile is 64 rows by one warpgroup;
    SOURCE_BF16X3 takes bf16 weights only)."""
    if shape.wgmma:
        return [("K", K), ("N", N), ("SPLIT", split), ("BN", shape.bn), ("STAGES", shape.stages)]
    tile = [
        ("K", K),
        ("N", N),
        ("SPLIT", split),
        ("BM", shape.bm),
        ("BN", shape.bn),
        ("WM", shape.wm),
        ("WN", shape.wn),
        ("STAGES", shape.stages),
    ]
    return tile if shape.bf16x3 else tile + [("WB", weight_bytes)]


def tf32x3_matmul(
    x: mx.array,
    w: mx.array,
    *,
    shape: Tiles = CHUNK_TILES,
    split: int | None = None,
    poison: bool = False,
    add: mx.array | None = None,
    swiglu: bool = False,
    norm: tuple[mx.array, float] | None = None,
    sums: str | None = None,
) -> "mx.array | Normed":
    """x (M, K) @ w.T for w (N, K), FP32 x and output, on tensor cores (module docstring), in `shape`'s tiles,
    then `add` + it or its SwiGLU (epilogue_ops); with `norm` (weight, eps) and `add`, the pair (h, RMSNorm of
    h). w FP32 takes the three products; w bf16 (exact in TF32: its lo is zero) two, and half the bytes (not in
    the wgmma kernel; the only kind the bf16x3 kernel takes). `split` overrides k_split; `poison` fills the
    outputs with NaN first, so a test sees any element a kernel skipped; `sums` how a K split is summed and
    finished (settings: PDLIB_PREFILL_GEMM_SUM's values), None: PDLIB_PREFILL_GEMM_SUM."""
    M, K = x.shape
    N = w.shape[0]
    if norm is not None and add is None:
        raise ValueError("tf32x3_matmul's norm follows a residual add: pass add too")
    split = k_split(M, K, N, cuda_sm_count(), shape) if split is None else split
    sums = sum_choice() if sums is None else sums
    wb = {mx.float32: 4, mx.bfloat16: 2}.get(w.dtype)
    if (
        x.dtype != mx.float32
        or wb is None
        or (wb == 2 and shape.wgmma)
        or (wb == 4 and shape.bf16x3)
        or w.shape[1] != K
    ):
        raise ValueError(
            f"tf32x3_matmul takes FP32 x (M, K) and w (N, K), FP32 (but not by bf16x3) or bf16 (but not"
            f" by wgmma), got {x.dtype} {x.shape}, {w.dtype} {w.shape} ({shape.label})"
        )
    if N % shape.bn or K % (split * BK):
        raise ValueError(
            f"tf32x3_matmul needs N % {shape.bn} == 0 and K % ({BK} * split) == 0, got K={K}, N={N}, split={split}"
        )
    (y,) = _kernel(shape, wb)(
        inputs=[x, w],
        template=template(shape, K, N, split, wb),
        grid=(N // shape.bn * shape.threads, -(-M // shape.bm), split),
        threadgroup=(shape.threads, 1, 1),
        output_shapes=[(split, M, N)],
        output_dtypes=[mx.float32],
        init_value=float("nan") if poison else None,
    )
    if split > 1 and sums == "fused-norm" and norm is not None:
        return summed(y, add=add, norm=norm, poison=poison)
    if split > 1 and sums != "ops":
        out = summed(y, add=add, swiglu=swiglu, poison=poison)
        return out if norm is None else (out, norm_ops(out, norm))
    return epilogue_ops(y[0] if split == 1 else y.sum(axis=0), add=add, swiglu=swiglu, norm=norm)


SUM_ENV = "PDLIB_PREFILL_GEMM_SUM"
Normed = tuple[mx.array, mx.array]  # (h, its RMSNorm): what a matmul returns with `norm`


def sum_choice() -> str:
    """PDLIB_PREFILL_GEMM_SUM: how a K split's parts are summed and the layer's epilogue applied: `fused-norm`
    (the default) by one kernel (summed), which, where a residual add is followed by an RMSNorm (o_proj's by
    the post-norm, down's by the next layer's in-norm or the final norm), applies that too: two launches fewer
    per layer; `fused` the same kernel without the norm; `ops` MLX's sum and ops."""
    return settings.get(SUM_ENV)


def norm_ops(h: mx.array, norm: tuple[mx.array, float]) -> mx.array:
    """The RMSNorm after a residual add, as the model ran it before it could ride in the sum: MLX's fused one."""
    return mx.fast.rms_norm(h, *norm)


def epilogue_ops(
    y: mx.array, *, add: mx.array | None = None, swiglu: bool = False, norm: tuple[mx.array, float] | None = None
) -> "mx.array | Normed":
    """What follows a matmul in a layer, as MLX's ops: silu(g) * u of y's halves [g | u] (gate|up's SwiGLU),
    then `add` + it (a residual); with `norm` (weight, eps), the pair (that, its RMSNorm: norm_ops)."""
    if swiglu:
        g, u = y[:, : y.shape[1] // 2], y[:, y.shape[1] // 2 :]
        y = g * mx.sigmoid(g) * u
    y = y if add is None else add + y
    return y if norm is None else (y, norm_ops(y, norm))


SUM_THREADS = 256
SUM_EPILOGUES = ("none", "add", "swiglu", "norm")


def sum_source(epilogue: str) -> str:
    """The sum kernel's text for one of SUM_EPILOGUES (gemm_sum.cu picks it by a macro)."""
    return f"#define PD_SUM_{epilogue.upper()} 1\n" + source("gemm_sum.cu")


_sums: dict = {}


def summed(
    parts: mx.array,
    *,
    add: mx.array | None = None,
    swiglu: bool = False,
    norm: tuple[mx.array, float] | None = None,
    poison: bool = False,
) -> "mx.array | Normed":
    """parts (S, M, N) summed over S in order, then epilogue_ops' `add` or `swiglu`, by one kernel (gemm_sum.cu).
    `add` is (M, N) FP32; under `swiglu` the output is (M, N / 2). With `norm` (weight (N,), eps) and `add`, the
    pair (h, norm_ops(h, norm)) for h = add + the sum, still one kernel. `poison` as
    tf32x3_matmul's. The kernels read and write four floats at a time: parts, add and the norm weight are
    row-contiguous arrays of 4k columns (MLX copies any other into that layout), so 16-byte aligned."""
    S, M, N = parts.shape
    halves = 2 if swiglu else 1  # the output's columns are N / halves
    if swiglu and add is not None:
        raise ValueError("summed takes add or swiglu, not both")
    if norm is not None and add is None:
        raise ValueError("summed's norm follows a residual add: pass add too")
    if parts.dtype != mx.float32 or N % (4 * halves):  # a thread's four columns, of each half
        raise ValueError(f"summed takes FP32 parts of {4 * halves}k columns, got {parts.dtype} {parts.shape}")
    if add is not None and (add.shape != (M, N) or add.dtype != mx.float32):
        raise ValueError(f"summed's add must be FP32 ({M}, {N}), got {add.dtype} {add.shape}")
    if norm is not None and (norm[0].shape != (N,) or norm[0].dtype != mx.float32):
        raise ValueError(f"summed's norm weight must be FP32 ({N},), got {norm[0].dtype} {norm[0].shape}")
    epilogue = "norm" if norm is not None else "swiglu" if swiglu else "add" if add is not None else "none"
    if epilogue not in _sums:
        _sums[epilogue] = mx.fast.cuda_kernel(
            name=f"pdlib_gemm_sum_{epilogue}",
            input_names=["parts"] + ["add"] * (add is not None) + ["weight"] * (norm is not None),
            output_names=["out"] + ["normed"] * (norm is not None),
            source=sum_source(epilogue),
        )
    inputs = [parts] + ([add] if add is not None else []) + ([norm[0]] if norm is not None else [])
    nan = float("nan") if poison else None
    if norm is not None:  # a block per row
        return tuple(
            _sums[epilogue](
                inputs=inputs,
                template=[("SPLIT", S), ("SUM_THREADS", SUM_THREADS), ("EPS_BITS", float_bits(norm[1]))],
                grid=(M * SUM_THREADS, 1, 1),
                threadgroup=(SUM_THREADS, 1, 1),
                output_shapes=[(M, N), (M, N)],
                output_dtypes=[mx.float32, mx.float32],
                init_value=nan,
            )
        )
    quads = M * N // halves // 4
    (out,) = _sums[epilogue](
        inputs=inputs,
        template=[("SPLIT", S), ("OUT_DIV", halves)],
        grid=(-(-quads // SUM_THREADS) * SUM_THREADS, 1, 1),
        threadgroup=(SUM_THREADS, 1, 1),
        output_shapes=[(M, N // halves)],
        output_dtypes=[mx.float32],
        init_value=nan,
    )
    return out


def linear_t(
    x: mx.array,
    w_t: mx.array,
    w: mx.array | None = None,
    *,
    add: mx.array | None = None,
    swiglu: bool = False,
    norm: tuple[mx.array, float] | None = None,
) -> "mx.array | Normed":
    """x: (M, D) @ w_t with w_t: (D, N), the weight's transposed view made once at load (prefill): a step
    then holds no transpose per matmul; then `add` + it or its SwiGLU (epilogue_ops); with `norm` (weight,
    eps) and `add`, the pair (h, norm_ops(h, norm)): the residual and its RMSNorm. On tensor cores when
    enabled() and _shape() gives a launch shape, from `w`, the same weight as (N, D) bf16 (the decode copy), where
    given and bf16_weights(), else from w_t (a K split's sum carries the epilogue, summed, unless
    PDLIB_PREFILL_GEMM_SUM=ops; and the norm under fused-norm)."""
    if norm is not None and add is None:
        raise ValueError("linear_t's norm follows a residual add: pass add too")
    epilogue = {"add": add, "swiglu": swiglu, "norm": norm}
    if enabled() and x.ndim == 2 and (shape := _shape(x.shape[0], w_t, w)) is not None:
        return tf32x3_matmul(x, w if bf16_on(w) else w_t.T, shape=shape, **epilogue)
    return epilogue_ops(x @ w_t, **epilogue)


ROUND_ENV = "PDLIB_ROUND_GEMM"


def bf16_on(w: mx.array | None) -> bool:
    """Whether linear_t takes `w`, the bf16 decode copy, rather than the FP32 weight."""
    return w is not None and w.dtype == mx.bfloat16 and bf16_weights()


def _shape(M: int, w_t: mx.array, w: mx.array | None) -> Tiles | None:
    """The launch shape linear_t runs M rows in, None for MLX's matmul: on the bf16 copy, ROUND_TILES up to
    ROUND_ROWS rows under PDLIB_ROUND_GEMM=tiles16 (bf16x3), else its tiles from MIN_ROWS; on the FP32 weight, a
    chunk's rows (tiles())."""
    K, N = w_t.shape
    if bf16_on(w):
        bf16x3 = choice() == "bf16x3"
        small = settings.get(ROUND_ENV) == "tiles16" and bf16x3 and M <= ROUND_ROWS
        if small and N % ROUND_TILES.bn == 0 and K % BK == 0:
            return ROUND_TILES
        if tiles(M, K, N, bf16=True):
            return BF16X3_TILES if bf16x3 else CHUNK_TILES
    return chunk_tiles() if tiles(M, K, N) else None


def variant(M: int, w_t: mx.array, w: mx.array | None = None) -> tuple | None:
    """What linear_t(x of M rows, w_t, w) launches of this module's, as (tiles, K split); None where MLX's matmul
    runs. MLX compiles a custom kernel once per name and template values, so a step of a row count whose
    variant is new compiles its kernels then (about a second each on the H200): model.warm runs each variant
    once, before anything is timed."""
    shape = _shape(M, w_t, w) if enabled() else None
    return None if shape is None else (shape, k_split(M, *w_t.shape, cuda_sm_count(), shape))


def tf32x3_ops(x: mx.array, w: mx.array, **_) -> mx.array:
    """The oracle: the plain FP32 product (MLX_ENABLE_TF32=0 keeps MLX's own matmul FP32 on CUDA)."""
    return x @ w.astype(mx.float32).T

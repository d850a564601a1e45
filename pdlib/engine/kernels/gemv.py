"""Matrix-vector products for decode, reading losslessly bf16-packed weights with FP32 accumulation (half the
bytes of the memory-bound step, bit-identical results), plus the plain FP32 `linear` that prefill uses.

One kernel covers every decode matvec, with optional fusions chosen by template flags:
  NORM     RMSNorm the input first (x * rsqrt(mean(x^2) + eps) * nw): q|k|v, gate|up and the LM head
  RESIDUAL add a residual vector to the output: o_proj and down_proj
  SWIGLU   rows r and N + r give silu(gate) * up for output r: gate|up
A warp owns ROWS rows per pass, each lane holding its 16-byte (8 bf16) pieces of them in registers; the loads
of the first pass are issued before the block stages the (normed) input vector in shared memory, and each
pass issues the next one's before reducing its own.
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND, float_bits, kernel_or_none
from pdlib.engine.kernels.rmsnorm import rms_norm


def launch_shape(n_rows: int) -> tuple[int, int]:
    """Threads per block and rows per warp. Any value is correct; these were the fastest in a sweep on the
    H200, which found little between shapes (notes/gpu.md)."""
    return (256, 2) if n_rows <= 4096 else (256, 1)


def linear(x: mx.array, w: mx.array) -> mx.array:
    """x: (..., D) @ w.T with w: (N, D), FP32 (prefill)."""
    return x @ w.T


def gemv_ops(x: mx.array, w: mx.array, *, norm: mx.array | None = None, eps: float = 0.0,
             residual: mx.array | None = None, swiglu: bool = False, poison: bool = False) -> mx.array:
    """The oracle: x (K,) FP32, w (N or 2N, K) bf16 or FP32 -> (N,) FP32. `poison` is the kernel's and does
    nothing here (every element is computed)."""
    if norm is not None:
        x = rms_norm(x, norm, eps=eps)
    y = w.astype(mx.float32) @ x
    if swiglu:
        g, u = mx.split(y, 2)
        y = g * mx.sigmoid(g) * u
    if residual is not None:
        y = residual + y
    return y


SOURCE = r"""
    // Each warp owns ROWS rows (x2 for SwiGLU) per pass; a lane holds PER 16-byte chunks of each row in
    // registers. The first pass's weights are requested before the block stages x, and each pass requests
    // the next pass's rows before reducing its own, so loads stay in flight behind the arithmetic.
    constexpr int WARPS = BLOCK / 32, K8 = K / 8, PER = (K8 + 31) / 32, M = SWIGLU ? 2 : 1;
    PD_SHARED float4 xs4[K / 4];
    PD_SHARED float red[WARPS];
    PD_SHARED_SPACE float* xs = reinterpret_cast<PD_SHARED_SPACE float*>(xs4);
    const int tid = thread_position_in_threadgroup.x, lane = PD_LANE(tid, thread_index_in_simdgroup),
              warp = PD_WARP(tid, simdgroup_index_in_threadgroup);
    const PD_DEVICE_SPACE uint4* W4 = reinterpret_cast<const PD_DEVICE_SPACE uint4*>(w);
    const int stride = threadgroups_per_grid.x * WARPS * ROWS;
    int row0 = (threadgroup_position_in_grid.x * WARPS + warp) * ROWS;

    uint4 buf[ROWS][M][PER];
    #define PDLIB_LOAD(R0)                                                                          \
        PD_UNROLL for (int r = 0; r < ROWS; ++r)                                                      \
        PD_UNROLL for (int m = 0; m < M; ++m)                                                         \
        PD_UNROLL for (int p = 0; p < PER; ++p) {                                                     \
            const int row = (R0) + r, c = lane + 32 * p;                                              \
            if (row < N && (K8 % 32 == 0 || c < K8)) buf[r][m][p] = W4[(size_t)(row + m * N) * K8 + c]; \
        }
    if (row0 < N) { PDLIB_LOAD(row0) }

    const PD_DEVICE_SPACE float4* x4 = reinterpret_cast<const PD_DEVICE_SPACE float4*>(x);
    float ss = 0.f;
    for (int i = tid; i < K / 4; i += BLOCK) {
        float4 v = x4[i]; xs4[i] = v; ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if (NORM) {
        for (int o = 16; o > 0; o >>= 1) ss += PD_SHFL_XOR(ss, o);
        if (lane == 0) red[warp] = ss;
        PD_BARRIER();
        float tot = 0.f;
        for (int w = 0; w < WARPS; ++w) tot += red[w];
        const float inv = PD_RSQRT(tot / K + PD_INT_AS_FLOAT(EPS_BITS));
        for (int i = tid; i < K; i += BLOCK) xs[i] = xs[i] * inv * nw[i];
    }
    PD_BARRIER();

    for (; row0 < N; row0 += stride) {
        uint4 cur[ROWS][M][PER];
        PD_UNROLL
        for (int r = 0; r < ROWS; ++r)
            PD_UNROLL
            for (int m = 0; m < M; ++m)
                PD_UNROLL
                for (int p = 0; p < PER; ++p) cur[r][m][p] = buf[r][m][p];
        if (row0 + stride < N) { PDLIB_LOAD(row0 + stride) }
        float acc[ROWS][M];
        PD_UNROLL
        for (int r = 0; r < ROWS; ++r)
            PD_UNROLL
            for (int m = 0; m < M; ++m) {
                float a = 0.f;
                PD_UNROLL
                for (int p = 0; p < PER; ++p) {
                    const int c = lane + 32 * p;
                    if (K8 % 32 == 0 || c < K8) {
                        const uint4 q = cur[r][m][p];
                        const float4 x0 = xs4[2 * c], x1 = xs4[2 * c + 1];
                        a += PD_UINT_AS_FLOAT(q.x << 16) * x0.x + PD_UINT_AS_FLOAT(q.x & 0xffff0000u) * x0.y
                           + PD_UINT_AS_FLOAT(q.y << 16) * x0.z + PD_UINT_AS_FLOAT(q.y & 0xffff0000u) * x0.w
                           + PD_UINT_AS_FLOAT(q.z << 16) * x1.x + PD_UINT_AS_FLOAT(q.z & 0xffff0000u) * x1.y
                           + PD_UINT_AS_FLOAT(q.w << 16) * x1.z + PD_UINT_AS_FLOAT(q.w & 0xffff0000u) * x1.w;
                    }
                }
                for (int o = 16; o > 0; o >>= 1) a += PD_SHFL_XOR(a, o);
                acc[r][m] = a;
            }
        PD_UNROLL
        for (int r = 0; r < ROWS; ++r) {
            const int row = row0 + r;
            if (lane == r && row < N) {
                float y = acc[r][0];
                if (SWIGLU) y = y / (1.f + PD_EXP(-y)) * acc[r][M - 1];
                if (RESIDUAL) y += res[row];
                out[row] = y;
            }
        }
    }
    #undef PDLIB_LOAD
"""

_kernel = kernel_or_none("pdlib_gemv_bf16", ["x", "w", "nw", "res"], ["out"], source=SOURCE)
_ONE = mx.zeros((4,), mx.float32)  # stands in for an unused input


def gemv_kernel(x: mx.array, w: mx.array, *, norm: mx.array | None = None, eps: float = 0.0,
                residual: mx.array | None = None, swiglu: bool = False, poison: bool = False) -> mx.array:
    """`poison` fills the output with NaN before the kernel runs, so a test sees any element it skipped."""
    K = x.shape[0]
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    block, rows = launch_shape(N)
    blocks = min(-(-N // (block // 32 * rows)), 4096)
    (out,) = _kernel(
        inputs=[x, w, _ONE if norm is None else norm, _ONE if residual is None else residual],
        template=[("K", K), ("N", N), ("BLOCK", block), ("ROWS", rows), ("EPS_BITS", float_bits(eps)),
                  ("NORM", norm is not None), ("RESIDUAL", residual is not None), ("SWIGLU", swiglu)],
        grid=(blocks * block, 1, 1), threadgroup=(block, 1, 1),
        output_shapes=[(N,)], output_dtypes=[mx.float32], init_value=float("nan") if poison else None)
    return out


def gemv(x, w, **kw):
    """The kernel on a GPU backend (bf16 weights, K a multiple of 8); the ops twin otherwise."""
    if _kernel is not None and w.dtype == mx.bfloat16 and x.shape[0] % 8 == 0:
        return gemv_kernel(x, w, **kw)
    return gemv_ops(x, w, **kw)


__all__ = ["BACKEND", "gemv", "gemv_kernel", "gemv_ops", "linear"]

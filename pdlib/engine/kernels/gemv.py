"""Matrix-vector products for decode, reading losslessly bf16-packed weights with FP32 accumulation (half the
bytes of the memory-bound step, bit-identical results), plus the plain FP32 `linear` that prefill uses.

One kernel covers every decode matvec, with optional fusions chosen by template flags:
  NORM     RMSNorm the input first (x * rsqrt(mean(x^2) + eps) * nw): q|k|v, gate|up and the LM head
  RESIDUAL add a residual vector to the output: o_proj and down_proj
  SWIGLU   rows r and N + r give silu(gate) * up for output r: gate|up
A warp owns a row and reads it 16 bytes (8 bf16) per lane per load; the block stages the (normed) input
vector in shared memory once and then strides over rows.
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND, float_bits, kernel_or_none
from pdlib.engine.kernels.rmsnorm import rms_norm_ops

def block_size(n_rows: int) -> int:
    """Threads per block: 8 warps, or 4 for short matrices so that more blocks cover the SMs."""
    return 128 if n_rows <= 2048 else 256


def linear(x: mx.array, w: mx.array) -> mx.array:
    """x: (..., D) @ w.T with w: (N, D), FP32 (prefill)."""
    return x @ w.T


def gemv_ops(x: mx.array, w: mx.array, *, norm: mx.array | None = None, eps: float = 0.0,
             residual: mx.array | None = None, swiglu: bool = False) -> mx.array:
    """The oracle: x (K,) FP32, w (N or 2N, K) bf16 or FP32 -> (N,) FP32."""
    if norm is not None:
        x = rms_norm_ops(x, norm, eps=eps)
    y = w.astype(mx.float32) @ x
    if swiglu:
        g, u = mx.split(y, 2)
        y = g * mx.sigmoid(g) * u
    if residual is not None:
        y = residual + y
    return y


CUDA_SOURCE = r"""
    constexpr int WARPS = BLOCK / 32;
    __shared__ float xs[K];
    __shared__ float red[WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    float ss = 0.f;
    for (int i = tid; i < K; i += BLOCK) { float v = x[i]; xs[i] = v; ss += v * v; }
    if (NORM) {
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        float tot = 0.f;
        for (int w = 0; w < WARPS; ++w) tot += red[w];
        const float inv = rsqrtf(tot / K + __int_as_float(EPS_BITS));
        for (int i = tid; i < K; i += BLOCK) xs[i] = xs[i] * inv * nw[i];
    }
    __syncthreads();

    const uint4* W4 = reinterpret_cast<const uint4*>(w);
    for (int row = blockIdx.x * WARPS + warp; row < N; row += gridDim.x * WARPS) {
        float acc = 0.f, acc2 = 0.f;
        const uint4* r1 = W4 + (size_t)row * (K / 8);
        const uint4* r2 = W4 + (size_t)(row + N) * (K / 8);
        #pragma unroll 4
        for (int c = lane; c < K / 8; c += 32) {
            const float* xv = xs + c * 8;
            uint4 p = r1[c];
            acc += __uint_as_float(p.x << 16) * xv[0] + __uint_as_float(p.x & 0xffff0000u) * xv[1]
                 + __uint_as_float(p.y << 16) * xv[2] + __uint_as_float(p.y & 0xffff0000u) * xv[3]
                 + __uint_as_float(p.z << 16) * xv[4] + __uint_as_float(p.z & 0xffff0000u) * xv[5]
                 + __uint_as_float(p.w << 16) * xv[6] + __uint_as_float(p.w & 0xffff0000u) * xv[7];
            if (SWIGLU) {
                uint4 q = r2[c];
                acc2 += __uint_as_float(q.x << 16) * xv[0] + __uint_as_float(q.x & 0xffff0000u) * xv[1]
                      + __uint_as_float(q.y << 16) * xv[2] + __uint_as_float(q.y & 0xffff0000u) * xv[3]
                      + __uint_as_float(q.z << 16) * xv[4] + __uint_as_float(q.z & 0xffff0000u) * xv[5]
                      + __uint_as_float(q.w << 16) * xv[6] + __uint_as_float(q.w & 0xffff0000u) * xv[7];
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (SWIGLU) acc2 += __shfl_xor_sync(0xffffffffu, acc2, o);
        }
        if (lane == 0) {
            float y = acc;
            if (SWIGLU) y = acc / (1.f + expf(-acc)) * acc2;
            if (RESIDUAL) y += res[row];
            out[row] = y;
        }
    }
"""

METAL_SOURCE = r"""
    constexpr int WARPS = BLOCK / 32;
    threadgroup float xs[K];
    threadgroup float red[WARPS];
    const uint tid = thread_position_in_threadgroup.x;
    const uint lane = thread_index_in_simdgroup, warp = simdgroup_index_in_threadgroup;

    float ss = 0.f;
    for (uint i = tid; i < K; i += BLOCK) { float v = x[i]; xs[i] = v; ss += v * v; }
    if (NORM) {
        ss = simd_sum(ss);
        if (lane == 0) red[warp] = ss;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float tot = 0.f;
        for (int w = 0; w < WARPS; ++w) tot += red[w];
        const float inv = metal::precise::rsqrt(tot / K + as_type<float>(EPS_BITS));
        for (uint i = tid; i < K; i += BLOCK) xs[i] = xs[i] * inv * nw[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const device uint4* W4 = reinterpret_cast<const device uint4*>(w);
    const uint groups = threadgroups_per_grid.x;
    for (uint row = threadgroup_position_in_grid.x * WARPS + warp; row < N; row += groups * WARPS) {
        float acc = 0.f, acc2 = 0.f;
        const device uint4* r1 = W4 + (size_t)row * (K / 8);
        const device uint4* r2 = W4 + (size_t)(row + N) * (K / 8);
        for (uint c = lane; c < K / 8; c += 32) {
            threadgroup const float* xv = xs + c * 8;
            uint4 p = r1[c];
            acc += as_type<float>(p.x << 16) * xv[0] + as_type<float>(p.x & 0xffff0000u) * xv[1]
                 + as_type<float>(p.y << 16) * xv[2] + as_type<float>(p.y & 0xffff0000u) * xv[3]
                 + as_type<float>(p.z << 16) * xv[4] + as_type<float>(p.z & 0xffff0000u) * xv[5]
                 + as_type<float>(p.w << 16) * xv[6] + as_type<float>(p.w & 0xffff0000u) * xv[7];
            if (SWIGLU) {
                uint4 q = r2[c];
                acc2 += as_type<float>(q.x << 16) * xv[0] + as_type<float>(q.x & 0xffff0000u) * xv[1]
                      + as_type<float>(q.y << 16) * xv[2] + as_type<float>(q.y & 0xffff0000u) * xv[3]
                      + as_type<float>(q.z << 16) * xv[4] + as_type<float>(q.z & 0xffff0000u) * xv[5]
                      + as_type<float>(q.w << 16) * xv[6] + as_type<float>(q.w & 0xffff0000u) * xv[7];
            }
        }
        acc = simd_sum(acc);
        if (SWIGLU) acc2 = simd_sum(acc2);
        if (lane == 0) {
            float y = acc;
            if (SWIGLU) y = acc / (1.f + metal::precise::exp(-acc)) * acc2;
            if (RESIDUAL) y += res[row];
            out[row] = y;
        }
    }
"""

_kernel = kernel_or_none("pdlib_gemv_bf16", ["x", "w", "nw", "res"], ["out"],
                         cuda_source=CUDA_SOURCE, metal_source=METAL_SOURCE)
_ONE = mx.zeros((4,), mx.float32)  # stands in for an unused input


def gemv_kernel(x: mx.array, w: mx.array, *, norm: mx.array | None = None, eps: float = 0.0,
                residual: mx.array | None = None, swiglu: bool = False, poison: bool = False) -> mx.array:
    """`poison` fills the output with NaN before the kernel runs, so a test sees any element it skipped."""
    K = x.shape[0]
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    block = block_size(N)
    blocks = min(-(-N // (block // 32)), 2048)
    (out,) = _kernel(
        inputs=[x, w, _ONE if norm is None else norm, _ONE if residual is None else residual],
        template=[("K", K), ("N", N), ("BLOCK", block), ("EPS_BITS", float_bits(eps)), ("NORM", norm is not None),
                  ("RESIDUAL", residual is not None), ("SWIGLU", swiglu)],
        grid=(blocks * block, 1, 1), threadgroup=(block, 1, 1),
        output_shapes=[(N,)], output_dtypes=[mx.float32], init_value=float("nan") if poison else None)
    return out


def gemv(x, w, **kw):
    """The kernel on a GPU backend (bf16 weights, K a multiple of 8); the ops twin otherwise."""
    if _kernel is not None and w.dtype == mx.bfloat16 and x.shape[0] % 8 == 0:
        return gemv_kernel(x, w, **kw)
    return gemv_ops(x, w, **kw)


__all__ = ["BACKEND", "gemv", "gemv_kernel", "gemv_ops", "linear"]

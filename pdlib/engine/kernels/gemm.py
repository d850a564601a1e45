"""The prefill's matmuls in FP32 accuracy on tensor cores, by the 3xTF32 split (CUDA only).

A TF32 product keeps 10 of FP32's 23 mantissa bits. Splitting each operand x = hi + lo, both TF32 (hi is x
rounded to TF32, lo the rounded remainder), and summing the three products that matter, lo*hi + hi*lo +
hi*hi, in FP32 accumulators leaves an error of ~2^-21 relative per product (the dropped lo*lo, and lo's own
rounding), against FP32's 2^-24: far inside the gate's 1e-3, on the tensor cores rather than the CUDA cores.
Each block computes a 64x64 tile of y = x @ w.T with four warps (32x32 each, mma.m16n8k8), staging
32-deep slices of x and w in shared memory while the next slice is loaded into registers. Where the tiles
are too few to fill the GPU, K is split and the slices' partial sums are added afterwards in a fixed order.
Not yet fast enough to be the default: ~22 TFLOP/s on the H200 against MLX's FP32 GEMMs' ~20 (notes/gpu.md,
v17, with what a faster form needs). The operands are split as each fragment is read, or once as the tiles
are staged (PDLIB_GEMM_PRESPLIT=1): the same products either way; which is faster is being measured.

    y = tf32x3_matmul(x, w)       # x (M, K), w (N, K) FP32, row-contiguous -> x @ w.T, (M, N) FP32
    K.linear_t(x, w_t)            # this, on w_t.T (the weight as loaded), on CUDA when PDLIB_PREFILL_GEMM=tf32x3
                                  # and the shapes tile; else x @ w_t
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND, cuda_sm_count, env_choice

BM, BN, BK, THREADS = 64, 64, 32, 128
MIN_ROWS = 16            # fewer rows (the LM head's, a decode's) waste most of a 64-row tile: plain FP32 there

HEADER = r"""
// x (finite) rounded to TF32, the nearest value with 10 mantissa bits, as FP32 bits (the low 13 are zero)
__device__ __forceinline__ uint32_t pd_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
// x = hi + lo, each TF32; x - hi is exact (hi is x's leading bits, rounded)
__device__ __forceinline__ void pd_split(float x, uint32_t& hi, uint32_t& lo) {
    hi = pd_tf32(x);
    lo = pd_tf32(x - __uint_as_float(hi));
}
// c += a (16x8, row) * b (8x8, col), TF32 in, FP32 accumulators
__device__ __forceinline__ void pd_mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""

SOURCE = r"""
    // y[z] = x[:, kz] @ w[:, kz].T for K slice z (z = blockIdx.z, SPLIT slices of KS = K / SPLIT columns).
    // Both tiles are staged as they lie, rows by 32 columns; the pad makes a warp's fragment reads (row g,
    // column t of either) hit 32 distinct banks. PRESPLIT: each tile is staged as its elements' TF32 hi and
    // lo parts (split once, where each element is used by two warps, for twice the shared bytes read);
    // otherwise as FP32, split as each fragment is read.
    constexpr int BM = 64, BN = 64, BK = 32, AP = BK + 4, KS = K / SPLIT;
    __shared__ __align__(16) uint32_t tiles[(PRESPLIT ? 4 : 2) * BM * AP];
    float* As = reinterpret_cast<float*>(tiles);
    float* Bs = As + BM * AP;
    uint32_t* Ah = tiles;  // (PRESPLIT only)
    uint32_t* Al = tiles + (PRESPLIT ? 1 : 0) * BM * AP;
    uint32_t* Bh = tiles + (PRESPLIT ? 2 : 0) * BM * AP;
    uint32_t* Bl = tiles + (PRESPLIT ? 3 : 0) * BM * AP;
    const int M = x_shape[0];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, k_begin = blockIdx.z * KS;

    // this thread's four float4 of each slice: rows idx / 8, columns (idx % 8) * 4 of x's and of w's tile
    float4 ra[4], rb[4];
    auto load = [&](int k0) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int idx = tid + i * 128, r = idx >> 3, c = (idx & 7) * 4;
            ra[i] = m0 + r < M ? *reinterpret_cast<const float4*>(x + (size_t)(m0 + r) * K + k0 + c)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
            rb[i] = *reinterpret_cast<const float4*>(w + (size_t)(n0 + r) * K + k0 + c);
        }
    };
    float acc[2][4][4];
    #pragma unroll
    for (int mi = 0; mi < 2; ++mi)
        #pragma unroll
        for (int ni = 0; ni < 4; ++ni)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    load(k_begin);
    for (int k0 = k_begin; k0 < k_begin + KS; k0 += BK) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int idx = tid + i * 128, at = (idx >> 3) * AP + (idx & 7) * 4;
            if constexpr (PRESPLIT) {
                uint4 h, l;
                pd_split(ra[i].x, h.x, l.x); pd_split(ra[i].y, h.y, l.y);
                pd_split(ra[i].z, h.z, l.z); pd_split(ra[i].w, h.w, l.w);
                *reinterpret_cast<uint4*>(Ah + at) = h;
                *reinterpret_cast<uint4*>(Al + at) = l;
                pd_split(rb[i].x, h.x, l.x); pd_split(rb[i].y, h.y, l.y);
                pd_split(rb[i].z, h.z, l.z); pd_split(rb[i].w, h.w, l.w);
                *reinterpret_cast<uint4*>(Bh + at) = h;
                *reinterpret_cast<uint4*>(Bl + at) = l;
            } else {
                *reinterpret_cast<float4*>(As + at) = ra[i];
                *reinterpret_cast<float4*>(Bs + at) = rb[i];
            }
        }
        __syncthreads();
        if (k0 + BK < k_begin + KS) load(k0 + BK);
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            uint32_t ah[2][4], al[2][4], bh[4][2], bl[4][2];
            constexpr int FA[4] = {0, 8 * AP, 4, 8 * AP + 4}, FB[2] = {0, 4};  // a fragment's four, two
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int at = (wm + mi * 16 + g) * AP + kk + t;
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if constexpr (PRESPLIT) { ah[mi][e] = Ah[at + FA[e]]; al[mi][e] = Al[at + FA[e]]; }
                    else pd_split(As[at + FA[e]], ah[mi][e], al[mi][e]);
                }
            }
            #pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int at = (wn + ni * 8 + g) * AP + kk + t;
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if constexpr (PRESPLIT) { bh[ni][e] = Bh[at + FB[e]]; bl[ni][e] = Bl[at + FB[e]]; }
                    else pd_split(Bs[at + FB[e]], bh[ni][e], bl[ni][e]);
                }
            }
            // each tile takes the small terms first (lo hi, hi lo, then hi hi); each term goes to all eight
            // tiles before the next, so no product waits on the one just issued to its accumulators
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                #pragma unroll
                for (int ni = 0; ni < 4; ++ni) pd_mma(acc[mi][ni], al[mi], bh[ni]);
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                #pragma unroll
                for (int ni = 0; ni < 4; ++ni) pd_mma(acc[mi][ni], ah[mi], bl[ni]);
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                #pragma unroll
                for (int ni = 0; ni < 4; ++ni) pd_mma(acc[mi][ni], ah[mi], bh[ni]);
        }
        __syncthreads();
    }

    float* out = y + (size_t)blockIdx.z * M * N;
    #pragma unroll
    for (int mi = 0; mi < 2; ++mi)
        #pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            const int row = m0 + wm + mi * 16 + g, col = n0 + wn + ni * 8 + 2 * t;
            if (row < M) *reinterpret_cast<float2*>(out + (size_t)row * N + col) =
                make_float2(acc[mi][ni][0], acc[mi][ni][1]);
            if (row + 8 < M) *reinterpret_cast<float2*>(out + (size_t)(row + 8) * N + col) =
                make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
"""

_kernel = (mx.fast.cuda_kernel(name="pdlib_gemm_tf32x3", input_names=["x", "w"], output_names=["y"],
                               source=SOURCE, header=HEADER) if BACKEND == "cuda" else None)


PRESPLIT_ENV = "PDLIB_GEMM_PRESPLIT"  # "1": stage the tiles split into hi and lo (SOURCE); being measured


def presplit() -> bool:
    """PDLIB_GEMM_PRESPLIT=1 stages each tile as its TF32 hi and lo parts, split once; 0 (the default) splits
    as each fragment is read. Which is faster is for the H200 to say (notes/gpu.md, v17)."""
    return env_choice(PRESPLIT_ENV, ("0", "1")) == "1"


def enabled() -> bool:
    """PDLIB_PREFILL_GEMM: `tf32x3` runs the prefill's matmuls here on CUDA; `fp32` (the default) runs MLX's."""
    return env_choice("PDLIB_PREFILL_GEMM", ("fp32", "tf32x3")) == "tf32x3" and _kernel is not None


def tiles(M: int, K: int, N: int) -> bool:
    """Whether the kernel takes these shapes: whole 64-column and 32-deep tiles, and rows enough to be worth it."""
    return M >= MIN_ROWS and N % BN == 0 and K % BK == 0


def k_split(M: int, K: int, N: int, sms: int) -> int:
    """Slices of K: doubled while the grid stays within two blocks per SM and each slice keeps 256 columns and
    whole 32-deep steps (M=128: o_proj and down split 8 ways, q|k|v 2, gate|up none; a whole prompt none)."""
    blocks, split = -(-M // BM) * (N // BN), 1
    while blocks * split * 2 <= 2 * sms and K % (2 * split * BK) == 0 and K // (2 * split) >= 256:
        split *= 2
    return split


def tf32x3_matmul(x: mx.array, w: mx.array, *, split: int | None = None, split_at_staging: bool | None = None,
                  poison: bool = False) -> mx.array:
    """x (M, K) @ w.T for w (N, K), FP32 in and out, on tensor cores (module docstring). `split` overrides
    k_split; `split_at_staging` overrides presplit(); `poison` fills the output with NaN first, so a test sees
    any element the kernel skipped."""
    M, K = x.shape
    N = w.shape[0]
    split = k_split(M, K, N, cuda_sm_count()) if split is None else split
    if x.dtype != mx.float32 or w.dtype != mx.float32 or w.shape[1] != K:
        raise ValueError(f"tf32x3_matmul takes FP32 x (M, K) and w (N, K), got {x.dtype} {x.shape}, {w.dtype} "
                         f"{w.shape}")
    if N % BN or K % (split * BK):
        raise ValueError(f"tf32x3_matmul needs N % {BN} == 0 and K % ({BK} * split) == 0, got K={K}, N={N}, "
                         f"split={split}")
    staged = presplit() if split_at_staging is None else split_at_staging
    (y,) = _kernel(inputs=[x, w], template=[("K", K), ("N", N), ("SPLIT", split), ("PRESPLIT", staged)],
                   grid=(N // BN * THREADS, -(-M // BM), split), threadgroup=(THREADS, 1, 1),
                   output_shapes=[(split, M, N)], output_dtypes=[mx.float32],
                   init_value=float("nan") if poison else None)
    return y[0] if split == 1 else y.sum(axis=0)


def linear_t(x: mx.array, w_t: mx.array) -> mx.array:
    """x: (M, D) @ w_t with w_t: (D, N), the weight's transposed view made once at load (prefill): a step
    then holds no transpose per matmul. On tensor cores when enabled() and the shapes tile."""
    if enabled() and x.ndim == 2 and tiles(x.shape[0], *w_t.shape):
        return tf32x3_matmul(x, w_t.T)
    return x @ w_t


def tf32x3_ops(x: mx.array, w: mx.array, **_) -> mx.array:
    """The oracle: the plain FP32 product (MLX_ENABLE_TF32=0 keeps MLX's own matmul FP32 on CUDA)."""
    return x @ w.T

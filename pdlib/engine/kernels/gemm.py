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
FP32 weights only a chunk's (up to 256 rows): MLX's FP32 matmul was faster on a whole prompt's there (launch
shapes measured by notes/gpu-session/gemm_sweep.py).
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

from pdlib.engine.kernels.backend import BACKEND, CUDA_CP_ASYNC, cuda_sm_count, env_choice, float_bits

BK = 32                  # a slice's depth
PITCH, WGMMA_PITCH, BF16X3_PITCH = 40, 36, 48   # a staged row's floats, or halves for bf16 w (the pad spreads
                                                # a warp's reads over the banks)
MIN_ROWS = 16            # fewer rows (the LM head's, a decode's) waste most of a tile: plain FP32 there


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


# the launch shapes check-kernels checks and gemm_sweep.py times. v19-v22 ran 64x64 tiles of four 32x32 warps
# with three slices in flight (3.78 ms for a chunk step's 28 layers on bf16 weights, against MLX's FP32 4.92
# ms: notes/gpu.md, v22), issue-bound: per 32-deep slice a warp issued ~6 instructions for each mma, most of
# them splitting x, which a 32-column warp does for every 32 columns of w. Warps of 32 x 64 split each x
# element half as often: ~4.2 instructions an mma by the compiled text. Four of them on a 64x128 tile run a
# chunk's 128 rows as fast as on 128x64 (3.55-3.89 against 3.61-3.70 ms) and ragged counts faster (129 rows,
# a mixed step's: 5.25 against 6.43 ms on FP32 weights; a 128-row tile computes 256 rows there); a whole
# prompt's 3% slower (54.9 against 53.2 ms; v23). Then the default's, bf16x3's, on that tile (SOURCE_BF16X3:
# 3.18 against 3.41 ms at 128 rows; v24's outcome), and the wgmma kernel's, PDLIB_PREFILL_GEMM=wgmma: exact,
# but slower so far (5.67 ms at 128 rows: v22).
CANDIDATES = (Tiles(64, 128, 32, 3, 256, wn=64), Tiles(128, 64, 32, 3, 256, wn=64), Tiles(64, 64, 32, 3, 256),
              Tiles(128, 128, 64, 3, 128), Tiles(64, 128, 32, 3, 256, wn=64, bf16x3=True),
              Tiles(64, 64, 0, 3, 256, wgmma=True))
CHUNK_TILES = CANDIDATES[0]
BF16X3_TILES = CANDIDATES[-2]  # the default's on bf16 weights (PDLIB_PREFILL_GEMM=bf16x3)
WGMMA_TILES = CANDIDATES[-1]   # PDLIB_PREFILL_GEMM=wgmma's
MAX_ROWS = 256           # on FP32 weights more rows (a whole prompt's) run MLX's FP32 matmul, faster there; on
                         # bf16 ones the kernel was faster at every count measured, 512 to 4,096 (v22)


HEADER = CUDA_CP_ASYNC + r"""
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
// c += a (16x16, row) * b (16x8, col), bf16 pairs in (the lower column in the lower half), FP32 accumulators
__device__ __forceinline__ void pd_mma16(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// four FP32 values as three bf16 parts each, x = p0 + p1 + p2 exactly (each part x's leading 8 bits left, cut
// off: what remains after two has at most 8 significant bits), packed in pairs: p[q][0] holds part q of v.x
// (low half) and v.y, p[q][1] of v.z and v.w
__device__ __forceinline__ void pd_split3(float4 v, uint32_t (&p)[3][2]) {
    float r[4] = {v.x, v.y, v.z, v.w};
    uint32_t b[3][4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
        b[0][e] = __float_as_uint(r[e]) & 0xffff0000u;
        r[e] -= __uint_as_float(b[0][e]);
        b[1][e] = __float_as_uint(r[e]) & 0xffff0000u;
        b[2][e] = __float_as_uint(r[e] - __uint_as_float(b[1][e]));
    }
    #pragma unroll
    for (int q = 0; q < 3; ++q) {
        p[q][0] = __byte_perm(b[q][0], b[q][1], 0x7632);
        p[q][1] = __byte_perm(b[q][2], b[q][3], 0x7632);
    }
}
// a warp's MI x NI accumulator fragments (16 x 8 each, mma's C layout): zeroed; acc += part
template <int MI, int NI>
__device__ __forceinline__ void pd_zero(float (&a)[MI][NI][4]) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int e = 0; e < 4; ++e) a[mi][ni][e] = 0.f;
}
template <int MI, int NI>
__device__ __forceinline__ void pd_add(float (&acc)[MI][NI][4], const float (&part)[MI][NI][4]) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] += part[mi][ni][e];
}
// the fragments into out (rows of N floats): fragment (mi, ni) at row r0 + 16 mi + g (and + 8), columns
// c0 + 8 ni + 2t and + 1; rows at or past M are not written
template <int MI, int NI>
__device__ __forceinline__ void pd_store(float* out, const float (&acc)[MI][NI][4], int r0, int c0, int M, int N,
                                         int g, int t) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int row = r0 + mi * 16 + g, col = c0 + ni * 8 + 2 * t;
            if (row < M) *reinterpret_cast<float2*>(out + (size_t)row * N + col) =
                make_float2(acc[mi][ni][0], acc[mi][ni][1]);
            if (row + 8 < M) *reinterpret_cast<float2*>(out + (size_t)(row + 8) * N + col) =
                make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
}
// R rows of a 32-deep slice into shared memory, 16 bytes a copy: rows r0 + r (r < R) of src, E-byte elements
// and K of them a row, from column k0, to dst at PITCH bytes a row; rows at or past `rows` come as zeros
template <int R, int E, int K, int PITCH, int THREADS>
__device__ __forceinline__ void pd_stage(void* dst, const void* src, int r0, int rows, int k0, int tid) {
    constexpr int COPIES = 32 * E / 16;                // a row's
    static_assert((R * COPIES) % THREADS == 0 && PITCH % 16 == 0);
    #pragma unroll
    for (int i = 0; i < R * COPIES / THREADS; ++i) {
        const int idx = tid + i * THREADS, r = idx / COPIES, c = idx % COPIES;
        const bool in = r0 + r < rows;
        pd_cp16(reinterpret_cast<float*>(static_cast<char*>(dst) + r * PITCH + 16 * c),
                reinterpret_cast<const float*>(static_cast<const char*>(src)
                                               + ((size_t)(in ? r0 + r : 0) * K + k0) * E + 16 * c), in);
    }
}
"""

SOURCE = r"""
    // y[z] = x[:, kz] @ w[:, kz].T for K slice z (z = blockIdx.z, SPLIT slices of KS = K / SPLIT columns); w is
    // FP32 (WB = 4) or bf16 (WB = 2: exact in TF32, so its lo is zero and the hi lo product is skipped).
    // Tiles of both are staged as they lie, rows by 32 columns at a pitch of 40 (floats, or halves for bf16),
    // in a ring of STAGES; slice i + STAGES - 1 is requested while slice i is multiplied. An mma's thread
    // holds two of an 8-deep step's columns (t and t + 4), and any two serve if x and w agree: here memory
    // columns 2t and 2t + 1, so each fragment row is one 64-bit read of x (or FP32 w) and one 32-bit read of
    // bf16 w (at pitch 40, a warp's reads, rows g and columns 2t, hit distinct banks). A warp's tile is WM x WN:
    // the wider, the fewer times each x element is split. Each slice's products go into a fresh accumulator,
    // added to the block's sum in FP32: an mma truncates its sum, which a long chain would compound.
    constexpr int BK = 32, AP = 40, BPB = WB * 40, KS = K / SPLIT, SLICES = KS / BK;
    constexpr int MI = WM / 16, NI = WN / 8, WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int STAGE = BM * AP + BN * BPB / 4;      // floats
    static_assert(BM % WM == 0 && BN % WN == 0 && KS % BK == 0 && STAGES >= 2 && (WB == 4 || WB == 2));
    extern __shared__ __align__(16) float smem[];
    const int M = x_shape[0];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, k_begin = blockIdx.z * KS;

    // slice k0 into ring buffer s: x's rows m0.. (zeros past M), then w's rows n0..
    auto request = [&](int s, int k0) {
        float* As = smem + s * STAGE;
        pd_stage<BM, 4, K, 4 * AP, THREADS>(As, x, m0, M, k0, tid);
        pd_stage<BN, WB, K, BPB, THREADS>(As + BM * AP, w, n0, N, k0, tid);
    };

    float acc[MI][NI][4];
    pd_zero(acc);

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {            // one group per slice, empty past the last: the counts stay
        if (s < SLICES) request(s, k_begin + s * BK);  // uniform for the wait below
        pd_cp_commit();
    }
    for (int i = 0; i < SLICES; ++i) {
        pd_cp_wait<STAGES - 2>();                      // this thread's copies of slice i have landed
        __syncthreads();                               // everyone's have; and slice i - 1's buffer is free
        if (i + STAGES - 1 < SLICES) request((i + STAGES - 1) % STAGES, k_begin + (i + STAGES - 1) * BK);
        pd_cp_commit();
        const float* As = smem + (i % STAGES) * STAGE + (wm + g) * AP + 2 * t;   // this thread's first column
        const float* Bs = smem + (i % STAGES) * STAGE + BM * AP + (wn + g) * BPB / 4;
        float part[MI][NI][4];
        pd_zero(part);
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            uint32_t ah[MI][4], al[MI][4], bh[NI][2], bl[NI][2];
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi) {          // rows g and g + 8: a0 a2, then a1 a3
                const float2 r0 = *reinterpret_cast<const float2*>(As + mi * 16 * AP + kk);
                const float2 r8 = *reinterpret_cast<const float2*>(As + (mi * 16 + 8) * AP + kk);
                pd_split(r0.x, ah[mi][0], al[mi][0]);
                pd_split(r8.x, ah[mi][1], al[mi][1]);
                pd_split(r0.y, ah[mi][2], al[mi][2]);
                pd_split(r8.y, ah[mi][3], al[mi][3]);
            }
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                if constexpr (WB == 4) {
                    const float2 c = *reinterpret_cast<const float2*>(Bs + ni * 8 * AP + 2 * t + kk);
                    pd_split(c.x, bh[ni][0], bl[ni][0]);
                    pd_split(c.y, bh[ni][1], bl[ni][1]);
                } else {                               // bf16 bits are the TF32 value's leading half
                    const uint32_t c = reinterpret_cast<const uint32_t*>(Bs)[ni * 8 * 20 + t + kk / 2];
                    bh[ni][0] = c << 16;
                    bh[ni][1] = c & 0xffff0000u;
                }
            }
            // the small terms first (lo hi, hi lo), then hi hi; each term goes to every tile before the next,
            // so no product waits on the one just issued to its accumulators
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                #pragma unroll
                for (int ni = 0; ni < NI; ++ni) pd_mma(part[mi][ni], al[mi], bh[ni]);
            if constexpr (WB == 4) {
                #pragma unroll
                for (int mi = 0; mi < MI; ++mi)
                    #pragma unroll
                    for (int ni = 0; ni < NI; ++ni) pd_mma(part[mi][ni], ah[mi], bl[ni]);
            }
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                #pragma unroll
                for (int ni = 0; ni < NI; ++ni) pd_mma(part[mi][ni], ah[mi], bh[ni]);
        }
        pd_add(acc, part);
    }
    pd_cp_wait<0>();                                   // no copy outlives the block (the tail's are empty)

    pd_store(y + (size_t)blockIdx.z * M * N, acc, m0 + wm, n0 + wn, M, N, g, t);
"""


# x as three bf16 parts times the bf16 weights (PDLIB_PREFILL_GEMM=bf16x3, the default): the split is exact,
# so only the accumulators round; 3 mma per 16 columns of K against tf32x2's 4, and w's fragments are read as
# they lie (notes/gpu.md, v24 and v25)
SOURCE_BF16X3 = r"""
    // y[z] = x[:, kz] @ w[:, kz].T as SOURCE's, w bf16, by mma.m16n8k16.bf16: x = p0 + p1 + p2 in bf16 parts
    // (pd_split3, exact), three products p2 w, p1 w, p0 w into a slice's fresh accumulator. A thread holds
    // columns 2t, 2t + 1, 2t + 8 and 2t + 9 of a 16-deep step; any four serve if x and w agree, so it takes
    // memory columns 4t .. 4t + 3: one 128-bit read of x a fragment row (pitch 48 floats: a quarter warp's
    // reads, rows g and g + 1, hit 32 banks) and one 64-bit read of w's four bf16 (pitch 48 halves).
    constexpr int BK = 32, AP = 48, BP = 48, KS = K / SPLIT, SLICES = KS / BK;
    constexpr int MI = WM / 16, NI = WN / 8, WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int STAGE = BM * AP + BN * BP / 2;       // floats
    static_assert(BM % WM == 0 && BN % WN == 0 && KS % BK == 0 && STAGES >= 2);
    extern __shared__ __align__(16) float smem[];
    const int M = x_shape[0];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, k_begin = blockIdx.z * KS;

    auto request = [&](int s, int k0) {               // as SOURCE's
        float* As = smem + s * STAGE;
        pd_stage<BM, 4, K, 4 * AP, THREADS>(As, x, m0, M, k0, tid);
        pd_stage<BN, 2, K, 2 * BP, THREADS>(As + BM * AP, w, n0, N, k0, tid);
    };

    float acc[MI][NI][4];
    pd_zero(acc);

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < SLICES) request(s, k_begin + s * BK);
        pd_cp_commit();
    }
    for (int i = 0; i < SLICES; ++i) {
        pd_cp_wait<STAGES - 2>();
        __syncthreads();
        if (i + STAGES - 1 < SLICES) request((i + STAGES - 1) % STAGES, k_begin + (i + STAGES - 1) * BK);
        pd_cp_commit();
        const float* As = smem + (i % STAGES) * STAGE + (wm + g) * AP + 4 * t;
        const uint2* Bs = reinterpret_cast<const uint2*>(smem + (i % STAGES) * STAGE + BM * AP)
                          + (wn + g) * BP / 4 + t;             // w row wn + g, halves 4t ..
        float part[MI][NI][4];
        pd_zero(part);
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[MI][3][4], b[NI][2];
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi) {          // rows g (a0 a2) and g + 8 (a1 a3), each part
                uint32_t r0[3][2], r8[3][2];
                pd_split3(*reinterpret_cast<const float4*>(As + mi * 16 * AP + kk), r0);
                pd_split3(*reinterpret_cast<const float4*>(As + (mi * 16 + 8) * AP + kk), r8);
                #pragma unroll
                for (int q = 0; q < 3; ++q) {
                    a[mi][q][0] = r0[q][0];
                    a[mi][q][1] = r8[q][0];
                    a[mi][q][2] = r0[q][1];
                    a[mi][q][3] = r8[q][1];
                }
            }
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {          // keys 4t .. 4t + 3 of row g: b0 (2t, 2t + 1), b1 (+ 8)
                const uint2 c = Bs[ni * 8 * BP / 4 + kk / 4];
                b[ni][0] = c.x;
                b[ni][1] = c.y;
            }
            // the smallest part first; each goes to every tile before the next (as SOURCE)
            #pragma unroll
            for (int q = 2; q >= 0; --q)
                #pragma unroll
                for (int mi = 0; mi < MI; ++mi)
                    #pragma unroll
                    for (int ni = 0; ni < NI; ++ni) pd_mma16(part[mi][ni], a[mi][q], b[ni]);
        }
        pd_add(acc, part);
    }
    pd_cp_wait<0>();

    pd_store(y + (size_t)blockIdx.z * M * N, acc, m0 + wm, n0 + wn, M, N, g, t);
"""


def _wgmma_function(n: int) -> str:
    """d (n / 2 floats a thread) = A (64x8, a descriptor) B (8 x n, a descriptor) + d if `add` else + 0, TF32 in,
    FP32 accumulators."""
    regs = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))
    return (f"__device__ __forceinline__ void pd_wgmma{n}(float* d, uint64_t a, uint64_t b, int add) {{\n"
            f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n // 2 + 2}, 0;\\n"\n'
            f'                 "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{regs}}}, %{n // 2}, '
            f'%{n // 2 + 1}, p, 1, 1;\\n}}\\n"\n'
            f'                 : {outs}\n'
            f'                 : "l"(a), "l"(b), "r"(add) : "memory");\n}}\n')


# the Hopper kernel's header: HEADER's split, shared-memory descriptors, the warpgroup's fences and its mma
HEADER_WGMMA = HEADER + r"""
// a K-major operand in shared memory as wgmma reads it, no swizzle: 8x4 core matrices of 128 contiguous bytes,
// `lbo` bytes from one to the next along K, `sbo` to the next 8 rows
__device__ __forceinline__ uint64_t pd_desc(const void* p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return (uint64_t)((a & 0x3ffffu) >> 4) | ((uint64_t)((lbo & 0x3ffffu) >> 4) << 16)
           | ((uint64_t)((sbo & 0x3ffffu) >> 4) << 32);
}
// this thread's shared-memory stores, visible to the tensor cores' reads (the async proxy)
__device__ __forceinline__ void pd_fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void pd_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void pd_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void pd_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// the compiler may not move a read or write of r across this point (the accumulators, around the async mma)
__device__ __forceinline__ void pd_fence_reg(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
""" + _wgmma_function(64) + _wgmma_function(128)

SOURCE_WGMMA = r"""
    // y[z] = x[:, kz] @ w[:, kz].T for K slice z, as SOURCE, by one warpgroup per 64 x BN tile (warp w: rows
    // 16 w..). Each 32-deep slice arrives by cp.async as it lies (rows of 32, PITCH 36) in a ring of STAGES;
    // then the block splits it once into TF32 hi and lo copies laid out as wgmma reads K-major operands
    // (core matrix (rows 8 q.., columns 4 c..) at (c * R / 8 + q) * 32 words, its row r at 4 (r & 7)), and
    // each 8-deep step runs three wgmma on them: lo x hi, hi x lo, hi x hi, into a slice's own sum (as SOURCE).
    constexpr int BM = 64, BK = 32, AP = 36, KS = K / SPLIT, SLICES = KS / BK, THREADS = 128, STAGE = (BM + BN) * AP;
    static_assert(KS % BK == 0 && STAGES >= 2 && (BN == 64 || BN == 128));
    extern __shared__ __align__(128) float smem[];
    uint32_t* const ahi = reinterpret_cast<uint32_t*>(smem + STAGES * STAGE);   // [BK / 4][BM / 8][8][4]
    uint32_t* const alo = ahi + BM * BK;
    uint32_t* const bhi = alo + BM * BK;                                       // [BK / 4][BN / 8][8][4]
    uint32_t* const blo = bhi + BN * BK;
    const int M = x_shape[0];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, k_begin = blockIdx.z * KS;

    auto request = [&](int s, int k0) {               // as SOURCE's: x's rows m0.. (zeros past M), w's n0..
        float* As = smem + s * STAGE;
        pd_stage<BM, 4, K, 4 * AP, THREADS>(As, x, m0, M, k0, tid);
        pd_stage<BN, 4, K, 4 * AP, THREADS>(As + BM * AP, w, n0, N, k0, tid);
    };
    // rows of a staged slice (R of them) into hi and lo copies: one 16-byte row of a core matrix each, the
    // threads along the rows, so a quarter-warp's stores fill the 32 banks
    auto split = [&](const float* S, uint32_t* hi, uint32_t* lo, int R) {
        for (int idx = tid; idx < R * 8; idx += THREADS) {
            const int r = idx % R, c = idx / R;
            const float4 v = *reinterpret_cast<const float4*>(S + r * AP + 4 * c);
            uint4 h, l;
            pd_split(v.x, h.x, l.x);
            pd_split(v.y, h.y, l.y);
            pd_split(v.z, h.z, l.z);
            pd_split(v.w, h.w, l.w);
            const int at = ((c * (R / 8) + (r >> 3)) * 8 + (r & 7)) * 4;
            *reinterpret_cast<uint4*>(hi + at) = h;
            *reinterpret_cast<uint4*>(lo + at) = l;
        }
    };

    float acc[BN / 2], part[BN / 2];                   // the block's sum; a slice's, started afresh (as SOURCE)
    #pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] = part[e] = 0.f;

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < SLICES) request(s, k_begin + s * BK);
        pd_cp_commit();
    }
    for (int i = 0; i < SLICES; ++i) {
        pd_cp_wait<STAGES - 2>();                      // this thread's copies of slice i have landed
        __syncthreads();                               // everyone's; slice i - 1's buffer and copies are free
        if (i + STAGES - 1 < SLICES) request((i + STAGES - 1) % STAGES, k_begin + (i + STAGES - 1) * BK);
        pd_cp_commit();
        const float* As = smem + (i % STAGES) * STAGE;
        split(As, ahi, alo, BM);
        split(As + BM * AP, bhi, blo, BN);
        pd_fence_async();
        __syncthreads();                               // every copy written and visible to the tensor cores
        #pragma unroll
        for (int e = 0; e < BN / 2; ++e) pd_fence_reg(part[e]);
        pd_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {          // core columns 2 kk, 2 kk + 1: 8 columns of K
            const uint64_t a_hi = pd_desc(ahi + 8 * kk * BM, 16 * BM, 128);
            const uint64_t a_lo = pd_desc(alo + 8 * kk * BM, 16 * BM, 128);
            const uint64_t b_hi = pd_desc(bhi + 8 * kk * BN, 16 * BN, 128);
            const uint64_t b_lo = pd_desc(blo + 8 * kk * BN, 16 * BN, 128);
            if constexpr (BN == 64) {
                pd_wgmma64(part, a_lo, b_hi, kk);      // the slice's first product starts the sum afresh
                pd_wgmma64(part, a_hi, b_lo, 1);
                pd_wgmma64(part, a_hi, b_hi, 1);
            } else {
                pd_wgmma128(part, a_lo, b_hi, kk);
                pd_wgmma128(part, a_hi, b_lo, 1);
                pd_wgmma128(part, a_hi, b_hi, 1);
            }
        }
        pd_wgmma_commit();
        pd_wgmma_wait0();                              // the copies are read: the next slice may overwrite them
        #pragma unroll
        for (int e = 0; e < BN / 2; ++e) {
            pd_fence_reg(part[e]);
            acc[e] += part[e];
        }
    }
    pd_cp_wait<0>();

    // accumulator 4 j + e: row 16 warp + g (+ 8 for e >= 2), column 8 j + 2 t + (e & 1)
    float* out = y + (size_t)blockIdx.z * M * N;
    #pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int row = m0 + 16 * warp + g, col = n0 + 8 * j + 2 * t;
        if (row < M) *reinterpret_cast<float2*>(out + (size_t)row * N + col) = make_float2(acc[4 * j], acc[4 * j + 1]);
        if (row + 8 < M) *reinterpret_cast<float2*>(out + (size_t)(row + 8) * N + col) =
            make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
"""

_kernels: dict = {}


def _kernel(tiles: Tiles, weight_bytes: int):
    """One compiled kernel per launch shape and weight type (the ring's dynamic shared memory is fixed at
    creation)."""
    if (tiles, weight_bytes) not in _kernels:
        kind = "wgmma" if tiles.wgmma else "bf16x3" if tiles.bf16x3 else f"tf32x{3 if weight_bytes == 4 else 2}"
        warps = "" if tiles.wgmma else f"w{tiles.wm}x{tiles.wn}"
        source = SOURCE_WGMMA if tiles.wgmma else SOURCE_BF16X3 if tiles.bf16x3 else SOURCE
        _kernels[tiles, weight_bytes] = mx.fast.cuda_kernel(
            name=f"pdlib_gemm_{kind}_{tiles.bm}x{tiles.bn}{warps}s{tiles.stages}", input_names=["x", "w"],
            output_names=["y"], source=source, header=HEADER_WGMMA if tiles.wgmma else HEADER,
            shared_memory=tiles.shared_bytes(weight_bytes))
    return _kernels[tiles, weight_bytes]


GEMM_ENV, GEMM_CHOICES = "PDLIB_PREFILL_GEMM", ("bf16x3", "tf32x2", "tf32x3", "fp32", "wgmma")


def choice() -> str:
    """PDLIB_PREFILL_GEMM: `bf16x3` (the default) runs the prefill's matmuls here on CUDA on the bf16 decode
    copies where the model has them, x in three bf16 parts (SOURCE_BF16X3; notes/gpu.md, v24), else as
    `tf32x3`: a chunk's on the FP32 weights; `tf32x2` as bf16x3 with x in two TF32 parts (SOURCE, two products:
    v22-v24's default); `wgmma` tf32x3 by the Hopper kernel (opt-in, slower so far: v21); `fp32` runs MLX's."""
    return env_choice(GEMM_ENV, GEMM_CHOICES)


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
    tile = [("K", K), ("N", N), ("SPLIT", split), ("BM", shape.bm), ("BN", shape.bn), ("WM", shape.wm),
            ("WN", shape.wn), ("STAGES", shape.stages)]
    return tile if shape.bf16x3 else tile + [("WB", weight_bytes)]


def tf32x3_matmul(x: mx.array, w: mx.array, *, shape: Tiles = CHUNK_TILES, split: int | None = None,
                  poison: bool = False, add: mx.array | None = None, swiglu: bool = False,
                  norm: tuple[mx.array, float] | None = None, sums: str | None = None) -> "mx.array | Normed":
    """x (M, K) @ w.T for w (N, K), FP32 x and output, on tensor cores (module docstring), in `shape`'s tiles,
    then `add` + it or its SwiGLU (epilogue_ops); with `norm` (weight, eps) and `add`, the pair (h, RMSNorm of
    h). w FP32 takes the three products; w bf16 (exact in TF32: its lo is zero) two, and half the bytes (not in
    the wgmma kernel; the only kind the bf16x3 kernel takes). `split` overrides k_split; `poison` fills the
    outputs with NaN first, so a test sees any element a kernel skipped; `sums` how a K split is summed and
    finished (SUM_CHOICES), None: PDLIB_PREFILL_GEMM_SUM."""
    M, K = x.shape
    N = w.shape[0]
    if norm is not None and add is None:
        raise ValueError("tf32x3_matmul's norm follows a residual add: pass add too")
    split = k_split(M, K, N, cuda_sm_count(), shape) if split is None else split
    sums = sum_choice() if sums is None else sums
    wb = {mx.float32: 4, mx.bfloat16: 2}.get(w.dtype)
    if (x.dtype != mx.float32 or wb is None or (wb == 2 and shape.wgmma) or (wb == 4 and shape.bf16x3)
            or w.shape[1] != K):
        raise ValueError(f"tf32x3_matmul takes FP32 x (M, K) and w (N, K), FP32 (but not by bf16x3) or bf16 (but not"
                         f" by wgmma), got {x.dtype} {x.shape}, {w.dtype} {w.shape} ({shape.label})")
    if N % shape.bn or K % (split * BK):
        raise ValueError(f"tf32x3_matmul needs N % {shape.bn} == 0 and K % ({BK} * split) == 0, got K={K}, N={N}, "
                         f"split={split}")
    (y,) = _kernel(shape, wb)(inputs=[x, w], template=template(shape, K, N, split, wb),
                              grid=(N // shape.bn * shape.threads, -(-M // shape.bm), split),
                              threadgroup=(shape.threads, 1, 1), output_shapes=[(split, M, N)],
                              output_dtypes=[mx.float32], init_value=float("nan") if poison else None)
    if split > 1 and sums == "fused-norm" and norm is not None:
        return summed(y, add=add, norm=norm, poison=poison)
    if split > 1 and sums != "ops":
        out = summed(y, add=add, swiglu=swiglu, poison=poison)
        return out if norm is None else (out, norm_ops(out, norm))
    return epilogue_ops(y[0] if split == 1 else y.sum(axis=0), add=add, swiglu=swiglu, norm=norm)


SUM_ENV, SUM_CHOICES = "PDLIB_PREFILL_GEMM_SUM", ("fused-norm", "fused", "ops")
Normed = tuple[mx.array, mx.array]   # (h, its RMSNorm): what a matmul returns with `norm`


def sum_choice() -> str:
    """PDLIB_PREFILL_GEMM_SUM: how a K split's parts are summed and the layer's epilogue applied: `fused-norm`
    (the default) by one kernel (summed), which, where a residual add is followed by an RMSNorm (o_proj's by
    the post-norm, down's by the next layer's in-norm or the final norm), applies that too: two launches fewer
    per layer (on the H200 a 128-row chunk step at 4K took 0.2-0.3 ms less: notes/gpu.md, v30); `fused` the
    same kernel without the norm (a 4K chunk step ~0.5 ms faster than `ops`: v26); `ops` MLX's sum and ops."""
    return env_choice(SUM_ENV, SUM_CHOICES)


def norm_ops(h: mx.array, norm: tuple[mx.array, float]) -> mx.array:
    """The RMSNorm after a residual add, as the model ran it before it could ride in the sum: MLX's fused one."""
    return mx.fast.rms_norm(h, *norm)


def epilogue_ops(y: mx.array, *, add: mx.array | None = None, swiglu: bool = False,
                 norm: tuple[mx.array, float] | None = None) -> "mx.array | Normed":
    """What follows a matmul in a layer, as MLX's ops: silu(g) * u of y's halves [g | u] (gate|up's SwiGLU),
    then `add` + it (a residual); with `norm` (weight, eps), the pair (that, its RMSNorm: norm_ops)."""
    if swiglu:
        g, u = y[:, : y.shape[1] // 2], y[:, y.shape[1] // 2:]
        y = g * mx.sigmoid(g) * u
    y = y if add is None else add + y
    return y if norm is None else (y, norm_ops(y, norm))


# A K split's partial outputs summed in z order, and what follows the matmul in the layer, in one pass: o_proj's
# and down's residual add, gate|up's SwiGLU (PDLIB_PREFILL_GEMM_SUM=fused; fused-norm, the default, also the norm
# after a residual: SUM_NORM_SOURCE). MLX's ops would run the
# sum and the epilogue as separate kernels, each a small launch of a chunk step (notes/gpu.md, v26).
# Row r's four columns from col on, summed over a split's parts (SPLIT, M, N) in z order: both sum kernels'.
SUM_OF_PARTS = r"""    auto sum = [&](size_t col) {
        float4 s = *reinterpret_cast<const float4*>(parts + r * N + col);
        #pragma unroll
        for (int z = 1; z < SPLIT; ++z) {
            const float4 v = *reinterpret_cast<const float4*>(parts + ((size_t)z * M + r) * N + col);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        return s;
    };
"""
SUM_SOURCE = r"""
    // out (M, NO) = the sum, then the epilogue (SUM_EPILOGUES); sum = parts[0] + parts[1] + ... (parts (SPLIT,
    // M, N), in that order); NO = N, or N / 2 under SwiGLU; a thread takes four columns
    const int M = parts_shape[1], N = parts_shape[2], NO = N / OUT_DIV;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * NO / 4) return;
    const size_t r = 4 * i / NO, c = 4 * i % NO;
""" + SUM_OF_PARTS + r"""    float4 s = sum(c);
@EPILOGUE@
    *reinterpret_cast<float4*>(out + r * NO + c) = s;
"""
# the epilogue, by kind: none, `add` + the sum (the residual), silu(g) * u of the sum's halves [g | u]
SUM_EPILOGUES = {
    "none": "",
    "add": """    const float4 a = *reinterpret_cast<const float4*>(add + r * N + c);
    s = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
""",
    "swiglu": """    const float4 u = sum(c + NO);
    auto silu_times = [](float g, float v) { return g * (1.f / (1.f + expf(-g))) * v; };
    s = make_float4(silu_times(s.x, u.x), silu_times(s.y, u.y), silu_times(s.z, u.z), silu_times(s.w, u.w));
""",
}


def sum_source(epilogue: str) -> str:
    """SUM_SOURCE with one of SUM_EPILOGUES; `norm`: SUM_NORM_SOURCE."""
    return SUM_NORM_SOURCE if epilogue == "norm" else SUM_SOURCE.replace("@EPILOGUE@\n", SUM_EPILOGUES[epilogue])


# The residual add and the RMSNorm after it (PDLIB_PREFILL_GEMM_SUM=fused-norm): a row's sum of squares needs all
# its columns, so a block takes a row, and the block's partial sums are added in a fixed order (the same values
# every run).
SUM_NORM_SOURCE = r"""
    // out (M, N) = add + the sum of parts (SPLIT, M, N) in z order; normed (M, N) = out * rsqrt(mean(out^2) + eps)
    // * weight (N,): block r takes row r, a thread four columns at a time
    const int M = parts_shape[1], N = parts_shape[2];
    const size_t r = blockIdx.x;
    const int tid = threadIdx.x;
""" + SUM_OF_PARTS + r"""    float ss = 0.f;
    for (int c = 4 * tid; c < N; c += 4 * SUM_THREADS) {
        float4 s = sum(c);
        const float4 a = *reinterpret_cast<const float4*>(add + r * N + c);
        s = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
        *reinterpret_cast<float4*>(out + r * N + c) = s;
        ss += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
    }
    __shared__ float warp_ss[SUM_THREADS / 32];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((tid & 31) == 0) warp_ss[tid >> 5] = ss;
    __syncthreads();
    float total = 0.f;
    #pragma unroll
    for (int i = 0; i < SUM_THREADS / 32; ++i) total += warp_ss[i];
    const float inv = rsqrtf(total / N + __int_as_float(EPS_BITS));
    for (int c = 4 * tid; c < N; c += 4 * SUM_THREADS) {   // this thread's own stores, read back
        const float4 h = *reinterpret_cast<const float4*>(out + r * N + c);
        const float4 g = *reinterpret_cast<const float4*>(weight + c);
        *reinterpret_cast<float4*>(normed + r * N + c) =
            make_float4(h.x * inv * g.x, h.y * inv * g.y, h.z * inv * g.z, h.w * inv * g.w);
    }
"""


SUM_THREADS = 256
_sums: dict = {}


def summed(parts: mx.array, *, add: mx.array | None = None, swiglu: bool = False,
           norm: tuple[mx.array, float] | None = None, poison: bool = False) -> "mx.array | Normed":
    """parts (S, M, N) summed over S in order, then epilogue_ops' `add` or `swiglu`, by one kernel (SUM_SOURCE).
    `add` is (M, N) FP32; under `swiglu` the output is (M, N / 2). With `norm` (weight (N,), eps) and `add`, the
    pair (h, norm_ops(h, norm)) for h = add + the sum, still one kernel (SUM_NORM_SOURCE). `poison` as
    tf32x3_matmul's. The kernels read and write four floats at a time: parts, add and the norm weight are
    row-contiguous arrays of 4k columns (MLX copies any other into that layout), so 16-byte aligned."""
    S, M, N = parts.shape
    halves = 2 if swiglu else 1   # the output's columns are N / halves
    if swiglu and add is not None:
        raise ValueError("summed takes add or swiglu, not both")
    if norm is not None and add is None:
        raise ValueError("summed's norm follows a residual add: pass add too")
    if parts.dtype != mx.float32 or N % (4 * halves):   # a thread's four columns, of each half
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
            output_names=["out"] + ["normed"] * (norm is not None), source=sum_source(epilogue))
    inputs = [parts] + ([add] if add is not None else []) + ([norm[0]] if norm is not None else [])
    nan = float("nan") if poison else None
    if norm is not None:   # a block per row
        return tuple(_sums[epilogue](
            inputs=inputs, template=[("SPLIT", S), ("SUM_THREADS", SUM_THREADS), ("EPS_BITS", float_bits(norm[1]))],
            grid=(M * SUM_THREADS, 1, 1), threadgroup=(SUM_THREADS, 1, 1), output_shapes=[(M, N), (M, N)],
            output_dtypes=[mx.float32, mx.float32], init_value=nan))
    quads = M * N // halves // 4
    (out,) = _sums[epilogue](inputs=inputs, template=[("SPLIT", S), ("OUT_DIV", halves)],
                             grid=(-(-quads // SUM_THREADS) * SUM_THREADS, 1, 1), threadgroup=(SUM_THREADS, 1, 1),
                             output_shapes=[(M, N // halves)], output_dtypes=[mx.float32], init_value=nan)
    return out


def linear_t(x: mx.array, w_t: mx.array, w: mx.array | None = None, *, add: mx.array | None = None,
             swiglu: bool = False, norm: tuple[mx.array, float] | None = None) -> "mx.array | Normed":
    """x: (M, D) @ w_t with w_t: (D, N), the weight's transposed view made once at load (prefill): a step
    then holds no transpose per matmul; then `add` + it or its SwiGLU (epilogue_ops); with `norm` (weight,
    eps) and `add`, the pair (h, norm_ops(h, norm)): the residual and its RMSNorm. On tensor cores when
    enabled() and the shapes tile, from `w`, the same weight as (N, D) bf16 (the decode copy), where given and
    bf16_weights(), else from w_t (a K split's sum carries the epilogue, summed, unless
    PDLIB_PREFILL_GEMM_SUM=ops; and the norm under fused-norm)."""
    if norm is not None and add is None:
        raise ValueError("linear_t's norm follows a residual add: pass add too")
    epilogue = {"add": add, "swiglu": swiglu, "norm": norm}
    if enabled() and x.ndim == 2:
        if w is not None and w.dtype == mx.bfloat16 and bf16_weights() and tiles(x.shape[0], *w_t.shape, bf16=True):
            return tf32x3_matmul(x, w, shape=BF16X3_TILES if choice() == "bf16x3" else CHUNK_TILES, **epilogue)
        if tiles(x.shape[0], *w_t.shape):
            return tf32x3_matmul(x, w_t.T, shape=chunk_tiles(), **epilogue)
    return epilogue_ops(x @ w_t, **epilogue)


def tf32x3_ops(x: mx.array, w: mx.array, **_) -> mx.array:
    """The oracle: the plain FP32 product (MLX_ENABLE_TF32=0 keeps MLX's own matmul FP32 on CUDA)."""
    return x @ w.astype(mx.float32).T

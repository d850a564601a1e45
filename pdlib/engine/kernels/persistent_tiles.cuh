namespace pdp {

// A group's weight phases on tensor cores (mma.m16n8k16.bf16): W (16 rows a tile) times the group's staged
// vectors as mma's 8 columns, each FP32 vector in three exact bf16 parts (pd_split3) as the compiled rounds
// take them. A unit is a tile's K / KSPLIT columns; the KSPLIT warps of a tile are one block's, and the
// tile's first warp sums their parts in slice order. x is read from shared memory once a 16-row tile, not
// once every row or two as gemv reads it.

// the most warps a tile takes (1, 2, 4 or 8) with every unit in one pass where it can; each slice 32 columns
// or a multiple
__host__ __device__ constexpr int tile_split(int tiles, int warps, int k) {
    int s = 8;
    while (s > 1 && (tiles * s > warps || (k / s) % 32 != 0)) s /= 2;
    return s;
}
// 32-column blocks of weights a lane holds ahead (a divisor of the unit's J blocks, at most 4 / M: 8 spill)
__host__ __device__ constexpr int tile_hold(int j, int m) {
    for (int h = 4 / m; h > 1; --h)
        if (j % h == 0) return h;
    return 1;
}

// A lane's weights for HOLD blocks of 32 columns of each of M matrices (rows r and r + N): rows g and g + 8
// of the unit's tile, 16-byte columns 4 j + t of the unit's slice (g = lane / 4, t = lane % 4)
template <int K, int M, int N, int KSPLIT, int HOLD>
struct Tiles {
    static constexpr int KS = K / KSPLIT, J = KS / 32, UNITS = (N + 15) / 16 * KSPLIT;
    static_assert(KS % 32 == 0 && J % HOLD == 0, "a unit is whole blocks of 32 columns, held HOLD at a time");
    uint4 w[HOLD][M][2];
    // block j of unit u into slot s (rows past N as zeros)
    __device__ __forceinline__ void load(const uint4* W, int u, int j, int s, int lane) {
        const int row = u / KSPLIT * 16 + (lane >> 2), c = (u % KSPLIT) * (KS / 8) + 4 * j + (lane & 3);
        #pragma unroll
        for (int m = 0; m < M; ++m)
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                w[s][m][h] = row + 8 * h < N ? W[(size_t)(row + 8 * h + m * N) * (K / 8) + c] : make_uint4(0, 0, 0, 0);
    }
    // the first HOLD blocks of the warp's first unit (before the barrier that precedes its phase; with LATE, after
    // the phase's staging)
    __device__ __forceinline__ void first(const uint4* W, int gw, int lane) {
        if (gw < UNITS)
            #pragma unroll
            for (int s = 0; s < HOLD; ++s) load(W, gw, s, s, lane);
    }
};

__device__ __forceinline__ void bar_named(int id, int threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// y_q = W x_q for the NR (<= 8) staged vectors (vector q at xs4 + q XS4, float4 i at xs_at(i)), units gw, gw +
// TW, ...: g holds the first unit's first blocks; each block, once used, is refilled with the one HOLD on,
// the next unit's where this one has no more. part: the block's WARPS M 128 floats, each warp's fragments
// for its tile's first warp (KSPLIT > 1). epi(q, row, y[, y of row + N]) for each row and q < NR.
template <int K, int M, int N, int KSPLIT, int HOLD, int TW, int NR, int XS4, class Epi>
__device__ __forceinline__ void tgemv(Tiles<K, M, N, KSPLIT, HOLD>& g, const uint4* W, int gw, int lane,
                                      const float4* xs4, float* part, Epi epi) {
    using T = Tiles<K, M, N, KSPLIT, HOLD>;
    static_assert(NR <= 8 && (32 / KSPLIT) * KSPLIT == 32, "mma's 8 columns; a tile's warps within a block");
    const int warp = threadIdx.x >> 5, gr = lane >> 2, t = lane & 3;
    // the B fragment's column gr is vector gr (vector 0 stands in for those past NR: their columns are dropped)
    const float4* xq = xs4 + (gr < NR ? gr : 0) * XS4;
    for (int u = gw; u < T::UNITS; u += TW) {
        const int slice = u % KSPLIT, tile = u / KSPLIT;
        float acc[M][4];
        #pragma unroll
        for (int m = 0; m < M; ++m)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][e] = 0.f;
        #pragma unroll
        for (int j = 0; j < T::J; ++j) {
            const int s = j % HOLD;
            // columns 8 t .. 8 t + 3 of the block are the first mma's k 2 t, 2 t + 1, 2 t + 8, 2 t + 9, the
            // next four the second's: x and W agree, so any four columns serve
            const int i0 = slice * (T::KS / 4) + 8 * j + 2 * t;
            uint32_t p[2][3][2];
            pd_split3(xq[xs_at(i0)], p[0]);
            pd_split3(xq[xs_at(i0 + 1)], p[1]);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                const uint4 r0 = g.w[s][m][0], r8 = g.w[s][m][1];
                const uint32_t a[2][4] = {{r0.x, r8.x, r0.y, r8.y}, {r0.z, r8.z, r0.w, r8.w}};
                float blk[4] = {0.f, 0.f, 0.f, 0.f};  // a block's products in a fresh accumulator, as gemm_bf16x3
                #pragma unroll
                for (int h = 0; h < 2; ++h)
                    #pragma unroll
                    for (int q = 2; q >= 0; --q) pd_mma16(blk, a[h], p[h][q]);  // the smallest part first
                #pragma unroll
                for (int e = 0; e < 4; ++e) acc[m][e] += blk[e];
            }
            if (j + HOLD < T::J) g.load(W, u, j + HOLD, s, lane);
            else if (u + TW < T::UNITS) g.load(W, u + TW, j + HOLD - T::J, s, lane);
        }
        // fragment element e: row gr (+ 8 for e >= 2) of the tile, vector 2 t + e % 2
        const int id = 1 + warp / KSPLIT, w0 = warp - slice;
        if (KSPLIT > 1) {
            #pragma unroll
            for (int m = 0; m < M; ++m)
                #pragma unroll
                for (int e = 0; e < 4; ++e) part[(warp * M + m) * 128 + e * 32 + lane] = acc[m][e];
            bar_named(id, 32 * KSPLIT);
        }
        if (slice == 0) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float y[M];
                #pragma unroll
                for (int m = 0; m < M; ++m) {
                    y[m] = KSPLIT > 1 ? 0.f : acc[m][e];
                    if (KSPLIT > 1)
                        #pragma unroll
                        for (int s = 0; s < KSPLIT; ++s) y[m] += part[((w0 + s) * M + m) * 128 + e * 32 + lane];
                }
                const int row = tile * 16 + gr + 8 * (e >> 1), col = 2 * t + (e & 1);
                if (row < N)
                    #pragma unroll
                    for (int q = 0; q < NR; ++q)
                        if (q == col) epi(q, row, y[0], y[M - 1]);
            }
        }
        if (KSPLIT > 1) bar_named(id, 32 * KSPLIT);  // parts read before the next unit's overwrite them
    }
}

template <bool B, class T, class F> struct pick { using type = T; };
template <class T, class F> struct pick<false, T, F> { using type = F; };

// One weight phase over N rows of M matrices for NR staged vectors: gemv's FMAs (R rows a warp, one request, a
// pair) or, for a group (MMA), tensor-core tiles (KSPLIT and HOLD from the grid's TW warps)
template <int K, int M, int N, int R, int TW, int NR, int XS4, bool MMA>
struct Phase {
    static constexpr int KSPLIT = tile_split((N + 15) / 16, TW, K), HOLD = tile_hold(K / KSPLIT / 32, M);
    using Held = typename pick<MMA, Tiles<K, M, N, KSPLIT, HOLD>, Rows<K, M, R>>::type;
    Held w;
    // the warp's first weights, before the barrier that precedes the phase (with LATE, after its staging)
    __device__ __forceinline__ void load(const uint4* W, int gw, int lane) {
        if constexpr (MMA) w.first(W, gw, lane);
        else w.load(W, N, gw * R, lane);
    }
    template <class Epi>
    __device__ __forceinline__ void run(const uint4* W, int gw, int lane, const float4* xs4, float* part, Epi epi) {
        if constexpr (MMA) tgemv<K, M, N, KSPLIT, HOLD, TW, NR, XS4>(w, W, gw, lane, xs4, part, epi);
        else gemv<K, M, R, N, TW * R, NR, XS4>(w, W, gw * R, lane, xs4, epi);
    }
};

}  // namespace pdp

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

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

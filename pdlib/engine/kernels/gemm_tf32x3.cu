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

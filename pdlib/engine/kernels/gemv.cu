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

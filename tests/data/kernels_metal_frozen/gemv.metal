
    // The CUDA body's structure: ROWS rows per simdgroup, the first pass requested before x is staged.
    constexpr int WARPS = BLOCK / 32, K8 = K / 8, PER = (K8 + 31) / 32, M = SWIGLU ? 2 : 1;
    threadgroup float4 xs4[K / 4];
    threadgroup float red[WARPS];
    threadgroup float* xs = reinterpret_cast<threadgroup float*>(xs4);
    const int tid = thread_position_in_threadgroup.x;
    const int lane = thread_index_in_simdgroup, warp = simdgroup_index_in_threadgroup;
    const device uint4* W4 = reinterpret_cast<const device uint4*>(w);
    const int stride = threadgroups_per_grid.x * WARPS * ROWS;
    int row0 = (threadgroup_position_in_grid.x * WARPS + warp) * ROWS;

    uint4 buf[ROWS][M][PER];
    #define PDLIB_LOAD(R0)                                                                          \
        for (int r = 0; r < ROWS; ++r)                                                                \
        for (int m = 0; m < M; ++m)                                                                   \
        for (int p = 0; p < PER; ++p) {                                                               \
            const int row = (R0) + r, c = lane + 32 * p;                                              \
            if (row < N && (K8 % 32 == 0 || c < K8)) buf[r][m][p] = W4[(size_t)(row + m * N) * K8 + c]; \
        }
    if (row0 < N) { PDLIB_LOAD(row0) }

    const device float4* x4 = reinterpret_cast<const device float4*>(x);
    float ss = 0.f;
    for (int i = tid; i < K / 4; i += BLOCK) { float4 v = x4[i]; xs4[i] = v; ss += dot(v, v); }
    if (NORM) {
        ss = simd_sum(ss);
        if (lane == 0) red[warp] = ss;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float tot = 0.f;
        for (int w = 0; w < WARPS; ++w) tot += red[w];
        const float inv = metal::precise::rsqrt(tot / K + as_type<float>(EPS_BITS));
        for (int i = tid; i < K; i += BLOCK) xs[i] = xs[i] * inv * nw[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (; row0 < N; row0 += stride) {
        uint4 cur[ROWS][M][PER];
        for (int r = 0; r < ROWS; ++r)
            for (int m = 0; m < M; ++m)
                for (int p = 0; p < PER; ++p) cur[r][m][p] = buf[r][m][p];
        if (row0 + stride < N) { PDLIB_LOAD(row0 + stride) }
        float acc[ROWS][M];
        for (int r = 0; r < ROWS; ++r)
            for (int m = 0; m < M; ++m) {
                float a = 0.f;
                for (int p = 0; p < PER; ++p) {
                    const int c = lane + 32 * p;
                    if (K8 % 32 == 0 || c < K8) {
                        const uint4 q = cur[r][m][p];
                        const float4 x0 = xs4[2 * c], x1 = xs4[2 * c + 1];
                        a += as_type<float>(q.x << 16) * x0.x + as_type<float>(q.x & 0xffff0000u) * x0.y
                           + as_type<float>(q.y << 16) * x0.z + as_type<float>(q.y & 0xffff0000u) * x0.w
                           + as_type<float>(q.z << 16) * x1.x + as_type<float>(q.z & 0xffff0000u) * x1.y
                           + as_type<float>(q.w << 16) * x1.z + as_type<float>(q.w & 0xffff0000u) * x1.w;
                    }
                }
                acc[r][m] = simd_sum(a);
            }
        for (int r = 0; r < ROWS; ++r) {
            const int row = row0 + r;
            if (lane == r && row < N) {
                float y = acc[r][0];
                if (SWIGLU) y = y / (1.f + metal::precise::exp(-y)) * acc[r][M - 1];
                if (RESIDUAL) y += res[row];
                out[row] = y;
            }
        }
    }
    #undef PDLIB_LOAD


    // Each warp owns ROWS rows (x2 for SwiGLU) per pass; a lane holds PER 16-byte chunks of each row in
    // registers. The first pass's weights are requested before the block stages x, and each pass requests
    // the next pass's rows before reducing its own, so loads stay in flight behind the arithmetic.
    constexpr int WARPS = BLOCK / 32, K8 = K / 8, PER = (K8 + 31) / 32, M = SWIGLU ? 2 : 1;
    __shared__ float4 xs4[K / 4];
    __shared__ float red[WARPS];
    float* xs = reinterpret_cast<float*>(xs4);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint4* W4 = reinterpret_cast<const uint4*>(w);
    const int stride = gridDim.x * WARPS * ROWS;
    int row0 = (blockIdx.x * WARPS + warp) * ROWS;

    uint4 buf[ROWS][M][PER];
    #define PDLIB_LOAD(R0)                                                                          \
        _Pragma("unroll") for (int r = 0; r < ROWS; ++r)                                              \
        _Pragma("unroll") for (int m = 0; m < M; ++m)                                                 \
        _Pragma("unroll") for (int p = 0; p < PER; ++p) {                                             \
            const int row = (R0) + r, c = lane + 32 * p;                                              \
            if (row < N && (K8 % 32 == 0 || c < K8)) buf[r][m][p] = W4[(size_t)(row + m * N) * K8 + c]; \
        }
    if (row0 < N) { PDLIB_LOAD(row0) }

    const float4* x4 = reinterpret_cast<const float4*>(x);
    float ss = 0.f;
    for (int i = tid; i < K / 4; i += BLOCK) {
        float4 v = x4[i]; xs4[i] = v; ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
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

    for (; row0 < N; row0 += stride) {
        uint4 cur[ROWS][M][PER];
        #pragma unroll
        for (int r = 0; r < ROWS; ++r)
            #pragma unroll
            for (int m = 0; m < M; ++m)
                #pragma unroll
                for (int p = 0; p < PER; ++p) cur[r][m][p] = buf[r][m][p];
        if (row0 + stride < N) { PDLIB_LOAD(row0 + stride) }
        float acc[ROWS][M];
        #pragma unroll
        for (int r = 0; r < ROWS; ++r)
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                float a = 0.f;
                #pragma unroll
                for (int p = 0; p < PER; ++p) {
                    const int c = lane + 32 * p;
                    if (K8 % 32 == 0 || c < K8) {
                        const uint4 q = cur[r][m][p];
                        const float4 x0 = xs4[2 * c], x1 = xs4[2 * c + 1];
                        a += __uint_as_float(q.x << 16) * x0.x + __uint_as_float(q.x & 0xffff0000u) * x0.y
                           + __uint_as_float(q.y << 16) * x0.z + __uint_as_float(q.y & 0xffff0000u) * x0.w
                           + __uint_as_float(q.z << 16) * x1.x + __uint_as_float(q.z & 0xffff0000u) * x1.y
                           + __uint_as_float(q.w << 16) * x1.z + __uint_as_float(q.w & 0xffff0000u) * x1.w;
                    }
                }
                for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
                acc[r][m] = a;
            }
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int row = row0 + r;
            if (lane == r && row < N) {
                float y = acc[r][0];
                if (SWIGLU) y = y / (1.f + expf(-y)) * acc[r][M - 1];
                if (RESIDUAL) y += res[row];
                out[row] = y;
            }
        }
    }
    #undef PDLIB_LOAD

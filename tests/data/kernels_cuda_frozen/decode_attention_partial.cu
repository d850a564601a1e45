
    // grid: (Hkv * NC) blocks of THREADS; block (h, c) = (blockIdx.x / NC, blockIdx.x % NC) covers keys
    // [c * CHUNK, (c + 1) * CHUNK) of KV head h; blocks wholly past P exit (the merge skips them).
    constexpr int REP = HQ / HKV, WARPS = THREADS / 32, DW = DH / 32;
    __shared__ float qs[REP][DH];
    __shared__ float kn[DH];
    __shared__ float vn[DH];
    __shared__ float red[REP + 1][DW];
    __shared__ float wm[WARPS][REP], wl[WARPS][REP];
    __shared__ float wo[WARPS][REP][DH];
    const int h = blockIdx.x / NC, c = blockIdx.x % NC;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int P = pos[0];
    const int start = c * CHUNK, stop = min(start + CHUNK, P + 1);
    if (blockIdx.x == 0 && t == 0) written[0] = after[0] + 1u;
    if (start > P) return;
    const float e = __int_as_float(EPS_BITS), SCALE = __int_as_float(SCALE_BITS);  // RMSNorm eps, 1/sqrt(DH)

    // Warp w takes groups of G consecutive keys (G loads of K and of V in flight per lane): groups w,
    // w + WARPS, ... The first group is requested now, before the q/k prologue, to overlap its latency.
    constexpr int G = GROUP;
    const float4* K4 = reinterpret_cast<const float4*>(kc + (size_t)h * CAP * DH);
    const float4* V4 = reinterpret_cast<const float4*>(vc + (size_t)h * CAP * DH);
    float4 kv[G], vv[G];
    #define PDLIB_LOAD_KV(J0)                                                                         \
        _Pragma("unroll") for (int g = 0; g < G; ++g) {                                               \
            const int j = (J0) + g;                                                                   \
            if (j < P) { kv[g] = K4[(size_t)j * (DH / 4) + lane]; vv[g] = V4[(size_t)j * (DH / 4) + lane]; } \
            else { kv[g] = make_float4(0.f, 0.f, 0.f, 0.f); vv[g] = kv[g]; }                           \
        }
    int j0 = start + warp * G;
    PDLIB_LOAD_KV(j0)

    // q (REP heads) and k of head h: RMSNorm over DH, then RoPE at P; block c == 0 stores the new slot
    pd_qk_norm_rope_store<HQ, HKV, DH, CAP, false>(h, P, c == 0, t, lane, warp, qkv, qn, knw, inv_freq,
                                                   const_cast<float*>(kc), const_cast<float*>(vc), e, SCALE, qs, kn,
                                                   vn, red);

    // online softmax over this block's keys; key P is the new one (from shared memory, not the cache)
    float4 qv[REP];
    float m[REP], l[REP];
    float4 acc[REP];
    for (int r = 0; r < REP; ++r) {
        qv[r] = make_float4(qs[r][lane * 4], qs[r][lane * 4 + 1], qs[r][lane * 4 + 2], qs[r][lane * 4 + 3]);
        m[r] = -INFINITY; l[r] = 0.f; acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float4 kp = make_float4(kn[lane * 4], kn[lane * 4 + 1], kn[lane * 4 + 2], kn[lane * 4 + 3]);
    const float4 vp = make_float4(vn[lane * 4], vn[lane * 4 + 1], vn[lane * 4 + 2], vn[lane * 4 + 3]);
    while (j0 < stop) {
        #pragma unroll
        for (int g = 0; g < G; ++g) if (j0 + g == P) { kv[g] = kp; vv[g] = vp; }
        #pragma unroll
        for (int r = 0; r < REP; ++r) {
            float s[G];
            #pragma unroll
            for (int g = 0; g < G; ++g)
                s[g] = qv[r].x * kv[g].x + qv[r].y * kv[g].y + qv[r].z * kv[g].z + qv[r].w * kv[g].w;
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                #pragma unroll
                for (int g = 0; g < G; ++g) s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
            }
            float mn = m[r];
            #pragma unroll
            for (int g = 0; g < G; ++g) if (j0 + g < stop) mn = fmaxf(mn, s[g]);
            const float corr = expf(m[r] - mn);
            l[r] *= corr;
            acc[r].x *= corr; acc[r].y *= corr; acc[r].z *= corr; acc[r].w *= corr;
            #pragma unroll
            for (int g = 0; g < G; ++g) {
                if (j0 + g < stop) {
                    const float p = expf(s[g] - mn);
                    l[r] += p;
                    acc[r].x += p * vv[g].x; acc[r].y += p * vv[g].y; acc[r].z += p * vv[g].z; acc[r].w += p * vv[g].w;
                }
            }
            m[r] = mn;
        }
        j0 += WARPS * G;
        if (j0 < stop) { PDLIB_LOAD_KV(j0) }
    }
    #undef PDLIB_LOAD_KV
    // merge the warps
    for (int r = 0; r < REP; ++r) {
        if (lane == 0) { wm[warp][r] = m[r]; wl[warp][r] = l[r]; }
        wo[warp][r][lane * 4] = acc[r].x; wo[warp][r][lane * 4 + 1] = acc[r].y;
        wo[warp][r][lane * 4 + 2] = acc[r].z; wo[warp][r][lane * 4 + 3] = acc[r].w;
    }
    __syncthreads();
    for (int i = t; i < REP * DH; i += THREADS) {
        const int r = i / DH, d = i % DH;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, wm[w][r]);
        float Lsum = 0.f, O = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float f = wm[w][r] == -INFINITY ? 0.f : expf(wm[w][r] - M);
            Lsum += wl[w][r] * f;
            O += wo[w][r][d] * f;
        }
        const int hq = h * REP + r;
        part_o[((size_t)hq * NC + c) * DH + d] = O;
        if (d == 0) { part_m[hq * NC + c] = M; part_l[hq * NC + c] = Lsum; }
    }

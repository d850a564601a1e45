
    // The CUDA body line for line (simdgroups for warps).
    constexpr int REP = HQ / HKV, WARPS = THREADS / 32, HALF = DH / 2, DW = DH / 32;
    threadgroup float qs[REP][DH];
    threadgroup float kn[DH];
    threadgroup float vn[DH];
    threadgroup float red[REP + 1][DW];
    threadgroup float wm[WARPS][REP], wl[WARPS][REP];
    threadgroup float wo[WARPS][REP][DH];
    const int gi = threadgroup_position_in_grid.x;
    const int h = gi / NC, c = gi % NC;
    const int t = thread_position_in_threadgroup.x;
    const int lane = thread_index_in_simdgroup, warp = simdgroup_index_in_threadgroup;
    const int P = pos[0];
    const int start = c * CHUNK, stop = min(start + CHUNK, P + 1);
    if (gi == 0 && t == 0) written[0] = after[0] + 1u;
    if (start > P) return;
    const float e = as_type<float>(EPS_BITS), SCALE = as_type<float>(SCALE_BITS);

    constexpr int G = GROUP;
    const device float4* K4 = reinterpret_cast<const device float4*>(kc + (size_t)h * CAP * DH);
    const device float4* V4 = reinterpret_cast<const device float4*>(vc + (size_t)h * CAP * DH);
    float4 kv[G], vv[G];
    #define PDLIB_LOAD_KV(J0)                                                                         \
        for (int g = 0; g < G; ++g) {                                                                 \
            const int j = (J0) + g;                                                                   \
            if (j < P) { kv[g] = K4[(size_t)j * (DH / 4) + lane]; vv[g] = V4[(size_t)j * (DH / 4) + lane]; } \
            else { kv[g] = float4(0.f); vv[g] = float4(0.f); }                                         \
        }
    int j0 = start + warp * G;
    PDLIB_LOAD_KV(j0)

    float raw[REP + 1], ss[REP + 1];
    if (t < DH) {
        for (int r = 0; r < REP; ++r) raw[r] = qkv[(h * REP + r) * DH + t];
        raw[REP] = qkv[(HQ + h) * DH + t];
        for (int r = 0; r <= REP; ++r) {
            float s = simd_sum(raw[r] * raw[r]);
            if (lane == 0) red[r][warp] = s;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t < DH) {
        for (int r = 0; r <= REP; ++r) {
            float s = 0.f;
            for (int w = 0; w < DW; ++w) s += red[r][w];
            ss[r] = metal::precise::rsqrt(s / DH + e);
        }
        for (int r = 0; r < REP; ++r) qs[r][t] = raw[r] * ss[r] * qn[t];
        kn[t] = raw[REP] * ss[REP] * knw[t];
        vn[t] = qkv[(HQ + HKV + h) * DH + t];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float outq[REP], outk = 0.f;
    if (t < DH) {
        const int i = t < HALF ? t : t - HALF;
        const float theta = (float)P * inv_freq[i];
        const float cs = metal::precise::cos(theta), sn = metal::precise::sin(theta);
        for (int r = 0; r < REP; ++r)
            outq[r] = t < HALF ? qs[r][t] * cs - qs[r][t + HALF] * sn : qs[r][t - HALF] * sn + qs[r][t] * cs;
        outk = t < HALF ? kn[t] * cs - kn[t + HALF] * sn : kn[t - HALF] * sn + kn[t] * cs;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t < DH) {
        for (int r = 0; r < REP; ++r) qs[r][t] = outq[r] * SCALE;
        kn[t] = outk;
        if (c == 0) {
            const size_t slot = ((size_t)h * CAP + P) * DH + t;
            const_cast<device float*>(kc)[slot] = outk;
            const_cast<device float*>(vc)[slot] = vn[t];
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    float4 qv[REP];
    float m[REP], l[REP];
    float4 acc[REP];
    for (int r = 0; r < REP; ++r) {
        qv[r] = float4(qs[r][lane * 4], qs[r][lane * 4 + 1], qs[r][lane * 4 + 2], qs[r][lane * 4 + 3]);
        m[r] = -INFINITY; l[r] = 0.f; acc[r] = float4(0.f);
    }
    const float4 kp = float4(kn[lane * 4], kn[lane * 4 + 1], kn[lane * 4 + 2], kn[lane * 4 + 3]);
    const float4 vp = float4(vn[lane * 4], vn[lane * 4 + 1], vn[lane * 4 + 2], vn[lane * 4 + 3]);
    while (j0 < stop) {
        for (int g = 0; g < G; ++g) if (j0 + g == P) { kv[g] = kp; vv[g] = vp; }
        for (int r = 0; r < REP; ++r) {
            float s[G];
            for (int g = 0; g < G; ++g) s[g] = simd_sum(dot(qv[r], kv[g]));
            float mn = m[r];
            for (int g = 0; g < G; ++g) if (j0 + g < stop) mn = fmax(mn, s[g]);
            const float corr = metal::precise::exp(m[r] - mn);
            l[r] *= corr;
            acc[r] *= corr;
            for (int g = 0; g < G; ++g) {
                if (j0 + g < stop) {
                    const float p = metal::precise::exp(s[g] - mn);
                    l[r] += p;
                    acc[r] += p * vv[g];
                }
            }
            m[r] = mn;
        }
        j0 += WARPS * G;
        if (j0 < stop) { PDLIB_LOAD_KV(j0) }
    }
    #undef PDLIB_LOAD_KV
    for (int r = 0; r < REP; ++r) {
        if (lane == 0) { wm[warp][r] = m[r]; wl[warp][r] = l[r]; }
        for (int i = 0; i < 4; ++i) wo[warp][r][lane * 4 + i] = acc[r][i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = t; i < REP * DH; i += THREADS) {
        const int r = i / DH, d = i % DH;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = fmax(M, wm[w][r]);
        float Lsum = 0.f, O = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float f = wm[w][r] == -INFINITY ? 0.f : metal::precise::exp(wm[w][r] - M);
            Lsum += wl[w][r] * f;
            O += wo[w][r][d] * f;
        }
        const int hq = h * REP + r;
        part_o[((size_t)hq * NC + c) * DH + d] = O;
        if (d == 0) { part_m[hq * NC + c] = M; part_l[hq * NC + c] = Lsum; }
    }

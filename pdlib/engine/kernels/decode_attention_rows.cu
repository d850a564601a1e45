    // Decode attention for R rows of one step, each at its own position in its own cache of one pool: the body
    // of decode_attention_partial.cu with a row index. grid: (R * HKV * NC) blocks of THREADS; block (row, h, c)
    // covers keys [c * CHUNK, (c + 1) * CHUNK) of KV head h for the step's row `row`: meta[3 row .. 3 row + 2] =
    // (its row of qkv, its cache's slot in the pool, its position P). kc, vc: the pool (slots x LAYERS x HKV x
    // CAP x DH), this launch's layer layer[0]. Blocks wholly past P exit (the merge skips them).
    constexpr int REP = HQ / HKV, WARPS = THREADS / 32, DW = DH / 32;
    PD_SHARED float qs[REP][DH];
    PD_SHARED float kn[DH];
    PD_SHARED float vn[DH];
    PD_SHARED float red[REP + 1][DW];
    PD_SHARED float wm[WARPS][REP], wl[WARPS][REP];
    PD_SHARED float wo[WARPS][REP][DH];
    const int b = threadgroup_position_in_grid.x;
    const int row = b / (HKV * NC), h = (b / NC) % HKV, c = b % NC;
    const int t = thread_position_in_threadgroup.x, lane = PD_LANE(t, thread_index_in_simdgroup),
              warp = PD_WARP(t, simdgroup_index_in_threadgroup);
    const int P = meta[3 * row + 2];
    const int start = c * CHUNK, stop = min(start + CHUNK, P + 1);
    if (b == 0 && t == 0) written[0] = after[0] + 1u;
    if (start > P) return;
    const float e = PD_INT_AS_FLOAT(EPS_BITS), SCALE = PD_INT_AS_FLOAT(SCALE_BITS);  // RMSNorm eps, 1/sqrt(DH)
    const PD_DEVICE_SPACE float* qkv_row = qkv + (size_t)meta[3 * row] * ((HQ + 2 * HKV) * DH);
    const size_t base = ((size_t)meta[3 * row + 1] * LAYERS + layer[0]) * HKV * CAP * DH;
    const PD_DEVICE_SPACE float* kcl = kc + base;
    const PD_DEVICE_SPACE float* vcl = vc + base;
    // Warp w takes groups of G consecutive keys (G loads of K and of V in flight per lane): groups w,
    // w + WARPS, ... The first group is requested now, before the q/k prologue, to overlap its latency.
    constexpr int G = GROUP;
    const PD_DEVICE_SPACE float4* K4 = reinterpret_cast<const PD_DEVICE_SPACE float4*>(kcl + (size_t)h * CAP * DH);
    const PD_DEVICE_SPACE float4* V4 = reinterpret_cast<const PD_DEVICE_SPACE float4*>(vcl + (size_t)h * CAP * DH);
    float4 kv[G], vv[G];
    #define PDLIB_LOAD_KV(J0)                                                                         \
        PD_UNROLL for (int g = 0; g < G; ++g) {                                                       \
            const int j = (J0) + g;                                                                   \
            if (j < P) { kv[g] = K4[(size_t)j * (DH / 4) + lane]; vv[g] = V4[(size_t)j * (DH / 4) + lane]; } \
            else { kv[g] = PD_FLOAT4(0.f, 0.f, 0.f, 0.f); vv[g] = kv[g]; }                            \
        }
    int j0 = start + warp * G;
    PDLIB_LOAD_KV(j0)

    // q (REP heads) and k of head h: RMSNorm over DH, then RoPE at P; block c == 0 stores the new slot (see the
    // module docstring)
    pd_qk_norm_rope_store<HQ, HKV, DH, CAP, false>(h, P, c == 0, t, lane, warp, qkv_row, qn, knw, inv_freq,
                                                   const_cast<PD_DEVICE_SPACE float*>(kcl),
                                                   const_cast<PD_DEVICE_SPACE float*>(vcl), e, SCALE, qs, kn, vn, red);

    // online softmax over this block's keys; key P is the new one (from shared memory, not the cache)
    float4 qv[REP];
    float m[REP], l[REP];
    float4 acc[REP];
    for (int r = 0; r < REP; ++r) {
        qv[r] = PD_FLOAT4(qs[r][lane * 4], qs[r][lane * 4 + 1], qs[r][lane * 4 + 2], qs[r][lane * 4 + 3]);
        m[r] = -INFINITY; l[r] = 0.f; acc[r] = PD_FLOAT4(0.f, 0.f, 0.f, 0.f);
    }
    const float4 kp = PD_FLOAT4(kn[lane * 4], kn[lane * 4 + 1], kn[lane * 4 + 2], kn[lane * 4 + 3]);
    const float4 vp = PD_FLOAT4(vn[lane * 4], vn[lane * 4 + 1], vn[lane * 4 + 2], vn[lane * 4 + 3]);
    while (j0 < stop) {
        PD_UNROLL
        for (int g = 0; g < G; ++g) if (j0 + g == P) { kv[g] = kp; vv[g] = vp; }
        PD_UNROLL
        for (int r = 0; r < REP; ++r) {
            float s[G];
            PD_UNROLL
            for (int g = 0; g < G; ++g)
                s[g] = qv[r].x * kv[g].x + qv[r].y * kv[g].y + qv[r].z * kv[g].z + qv[r].w * kv[g].w;
            PD_UNROLL
            for (int o = 16; o > 0; o >>= 1) {
                PD_UNROLL
                for (int g = 0; g < G; ++g) s[g] += PD_SHFL_XOR(s[g], o);
            }
            float mn = m[r];
            PD_UNROLL
            for (int g = 0; g < G; ++g) if (j0 + g < stop) mn = PD_FMAX(mn, s[g]);
            const float corr = PD_EXP(m[r] - mn);
            l[r] *= corr;
            acc[r].x *= corr; acc[r].y *= corr; acc[r].z *= corr; acc[r].w *= corr;
            PD_UNROLL
            for (int g = 0; g < G; ++g) {
                if (j0 + g < stop) {
                    const float p = PD_EXP(s[g] - mn);
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
    PD_BARRIER();
    for (int i = t; i < REP * DH; i += THREADS) {
        const int r = i / DH, d = i % DH;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = PD_FMAX(M, wm[w][r]);
        float Lsum = 0.f, O = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float f = wm[w][r] == -INFINITY ? 0.f : PD_EXP(wm[w][r] - M);
            Lsum += wl[w][r] * f;
            O += wo[w][r][d] * f;
        }
        const int hq = row * HQ + h * REP + r;  // the row's heads, one after another
        part_o[((size_t)hq * NC + c) * DH + d] = O;
        if (d == 0) { part_m[hq * NC + c] = M; part_l[hq * NC + c] = Lsum; }
    }

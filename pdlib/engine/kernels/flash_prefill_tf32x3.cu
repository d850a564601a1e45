    // block: query rows r0.. of head h, key tiles [t_begin, t_end) of split z; warp w: rows r0 + 16 w + g and
    // + 8 (g = lane / 4, t = lane % 4), mma.m16n8k8's fragments. Shared rows as they lie, 16-byte chunk c of
    // row r at c ^ f(r): Q's, K's and P's f = r & 7 (a fragment's 8 rows g, column t: 32 banks), V's
    // 2 (r & 3) (a B fragment's 4 keys t by 8 dims g: 32 banks). P is each warp's own 16 rows.
    constexpr int BR = 64, BC = 64, DH = 128, THREADS = 128;
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;              // [BR][DH], q * scale
    float* Ks = Qs + BR * DH;      // [BC][DH]
    float* Vs = Ks + BC * DH;      // [BC][DH]
    float* Ps = Vs + BC * DH;      // [BR][BC], e^(s - m) by row
    __shared__ int kend_s;
    const int HQ = q_shape[0], T = q_shape[1], HKV = kc_shape[0], CAP = kc_shape[1];
    const int h = blockIdx.x, kvh = h / (HQ / HKV), r0 = (gridDim.y - 1 - blockIdx.y) * BR;
    const int z = blockIdx.z, NSPLIT = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int qr = 16 * warp + g;                      // the thread's rows qr and qr + 8 of the block
    const float scale = __int_as_float(SCALE_BITS);
    const bool live = r0 + 16 * warp < T;              // a warp's rows all past T (a 1-row segment): no products
    const float* kh = kc + (size_t)kvh * CAP * DH;
    const float* vh = vc + (size_t)kvh * CAP * DH;

    // Q's rows, zeros past T
    pd_load_tile<BR, DH, THREADS>(Qs, q + (size_t)h * T * DH, r0, T, tid, [](int r) { return r & 7; });
    if (tid == 0) kend_s = 0;
    __syncthreads();
    if (tid < BR && r0 + tid < T) atomicMax(&kend_s, pos[r0 + tid] + 1);
    __syncthreads();
    const int kend = min(kend_s, CAP);                 // keys [0, kend): those some row of the block sees
    const int tiles = (kend + BC - 1) / BC, per = (tiles + NSPLIT - 1) / NSPLIT;
    const int t_begin = min(tiles, z * per), t_end = min(tiles, t_begin + per);

    // one group: keys [k0, k0 + BC) of K or V into dst (chunk c of key k at c ^ sw(k)), zeros past kend
    auto request = [&](float* dst, const float* src, int k0, bool is_v) {
        pd_load_tile<BC, DH, THREADS>(dst, src, k0, kend, tid, [=](int k) { return is_v ? 2 * (k & 3) : k & 7; });
    };
    if (t_begin < t_end) request(Ks, kh, t_begin * BC, false);

    const int pos0 = r0 + qr < T ? pos[r0 + qr] : -1, pos1 = r0 + qr + 8 < T ? pos[r0 + qr + 8] : -1;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float o[16][4];
    #pragma unroll
    for (int j = 0; j < 16; ++j)
        #pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;

    for (int tile = t_begin; tile < t_end; ++tile) {
        const int k0 = tile * BC;
        pd_cp_wait<0>();                               // this thread's copies of K (and, first, Q) have landed
        if (tile == t_begin) {
            #pragma unroll
            for (int n = 0; n < BR * 32 / THREADS; ++n) {   // the reference's q * scale, on this thread's chunks
                const int i = tid + n * THREADS, r = i >> 5, c = i & 31;
                float4* at = reinterpret_cast<float4*>(Qs + r * DH + 4 * (c ^ (r & 7)));
                const float4 v = *at;
                *at = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
            }
        }
        __syncthreads();                               // everyone's have; the last tile's V is read
        request(Vs, vh, k0, true);                     // lands while the scores are made

        // keys 8 j + 2 t + (e & 1), rows qr + 8 (e >> 1); the split's small products (lo x hi) in their own
        // accumulator, so an mma's truncation of its sum (at the largest addend's exponent) costs them no bits
        float s[8][4], ss[8][4];
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = ss[j][e] = 0.f;
        if (live) {
            #pragma unroll 2
            for (int kk = 0; kk < DH; kk += 8) {
                const int c0 = (kk >> 2) ^ g, c1 = ((kk >> 2) + 1) ^ g;   // (row & 7) = g for qr, qr + 8, 8 j + g
                uint32_t ah[4], al[4], bh[8][2], bl[8][2];
                pd_split(Qs[qr * DH + 4 * c0 + t], ah[0], al[0]);
                pd_split(Qs[(qr + 8) * DH + 4 * c0 + t], ah[1], al[1]);
                pd_split(Qs[qr * DH + 4 * c1 + t], ah[2], al[2]);
                pd_split(Qs[(qr + 8) * DH + 4 * c1 + t], ah[3], al[3]);
                #pragma unroll
                for (int j = 0; j < 8; ++j) {
                    pd_split(Ks[(8 * j + g) * DH + 4 * c0 + t], bh[j][0], bl[j][0]);
                    pd_split(Ks[(8 * j + g) * DH + 4 * c1 + t], bh[j][1], bl[j][1]);
                }
                #pragma unroll
                for (int j = 0; j < 8; ++j) pd_mma(ss[j], al, bh[j]);
                #pragma unroll
                for (int j = 0; j < 8; ++j) pd_mma(ss[j], ah, bl[j]);
                #pragma unroll
                for (int j = 0; j < 8; ++j) pd_mma(s[j], ah, bh[j]);
            }
        }
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] += ss[j][e];

        // online softmax: a row's 64 keys lie across the 4 lanes of its quad (t), 16 a lane
        float mt0 = -INFINITY, mt1 = -INFINITY;
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + 8 * j + 2 * t + (e & 1);
                if (key > (e < 2 ? pos0 : pos1)) s[j][e] = -INFINITY;
                if (e < 2) mt0 = fmaxf(mt0, s[j][e]); else mt1 = fmaxf(mt1, s[j][e]);
            }
        #pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, off));
            mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, off));
        }
        const float mn0 = fmaxf(m0, mt0), mn1 = fmaxf(m1, mt1);
        const float sh0 = mn0 == -INFINITY ? 0.f : mn0, sh1 = mn1 == -INFINITY ? 0.f : mn1;
        const float alpha0 = expf(m0 - sh0), alpha1 = expf(m1 - sh1);
        float sum0 = 0.f, sum1 = 0.f;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[j][0] = expf(s[j][0] - sh0); s[j][1] = expf(s[j][1] - sh0);
            s[j][2] = expf(s[j][2] - sh1); s[j][3] = expf(s[j][3] - sh1);
            sum0 += s[j][0] + s[j][1];
            sum1 += s[j][2] + s[j][3];
            // P rows qr, qr + 8 (16 chunks of 4 keys; row & 7 = g), keys 8 j + 2 t, + 1
            const int c = (2 * j + (t >> 1)) ^ g, at = 4 * c + 2 * (t & 1);
            *reinterpret_cast<float2*>(Ps + qr * BC + at) = make_float2(s[j][0], s[j][1]);
            *reinterpret_cast<float2*>(Ps + (qr + 8) * BC + at) = make_float2(s[j][2], s[j][3]);
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
        m0 = mn0;
        m1 = mn1;
        __syncwarp();                                  // the warp's P rows are written (it alone reads them)
        pd_cp_wait<0>();                               // this thread's copies of V have landed
        __syncthreads();                               // everyone's; K's space is free
        if (tile + 1 < t_end) request(Ks, kh, k0 + BC, false);   // lands while the values are summed

        // this tile's P V in a fresh accumulator, added into o in FP32: one held across every tile would lose
        // an mma's truncation per step against the growing sum, a bias toward zero
        float pv[16][4];
        #pragma unroll
        for (int j = 0; j < 16; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) pv[j][e] = 0.f;
        if (live) {
            #pragma unroll 1
            for (int kk = 0; kk < BC; kk += 8) {
                const int c0 = (kk >> 2) ^ g, c1 = ((kk >> 2) + 1) ^ g;
                uint32_t ah[4], al[4];
                pd_split(Ps[qr * BC + 4 * c0 + t], ah[0], al[0]);
                pd_split(Ps[(qr + 8) * BC + 4 * c0 + t], ah[1], al[1]);
                pd_split(Ps[qr * BC + 4 * c1 + t], ah[2], al[2]);
                pd_split(Ps[(qr + 8) * BC + 4 * c1 + t], ah[3], al[3]);
                #pragma unroll
                for (int half = 0; half < 2; ++half) {  // dims 64 half + 8 j + g; keys kk + t, kk + t + 4 (& 3 = t)
                    uint32_t bh[8][2], bl[8][2];
                    #pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int c = ((64 * half + 8 * j + g) >> 2) ^ (2 * t), at = 4 * c + (g & 3);
                        pd_split(Vs[(kk + t) * DH + at], bh[j][0], bl[j][0]);
                        pd_split(Vs[(kk + t + 4) * DH + at], bh[j][1], bl[j][1]);
                    }
                    #pragma unroll
                    for (int j = 0; j < 8; ++j) pd_mma(pv[8 * half + j], al, bh[j]);
                    #pragma unroll
                    for (int j = 0; j < 8; ++j) pd_mma(pv[8 * half + j], ah, bl[j]);
                    #pragma unroll
                    for (int j = 0; j < 8; ++j) pd_mma(pv[8 * half + j], ah, bh[j]);
                }
            }
        }
        #pragma unroll
        for (int j = 0; j < 16; ++j) {
            o[j][0] = fmaf(o[j][0], alpha0, pv[j][0]); o[j][1] = fmaf(o[j][1], alpha0, pv[j][1]);
            o[j][2] = fmaf(o[j][2], alpha1, pv[j][2]); o[j][3] = fmaf(o[j][3], alpha1, pv[j][3]);
        }
    }
    pd_cp_wait<0>();                                   // no copy outlives the block (a split with no tiles: Q's)

    const bool fenced = after[0] != 0u;                // else the cache's writer never ran: NaN, as read_after
    #pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = r0 + qr + 8 * half;
        if (row >= T) continue;
        const float l = half ? l1 : l0;
        const size_t at = ((size_t)z * HQ + h) * T + row;
        const float k = !fenced ? __int_as_float(0x7fc00000) : NSPLIT == 1 ? 1.f / l : 1.f;
        #pragma unroll
        for (int j = 0; j < 16; ++j)
            *reinterpret_cast<float2*>(part + at * DH + 8 * j + 2 * t) =
                make_float2(o[j][2 * half] * k, o[j][2 * half + 1] * k);
        if (t == 0) { stats[2 * at] = half ? m1 : m0; stats[2 * at + 1] = l; }
    }

    // NR requests decode in this launch (PDP_REQS lists each one's buffers: the kernel's own, then tok1, tok2, ...)
    constexpr int WARPS = BLOCK / 32, NQKV = (HQ + 2 * HKV) * DH, NO = HQ * DH;
    constexpr int TW = NB * WARPS;  // warps in the grid
    constexpr int ITEMS = NR * HKV * S;  // attention items: (request, KV head, split)
    static_assert(NR == 1 || !FOLD, "o_proj folded into attention decodes one request a launch");
    // an item may wait for its head's other items (fold): they must be other blocks' first items, or none
    static_assert(S == 1 || ITEMS <= NB, "attention items beyond one per block with S > 1");
    static_assert(NR * HKV <= pdp::SY_FLAGS - pdp::SY_HEAD, "the heads' counts overrun the block flags");
    constexpr int XS = (FF > NO ? FF : NO) > D ? (FF > NO ? FF : NO) : D, XS4 = XS / 4;
    // each request's work arrays in scratch, in this order (scratch_layout), the next request's SCR floats on
    constexpr int OFF_H = 0, OFF_QKV = OFF_H + D, OFF_O = OFF_QKV + NQKV, OFF_ACT = OFF_O + NO;
    constexpr int OFF_H2 = OFF_ACT + FF;  // FOLD: h after attention, while H still holds the layer's input
    constexpr int OFF_HP = OFF_H2 + D;    // FOLD: each KV head's part of o_proj, (HKV, D)
    constexpr int OFF_PM = OFF_HP + HKV * D, OFF_PL = OFF_PM + HQ * S, OFF_PO = OFF_PL + HQ * S;
    constexpr int OFF_CV = OFF_PO + HQ * S * DH, OFF_CI = OFF_CV + NB, SCR = (OFF_CI + NB + 3) / 4 * 4;
    // one request's or a pair's staged vectors fit static shared memory; a group's (more requests: source()
    // defines PDP_GROUP) follow attention's ring in dynamic shared memory (launch sizes it: staged_bytes)
#ifdef PDP_TILES
    // the weight phases on tensor cores (source() defines PDP_TILES, for a group, from TILES_FROM requests); a
    // float4 more a vector, so that mma's B fragments (vectors gr, gr + 1) meet in no bank; then the tiles' parts
#ifndef PDP_GROUP
#error "the tiles' padded vectors and parts live in a group's dynamic shared memory (TILES_FROM past a pair)"
#endif
    constexpr bool MMA = true;
    constexpr int XP4 = XS4 + 1;
#else
    constexpr bool MMA = false;
    constexpr int XP4 = XS4;
#endif
#ifdef PDP_GROUP
    float4* const xs4 = pdp::kv_ring + NST * 2 * WARPS * KVG * DH / 4;
#else
    __shared__ float4 xs4[NR * XS4];
#endif
    float* const part = MMA ? reinterpret_cast<float*>(xs4 + NR * XP4) : nullptr;
    __shared__ float red[NR * WARPS];
    __shared__ float bv[NR][WARPS];
    __shared__ int bi[NR][WARPS];
    __shared__ int last;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, b = blockIdx.x, gw = b * WARPS + warp;
    const uint32_t* const toks[NR] = {PDP_REQS(tok, tok1)};
    const int32_t* const poss[NR] = {PDP_REQS(pos, pos1)};
    const float* const kcs[NR] = {PDP_REQS(kc, kc1)};
    const float* const vcs[NR] = {PDP_REQS(vc, vc1)};
    const uint32_t* const fins[NR] = {PDP_REQS(fin, fin1)};
    uint32_t* const fouts[NR] = {PDP_REQS(fout, fout1)};
    int P[NR];
    unsigned tk[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) { P[q] = poss[q][0]; tk[q] = (unsigned)toks[q][0]; }
    const float eps = __int_as_float(EPS_BITS), scale = __int_as_float(SCALE_BITS);
    unsigned* sy = const_cast<unsigned*>(sync_buf);
    auto at = [&](int q, int off) { return scratch + (size_t)q * SCR + off; };
    float* H2 = at(0, OFF_H2);
    float* HP = at(0, OFF_HP);
    if (b == 0 && t < 4 * NR) {  // the outputs a failed step leaves: ERROR_TOKEN, and the fences advanced
        const int q = t / 4, w = t % 4;
        tok_out[t] = w == 0 ? 0xffffffffu : w == 1 ? 1u : 0u;
        pos_out[t] = w == 0 ? P[q] + 1 : 0;
        fouts[q][w] = w == 0 ? fins[q][0] + 1u : 0u;
    }
    #pragma unroll
    for (int q = 0; q < NR; ++q)
        if (tk[q] >= (unsigned)V || P[q] < 0 || P[q] >= CAP) return;
    // the barriers this buffer saw before this step (the last block of the step before wrote it)
    const unsigned base = __ldcg(sy + pdp::SY_EPOCH);
    unsigned epoch = base;
    // each (request, head)'s count before this step (read before the first barrier; items count in after it)
    __shared__ unsigned cbase[NR * HKV];
    if (t < NR * HKV) cbase[t] = __ldcg(sy + pdp::SY_HEAD + t);
    __shared__ unsigned long long ring_bar[NST];
    pdp::ring_init(ring_bar, NST);
    pdp::Ring ring{ring_bar, 0u, 0u};
    // STAMPS (a profile, off in every real step): block 0's clocks at each phase's start and end
    #define PDP_STAMP(i) if (STAMPS && b == 0 && t == 0) { stamps[i] = pdp::now_ns(); stamps[NL * SPL + 3 + (i)] = clock64(); }
    PDP_STAMP(NL * SPL + 2)
    const uint4* WQKV = reinterpret_cast<const uint4*>(wqkv);
    const uint4* WO = reinterpret_cast<const uint4*>(wo);
    const uint4* WGU = reinterpret_cast<const uint4*>(wgu);
    const uint4* WD = reinterpret_cast<const uint4*>(wdown);
    const uint4* LM = reinterpret_cast<const uint4*>(lm);
    // attention splits: item (q, h, s) takes keys [s * CH, (s + 1) * CH) of P + 1 (CH rounded up to 2 KVG keys)
    int CH[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) CH[q] = (((P[q] + 1) + S - 1) / S + 2 * KVG - 1) / (2 * KVG) * (2 * KVG);
    auto keys_of = [&](int item, int& start, int& stop) {
        const int q = item / (HKV * S);
        start = item % S * CH[q];
        stop = max(start, min(start + CH[q], P[q] + 1));
    };
    constexpr int KS = WARPS * KVG;  // keys per stage of the attention ring
    const float* in[NR];  // the vectors a phase stages, one per request

    pdp::Phase<D, 1, NQKV, 2, TW, NR, XP4, MMA> gq;
    pdp::Phase<D, 1, V, 2, TW, NR, XP4, MMA> gl;
    if (!LATE) gq.load(WQKV, gw, lane);
    for (int l = 0; l < NL; ++l) {
        // the layer's input: the token's embedding, then h
        auto hin = [&](int q) { return l == 0 ? embed + (size_t)tk[q] * D : at(q, OFF_H); };
        // 1: RMSNorm + q|k|v
        PDP_STAMP(l * SPL)
        for (int q = 0; q < NR; ++q) in[q] = hin(q);
        pdp::stage<D, BLOCK, true, NR, XP4>(xs4, in, in_norm + l * D, eps, red);
        if (LATE) gq.load(WQKV + (size_t)l * NQKV * (D / 8), gw, lane);
        PDP_STAMP(l * SPL + 1)
        gq.run(WQKV + (size_t)l * NQKV * (D / 8), gw, lane, xs4, part,
                  [&](int q, int row, float a, float) { __stcg(at(q, OFF_QKV) + row, a); });
        auto KL = [&](int q) { return const_cast<float*>(kcs[q]) + (size_t)l * HKV * CAP * DH; };
        auto VL = [&](int q) { return const_cast<float*>(vcs[q]) + (size_t)l * HKV * CAP * DH; };
        if (b < ITEMS) {  // this block's first attention item: its keys start arriving during the barrier
            int start, stop;
            keys_of(b, start, stop);
            const int q = b / (HKV * S);
            pdp::ring_prefetch<DH, CAP, KS, NST>(ring, KL(q), VL(q), b / S % HKV, start, stop, P[q]);
        }
        PDP_STAMP(l * SPL + 2)
        if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) {  // no block leaves with bytes still landing in its shared memory
            while (ring.used != ring.issued) pdp::ring_wait<DH, KS, NST>(ring, sy + pdp::SY_ERR, SPIN);
            return;
        }
        // 2: attention
        PDP_STAMP(l * SPL + 3)
        for (int item = b; item < ITEMS; item += NB) {
            int start, stop;
            keys_of(item, start, stop);
            const int q = item / (HKV * S), h = item / S % HKV, s = item % S;
            pdp::attend<HQ, HKV, DH, CAP, S, BLOCK, KVG, NST, !FOLD>(h, s, start, stop, P[q], at(q, OFF_QKV),
                q_norm + l * DH, k_norm + l * DH, inv_freq, KL(q), VL(q), at(q, OFF_PM), at(q, OFF_PL),
                at(q, OFF_PO), at(q, OFF_O), sy + pdp::SY_HEAD + q * HKV, cbase[q * HKV + h] + S * (l + 1), eps,
                scale, ring, item == b, sy + pdp::SY_ERR, SPIN);
            if (FOLD && !pdp::fold<HQ, HKV, DH, S, D, BLOCK>(h, s, cbase[h] + S * (l + 1), sy + pdp::SY_HEAD,
                    at(0, OFF_PM), at(0, OFF_PL), at(0, OFF_PO), WO + (size_t)l * D * (NO / 8), HP, at(0, OFF_O),
                    sy + pdp::SY_ERR, SPIN))
                break;  // the barrier below ends the step
        }
        pdp::Phase<D, 2, FF, 1, TW, NR, XP4, MMA> gg;
        if constexpr (FOLD) {  // o_proj is done (in parts): no phase 3
            if (!LATE) gg.load(WGU + (size_t)l * 2 * FF * (D / 8), gw, lane);
            PDP_STAMP(l * SPL + 4)
            if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
            PDP_STAMP(l * SPL + 5)
            PDP_STAMP(l * SPL + 6)
            PDP_STAMP(l * SPL + 7)
        } else {
            pdp::Phase<NO, 1, D, 1, TW, NR, XP4, MMA> go;
            if (!LATE) go.load(WO + (size_t)l * D * (NO / 8), gw, lane);
            PDP_STAMP(l * SPL + 4)
            if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
            // 3: o_proj + residual
            PDP_STAMP(l * SPL + 5)
            for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_O);
            pdp::stage<NO, BLOCK, false, NR, XP4>(xs4, in, nullptr, 0.f, red);
            if (LATE) go.load(WO + (size_t)l * D * (NO / 8), gw, lane);
            PDP_STAMP(l * SPL + 6)
            go.run(WO + (size_t)l * D * (NO / 8), gw, lane, xs4, part,
                      [&](int q, int row, float a, float) { __stcg(at(q, OFF_H) + row, __ldcg(hin(q) + row) + a); });
            if (!LATE) gg.load(WGU + (size_t)l * 2 * FF * (D / 8), gw, lane);
            PDP_STAMP(l * SPL + 7)
            if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
        }
        // 4: RMSNorm + gate|up + SwiGLU (FOLD: h is the layer's input plus each head's part of o_proj)
        PDP_STAMP(l * SPL + 8)
        if constexpr (FOLD) {
            pdp::stage_sum<D, BLOCK, HKV>(xs4, hin(0), HP, H2, b, NB, post_norm + l * D, eps, red);
            if (LATE) gg.load(WGU + (size_t)l * 2 * FF * (D / 8), gw, lane);
        } else {
            for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_H);
            pdp::stage<D, BLOCK, true, NR, XP4>(xs4, in, post_norm + l * D, eps, red);
            if (LATE) gg.load(WGU + (size_t)l * 2 * FF * (D / 8), gw, lane);
        }
        PDP_STAMP(l * SPL + 9)
        gg.run(WGU + (size_t)l * 2 * FF * (D / 8), gw, lane, xs4, part,
                  [&](int q, int row, float g, float u) { __stcg(at(q, OFF_ACT) + row, g / (1.f + expf(-g)) * u); });
        pdp::Phase<FF, 1, D, 1, TW, NR, XP4, MMA> gd;
        if (!LATE) gd.load(WD + (size_t)l * D * (FF / 8), gw, lane);
        PDP_STAMP(l * SPL + 10)
        if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
        // 5: down + residual
        PDP_STAMP(l * SPL + 11)
        for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_ACT);
        pdp::stage<FF, BLOCK, false, NR, XP4>(xs4, in, nullptr, 0.f, red);
        if (LATE) gd.load(WD + (size_t)l * D * (FF / 8), gw, lane);
        PDP_STAMP(l * SPL + 12)
        gd.run(WD + (size_t)l * D * (FF / 8), gw, lane, xs4, part,
                  [&](int q, int row, float a, float) {
                      __stcg(at(q, OFF_H) + row, __ldcg(at(q, FOLD ? OFF_H2 : OFF_H) + row) + a);
                  });
        if (!LATE && l + 1 < NL) gq.load(WQKV + (size_t)(l + 1) * NQKV * (D / 8), gw, lane);
        PDP_STAMP(l * SPL + 13)
        if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
    }
    // final RMSNorm + LM head, each warp keeping each request's best row (the first of equal maxima, as argmax
    // does)
    PDP_STAMP(NL * SPL)
    if (!LATE) gl.load(LM, gw, lane);
    for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_H);
    pdp::stage<D, BLOCK, true, NR, XP4>(xs4, in, fnorm, eps, red);
    if (LATE) gl.load(LM, gw, lane);
    float best[NR];
    int besti[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) { best[q] = -INFINITY; besti[q] = 0x7fffffff; }
    gl.run(LM, gw, lane, xs4, part, [&](int q, int row, float a, float) {
        logits[(size_t)q * V + row] = a;
        if (a > best[q] || (a == best[q] && row < besti[q])) { best[q] = a; besti[q] = row; }
    });
    #pragma unroll
    for (int q = 0; q < NR; ++q) {
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best[q], o);
            const int oi = __shfl_xor_sync(0xffffffffu, besti[q], o);
            if (ov > best[q] || (ov == best[q] && oi < besti[q])) { best[q] = ov; besti[q] = oi; }
        }
    }
    PDP_STAMP(NL * SPL + 1)
    if (lane == 0) {
        #pragma unroll
        for (int q = 0; q < NR; ++q) { bv[q][warp] = best[q]; bi[q][warp] = besti[q]; }
    }
    __syncthreads();
    if (t == 0) {
        #pragma unroll
        for (int q = 0; q < NR; ++q) {
            for (int w = 1; w < WARPS; ++w)
                if (bv[q][w] > best[q] || (bv[q][w] == best[q] && bi[q][w] < besti[q])) {
                    best[q] = bv[q][w]; besti[q] = bi[q][w];
                }
            __stcg(at(q, OFF_CV) + b, best[q]);
            __stcg(reinterpret_cast<int*>(at(q, OFF_CI)) + b, besti[q]);
        }
        __threadfence();
        last = atomicAdd(sy + pdp::SY_DONE, 1u) == (unsigned)(NB - 1);
    }
    __syncthreads();
    if (last && t == 0) {  // every block's best is written: the tokens
        __threadfence();
        #pragma unroll
        for (int q = 0; q < NR; ++q) {
            for (int c = 0; c < NB; ++c) {
                const float v = __ldcg(at(q, OFF_CV) + c);
                const int i = __ldcg(reinterpret_cast<const int*>(at(q, OFF_CI)) + c);
                if (v > best[q] || (v == best[q] && i < besti[q])) { best[q] = v; besti[q] = i; }
            }
            const unsigned token = besti[q] < V ? (unsigned)besti[q] : 0xffffffffu;
            tok_out[4 * q] = token;
            tok_out[4 * q + 1] = 0u;
            const unsigned long long box = (unsigned long long)__ldcg(sy + pdp::SY_BOX + 2 * q)
                                           | (unsigned long long)__ldcg(sy + pdp::SY_BOX + 2 * q + 1) << 32;
            if (box != 0) {  // the host polls for it (mailbox.py): position + 1 and the token, in one 64-bit store
                reinterpret_cast<volatile unsigned long long*>(box)[P[q] % pdp::MBOX_SLOTS] =
                    (unsigned long long)(P[q] + 1) << 32 | token;
                __threadfence_system();  // out to the host now, not whenever the write drains
            }
        }
        atomicExch(sy + pdp::SY_DONE, 0u);
        atomicExch(sy + pdp::SY_EPOCH, epoch);  // every block read base long before: it passed every barrier
    }

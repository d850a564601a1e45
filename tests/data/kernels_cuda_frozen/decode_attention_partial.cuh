// What decode attention needs before its keys, for both decode paths (decode_attention_partial.cu, and
// persistent_decode.cuh's attention items): q (REP query heads) and k of KV head h from the step's raw q|k|v
// projection, RMSNormed over DH by qn / knw, RoPE at position P; q times SCALE into qs, k into kn, v into vn.
// Thread t < DH owns dim t. `store`: also the new slot P of the layer's caches kc, vc (HKV x CAP x DH), in place.
// L2: qkv was written by other blocks of this launch, so it is read through L2 (__ldcg), never a stale L1 line.
template <int HQ, int HKV, int DH, int CAP, bool L2>
__device__ __forceinline__ void pd_qk_norm_rope_store(int h, int P, bool store, int t, int lane, int warp,
                                        const float* qkv, const float* qn,
                                        const float* knw, const float* inv_freq,
                                        float* kc, float* vc, float e, float SCALE,
                                        float (*qs)[DH], float* kn,
                                        float* vn, float (*red)[DH / 32]) {
    constexpr int REP = HQ / HKV, HALF = DH / 2, DW = DH / 32;
    float raw[REP + 1], ss[REP + 1];
    if (t < DH) {
        for (int r = 0; r < REP; ++r) raw[r] = L2 ? __ldcg(qkv + (h * REP + r) * DH + t) : qkv[(h * REP + r) * DH + t];
        raw[REP] = L2 ? __ldcg(qkv + (HQ + h) * DH + t) : qkv[(HQ + h) * DH + t];
        for (int r = 0; r <= REP; ++r) {
            float s = raw[r] * raw[r];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) red[r][warp] = s;
        }
    }
    __syncthreads();
    if (t < DH) {
        for (int r = 0; r <= REP; ++r) {
            float s = 0.f;
            for (int w = 0; w < DW; ++w) s += red[r][w];
            ss[r] = rsqrtf(s / DH + e);
        }
        for (int r = 0; r < REP; ++r) qs[r][t] = raw[r] * ss[r] * qn[t];
        kn[t] = raw[REP] * ss[REP] * knw[t];
        vn[t] = L2 ? __ldcg(qkv + (HQ + HKV + h) * DH + t) : qkv[(HQ + HKV + h) * DH + t];
    }
    __syncthreads();
    float outq[REP], outk = 0.f;
    if (t < DH) {
        const int i = t < HALF ? t : t - HALF;
        const float theta = (float)P * inv_freq[i];
        const float cs = cos(theta), sn = sin(theta);
        for (int r = 0; r < REP; ++r)
            outq[r] = t < HALF ? qs[r][t] * cs - qs[r][t + HALF] * sn : qs[r][t - HALF] * sn + qs[r][t] * cs;
        outk = t < HALF ? kn[t] * cs - kn[t + HALF] * sn : kn[t - HALF] * sn + kn[t] * cs;
    }
    __syncthreads();
    if (t < DH) {
        for (int r = 0; r < REP; ++r) qs[r][t] = outq[r] * SCALE;
        kn[t] = outk;
        if (store) {  // no block reads slot P from the cache in this step: it takes the new key from kn, vn
            const size_t slot = ((size_t)h * CAP + P) * DH + t;
            kc[slot] = outk;
            vc[slot] = vn[t];
        }
    }
    __syncthreads();
}

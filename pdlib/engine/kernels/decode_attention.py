"""Decode attention for one new token, fused with what feeds it: q/k RMSNorm, RoPE at the token's position
and the new K/V slot. FP32 throughout; GQA (REP query heads share a KV head).

    o, k, v, written = decode_attention(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, ...)

`qkv` is the raw q|k|v projection (Hq + 2 Hkv heads of Dh). The layer's caches are (Hkv, cap, Dh); positions
< pos are read from them, position pos from the new k/v. The kernel stores the new k/v at slot pos *in
place*, into the cache it was given as an input: MLX has no in-place output for custom kernels, and the
functional alternative (`slice_update`) cannot reuse the buffer while other kernels of the step still hold
it, so it copied the cache every token (1 GB per step at 4K context with one array for all layers).
Nothing else reads slot pos in the same step (this kernel takes it from registers); the kernel takes the
layer's write fence and outputs the next one (fence.py), so the next write and every read of the cache depend
on this kernel through a buffer it outputs; the validation gate checks every slot written. The ops twin
returns k and v for the caller to store, and the fence unchanged.
Split-K ("flash decoding"): block (h, c) handles KV head h over keys [c*CHUNK, (c+1)*CHUNK) with an online
softmax; a second kernel merges the chunks. Shapes are static (the cache capacity), so a decode step
compiles to one graph; chunks past pos exit at once.
"""

import mlx.core as mx

from pdlib.engine.kernels.attention import causal_mask
from pdlib.engine.kernels.backend import float_bits, kernel_or_none
from pdlib.engine.kernels.rmsnorm import rms_norm

CHUNK, THREADS, GROUP = 128, 256, 8   # keys per block, threads per block (8 warps), keys per warp load group


def decode_attention_ops(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written=None, *, heads: int,
                         kv_heads: int, eps: float, poison: bool = False):
    """The oracle, with the same static shapes: attends over the whole capacity, masking positions > pos.
    -> (o, k, v): it writes no cache, so it needs no fence (`written`) and has nothing to poison."""
    Hkv, cap, Dh = k_cache.shape
    q = qkv[: heads * Dh].reshape(heads, Dh)
    k = qkv[heads * Dh: (heads + kv_heads) * Dh].reshape(kv_heads, Dh)
    v = qkv[(heads + kv_heads) * Dh:].reshape(kv_heads, Dh)

    def norm_rope(x, w):
        x = rms_norm(x, w, eps=eps)
        angle = pos.astype(mx.float32) * inv_freq
        cos, sin = mx.cos(angle), mx.sin(angle)
        x1, x2 = x[:, : Dh // 2], x[:, Dh // 2:]
        return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    q, k = norm_rope(q, q_norm), norm_rope(k, k_norm)
    at_pos = (mx.arange(cap) == pos)[None, :, None]
    keys = mx.where(at_pos, k[:, None, :], k_cache)                 # (Hkv, cap, Dh)
    values = mx.where(at_pos, v[:, None, :], v_cache)
    qg = q.reshape(kv_heads, heads // kv_heads, Dh) * (Dh ** -0.5)
    scores = qg @ keys.swapaxes(-1, -2)                              # (Hkv, rep, cap)
    scores = mx.where(causal_mask(pos, cap)[None], scores, -mx.inf)
    p = mx.exp(scores - mx.max(scores, axis=-1, keepdims=True))
    o = (p / mx.sum(p, axis=-1, keepdims=True)) @ values             # (Hkv, rep, Dh)
    return o.reshape(heads * Dh), k, v


PARTIAL = r"""
    // grid: (Hkv * NC) blocks of THREADS; block (h, c) = (blockIdx.x / NC, blockIdx.x % NC) covers keys
    // [c * CHUNK, (c + 1) * CHUNK) of KV head h; blocks wholly past P exit (the merge skips them).
    constexpr int REP = HQ / HKV, WARPS = THREADS / 32, HALF = DH / 2, DW = DH / 32;
    PD_SHARED float qs[REP][DH];
    PD_SHARED float kn[DH];
    PD_SHARED float vn[DH];
    PD_SHARED float red[REP + 1][DW];
    PD_SHARED float wm[WARPS][REP], wl[WARPS][REP];
    PD_SHARED float wo[WARPS][REP][DH];
    const int h = threadgroup_position_in_grid.x / NC, c = threadgroup_position_in_grid.x % NC;
    const int t = thread_position_in_threadgroup.x, lane = PD_LANE(t, thread_index_in_simdgroup),
              warp = PD_WARP(t, simdgroup_index_in_threadgroup);
    const int P = pos[0];
    const int start = c * CHUNK, stop = min(start + CHUNK, P + 1);
    if (threadgroup_position_in_grid.x == 0 && t == 0) written[0] = after[0] + 1u;
    if (start > P) return;
    const float e = PD_INT_AS_FLOAT(EPS_BITS), SCALE = PD_INT_AS_FLOAT(SCALE_BITS);  // RMSNorm eps, 1/sqrt(DH)

    // Warp w takes groups of G consecutive keys (G loads of K and of V in flight per lane): groups w,
    // w + WARPS, ... The first group is requested now, before the q/k prologue, to overlap its latency.
    constexpr int G = GROUP;
    const PD_DEVICE_SPACE float4* K4 = reinterpret_cast<const PD_DEVICE_SPACE float4*>(kc + (size_t)h * CAP * DH);
    const PD_DEVICE_SPACE float4* V4 = reinterpret_cast<const PD_DEVICE_SPACE float4*>(vc + (size_t)h * CAP * DH);
    float4 kv[G], vv[G];
    #define PDLIB_LOAD_KV(J0)                                                                         \
        PD_UNROLL for (int g = 0; g < G; ++g) {                                                       \
            const int j = (J0) + g;                                                                   \
            if (j < P) { kv[g] = K4[(size_t)j * (DH / 4) + lane]; vv[g] = V4[(size_t)j * (DH / 4) + lane]; } \
            else { kv[g] = PD_FLOAT4(0.f, 0.f, 0.f, 0.f); vv[g] = kv[g]; }                            \
        }
    int j0 = start + warp * G;
    PDLIB_LOAD_KV(j0)

    // q (REP heads) and k of head h: RMSNorm over DH, then RoPE at P (thread t < DH owns dim t)
    float raw[REP + 1], ss[REP + 1];
    if (t < DH) {
        for (int r = 0; r < REP; ++r) raw[r] = qkv[(h * REP + r) * DH + t];
        raw[REP] = qkv[(HQ + h) * DH + t];
        for (int r = 0; r <= REP; ++r) {
            float s = raw[r] * raw[r];
            for (int o = 16; o > 0; o >>= 1) s += PD_SHFL_XOR(s, o);
            if (lane == 0) red[r][warp] = s;
        }
    }
    PD_BARRIER();
    if (t < DH) {
        for (int r = 0; r <= REP; ++r) {
            float s = 0.f;
            for (int w = 0; w < DW; ++w) s += red[r][w];
            ss[r] = PD_RSQRT(s / DH + e);
        }
        for (int r = 0; r < REP; ++r) qs[r][t] = raw[r] * ss[r] * qn[t];
        kn[t] = raw[REP] * ss[REP] * knw[t];
        vn[t] = qkv[(HQ + HKV + h) * DH + t];
    }
    PD_BARRIER();
    float outq[REP], outk = 0.f;
    if (t < DH) {
        const int i = t < HALF ? t : t - HALF;
        const float theta = (float)P * inv_freq[i];
        const float cs = PD_COS(theta), sn = PD_SIN(theta);
        for (int r = 0; r < REP; ++r)
            outq[r] = t < HALF ? qs[r][t] * cs - qs[r][t + HALF] * sn : qs[r][t - HALF] * sn + qs[r][t] * cs;
        outk = t < HALF ? kn[t] * cs - kn[t + HALF] * sn : kn[t - HALF] * sn + kn[t] * cs;
    }
    PD_BARRIER();
    if (t < DH) {
        for (int r = 0; r < REP; ++r) qs[r][t] = outq[r] * SCALE;
        kn[t] = outk;
        if (c == 0) {  // the new slot, stored in place (see the module docstring)
            const size_t slot = ((size_t)h * CAP + P) * DH + t;
            const_cast<PD_DEVICE_SPACE float*>(kc)[slot] = outk;
            const_cast<PD_DEVICE_SPACE float*>(vc)[slot] = vn[t];
        }
    }
    PD_BARRIER();

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
        const int hq = h * REP + r;
        part_o[((size_t)hq * NC + c) * DH + d] = O;
        if (d == 0) { part_m[hq * NC + c] = M; part_l[hq * NC + c] = Lsum; }
    }
"""

REDUCE = r"""
    // grid: HQ blocks of DH threads: merge the live chunks (those at or before P) of head blockIdx.x
    const int hq = threadgroup_position_in_grid.x, t = thread_position_in_threadgroup.x;
    const int live = min(NC, pos[0] / CHUNK + 1);
    float M = -INFINITY;
    for (int c = 0; c < live; ++c) M = PD_FMAX(M, part_m[hq * NC + c]);
    float Lsum = 0.f, O = 0.f;
    for (int c = 0; c < live; ++c) {
        const float mc = part_m[hq * NC + c];
        if (mc == -INFINITY) continue;
        const float f = PD_EXP(mc - M);
        Lsum += part_l[hq * NC + c] * f;
        O += part_o[((size_t)hq * NC + c) * DH + t] * f;
    }
    o[hq * DH + t] = O / Lsum;
"""

_partial = kernel_or_none("pdlib_decode_attn_partial",
                          ["qkv", "qn", "knw", "inv_freq", "pos", "kc", "vc", "after"],
                          ["part_m", "part_l", "part_o", "written"],
                          source=PARTIAL)
_reduce = kernel_or_none("pdlib_decode_attn_reduce", ["part_m", "part_l", "part_o", "pos"], ["o"], source=REDUCE)


def decode_attention_kernel(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, *, heads: int,
                            kv_heads: int, eps: float, poison: bool = False):
    """-> (o, the next fence); stores k and v at slot pos of k_cache / v_cache in place."""
    Hkv, cap, Dh = k_cache.shape
    nc = -(-cap // CHUNK)
    part_m, part_l, part_o, written = _partial(
        inputs=[qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written],
        template=[("HQ", heads), ("HKV", kv_heads), ("DH", Dh), ("CAP", cap), ("NC", nc), ("CHUNK", CHUNK),
                  ("THREADS", THREADS), ("GROUP", GROUP), ("EPS_BITS", float_bits(eps)),
                  ("SCALE_BITS", float_bits(Dh ** -0.5))],
        grid=(kv_heads * nc * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(heads * nc,), (heads * nc,), (heads * nc * Dh,), written.shape],
        output_dtypes=[mx.float32] * 3 + [written.dtype], init_value=float("nan") if poison else None)
    (o,) = _reduce(inputs=[part_m, part_l, part_o, pos], template=[("NC", nc), ("DH", Dh), ("CHUNK", CHUNK)],
                   grid=(heads * Dh, 1, 1), threadgroup=(Dh, 1, 1),
                   output_shapes=[(heads * Dh,)], output_dtypes=[mx.float32],
                   init_value=float("nan") if poison else None)
    return o, written


def stores_kv_in_place(head_dim: int) -> bool:
    """Whether `decode_attention` runs the kernel (which stores the new k/v itself) for this head size."""
    return _partial is not None and head_dim == 128


def decode_attention(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw):
    """-> (o, k, v, written). The kernel on a GPU backend for head_dim 128 (one thread per dim, a float4 per
    lane), which stores k and v itself, returns None for them and the next fence; the ops twin otherwise (the
    CPU, or other head sizes such as the `tiny` preset's), whose k and v the caller stores."""
    if stores_kv_in_place(k_cache.shape[-1]):
        o, written = decode_attention_kernel(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw)
        return o, None, None, written
    return (*decode_attention_ops(qkv, q_norm, k_norm, inv_freq, pos, k_cache, v_cache, written, **kw), written)

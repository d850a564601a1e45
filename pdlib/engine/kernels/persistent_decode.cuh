namespace pdp {

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ float lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }

// sync buffer words, each group on its own 128-byte line; from SY_FLAGS, one word per block; from SY_HEAD, one
// count per (request, KV head); SY_BOX + 2 q and the word after it: the device address of request q's token
// mailbox area (mailbox.py), 0 for none, set when the buffer is made, only read
enum { SY_BOX = 0, SY_EPOCH = 32, SY_ERR = 64, SY_DONE = 96, SY_HEAD = 128, SY_FLAGS = 256 };
constexpr int MBOX_SLOTS = 16;  // mailbox.SLOTS

// Wait at a grid-wide barrier of nb co-resident blocks; false (in every thread) when this or another block
// gave up waiting. Each block has its own flag word and raises it to `epoch` (the barriers this buffer has
// seen, this one included); one warp per block waits until every flag is at epoch or past it. No word is
// contended and nothing is reset: a flag only grows, so a block already at the next barrier still counts
// for this one, and the buffer is reusable as it stands.
__device__ __noinline__ bool grid_sync(unsigned* sy, unsigned nb, unsigned epoch, long long spin) {
    __shared__ int ok;
    __syncthreads();
    if (threadIdx.x < 32) {
        const unsigned lane = threadIdx.x;
        volatile unsigned* err = sy + SY_ERR;
        volatile unsigned* flags = sy + SY_FLAGS;
        bool good = __shfl_sync(0xffffffffu, *err == 0u ? 1 : 0, 0) != 0;  // one decision for the warp
        if (good) {
            if (lane == 0) { __threadfence(); flags[blockIdx.x] = epoch; }  // this block's writes, then its flag
            const long long t0 = clock64();
            while (true) {
                bool up = true;
                for (unsigned i = lane; i < nb; i += 32) up &= (int)(flags[i] - epoch) >= 0;
                if (__all_sync(0xffffffffu, up)) break;
                int stop = *err != 0u ? 1 : clock64() - t0 > spin ? 2 : 0;
                stop = __shfl_sync(0xffffffffu, stop, 0);
                if (stop) {
                    if (stop == 2 && lane == 0) atomicExch(sy + SY_ERR, 1u);
                    good = false;
                    break;
                }
            }
            __threadfence();  // every other block's writes before this block reads them
        }
        if (lane == 0) ok = good;
    }
    __syncthreads();
    return ok != 0;
}

// Where float4 i of a staged vector lies: in each odd group of 8 the pairs are swapped, so that a quarter-warp
// of gemv's lanes (float4s 2c and 2c + 1, 32 bytes apart) reads eight distinct 16-byte bank groups, not four
// twice. An involution within each aligned 16; K / 4 is even, so it stays inside the vector.
__device__ __forceinline__ int xs_at(int i) { return i ^ ((i >> 3) & 1); }

// NR staged vectors (K floats each in shared memory, vector q at xs4 + q XS4, float4 i at xs_at(i); ss[q]: this
// thread's share of its sum of squares) RMSNormed by nw in place (red: NR WARPS floats)
template <int K, int BLOCK, int NR = 1, int XS4 = 0>
__device__ __forceinline__ void normalize(float4* xs4, float* ss, const float* nw, float eps, float* red) {
    constexpr int WARPS = BLOCK / 32;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    #pragma unroll
    for (int q = 0; q < NR; ++q) {
        for (int o = 16; o > 0; o >>= 1) ss[q] += __shfl_xor_sync(0xffffffffu, ss[q], o);
        if (lane == 0) red[q * WARPS + warp] = ss[q];
    }
    __syncthreads();
    float inv[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) {
        float tot = 0.f;
        for (int w = 0; w < WARPS; ++w) tot += red[q * WARPS + w];
        inv[q] = rsqrtf(tot / K + eps);
    }
    for (int i = t; i < K; i += BLOCK) {  // each norm weight read once for all NR vectors
        const int at = (xs_at(i >> 2) << 2) | (i & 3);
        const float w = nw[i];
        #pragma unroll
        for (int q = 0; q < NR; ++q) {
            float* xs = reinterpret_cast<float*>(xs4 + q * XS4);
            xs[at] = xs[at] * inv[q] * w;
        }
    }
}

// NR vectors x[q] (K floats each, written by other blocks: read through L2) into shared memory, vector q at
// xs4 + q XS4 (float4 i at xs_at(i)), each RMSNormed by nw when NORM (red: NR WARPS floats). Every copy is
// requested at once (cp.async, no registers held), then each thread sums the squares of its own float4s: one L2
// round trip for all NR vectors, not one a float4.
template <int K, int BLOCK, bool NORM, int NR = 1, int XS4 = 0>
__device__ __forceinline__ void stage(float4* xs4, const float* const* x, const float* nw, float eps, float* red) {
    #pragma unroll
    for (int q = 0; q < NR; ++q)
        for (int i = threadIdx.x; i < K / 4; i += BLOCK)
            pd_cp16(reinterpret_cast<float*>(xs4 + q * XS4 + xs_at(i)), x[q] + 4 * i, true);
    pd_cp_commit();
    pd_cp_wait<0>();
    float ss[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) {
        ss[q] = 0.f;
        for (int i = threadIdx.x; i < K / 4; i += BLOCK) {
            const float4 v = xs4[q * XS4 + xs_at(i)];
            ss[q] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    }
    if (NORM) normalize<K, BLOCK, NR, XS4>(xs4, ss, nw, eps, red);
    __syncthreads();
}

// A warp's R rows of a bf16 matrix with K columns (M = 2: rows r and r + N, a gate|up pair), held in
// registers: each lane has its 16-byte pieces (8 weights) of each row.
template <int K, int M, int R>
struct Rows {
    static constexpr int K8 = K / 8, PER = (K8 + 31) / 32;
    uint4 q[R][M][PER];
    __device__ __forceinline__ void load(const uint4* W, int N, int row0, int lane) {
        #pragma unroll
        for (int r = 0; r < R; ++r)
            #pragma unroll
            for (int m = 0; m < M; ++m)
                #pragma unroll
                for (int p = 0; p < PER; ++p) {
                    const int row = row0 + r, c = lane + 32 * p;
                    if (row < N && (K8 % 32 == 0 || c < K8)) q[r][m][p] = W[(size_t)(row + m * N) * K8 + c];
                }
    }
};

// y_q = W x_q for each of NR staged vectors (x_q at xs4 + q XS4) over the warp's rows row0, row0 + STRIDE, ...
// < N (R per pass): each weight is read once for every vector. g already holds the first pass (loaded before
// the barrier, or after the staging with LATE), each pass requests the next before reducing its own (with one
// pass, as most phases have, nothing is copied). epi(q, row, y[, y of row + N]) runs in lane r for the pass's row r.
template <int K, int M, int R, int N, int STRIDE, int NR, int XS4, class Epi>
__device__ __forceinline__ void gemv(Rows<K, M, R>& g, const uint4* W, int row0, int lane, const float4* xs4,
                                     Epi epi) {
    constexpr int K8 = K / 8, PER = (K8 + 31) / 32;
    for (; row0 < N; row0 += STRIDE) {
        Rows<K, M, R> cur;
        if (N > STRIDE) {
            cur = g;
            if (row0 + STRIDE < N) g.load(W, N, row0 + STRIDE, lane);
        }
        const Rows<K, M, R>& use = N > STRIDE ? cur : g;
        float acc[NR][R][M];
        #pragma unroll
        for (int q = 0; q < NR; ++q)
            #pragma unroll
            for (int r = 0; r < R; ++r)
                #pragma unroll
                for (int m = 0; m < M; ++m) acc[q][r][m] = 0.f;
        // each vector's slice is read from shared memory once for all R x M rows of the pass (read per row, a
        // group of 8 would ask an SM for more bytes a cycle than it serves, by estimate); sums in p order
        #pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int c = lane + 32 * p;
            if (K8 % 32 == 0 || c < K8) {
                #pragma unroll
                for (int q = 0; q < NR; ++q) {
                    const float4 x0 = xs4[q * XS4 + xs_at(2 * c)], x1 = xs4[q * XS4 + xs_at(2 * c + 1)];
                    #pragma unroll
                    for (int r = 0; r < R; ++r)
                        #pragma unroll
                        for (int m = 0; m < M; ++m) {
                            const uint4 u = use.q[r][m][p];
                            acc[q][r][m] += lo(u.x) * x0.x + hi(u.x) * x0.y + lo(u.y) * x0.z + hi(u.y) * x0.w
                                          + lo(u.z) * x1.x + hi(u.z) * x1.y + lo(u.w) * x1.z + hi(u.w) * x1.w;
                        }
                }
            }
        }
        #pragma unroll
        for (int q = 0; q < NR; ++q)
            #pragma unroll
            for (int r = 0; r < R; ++r)
                #pragma unroll
                for (int m = 0; m < M; ++m)
                    for (int o = 16; o > 0; o >>= 1) acc[q][r][m] += __shfl_xor_sync(0xffffffffu, acc[q][r][m], o);
        #pragma unroll
        for (int r = 0; r < R; ++r)
            if (lane == r && row0 + r < N) {
                #pragma unroll
                for (int q = 0; q < NR; ++q) epi(q, row0 + r, acc[q][r][0], acc[q][r][M - 1]);
            }
    }
}

// Attention's keys and values stream into a ring of NST stages in dynamic shared memory through the Tensor
// Memory Accelerator (cp.async.bulk): one thread requests a stage's contiguous K rows and V rows, and the
// stage's mbarrier completes when their bytes have landed. The warps hold no loads in registers and issue
// none. Stage q (a count kept alike in every thread) uses buffer q % NST and completes phase q / NST of
// that buffer's mbarrier; every stage requested is waited for before its buffer's next request, so no
// mbarrier runs two phases ahead of a waiter.
extern __shared__ __align__(128) float4 kv_ring[];  // NST stages of [K, V][KS keys][DH]

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

struct Ring {
    unsigned long long* bar;  // NST mbarriers in static shared memory
    unsigned issued, used;    // stages requested and stages waited for so far in this launch
};

__device__ __forceinline__ void ring_init(unsigned long long* bar, int n) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < n; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(bar + i)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

// Request the next stage: keys [j0, min(j0 + KS, lim)) of KV head h; with none, the stage just completes.
template <int DH, int CAP, int KS, int NST>
__device__ __forceinline__ void ring_issue(Ring& r, const float* kc, const float* vc, int h, int j0, int lim) {
    if (threadIdx.x == 0) {
        const unsigned bar = smem_u32(r.bar + r.issued % NST);
        float* dst = reinterpret_cast<float*>(kv_ring) + (size_t)(r.issued % NST) * 2 * KS * DH;
        const int n = max(0, min(KS, lim - j0));
        if (n > 0) {
            const unsigned bytes = (unsigned)n * DH * 4;
            const size_t src = ((size_t)h * CAP + j0) * DH;
            // the block's reads of this buffer (ordered before by a __syncthreads) come before the async writes
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(2 * bytes)
                         : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(smem_u32(dst)), "l"(kc + src), "r"(bytes), "r"(bar) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(smem_u32(dst + KS * DH)), "l"(vc + src), "r"(bytes), "r"(bar) : "memory");
        } else {
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
        }
    }
    ++r.issued;
}

// Wait (every thread) for the oldest stage not yet waited for; returns its buffer. A stage that has not
// landed within the spin budget flags the error (the next grid barrier then ends the launch). An error
// flagged elsewhere does not cut the wait short: the bytes land whatever other blocks do, and a buffer may
// only be requested again once its last request has completed.
template <int DH, int KS, int NST>
__device__ __forceinline__ const float4* ring_wait(Ring& r, unsigned* sy_err, long long spin) {
    const unsigned bar = smem_u32(r.bar + r.used % NST), parity = (r.used / NST) & 1u;
    const long long t0 = clock64();
    while (true) {
        unsigned done;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        if (done) break;
        if (clock64() - t0 > spin) { atomicExch(sy_err, 1u); break; }
    }
    const float4* buf = kv_ring + (size_t)(r.used % NST) * 2 * KS * (DH / 4);
    ++r.used;
    return buf;
}

// An attention item's first NST stages (keys [start, stop) of head h; key P, the new one, is not read from
// the cache), requested before the grid barrier that precedes attention: the cache does not depend on it.
template <int DH, int CAP, int KS, int NST>
__device__ __forceinline__ void ring_prefetch(Ring& r, const float* kc, const float* vc, int h, int start,
                                              int stop, int P) {
    #pragma unroll
    for (int i = 0; i < NST; ++i) ring_issue<DH, CAP, KS, NST>(r, kc, vc, h, start + i * KS, min(stop, P));
}

// One attention work item: KV head h over keys [start, stop) (stop <= P + 1; key P is the new one), the
// decode_attention kernel's partial pass, its result (m, l, o) per query head written for split s; the last
// of a head's S items to finish merges them into o. qkv is this step's projection (read through L2). Keys
// and values arrive in stages of KS = WARPS G keys (G per warp) through the ring; `issued` says ring_prefetch
// already requested the first NST.
// Head h's S split results (m, l, o per query head) merged into its REP DH outputs, as the decode_attention
// reduce kernel does: out(i, value) for i = r DH + d, the output of query head h REP + r.
template <int HQ, int HKV, int DH, int S, int BLOCK, class Out>
__device__ __forceinline__ void merge_head(int h, const float* pm, const float* pl, const float* po, Out out) {
    constexpr int REP = HQ / HKV;
    for (int i = threadIdx.x; i < REP * DH; i += BLOCK) {
        const int r = i / DH, d = i % DH, hq = h * REP + r;
        float M = -INFINITY;
        #pragma unroll
        for (int c = 0; c < S; ++c) M = fmaxf(M, __ldcg(pm + hq * S + c));
        float Lsum = 0.f, O = 0.f;
        #pragma unroll
        for (int c = 0; c < S; ++c) {
            const float mc = __ldcg(pm + hq * S + c);
            if (mc == -INFINITY) continue;
            const float f = expf(mc - M);
            Lsum += __ldcg(pl + hq * S + c) * f;
            O += __ldcg(po + ((size_t)hq * S + c) * DH + d) * f;
        }
        out(i, O / Lsum);
    }
}

// Each item counts itself in on its head's count, which grows by S per layer and reaches `target` when the
// head's last item is in. MERGE: that last item merges the head into o; otherwise `fold` merges.
template <int HQ, int HKV, int DH, int CAP, int S, int BLOCK, int G, int NST, bool MERGE>
__device__ __forceinline__ void attend(int h, int s, int start, int stop, int P, const float* qkv,
                                       const float* qn, const float* knw, const float* inv_freq, float* kc,
                                       float* vc, float* pm, float* pl, float* po, float* o, unsigned* count,
                                       unsigned target, float e, float SCALE, Ring& ring, bool issued,
                                       unsigned* sy_err, long long spin) {
    constexpr int REP = HQ / HKV, WARPS = BLOCK / 32, DW = DH / 32, KS = WARPS * G, Q = DH / 4;
    __shared__ float qs[REP][DH];
    __shared__ float kn[DH];
    __shared__ float vn[DH];
    __shared__ float red[REP + 1][DW];
    __shared__ float wm[WARPS][REP], wl[WARPS][REP];
    __shared__ float wo[WARPS][REP][DH];
    __shared__ int last;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (!issued) ring_prefetch<DH, CAP, KS, NST>(ring, kc, vc, h, start, stop, P);

    pd_qk_norm_rope_store<HQ, HKV, DH, CAP, true>(h, P, s == 0, t, lane, warp, qkv, qn, knw, inv_freq, kc, vc, e,
                                                  SCALE, qs, kn, vn, red);

    float4 qv[REP];
    float m[REP], l[REP];
    float4 acc[REP];
    for (int r = 0; r < REP; ++r) {
        qv[r] = make_float4(qs[r][lane * 4], qs[r][lane * 4 + 1], qs[r][lane * 4 + 2], qs[r][lane * 4 + 3]);
        m[r] = -INFINITY; l[r] = 0.f; acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float4 kp = make_float4(kn[lane * 4], kn[lane * 4 + 1], kn[lane * 4 + 2], kn[lane * 4 + 3]);
    const float4 vp = make_float4(vn[lane * 4], vn[lane * 4 + 1], vn[lane * 4 + 2], vn[lane * 4 + 3]);
    const int lim = min(stop, P), stages = (stop - start + KS - 1) / KS;
    for (int i = 0; i < stages; ++i) {
        const float4* st = ring_wait<DH, KS, NST>(ring, sy_err, spin);
        const int j0 = start + i * KS + warp * G;
        float4 kv[G], vv[G];
        #pragma unroll
        for (int g = 0; g < G; ++g) {
            kv[g] = j0 + g == P ? kp : st[(warp * G + g) * Q + lane];
            vv[g] = j0 + g == P ? vp : st[(KS + warp * G + g) * Q + lane];
        }
        if (j0 < stop)  // (a warp whose keys all lie past stop has none in this stage)
        #pragma unroll
        for (int r = 0; r < REP; ++r) {
            float sc[G];
            #pragma unroll
            for (int g = 0; g < G; ++g)
                sc[g] = qv[r].x * kv[g].x + qv[r].y * kv[g].y + qv[r].z * kv[g].z + qv[r].w * kv[g].w;
            #pragma unroll
            for (int o2 = 16; o2 > 0; o2 >>= 1) {
                #pragma unroll
                for (int g = 0; g < G; ++g) sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], o2);
            }
            float mn = m[r];
            #pragma unroll
            for (int g = 0; g < G; ++g) if (j0 + g < stop) mn = fmaxf(mn, sc[g]);
            const float corr = expf(m[r] - mn);
            l[r] *= corr;
            acc[r].x *= corr; acc[r].y *= corr; acc[r].z *= corr; acc[r].w *= corr;
            #pragma unroll
            for (int g = 0; g < G; ++g) {
                if (j0 + g < stop) {
                    const float p = expf(sc[g] - mn);
                    l[r] += p;
                    acc[r].x += p * vv[g].x; acc[r].y += p * vv[g].y; acc[r].z += p * vv[g].z; acc[r].w += p * vv[g].w;
                }
            }
            m[r] = mn;
        }
        __syncthreads();  // every warp is done with the buffer: refill it with stage i + NST
        ring_issue<DH, CAP, KS, NST>(ring, kc, vc, h, start + (i + NST) * KS, lim);
    }
    while (ring.used != ring.issued) ring_wait<DH, KS, NST>(ring, sy_err, spin);  // the empty tail
    for (int r = 0; r < REP; ++r) {
        if (lane == 0) { wm[warp][r] = m[r]; wl[warp][r] = l[r]; }
        wo[warp][r][lane * 4] = acc[r].x; wo[warp][r][lane * 4 + 1] = acc[r].y;
        wo[warp][r][lane * 4 + 2] = acc[r].z; wo[warp][r][lane * 4 + 3] = acc[r].w;
    }
    __syncthreads();
    for (int i = t; i < REP * DH; i += BLOCK) {
        const int r = i / DH, d = i % DH, hq = h * REP + r;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, wm[w][r]);
        float Lsum = 0.f, O = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float f = wm[w][r] == -INFINITY ? 0.f : expf(wm[w][r] - M);
            Lsum += wl[w][r] * f;
            O += wo[w][r][d] * f;
        }
        __stcg(po + ((size_t)hq * S + s) * DH + d, O);
        if (d == 0) { __stcg(pm + hq * S + s, M); __stcg(pl + hq * S + s, Lsum); }
    }
    __syncthreads();
    if (t == 0) {
        __threadfence();
        const unsigned now_in = atomicAdd(count + h, 1u) + 1u;  // always counted in (fold waits on it)
        last = MERGE && now_in == target;
    }
    __syncthreads();
    if (MERGE && last) {  // every split of head h is written: merge them
        __threadfence();
        merge_head<HQ, HKV, DH, S, BLOCK>(h, pm, pl, po, [&](int i, float v) { __stcg(o + h * REP * DH + i, v); });
    }
    __syncthreads();
}

// o_proj folded into attention: once head h's S items have all counted in (its count at `target`), each of
// them merges the head itself and applies W_o's columns of the head (its REP query heads) to its share of
// the rows, [s D / S, (s + 1) D / S): hp (HKV, D) holds each head's part of o_proj, which the next phase
// adds in head order. Item s = 0 also writes the merged head into o. False (in every thread) when the wait
// gave up (another block failed, or the timeout).
template <int HQ, int HKV, int DH, int S, int D, int BLOCK>
__device__ __forceinline__ bool fold(int h, int s, unsigned target, unsigned* count, const float* pm,
                                     const float* pl, const float* po, const uint4* wo, float* hp, float* o,
                                     unsigned* sy_err, long long spin) {
    constexpr int REP = HQ / HKV, WARPS = BLOCK / 32, C8 = REP * DH / 8, NO8 = HQ * DH / 8;
    __shared__ float oh[REP * DH];
    __shared__ int ok;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (t == 0) {
        volatile unsigned* c = count + h;
        volatile unsigned* err = sy_err;
        int good = 1;
        const long long t0 = clock64();
        while ((int)(*c - target) < 0) {
            if (*err != 0u) { good = 0; break; }
            if (clock64() - t0 > spin) { atomicExch(sy_err, 1u); good = 0; break; }
        }
        __threadfence();
        ok = good;
    }
    __syncthreads();
    if (!ok) return false;
    merge_head<HQ, HKV, DH, S, BLOCK>(h, pm, pl, po, [&](int i, float v) {
        oh[i] = v;
        if (s == 0) __stcg(o + h * REP * DH + i, v);
    });
    __syncthreads();
    for (int r = s * D / S + warp; r < (s + 1) * D / S; r += WARPS) {
        float a = 0.f;
        for (int c = lane; c < C8; c += 32) {
            const uint4 u = wo[(size_t)r * NO8 + h * C8 + c];
            const float* x = oh + 8 * c;
            a += lo(u.x) * x[0] + hi(u.x) * x[1] + lo(u.y) * x[2] + hi(u.y) * x[3]
               + lo(u.z) * x[4] + hi(u.z) * x[5] + lo(u.w) * x[6] + hi(u.w) * x[7];
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o2);
        if (lane == 0) __stcg(hp + (size_t)h * D + r, a);
    }
    __syncthreads();  // oh is read; the next item may overwrite it
    return true;
}

// x = base + parts[0] + ... + parts[NP - 1] (K floats each, written by other blocks; added in that order)
// into shared memory, block b of nb writing its slice of x to out, then RMSNormed by nw
template <int K, int BLOCK, int NP>
__device__ __forceinline__ void stage_sum(float4* xs4, const float* base, const float* parts, float* out, int b,
                                          int nb, const float* nw, float eps, float* red) {
    constexpr int K4 = K / 4;
    const int i0 = b * K4 / nb, i1 = (b + 1) * K4 / nb;
    float ss = 0.f;
    for (int i = threadIdx.x; i < K4; i += BLOCK) {
        float4 v = __ldcg(reinterpret_cast<const float4*>(base) + i);
        #pragma unroll
        for (int p = 0; p < NP; ++p) {
            const float4 w = __ldcg(reinterpret_cast<const float4*>(parts + (size_t)p * K) + i);
            v.x += w.x; v.y += w.y; v.z += w.z; v.w += w.w;
        }
        xs4[xs_at(i)] = v;
        if (i >= i0 && i < i1) __stcg(reinterpret_cast<float4*>(out) + i, v);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    normalize<K, BLOCK>(xs4, &ss, nw, eps, red);
    __syncthreads();
}

}  // namespace pdp

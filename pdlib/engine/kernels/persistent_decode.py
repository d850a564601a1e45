"""Decode as one persistent kernel per token (CUDA): every layer, the final norm, the LM head and the greedy pick
in one launch, phases separated by a software grid barrier, so a token costs one launch and one host read.

    dw = DecodeWeights(embed=..., qkv=mx.stack(...), ...)      # the layers' decode matrices stacked per kind
    sync = new_sync()                                           # one per request, reused by its every step
    logits, token, next_pos, ks, vs, written = decode_persistent(token, pos, dw, cache.k_all, cache.v_all,
                                                                 cache.written, sync, heads=16, kv_heads=8, eps=1e-6)
    (la, ta, pa, wa), (lb, tb, pb, wb) = decode_persistent_pair(    # two requests, one launch, their own sync
        (tok_a, pos_a, ka, va, fa), (tok_b, pos_b, kb, vb, fb), dw, new_sync(), heads=16, kv_heads=8, eps=1e-6)

Same contract as Qwen3.decode_step, over the cache's stacked K and V (L, Hkv, capacity, Dh) so that the launch
takes few buffers (MLX's host work grows with them): the new K/V slots are stored in place (ks, vs are
empty) and the cache's write fence comes back advanced (fence.py). The arithmetic is the per-operation
kernels' (gemv.py, decode_attention.py): bf16 weights, FP32 accumulation, the same online softmax. Per
layer, five phases:

    1 RMSNorm(h) in every block, q|k|v rows spread over all warps                      grid barrier
    2 q/k norm + RoPE, the new slot stored, split-K attention: (KV head, split) items;
      the last block to finish a head merges its splits into o                         grid barrier
    3 o_proj + residual into h (each row read and written by one warp)                  grid barrier
    4 RMSNorm(h) + gate|up + SwiGLU into act                                            grid barrier
    5 down + residual into h                                                            grid barrier

With o_proj folded into attention (PDLIB_PERSISTENT_FOLD=1, `fold`; off: ~2.5 µs a layer slower on the
H200), phase 3 goes: every item of a head waits for the head's others, merges it and applies its columns of
W_o to its share of the rows; phase 4 adds the heads' parts to the layer's input in head order. Four phases,
four barriers. Then RMSNorm + LM head with a per-block argmax, and the last block to finish picks the token.
Each warp requests its next phase's first weight rows before it waits at a barrier (weights do not depend on
it), and each block its first attention item's keys and values (the Tensor Memory Accelerator streams them
into a ring of stages in dynamic shared memory, 128 KB in flight per SM, without holding registers).

Co-residency: a grid barrier deadlocks if a block is never scheduled, so the grid is one block per SM (read
from the driver), 256 threads, ~23 KB (a pair's ~35 KB) of static and 128 KB of dynamic shared memory: always
resident.
Behind that, every wait (at a barrier, or for a stage of the ring) has a timeout: a block that waits ~1 s
flags an error in the sync buffer, every block then leaves, and the step's token comes back as ERROR_TOKEN,
which `check_token` turns into a clear error on the host (the flag stays set, so later steps fail too
rather than run on a broken barrier). Data that other blocks wrote in this launch is read with __ldcg (L2,
never a stale L1 line) and written with __stcg. The barrier is a flag per block in the sync buffer (a few
words and MAX_BLOCKS flags, ~17 KB): no block waits on a contended counter (MLX keeps arrays of 8 bytes or
less in managed memory, where one barrier costs ~0.7 ms: MEASURED.md). With PDLIB_TOKEN_READ=mailbox the
last block also leaves the token in pinned host memory, where the host polls for it (mailbox.py; the sync
buffer holds the address).
Two requests decode in one launch where a step carries both (decode_persistent_pair; the same BODY with NR = 2,
its second request's buffers in PAIR_INPUTS): each phase stages both vectors and multiplies every weight row it
loads by both, so the weights are read and the barriers paid once for two tokens; attention's items are
(request, KV head, split), with half the splits per head.
Metal has no co-residency guarantee, so there the per-operation kernels stay.
"""

import functools
import os
from dataclasses import dataclass

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND, cuda_sm_count, float_bits
from pdlib.engine.kernels.decode_attention import decode_attention_ops
from pdlib.engine.kernels.gemv import gemv_ops
from pdlib.errors import InputError

BLOCK = 256
FOLD_ENV = "PDLIB_PERSISTENT_FOLD"  # "1": o_proj folded into attention (four phases a layer; measured slower)
MAX_BLOCKS = 4096  # the sync buffer's block flags
SY_BOX, SY_EPOCH, SY_ERR, SY_HEAD, SY_FLAGS = 0, 32, 64, 128, 256  # the sync buffer's words (HEADER's enum)
SYNC_WORDS = SY_FLAGS + MAX_BLOCKS
ERROR_TOKEN = 0xFFFFFFFF
SPIN_CYCLES = 2_000_000_000  # ~1 s at the H200's ~2 GHz before a wait gives up
KV_GROUP = 4  # keys per warp per stage of attention's ring
KV_STAGES = 4  # stages of the ring in flight (each BLOCK / 32 * KV_GROUP keys, K and V)


@dataclass(frozen=True)
class DecodeWeights:
    """The decode step's weights with the layers stacked per kind (one pointer each for the kernel)."""
    embed: mx.array       # (V, D) FP32, the input embedding
    qkv: mx.array         # (L, (Hq + 2 Hkv) Dh, D) bf16
    o: mx.array           # (L, D, Hq Dh) bf16
    gate_up: mx.array     # (L, 2 F, D) bf16: gate rows, then up rows
    down: mx.array        # (L, D, F) bf16
    lm_head: mx.array     # (V, D) bf16
    in_norm: mx.array     # (L, D)
    post_norm: mx.array   # (L, D)
    q_norm: mx.array      # (L, Dh)
    k_norm: mx.array      # (L, Dh)
    norm: mx.array        # (D,) the final norm
    inv_freq: mx.array    # (Dh / 2,) RoPE


def decode_persistent_ops(token, pos, dw: DecodeWeights, k_all, v_all, written, sync=None, *, heads: int,
                          kv_heads: int, eps: float, poison: bool = False):
    """The oracle: Qwen3.decode_step's ops path over the stacked weights and caches (L, Hkv, cap, Dh) ->
    (logits, token, pos + 1, ks, vs, written), the new rows (Hkv, 1, Dh) per layer for the caller to store
    and the fence unchanged."""
    h = dw.embed[token].reshape(dw.embed.shape[1])
    ks, vs = [], []
    for i in range(k_all.shape[0]):
        qkv = gemv_ops(h, dw.qkv[i], norm=dw.in_norm[i], eps=eps)
        o, k, v = decode_attention_ops(qkv, dw.q_norm[i], dw.k_norm[i], dw.inv_freq, pos, k_all[i], v_all[i],
                                       heads=heads, kv_heads=kv_heads, eps=eps)
        h = gemv_ops(o, dw.o[i], residual=h)
        act = gemv_ops(h, dw.gate_up[i], norm=dw.post_norm[i], eps=eps, swiglu=True)
        h = gemv_ops(act, dw.down[i], residual=h)
        ks.append(k[:, None])
        vs.append(v[:, None])
    logits = gemv_ops(h, dw.lm_head, norm=dw.norm, eps=eps)
    return logits, mx.argmax(logits), pos + 1, ks, vs, written


HEADER = r"""
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

// NR staged vectors (K floats each in shared memory, vector q at xs4 + q XS4; ss[q]: this thread's share of its
// sum of squares) RMSNormed by nw in place (red: NR WARPS floats)
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
    #pragma unroll
    for (int q = 0; q < NR; ++q) {
        float tot = 0.f;
        for (int w = 0; w < WARPS; ++w) tot += red[q * WARPS + w];
        const float inv = rsqrtf(tot / K + eps);
        float* xs = reinterpret_cast<float*>(xs4 + q * XS4);
        for (int i = t; i < K; i += BLOCK) xs[i] = xs[i] * inv * nw[i];
    }
}

// NR vectors x[q] (K floats each, written by other blocks: read through L2) into shared memory, vector q at
// xs4 + q XS4, each RMSNormed by nw when NORM (red: NR WARPS floats)
template <int K, int BLOCK, bool NORM, int NR = 1, int XS4 = 0>
__device__ __forceinline__ void stage(float4* xs4, const float* const* x, const float* nw, float eps, float* red) {
    float ss[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) {
        ss[q] = 0.f;
        for (int i = threadIdx.x; i < K / 4; i += BLOCK) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(x[q]) + i);
            xs4[q * XS4 + i] = v;
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
// the barrier), each pass requests the next before reducing its own (with one pass, as most phases have,
// nothing is copied). epi(q, row, y[, y of row + N]) runs in lane r for the pass's row r.
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
        for (int r = 0; r < R; ++r)
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                float a[NR];
                #pragma unroll
                for (int q = 0; q < NR; ++q) a[q] = 0.f;
                #pragma unroll
                for (int p = 0; p < PER; ++p) {
                    const int c = lane + 32 * p;
                    if (K8 % 32 == 0 || c < K8) {
                        const uint4 u = use.q[r][m][p];
                        #pragma unroll
                        for (int q = 0; q < NR; ++q) {
                            const float4 x0 = xs4[q * XS4 + 2 * c], x1 = xs4[q * XS4 + 2 * c + 1];
                            a[q] += lo(u.x) * x0.x + hi(u.x) * x0.y + lo(u.y) * x0.z + hi(u.y) * x0.w
                                  + lo(u.z) * x1.x + hi(u.z) * x1.y + lo(u.w) * x1.z + hi(u.w) * x1.w;
                        }
                    }
                }
                #pragma unroll
                for (int q = 0; q < NR; ++q) {
                    for (int o = 16; o > 0; o >>= 1) a[q] += __shfl_xor_sync(0xffffffffu, a[q], o);
                    acc[q][r][m] = a[q];
                }
            }
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
    constexpr int REP = HQ / HKV, WARPS = BLOCK / 32, HALF = DH / 2, DW = DH / 32, KS = WARPS * G, Q = DH / 4;
    __shared__ float qs[REP][DH];
    __shared__ float kn[DH];
    __shared__ float vn[DH];
    __shared__ float red[REP + 1][DW];
    __shared__ float wm[WARPS][REP], wl[WARPS][REP];
    __shared__ float wo[WARPS][REP][DH];
    __shared__ int last;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (!issued) ring_prefetch<DH, CAP, KS, NST>(ring, kc, vc, h, start, stop, P);

    float raw[REP + 1], ss[REP + 1];
    if (t < DH) {
        for (int r = 0; r < REP; ++r) raw[r] = __ldcg(qkv + (h * REP + r) * DH + t);
        raw[REP] = __ldcg(qkv + (HQ + h) * DH + t);
        for (int r = 0; r <= REP; ++r) {
            float v = raw[r] * raw[r];
            for (int o2 = 16; o2 > 0; o2 >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o2);
            if (lane == 0) red[r][warp] = v;
        }
    }
    __syncthreads();
    if (t < DH) {
        for (int r = 0; r <= REP; ++r) {
            float v = 0.f;
            for (int w = 0; w < DW; ++w) v += red[r][w];
            ss[r] = rsqrtf(v / DH + e);
        }
        for (int r = 0; r < REP; ++r) qs[r][t] = raw[r] * ss[r] * qn[t];
        kn[t] = raw[REP] * ss[REP] * knw[t];
        vn[t] = __ldcg(qkv + (HQ + HKV + h) * DH + t);
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
        if (s == 0) {  // the new slot, stored in place; no block reads it from the cache in this step
            const size_t slot = ((size_t)h * CAP + P) * DH + t;
            kc[slot] = outk;
            vc[slot] = vn[t];
        }
    }
    __syncthreads();

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
        xs4[i] = v;
        if (i >= i0 && i < i1) __stcg(reinterpret_cast<float4*>(out) + i, v);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    normalize<K, BLOCK>(xs4, &ss, nw, eps, red);
    __syncthreads();
}

}  // namespace pdp
"""

BODY = r"""
    // NR requests decode in this launch (PDP_REQS lists each one's buffers: the kernel's own, then the pair's)
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
    __shared__ float4 xs4[NR * XS4];
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
    #define PDP_STAMP(i) if (STAMPS && b == 0 && t == 0) { stamps[i] = pdp::now_ns(); stamps[NL * 10 + 3 + (i)] = clock64(); }
    PDP_STAMP(NL * 10 + 2)
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

    pdp::Rows<D, 1, 2> gq, gl;
    gq.load(WQKV, NQKV, gw * 2, lane);
    for (int l = 0; l < NL; ++l) {
        // the layer's input: the token's embedding, then h
        auto hin = [&](int q) { return l == 0 ? embed + (size_t)tk[q] * D : at(q, OFF_H); };
        // 1: RMSNorm + q|k|v
        PDP_STAMP(l * 10)
        for (int q = 0; q < NR; ++q) in[q] = hin(q);
        pdp::stage<D, BLOCK, true, NR, XS4>(xs4, in, in_norm + l * D, eps, red);
        pdp::gemv<D, 1, 2, NQKV, TW * 2, NR, XS4>(gq, WQKV + (size_t)l * NQKV * (D / 8), gw * 2, lane, xs4,
                  [&](int q, int row, float a, float) { __stcg(at(q, OFF_QKV) + row, a); });
        auto KL = [&](int q) { return const_cast<float*>(kcs[q]) + (size_t)l * HKV * CAP * DH; };
        auto VL = [&](int q) { return const_cast<float*>(vcs[q]) + (size_t)l * HKV * CAP * DH; };
        if (b < ITEMS) {  // this block's first attention item: its keys start arriving during the barrier
            int start, stop;
            keys_of(b, start, stop);
            const int q = b / (HKV * S);
            pdp::ring_prefetch<DH, CAP, KS, NST>(ring, KL(q), VL(q), b / S % HKV, start, stop, P[q]);
        }
        PDP_STAMP(l * 10 + 1)
        if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) {  // no block leaves with bytes still landing in its shared memory
            while (ring.used != ring.issued) pdp::ring_wait<DH, KS, NST>(ring, sy + pdp::SY_ERR, SPIN);
            return;
        }
        // 2: attention
        PDP_STAMP(l * 10 + 2)
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
        pdp::Rows<D, 2, 1> gg;
        if constexpr (FOLD) {  // o_proj is done (in parts): no phase 3
            gg.load(WGU + (size_t)l * 2 * FF * (D / 8), FF, gw, lane);
            PDP_STAMP(l * 10 + 3)
            if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
            PDP_STAMP(l * 10 + 4)
            PDP_STAMP(l * 10 + 5)
        } else {
            pdp::Rows<NO, 1, 1> go;
            go.load(WO + (size_t)l * D * (NO / 8), D, gw, lane);
            PDP_STAMP(l * 10 + 3)
            if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
            // 3: o_proj + residual
            PDP_STAMP(l * 10 + 4)
            for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_O);
            pdp::stage<NO, BLOCK, false, NR, XS4>(xs4, in, nullptr, 0.f, red);
            pdp::gemv<NO, 1, 1, D, TW, NR, XS4>(go, WO + (size_t)l * D * (NO / 8), gw, lane, xs4,
                      [&](int q, int row, float a, float) { __stcg(at(q, OFF_H) + row, __ldcg(hin(q) + row) + a); });
            gg.load(WGU + (size_t)l * 2 * FF * (D / 8), FF, gw, lane);
            PDP_STAMP(l * 10 + 5)
            if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
        }
        // 4: RMSNorm + gate|up + SwiGLU (FOLD: h is the layer's input plus each head's part of o_proj)
        PDP_STAMP(l * 10 + 6)
        if constexpr (FOLD) {
            pdp::stage_sum<D, BLOCK, HKV>(xs4, hin(0), HP, H2, b, NB, post_norm + l * D, eps, red);
        } else {
            for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_H);
            pdp::stage<D, BLOCK, true, NR, XS4>(xs4, in, post_norm + l * D, eps, red);
        }
        pdp::gemv<D, 2, 1, FF, TW, NR, XS4>(gg, WGU + (size_t)l * 2 * FF * (D / 8), gw, lane, xs4,
                  [&](int q, int row, float g, float u) { __stcg(at(q, OFF_ACT) + row, g / (1.f + expf(-g)) * u); });
        pdp::Rows<FF, 1, 1> gd;
        gd.load(WD + (size_t)l * D * (FF / 8), D, gw, lane);
        PDP_STAMP(l * 10 + 7)
        if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
        // 5: down + residual
        PDP_STAMP(l * 10 + 8)
        for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_ACT);
        pdp::stage<FF, BLOCK, false, NR, XS4>(xs4, in, nullptr, 0.f, red);
        pdp::gemv<FF, 1, 1, D, TW, NR, XS4>(gd, WD + (size_t)l * D * (FF / 8), gw, lane, xs4,
                  [&](int q, int row, float a, float) {
                      __stcg(at(q, OFF_H) + row, __ldcg(at(q, FOLD ? OFF_H2 : OFF_H) + row) + a);
                  });
        if (l + 1 < NL) gq.load(WQKV + (size_t)(l + 1) * NQKV * (D / 8), NQKV, gw * 2, lane);
        PDP_STAMP(l * 10 + 9)
        if (!pdp::grid_sync(sy, NB, ++epoch, SPIN)) return;
    }
    // final RMSNorm + LM head, each warp keeping each request's best row (the first of equal maxima, as argmax
    // does)
    PDP_STAMP(NL * 10)
    gl.load(LM, V, gw * 2, lane);
    for (int q = 0; q < NR; ++q) in[q] = at(q, OFF_H);
    pdp::stage<D, BLOCK, true, NR, XS4>(xs4, in, fnorm, eps, red);
    float best[NR];
    int besti[NR];
    #pragma unroll
    for (int q = 0; q < NR; ++q) { best[q] = -INFINITY; besti[q] = 0x7fffffff; }
    pdp::gemv<D, 1, 2, V, TW * 2, NR, XS4>(gl, LM, gw * 2, lane, xs4, [&](int q, int row, float a, float) {
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
    PDP_STAMP(NL * 10 + 1)
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
"""

INPUTS = ["tok", "pos", "embed", "wqkv", "wo", "wgu", "wdown", "lm", "in_norm", "post_norm", "q_norm", "k_norm",
          "fnorm", "inv_freq", "sync_buf", "kc", "vc", "fin"]
OUTPUTS = ["logits", "tok_out", "pos_out", "scratch", "stamps", "fout"]
PAIR_INPUTS, PAIR_OUTPUTS = ["tok1", "pos1", "kc1", "vc1", "fin1"], ["fout1"]  # the second request's
_kernels: dict = {}


def source(requests: int) -> str:
    """BODY for one request a launch, or two (a pair: its second request's buffers are PAIR_INPUTS/OUTPUTS)."""
    return f"#define PDP_REQS(a, b) {'a' if requests == 1 else 'a, b'}\n" + BODY


def ring_bytes(dh: int, kv_group: int = KV_GROUP) -> int:
    """The dynamic shared memory of attention's ring: KV_STAGES stages of K and V rows."""
    return KV_STAGES * 2 * (BLOCK // 32) * kv_group * dh * 4


def kernel(dh: int, kv_group: int = KV_GROUP, requests: int = 1):
    """The kernel for a head size, load group and requests a launch (1 or 2), built once (CUDA only)."""
    if (dh, kv_group, requests) not in _kernels:
        pair = requests == 2
        _kernels[dh, kv_group, requests] = mx.fast.cuda_kernel(
            name="pdlib_decode_persistent" + ("_pair" if pair else ""),
            input_names=INPUTS + PAIR_INPUTS * pair, output_names=OUTPUTS + PAIR_OUTPUTS * pair,
            source=source(requests), header=HEADER, shared_memory=ring_bytes(dh, kv_group))
    return _kernels[dh, kv_group, requests]


@functools.cache
def sm_count() -> int:
    """Streaming multiprocessors of CUDA device 0 (backend.cuda_sm_count); PDLIB_PERSISTENT_BLOCKS overrides it
    (fewer blocks stay co-resident; more may deadlock, which the barrier's timeout reports)."""
    if os.environ.get("PDLIB_PERSISTENT_BLOCKS"):
        return int(os.environ["PDLIB_PERSISTENT_BLOCKS"])
    return cuda_sm_count()


def new_sync(*mailboxes: int) -> mx.array:
    """A barrier's sync buffer: zeros, SYNC_WORDS words, reused by every step that is given it (its barrier count,
    block flags and heads' counts only grow), but for SY_BOX + 2 q and the word after it: `mailboxes[q]`, the
    device address of request q's token mailbox area (mailbox.py), where each step's last block also leaves
    its token; 0 for none. One per request, or per pair of requests that decode in one launch: two decodes
    that could run at once must not share one."""
    if len(mailboxes) > 2:
        raise ValueError(f"{len(mailboxes)} mailboxes: a launch decodes one request or two")
    s = mx.zeros((SYNC_WORDS,), mx.uint32)
    if any(mailboxes):
        words = [w for box in mailboxes for w in (box & 0xFFFFFFFF, box >> 32)]
        s = mx.concatenate([mx.array(words, mx.uint32), s[len(words):]])
    mx.eval(s)
    return s


SHARED_LIMIT = 48 * 1024  # static shared memory a block may declare
SM_SHARED_LIMIT = 227 * 1024  # static and dynamic together, one block per SM (sm_90)


def shared_bytes(cfg, *, fold: bool = True, requests: int = 1) -> int:
    """The kernel's static shared memory for a model config's shapes (static_shared_bytes; by default one request
    with o_proj folded, the larger; a pair never folds)."""
    return static_shared_bytes(D=cfg.hidden_size, F=cfg.intermediate_size, dh=cfg.head_dim,
                               heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                               fold=fold and requests == 1, requests=requests)


def static_shared_bytes(*, D: int, F: int, dh: int, heads: int, kv_heads: int, fold: bool,
                        requests: int = 1) -> int:
    """The kernel's static shared memory (BODY's, attend's and the ring's arrays, a few words spare): each
    request's staged input vector is the largest of D, Hq Dh and F floats; attention's per-warp partial outputs
    grow with the query heads per KV head; with o_proj folded, a merged head's outputs too."""
    rep, warps = heads // kv_heads, BLOCK // 32
    body = 4 * (requests * (max(D, heads * dh, F) + 3 * warps + kv_heads) + 1)
    attend = 4 * (rep * dh + 2 * dh + (rep + 1) * (dh // 32) + 2 * warps * rep + warps * rep * dh + 1)
    folded_head = 4 * (rep * dh + 1) if fold else 0
    ring = 8 * (KV_STAGES + 1)  # the ring's mbarriers, 8-byte aligned
    return body + attend + folded_head + ring + 4 + 64 + 32 * (requests - 1)


def fits(static: int, dh: int, kv_group: int = KV_GROUP) -> bool:
    """A block's static shared memory within its limit, and beside it attention's ring within the SM's."""
    return static <= SHARED_LIMIT and static + ring_bytes(dh, kv_group) <= SM_SHARED_LIMIT


def available(cfg, *, packed: bool, requests: int = 1) -> bool:
    """Where the persistent kernel runs: CUDA, head_dim 128 (the attention item's thread layout), bf16 weights,
    and shapes whose arrays fit one block's static shared memory, beside attention's ring (Qwen3-0.6B and
    -1.7B do; -4B and -8B do not, and keep the per-operation kernels). `requests`: 2 for two requests' decodes in
    one launch, whose staged vectors take twice the room (Qwen3-0.6B's fit, -1.7B's do not)."""
    return (BACKEND == "cuda" and cfg.head_dim == 128 and packed
            and fits(shared_bytes(cfg, requests=requests), cfg.head_dim))


def scratch_layout(*, D: int, heads: int, kv_heads: int, dh: int, F: int, splits: int, blocks: int) -> dict:
    """Name -> (offset, size) of the kernel's work arrays in its scratch output, as BODY lays them out (h_mid and
    head_parts used only with o_proj folded; the float4-read arrays first, at offsets that are multiples of 4)."""
    sizes = [("h", D), ("qkv", (heads + 2 * kv_heads) * dh), ("o", heads * dh), ("act", F), ("h_mid", D),
             ("head_parts", kv_heads * D), ("m", heads * splits), ("l", heads * splits),
             ("partial_o", heads * splits * dh), ("block_best", blocks), ("block_index", blocks)]
    layout, at = {}, 0
    for name, n in sizes:
        layout[name], at = (at, n), at + n
    return layout


def scratch_size(requests: int = 1, **shape) -> int:
    """The scratch output's floats: each request's scratch_layout(**shape), the next at a multiple of 4 floats."""
    per = sum(scratch_layout(**shape)["block_index"])  # the last array's end
    return requests * ((per + 3) // 4 * 4)


def folded(fold: bool | None = None) -> bool:
    """Whether o_proj runs folded into attention: `fold`, or PDLIB_PERSISTENT_FOLD=1 (off by default)."""
    if fold is not None:
        return fold
    value = os.environ.get(FOLD_ENV, "0")
    if value not in ("0", "1"):
        raise InputError(f"{FOLD_ENV}={value!r}: expected 0 or 1")
    return value == "1"


def barriers_per_layer(fold: bool) -> int:
    """Grid barriers per layer: one after each phase (four with o_proj folded into attention, else five)."""
    return 4 if fold else 5


def launch(token, pos, dw: DecodeWeights, k_all, v_all, written, sync, *, heads: int, kv_heads: int,
           eps: float, poison: bool = False, blocks: int | None = None, stamps: bool = False,
           kv_group: int = KV_GROUP, fold: bool | None = None, pair: tuple | None = None) -> list:
    """The kernel's outputs: [logits, tok_out (token, error flag, 0, 0), pos_out (pos + 1, 0, 0, 0), scratch
    (scratch_layout), stamps, the fence advanced]. k_all, v_all: the caches (L, Hkv, cap, Dh), written in
    place. `poison` fills the outputs with NaN first (a skipped element shows); `blocks` defaults to the SM
    count. `stamps` (a profile): block 0's globaltimer (ns) at each of the 10 phase starts and ends per layer,
    the LM head's start and end, the kernel's start, then the same 10 L + 3 as SM clock cycles; otherwise two
    unused words (16 bytes: not managed memory); with o_proj folded, its phase's start and end are one instant.
    `kv_group`: keys per warp in each stage of attention's ring (KV_STAGES stages in flight). `fold`: o_proj
    folded into attention (`folded`). One sync buffer may see either; where it names a token mailbox area
    (new_sync), the last block also leaves the token there.
    `pair`: a second request's (token, pos, k_all, v_all, written), decoded in the same launch (never folded):
    each weight row is read once for both, and the barriers are paid once. Then logits is (2 V,), tok_out and
    pos_out hold four words per request, scratch one scratch_layout per request, and a second fence follows."""
    layers, _, cap, dh = k_all.shape
    V, D = dw.embed.shape
    F = dw.down.shape[2]
    requests = 1 if pair is None else 2
    if pair is not None and fold:
        raise ValueError("fold=True: o_proj folded into attention decodes one request a launch, not a pair")
    fold = folded(fold) and requests == 1  # PDLIB_PERSISTENT_FOLD=1 folds single launches only
    if pair is not None and (pair[2].shape != k_all.shape or pair[3].shape != v_all.shape):
        raise ValueError(f"a pair's caches must have one shape: {k_all.shape} and {pair[2].shape}")
    static = static_shared_bytes(D=D, F=F, dh=dh, heads=heads, kv_heads=kv_heads, fold=fold, requests=requests)
    if not fits(static, dh, kv_group):
        most = (SM_SHARED_LIMIT - static) // ring_bytes(dh, 1)
        raise ValueError(f"kv_group={kv_group}: attention's ring would take {ring_bytes(dh, kv_group)} bytes of "
                         f"shared memory beside {static} static; 1 to {most} keys per warp fit")
    nb = blocks or sm_count()
    if not 1 <= nb <= MAX_BLOCKS:
        raise ValueError(f"blocks={nb}: the sync buffer has flags for 1 to {MAX_BLOCKS} blocks")
    splits = max(1, nb // (requests * kv_heads))
    size = scratch_size(requests, D=D, heads=heads, kv_heads=kv_heads, dh=dh, F=F, splits=splits, blocks=nb)
    return kernel(dh, kv_group, requests)(
        inputs=[token, pos, dw.embed, dw.qkv, dw.o, dw.gate_up, dw.down, dw.lm_head, dw.in_norm, dw.post_norm,
                dw.q_norm, dw.k_norm, dw.norm, dw.inv_freq, sync, k_all, v_all, written, *(pair or ())],
        template=[("D", D), ("HQ", heads), ("HKV", kv_heads), ("DH", dh), ("FF", F), ("NL", layers), ("V", V),
                  ("CAP", cap), ("NB", nb), ("S", splits), ("BLOCK", BLOCK), ("EPS_BITS", float_bits(eps)),
                  ("SCALE_BITS", float_bits(dh ** -0.5)), ("SPIN", SPIN_CYCLES), ("STAMPS", stamps),
                  ("KVG", kv_group), ("NST", KV_STAGES), ("FOLD", fold), ("NR", requests)],
        grid=(nb * BLOCK, 1, 1), threadgroup=(BLOCK, 1, 1),
        output_shapes=[(requests * V,), (4 * requests,), (4 * requests,), (size,),
                       (2 * (10 * layers + 3) if stamps else 2,), written.shape] + [written.shape] * (requests - 1),
        output_dtypes=[mx.float32, mx.uint32, mx.int32, mx.float32, mx.uint64] + [written.dtype] * requests,
        init_value=float("nan") if poison else None)


def decode_persistent(token, pos, dw: DecodeWeights, k_all, v_all, written, sync, **kw):
    """-> (logits (V,), token (), pos + 1 (1,), [], [], the fence advanced): one launch (keywords as `launch`)."""
    logits, tok, next_pos, _, _, fence = launch(token, pos, dw, k_all, v_all, written, sync, **kw)
    return logits, tok[0], next_pos[:1], [], [], fence


def decode_persistent_pair(first: tuple, second: tuple, dw: DecodeWeights, sync, **kw) -> list[tuple]:
    """Two requests' decode steps in one launch, each request given as (token, pos, k_all, v_all, written) ->
    for each, decode_persistent's (logits (V,), token (), pos + 1 (1,), [], [], the fence advanced) (keywords
    as `launch`; `sync` is the pair's own, naming both requests' mailboxes)."""
    token, pos, k_all, v_all, written = first
    logits, tok, next_pos, _, _, fence, fence1 = launch(token, pos, dw, k_all, v_all, written, sync,
                                                        pair=tuple(second), **kw)
    V = dw.embed.shape[0]
    return [(logits[q * V:(q + 1) * V], tok[4 * q], next_pos[4 * q:4 * q + 1], [], [], f)
            for q, f in enumerate((fence, fence1))]


def decode_persistent_pair_ops(first: tuple, second: tuple, dw: DecodeWeights, sync=None, **kw) -> list[tuple]:
    """The pair's oracle: each request's decode_persistent_ops -> for each, (logits, token, pos + 1, ks, vs, fence)
    with the new rows (Hkv, 1, Dh) per layer for the caller to store."""
    return [decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw)
            for token, pos, k_all, v_all, written in (first, second)]


def check_token(token: int) -> int:
    """A token id observed on the host; ERROR_TOKEN (a wait at a grid barrier timed out) raises."""
    if token == ERROR_TOKEN:
        raise RuntimeError("the persistent decode kernel failed: a wait at a grid barrier timed out (its blocks "
                           "were not all resident, or one stalled for ~1 s), or its input token or position was "
                           "out of range; run with PDLIB_DECODE=kernels")
    return token

"""A frozen copy of the flash prefill kernel as it stood before v20 (tree b810f9a), for flash_sweep.py's A/B: its
body and launch; the split rule, the merge and the oracle are flash_prefill's (the same text then and now).

Prefill attention as one flash-style FP32 kernel (CUDA only): T new queries of one request over its cache,
read in place, the scores never materialised.

    o = flash_attention(q, k_cache, v_cache, positions, written, scale=s, length=n)
    # q (Hq, T, Dh) FP32; k_cache, v_cache (Hkv, capacity, Dh), the layer's cache as it lies, the chunk's rows
    # already written in place (kv_store.install_kv) behind `written`; positions (T,) int32, the queries'
    # positions; n = the host's start + T -> o (Hq, T, Dh)

Why: MLX's ops materialise (Hkv, rep T, S) FP32 scores and run them through a mask, a softmax and two batched
matmuls, after a kernel copied the cache's whole prefix out for them (kv_store.store_kv): most of a chunk
step's attention time at 4K context is those round trips and copies, and a whole prompt's scores are 1 GB a
layer, half of them masked.

Each block takes 64 query rows of one head and a range of 64-key tiles of its KV head: Q (scaled, as the
reference scales it) stays in shared memory, each tile's K and V are staged beside it, and every thread owns
4 rows x 4 keys of the scores and 4 rows x 8 dims of the output, with a running max and sum per row (online
softmax). A key is read only when some row of the block may see it (key <= that row's position), so stale
slots past the request's length are never touched. Where the row blocks are too few to fill the GPU (a
128-row chunk: 2 per head), the keys are split across blocks and a second kernel merges the partial results
by their maxima; with one split the first kernel normalises its own output. A zero fence (its writer never
ran) makes the output NaN, as fence.read_after does.
"""

import mlx.core as mx

from pdlib.engine.kernels import flash_prefill as F
from pdlib.engine.kernels.backend import BACKEND, cuda_sm_count, float_bits

BR, BC, DH, THREADS = 64, 64, 128, 256
QP, KP, VP = BR + 4, BC + 4, DH + 4        # pitches: 16-byte rows that spread a warp's reads over the banks
SHARED_BYTES = 4 * (DH * QP + DH * KP + BC * VP)   # Q (d-major), K (d-major, then P key-major), V (key-major)

SOURCE = r"""
    // block: query rows r0.. of head h, key tiles [t_begin, t_end) of split z; thread (ty, tx): rows
    // r0 + 4 ty + i (i < 4), keys k0 + 4 tx + j (j < 4) of a tile, dims 4 tx + c and 64 + 4 tx + c (c < 4)
    constexpr int BR = 64, BC = 64, DH = 128, QP = BR + 4, KP = BC + 4, VP = DH + 4;
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;              // [DH][QP], q * scale
    float* Ks = Qs + DH * QP;      // [DH][KP] while the scores are made, then P as [BC][QP]
    float* Vs = Ks + DH * KP;      // [BC][VP]
    float* Ps = Ks;
    __shared__ int kend_s;
    const int HQ = q_shape[0], T = q_shape[1], HKV = kc_shape[0], CAP = kc_shape[1];
    const int h = blockIdx.y, kvh = h / (HQ / HKV), r0 = blockIdx.x * BR, z = blockIdx.z, NSPLIT = gridDim.z;
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const float scale = __int_as_float(SCALE_BITS);
    const bool live = r0 + 8 * (tid >> 5) < T;         // a warp's 8 rows all past T (a 1-row segment): no FMAs
    const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);

    if (tid == 0) kend_s = 0;
    __syncthreads();
    if (tid < BR && r0 + tid < T) atomicMax(&kend_s, pos[r0 + tid] + 1);
    for (int i = tid; i < BR * (DH / 4); i += 256) {
        const int r = i / (DH / 4), d4 = i % (DH / 4);
        const float4 v = r0 + r < T ? reinterpret_cast<const float4*>(q + ((size_t)h * T + r0 + r) * DH)[d4] : zero4;
        Qs[(4 * d4 + 0) * QP + r] = v.x * scale;
        Qs[(4 * d4 + 1) * QP + r] = v.y * scale;
        Qs[(4 * d4 + 2) * QP + r] = v.z * scale;
        Qs[(4 * d4 + 3) * QP + r] = v.w * scale;
    }
    __syncthreads();
    const int kend = min(kend_s, CAP);                 // keys [0, kend): those some row of the block sees
    const int tiles = (kend + BC - 1) / BC, per = (tiles + NSPLIT - 1) / NSPLIT;
    const int t_begin = min(tiles, z * per), t_end = min(tiles, t_begin + per);
    const float4* K4 = reinterpret_cast<const float4*>(kc + (size_t)kvh * CAP * DH);
    const float4* V4 = reinterpret_cast<const float4*>(vc + (size_t)kvh * CAP * DH);

    int row_pos[4];
    float m[4], l[4], o[4][8];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = r0 + 4 * ty + i;
        row_pos[i] = row < T ? pos[row] : -1;
        m[i] = -INFINITY;
        l[i] = 0.f;
        #pragma unroll
        for (int c = 0; c < 8; ++c) o[i][c] = 0.f;
    }

    for (int tile = t_begin; tile < t_end; ++tile) {
        const int k0 = tile * BC;
        __syncthreads();                               // the last tile's P and V are read
        for (int i = tid; i < BC * (DH / 4); i += 256) {
            const int key = i % BC, d4 = i / BC;       // a warp: 32 keys, one float4 column (conflict-free stores)
            const float4 kv = k0 + key < kend ? K4[(size_t)(k0 + key) * (DH / 4) + d4] : zero4;
            Ks[(4 * d4 + 0) * KP + key] = kv.x;
            Ks[(4 * d4 + 1) * KP + key] = kv.y;
            Ks[(4 * d4 + 2) * KP + key] = kv.z;
            Ks[(4 * d4 + 3) * KP + key] = kv.w;
            const int vkey = i / (DH / 4), vd4 = i % (DH / 4);   // a warp: one key's row
            *reinterpret_cast<float4*>(Vs + vkey * VP + 4 * vd4) =
                k0 + vkey < kend ? V4[(size_t)(k0 + vkey) * (DH / 4) + vd4] : zero4;
        }
        __syncthreads();

        float s[4][4];
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
        if (live) {
            #pragma unroll 8
            for (int d = 0; d < DH; ++d) {
                const float4 a = *reinterpret_cast<const float4*>(Qs + d * QP + 4 * ty);
                const float4 b = *reinterpret_cast<const float4*>(Ks + d * KP + 4 * tx);
                const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
                #pragma unroll
                for (int i = 0; i < 4; ++i)
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) s[i][j] = fmaf(av[i], bv[j], s[i][j]);
            }
        }

        // online softmax: a row's 64 keys lie across the 16 lanes of its half-warp (tx)
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            float mt = -INFINITY;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (k0 + 4 * tx + j > row_pos[i]) s[i][j] = -INFINITY;
                mt = fmaxf(mt, s[i][j]);
            }
            #pragma unroll
            for (int off = 1; off < 16; off <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
            const float m_new = fmaxf(m[i], mt), shift = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = expf(m[i] - shift);
            float sum = 0.f;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[i][j] = expf(s[i][j] - shift);
                sum += s[i][j];
            }
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            #pragma unroll
            for (int c = 0; c < 8; ++c) o[i][c] *= alpha;
        }
        __syncthreads();                               // every thread's scores are made: K's space takes P
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            *reinterpret_cast<float4*>(Ps + (4 * tx + j) * QP + 4 * ty) = make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
        __syncthreads();

        if (live) {
            #pragma unroll 4
            for (int key = 0; key < BC; ++key) {
                const float4 p = *reinterpret_cast<const float4*>(Ps + key * QP + 4 * ty);
                const float4 v0 = *reinterpret_cast<const float4*>(Vs + key * VP + 4 * tx);
                const float4 v1 = *reinterpret_cast<const float4*>(Vs + key * VP + 64 + 4 * tx);
                const float pv[4] = {p.x, p.y, p.z, p.w}, vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                #pragma unroll
                for (int i = 0; i < 4; ++i)
                    #pragma unroll
                    for (int c = 0; c < 8; ++c) o[i][c] = fmaf(pv[i], vv[c], o[i][c]);
            }
        }
    }

    const bool fenced = after[0] != 0u;                // else the cache's writer never ran: NaN, as read_after
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        #pragma unroll
        for (int off = 1; off < 16; off <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], off);
        const int row = r0 + 4 * ty + i;
        if (row >= T) continue;
        const size_t at = ((size_t)z * HQ + h) * T + row;
        const float k = !fenced ? __int_as_float(0x7fc00000) : NSPLIT == 1 ? 1.f / l[i] : 1.f;
        *reinterpret_cast<float4*>(part + at * DH + 4 * tx) = make_float4(o[i][0] * k, o[i][1] * k, o[i][2] * k, o[i][3] * k);
        *reinterpret_cast<float4*>(part + at * DH + 64 + 4 * tx) = make_float4(o[i][4] * k, o[i][5] * k, o[i][6] * k, o[i][7] * k);
        if (tx == 0) { stats[2 * at] = m[i]; stats[2 * at + 1] = l[i]; }
    }
"""

_kernel = (mx.fast.cuda_kernel(name="pdlib_flash_prefill_v1", input_names=["q", "kc", "vc", "pos", "after"],
                               output_names=["part", "stats"], source=SOURCE, shared_memory=SHARED_BYTES)
           if BACKEND == "cuda" else None)


def flash_attention(q: mx.array, k_cache: mx.array, v_cache: mx.array, positions: mx.array, written: mx.array, *,
                    scale: float, length: int, splits: int | None = None, poison: bool = False) -> mx.array:
    """flash_prefill.flash_attention's contract, by the old kernel (its grid: row blocks along x, 256 threads);
    the key split and the merge are flash_prefill's own, unchanged since."""
    Hq, T, Dh = q.shape
    z = F.key_splits(T, Hq, length, cuda_sm_count()) if splits is None else splits
    nan = float("nan") if poison else None
    part, stats = _kernel(inputs=[q, k_cache, v_cache, positions, written],
                          template=[("SCALE_BITS", float_bits(scale))],
                          grid=(-(-T // BR) * THREADS, Hq, z), threadgroup=(THREADS, 1, 1),
                          output_shapes=[(z, Hq, T, Dh), (z, Hq, T, 2)], output_dtypes=[mx.float32, mx.float32],
                          init_value=nan)
    return F.merged(part, stats, poison=poison)

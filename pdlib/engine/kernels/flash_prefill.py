"""Prefill attention as one flash-style kernel (CUDA only), FP32-accurate: T new queries of one request over its
cache, read in place, the scores never materialised.

    o = flash_attention(q, k_cache, v_cache, positions, written, scale=s, length=n)
    # q (Hq, T, Dh) FP32; k_cache, v_cache (Hkv, capacity, Dh), the layer's cache as it lies, the chunk's rows
    # already written in place (kv_store.install_kv) behind `written`; positions (T,) int32, the queries'
    # positions; n = the host's start + T -> o (Hq, T, Dh)

Why: MLX's ops materialise (Hkv, rep T, S) FP32 scores and run them through a mask, a softmax and two batched
matmuls, after a kernel copied the cache's whole prefix out for them (kv_store.store_kv): most of a chunk
step's attention time at 4K context is those round trips and copies, and a whole prompt's scores are 1 GB a
layer, half of them masked.

Each block takes 64 query rows of one head and a range of 64-key tiles of its KV head. Q, K and V arrive by
`cp.async` as they lie (rows of 128 floats, their 16-byte chunks XOR-swizzled so a warp's reads spread over
the banks): the tile's V is requested as its scores are made and the next tile's K as its values are summed,
so the loads hide behind the arithmetic. Each thread owns RT rows x 4 keys of the scores and RT rows x 8 dims
of the output (RT 8: 128 threads; 4: 256), with a running max and sum per row (online softmax). A key is read
only when some row of the block may see it (key <= that row's position), so stale slots past the request's
length are never touched. Where the row blocks are too few to fill the GPU (a 128-row chunk: 2 per head), the
keys are split across blocks and a second kernel merges the partial results by their maxima; with one split
the first kernel normalises its own output. The row blocks run latest first (most keys first: a whole prompt's
tail of blocks is its lightest). A zero fence (its writer never ran) makes the output NaN, as
fence.read_after does. A second kernel, SOURCE_TF32X3 (the engine's default), does the same on the tensor
cores: the products by the 3xTF32 split (gemm.py), each warp 16 rows in mma.m16n8k8 fragments.
"""

import mlx.core as mx

from pdlib.engine.kernels.attention import attention_ops, causal_mask
from pdlib.engine.kernels.backend import (BACKEND, CUDA_CP_ASYNC, cuda_launch_bounds, cuda_sm_count, env_choice,
                                          float_bits)
from pdlib.engine.kernels.gemm import HEADER as TF32X3_HEADER

BR, BC, DH = 64, 64, 128
SHARED_BYTES = 4 * (BR * DH + 2 * BC * DH + BC * BR)   # Q, K, V (rows of DH), P (keys of BR rows): 112 KB
# rows per thread the kernel is built for, the first the default (check-kernels checks each; flash_sweep.py
# times them: notes/gpu.md, v20)
ROW_TILES = (8, 4)
TF32X3_THREADS = 128     # the tensor-core kernel: 4 warps of 16 rows

SOURCE = r"""
    // block: query rows r0.. of head h, key tiles [t_begin, t_end) of split z; thread (ty, tx): rows
    // r0 + RT ty + i (i < RT), keys k0 + tx + 16 j (j < 4) of a tile, dims 4 tx + c and 64 + 4 tx + c (c < 4).
    // Shared rows hold DH floats (P's: BR) as 16-byte chunks, chunk c of row r at c ^ f(r): Q's f = (r >> 2) & 7,
    // K's r & 7, P's (key) r & 15, V's 0; so a warp's float4 reads (2 rows of Q or P, 16 keys of K) and the
    // stores of P hit distinct banks.
    constexpr int BR = 64, BC = 64, DH = 128, THREADS = 16 * BR / RT, RC = RT / 4;   // RC: a thread's row chunks
    static_assert(RT == 4 || RT == 8);
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;              // [BR][DH], q * scale
    float* Ks = Qs + BR * DH;      // [BC][DH]
    float* Vs = Ks + BC * DH;      // [BC][DH]
    float* Ps = Vs + BC * DH;      // [BC][BR], e^(s - m) by key
    __shared__ int kend_s;
    const int HQ = q_shape[0], T = q_shape[1], HKV = kc_shape[0], CAP = kc_shape[1];
    const int h = blockIdx.x, kvh = h / (HQ / HKV), r0 = (gridDim.y - 1 - blockIdx.y) * BR;
    const int z = blockIdx.z, NSPLIT = gridDim.z;
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const float scale = __int_as_float(SCALE_BITS);
    const bool live = r0 + 2 * RT * (tid >> 5) < T;    // a warp's rows all past T (a 1-row segment): no FMAs
    const float* kh = kc + (size_t)kvh * CAP * DH;
    const float* vh = vc + (size_t)kvh * CAP * DH;

    #pragma unroll
    for (int n = 0; n < BR * 32 / THREADS; ++n) {     // Q's rows, zeros past T (a warp: one row)
        const int i = tid + n * THREADS, r = i >> 5, c = i & 31;
        const bool in = r0 + r < T;
        pd_cp16(Qs + r * DH + 4 * (c ^ ((r >> 2) & 7)), q + ((size_t)h * T + (in ? r0 + r : 0)) * DH + 4 * c, in);
    }
    pd_cp_commit();
    if (tid == 0) kend_s = 0;
    __syncthreads();
    if (tid < BR && r0 + tid < T) atomicMax(&kend_s, pos[r0 + tid] + 1);
    __syncthreads();
    const int kend = min(kend_s, CAP);                 // keys [0, kend): those some row of the block sees
    const int tiles = (kend + BC - 1) / BC, per = (tiles + NSPLIT - 1) / NSPLIT;
    const int t_begin = min(tiles, z * per), t_end = min(tiles, t_begin + per);

    // one group: keys [k0, k0 + BC) of K (swizzled) or V into dst, zeros past kend (never read)
    auto request = [&](float* dst, const float* src, int k0, bool swizzle) {
        #pragma unroll
        for (int n = 0; n < BC * 32 / THREADS; ++n) {
            const int i = tid + n * THREADS, k = i >> 5, c = i & 31;
            const bool in = k0 + k < kend;
            pd_cp16(dst + k * DH + 4 * (swizzle ? c ^ (k & 7) : c), src + (size_t)(in ? k0 + k : 0) * DH + 4 * c, in);
        }
        pd_cp_commit();
    };
    if (t_begin < t_end) request(Ks, kh, t_begin * BC, true);

    int row_pos[RT];
    float m[RT], l[RT], o[RT][8];
    #pragma unroll
    for (int i = 0; i < RT; ++i) {
        const int row = r0 + RT * ty + i;
        row_pos[i] = row < T ? pos[row] : -1;
        m[i] = -INFINITY;
        l[i] = 0.f;
        #pragma unroll
        for (int c = 0; c < 8; ++c) o[i][c] = 0.f;
    }

    for (int tile = t_begin; tile < t_end; ++tile) {
        const int k0 = tile * BC;
        pd_cp_wait<0>();                               // this thread's copies of K (and, first, Q) have landed
        if (tile == t_begin) {
            #pragma unroll
            for (int n = 0; n < BR * 32 / THREADS; ++n) {   // the reference's q * scale, on this thread's chunks
                const int i = tid + n * THREADS, r = i >> 5, c = i & 31;
                float4* at = reinterpret_cast<float4*>(Qs + r * DH + 4 * (c ^ ((r >> 2) & 7)));
                const float4 v = *at;
                *at = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
            }
        }
        __syncthreads();                               // everyone's have; the last tile's P and V are read
        request(Vs, vh, k0, false);                    // lands while the scores are made

        float s[RT][4];
        #pragma unroll
        for (int i = 0; i < RT; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
        if (live) {
            #pragma unroll 2
            for (int c = 0; c < DH / 4; ++c) {
                float4 kv[4];
                #pragma unroll
                for (int j = 0; j < 4; ++j)            // key tx + 16 j: its swizzle is tx & 7
                    kv[j] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * j) * DH + 4 * (c ^ (tx & 7)));
                #pragma unroll
                for (int i = 0; i < RT; ++i) {
                    const int r = RT * ty + i;
                    const float4 qv = *reinterpret_cast<const float4*>(Qs + r * DH + 4 * (c ^ ((r >> 2) & 7)));
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        s[i][j] = fmaf(qv.x, kv[j].x, s[i][j]);
                        s[i][j] = fmaf(qv.y, kv[j].y, s[i][j]);
                        s[i][j] = fmaf(qv.z, kv[j].z, s[i][j]);
                        s[i][j] = fmaf(qv.w, kv[j].w, s[i][j]);
                    }
                }
            }
        }

        // online softmax: a row's 64 keys lie across the 16 lanes of its half-warp (tx)
        #pragma unroll
        for (int i = 0; i < RT; ++i) {
            float mt = -INFINITY;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (k0 + tx + 16 * j > row_pos[i]) s[i][j] = -INFINITY;
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
        #pragma unroll
        for (int j = 0; j < 4; ++j)                    // key tx + 16 j: its swizzle is tx
            #pragma unroll
            for (int cc = 0; cc < RC; ++cc)
                *reinterpret_cast<float4*>(Ps + (tx + 16 * j) * BR + 4 * ((RC * ty + cc) ^ tx)) =
                    make_float4(s[4 * cc][j], s[4 * cc + 1][j], s[4 * cc + 2][j], s[4 * cc + 3][j]);
        pd_cp_wait<0>();                               // this thread's copies of V have landed
        __syncthreads();                               // everyone's, and all of P; K's space is free
        if (tile + 1 < t_end) request(Ks, kh, k0 + BC, true);   // lands while the values are summed

        if (live) {
            #pragma unroll 4
            for (int key = 0; key < BC; ++key) {
                float p[RT];
                #pragma unroll
                for (int cc = 0; cc < RC; ++cc) {
                    const float4 pc = *reinterpret_cast<const float4*>(Ps + key * BR + 4 * ((RC * ty + cc) ^ (key & 15)));
                    p[4 * cc] = pc.x; p[4 * cc + 1] = pc.y; p[4 * cc + 2] = pc.z; p[4 * cc + 3] = pc.w;
                }
                const float4 v0 = *reinterpret_cast<const float4*>(Vs + key * DH + 4 * tx);
                const float4 v1 = *reinterpret_cast<const float4*>(Vs + key * DH + 64 + 4 * tx);
                const float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                #pragma unroll
                for (int i = 0; i < RT; ++i)
                    #pragma unroll
                    for (int c = 0; c < 8; ++c) o[i][c] = fmaf(p[i], vv[c], o[i][c]);
            }
        }
    }
    pd_cp_wait<0>();                                   // no copy outlives the block (a split with no tiles: Q's)

    const bool fenced = after[0] != 0u;                // else the cache's writer never ran: NaN, as read_after
    #pragma unroll
    for (int i = 0; i < RT; ++i) {
        #pragma unroll
        for (int off = 1; off < 16; off <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], off);
        const int row = r0 + RT * ty + i;
        if (row >= T) continue;
        const size_t at = ((size_t)z * HQ + h) * T + row;
        const float k = !fenced ? __int_as_float(0x7fc00000) : NSPLIT == 1 ? 1.f / l[i] : 1.f;
        *reinterpret_cast<float4*>(part + at * DH + 4 * tx) = make_float4(o[i][0] * k, o[i][1] * k, o[i][2] * k, o[i][3] * k);
        *reinterpret_cast<float4*>(part + at * DH + 64 + 4 * tx) = make_float4(o[i][4] * k, o[i][5] * k, o[i][6] * k, o[i][7] * k);
        if (tx == 0) { stats[2 * at] = m[i]; stats[2 * at + 1] = l[i]; }
    }
"""

# QK^T and PV by 3xTF32 on the tensor cores (gemm.py's split and mma), the engine's default (`flash-tf32x3`):
# a whole prompt's 28 attentions 44.9 against the FP32 kernel's 54.8 ms, its logits as close to the reference's
# (notes/gpu.md, v21)
SOURCE_TF32X3 = r"""
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

    #pragma unroll
    for (int n = 0; n < BR * 32 / THREADS; ++n) {     // Q's rows, zeros past T (a warp: one row)
        const int i = tid + n * THREADS, r = i >> 5, c = i & 31;
        const bool in = r0 + r < T;
        pd_cp16(Qs + r * DH + 4 * (c ^ (r & 7)), q + ((size_t)h * T + (in ? r0 + r : 0)) * DH + 4 * c, in);
    }
    pd_cp_commit();
    if (tid == 0) kend_s = 0;
    __syncthreads();
    if (tid < BR && r0 + tid < T) atomicMax(&kend_s, pos[r0 + tid] + 1);
    __syncthreads();
    const int kend = min(kend_s, CAP);                 // keys [0, kend): those some row of the block sees
    const int tiles = (kend + BC - 1) / BC, per = (tiles + NSPLIT - 1) / NSPLIT;
    const int t_begin = min(tiles, z * per), t_end = min(tiles, t_begin + per);

    // one group: keys [k0, k0 + BC) of K or V into dst (chunk c of key k at c ^ sw(k)), zeros past kend
    auto request = [&](float* dst, const float* src, int k0, bool is_v) {
        #pragma unroll
        for (int n = 0; n < BC * 32 / THREADS; ++n) {
            const int i = tid + n * THREADS, k = i >> 5, c = i & 31;
            const bool in = k0 + k < kend;
            pd_cp16(dst + k * DH + 4 * (c ^ (is_v ? 2 * (k & 3) : k & 7)), src + (size_t)(in ? k0 + k : 0) * DH + 4 * c,
                    in);
        }
        pd_cp_commit();
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
        // an mma's truncation per step against the growing sum, a bias toward zero (notes/gpu.md, v21)
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
"""

MERGE = r"""
    // one block of DH threads per (head, row) n: o = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z, M = max_z m_z
    // (a split that saw no key of the row has m_z = -inf and weighs 0; the first split always sees key 0)
    const int NS = part_shape[0], DH = part_shape[3];
    const size_t HT = (size_t)part_shape[1] * part_shape[2], n = blockIdx.x, d = threadIdx.x;
    float M = -INFINITY;
    for (int zi = 0; zi < NS; ++zi) M = fmaxf(M, stats[2 * (zi * HT + n)]);
    float L = 0.f, acc = 0.f;
    for (int zi = 0; zi < NS; ++zi) {
        const float w = expf(stats[2 * (zi * HT + n)] - M);
        L += w * stats[2 * (zi * HT + n) + 1];
        acc += w * part[(zi * HT + n) * DH + d];
    }
    o[n * DH + d] = acc / L;
"""


def threads_for(rows_per_thread: int) -> int:
    """A block's threads: 16 per 4-key column group, one per RT rows of the block's 64."""
    return 16 * BR // rows_per_thread


def header(rows_per_thread: int) -> str:
    """The FP32 kernel's header for one row tile: cp.async, and registers bounded to two blocks an SM (the most
    its shared memory allows)."""
    return CUDA_CP_ASYNC + cuda_launch_bounds(threads_for(rows_per_thread), 2)


HEADER_TF32X3 = TF32X3_HEADER + cuda_launch_bounds(TF32X3_THREADS, 2)   # the tensor-core kernel's


def _build(name: str, source: str, header_text: str):
    return mx.fast.cuda_kernel(name=name, input_names=["q", "kc", "vc", "pos", "after"],
                               output_names=["part", "stats"], source=source, header=header_text,
                               shared_memory=SHARED_BYTES)


_kernels = ({**{rt: _build(f"pdlib_flash_prefill_rt{rt}", SOURCE, header(rt)) for rt in ROW_TILES},
             "tf32x3": _build("pdlib_flash_prefill_tf32x3", SOURCE_TF32X3, HEADER_TF32X3)}
            if BACKEND == "cuda" else {})
_merge = (mx.fast.cuda_kernel(name="pdlib_flash_merge", input_names=["part", "stats"], output_names=["o"],
                              source=MERGE) if BACKEND == "cuda" else None)

ENV = "PDLIB_PREFILL_ATTENTION"
CHOICES = ("flash-tf32x3", "flash", "ops")


def enabled(head_dim: int) -> bool:
    """PDLIB_PREFILL_ATTENTION: `flash-tf32x3` (the default) runs prefill attention here where the kernels exist
    (CUDA, head_dim 128: where the caches are written in place), on the tensor cores; `flash` the same with
    the FP32 kernel (arithmetic()); `ops` runs MLX's ops (attention.py) everywhere."""
    return env_choice(ENV, CHOICES) != "ops" and bool(_kernels) and head_dim == DH


def arithmetic() -> str:
    """flash_attention's `arithmetic` under PDLIB_PREFILL_ATTENTION: fp32 for `flash`, else tf32x3."""
    return "fp32" if env_choice(ENV, CHOICES) == "flash" else "tf32x3"


def key_splits(rows: int, heads: int, length: int, sms: int) -> int:
    """Blocks per row block along the keys: as many as two per SM hold at once (two fit by shared memory), at
    most half the `length` keys' 64-key tiles (a 128-row chunk of 16 heads at 4K: 8; a whole prompt: 1). A
    row block whose last row sits early sees fewer tiles, so its last splits may be empty."""
    blocks = -(-rows // BR) * heads
    return max(1, min(2 * sms // blocks, -(-length // BC) // 2))


def flash_attention(q: mx.array, k_cache: mx.array, v_cache: mx.array, positions: mx.array, written: mx.array, *,
                    scale: float, length: int, splits: int | None = None, rows_per_thread: int = ROW_TILES[0],
                    arithmetic: str = "fp32", poison: bool = False) -> mx.array:
    """o (Hq, T, Dh) of q's rows over the cache (module docstring). `length` (start + T on the host) only sizes
    the key split; `splits` overrides key_splits; `rows_per_thread` is one of ROW_TILES; `arithmetic`
    "tf32x3" runs the tensor-core kernel instead (SOURCE_TF32X3; rows_per_thread unused); `poison` fills the
    outputs with NaN first, so a test sees any element the kernels skipped."""
    Hq, T, Dh = q.shape
    Hkv = k_cache.shape[0]
    if (Dh != DH or k_cache.shape != v_cache.shape or k_cache.shape[2] != DH or Hq % Hkv or positions.shape != (T,)
            or {q.dtype, k_cache.dtype, v_cache.dtype} != {mx.float32} or positions.dtype != mx.int32
            or rows_per_thread not in ROW_TILES or arithmetic not in ("fp32", "tf32x3")):
        raise ValueError(f"flash_attention takes FP32 q (Hq, T, {DH}) and caches (Hkv, capacity, {DH}), Hq a multiple "
                         f"of Hkv, int32 positions (T,); got q {q.dtype} {q.shape}, caches {k_cache.dtype} "
                         f"{k_cache.shape} {v_cache.shape}, positions {positions.dtype} {positions.shape}, "
                         f"rows per thread {rows_per_thread} (one of {ROW_TILES}), arithmetic {arithmetic!r} (fp32 "
                         f"or tf32x3)")
    z = key_splits(T, Hq, length, cuda_sm_count()) if splits is None else splits
    nan = float("nan") if poison else None
    tc = arithmetic == "tf32x3"
    threads = TF32X3_THREADS if tc else threads_for(rows_per_thread)
    part, stats = _kernels["tf32x3" if tc else rows_per_thread](
        inputs=[q, k_cache, v_cache, positions, written],
        template=[("SCALE_BITS", float_bits(scale)), ("RT", rows_per_thread)],
        grid=(Hq * threads, -(-T // BR), z), threadgroup=(threads, 1, 1),
        output_shapes=[(z, Hq, T, Dh), (z, Hq, T, 2)], output_dtypes=[mx.float32, mx.float32], init_value=nan)
    return merged(part, stats, poison=poison)


def merged(part: mx.array, stats: mx.array, *, poison: bool = False) -> mx.array:
    """o (Hq, T, Dh) from the key splits' partial results part (z, Hq, T, Dh) and their (max, sum) stats: the
    one split's own (normalised by the kernel) or the MERGE kernel's. `poison` as flash_attention's."""
    z, Hq, T, Dh = part.shape
    if z == 1:
        return part.reshape(Hq, T, Dh)
    (o,) = _merge(inputs=[part, stats], grid=(Hq * T * Dh, 1, 1), threadgroup=(Dh, 1, 1),
                  output_shapes=[(Hq, T, Dh)], output_dtypes=[mx.float32],
                  init_value=float("nan") if poison else None)
    return o


def flash_attention_ops(q: mx.array, k_cache: mx.array, v_cache: mx.array, positions: mx.array, written: mx.array, *,
                        scale: float, length: int, **_) -> mx.array:
    """The oracle, with flash_attention's signature: the reference's masked softmax over the cache's first
    `length` slots (attention.attention_ops)."""
    k, v = k_cache[:, :length], v_cache[:, :length]
    return attention_ops(q, k, v, mask=causal_mask(positions, length), scale=scale)




// A K split's partial outputs parts (SPLIT, M, N) summed in z order, and what follows the matmul in the layer, in
// one pass (MLX's ops would run the sum and the epilogue as separate small launches). sum_source() defines one
// of PD_SUM_NONE, PD_SUM_ADD (the residual: add + the sum), PD_SUM_SWIGLU (silu(g) * u of the sum's halves
// [g | u]) or PD_SUM_NORM (the residual add and the RMSNorm after it) before this text.
#if PD_SUM_NORM
    // out (M, N) = add + the sum of parts (SPLIT, M, N) in z order; normed (M, N) = out * rsqrt(mean(out^2) + eps)
    // * weight (N,): block r takes row r (a row's sum of squares needs all its columns; the block's partial sums
    // are added in a fixed order), a thread four columns at a time
    const int M = parts_shape[1], N = parts_shape[2];
    const size_t r = blockIdx.x;
    const int tid = threadIdx.x;
#else
    // out (M, NO) = the sum, then the epilogue; sum = parts[0] + parts[1] + ... (parts (SPLIT, M, N), in that
    // order); NO = N, or N / 2 under SwiGLU; a thread takes four columns
    const int M = parts_shape[1], N = parts_shape[2], NO = N / OUT_DIV;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * NO / 4) return;
    const size_t r = 4 * i / NO, c = 4 * i % NO;
#endif
    // row r's four columns from col on, summed over the parts in z order
    auto sum = [&](size_t col) {
        float4 s = *reinterpret_cast<const float4*>(parts + r * N + col);
        #pragma unroll
        for (int z = 1; z < SPLIT; ++z) {
            const float4 v = *reinterpret_cast<const float4*>(parts + ((size_t)z * M + r) * N + col);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        return s;
    };
#if PD_SUM_NORM
    float ss = 0.f;
    for (int c = 4 * tid; c < N; c += 4 * SUM_THREADS) {
        float4 s = sum(c);
        const float4 a = *reinterpret_cast<const float4*>(add + r * N + c);
        s = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
        *reinterpret_cast<float4*>(out + r * N + c) = s;
        ss += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
    }
    __shared__ float warp_ss[SUM_THREADS / 32];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((tid & 31) == 0) warp_ss[tid >> 5] = ss;
    __syncthreads();
    float total = 0.f;
    #pragma unroll
    for (int i = 0; i < SUM_THREADS / 32; ++i) total += warp_ss[i];
    const float inv = rsqrtf(total / N + __int_as_float(EPS_BITS));
    for (int c = 4 * tid; c < N; c += 4 * SUM_THREADS) {   // this thread's own stores, read back
        const float4 h = *reinterpret_cast<const float4*>(out + r * N + c);
        const float4 g = *reinterpret_cast<const float4*>(weight + c);
        *reinterpret_cast<float4*>(normed + r * N + c) =
            make_float4(h.x * inv * g.x, h.y * inv * g.y, h.z * inv * g.z, h.w * inv * g.w);
    }
#else
    float4 s = sum(c);
#if PD_SUM_ADD
    const float4 a = *reinterpret_cast<const float4*>(add + r * N + c);
    s = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
#elif PD_SUM_SWIGLU
    const float4 u = sum(c + NO);
    auto silu_times = [](float g, float v) { return g * (1.f / (1.f + expf(-g))) * v; };
    s = make_float4(silu_times(s.x, u.x), silu_times(s.y, u.y), silu_times(s.z, u.z), silu_times(s.w, u.w));
#endif
    *reinterpret_cast<float4*>(out + r * NO + c) = s;
#endif

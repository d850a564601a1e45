// x (finite) rounded to TF32, the nearest value with 10 mantissa bits, as FP32 bits (the low 13 are zero)
__device__ __forceinline__ uint32_t pd_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
// x = hi + lo, each TF32; x - hi is exact (hi is x's leading bits, rounded)
__device__ __forceinline__ void pd_split(float x, uint32_t& hi, uint32_t& lo) {
    hi = pd_tf32(x);
    lo = pd_tf32(x - __uint_as_float(hi));
}
// c += a (16x8, row) * b (8x8, col), TF32 in, FP32 accumulators
__device__ __forceinline__ void pd_mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c += a (16x16, row) * b (16x8, col), bf16 pairs in (the lower column in the lower half), FP32 accumulators
__device__ __forceinline__ void pd_mma16(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// four FP32 values as three bf16 parts each, x = p0 + p1 + p2 exactly (each part x's leading 8 bits left, cut
// off: what remains after two has at most 8 significant bits), packed in pairs: p[q][0] holds part q of v.x
// (low half) and v.y, p[q][1] of v.z and v.w
__device__ __forceinline__ void pd_split3(float4 v, uint32_t (&p)[3][2]) {
    float r[4] = {v.x, v.y, v.z, v.w};
    uint32_t b[3][4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
        b[0][e] = __float_as_uint(r[e]) & 0xffff0000u;
        r[e] -= __uint_as_float(b[0][e]);
        b[1][e] = __float_as_uint(r[e]) & 0xffff0000u;
        b[2][e] = __float_as_uint(r[e] - __uint_as_float(b[1][e]));
    }
    #pragma unroll
    for (int q = 0; q < 3; ++q) {
        p[q][0] = __byte_perm(b[q][0], b[q][1], 0x7632);
        p[q][1] = __byte_perm(b[q][2], b[q][3], 0x7632);
    }
}
// a warp's MI x NI accumulator fragments (16 x 8 each, mma's C layout): zeroed; acc += part
template <int MI, int NI>
__device__ __forceinline__ void pd_zero(float (&a)[MI][NI][4]) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int e = 0; e < 4; ++e) a[mi][ni][e] = 0.f;
}
template <int MI, int NI>
__device__ __forceinline__ void pd_add(float (&acc)[MI][NI][4], const float (&part)[MI][NI][4]) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] += part[mi][ni][e];
}
// the fragments into out (rows of N floats): fragment (mi, ni) at row r0 + 16 mi + g (and + 8), columns
// c0 + 8 ni + 2t and + 1; rows at or past M are not written
template <int MI, int NI>
__device__ __forceinline__ void pd_store(float* out, const float (&acc)[MI][NI][4], int r0, int c0, int M, int N,
                                         int g, int t) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int row = r0 + mi * 16 + g, col = c0 + ni * 8 + 2 * t;
            if (row < M) *reinterpret_cast<float2*>(out + (size_t)row * N + col) =
                make_float2(acc[mi][ni][0], acc[mi][ni][1]);
            if (row + 8 < M) *reinterpret_cast<float2*>(out + (size_t)(row + 8) * N + col) =
                make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
}
// R rows of a 32-deep slice into shared memory, 16 bytes a copy: rows r0 + r (r < R) of src, E-byte elements
// and K of them a row, from column k0, to dst at PITCH bytes a row; rows at or past `rows` come as zeros
template <int R, int E, int K, int PITCH, int THREADS>
__device__ __forceinline__ void pd_stage(void* dst, const void* src, int r0, int rows, int k0, int tid) {
    constexpr int COPIES = 32 * E / 16;                // a row's
    static_assert((R * COPIES) % THREADS == 0 && PITCH % 16 == 0);
    #pragma unroll
    for (int i = 0; i < R * COPIES / THREADS; ++i) {
        const int idx = tid + i * THREADS, r = idx / COPIES, c = idx % COPIES;
        const bool in = r0 + r < rows;
        pd_cp16(reinterpret_cast<float*>(static_cast<char*>(dst) + r * PITCH + 16 * c),
                reinterpret_cast<const float*>(static_cast<const char*>(src)
                                               + ((size_t)(in ? r0 + r : 0) * K + k0) * E + 16 * c), in);
    }
}

// The flash kernels' one tile loader (flash_prefill.cu and flash_prefill_tf32x3.cu): rows [first, first + ROWS)
// of an array of DH-float rows (src: its row 0) into dst by cp.async, the 16-byte chunk c of row r at
// c ^ swizzle(r), so that a warp's reads spread over the banks; rows at or past `limit` are zeros, read from
// nowhere. One commit group.
template <int ROWS, int DH, int THREADS, class Swizzle>
__device__ __forceinline__ void pd_load_tile(float* dst, const float* src, int first, int limit, int tid,
                                             Swizzle swizzle) {
    static_assert(DH == 128, "a row is 32 chunks");
    #pragma unroll
    for (int n = 0; n < ROWS * 32 / THREADS; ++n) {
        const int i = tid + n * THREADS, r = i >> 5, c = i & 31;
        const bool in = first + r < limit;
        pd_cp16(dst + r * DH + 4 * (c ^ swizzle(r)), src + (size_t)(in ? first + r : 0) * DH + 4 * c, in);
    }
    pd_cp_commit();
}

// A tile lands in shared memory without passing through registers while the block computes on the one before.
// 16 bytes global -> shared without a register; `valid` false writes zeros and reads nothing
__device__ __forceinline__ void pd_cp16(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void pd_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// until at most N of this thread's groups are in flight
template <int N> __device__ __forceinline__ void pd_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

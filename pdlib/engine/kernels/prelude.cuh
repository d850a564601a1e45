#define thread_position_in_threadgroup threadIdx
#define threadgroup_position_in_grid blockIdx
#define threads_per_threadgroup blockDim
#define threadgroups_per_grid gridDim
#define PD_SHARED __shared__
#define PD_SHARED_SPACE
#define PD_DEVICE_SPACE
#define PD_BARRIER() __syncthreads()
#define PD_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, v, o)
#define PD_LANE(tid, attr) tid & 31
#define PD_WARP(tid, attr) tid >> 5
#define PD_UNROLL _Pragma("unroll")
#define PD_INT_AS_FLOAT __int_as_float
#define PD_UINT_AS_FLOAT __uint_as_float
#define PD_RSQRT rsqrtf
#define PD_EXP expf
#define PD_EXP2 exp2
#define PD_COS cos
#define PD_SIN sin
#define PD_FMAX fmaxf
#define PD_FLOAT4 make_float4
#define PD_DEVICE_FN __device__ __forceinline__
#define PD_LDCG(p) __ldcg(p)

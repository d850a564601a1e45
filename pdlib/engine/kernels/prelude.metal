#define PD_SHARED threadgroup
#define PD_SHARED_SPACE threadgroup
#define PD_DEVICE_SPACE device
#define PD_BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define PD_SHFL_XOR(v, o) simd_shuffle_xor(v, (ushort)(o))
#define PD_LANE(tid, attr) attr
#define PD_WARP(tid, attr) attr
#define PD_UNROLL
#define PD_INT_AS_FLOAT as_type<float>
#define PD_UINT_AS_FLOAT as_type<float>
#define PD_RSQRT metal::precise::rsqrt
#define PD_EXP metal::precise::exp
#define PD_EXP2 metal::exp2
#define PD_COS metal::precise::cos
#define PD_SIN metal::precise::sin
#define PD_FMAX fmax
#define PD_FLOAT4 float4
#define PD_DEVICE_FN inline
#define PD_LDCG(p) (*(p))

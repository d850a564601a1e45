"""Which backend runs, and the one place kernels are built: once, at import, for that backend only.

Each kernel body is written once. PRELUDE[backend], passed as `header=`, holds what differs, as macros:

    macro                 what                                  CUDA                 Metal
    PD_SHARED             storage of a block-shared array       __shared__           threadgroup
    PD_SHARED_SPACE       address space of a pointer into one   (nothing)            threadgroup
    PD_DEVICE_SPACE       address space of a buffer pointer     (nothing)            device
    PD_BARRIER()          block-wide barrier                    __syncthreads()      threadgroup_barrier(...)
    PD_SHFL_XOR(v, o)     v from lane (lane ^ o), all 32 lanes  __shfl_xor_sync      simd_shuffle_xor
    PD_LANE(tid, attr)    lane in the warp / simdgroup          tid & 31             attr
    PD_WARP(tid, attr)    warp / simdgroup in the block         tid >> 5             attr
    PD_UNROLL             unroll the loop that follows          _Pragma("unroll")    (nothing)
    PD_(U)INT_AS_FLOAT    an (unsigned) int's bits as a float   __(u)int_as_float    as_type<float>
    PD_FLOAT4             a float4 from four floats             make_float4          float4
    PD_RSQRT, PD_EXP, PD_COS, PD_SIN                            rsqrtf expf cos sin  metal::precise::...
    PD_EXP2, PD_FMAX                                            exp2 fmaxf           metal::exp2 fmax

Thread and block ids are spelled as Metal's attributes (thread_position_in_threadgroup,
threadgroup_position_in_grid, threads_per_threadgroup, threadgroups_per_grid), which the CUDA prelude maps to
threadIdx, blockIdx, blockDim and gridDim: MLX gives a Metal kernel an attribute only if the body (not the
header) names it. For the same reason PD_LANE and PD_WARP take the attribute as an argument, which CUDA
drops; their CUDA expansions are unparenthesised so that they read as the H200-validated text. After the
preprocessor the CUDA text is token for token that validated CUDA (tests/test_kernel_sources.py).
"""

import ctypes
import functools
import os

import mlx.core as mx

BACKEND = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"

_CUDA_PRELUDE = r"""
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
"""

_METAL_PRELUDE = r"""
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
"""

PRELUDE = {"cuda": _CUDA_PRELUDE, "metal": _METAL_PRELUDE}

# CUDA-only kernels' asynchronous copies (sm_80+), for their `header=`: a tile lands in shared memory without
# passing through registers while the block computes on the one before
CUDA_CP_ASYNC = r"""
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
"""


def cuda_launch_bounds(threads: int, blocks: int) -> str:
    """Header text that gives the kernel after it `__launch_bounds__(threads, blocks)`, so ptxas keeps to the
    registers that let `blocks` blocks share an SM (unbounded, it may take up to 255 a thread and fit fewer).
    MLX writes the signature itself, `__global__ void name(...)` right after the header, so the header redefines
    `__global__` as CUDA spells it plus the bounds; nothing else follows in that source."""
    return f"#undef __global__\n#define __global__ __attribute__((global)) __launch_bounds__({threads}, {blocks})\n"


def kernel_or_none(name: str, inputs: list[str], outputs: list[str], *, source: str | None = None,
                   cuda_source: str | None = None, metal_source: str | None = None, header: str = ""):
    """The backend's custom kernel, or None on the CPU (where the ops twin runs). `source` is one body for both
    backends, built on PRELUDE; `cuda_source` / `metal_source` are raw per-backend bodies without it."""
    if source is not None and BACKEND != "cpu":
        cuda_source = metal_source = source
        header = PRELUDE[BACKEND] + header
    if BACKEND == "cuda":
        return mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs, source=cuda_source,
                                   header=header)
    if BACKEND == "metal":
        return mx.fast.metal_kernel(name=name, input_names=inputs, output_names=outputs, source=metal_source,
                                    header=header)
    return None


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The environment's setting of a kernel switch, the first of `choices` when unset or empty; any other value
    is a clear error naming the accepted ones."""
    value = os.environ.get(name) or choices[0]
    if value not in choices:
        from pdlib.errors import InputError
        raise InputError(f"{name} must be {' or '.join(choices)}, got {value!r}")
    return value


def float_bits(x: float) -> int:
    """An FP32 value as the int32 of its bits: kernels take it as a template constant and rebuild it exactly
    (no tiny scalar array for the kernel to read: MLX keeps those in managed memory)."""
    import struct
    return struct.unpack("<i", struct.pack("<f", x))[0]


@functools.cache
def cuda_sm_count() -> int:
    """Streaming multiprocessors of CUDA device 0 (the process's first visible GPU, which MLX uses), from the
    driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, n = ctypes.c_int(), ctypes.c_int()
    for call in (lambda: cuda.cuInit(0), lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0),
                 lambda: cuda.cuDeviceGetAttribute(ctypes.byref(n), 16, dev)):  # 16: MULTIPROCESSOR_COUNT
        if call() != 0:
            raise RuntimeError("the CUDA driver did not report the device's SM count")
    return n.value

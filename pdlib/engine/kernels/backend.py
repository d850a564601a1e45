"""Which backend runs, where kernel text is read, and the one place kernels are built: once, at import, for that
backend only.

Kernel text lives in files beside its launcher (package data), read once by `source(name)`:
    name.cu     a kernel body (what MLX wraps in the function's signature): CUDA-only, or single-source where it
                spells every difference with the PD_* macros below (kernel_or_none(source=...) builds it for
                CUDA or Metal); the bodies of gemv, decode_attention_*, kv_store, kv_install, qk_rope and
                rope_inv_freq are single-source
    name.cuh    file-scope device functions a body calls, passed as `header=`; qk_norm_rope.cuh is
                single-source too (decode_attention's Metal twin and the persistent kernel share it)
    prelude.cuh, prelude.metal   PRELUDE[backend], the macros below

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
    PD_DEVICE_FN          a function a body calls                __device__ __forceinline__   inline
    PD_LDCG(p)            *p through L2 (written by other blocks) __ldcg(p)           *p

Thread and block ids are spelled as Metal's attributes (thread_position_in_threadgroup,
threadgroup_position_in_grid, threads_per_threadgroup, threadgroups_per_grid), which the CUDA prelude maps to
threadIdx, blockIdx, blockDim and gridDim: MLX gives a Metal kernel an attribute only if the body (not the
header) names it. For the same reason PD_LANE and PD_WARP take the attribute as an argument, which CUDA
drops; their CUDA expansions are unparenthesised so that they read as the validated CUDA text. After the
preprocessor the CUDA text is token for token that validated CUDA (tests/engine/test_kernel_sources.py).
"""

import ctypes
import functools
import importlib.resources

import mlx.core as mx

BACKEND = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"


@functools.cache
def source(name: str) -> str:
    """A kernel file beside this module (package data), read once, after a `#line` directive so that a compiler
    error names the file's own lines (the directive vanishes in preprocessing)."""
    text = importlib.resources.files(__package__).joinpath(name).read_text()
    return f'#line 1 "pdlib/engine/kernels/{name}"\n{text}'


PRELUDE = {"cuda": source("prelude.cuh"), "metal": source("prelude.metal")}

# CUDA-only kernels' asynchronous copies (sm_80+), for their `header=`
CUDA_CP_ASYNC = source("cp_async.cuh")


def cuda_launch_bounds(threads: int, blocks: int) -> str:
    """Header text that gives the kernel after it `__launch_bounds__(threads, blocks)`, so ptxas keeps to the
    registers that let `blocks` blocks share an SM (unbounded, it may take up to 255 a thread and fit fewer).
    MLX writes the signature itself, `__global__ void name(...)` right after the header, so the header redefines
    `__global__` as CUDA spells it plus the bounds; nothing else follows in that source."""
    return f"#undef __global__\n#define __global__ __attribute__((global)) __launch_bounds__({threads}, {blocks})\n"


def kernel_or_none(
    name: str,
    inputs: list[str],
    outputs: list[str],
    *,
    source: str | None = None,
    cuda_source: str | None = None,
    metal_source: str | None = None,
    header: str = "",
):
    """The backend's custom kernel, or None on the CPU (where the ops twin runs). `source` is one body for both
    backends, built on PRELUDE; `cuda_source` / `metal_source` are raw per-backend bodies without it."""
    if source is not None and BACKEND != "cpu":
        cuda_source = metal_source = source
        header = PRELUDE[BACKEND] + header
    if BACKEND == "cuda":
        return mx.fast.cuda_kernel(
            name=name, input_names=inputs, output_names=outputs, source=cuda_source, header=header
        )
    if BACKEND == "metal":
        return mx.fast.metal_kernel(
            name=name, input_names=inputs, output_names=outputs, source=metal_source, header=header
        )
    return None


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
    for call in (
        lambda: cuda.cuInit(0),
        lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0),
        lambda: cuda.cuDeviceGetAttribute(ctypes.byref(n), 16, dev),
    ):  # 16: MULTIPROCESSOR_COUNT
        if call() != 0:
            raise RuntimeError("the CUDA driver did not report the device's SM count")
    return n.value

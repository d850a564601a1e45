"""Kernel text as MLX wraps a body (mlx/backend/cuda/custom_kernel.cpp and its Metal twin): the signature,
inputs `const T*`, outputs `T*`, template values as constants (CUDA) or template parameters (Metal, whose
attributes are parameters too). Shared by the tests that compile or compare kernel text without a GPU."""

import ctypes
import glob
import os
import sys
from dataclasses import dataclass


@dataclass
class Kernel:
    name: str  # the function's name (and the frozen copies' file name)
    source: str
    inputs: list  # (name, dtype code) in the order the wrapper passes them to MLX
    outputs: list
    instances: list  # template values of realistic launches
    header: str = ""  # file-scope text the body calls into (its `header=` beyond the prelude)


CUDA_TYPES = {"f32": "float", "bf16": "__nv_bfloat16", "i32": "int32_t", "u32": "uint32_t", "u64": "uint64_t"}
METAL_TYPES = {"f32": "float", "bf16": "bfloat16_t", "i32": "int32_t", "u32": "uint32_t"}
# MLX declares these Metal attributes, with these types, for a body that names them (its metal_kernel)
METAL_ATTRIBUTES = {
    "dispatch_quadgroups_per_threadgroup": "uint",
    "dispatch_simdgroups_per_threadgroup": "uint",
    "dispatch_threads_per_threadgroup": "uint3",
    "grid_origin": "uint3",
    "grid_size": "uint3",
    "quadgroup_index_in_threadgroup": "uint",
    "quadgroups_per_threadgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint",
    "simdgroups_per_threadgroup": "uint",
    "thread_execution_width": "uint",
    "thread_index_in_quadgroup": "uint",
    "thread_index_in_simdgroup": "uint",
    "thread_index_in_threadgroup": "uint",
    "thread_position_in_grid": "uint3",
    "thread_position_in_threadgroup": "uint3",
    "threadgroup_position_in_grid": "uint3",
    "threadgroups_per_grid": "uint3",
    "threads_per_grid": "uint3",
    "threads_per_simdgroup": "uint",
    "threads_per_threadgroup": "uint3",
}


def metal_attributes(source: str) -> list[str]:
    """What MLX adds to the Metal signature: the attributes whose names occur in the body (not the header)."""
    return [f"{t} {a}" for a, t in METAL_ATTRIBUTES.items() if a in source]


def wrapped(kernel: Kernel, backend: str, source: str) -> str:
    """The kernel's instances (one function each, named kernel.name + _i) as MLX wraps `source`."""
    out = []
    for i, inst in enumerate(kernel.instances):
        fn = f"{kernel.name}_{i}"
        if backend == "cuda":
            # an input's shape follows it when the body names it (x_shape), as MLX passes it
            params = [
                p
                for n, t in kernel.inputs
                for p in [f"const {CUDA_TYPES[t]}* {n}"]
                + ([f"const __grid_constant__ Shape {n}_shape"] if f"{n}_shape" in source else [])
            ] + [f"{CUDA_TYPES[t]}* {n}" for n, t in kernel.outputs]
            consts = "".join(
                f"  constexpr {'bool' if isinstance(v, bool) else 'int'} {k} = {str(v).lower()};\n"
                for k, v in inst.items()
            )
            out.append(f"__global__ void {fn}(\n    {', '.join(params)}) {{\n{consts}\n{source}\n}}\n")
        else:
            params = (
                [
                    p
                    for n, t in kernel.inputs
                    for p in [f"const device {METAL_TYPES[t]}* {n}"]
                    + ([f"const constant int* {n}_shape"] if f"{n}_shape" in source else [])
                ]
                + [f"device {METAL_TYPES[t]}* {n}" for n, t in kernel.outputs]
                + metal_attributes(source)
            )
            tparams = ", ".join(f"{'bool' if isinstance(v, bool) else 'int'} {k}" for k, v in inst.items())
            targs = ", ".join(str(v).lower() for v in inst.values())
            out.append(
                f"template <{tparams}>\nvoid {fn}_t(\n    {', '.join(params)}) {{\n{source}\n}}\n"
                f"static auto* const {fn} = &{fn}_t<{targs}>;\n"
            )
    return "\n".join(out)


# -- NVRTC: compile a kernel's text for the H200 without a GPU ---------------------------------------------


def _nvrtc():
    """libnvrtc from the nvidia-cuda-nvrtc wheel (a test extra on Linux), or None."""
    for root in sys.path:
        libs = sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libnvrtc.so.*")))
        builtins = sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libnvrtc-builtins.so.*")))
        if libs and builtins:
            ctypes.CDLL(builtins[0], mode=ctypes.RTLD_GLOBAL)  # so libnvrtc's own dlopen of it by name succeeds
            return ctypes.CDLL(libs[0])
    return None


NVRTC = _nvrtc() if sys.platform == "linux" else None


# What MLX's default header provides that the kernels use: fixed-width ints, bf16 storage, INFINITY, an
# input's shape
STANDINS = (
    "typedef unsigned int uint32_t; typedef int int32_t; typedef unsigned long long uint64_t;\n"
    "struct __nv_bfloat16 { unsigned short x; };\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "struct Shape { int d[10]; __device__ int operator[](int i) const { return d[i]; } };\n"
)


def compile_sm90(text: str, arch: str = "sm_90") -> str:
    """ptxas's log for the H200; `arch` sm_90a for Hopper-only instructions (wgmma), as MLX 0.32 compiles every
    custom kernel there (mlx/backend/cuda/jit_module.cpp)."""
    prog = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"kernel.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-Xptxas=-v"]
    rc = NVRTC.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetProgramLog(prog, log)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))
    assert rc == 0, log.value.decode()
    return log.value.decode()

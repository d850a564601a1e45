"""Each kernel body is written once, on backend.PRELUDE. The CUDA kernels are validated on an H200, so the CUDA
text they compile to must stay that text: after the C preprocessor it is token for token the CUDA bodies frozen
in tests/data/kernels_cuda_frozen (a body's device functions in its .cuh there), and nvcc turns both into the
same PTX. The bodies live in pdlib/engine/kernels/*.cu, read with a #line directive that the preprocessor drops.
No Metal compiler runs here: the Metal text is type-checked
against a few lines of plain-C++ stand-ins for Metal, with exactly the attributes MLX would declare for it
(those named in the body)."""

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from kernel_text import METAL_ATTRIBUTES, Kernel, wrapped

from pdlib.engine.kernels.backend import PRELUDE, float_bits

backend_module = importlib.import_module("pdlib.engine.kernels.backend")

DATA = Path(__file__).parents[1] / "data"
gemv_module = importlib.import_module("pdlib.engine.kernels.gemv")
attention_module = importlib.import_module("pdlib.engine.kernels.decode_attention")
kv_store_module = importlib.import_module("pdlib.engine.kernels.kv_store")
rope_module = importlib.import_module("pdlib.engine.kernels.rope")


def _gemv_instances():
    from pdlib.tools.kernel_check import gemv_cases

    for _, c in gemv_cases():
        block, rows = gemv_module.launch_shape(c["N"])
        yield dict(
            K=c["K"],
            N=c["N"],
            BLOCK=block,
            ROWS=rows,
            EPS_BITS=float_bits(1e-6),
            NORM=c.get("norm", False),
            RESIDUAL=c.get("residual", False),
            SWIGLU=c.get("swiglu", False),
        )


_A = attention_module
KERNELS = [
    Kernel(
        "gemv",
        gemv_module.SOURCE,
        [("x", "f32"), ("w", "bf16"), ("nw", "f32"), ("res", "f32")],
        [("out", "f32")],
        list(_gemv_instances()),
    ),
    Kernel(
        "decode_attention_partial",
        _A.PARTIAL,
        [
            ("qkv", "f32"),
            ("qn", "f32"),
            ("knw", "f32"),
            ("inv_freq", "f32"),
            ("pos", "i32"),
            ("kc", "f32"),
            ("vc", "f32"),
            ("after", "u32"),
        ],
        [("part_m", "f32"), ("part_l", "f32"), ("part_o", "f32"), ("written", "u32")],
        [
            dict(
                HQ=16,
                HKV=8,
                DH=128,
                CAP=cap,
                NC=-(-cap // _A.CHUNK),
                CHUNK=_A.CHUNK,
                THREADS=_A.THREADS,
                GROUP=_A.GROUP,
                EPS_BITS=float_bits(1e-6),
                SCALE_BITS=float_bits(128**-0.5),
            )
            for cap in (640, 5120 + 128)
        ],
        header=_A.QK_NORM_ROPE,
    ),
    Kernel(
        "decode_attention_reduce",
        _A.REDUCE,
        [("part_m", "f32"), ("part_l", "f32"), ("part_o", "f32"), ("pos", "i32")],
        [("o", "f32")],
        [dict(NC=41, DH=128, CHUNK=_A.CHUNK)],
    ),
    Kernel(
        "kv_store",
        kv_store_module.SOURCE,
        [("k", "f32"), ("v", "f32"), ("pos", "i32"), ("kc", "f32"), ("vc", "f32"), ("after", "u32")],
        [("keys", "f32"), ("values", "f32"), ("written", "u32")],
        [dict(HKV=8, DH=128, CAP=640)],  # T is k_shape[1],
    ),
    Kernel(
        "kv_install",
        kv_store_module.INSTALL,
        [("k", "f32"), ("v", "f32"), ("pos", "i32"), ("kc", "f32"), ("vc", "f32"), ("after", "u32")],
        [("written", "u32")],
        [dict(HKV=8, DH=128, CAP=640)],
    ),
    Kernel("rope_inv_freq", rope_module.INV_FREQ, [("lb", "f32")], [("out", "f32")], [dict(HALF=64)]),
]
IDS = [k.name for k in KERNELS]

_TOKEN = re.compile(
    r"""\#[^\n]*|[A-Za-z_]\w*|\.?\d(?:[eEpP][+-]|[\w.])*|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'"""
    r"""|>>=|<<=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|::|\.\.\.|\S"""
)


def preprocessed_tokens(text: str) -> list[str]:
    """C tokens after the preprocessor (each `#pragma` line one token: `_Pragma("x")` becomes `#pragma x`)."""
    cpp = subprocess.run(
        ["cpp", "-P", "-undef", "-nostdinc", "-x", "c++", "-"], input=text, capture_output=True, text=True, check=True
    ).stdout
    return [re.sub(r"\s+", " ", t) for t in _TOKEN.findall(cpp)]


def frozen(kernel: Kernel, backend: str) -> str:
    return (DATA / f"kernels_{backend}_frozen" / f"{kernel.name}.{'cu' if backend == 'cuda' else 'metal'}").read_text()


def frozen_header(kernel: Kernel) -> str:
    """The frozen CUDA of the device functions a body calls (its header beyond the prelude), or nothing."""
    path = DATA / "kernels_cuda_frozen" / f"{kernel.name}.cuh"
    return path.read_text() if path.exists() else ""


needs_cpp = pytest.mark.skipif(shutil.which("cpp") is None, reason="no C preprocessor (cpp)")


@pytest.mark.parametrize("backend,build", [("cuda", "cuda_kernel"), ("metal", "metal_kernel")])
def test_a_kernel_gets_one_body_and_its_backends_prelude(monkeypatch, backend, build):
    seen = {}
    monkeypatch.setattr(backend_module, "BACKEND", backend)
    monkeypatch.setattr(mx.fast, build, lambda **kw: seen.update(kw) or "built")
    assert backend_module.kernel_or_none("k", ["x"], ["y"], source="BODY", header="EXTRA") == "built"
    assert seen["source"] == "BODY" and seen["header"] == PRELUDE[backend] + "EXTRA"


@needs_cpp
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_cuda_text_is_the_validated_cuda(kernel):
    assert preprocessed_tokens(PRELUDE["cuda"] + kernel.header + kernel.source) == preprocessed_tokens(
        frozen_header(kernel) + frozen(kernel, "cuda")
    )


@needs_cpp
def test_metal_text_is_the_old_metal_where_nothing_had_to_change():
    """The merge of the split-K chunks came out token for token as the Metal copy had it; the others
    changed, all of it to CUDA's formulation (docs/engine.md)."""
    reduce = KERNELS[IDS.index("decode_attention_reduce")]
    assert preprocessed_tokens(PRELUDE["metal"] + reduce.source) == preprocessed_tokens(frozen(reduce, "metal"))


CUDA_ONLY = {
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "__shared__",
    "__syncthreads",
    "__shfl_xor_sync",
    "__int_as_float",
    "__uint_as_float",
    "rsqrtf",
    "expf",
    "fmaxf",
    "make_float4",
    "#pragma unroll",
}
METAL_ONLY = set(METAL_ATTRIBUTES) | {
    "threadgroup",
    "device",
    "threadgroup_barrier",
    "simd_shuffle_xor",
    "as_type",
    "metal",
    "simd_sum",
}


@needs_cpp
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_each_backend_sees_only_its_own_vocabulary(kernel):
    cuda = set(preprocessed_tokens(PRELUDE["cuda"] + kernel.header + kernel.source))
    metal = set(preprocessed_tokens(PRELUDE["metal"] + kernel.header + kernel.source))
    assert not cuda & METAL_ONLY and not metal & CUDA_ONLY
    assert not {t for t in cuda | metal if t.startswith("PD_")}  # every prelude macro expanded


def _ptx(tmp_path: Path, name: str, text: str) -> str:
    src = tmp_path / f"{name}.cu"
    shape = "struct Shape { int d[10]; __device__ int operator[](int i) const { return d[i]; } };\n"  # MLX's
    src.write_text("#include <cstdint>\n#include <cuda_bf16.h>\n" + shape + text)
    run = subprocess.run(
        ["nvcc", "--ptx", "-std=c++17", "-arch=sm_90a", "-o", str(tmp_path / f"{name}.ptx"), str(src)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return "\n".join(line for line in (tmp_path / f"{name}.ptx").read_text().splitlines() if not line.startswith("//"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_cuda_compiles_to_the_validated_ptx(tmp_path):
    """Compile-only (no GPU needed), for the H200's sm_90a, every kernel in one file: the single source and
    the frozen bodies give the same PTX, so `_Pragma("unroll")` for `#pragma unroll` changed no code either."""
    new = PRELUDE["cuda"] + "".join(k.header for k in KERNELS) + "".join(wrapped(k, "cuda", k.source) for k in KERNELS)
    old = "".join(frozen_header(k) for k in KERNELS) + "".join(wrapped(k, "cuda", frozen(k, "cuda")) for k in KERNELS)
    new_ptx, old_ptx = _ptx(tmp_path, "single_source", new), _ptx(tmp_path, "frozen", old)
    assert new_ptx.count(".entry") == sum(len(k.instances) for k in KERNELS)
    assert new_ptx == old_ptx


METAL_STANDINS = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#define device
#define threadgroup
#define constant
typedef unsigned int uint;
typedef unsigned short ushort;
typedef uint16_t bfloat16_t;
struct uint3 { uint x, y, z; };
struct uint4 { uint x, y, z, w; };
struct float4 {
  float x, y, z, w;
  float4() = default;
  float4(float a, float b, float c, float d) : x(a), y(b), z(c), w(d) {}
};
enum class mem_flags { mem_threadgroup };
void threadgroup_barrier(mem_flags);
float simd_shuffle_xor(float, ushort);
template <class T, class U> T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type");
  T t;
  std::memcpy(&t, &u, sizeof t);
  return t;
}
namespace metal {
float exp2(float);
namespace precise { float rsqrt(float); float exp(float); float cos(float); float sin(float); }
}
using std::fmax; using std::min;
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_metal_text_type_checks_against_standins(tmp_path):
    """Catches a name the Metal expansion lacks (an attribute MLX would not declare, a missing function), a
    wrong argument count or a bad cast; the stand-ins model address spaces away, so not those."""
    text = (
        METAL_STANDINS
        + PRELUDE["metal"]
        + "".join(k.header for k in KERNELS)
        + "".join(wrapped(k, "metal", k.source) for k in KERNELS)
    )
    src = tmp_path / "metal_standins.cpp"
    src.write_text(text)
    run = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-Wno-unused", str(src)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr

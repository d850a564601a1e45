"""Where a 3xTF32 GEMM block's time goes, slice by slice (runbook 3): gemm.SOURCE (mma.sync) and SOURCE_WGMMA,
each with clock64() stamps that thread 0 of block (0, 0, 0) writes at every phase of every 32-deep slice, in a
normal launch of the whole grid. At a chunk's 128 rows, for each matrix kind: the block's cycles from start to
end, its slices, and per slice the median cycles of each phase (the stamp before it to the stamp after it).
v21 measured both kernels at ~5k cycles a slice against ~400 of tensor work (notes/gpu.md): this says which
phase holds them. Stamps read issue times (an mma or wgmma issued is not done; its wait shows in a later phase).

    python3 notes/gpu-session/gemm_phases.py           # on the H200
    python3 notes/gpu-session/gemm_phases.py --compile # anywhere with NVRTC: the instrumented text compiles
"""

import json
import os
import statistics
import sys

from pdlib.engine.kernels import gemm as G

STAMP = r"""
// thread 0 of block (0, 0, 0) writes the SM's clock into prof[slot]
#define PD_STAMP(slot) do { if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) \
    prof[(slot)] = (uint64_t)clock64(); } while (0)
"""
PAD = " " * 31               # the kernels' comment column, after `__syncthreads();`
MAX_SLICES = 64              # prof: [MAX_SLICES][8] per slice (8 i + phase), then the block's start and end

# (anchor, what goes after it) for each kernel; a stamp's slot is 8 i + phase, the block's start and end at
# 8 MAX_SLICES (8 * 64 in the text) and + 1. Both kernels open a block and a slice alike.
OPENING = [
    ("    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, k_begin = blockIdx.z * KS;\n",
     "    PD_STAMP(8 * 64);\n"),
    ("    for (int i = 0; i < SLICES; ++i) {\n", "        PD_STAMP(8 * i + 0);\n"),
    ("        pd_cp_wait<STAGES - 2>();                      // this thread's copies of slice i have landed\n",
     "        PD_STAMP(8 * i + 1);\n"),
]
MMA_SYNC = {
    "names": ["wait", "barrier", "request", "split 1st", "mma issue"],
    "inserts": OPENING + [
        ("        __syncthreads();" + PAD + "// everyone's have; and slice i - 1's buffer is free\n",
         "        PD_STAMP(8 * i + 2);\n"),
        ("        const float* Bs = smem + (i % STAGES) * STAGE + BM * AP + (wn + g) * BPB / 4;\n",
         "        PD_STAMP(8 * i + 3);\n"),
        ("                    bh[ni][1] = c & 0xffff0000u;\n                }\n            }\n",
         "            if (kk == 0) PD_STAMP(8 * i + 4);\n"),
        ("                for (int ni = 0; ni < NI; ++ni) pd_mma(part[mi][ni], ah[mi], bh[ni]);\n        }\n",
         "        PD_STAMP(8 * i + 5);\n"),
    ],
    "end_after": "    pd_store(y + (size_t)blockIdx.z * M * N, acc, m0 + wm, n0 + wn, M, N, g, t);\n",
}
WGMMA = {
    "names": ["wait", "barrier", "request", "split", "fence+barrier", "wgmma issue", "wgmma wait"],
    "inserts": OPENING + [
        ("        __syncthreads();" + PAD + "// everyone's; slice i - 1's buffer and copies are free\n",
         "        PD_STAMP(8 * i + 2);\n"),
        ("        const float* As = smem + (i % STAGES) * STAGE;\n", "        PD_STAMP(8 * i + 3);\n"),
        ("        split(As + BM * AP, bhi, blo, BN);\n", "        PD_STAMP(8 * i + 4);\n"),
        ("        __syncthreads();" + PAD + "// every copy written and visible to the tensor cores\n",
         "        PD_STAMP(8 * i + 5);\n"),
        ("        pd_wgmma_commit();\n", "        PD_STAMP(8 * i + 6);\n"),
        ("        pd_wgmma_wait0();" + PAD[1:] + "// the copies are read: the next slice may overwrite them\n",
         "        PD_STAMP(8 * i + 7);\n"),
    ],
    "end_after": "make_float2(acc[4 * j + 2], acc[4 * j + 3]);\n    }\n",
}


def instrumented(source: str, plan: dict) -> str:
    """`source` with the plan's stamps; every anchor must occur exactly once (the kernel changed: fix the plan)."""
    for anchor, insert in plan["inserts"] + [(plan["end_after"], f"    PD_STAMP(8 * {MAX_SLICES} + 1);\n")]:
        if source.count(anchor) != 1:
            raise ValueError(f"anchor found {source.count(anchor)} times: {anchor!r}")
        source = source.replace(anchor, anchor + insert)
    return source


# name: (launch shape, source, header, stamps, the weight's bytes an element)
KERNELS = {"mma.sync": (G.CHUNK_TILES, G.SOURCE, G.HEADER, MMA_SYNC, 4),
           "mma.sync bf16": (G.CHUNK_TILES, G.SOURCE, G.HEADER, MMA_SYNC, 2),
           "wgmma": (G.WGMMA_TILES, G.SOURCE_WGMMA, G.HEADER_WGMMA, WGMMA, 4)}
KINDS = {"q|k|v": (1024, 4096), "o_proj": (2048, 1024), "gate|up": (1024, 6144), "down": (3072, 1024)}


def compile_only():
    """The instrumented text as MLX wraps it, through NVRTC for sm_90a (tests/kernel_text.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped
    if NVRTC is None:
        sys.exit("no NVRTC here")
    for name, (shape, source, header, plan, wb) in KERNELS.items():
        text = instrumented(source, plan)
        k = Kernel("pdlib_gemm_phases", text, [("x", "f32"), ("w", "f32" if wb == 4 else "bf16")],
                   [("y", "f32"), ("prof", "u64")], [dict(G.template(shape, 1024, 4096, 2, wb))])
        log = compile_sm90(STANDINS + header + STAMP + wrapped(k, "cuda", text), arch="sm_90a")
        print(name, [line for line in log.splitlines() if "Used" in line or "spill" in line][:2])


def run():
    import mlx.core as mx
    from pdlib.engine.kernels.backend import cuda_sm_count
    mx.random.seed(0)
    for name, (shape, source, header, plan, wb) in KERNELS.items():
        kernel = mx.fast.cuda_kernel(name=f"pdlib_gemm_phases_{name.replace('.', '_').replace(' ', '_')}",
                                     input_names=["x", "w"], output_names=["y", "prof"],
                                     source=instrumented(source, plan), header=header + STAMP,
                                     shared_memory=shape.shared_bytes(wb))
        for kind, (K, N) in KINDS.items():
            x, w = mx.random.normal((128, K)), mx.random.normal((N, K)) * K ** -0.5
            w = w.astype(mx.bfloat16) if wb == 2 else w
            split = G.k_split(128, K, N, cuda_sm_count(), shape)
            runs = []
            for _ in range(7):
                y, prof = kernel(inputs=[x, w], template=G.template(shape, K, N, split, wb),
                                 grid=(N // shape.bn * shape.threads, -(-128 // shape.bm), split),
                                 threadgroup=(shape.threads, 1, 1),
                                 output_shapes=[(split, 128, N), (8 * MAX_SLICES + 2,)],
                                 output_dtypes=[mx.float32, mx.uint64], init_value=0)
                mx.eval(y, prof)
                runs.append([int(v) for v in prof.tolist()])
            slices = K // split // G.BK
            phases = plan["names"]
            row = {"kernel": name, "kind": kind, "split": split, "slices": slices,
                   "block_cycles": statistics.median(r[8 * MAX_SLICES + 1] - r[8 * MAX_SLICES] for r in runs[2:]),
                   "prologue": statistics.median(r[0] - r[8 * MAX_SLICES] for r in runs[2:])}
            for p, phase in enumerate(phases):   # stamp p to stamp p + 1 within a slice
                row[phase] = statistics.median(r[8 * i + p + 1] - r[8 * i + p] for r in runs[2:] for i in range(slices))
            row["to next slice"] = statistics.median(r[8 * (i + 1)] - r[8 * i + len(phases)] for r in runs[2:]
                                                     for i in range(slices - 1))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else run()

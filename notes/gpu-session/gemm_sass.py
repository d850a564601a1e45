"""The GEMM's slice loop, counted in the compiled text: no GPU needed. gemm.SOURCE as MLX wraps it
(tests/kernel_text.py), compiled by nvcc for sm_90a and read back by nvdisasm; the longest loop (the 32-deep
slice loop) is counted by opcode. v22's clock said the kernel is issue-bound, so instructions per mma is the
figure to cut (notes/gpu.md, v23: 6.2 at 64x64/w32x32 before the k-paired reads, 4.2 at 128x64/w32x64).

    python3 notes/gpu-session/gemm_sass.py                      # every mma.sync candidate, bf16 and FP32 w
                                                                # (bf16x3: bf16 only; HMMA counts either mma)
    python3 notes/gpu-session/gemm_sass.py 128x64/w32x64 --dump  # one shape's SASS too

Needs nvcc (the CUDA toolkit) and nvdisasm (`pip install nvidia-cuda-nvdisasm`, or the toolkit's).
"""

import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "..", "tests"),
                os.path.join(os.path.dirname(__file__), "..", "..")]
from kernel_text import STANDINS, Kernel, wrapped  # noqa: E402

from pdlib.engine.kernels import gemm as G  # noqa: E402


def nvdisasm() -> str:
    found = shutil.which("nvdisasm") or next(iter(sorted(
        p for root in sys.path for p in glob.glob(os.path.join(root, "nvidia", "cu*", "bin", "nvdisasm")))), None)
    if not found or not shutil.which("nvcc"):
        sys.exit("needs nvcc and nvdisasm (pip install nvidia-cuda-nvdisasm)")
    return found


def sass(shape: G.Tiles, wb: int, K: int = 1024, N: int = 4096, split: int = 2) -> tuple[int, str]:
    """(registers, SASS) of the kernel at this launch shape and weight width."""
    source = G.SOURCE_BF16X3 if shape.bf16x3 else G.SOURCE
    kernel = Kernel("pdlib_gemm", source, [("x", "f32"), ("w", "f32" if wb == 4 else "bf16")], [("y", "f32")],
                    [dict(G.template(shape, K, N, split, wb))])
    with tempfile.TemporaryDirectory() as d:
        cu, cubin = os.path.join(d, "k.cu"), os.path.join(d, "k.cubin")
        with open(cu, "w") as f:
            f.write(STANDINS + G.HEADER + wrapped(kernel, "cuda", source))
        log = subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-std=c++17", "-Xptxas=-v", "-o", cubin, cu],
                             capture_output=True, text=True, check=True).stderr
        text = subprocess.run([nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Used (\d+) registers", log).group(1)), text


def slice_loop(text: str) -> list[str]:
    """The instructions of the longest loop: from a label to the last branch back to it."""
    labels, body = {}, []
    for line in text.splitlines():
        if m := re.match(r"\s*\.(L_x_\d+):", line):
            labels[m.group(1)] = len(body)
        elif m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line):
            body.append(m.group(1))
    loops = [(labels[m.group(1)], i) for i, s in enumerate(body)
             if (m := re.search(r"BRA.*\.(L_x_\d+)", s)) and labels.get(m.group(1), len(body)) <= i]
    start, end = max(loops, key=lambda ab: ab[1] - ab[0])
    return body[start:end + 1]


def opcodes(loop: list[str]) -> collections.Counter:
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", s).split()[0].split(".")[0] for s in loop)


def main(argv: list[str]) -> None:
    wanted = [a for a in argv if not a.startswith("--")]
    shapes = [s for s in G.CANDIDATES if not s.wgmma and (not wanted or any(s.label.startswith(w) for w in wanted))]
    print(f"{'shape':<30} {'w':<5} {'regs':>4} {'loop':>5} {'mma':>4} {'per mma':>7}  top opcodes")
    for shape in shapes:
        for wb in (2,) if shape.bf16x3 else (2, 4):
            regs, text = sass(shape, wb)
            ops = opcodes(slice_loop(text))
            total = sum(ops.values())
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(7))
            print(f"{shape.label:<30} {'bf16' if wb == 2 else 'fp32':<5} {regs:>4} {total:>5} {ops['HMMA']:>4} "
                  f"{total / ops['HMMA']:>7.2f}  {top}")
            if "--dump" in argv:
                print("\n".join(slice_loop(text)))


if __name__ == "__main__":
    main(sys.argv[1:])

"""A model of the 3xTF32 GEMM's accumulation (gemm.SOURCE and SOURCE_WGMMA) for the prefill's four matmul depths,
against float64, by tc_truncation_model.py's mma (TF32 splits; each mma step's addends aligned at the largest
one's exponent and truncated, the small products first). v21 found that a flash accumulator held across many
steps drifts toward zero; the GEMM holds one across K / split columns (1,024 for gate|up's 1 split, 512 for
q|k|v's 2, 256 for o_proj's and 384 for down's 8). Variants:
  kernel  one accumulator across the block's K slice (as both kernels run)
  slices  a fresh accumulator per 32-deep slice, added into the block's in FP32
  fp32    an FP32 FMA chain (MLX's FP32 matmul, roughly)
x as the gate's activations are (check-kernels' cases: N(0, 3^2); also with a mean per column), w ~ N(0, 1/K).
Prints each one's worst error as a fraction of the gate's tolerance and its bias (the mean signed error over
|exact|, the share of the drift toward zero).

    python3 notes/gpu-session/gemm_truncation_model.py
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from tc_truncation_model import mma, split  # noqa: E402

OUTS = 2048     # outputs per depth (dot products)


def kernel_dot(x, w, slice_fresh: bool):
    """x (K,) . w (K, OUTS): 3xTF32 by mma steps of 8 (lo hi, hi lo, hi hi each step), the block's accumulator
    across all of K, or a fresh one per 32 columns added in FP32."""
    (xh, xl), (wh, wl) = split(x), split(w)
    acc = np.zeros(w.shape[1], np.float32)
    part = np.zeros(w.shape[1], np.float32)
    for k0 in range(0, len(x), 8):
        k = slice(k0, k0 + 8)
        for a, b in ((xl, wh), (xh, wl), (xh, wh)):
            prods = a[k, None].astype(np.float64) * b[k].astype(np.float64)
            if slice_fresh:
                part = mma(part, prods)
            else:
                acc = mma(acc, prods)
        if slice_fresh and (k0 + 8) % 32 == 0:
            acc, part = (acc + part).astype(np.float32), np.zeros_like(part)
    return acc


def fp32_dot(x, w):
    acc = np.zeros(w.shape[1], np.float32)
    for k in range(len(x)):
        acc = (acc + np.float32(x[k]) * w[k]).astype(np.float32)   # FMA rounds once; close enough here
    return acc


if __name__ == "__main__":
    rng = np.random.default_rng(3)
    for mean in (0.0, 1.0):
        for depth in (256, 384, 512, 1024):
            x = (rng.standard_normal(depth) * 3 + mean).astype(np.float32)
            w = (rng.standard_normal((depth, OUTS)) / np.sqrt(depth)).astype(np.float32)
            exact = x.astype(np.float64) @ w.astype(np.float64)
            t0 = time.time()
            line = [f"x mean {mean:.0f}, depth {depth:>4}:"]
            for name, got in (("kernel", kernel_dot(x, w, False)), ("slices", kernel_dot(x, w, True)),
                              ("fp32", fp32_dot(x, w))):
                err = got.astype(np.float64) - exact
                worst = np.max(np.abs(err) / (1e-3 + 1e-3 * np.abs(exact)))
                bias = np.mean(err * np.sign(exact)) / np.mean(np.abs(exact))
                line.append(f"{name} worst/tol {worst:.5f} bias {bias:+.1e}")
            print("  ".join(line), f"({time.time() - t0:.0f} s)", flush=True)

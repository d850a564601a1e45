"""The wgmma GEMM (gemm.SOURCE_WGMMA) on inputs whose products name their operands, for its first runs on the
H200: x selects one column of w per row (x[i, k] = 1 where k = i mod K), w[j, k] = K j + k, so a right output
y[i, j] is K j + (i mod K) and a wrong one names the (j, k) it took. Prints, per wgmma shape, how many outputs
are wrong, which 8x8 blocks hold them, and the first few wrong outputs decoded; then a random case over 1,024
columns of K (every slice and the ring) against FP32.

    python3 notes/gpu-session/wgmma_debug.py
"""

import numpy as np

import mlx.core as mx

from pdlib.engine.kernels import gemm as G

for shape in [s for s in G.CANDIDATES if s.wgmma]:
    M, Kd, N = 64, 32, shape.bn
    x = (np.arange(Kd)[None, :] == (np.arange(M) % Kd)[:, None]).astype(np.float32)
    w = (Kd * np.arange(N)[:, None] + np.arange(Kd)[None, :]).astype(np.float32)
    got = np.array(G.tf32x3_matmul(mx.array(x), mx.array(w), shape=shape, split=1, poison=True))
    want = x @ w.T
    bad = ~np.isclose(got, want, rtol=0, atol=1e-3)
    print(f"{shape.label}: {int(bad.sum())} of {bad.size} wrong, {int(np.isnan(got).sum())} NaN")
    if bad.any():
        blocks = bad.reshape(M // 8, 8, N // 8, 8).any(axis=(1, 3))
        print("  wrong 8x8 blocks (rows of 8 output rows, columns of 8 output columns):")
        for r in blocks:
            print("   ", "".join("X" if b else "." for b in r))
        for i, j in list(zip(*np.nonzero(bad)))[:12]:
            v = got[i, j]
            exact = np.isfinite(v) and abs(v - round(v)) < 1e-3
            where = f"w[{int(round(v)) // Kd}, {int(round(v)) % Kd}]" if exact else "?"
            print(f"  y[{i}, {j}] = {v:.4f}, want {want[i, j]:.0f} (w[{j}, {i % Kd}]); got looks like {where}")
    rng = np.random.default_rng(0)
    xr = rng.standard_normal((128, 1024)).astype(np.float32) * 3
    wr = (rng.standard_normal((shape.bn * 4, 1024)) / 32).astype(np.float32)
    for split in (1, 4):
        g = np.array(G.tf32x3_matmul(mx.array(xr), mx.array(wr), shape=shape, split=split, poison=True))
        ref = xr.astype(np.float64) @ wr.T.astype(np.float64)
        ratio = np.max(np.abs(g - ref) / (1e-3 + 1e-3 * np.abs(ref)))
        print(f"  random 128 x 1024 x {shape.bn * 4}, split {split}: worst / tolerance {ratio:.4f}, "
              f"NaN {int(np.isnan(g).sum())}")

"""A model of the tensor-core flash kernel's arithmetic (v20, SOURCE_TF32X3) for one head of a whole
4,096-token prompt, every 16th row, against FP64: operands split into TF32 hi + lo, products summed by
mma steps of 8 whose addends are aligned at the largest one's exponent and truncated (no guard bits), the
small terms first. Three variants: A as the kernel runs; B the scores' two small terms in their own
accumulator, added in FP32 at the end; C that and PV's products in a fresh accumulator per 64-key tile, added
into O in FP32. Prints each one's worst and median error as a fraction of the gate's tolerance.

On the CPU (2026-11-30), values of mean 0: A 0.0083 worst, 0.0022 median (the H200 measured 0.007 at a 128-row
chunk and 0.023 on a whole prompt); B 0.0067 / 0.0016; C 0.0045 / 0.0010. Values of mean 1 (a model's V has a
mean per dim; check-kernels' cases had none): A 0.072 / 0.021, B 0.073 / 0.021, C 0.0053 / 0.0012; mean 4: A
0.109, C 0.0033. So the whole prompt's error is PV's accumulator, held across every tile: each mma truncates
its sum at the running total's exponent, and with values of one sign the losses add up (a bias toward zero),
where a chunk's key splits (merged in FP32) keep each accumulator short. v21 is C (notes/gpu.md).

    python3 notes/gpu-session/tc_truncation_model.py [mean of the values, default 0]
"""

import sys
import time

import numpy as np

D, N, TILE = 128, 4096, 64


def tf32(x):
    """x rounded to TF32 as pd_tf32 does (gemm.py)."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)


def split(x):
    hi = tf32(x)
    return hi, tf32(x - hi)


def mma(acc, prods):
    """acc + the sum of prods (8, ...), every addend aligned at the largest one's exponent and truncated."""
    terms = np.concatenate([acc[None].astype(np.float64), prods], 0)
    top = np.max(np.abs(terms), 0)
    ulp = 2.0 ** (np.floor(np.log2(np.where(top > 0, top, 1.0))) - 23)
    return (np.trunc((np.trunc(terms / ulp) * ulp).sum(0) / ulp) * ulp).astype(np.float32)


def scores(q, k, separate):
    """q (D,) . k (n, D) by 3xTF32 mma steps over D; `separate`: the small terms in their own accumulator."""
    (qh, ql), (kh, kl) = split(q), split(k)
    big, small = np.zeros(len(k), np.float32), np.zeros(len(k), np.float32)
    for d0 in range(0, D, 8):
        d = slice(d0, d0 + 8)
        for a, b, is_small in ((ql, kh, True), (qh, kl, True), (qh, kh, False)):
            prods = a[d, None].astype(np.float64) * b[:, d].T.astype(np.float64)
            if separate and is_small:
                small = mma(small, prods)
            else:
                big = mma(big, prods)
    return (big + small).astype(np.float32)


def values(p, v, per_tile):
    """p (n,) @ v (n, D) by 3xTF32 mma steps over the keys; `per_tile`: a fresh accumulator per TILE keys."""
    pad = (-len(p)) % TILE
    (ph, pl), (vh, vl) = split(np.pad(p, (0, pad))), split(np.pad(v, ((0, pad), (0, 0))))
    o, t = np.zeros(D, np.float32), np.zeros(D, np.float32)
    for k0 in range(0, len(ph), 8):
        keys = slice(k0, k0 + 8)
        for a, b in ((pl, vh), (ph, vl), (ph, vh)):
            prods = a[keys, None].astype(np.float64) * b[keys].astype(np.float64)
            if per_tile:
                t = mma(t, prods)
            else:
                o = mma(o, prods)
        if per_tile and (k0 + 8) % TILE == 0:
            o, t = (o + t).astype(np.float32), np.zeros(D, np.float32)
    return o


if __name__ == "__main__":
    V_MEAN = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0   # every value's mean (a model's V has one per dim)
    rng = np.random.default_rng(1)
    q = (rng.standard_normal((N, D)) * 3 * D ** -0.5).astype(np.float32)   # scaled as the kernel holds it
    k = rng.standard_normal((N, D)).astype(np.float32)
    v = (rng.standard_normal((N, D)) + V_MEAN).astype(np.float32)
    VARIANTS = {"A": ("the kernel as run", False, False), "B": ("the scores' small terms apart", True, False),
                "C": ("B, and PV per 64-key tile", True, True)}
    rows, errors = range(0, N, 16), {name: [] for name in VARIANTS}
    t0 = time.time()
    for r in rows:
        exact_s = k[: r + 1].astype(np.float64) @ q[r].astype(np.float64)
        pe = np.exp(exact_s - exact_s.max())
        exact = pe @ v[: r + 1].astype(np.float64) / pe.sum()
        for name, (_, separate, per_tile) in VARIANTS.items():
            s = scores(q[r], k[: r + 1], separate)
            p = np.exp(s - s.max()).astype(np.float32)
            o = values(p, v[: r + 1], per_tile) / p.sum(dtype=np.float32)
            errors[name].append(np.max(np.abs(o - exact) / (1e-3 + 1e-3 * np.abs(exact))))
    print(f"{time.time() - t0:.0f} s, {len(rows)} rows")
    for name, (what, _, _) in VARIANTS.items():
        e = np.array(errors[name])
        print(f"{name} {what}: worst/tol {e.max():.4f} (row {rows[int(e.argmax())]}), median {np.median(e):.4f}")

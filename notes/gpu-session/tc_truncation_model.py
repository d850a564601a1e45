"""Does truncating accumulation explain the tensor-core flash kernel's larger error on a whole prompt (v20)?
A NumPy model of one output row's PV over n keys by 3xTF32 mma steps of 8 keys, each step's addends aligned
to the largest one's exponent and truncated there (no guard bits), one accumulator for all keys (the kernel)
or a fresh one per 64-key tile summed in FP32, against FP64. Prints the worst normalised error of each and of
a plain FP32 FMA chain. (It said ~3e-7 at 4,096 keys: far below the 2e-5 measured, so not this.)

    python3 notes/gpu-session/tc_truncation_model.py
"""
import numpy as np
rng = np.random.default_rng(0)

def tf32(x):
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)

def mma_step(acc, prods):
    """acc (d,) + sum of prods (8, d) as a tensor core might: every addend aligned to the largest one's exponent
    and truncated there (24 bits kept, no guard bits), then the sum truncated to FP32."""
    terms = np.concatenate([acc[None].astype(np.float64), prods], 0)
    e = np.floor(np.log2(np.max(np.abs(terms), 0) + 1e-300))
    ulp = 2.0 ** (e - 23)
    aligned = np.trunc(terms / ulp) * ulp
    s = aligned.sum(0)
    return (np.trunc(s / ulp) * ulp).astype(np.float32)

def pv(p, v, per_tile):
    ph, vh = tf32(p), tf32(v)
    pl, vl = tf32(p - ph), tf32(v - vh)
    total = np.zeros(v.shape[1], np.float32)
    acc = np.zeros(v.shape[1], np.float32)
    for k0 in range(0, len(p), 8):
        s = slice(k0, k0 + 8)
        for a, b in ((pl, vh), (ph, vl), (ph, vh)):
            acc = mma_step(acc, a[s, None].astype(np.float64) * b[s].astype(np.float64))
        if per_tile and (k0 + 8) % 64 == 0:
            total = (total + acc).astype(np.float32)
            acc = np.zeros_like(acc)
    return (total + acc).astype(np.float32) if per_tile else acc

for n in (512, 4096):
    errs = {False: [], True: [], "fp32": []}
    for trial in range(4):
        p = rng.random(n).astype(np.float32)
        v = rng.standard_normal((n, 128)).astype(np.float32)
        exact = (p.astype(np.float64)[:, None] * v.astype(np.float64)).sum(0)
        l = p.astype(np.float64).sum()
        for per_tile in (False, True):
            errs[per_tile].append(np.max(np.abs(pv(p, v, per_tile) / l - exact / l)))
        o = np.zeros(128, np.float32)
        for k in range(n):
            o = (o + p[k] * v[k]).astype(np.float32)
        errs["fp32"].append(np.max(np.abs(o / l - exact / l)))
    print(n, "one accumulator", f"{np.median(errs[False]):.2e}", "per 64-key tile", f"{np.median(errs[True]):.2e}",
          "FP32 FMA chain", f"{np.median(errs['fp32']):.2e}")

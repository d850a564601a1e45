"""The 3xTF32 GEMM's K splits (gemm.k_split) at a chunk's 128 rows and a mixed step's 129, per matrix kind: 28
layers timed with the split the rule picks and with 1, 2, 4, 8 and 16, the default launch shape (CHUNK_TILES)
and the wgmma one, on FP32 weights and (not wgmma) on bf16 ones. Where a deeper split wins at 129 rows, the
rule (at most two blocks an SM) costs mixed's step there (notes/gpu.md, v21). One JSON line per kind and rows,
a table at the end.

    python3 notes/gpu-session/gemm_splits.py          # SHAPES=1: the default launch shape only; WEIGHTS=bf16
"""

import json
import os

import mlx.core as mx

from pdlib.engine.kernels import gemm as G
from pdlib.engine.kernels.backend import cuda_sm_count
from pdlib.profile_step import timed

LAYERS = 28
KINDS = {"q|k|v": (1024, 4096), "o_proj": (2048, 1024), "gate|up": (1024, 6144), "down": (3072, 1024)}

mx.random.seed(0)
weights = {k: [mx.random.normal((n, kd)) * kd ** -0.5 for _ in range(LAYERS)] for k, (kd, n) in KINDS.items()}
mx.eval(weights)
table = []
runs = [(shape, weight) for shape in (G.CHUNK_TILES, G.WGMMA_TILES)[: int(os.environ.get("SHAPES", 2))]
        for weight in os.environ.get("WEIGHTS", "fp32 bf16").split() if not (shape.wgmma and weight == "bf16")]
for shape, weight in runs:
    ws = {k: [w.astype(mx.bfloat16) for w in v] for k, v in weights.items()} if weight == "bf16" else weights
    mx.eval(ws)
    for M in (128, 129):
        for kind, (kd, n) in KINDS.items():
            x = mx.random.normal((M, kd))
            mx.eval(x)
            rule = G.k_split(M, kd, n, cuda_sm_count(), shape)
            row = {"shape": shape.label + (" bf16" if weight == "bf16" else ""), "rows": M, "kind": kind, "rule": rule}
            for split in (1, 2, 4, 8, 16):
                if kd % (split * G.BK) == 0:
                    row[f"split {split}"] = timed(lambda: mx.eval([G.tf32x3_matmul(x, w, shape=shape, split=split)
                                                                   for w in ws[kind]]), 9)
            print(json.dumps(row), flush=True)
            table.append(row)

SPLITS = (1, 2, 4, 8, 16)
print(f"\n{'shape':<25} {'rows':>4} {'kind':<8} {'rule':>4} " + " ".join(f"{'split ' + str(s):>9}" for s in SPLITS))
for r in table:
    print(f"{r['shape']:<25} {r['rows']:>4} {r['kind']:<8} {r['rule']:>4} "
          + " ".join(f"{r.get(f'split {s}', float('nan')):>9.3f}" for s in SPLITS))

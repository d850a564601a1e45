"""The 3xTF32 GEMM's launch shapes (gemm.CANDIDATES, and at 128 rows the ones in EXPLORE too) against MLX's FP32
matmul, on the prefill's 28 layers of q|k|v, o_proj, gate|up and down at a chunk's 128 rows, 1,024 and a whole
prompt's 4,096, each shape on the FP32 weights (but not bf16x3) and (but not wgmma) on their bf16 copies
("bf16": two products, half the bytes; bf16x3: x in three bf16 parts); the weights are bf16 values, as a
model's are. Each runner's products are checked against FP32 at the gate's tolerance first, then timed (median
ms of the 112 matmuls in one eval, and per kind). One JSON line per measurement, a table at the end (the flash
kernel: flash_sweep.py).

    python3 notes/gpu-session/gemm_sweep.py          # EXPLORE=0: gemm.CANDIDATES only; ROWS="128": those rows

"""

import json
import os

import mlx.core as mx

from pdlib.engine.kernels import gemm as G
from pdlib.profile_step import timed
from pdlib.validate import tolerance_stats

LAYERS, D, F_, HQ, HKV, DH = 28, 1024, 3072, 16, 8, 128
KINDS = {"q|k|v": (D, (HQ + 2 * HKV) * DH), "o_proj": (HQ * DH, D), "gate|up": (D, 2 * F_), "down": (F_, D)}
REPS = 15
# shapes not (yet) in check-kernels, timed at 128 rows after the same accuracy check (v23, warps of 32 x 64):
# four stages, slices of 128 columns (deeper K splits), two warps on a 64x64 tile, four 16 x 64 warps on one,
# eight warps on a 128x128 tile (one block an SM by registers); v22's 32 x 32 warps with four stages; the wgmma
# kernel with 128-column tiles (v21: 5.26 ms at 128 rows, against 4.96 with 64)
EXPLORE = (G.Tiles(128, 64, 32, 4, 256, wn=64), G.Tiles(128, 64, 32, 3, 128, wn=64), G.Tiles(64, 64, 32, 3, 256, wn=64),
           G.Tiles(64, 64, 16, 3, 256, wn=64), G.Tiles(128, 128, 32, 3, 256, wn=64), G.Tiles(64, 64, 32, 4, 256),
           G.Tiles(64, 128, 0, 3, 256, wgmma=True))


def median_ms(fn):
    return timed(fn, REPS)  # two warm-ups, then the median of REPS calls


mx.random.seed(0)
weights = {k: [(mx.random.normal((n, kd)) * kd ** -0.5).astype(mx.bfloat16).astype(mx.float32) for _ in range(LAYERS)]
           for k, (kd, n) in KINDS.items()}
copies = {k: [w.astype(mx.bfloat16) for w in ws] for k, ws in weights.items()}   # the decode copies
mx.eval(weights, copies)
table = []

for M in map(int, os.environ.get("ROWS", "128 1024 4096").split()):
    xs = {kd: mx.random.normal((M, kd)) * 3.0 for kd, _ in KINDS.values()}
    mx.eval(xs)
    flops = 2 * M * LAYERS * sum(kd * n for kd, n in KINDS.values())
    runners = {"mlx fp32": lambda x, w: x @ w.T}
    shapes = G.CANDIDATES + (EXPLORE if M <= G.MAX_ROWS and os.environ.get("EXPLORE") != "0" else ())
    runners.update({s.label: (lambda s: lambda x, w: G.tf32x3_matmul(x, w, shape=s))(s) for s in shapes
                    if not s.bf16x3})
    runners.update({s.label + " bf16": (lambda s: lambda x, w: G.tf32x3_matmul(x, w, shape=s))(s) for s in shapes
                    if not s.wgmma})
    for name, run in runners.items():
        ws = copies if name.endswith(" bf16") else weights
        row = {"rows": M, "shape": name}
        worst = 0.0
        for kind, (kd, n) in KINDS.items():  # accuracy first: layer 0 of each kind against FP32
            got, want = run(xs[kd], ws[kind][0]), xs[kd] @ weights[kind][0].T
            (err,), (ratio,), (bad,) = tolerance_stats(got[None], want[None]).tolist()
            worst = max(worst, ratio)
            row[f"{kind}_bad"] = int(bad)
        row["worst_ratio"] = worst
        row["passed"] = all(row[f"{k}_bad"] == 0 for k in KINDS)
        if row["passed"]:
            row["all_ms"] = median_ms(lambda: mx.eval([run(xs[kd], w) for kind, (kd, _) in KINDS.items()
                                                       for w in ws[kind]]))
            row["tflops"] = flops / row["all_ms"] / 1e9
            for kind, (kd, _) in KINDS.items():
                row[f"{kind}_ms"] = median_ms(lambda: mx.eval([run(xs[kd], w) for w in ws[kind]]))
        print(json.dumps(row), flush=True)
        table.append(row)

print(f"\n{'rows':>5} {'shape':<34} {'pass':<5} {'ms (28 layers)':>14} {'TFLOP/s':>8} "
      + " ".join(f"{k:>8}" for k in KINDS))
for r in table:
    print(f"{r['rows']:>5} {r['shape']:<34} {str(r['passed']):<5} {r.get('all_ms', float('nan')):>14.2f} "
          f"{r.get('tflops', float('nan')):>8.1f} "
          + " ".join(f"{r.get(k + '_ms', float('nan')):>8.2f}" for k in KINDS))

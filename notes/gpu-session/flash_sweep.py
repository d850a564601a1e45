"""The flash prefill kernel's row tiles (flash_prefill.ROW_TILES) and its tensor-core twin (arithmetic tf32x3)
against the kernel as it stood before v20 (flash_v1.py) and the tensor-core kernel as v20 ran it
(flash_tc_v20.py), both frozen copies: each first checked against the oracle (MLX's masked softmax) at the
gate's tolerance on check-kernels' flash cases (each case's worst printed), then timed over 28 layers' caches:
a 128-row chunk at 4K context (chunked's step), a whole 4,096-token prompt (overlap's and disagg's) and one row
at 4K (mixed's decode row). One JSON line per measurement, a table at the end.

    python3 notes/gpu-session/flash_sweep.py
"""

import json
import os
import sys

import mlx.core as mx

sys.path.insert(0, os.path.dirname(__file__))
import flash_tc_v20 as TC20  # noqa: E402
import flash_v1 as V1  # noqa: E402

from pdlib.engine import kernels as K  # noqa: E402
from pdlib.engine.kernels import flash_prefill as F  # noqa: E402
from pdlib.kernel_check import flash_cases, flash_inputs  # noqa: E402
from pdlib.profile_step import timed  # noqa: E402
from pdlib.validate import tolerance_stats  # noqa: E402

LAYERS, HQ, HKV, DH, CTX, REPS = 28, 16, 8, 128, 4096, 15
SCALE = DH ** -0.5
RUNNERS = {"v1": V1.flash_attention}
RUNNERS.update({f"rt{rt}": (lambda rt: lambda *a, **k: K.flash_attention(*a, **k, rows_per_thread=rt))(rt)
                for rt in F.ROW_TILES})
RUNNERS["tc-v20"] = TC20.flash_attention
RUNNERS["tf32x3"] = lambda *a, **k: K.flash_attention(*a, **k, arithmetic="tf32x3")  # flash-tf32x3
TIMED = (("chunk 128 at 3968", 128, CTX - 128), ("whole 4096", CTX, 0), ("1 row at 4095", 1, CTX - 1))

table = []
for name, run in RUNNERS.items():  # accuracy first: every check-kernels flash case, NaN in the stale slots
    worst, bad, per_case = 0.0, 0, {}
    for i, (case, Hq, Hkv, T, start, cap, splits) in enumerate(flash_cases()):
        q, kc, vc, positions = flash_inputs(60 + i, Hq, Hkv, T, start, cap)
        kw = dict(scale=SCALE, length=start + T, splits=splits)
        got = run(q, kc, vc, positions, K.new_fence(), poison=True, **kw)
        want = K.flash_attention_ops(q, kc, vc, positions, K.new_fence(), **kw)
        (err,), (ratio,), (n_bad,) = tolerance_stats(got.reshape(1, -1), want.reshape(1, -1)).tolist()
        worst, bad, per_case[case] = max(worst, ratio), bad + int(n_bad), round(ratio, 5)
        if n_bad:  # where: the worst element's head, row and dim, NaNs, and the same case unsplit
            e = mx.abs(got - want)
            flat = int(mx.argmax(mx.where(mx.isnan(e), mx.inf, e)).item())
            one = run(q, kc, vc, positions, K.new_fence(), poison=True, **{**kw, "splits": 1})
            print(json.dumps({"kernel": name, "case": case, "bad": int(n_bad), "of": got.size,
                              "nan": int(mx.isnan(got).sum().item()), "worst_at": [flat // (T * DH), flat // DH % T,
                                                                                  flat % DH],
                              "got": got.reshape(-1)[flat].item(), "want": want.reshape(-1)[flat].item(),
                              "unsplit_bad": int((~(mx.abs(one - want) <= 1e-3 + 1e-3 * mx.abs(want))).sum().item())}),
                  flush=True)
    row = {"kernel": name, "worst_ratio": worst, "bad": bad, "passed": bad == 0, "cases": per_case}
    print(json.dumps(row), flush=True)
    table.append(row)

mx.random.seed(0)
# values with a mean per head and dim, as flash_inputs' (and a model's)
caches = [(mx.random.normal((HKV, CTX + 64, DH)),
           mx.random.normal((HKV, CTX + 64, DH)) + mx.random.normal((HKV, 1, DH))) for _ in range(LAYERS)]
fence = K.new_fence()
mx.eval(caches, fence)
for case, T, start in TIMED:
    q = mx.random.normal((HQ, T, DH)) * 3.0
    pos = mx.arange(start, start + T, dtype=mx.int32)
    mx.eval(q, pos)
    flops = 4 * HQ * DH * sum(p + 1 for p in range(start, start + T)) * LAYERS
    want = K.flash_attention_ops(q, *caches[0], pos, fence, scale=SCALE, length=start + T)
    for name, run in RUNNERS.items():
        if not next(r for r in table if r["kernel"] == name)["passed"]:
            continue
        got = run(q, *caches[0], pos, fence, scale=SCALE, length=start + T)
        (_,), (ratio,), (n_bad,) = tolerance_stats(got.reshape(1, -1), want.reshape(1, -1)).tolist()
        e = mx.abs(got - want) / (1e-3 + 1e-3 * mx.abs(want))
        worst = int(mx.argmax(e).item())     # where: head, row (its position start + row), dim
        ms = timed(lambda: mx.eval([run(q, k, v, pos, fence, scale=SCALE, length=start + T) for k, v in caches]),
                   REPS)
        row = {"case": case, "kernel": name, "ms_28_layers": ms, "tflops": flops / ms / 1e9,
               "worst_ratio": ratio, "bad": int(n_bad), "worst_at": [worst // (T * DH), worst // DH % T, worst % DH]}
        print(json.dumps(row), flush=True)
        table.append(row)

print(f"\n{'case':<20} {'kernel':<7} {'ms (28 layers)':>14} {'TFLOP/s':>8} {'worst/tol':>9}")
for r in table:
    if "case" in r:
        print(f"{r['case']:<20} {r['kernel']:<7} {r['ms_28_layers']:>14.2f} {r['tflops']:>8.1f} "
              f"{r['worst_ratio']:>9.3f}")
    else:
        print(f"{'check-kernels cases':<20} {r['kernel']:<7} {'pass' if r['passed'] else 'FAIL':>14} "
              f"{'':>8} {r['worst_ratio']:>9.3f}")

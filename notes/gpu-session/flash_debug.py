"""Where flash_attention departs from its oracle, case by case (check-kernels' cases): the worst element's head,
row and dim, NaN counts, and the same case with one split (is it the merge?). Prints one line per case.

    python3 notes/gpu-session/flash_debug.py
"""

import mlx.core as mx

from pdlib.engine import kernels as K
from pdlib.kernel_check import flash_cases, flash_inputs

for i, (case, Hq, Hkv, T, start, cap, splits) in enumerate(flash_cases()):
    q, kc, vc, positions = flash_inputs(60 + i, Hq, Hkv, T, start, cap)  # check-kernels' inputs at seed 0
    n = start + T
    want = K.flash_attention_ops(q, kc, vc, positions, K.new_fence(), scale=128 ** -0.5, length=n)
    for z in (splits, 1):
        got = K.flash_attention(q, kc, vc, positions, K.new_fence(), scale=128 ** -0.5, length=n, splits=z,
                                poison=True)
        err = mx.abs(got - want)
        flat = int(mx.argmax(mx.where(mx.isnan(err), mx.inf, err)).item())
        h, r, d = flat // (T * 128), flat // 128 % T, flat % 128
        bad = int((~(err <= 1e-3 + 1e-3 * mx.abs(want))).sum().item())
        print(f"{case:28s} splits {z}: bad {bad} of {got.size}, NaN {int(mx.isnan(got).sum().item())}, worst at "
              f"head {h} row {r} dim {d}: got {got[h, r, d].item():.4g} want {want[h, r, d].item():.4g}", flush=True)

"""check-kernels' rows for the persistent decode on SM slices (engine/kernels/slices.py), as the partition
policy runs it: steps on slice A (its grid sized to the slice) against the ops twin, many positions on one
reused sync buffer, then a step on slice B on that same buffer (a grid of another size), a pair on slice A
and then on the whole device on one buffer, and a grid too large for the slice, which must come back as the
barrier's timeout, not a hang.

    rows = check_slices(seed=0)      # [] where there are no green contexts (only CUDA has them)
"""

import mlx.core as mx

from pdlib import settings
from pdlib.config import preset
from pdlib.engine import kernels as K
from pdlib.engine.kernels import slices
from pdlib.tools.check_rows import compare, evaluated
from pdlib.tools.persistent_check import persistent_case, persistent_pair_case, tiny_step


def _on(where: slices.Slice, rows: list[dict]) -> list[dict]:
    for r in rows:
        r["case"] = f"{where.sms} SMs, {r['case']}"
    return rows


def check_slices(seed: int) -> list[dict]:
    P = K.persistent_decode
    if K.BACKEND != "cuda" or not P.available(preset("qwen3-0.6b"), packed=True):
        return []
    pair = slices.split(settings.get("PDLIB_PARTITION_SMS"))
    rows, cap, L = [], 4096 + 64, 28
    sync = P.new_sync()
    with pair.a.active():
        for i, pos in enumerate([0, 639, 4095]):  # many tokens on one buffer, as a request's steps reuse theirs
            rows += _on(pair.a, persistent_case(seed * 100 + 90 + i, L=L, pos=pos, cap=cap, sync=sync))
    with pair.b.active():  # the other slice, another grid size, the same buffer
        rows += _on(pair.b, persistent_case(seed * 100 + 93, L=L, pos=cap - 1, cap=cap, sync=sync))
    pair_sync = P.new_sync()  # a pair on slice A, then on the whole device, as after partition's join
    with pair.a.active():
        rows += _on(pair.a, persistent_pair_case(seed * 100 + 94, L=L, positions=(100, 4095), cap=cap, sync=pair_sync))
    for r in persistent_pair_case(seed * 100 + 95, L=L, positions=(639, 7), cap=cap, sync=pair_sync):
        r["case"] = f"whole device after a slice, {r['case']}"
        rows.append(r)
    with pair.a.active():
        too_many = 16 * pair.a.sms  # more blocks of 256 threads than the slice holds at once
        bad = P.new_sync()
        tok = tiny_step(bad, too_many)
        rows += evaluated(
            [
                compare(
                    "persistent/barrier timeout",
                    f"{pair.a.sms} SMs, {too_many} blocks",
                    mx.stack([tok, bad[P.SY_ERR]]).astype(mx.float32),
                    mx.array([P.ERROR_TOKEN, 1]).astype(mx.float32),
                )
            ]
        )
    return rows


__all__ = ["check_slices"]

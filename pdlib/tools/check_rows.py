"""check-kernels' rows: a kernel's output against its twin's under the fixed tolerance, evaluated a case at a
time, and the rows every in-place writer shares (the write fence advanced, a cache slot written and the rest
untouched).

    rows = evaluated([compare("gemv", "K=1024", out, want), fence_row("kv_store", "T=1", written, before)])
"""

import mlx.core as mx

from pdlib.tolerance import tolerance_stats


def bf16_normal(shape, scale):
    return (mx.random.normal(shape) * scale).astype(mx.bfloat16)


def compare(name, case, x, ref) -> dict:
    """A row whose numbers are still lazy: `evaluated` computes a case's rows in one graph with the kernel."""
    return {"kernel": name, "case": case, "stats": tolerance_stats(x[None], ref[None])}


def evaluated(rows: list[dict]) -> list[dict]:
    mx.eval([r["stats"] for r in rows])
    out = []
    for r in rows:
        (max_abs,), (ratio,), (bad,) = r.pop("stats").tolist()
        out.append({**r, "max_abs": max_abs, "worst_ratio": ratio, "passed": bad == 0})
    return out


def fence_row(name: str, case: str, written: mx.array, before: mx.array, *, writes: int = 1) -> dict:
    """The kernels advanced the write fence's counter (word 0; the rest is padding) once per write."""
    return compare(name, case, written[:1].astype(mx.float32), (before[:1] + writes).astype(mx.float32))


def slot_rows(name: str, case: str, after: list, before: list, new: list, pos: int) -> list[dict]:
    """Caches (Hkv, cap, Dh) after an in-place decode write, one per layer: slot pos holds `new` (Hkv, Dh) and
    every other slot is as it was `before` (stale garbage included)."""
    others = (mx.arange(after[0].shape[1]) != pos)[None, :, None]
    flat = lambda arrays: mx.concatenate([a.reshape(-1) for a in arrays])  # noqa: E731
    return [
        compare(f"{name} slot", case, flat([a[:, pos] for a in after]), flat(new)),
        compare(
            f"{name} rest",
            case,
            flat([mx.where(others, a, 0) for a in after]),
            flat([mx.where(others, b, 0) for b in before]),
        ),
    ]

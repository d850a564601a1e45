"""Every GPU kernel against its MLX-ops twin: fresh random inputs each time, outputs poisoned (NaN) before
each run, the fixed tolerance |x - ref| <= 1e-3 + 1e-3 |ref|. Used by tests/test_kernels.py and, on a GPU box
without pytest, by `python -m pdlib check-kernels`.

    rows = check_kernels(seed=0)      # [{"kernel", "case", "max_abs", "worst_ratio", "passed"}, ...]
"""

import mlx.core as mx

from pdlib.engine import kernels as K
from pdlib.errors import InputError
from pdlib.validate import tolerance_stats


def _bf16(shape, scale):
    return (mx.random.normal(shape) * scale).astype(mx.bfloat16)


def _compare(name, case, x, ref) -> dict:
    (max_abs,), (ratio,), (bad,) = tolerance_stats(x[None], ref[None]).tolist()
    return {"kernel": name, "case": case, "max_abs": max_abs, "worst_ratio": ratio, "passed": bad == 0}


def gemv_cases():
    D, F, V = 1024, 3072, 151936
    yield "qkv (norm)", dict(K=D, N=4096, norm=True)
    yield "o_proj (residual)", dict(K=2048, N=D, residual=True)
    yield "gate|up (norm, swiglu)", dict(K=D, N=F, norm=True, swiglu=True)
    yield "down (residual)", dict(K=F, N=D, residual=True)
    yield "lm_head (norm)", dict(K=D, N=V, norm=True)
    yield "ragged rows", dict(K=64, N=1001, norm=True, residual=True)
    yield "ragged, 2 rows per warp", dict(K=136, N=3001, norm=True, swiglu=True, residual=True)


def check_gemv(seed: int) -> list[dict]:
    rows = []
    for i, (case, c) in enumerate(gemv_cases()):
        mx.random.seed(seed * 100 + i)
        k, n = c["K"], c["N"]
        x = mx.random.normal((k,)) * 3.0
        w = _bf16((2 * n if c.get("swiglu") else n, k), k ** -0.5)
        kw = dict(norm=1.0 + 0.1 * mx.random.normal((k,)) if c.get("norm") else None, eps=1e-6,
                  residual=mx.random.normal((n,)) if c.get("residual") else None, swiglu=c.get("swiglu", False))
        rows.append(_compare("gemv", case, K.gemv_kernel(x, w, poison=True, **kw), K.gemv_ops(x, w, **kw)))
    return rows


def check_decode_attention(seed: int) -> list[dict]:
    rows = []
    Hq, Hkv, Dh, L, cap = 16, 8, 128, 3, 5120 + 128
    inv_freq = K.rope_inv_freq(Dh, base=1e6)
    for i, pos in enumerate([0, 1, 127, 128, 1000, 4095, 5119, cap - 1]):
        mx.random.seed(seed * 100 + i)
        qkv = mx.random.normal(((Hq + 2 * Hkv) * Dh,)) * 2.0
        qn, kn = 1.0 + 0.1 * mx.random.normal((Dh,)), 1.0 + 0.1 * mx.random.normal((Dh,))
        # stale garbage beyond pos: the kernel must never read it (the twin masks it)
        live = (mx.arange(cap) < pos)[None, None, :, None]
        kc = mx.where(live, mx.random.normal((L, Hkv, cap, Dh)), 1e4)
        vc = mx.where(live, mx.random.normal((L, Hkv, cap, Dh)), 1e4)
        p = mx.array([pos], mx.int32)
        args = (qkv, qn, kn, inv_freq, p, kc, vc, 1)
        kw = dict(heads=Hq, kv_heads=Hkv, eps=1e-6)
        got = K.decode_attention_kernel(*args, poison=True, **kw)
        want = K.decode_attention_ops(*args, **kw)
        for part, g, w in zip(("o", "k_new", "v_new"), got, want):
            rows.append(_compare(f"decode_attention/{part}", f"pos {pos}", g.reshape(-1), w.reshape(-1)))
    return rows


def check_stack_pair(seed: int) -> list[dict]:
    rows = []
    for i, (n, shape) in enumerate([(28, (8, 128)), (3, (5,))]):
        mx.random.seed(seed * 100 + i)
        ks = [mx.random.normal(shape) for _ in range(n)]
        vs = [mx.random.normal(shape) for _ in range(n)]
        for part, g, w in zip(("k", "v"), K.stack_pair_kernel(ks, vs, poison=True), K.stack_pair_ops(ks, vs)):
            rows.append(_compare(f"stack_pair/{part}", f"{n} x {shape}", g.reshape(-1), w.reshape(-1)))
    return rows


def check_kernels(*, seed: int = 0) -> list[dict]:
    if K.BACKEND == "cpu":
        raise InputError("no GPU backend: the kernels exist only on CUDA or Metal; the CPU runs the ops twins")
    return check_gemv(seed) + check_decode_attention(seed) + check_stack_pair(seed)


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'kernel':26s} {'case':24s} {'max|err|':>10s} {'ratio':>8s}  result"]
    for r in rows:
        lines.append(f"{r['kernel']:26s} {r['case']:24s} {r['max_abs']:10.2e} {r['worst_ratio']:8.3f}  "
                     f"{'pass' if r['passed'] else 'FAIL'}")
    return "\n".join(lines)

"""Every GPU kernel against its MLX-ops twin: fresh random inputs each time, outputs poisoned (NaN) before
each run, the fixed tolerance |x - ref| <= 1e-3 + 1e-3 |ref|. Used by tests/engine/test_kernels.py and, on a GPU box
without pytest, by `python -m pdlib check-kernels`.

    rows = check_kernels(seed=0)      # [{"kernel", "case", "max_abs", "worst_ratio", "passed"}, ...]
"""

import sys

import mlx.core as mx
from tqdm import tqdm

from pdlib.engine import kernels as K
from pdlib.engine.kernels import gemm as G
from pdlib.engine.kernels.flash_prefill import ROW_TILES
from pdlib.engine.kernels.gemm import CANDIDATES
from pdlib.errors import InputError
from pdlib.tools.check_pool import run_families, run_family
from pdlib.tools.check_rows import bf16_normal, compare, evaluated, fence_row, slot_rows
from pdlib.tools.persistent_check import check_persistent_decode
from pdlib.tools.rows_check import check_decode_rows
from pdlib.tools.slice_check import check_slices


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
        w = bf16_normal((2 * n if c.get("swiglu") else n, k), k**-0.5)
        kw = dict(
            norm=1.0 + 0.1 * mx.random.normal((k,)) if c.get("norm") else None,
            eps=1e-6,
            residual=mx.random.normal((n,)) if c.get("residual") else None,
            swiglu=c.get("swiglu", False),
        )
        rows += evaluated([compare("gemv", case, K.gemv_kernel(x, w, poison=True, **kw), K.gemv_ops(x, w, **kw))])
    return rows


def gemm_cases():
    """(case, M, K, N, split, cancelling): the prefill's four matmuls at a chunk's 128 rows (by the default tiles
    K in 4, 8 and 2 slices) and a whole prompt's rows, the LM head at a decode round's rows, ragged row counts
    (down's 129 rows: 8 slices), a forced split. `cancelling`: one operand's rows are 1 + u 2^-12 (below TF32's
    10 mantissa bits, u in [0, 1)), the other's +-1 with as many of each sign, so the 2^-12 parts are the
    whole result: "x" puts them in x (the lo*hi products carry them), "w" in w (hi*lo); one TF32 product, or
    a split missing that term, fails the row. "x deep": x's rows are 1 + 2^-8 + u 2^-16 and w's +-64, so the
    result (~0.01) lies in x's bits 16-23, which only the third part of the bf16x3 split carries (and TF32's
    lo); w's signs balance within every 8 columns (one mma's), so each mma's sum cancels the large parts
    exactly and FP32 accumulators keep the result's bits (shuffled over all 256, the running sums reach ~1,000x
    the result and FP32's rounding of them alone exceeds the tolerance)."""
    yield "q|k|v, 128 rows", 128, 1024, 4096, None, None
    yield "o_proj, 128 rows", 128, 2048, 1024, None, None
    yield "gate|up, 128 rows", 128, 1024, 6144, None, None
    yield "gate|up, 4096 rows", 4096, 1024, 6144, None, None
    yield "down, 129 rows", 129, 3072, 1024, None, None
    yield "LM head, 32 rows", 32, 1024, 151936, None, None  # a decode round's emitting rows
    yield "q|k|v, 3 rows", 3, 1024, 4096, None, None  # a small round's, in part of one tile
    yield "17 rows, split 4", 17, 1024, 128, 4, None
    yield "cancelling in x, 200 rows", 200, 256, 128, None, "x"
    yield "cancelling in w, 200 rows", 200, 256, 128, None, "w"
    yield "cancelling deep in x, 200 rows", 200, 256, 128, None, "x deep"


def _cancelling(
    rows: int, cols: int, depth: int, bits: int = 12, scale: float = 1.0, offset: float = 0.0, blocked: bool = False
):
    """(rows, depth) of 1 + offset + u 2^-bits, and (cols, depth) of +-scale, each row of those half each sign,
    shuffled across the row, or, `blocked`, within each 8 columns (each holding four of each)."""
    near_one = 1.0 + offset + mx.random.uniform(shape=(rows, depth)) * 2.0**-bits
    if blocked:
        signs = mx.broadcast_to(mx.array([1.0, 1, 1, 1, -1, -1, -1, -1]), (cols, depth // 8, 8)).reshape(cols, depth)
        group = (mx.arange(depth) // 8).astype(mx.float32)
        order = mx.argsort(group + mx.random.uniform(shape=(cols, depth)), axis=1)  # a shuffle within each 8
    else:
        signs = mx.concatenate([mx.ones((cols, depth // 2)), -mx.ones((cols, depth // 2))], axis=1)
        order = mx.argsort(mx.random.uniform(shape=(cols, depth)), axis=1)
    return near_one, mx.take_along_axis(signs * scale, order, axis=1)


def check_gemm(seed: int, cases=None, shapes=None, weights=("fp32", "bf16")) -> list[dict]:
    """Every case under every launch shape the sweep compares (gemm.CANDIDATES, the engine's CHUNK_TILES among
    them), or under `shapes`, with FP32 weights (but not by bf16x3) and (but not by wgmma) bf16 ones, the
    decode copies' type: those are exact in TF32, so the kernel skips their lo (gemm_tf32x2's rows, and
    gemm_bf16x3's; a bf16 w carries no 2^-12 parts, so "cancelling in w" is FP32's alone)."""
    rows = []
    for shape in shapes or CANDIDATES:
        for weight in weights:
            if (weight == "bf16" and shape.wgmma) or (weight == "fp32" and shape.bf16x3):
                continue
            for i, (case, M, Kd, N, split, cancelling) in enumerate(cases or gemm_cases()):
                if weight == "bf16" and cancelling == "w":
                    continue
                mx.random.seed(seed * 100 + 80 + i)
                if cancelling in ("x", "x deep"):
                    deep = dict(bits=16, scale=64.0, offset=2.0**-8, blocked=True) if cancelling == "x deep" else {}
                    x, w = _cancelling(M, N, Kd, **deep)
                    want = (x - 1.0) @ w.T  # exact: every row of w sums to 0
                elif cancelling == "w":
                    w, x = _cancelling(N, M, Kd)
                    want = x @ (w - 1.0).T
                else:
                    x, w = mx.random.normal((M, Kd)) * 3.0, mx.random.normal((N, Kd)) * Kd**-0.5
                w = w.astype(mx.bfloat16) if weight == "bf16" else w
                want = K.tf32x3_ops(x, w) if cancelling is None else want
                got = K.tf32x3_matmul(x, w, shape=shape, split=split, poison=True)
                name = "gemm_bf16x3" if shape.bf16x3 else "gemm_tf32x2" if weight == "bf16" else "gemm_tf32x3"
                rows += evaluated([compare(name, f"{case}, {shape.label}", got.reshape(-1), want.reshape(-1))])
    return rows


def check_gemm_fp32(seed: int) -> list[dict]:
    """check_gemm's FP32-weight rows: with --jobs, a worker of their own (the GEMM's modules compile longest)."""
    return check_gemm(seed, weights=("fp32",))


def check_gemm_bf16(seed: int) -> list[dict]:
    """check_gemm's bf16-weight rows (the decode copies' type), beside the FP32 ones."""
    return check_gemm(seed, weights=("bf16",))


def epilogue_cases(rounds: bool = False):
    """(case, M, K, N, epilogue): the layer's matmuls with what follows them, at the row counts whose K splits
    the sum kernel carries (o_proj's and down's residual, gate|up's SwiGLU) and one whose split is 1 (ops);
    `rounds`: a decode round's 8 rows too (deeper K splits)."""
    if rounds:
        yield "o_proj + residual, 8 rows", 8, 2048, 1024, "add"
        yield "gate|up, SwiGLU, 8 rows", 8, 1024, 6144, "swiglu"
        yield "down + residual, 8 rows", 8, 3072, 1024, "add"
    yield "o_proj + residual, 128 rows", 128, 2048, 1024, "add"
    yield "gate|up, SwiGLU, 128 rows", 128, 1024, 6144, "swiglu"
    yield "down + residual, 129 rows", 129, 3072, 1024, "add"
    yield "q|k|v, 128 rows", 128, 1024, 4096, None
    yield "gate|up, SwiGLU, 4096 rows", 4096, 1024, 6144, "swiglu"


def check_gemm_epilogue(seed: int, shapes=None) -> list[dict]:
    """The matmul and its epilogue against MLX's FP32 ops, on bf16 weights, under the default's shape, a round's
    (ROUND_TILES, 8 rows too) and tf32x2's (CHUNK_TILES), a K split's sum and the epilogue by MLX's ops
    (gemm_epilogue rows), by gemm.summed's one kernel (gemm_sum_fused: PDLIB_PREFILL_GEMM_SUM=fused) and, for a
    residual add, with the RMSNorm after it in that kernel too (gemm_sum_norm: fused-norm; the residual and the
    normed rows, side by side)."""
    rows = []
    for sums, name in (("ops", "gemm_epilogue"), ("fused", "gemm_sum_fused"), ("fused-norm", "gemm_sum_norm")):
        for shape in shapes or (G.BF16X3_TILES, G.ROUND_TILES, G.CHUNK_TILES):
            for i, (case, M, Kd, N, epi) in enumerate(epilogue_cases(rounds=shape == G.ROUND_TILES)):
                if sums == "fused-norm" and epi != "add":
                    continue
                mx.random.seed(seed * 100 + 90 + i)
                x, w = mx.random.normal((M, Kd)) * 3.0, bf16_normal((N, Kd), Kd**-0.5)
                kw = {"add": mx.random.normal((M, N)) * 2.0} if epi == "add" else {"swiglu": epi == "swiglu"}
                if sums == "fused-norm":  # a norm weight near 1, as a model's, and Qwen3's eps
                    kw["norm"] = (1.0 + 0.5 * mx.random.normal((N,)), 1e-6)
                got = K.tf32x3_matmul(x, w, shape=shape, poison=True, sums=sums, **kw)
                want = G.epilogue_ops(K.tf32x3_ops(x, w), **kw)
                if "norm" in kw:  # (residual, normed) pairs
                    got, want = mx.concatenate(got, axis=1), mx.concatenate(want, axis=1)
                rows += evaluated([compare(name, f"{case}, {shape.label}", got.reshape(-1), want.reshape(-1))])
    return rows


def flash_cases():
    """(case, Hq, Hkv, T, start, capacity, splits): a chunk late and early in a prompt, a whole prompt, ragged
    rows over a split that ends mid-tile, one row (a pruned last layer's), 4 query heads per KV head, and more
    splits than tiles (empty splits to merge). splits None: key_splits' choice."""
    yield "128 rows at 3968", 16, 8, 128, 3968, 5120, None
    yield "128 rows at 0", 16, 8, 128, 0, 5120, None
    yield "2048 rows at 0", 16, 8, 2048, 0, 2048, None
    yield "37 rows at 100, 3 splits", 16, 8, 37, 100, 256, 3
    yield "1 row at 4095", 16, 8, 1, 4095, 4160, None
    yield "100 rows at 700, GQA 4", 8, 2, 100, 700, 1024, 1
    yield "5 rows at 60, 4 splits", 16, 8, 5, 60, 128, 4


def flash_inputs(seed: int, Hq: int, Hkv: int, T: int, start: int, cap: int):
    """A case's q (Hq, T, 128) at ~3x a unit softmax's scores, caches (Hkv, cap, 128) with NaN in every slot past
    the chunk, and the rows' positions. The values have a mean per head and dim, as a model's do: a sum that
    drifts (an accumulator that loses a little at every step) shows there, where zero-mean values hide it."""
    mx.random.seed(seed)
    q = mx.random.normal((Hq, T, 128)) * 3.0
    stale = mx.arange(cap)[None, :, None] >= start + T
    kc = mx.where(stale, float("nan"), mx.random.normal((Hkv, cap, 128)))
    vc = mx.where(stale, float("nan"), mx.random.normal((Hkv, cap, 128)) + mx.random.normal((Hkv, 1, 128)))
    return q, kc, vc, mx.arange(start, start + T, dtype=mx.int32)


def flash_variants() -> list[tuple[str, dict]]:
    """(label, flash_attention keywords): each FP32 row tile (flash_prefill.ROW_TILES) and the tensor-core
    kernel (PDLIB_PREFILL_ATTENTION=flash-tf32x3, the default)."""
    return [(f"{rt} rows/thread", {"rows_per_thread": rt}) for rt in ROW_TILES] + [("tf32x3", {"arithmetic": "tf32x3"})]


def check_flash_attention(seed: int, cases=None) -> list[dict]:
    """The prefill attention kernel, in each variant the engine can run (flash_variants), against the
    reference's masked softmax, on caches whose slots past the chunk hold NaN (a read of one poisons the row),
    scores ~3x a unit softmax's (so the max matters); and a zero fence (the cache's writer never ran) must make
    every output NaN, on the path that merges splits and on the one that does not."""
    prepared = []  # each case's inputs and the oracle's answer, once for every variant
    for i, (case, Hq, Hkv, T, start, cap, splits) in enumerate(cases or flash_cases()):
        q, kc, vc, positions = flash_inputs(seed * 100 + 60 + i, Hq, Hkv, T, start, cap)
        kw = dict(scale=128**-0.5, length=start + T, splits=splits)
        prepared.append(
            (case, (q, kc, vc, positions), kw, K.flash_attention_ops(q, kc, vc, positions, K.new_fence(), **kw))
        )
    rows = []
    for variant, how_run in flash_variants():
        for i, (case, (q, kc, vc, positions), kw, want) in enumerate(prepared):
            got = K.flash_attention(q, kc, vc, positions, K.new_fence(), poison=True, **how_run, **kw)
            label = f"{case}, {variant}"
            rows += evaluated([compare("flash_attention", label, got.reshape(-1), want.reshape(-1))])
            if i == 0:
                for z, how in ((kw["splits"], ""), (1, ", 1 split")):
                    unfenced = mx.zeros_like(K.new_fence())
                    unwritten = K.flash_attention(q, kc, vc, positions, unfenced, **how_run, **{**kw, "splits": z})
                    rows += evaluated(
                        [
                            compare(
                                "flash_attention",
                                label + ", zero fence" + how,
                                mx.isnan(unwritten).all()[None].astype(mx.float32),
                                mx.ones((1,)),
                            )
                        ]
                    )
    return rows


def check_decode_attention(seed: int) -> list[dict]:
    """o against the twin, and the in-place store: slot pos holds the twin's k/v, every other slot is as it was.
    The cache is read through the fence in the same graph as the kernel: no evaluation in between makes the
    order hold by luck (MLX orders a CUDA graph only through output buffers)."""
    rows = []
    Hq, Hkv, Dh, cap = 16, 8, 128, 5120 + 128
    inv_freq = K.rope_inv_freq(Dh, base=1e6)
    for i, pos in enumerate([0, 1, 127, 128, 1000, 4095, 5119, cap - 1]):
        mx.random.seed(seed * 100 + i)
        qkv = mx.random.normal(((Hq + 2 * Hkv) * Dh,)) * 2.0
        qn, kn = 1.0 + 0.1 * mx.random.normal((Dh,)), 1.0 + 0.1 * mx.random.normal((Dh,))
        # stale garbage from pos on: the kernel must never read it (the twin masks it)
        live = (mx.arange(cap) < pos)[None, :, None]
        kc = mx.where(live, mx.random.normal((Hkv, cap, Dh)), 1e4)
        vc = mx.where(live, mx.random.normal((Hkv, cap, Dh)), 1e4)
        p, fence = mx.array([pos], mx.int32), K.new_fence() + i
        kw = dict(heads=Hq, kv_heads=Hkv, eps=1e-6)
        want = K.decode_attention_ops(qkv, qn, kn, inv_freq, p, kc, vc, **kw)
        kc0, vc0 = kc + 0.0, vc + 0.0  # copies (kc, vc are still held, so nothing is donated)
        mx.eval(want, kc, vc, kc0, vc0, fence)
        got, written = K.decode_attention_kernel(qkv, qn, kn, inv_freq, p, kc, vc, fence, poison=True, **kw)
        case = f"pos {pos}"
        case_rows = [
            compare("decode_attention/o", case, got, want[0]),
            fence_row("decode_attention/fence", case, written, fence),
        ]
        for part, cache, before, new in (("k", kc, kc0, want[1]), ("v", vc, vc0, want[2])):
            case_rows += slot_rows(
                f"decode_attention/{part}", case, [K.read_after(cache, written)], [before], [new], pos
            )
        rows += evaluated(case_rows)
    return rows


def _store_inputs(seed: int, start: int, T: int, bump: int):
    """A chunk's k, v (Hkv, T, Dh) for positions start.., a random cache (Hkv, 640, Dh), a fence and the positions,
    with the oracle: store_kv_ops's (k cache, v cache, fence, keys, values)."""
    Hkv, Dh, cap = 8, 128, 640
    mx.random.seed(seed)
    k, v = mx.random.normal((Hkv, T, Dh)), mx.random.normal((Hkv, T, Dh))
    kc, vc = mx.random.normal((Hkv, cap, Dh)), mx.random.normal((Hkv, cap, Dh))
    fence = K.new_fence() + bump
    want = K.store_kv_ops(k, v, kc, vc, fence, start=start)
    mx.eval(want, kc, vc)
    return k, v, kc, vc, fence, want, mx.arange(start, start + T, dtype=mx.int32)


def check_kv_store(seed: int) -> list[dict]:
    """The in-place prefill store against `slice_update`: the whole cache (so a stray write shows), read through
    the fence in the kernel's own graph, and the keys/values handed to attention."""
    rows = []
    for i, (start, T) in enumerate([(0, 128), (128, 128), (500, 140), (639, 1)]):
        k, v, kc, vc, fence, want, positions = _store_inputs(seed * 100 + i, start, T, i)
        kc2, vc2, written, keys, values = K.store_kv_kernel(k, v, kc, vc, fence, start=start, positions=positions)
        case = f"{T} at {start}"
        got = (K.read_after(kc2, written), K.read_after(vc2, written), keys, values)
        case_rows = [
            compare(f"kv_store/{part}", case, g.reshape(-1), w.reshape(-1))
            for part, g, w in zip(("k cache", "v cache", "keys", "values"), got, (want[0], want[1], want[3], want[4]))
        ]
        rows += evaluated(case_rows + [fence_row("kv_store/fence", case, written, fence)])
    return rows


def check_kv_install(seed: int) -> list[dict]:
    """The in-place install of a prefix computed elsewhere (disagg) against `slice_update`: the whole cache,
    read through the fence in the kernel's own graph."""
    rows = []
    for i, (start, T) in enumerate([(0, 512), (128, 128), (639, 1)]):
        k, v, kc, vc, fence, want, positions = _store_inputs(seed * 100 + 20 + i, start, T, i)
        kc2, vc2, written = K.install_kv_kernel(k, v, kc, vc, fence, start=start, positions=positions)
        case = f"{T} at {start}"
        got = (K.read_after(kc2, written), K.read_after(vc2, written))
        rows += evaluated(
            [
                compare(f"kv_install/{part}", case, g.reshape(-1), w.reshape(-1))
                for part, g, w in zip(("k cache", "v cache"), got, want)
            ]
            + [fence_row("kv_install/fence", case, written, fence)]
        )
    return rows


def qk_rope_cases():
    """(rows, first position, capacity, q heads, KV heads, scale): Qwen3-0.6B's heads in a chunk at the start, one
    at 4K, a ragged chunk mid-tile and one ending at the cache's last slot; then 6 + 2 heads, whose grid ends
    mid-block (its last warps start past the rows), with values near zero, where the norm's eps counts."""
    return [
        (128, 0, 640, 16, 8, 2.0),
        (128, 3968, 4224, 16, 8, 2.0),
        (37, 100, 640, 16, 8, 2.0),
        (17, 623, 640, 16, 8, 2.0),
        (37, 100, 640, 6, 2, 1e-4),
    ]


def check_qk_rope_store(seed: int) -> list[dict]:
    """q against the twin, and the whole caches after the in-place store (the new slots hold the twin's
    rotated k and v, every other slot is as it was), read through the fence in the kernel's own graph."""
    rows = []
    Dh = 128
    inv_freq = K.rope_inv_freq(Dh, base=1e6)
    for i, (T, start, cap, Hq, Hkv, scale) in enumerate(qk_rope_cases()):
        mx.random.seed(seed * 100 + 40 + i)
        raw = mx.random.normal((T, Hq + 2 * Hkv, Dh)) * scale
        qn, kn = 1.0 + 0.1 * mx.random.normal((Dh,)), 1.0 + 0.1 * mx.random.normal((Dh,))
        kc, vc = mx.random.normal((Hkv, cap, Dh)), mx.random.normal((Hkv, cap, Dh))
        positions, fence = mx.arange(start, start + T, dtype=mx.int32), K.new_fence() + i
        kw = dict(heads=Hq, kv_heads=Hkv, eps=1e-6, start=start)
        want = K.qk_rope_store_ops(raw, qn, kn, inv_freq, positions, kc, vc, fence, **kw)
        mx.eval(want, kc, vc, fence)
        q, kc2, vc2, written = K.qk_rope_store_kernel(
            raw, qn, kn, inv_freq, positions, kc, vc, fence, poison=True, **kw
        )
        case = f"{T} rows at {start}" + ("" if Hq == 16 else f", {Hq} + {Hkv} heads of {scale:g}")
        rows += evaluated(
            [
                compare("qk_rope_store/q", case, q, want[0]),
                compare("qk_rope_store/k cache", case, K.read_after(kc2, written), want[1]),
                compare("qk_rope_store/v cache", case, K.read_after(vc2, written), want[2]),
                fence_row("qk_rope_store/fence", case, written, fence),
            ]
        )
    return rows


def check_write_chain(seed: int) -> list[dict]:
    """Three in-place writers of one cache in one graph (a 100-slot chunk, a 28-slot chunk, then a decode at
    128 that reads all of them) and a fenced read after: each writer must wait for the one before through
    its fence input. Against the same chain of ops twins."""
    Hq, Hkv, Dh, cap = 16, 8, 128, 640
    mx.random.seed(seed * 100 + 99)
    inv_freq = K.rope_inv_freq(Dh, base=1e6)
    kc, vc = mx.random.normal((Hkv, cap, Dh)), mx.random.normal((Hkv, cap, Dh))
    k1, v1, k2, v2 = (mx.random.normal((Hkv, t, Dh)) for t in (100, 100, 28, 28))
    qkv = mx.random.normal(((Hq + 2 * Hkv) * Dh,)) * 2.0
    qn, kn = 1.0 + 0.1 * mx.random.normal((Dh,)), 1.0 + 0.1 * mx.random.normal((Dh,))
    fence, p, kw = K.new_fence(), mx.array([128], mx.int32), dict(heads=Hq, kv_heads=Hkv, eps=1e-6)
    a = K.store_kv_ops(k1, v1, kc, vc, fence, start=0)
    b = K.store_kv_ops(k2, v2, a[0], a[1], fence, start=100)
    want_o, k_new, v_new = K.decode_attention_ops(qkv, qn, kn, inv_freq, p, b[0], b[1], **kw)
    want_k = mx.slice_update(b[0], k_new[:, None], p, axes=(1,))
    want_v = mx.slice_update(b[1], v_new[:, None], p, axes=(1,))
    mx.eval(want_o, want_k, want_v, kc, vc, fence)
    c1 = K.store_kv_kernel(k1, v1, kc, vc, fence, positions=mx.arange(0, 100, dtype=mx.int32), start=0)
    c2 = K.store_kv_kernel(k2, v2, c1[0], c1[1], c1[2], positions=mx.arange(100, 128, dtype=mx.int32), start=100)
    o, written = K.decode_attention_kernel(qkv, qn, kn, inv_freq, p, c2[0], c2[1], c2[2], poison=True, **kw)
    case = "store, store, decode"
    return evaluated(
        [
            compare("write chain/o", case, o, want_o),
            compare("write chain/k cache", case, K.read_after(kc, written).reshape(-1), want_k.reshape(-1)),
            compare("write chain/v cache", case, K.read_after(vc, written).reshape(-1), want_v.reshape(-1)),
            fence_row("write chain/fence", case, written, fence, writes=3),
        ]
    )


# the families that take longest on a fresh machine (mostly compiling), started first with --jobs (one H200,
# 2026-12-06: the GEMM's rows 131 s, hence two families by weight type; persistent_decode 83, decode_rows 42,
# gemm_epilogue 36, slices 33; the rest under 10)
SLOWEST = ("gemm_fp32", "gemm_bf16", "persistent_decode", "decode_rows", "gemm_epilogue", "slices")


def check_kernels(*, seed: int = 0, progress: bool = False, jobs: int = 1) -> list[dict]:
    """Every kernel's rows, in one fixed order. `progress`: a bar on stderr, one step per kernel family (a fresh
    GPU machine compiles each family's kernels on first use, minutes in all, so a cut run says where it was).
    `jobs` > 1: the families in that many worker processes at once (check_pool.py)."""
    if K.BACKEND == "cpu":
        raise InputError("no GPU backend: the kernels exist only on CUDA or Metal; the CPU runs the ops twins")
    cuda = [check_gemm_fp32, check_gemm_bf16, check_gemm_epilogue, check_flash_attention] if K.BACKEND == "cuda" else []
    families = [
        check_gemv,
        *cuda,
        check_decode_attention,
        check_decode_rows,
        check_kv_store,
        check_kv_install,
        check_qk_rope_store,
        check_write_chain,
        check_persistent_decode,
        *([check_slices] if K.BACKEND == "cuda" else []),  # green contexts: CUDA's alone
    ]
    with tqdm(total=len(families), desc="check-kernels", unit="family", file=sys.stderr, disable=not progress) as bar:
        count = [0]

        def done(name: str, new: list[dict], took: float) -> None:
            count[0] += len(new)
            bar.update(1)
            bar.set_postfix_str(f"{name} done, {count[0]} rows so far")
            if progress:  # a run cut short still says which families were done, how they fared and how long
                failing = sum(not r["passed"] for r in new)
                tqdm.write(f"check-kernels: {name}: {len(new)} rows, {failing} failing, {took:.1f} s", file=sys.stderr)

        if jobs > 1:
            return run_families(families, seed=seed, jobs=jobs, first=SLOWEST, done=done)
        rows = []
        for check in families:
            bar.set_postfix_str(f"{check.__name__.removeprefix('check_')}, {count[0]} rows so far")
            new, took = run_family(check, seed)
            rows += new
            done(check.__name__.removeprefix("check_"), new, took)
        return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'kernel':26s} {'case':24s} {'max|err|':>10s} {'ratio':>8s}  result"]
    for r in rows:
        lines.append(
            f"{r['kernel']:26s} {r['case']:24s} {r['max_abs']:10.2e} {r['worst_ratio']:8.3f}  "
            f"{'pass' if r['passed'] else 'FAIL'}"
        )
    return "\n".join(lines)

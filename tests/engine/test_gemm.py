"""The 3xTF32 prefill GEMM (pdlib/engine/kernels/gemm.py). On the CPU: its check (kernel_check.check_gemm)
passes an exact NumPy emulation of the split and fails one TF32 product or a skipped tile, with FP32 weights
and with bf16 ones (two products), and passes x in three bf16 parts and fails two (bf16x3); the split rule;
the switch; the engine's matmuls go through it when enabled, on the bf16 decode copies under tf32x2 and bf16x3.
The kernels themselves run in check-kernels on a GPU."""

import os
import re

import mlx.core as mx
import numpy as np
import pytest
from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped

from pdlib.engine import kernels as K
from pdlib.engine.kernels import gemm as G
from pdlib.engine.kernels.backend import float_bits
from pdlib.errors import InputError
from pdlib.tools.kernel_check import check_gemm, gemm_cases


def tf32(a: np.ndarray) -> np.ndarray:
    """As the kernel rounds (pd_tf32): to the nearest value with 10 mantissa bits."""
    return ((a.astype(np.float32).view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def emulated(x, w, *, drop=(), skip_tile=False, **_):
    """x @ w.T as the kernel computes it, lo*hi + hi*lo + hi*hi, less the terms in `drop` ("lo hi", "hi lo";
    both: one TF32 product), the products exact and summed in float64 (the tensor cores accumulate in FP32:
    close enough for this check)."""
    xn, wn = np.array(x, np.float32), np.array(w.astype(mx.float32), np.float32)
    xh, wh = tf32(xn), tf32(wn)
    xl, wl = tf32(xn - xh), tf32(wn - wh)
    d = lambda a, b: a.astype(np.float64) @ b.astype(np.float64).T  # noqa: E731
    y = d(xh, wh) + (0 if "lo hi" in drop else d(xl, wh)) + (0 if "hi lo" in drop else d(xh, wl))
    if skip_tile:
        y[: G.CHUNK_TILES.bm, : G.CHUNK_TILES.bn] = np.nan
    return mx.array(y.astype(np.float32))


def bf16_parts(a: np.ndarray) -> list[np.ndarray]:
    """As pd_split3 and its packing: three parts, each the remainder's leading 8 bits (its FP32 bits' upper
    half: what a bf16 holds), cut off; a = p0 + p1 + p2 when the third remainder fits in 8 bits."""
    parts, rest = [], a.astype(np.float32)
    for _ in range(3):
        parts.append((rest.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))
        rest = rest - parts[-1]
    return parts


def emulated_bf16x3(x, w, *, parts=3, **_):
    """x @ w.T as SOURCE_BF16X3 computes it from x's first `parts` bf16 parts (3: all), the products exact."""
    xn, wn = np.array(x, np.float32), np.array(w.astype(mx.float32), np.float64)
    return mx.array(sum(p.astype(np.float64) @ wn.T for p in bf16_parts(xn)[:parts]).astype(np.float32))


def small(case):
    """check-kernels' case with its rows, K and N scaled down (so NumPy's float64 runs it in CI's time); the
    cancelling case keeps its shape (its K sets what one TF32 product loses)."""
    name, M, Kd, N, split, cancelling = case
    return case if cancelling else (name, min(M, 129), min(Kd, 512), min(N, 256), split, cancelling)


def rows_with(monkeypatch, weight="fp32", shape=G.CHUNK_TILES, kernel=emulated, **kw):
    seen = []
    monkeypatch.setattr(K, "tf32x3_matmul", lambda x, w, **k: seen.append(w.dtype) or kernel(x, w, **kw))
    rows = check_gemm(seed=0, cases=[small(c) for c in gemm_cases()], shapes=[shape], weights=(weight,))
    names = [c[0] for c in gemm_cases() if weight == "fp32" or c[5] != "w"]
    assert [r["case"] for r in rows] == [f"{n}, {shape.label}" for n in names]
    assert set(seen) == {mx.float32 if weight == "fp32" else mx.bfloat16}
    name = "gemm_bf16x3" if shape.bf16x3 else "gemm_tf32x3" if weight == "fp32" else "gemm_tf32x2"
    assert {r["kernel"] for r in rows} == {name}
    return {r["case"].rsplit(", ", 1)[0]: r["passed"] for r in rows}


def test_check_kernels_runs_every_case_under_every_candidate_shape(monkeypatch):
    seen = []
    monkeypatch.setattr(
        K, "tf32x3_matmul", lambda x, w, *, shape, **k: seen.append((shape, w.dtype)) or x @ w.astype(mx.float32).T
    )
    cases = [("tiny", 17, 64, 128, None, None)]
    rows = check_gemm(seed=0, cases=cases)
    assert seen == [
        (s, dt)
        for s in G.CANDIDATES
        for dt in (mx.float32, mx.bfloat16)
        if not (s.wgmma and dt == mx.bfloat16) and not (s.bf16x3 and dt == mx.float32)
    ]
    assert all(r["passed"] for r in rows) and G.CHUNK_TILES in G.CANDIDATES


def test_the_check_passes_the_split_and_fails_one_tf32_product_or_a_missing_term(monkeypatch):
    assert all(rows_with(monkeypatch).values())
    one = rows_with(monkeypatch, drop=("lo hi", "hi lo"))
    assert not one["cancelling in x, 200 rows"] and not one["cancelling in w, 200 rows"]
    no_lo_hi = rows_with(monkeypatch, drop=("lo hi",))
    assert not no_lo_hi["cancelling in x, 200 rows"] and no_lo_hi["cancelling in w, 200 rows"]
    assert not no_lo_hi["cancelling deep in x, 200 rows"]
    no_hi_lo = rows_with(monkeypatch, drop=("hi lo",))
    assert no_hi_lo["cancelling in x, 200 rows"] and not no_hi_lo["cancelling in w, 200 rows"]


def test_with_bf16_weights_two_products_pass_and_one_fails(monkeypatch):
    """A bf16 weight is exact in TF32: without its lo (hi lo dropped) every row still passes; without lo hi,
    x's 2^-12 parts are lost and the cancelling row fails."""
    assert all(rows_with(monkeypatch, "bf16").values())
    assert all(rows_with(monkeypatch, "bf16", drop=("hi lo",)).values())
    assert not rows_with(monkeypatch, "bf16", drop=("lo hi",))["cancelling in x, 200 rows"]


def test_with_x_in_three_bf16_parts_the_check_passes_and_fails_two(monkeypatch):
    """bf16x3: x's three bf16 parts are x exactly, so every row passes; without the third (x's bits 16-23)
    the deep cancelling row fails, and without the second the cancelling one too."""

    def run(parts):
        return rows_with(monkeypatch, "bf16", G.BF16X3_TILES, kernel=emulated_bf16x3, parts=parts)

    assert all(run(3).values())
    two, one = run(2), run(1)
    assert not two["cancelling deep in x, 200 rows"] and two["cancelling in x, 200 rows"]
    assert not one["cancelling in x, 200 rows"] and not one["cancelling deep in x, 200 rows"]
    xs = (np.random.default_rng(0).standard_normal(1000) * 10.0 ** np.arange(-5, 5).repeat(100)).astype(np.float32)
    assert np.array_equal(sum(p.astype(np.float64) for p in bf16_parts(xs)), xs.astype(np.float64))  # exact


def test_the_deep_cancelling_case_cancels_within_each_mma():
    """Its w's signs balance within every 8 columns (one mma's), so FP32 accumulators never hold the large
    parts; x - 1 lies in [2^-8, 2^-8 + 2^-16]: its varying bits are x's 16-23."""
    from pdlib.tools.kernel_check import _cancelling

    mx.random.seed(3)
    x, w = _cancelling(40, 128, 256, bits=16, scale=64.0, offset=2.0**-8, blocked=True)
    groups = np.array(w).reshape(128, 32, 8)
    assert np.all(groups.sum(-1) == 0) and np.all(np.abs(groups) == 64) and len({tuple(g) for g in groups[:, 0]}) > 8
    d = np.array(x) - 1.0
    assert d.min() >= 2.0**-8 and d.max() <= 2.0**-8 + 2.0**-16


def test_the_check_fails_a_skipped_tile(monkeypatch):
    assert not any(rows_with(monkeypatch, skip_tile=True).values())
    assert not any(rows_with(monkeypatch, "bf16", skip_tile=True).values())


def test_the_split_fills_the_gpu_and_keeps_whole_steps():
    sms, t64 = 132, G.Tiles(64, 64, 32, 3, 256)
    assert G.k_split(128, 1024, 4096, sms, t64) == 2  # q|k|v: 128 tiles -> 256
    assert G.k_split(128, 1024, 6144, sms, t64) == 1  # gate|up: 192 tiles already
    assert G.k_split(128, 2048, 1024, sms, t64) == 8  # o_proj: 32 tiles -> 256
    assert G.k_split(128, 3072, 1024, sms, t64) == 8  # down
    assert G.k_split(4096, 1024, 6144, sms, t64) == 1  # a whole prompt
    t128 = G.Tiles(128, 128, 64, 3, 128)
    assert G.k_split(128, 1024, 4096, sms, t128) == 8  # 32 tiles -> 256, slices of 128 columns
    assert G.k_split(128, 2048, 1024, sms, t128) == 16  # 8 tiles -> 128 (slices of 128 columns at least)
    wide = G.Tiles(64, 128, 32, 3, 256, wn=64)  # the chunk's tiles (2 x 2 warps of 32 x 64)
    assert wide == G.CHUNK_TILES and wide.threads == 128
    assert [G.k_split(128, Kd, N, sms, wide) for Kd, N in [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]] == [
        4,
        8,
        2,
        8,
    ]  # 256, 128, 192 and 128 blocks
    for shape in G.CANDIDATES:
        for M, Kd, N in [(17, 1024, 128), (129, 3072, 1024), (64, 96, 128), (4096, 1024, 6144)]:
            s = G.k_split(M, Kd, N, sms, shape)
            assert Kd % (s * G.BK) == 0 and (s == 1 or Kd // s >= shape.min_ks)
            assert s == 1 or -(-M // shape.bm) * (N // shape.bn) * s <= 2 * sms


def test_a_rounds_rows_take_16_row_tiles_on_the_bf16_copies_where_asked(monkeypatch):
    """PDLIB_ROUND_GEMM=tiles16: from 1 to ROUND_ROWS rows on the bf16 copy, bf16x3 in ROUND_TILES; more rows, the
    FP32 weight or another PDLIB_PREFILL_GEMM keep their launch; unset, MLX's matmul below MIN_ROWS as before."""
    monkeypatch.setattr(G, "enabled", lambda: True)
    monkeypatch.setattr(G, "cuda_sm_count", lambda: 132)
    w_t, wb = mx.zeros((1024, 4096)), mx.zeros((4096, 1024), mx.bfloat16)
    shape = lambda M, w=wb: (G.variant(M, w_t, w) or (None,))[0]  # noqa: E731
    assert [shape(M) for M in (1, 8, 15, 16, 32, 33)] == [None] * 3 + [G.BF16X3_TILES] * 3
    monkeypatch.setenv("PDLIB_ROUND_GEMM", "tiles16")
    assert [shape(M) for M in (1, 8, 15, 16, 32)] == [G.ROUND_TILES] * 5 and G.ROUND_TILES.bf16x3
    assert shape(33) == G.BF16X3_TILES and shape(8, None) is None and shape(16, None) == G.CHUNK_TILES
    assert G.variant(8, w_t, wb)[1] == G.k_split(8, 1024, 4096, 132, G.ROUND_TILES) > 1  # 32 tiles: K split
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "tf32x2")
    assert shape(8) is None and shape(16) == G.CHUNK_TILES
    monkeypatch.setenv("PDLIB_ROUND_GEMM", "16")
    with pytest.raises(InputError, match="PDLIB_ROUND_GEMM must be mlx or tiles16, got '16'"):
        shape(8)
    calls = []
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "bf16x3")
    monkeypatch.setenv("PDLIB_ROUND_GEMM", "tiles16")
    monkeypatch.setattr(G, "tf32x3_matmul", lambda x, w, *, shape, **e: calls.append((shape, w.dtype)) or x @ w.T)
    G.linear_t(mx.zeros((8, 1024)), w_t, wb)
    assert calls == [(G.ROUND_TILES, mx.bfloat16)]


def test_it_takes_a_chunks_rows_and_leaves_a_decodes_and_on_fp32_weights_a_whole_prompts_to_mlx():
    assert G.tiles(16, 1024, 4096) and G.tiles(128, 1024, 4096) and G.tiles(256, 3072, 1024)
    assert not G.tiles(15, 1024, 4096) and not G.tiles(257, 1024, 4096) and not G.tiles(4096, 1024, 6144)
    assert not G.tiles(128, 1000, 4096) and not G.tiles(128, 1024, 4000)
    assert G.tiles(4096, 1024, 6144, bf16=True) and G.tiles(16, 1024, 4096, bf16=True)
    assert not G.tiles(15, 1024, 4096, bf16=True) and not G.tiles(4096, 1024, 4000, bf16=True)


@pytest.mark.parametrize("choice", ["tf32x2", "tf32x3", "fp32", "wgmma", "bf16x3"])
@pytest.mark.parametrize("rows", [8, 128, 4096])
def test_linear_t_picks_the_weight_and_the_kernel(monkeypatch, choice, rows):
    """Which matmul runs for a decode's, a chunk's and a whole prompt's rows under each PDLIB_PREFILL_GEMM: the
    bf16 copy under tf32x2 at any row count that tiles; the FP32 weight by the kernel at a chunk's rows under
    tf32x3 and wgmma; MLX's FP32 matmul otherwise. Every path gives the plain product."""
    seen = []
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", choice)
    monkeypatch.setattr(G, "BACKEND", "cuda")
    monkeypatch.setattr(
        G,
        "tf32x3_matmul",
        lambda x, w, *, shape, **kw: seen.append((w.dtype, shape)) or G.epilogue_ops(emulated(x, w), **kw),
    )
    mx.random.seed(0)
    w = (mx.random.normal((128, 64)) * 0.1).astype(mx.bfloat16)
    x, w_t = mx.random.normal((rows, 64)), w.astype(mx.float32).T
    got = G.linear_t(x, w_t, w)
    assert np.allclose(np.array(got), np.array(x @ w_t), rtol=1e-3, atol=1e-3)
    want = {
        ("tf32x2", 128): (mx.bfloat16, G.CHUNK_TILES),
        ("tf32x2", 4096): (mx.bfloat16, G.CHUNK_TILES),
        ("tf32x3", 128): (mx.float32, G.CHUNK_TILES),
        ("wgmma", 128): (mx.float32, G.WGMMA_TILES),
        ("bf16x3", 128): (mx.bfloat16, G.BF16X3_TILES),
        ("bf16x3", 4096): (mx.bfloat16, G.BF16X3_TILES),
    }
    assert seen == ([want[choice, rows]] if (choice, rows) in want else [])


@pytest.mark.parametrize("choice", ["tf32x3", "fp32", "wgmma", "bf16x3"])
def test_variant_names_what_linear_t_launches(monkeypatch, choice):
    """variant(M, w_t, w) is the tiles and K split linear_t's kernel launches with at M rows, None where MLX's
    matmul runs: the key of what a step compiles (model.warm runs each once)."""
    seen = []
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", choice)
    monkeypatch.setattr(G, "BACKEND", "cuda")
    monkeypatch.setattr(G, "cuda_sm_count", lambda: 132)
    monkeypatch.setattr(G, "tf32x3_matmul", lambda x, w, *, shape, **kw: seen.append(shape) or x @ w.T)
    w = mx.zeros((1024, 3072), mx.bfloat16)  # N = 1024, K = 3072: down_proj's
    variants = set()
    for rows in (1, 15, 16, 40, 64, 65, 128, 256, 257, 4096):
        for weight in (w, None):
            seen.clear()
            G.linear_t(mx.zeros((rows, 3072)), w.astype(mx.float32).T, weight)
            v = G.variant(rows, w.astype(mx.float32).T, weight)
            assert v == ((seen[0], G.k_split(rows, 3072, 1024, 132, seen[0])) if seen else None), (rows, weight)
            variants.add(v)
    assert variants == {None} if choice == "fp32" else len(variants) >= 2  # MLX's, and the kernel's
    monkeypatch.setattr(G, "BACKEND", "cpu")
    assert G.variant(128, w.astype(mx.float32).T, w) is None


def test_warm_runs_one_step_of_rows_per_variant(monkeypatch, tiny):
    """model.warm runs the first row count of each new tuple of the step's five matmuls' variants, through the
    compiled pieces; on this machine every matmul is MLX's, so one."""
    from pdlib.engine.model import Qwen3

    q = Qwen3(tiny, compile_steps=False)
    assert q.warm(600) == [1]
    ran = []
    proj = q._p_proj
    monkeypatch.setattr(q, "_p_proj", lambda x, w: ran.append(x.shape[0]) or proj(x, w))
    monkeypatch.setattr(K, "gemm_variant", lambda m, w_t, w=None: None if m < 16 else (w is None, m // 100))
    assert q.warm(250) == [1, 16, 100, 200] == ran


def test_the_switch_defaults_to_tensor_cores_on_the_bf16_copies_on_cuda_only(monkeypatch):
    monkeypatch.delenv("PDLIB_PREFILL_GEMM", raising=False)
    monkeypatch.setattr(G, "BACKEND", "cuda")
    assert G.choice() == "bf16x3" and G.enabled() and G.bf16_weights() and G.chunk_tiles() == G.CHUNK_TILES
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "fp32")
    assert not G.enabled()
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "tf32x3")
    assert G.enabled() and G.chunk_tiles() == G.CHUNK_TILES and not G.bf16_weights()
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "tf32x2")
    assert G.enabled() and G.chunk_tiles() == G.CHUNK_TILES and G.bf16_weights()
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "wgmma")
    assert G.enabled() and G.chunk_tiles() == G.WGMMA_TILES and G.WGMMA_TILES.wgmma
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "bf16x3")
    assert G.enabled() and G.bf16_weights() and G.chunk_tiles() == G.CHUNK_TILES and G.BF16X3_TILES.bf16x3
    monkeypatch.setattr(G, "BACKEND", "cpu")
    assert not G.enabled()
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "tf32")
    with pytest.raises(
        InputError, match="PDLIB_PREFILL_GEMM must be bf16x3 or tf32x2 or tf32x3 or fp32 or wgmma, got 'tf32'"
    ):
        G.enabled()


@pytest.mark.parametrize("choice, dtype", [("tf32x3", mx.float32), ("tf32x2", mx.bfloat16), ("bf16x3", mx.bfloat16)])
def test_the_engine_sends_its_chunk_matmuls_through_it(monkeypatch, tiny, choice, dtype):
    """With the kernel enabled (a stand-in on the CPU: the exact emulation), a prompt step of 40 rows runs its
    four matmuls per layer through it, on the weights as loaded (no copy: w_t.T is row-contiguous) or, under
    tf32x2, on the bf16 decode copies; the LM head's one row and a decode's do not, the LM head of 16 rows does; the
    logits equal the plain path's within the gate's tolerance."""
    from pdlib.engine.model import Qwen3, Segment

    calls = []

    def standin(x, w, *, shape, **epilogue):
        calls.append((x.shape[0], w.shape, w.dtype))
        return G.epilogue_ops(emulated(x, w), **epilogue)

    q = Qwen3(tiny, compile_steps=False)
    prompt = mx.arange(3, 43, dtype=mx.int32)
    (plain,) = q.step([Segment(q.new_cache(64), prompt, start=0, emits=True)])
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", choice)
    monkeypatch.setattr(G, "enabled", lambda: True)
    monkeypatch.setattr(G, "tf32x3_matmul", standin)
    monkeypatch.setattr(G, "tiles", lambda M, Kd, N, bf16=False: M >= G.MIN_ROWS)  # the tiny model's are not
    cache = q.new_cache(64)
    (got,) = q.step([Segment(cache, prompt, start=0, emits=True)])
    layers, c = tiny.config.num_hidden_layers, tiny.config
    # the last layer's rows after attention are pruned to the emitting row: its o_proj and MLP fall back
    assert len(calls) == 4 * layers - 3 and {m for m, _, _ in calls} == {40} and {d for _, _, d in calls} == {dtype}
    assert calls[0][1] == ((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, c.hidden_size)
    assert np.allclose(np.array(got), np.array(plain), rtol=1e-3, atol=1e-3)
    calls.clear()
    q.step([Segment(cache, mx.array([7], mx.int32), start=40, emits=True)])
    assert not calls
    # 16 emitting rows (a decode round's): the LM head goes through it too, on the bf16 copy where the layers do
    caches = [q.new_cache(8) for _ in range(G.MIN_ROWS)]
    q.step([Segment(kc, mx.array([5 + i], mx.int32), start=0, emits=True) for i, kc in enumerate(caches)])
    assert calls[-1] == (G.MIN_ROWS, (c.vocab_size, c.hidden_size), dtype), calls[-1]


@pytest.mark.parametrize("fault", [None, "scaled"])
def test_each_residual_add_carries_the_norm_after_it(monkeypatch, tiny, fault):
    """A layer's o_proj hands back the residual and its post-norm, its down the residual and the next layer's
    in-norm (the last layer's: the final norm), with the model's eps, so under PDLIB_PREFILL_GEMM_SUM=
    fused-norm one kernel can apply them; the logits equal the plain path's. A norm applied with the wrong
    weight (scaled by 1.5, where the kernel would misread it) moves them past the gate's tolerance."""
    from pdlib.engine.model import Qwen3, Segment

    norms = []

    def standin(x, w, *, shape, norm=None, **epilogue):
        if norm is not None:
            norms.append(norm)
            norm = (norm[0] * 1.5, norm[1]) if fault else norm
        return G.epilogue_ops(emulated(x, w), norm=norm, **epilogue)

    q = Qwen3(tiny, compile_steps=False)
    prompt = mx.arange(3, 43, dtype=mx.int32)
    (plain,) = q.step([Segment(q.new_cache(64), prompt, start=0, emits=True)], prune=False)
    monkeypatch.setattr(G, "enabled", lambda: True)
    monkeypatch.setattr(G, "tf32x3_matmul", standin)
    monkeypatch.setattr(G, "tiles", lambda M, Kd, N, bf16=False: M >= G.MIN_ROWS)
    (got,) = q.step([Segment(q.new_cache(64), prompt, start=0, emits=True)], prune=False)
    L, eps = q.layers, tiny.config.rms_norm_eps
    want = [w for i, layer in enumerate(L) for w in (layer.post_norm, L[i + 1].in_norm if i + 1 < len(L) else q.norm)]
    assert len(norms) == len(want) and all(a is b and e == eps for (a, e), b in zip(norms, want))
    close = np.allclose(np.array(got), np.array(plain), rtol=1e-3, atol=1e-3)
    assert close == (fault is None)


def test_without_packed_weights_tf32x2_runs_on_the_fp32_ones(monkeypatch, tiny):
    """lossless_decode_weights=False leaves the decode copies FP32: tf32x2 then multiplies the FP32 weights by
    all three products (a bf16 copy is the only kind whose lo may be dropped)."""
    from pdlib.engine.model import Qwen3, Segment

    seen = []
    q = Qwen3(tiny, compile_steps=False, lossless_decode_weights=False, decode="kernels")
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "tf32x2")
    monkeypatch.setattr(G, "enabled", lambda: True)
    monkeypatch.setattr(
        G, "tf32x3_matmul", lambda x, w, *, shape, **kw: seen.append(w.dtype) or G.epilogue_ops(emulated(x, w), **kw)
    )
    monkeypatch.setattr(G, "tiles", lambda M, Kd, N, bf16=False: M >= G.MIN_ROWS)
    q.step([Segment(q.new_cache(64), mx.arange(3, 43, dtype=mx.int32), start=0, emits=True)])
    assert seen and set(seen) == {mx.float32}


def test_the_layers_epilogue_on_mlx_ops_is_the_expression_it_replaced():
    """Off the kernel (the CPU, a decode's rows), linear_t's add, swiglu and norm are the model's former ops, bit
    for bit: h + x @ w_t, g * sigmoid(g) * u of the halves, and MLX's RMSNorm of the residual."""
    mx.random.seed(3)
    x, w_t, h = mx.random.normal((5, 64)), mx.random.normal((64, 96)), mx.random.normal((5, 96))
    y = x @ w_t
    assert mx.array_equal(G.linear_t(x, w_t, add=h), h + y)
    g, u = y[:, :48], y[:, 48:]
    assert mx.array_equal(G.linear_t(x, w_t, swiglu=True), g * mx.sigmoid(g) * u)
    assert mx.array_equal(G.linear_t(x, w_t), y)
    norm = (mx.random.normal((96,)), 1e-6)  # the residual and its RMSNorm, as the layer ran them apart
    got_h, got_n = G.linear_t(x, w_t, add=h, norm=norm)
    assert mx.array_equal(got_h, h + y) and mx.array_equal(got_n, mx.fast.rms_norm(h + y, *norm))


def test_the_epilogue_check_passes_the_layers_ops_and_fails_a_dropped_epilogue(monkeypatch):
    """check-kernels' gemm_epilogue rows (small shapes here): an exact stand-in that applies the epilogue
    passes every row; one that drops the residual fails the residual rows, one that drops SwiGLU's silu the
    SwiGLU rows."""
    from pdlib.tools.kernel_check import check_gemm_epilogue, epilogue_cases

    monkeypatch.delenv(G.SUM_ENV, raising=False)
    cases = [(c, min(M, 65), min(Kd, 256), min(N, 256), e) for c, M, Kd, N, e in epilogue_cases()]
    monkeypatch.setattr("pdlib.tools.kernel_check.epilogue_cases", lambda rounds=False: iter(cases))

    asked = []

    def rows(fault=None):
        def standin(x, w, *, shape, poison, sums, add=None, swiglu=False, norm=None):
            asked.append(sums)
            y = emulated(x, w)
            if fault == "residual":
                add = None
            if fault == "silu" and swiglu:
                return y[:, : y.shape[1] // 2] * y[:, y.shape[1] // 2 :]
            if fault == "norm weight" and norm is not None:
                norm = (mx.ones_like(norm[0]), norm[1])
            return G.epilogue_ops(y, add=add, swiglu=swiglu, norm=norm)

        monkeypatch.setattr(K, "tf32x3_matmul", standin)
        return {
            (r["kernel"], r["case"].rsplit(", ", 1)[0]): r["passed"]
            for r in check_gemm_epilogue(0, shapes=[G.CHUNK_TILES])
        }

    kinds = ("gemm_epilogue", "gemm_sum_fused")  # PDLIB_PREFILL_GEMM_SUM=ops and fused: every case
    normed = [c for c, *_, e in cases if e == "add"]  # fused-norm: the residual adds'
    every = [(k, c[0]) for k in kinds for c in cases] + [("gemm_sum_norm", c) for c in normed]
    assert all(rows().values()) and list(rows()) == every
    assert asked[: len(every)] == ["ops"] * len(cases) + ["fused"] * len(cases) + ["fused-norm"] * len(normed)
    dropped = rows("residual")
    assert [key for key, ok in dropped.items() if not ok] == [(k, c) for k, c in every if c in normed]
    no_silu = rows("silu")
    assert [key for key, ok in no_silu.items() if not ok] == [
        (k, c) for k in kinds for c, *_, e in cases if e == "swiglu"
    ]
    no_weight = rows("norm weight")
    assert [key for key, ok in no_weight.items() if not ok] == [("gemm_sum_norm", c) for c in normed]
    assert G.SUM_ENV not in os.environ  # the check passes the choice, leaving the switch alone


@pytest.mark.parametrize("how", ["ops", "fused", "fused-norm"])
def test_a_k_split_is_summed_and_finished_as_the_switch_says(monkeypatch, how):
    """PDLIB_PREFILL_GEMM_SUM: a split's parts go to summed's one kernel under `fused` and `fused-norm`, else to
    MLX's sum and ops; one slice never needs a sum; a residual's RMSNorm rides in that kernel under `fused-norm`
    only. The kernel here is a stand-in that returns the exact parts."""
    monkeypatch.setenv(G.SUM_ENV, how)
    spied = []
    monkeypatch.setattr(
        G,
        "summed",
        lambda parts, *, poison, **kw: spied.append((parts.shape, kw)) or G.epilogue_ops(parts.sum(axis=0), **kw),
    )

    def kernel(inputs, template, output_shapes, **_):
        x, w = inputs
        split = dict(template)["SPLIT"]
        ks = x.shape[1] // split
        return [
            mx.stack(
                [x[:, z * ks : (z + 1) * ks] @ w[:, z * ks : (z + 1) * ks].astype(mx.float32).T for z in range(split)]
            )
        ]

    monkeypatch.setattr(G, "_kernel", lambda shape, wb: kernel)
    mx.random.seed(5)
    x, w, h = mx.random.normal((64, 512)), mx.random.normal((256, 512)).astype(mx.bfloat16), mx.random.normal((64, 256))
    want = h + x @ w.astype(mx.float32).T
    for split in (1, 4):
        got = G.tf32x3_matmul(x, w, split=split, add=h)
        assert np.allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    assert [s for s, _ in spied] == ([] if how == "ops" else [(4, 64, 256)])
    spied.clear()  # an explicit choice overrides the switch
    G.tf32x3_matmul(x, w, split=4, add=h, sums="ops" if how != "ops" else "fused")
    assert [s for s, _ in spied] == ([] if how != "ops" else [(4, 64, 256)])
    spied.clear()  # the norm after the residual: the pair (h, its RMSNorm) whoever applies it
    norm = (mx.random.normal((256,)) + 1.0, 1e-6)
    for split in (1, 4):
        got_h, got_n = G.tf32x3_matmul(x, w, split=split, add=h, norm=norm)
        assert np.allclose(np.array(got_h), np.array(want), rtol=1e-4, atol=1e-4)
        assert np.allclose(np.array(got_n), np.array(mx.fast.rms_norm(want, *norm)), rtol=1e-4, atol=1e-4)
    assert [kw.get("norm") is not None for _, kw in spied] == {"ops": [], "fused": [False], "fused-norm": [True]}[how]
    with pytest.raises(ValueError, match="norm follows a residual add: pass add too"):
        G.tf32x3_matmul(x, w, split=4, norm=norm)
    y = x @ w.astype(mx.float32).T
    g, u = y[:, :128], y[:, 128:]
    got = G.tf32x3_matmul(x, w, split=4, swiglu=True)
    assert got.shape == (64, 128) and np.allclose(np.array(got), np.array(g * mx.sigmoid(g) * u), rtol=1e-3, atol=1e-3)


def test_a_bad_sum_switch_is_refused_when_the_model_loads(monkeypatch, tiny):
    from pdlib.engine.model import Qwen3

    monkeypatch.setenv(G.SUM_ENV, "kernel")
    with pytest.raises(InputError, match="PDLIB_PREFILL_GEMM_SUM must be fused-norm or fused or ops, got 'kernel'"):
        Qwen3(tiny, compile_steps=False)
    monkeypatch.delenv(G.SUM_ENV)
    assert G.sum_choice() == "fused-norm"  # the default


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
@pytest.mark.parametrize(
    "epilogue, split", [("none", 4), ("add", 8), ("swiglu", 2), ("add", 2), ("norm", 8), ("norm", 2)]
)
def test_the_sum_kernel_compiles_for_the_h200(epilogue, split):
    source = G.sum_source(epilogue)
    norm = epilogue == "norm"
    inputs = [("parts", "f32")] + ([("add", "f32")] if epilogue in ("add", "norm") else []) + [("weight", "f32")] * norm
    values = {
        "SPLIT": split,
        **(
            {"SUM_THREADS": G.SUM_THREADS, "EPS_BITS": float_bits(1e-6)}
            if norm
            else {"OUT_DIV": 2 if epilogue == "swiglu" else 1}
        ),
    }
    kernel = Kernel("pdlib_gemm_sum", source, inputs, [("out", "f32")] + [("normed", "f32")] * norm, [values])
    log = compile_sm90(STANDINS + wrapped(kernel, "cuda", source))
    assert "@EPILOGUE@" not in source and "0 bytes spill stores" in log, log


def test_summed_refuses_what_its_kernel_cannot_take():
    parts = mx.zeros((2, 4, 8))
    with pytest.raises(ValueError, match=r"summed's add must be FP32 \(4, 8\), got mlx.core.float32 \(4, 4\)"):
        G.summed(parts, add=mx.zeros((4, 4)))
    with pytest.raises(ValueError, match="add or swiglu, not both"):
        G.summed(parts, add=mx.zeros((4, 8)), swiglu=True)
    with pytest.raises(ValueError, match=r"FP32 parts of 4k columns, got mlx.core.float32 \(2, 4, 6\)"):
        G.summed(mx.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match=r"FP32 parts of 8k columns, got mlx.core.float32 \(2, 4, 12\)"):
        G.summed(mx.zeros((2, 4, 12)), swiglu=True)
    with pytest.raises(ValueError, match=r"4k columns, got mlx.core.bfloat16"):
        G.summed(parts.astype(mx.bfloat16))
    with pytest.raises(ValueError, match="summed's norm follows a residual add: pass add too"):
        G.summed(parts, norm=(mx.ones((8,)), 1e-6))
    with pytest.raises(ValueError, match=r"norm weight must be FP32 \(8,\), got mlx.core.float32 \(4,\)"):
        G.summed(parts, add=mx.zeros((4, 8)), norm=(mx.ones((4,)), 1e-6))


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
@pytest.mark.parametrize(
    "shape, weight",
    [
        (s, w)
        for s in G.CANDIDATES + (G.Tiles(64, 128, 0, 3, 256, wgmma=True),)
        for w in ("f32", "bf16")
        if not (s.wgmma and w == "bf16") and not (s.bf16x3 and w == "f32")
    ],
    ids=lambda v: v.label if isinstance(v, G.Tiles) else v,
)
@pytest.mark.parametrize("K_, N, split", [(1024, 4096, 2), (3072, 1024, 8), (1024, 6144, 1)])
def test_the_cuda_source_compiles_for_the_h200(K_, N, split, shape, weight):
    """As MLX wraps it (x's shape passed for the row count), for sm_90 (the wgmma kernel for sm_90a, also with
    gemm_sweep's 128-column tiles; it takes FP32 weights only): no spills; a block fits an SM by registers and
    by shared memory (228 KB, 1 KB of it reserved per block), and two of the chunk's shape and of the 64-column
    wgmma one."""
    wb = 4 if weight == "f32" else 2
    values = [dict(G.template(shape, K_, N, split, wb))]
    if shape.wgmma:
        kernel = Kernel("pdlib_gemm_wgmma", G.SOURCE_WGMMA, [("x", "f32"), ("w", "f32")], [("y", "f32")], values)
        log = compile_sm90(STANDINS + G.HEADER_WGMMA + wrapped(kernel, "cuda", G.SOURCE_WGMMA), arch="sm_90a")
    else:
        source = G.SOURCE_BF16X3 if shape.bf16x3 else G.SOURCE
        kernel = Kernel("pdlib_gemm_tf32x3", source, [("x", "f32"), ("w", weight)], [("y", "f32")], values)
        log = compile_sm90(STANDINS + G.HEADER + wrapped(kernel, "cuda", source))
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    blocks = 2 if shape in (G.CHUNK_TILES, G.BF16X3_TILES) or (shape.wgmma and shape.bn == 64) else 1
    assert "0 bytes spill stores, 0 bytes spill loads" in log and blocks * regs * shape.threads <= 65536, log
    assert blocks * (shape.shared_bytes(wb) + 1024) <= 228 * 1024


def test_a_bad_switch_is_refused_when_the_model_loads(monkeypatch, tiny):
    from pdlib.engine.model import Qwen3

    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "fast")
    with pytest.raises(
        InputError, match="PDLIB_PREFILL_GEMM must be bf16x3 or tf32x2 or tf32x3 or fp32 or wgmma, got 'fast'"
    ):
        Qwen3(tiny, compile_steps=False)


@pytest.mark.parametrize(
    "choice, packed, backend, want",
    [
        ("tf32x2", True, "cuda", "tf32x2"),
        ("tf32x2", False, "cuda", "tf32x3"),
        ("tf32x3", True, "cuda", "tf32x3"),
        ("wgmma", True, "cuda", "wgmma"),
        ("fp32", True, "cuda", "fp32"),
        ("tf32x2", True, "cpu", "fp32"),
        ("bf16x3", True, "cuda", "bf16x3"),
        ("bf16x3", False, "cuda", "tf32x3"),
    ],
)
@pytest.mark.parametrize("sums", ["fused", "ops"])
def test_the_model_says_what_its_prefill_matmuls_run_as(monkeypatch, tiny, choice, packed, backend, want, sums):
    """Reports record it (environment's prefill_matmuls, prefill_split_sums where the matmul kernels run, and
    prefill_attention): the switches as they apply to these weights on this backend; on the CPU attention is
    MLX's ops (so prefill_qk is absent)."""
    from pdlib.engine.model import Qwen3

    monkeypatch.setenv("PDLIB_PREFILL_GEMM", choice)
    monkeypatch.setenv(G.SUM_ENV, sums)
    monkeypatch.setattr(G, "BACKEND", backend)
    q = Qwen3(tiny, compile_steps=False, lossless_decode_weights=packed, decode="kernels")
    split = {} if want == "fp32" else {"prefill_split_sums": sums}
    assert q.prefill_arithmetic == {"prefill_matmuls": want, "prefill_attention": "ops", **split}


@pytest.mark.parametrize("qk", ["kernel", "ops"])
def test_the_model_says_whether_a_chunks_q_and_k_run_as_one_kernel(monkeypatch, tiny, qk):
    from pdlib.engine.kernels import arithmetic
    from pdlib.engine.model import Qwen3

    monkeypatch.setattr(arithmetic, "flash_enabled", lambda head_dim: True)
    monkeypatch.setattr(arithmetic, "qk_rope_enabled", lambda head_dim: qk == "kernel")
    q = Qwen3(tiny, compile_steps=False, decode="kernels")
    assert q.prefill_arithmetic["prefill_qk"] == qk and q.prefill_arithmetic["prefill_attention"] == "flash-tf32x3"

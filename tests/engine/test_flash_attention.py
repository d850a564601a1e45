"""Flash prefill attention (pdlib/engine/kernels/flash_prefill.py). On the CPU: a NumPy emulation of the
kernel's blocks, key splits, tiles, online softmax and merge passes its check (kernel_check.check_flash_attention)
and each planted fault fails it; the split rule; the switch; the engine's prefill goes through it when enabled
(ragged steps and the pruned last layer included) and gives the ops path's logits. The kernel itself runs in
check-kernels on a GPU; NVRTC compiles it here."""

import re

import mlx.core as mx
import numpy as np
import pytest
from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped

from pdlib.engine import kernels as K
from pdlib.engine.kernels import flash_prefill as F
from pdlib.engine.kernels.backend import float_bits
from pdlib.errors import InputError
from pdlib.tools.kernel_check import check_flash_attention, flash_cases


def emulated(
    q,
    kc,
    vc,
    positions,
    written,
    *,
    scale,
    length,
    splits=None,
    rows_per_thread=None,
    arithmetic=None,
    poison=False,
    fault=None,
):
    """flash_attention as the kernel computes it: per head and 64-row block, keys [0, max position + 1) in
    64-key tiles, shared out to the splits, an online softmax per split, the splits merged by their maxima (a
    thread's share of the rows, `rows_per_thread`, changes no arithmetic).
    `fault`: "last tile" (each split skips its last), "no mask", "whole cache" (tiles run to the capacity),
    "merge" (the splits' sums added without their maxima), "fence" (the fence ignored)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # a fault may leave a row no key: NaN, as it should
        return _emulated(q, kc, vc, positions, written, scale=scale, length=length, splits=splits, fault=fault)


def _emulated(q, kc, vc, positions, written, *, scale, length, splits, fault):
    q, kc, vc = (np.array(a, np.float32) for a in (q, kc, vc))
    pos = np.array(positions)
    Hq, T, Dh = q.shape
    Hkv, cap, _ = kc.shape
    z = F.key_splits(T, Hq, length, 132) if splits is None else splits
    out = np.zeros((Hq, T, Dh), np.float32)
    for h in range(Hq):
        g = h // (Hq // Hkv)
        for r0 in range(0, T, F.BR):
            qs, p = q[h, r0 : r0 + F.BR] * np.float32(scale), pos[r0 : r0 + F.BR]
            kend = cap if fault == "whole cache" else min(int(p.max()) + 1, cap)
            tiles = -(-kend // F.BC)
            per = -(-tiles // z)
            parts = []
            for zi in range(z):
                t0 = min(tiles, zi * per)
                t1 = min(tiles, t0 + per) - (1 if fault == "last tile" and min(tiles, t0 + per) > t0 else 0)
                m = np.full(len(p), -np.inf, np.float32)
                l, o = np.zeros(len(p), np.float32), np.zeros((len(p), Dh), np.float32)
                for t in range(t0, t1):
                    keys = np.arange(t * F.BC, min((t + 1) * F.BC, kend))
                    s = qs @ kc[g, keys].T
                    if fault != "no mask":
                        s = np.where(keys[None, :] > p[:, None], -np.inf, s)
                    m_new = np.maximum(m, s.max(axis=1))
                    shift = np.where(m_new == -np.inf, 0, m_new)
                    alpha, e = np.exp(m - shift), np.exp(s - shift[:, None])
                    l, o, m = l * alpha + e.sum(axis=1), o * alpha[:, None] + e @ vc[g, keys], m_new
                parts.append((m, l, o))
            ms = np.stack([m for m, _, _ in parts])
            w = np.ones_like(ms) if fault == "merge" else np.exp(ms - ms.max(axis=0))
            out[h, r0 : r0 + F.BR] = (
                sum(wi[:, None] * o for wi, (_, _, o) in zip(w, parts))
                / sum(wi * l for wi, (_, l, _) in zip(w, parts))[:, None]
            )
    if fault != "fence" and int(np.array(written)[0]) == 0:
        out[:] = np.nan
    return mx.array(out)


def small(case):
    """check-kernels' case with its rows and context scaled down, so NumPy runs it in CI's time (splits kept)."""
    name, Hq, Hkv, T, start, cap, splits = case
    if T > 256:
        T, cap = 300, 300
    if start > 1024:
        start, cap = 1000 - T, 1100
    return name, Hq, Hkv, T, start, cap, splits


def rows_with(monkeypatch, **kw):
    """check-kernels' flash rows on the emulation, by case (each variant's verdict, which must agree)."""
    monkeypatch.setattr(K, "flash_attention", lambda *a, **k: emulated(*a, **k, **kw))
    rows = check_flash_attention(seed=0, cases=[small(c) for c in flash_cases()])
    names = [c[0] for c in flash_cases()]
    variants = [f"{rt} rows/thread" for rt in F.ROW_TILES] + ["tf32x3"]
    expected = []
    for variant in variants:
        first = f"{names[0]}, {variant}"
        expected += [first, first + ", zero fence", first + ", zero fence, 1 split"]
        expected += [f"{n}, {variant}" for n in names[1:]]
    assert [r["case"] for r in rows] == expected
    verdicts = {}
    for r in rows:
        verdicts.setdefault(re.sub(r", (\d+ rows/thread|tf32x3)", "", r["case"]), set()).add(r["passed"])
    assert all(len(v) == 1 for v in verdicts.values())
    return {case: v.pop() for case, v in verdicts.items()}


def test_the_check_passes_the_emulation_and_fails_each_planted_fault(monkeypatch):
    assert all(rows_with(monkeypatch).values())
    # a tile skipped, a key past a row's position seen, a stale (NaN) slot read, a merge without the maxima
    skipped = rows_with(monkeypatch, fault="last tile")
    assert not any(passed for case, passed in skipped.items() if "zero fence" not in case)
    no_mask = rows_with(monkeypatch, fault="no mask")
    assert not no_mask["128 rows at 3968"] and not no_mask["2048 rows at 0"]
    assert no_mask["1 row at 4095"]  # the last position sees every key: nothing to mask
    whole = rows_with(monkeypatch, fault="whole cache")
    assert not whole["128 rows at 3968"] and not whole["37 rows at 100, 3 splits"]
    merge = rows_with(monkeypatch, fault="merge")
    assert not merge["128 rows at 3968"] and not merge["37 rows at 100, 3 splits"]
    unfenced = rows_with(monkeypatch, fault="fence")
    assert not unfenced["128 rows at 3968, zero fence"] and not unfenced["128 rows at 3968, zero fence, 1 split"]


def test_the_split_fills_the_gpu_with_whole_tiles():
    sms = 132
    assert F.key_splits(128, 16, 4096, sms) == 8  # a chunk at 4K: 2 row blocks x 16 heads -> 256 blocks
    assert F.key_splits(4096, 16, 4096, sms) == 1  # a whole prompt: 1024 blocks already
    assert F.key_splits(1, 16, 4096, sms) == 16  # a pruned row
    assert F.key_splits(128, 16, 128, sms) == 1  # the first chunk: two tiles, one split
    for T, n in [(37, 1000), (5, 300), (128, 5120)]:
        z = F.key_splits(T, 16, n, sms)
        assert z > 1 and -(-n // F.BC) >= 2 * z and -(-T // F.BR) * 16 * z <= 2 * sms


def test_the_switch(monkeypatch):
    monkeypatch.delenv(F.ENV, raising=False)
    assert F.enabled(128) == (K.BACKEND == "cuda") and F.arithmetic() == "tf32x3"
    assert not F.enabled(64)
    monkeypatch.setenv(F.ENV, "ops")
    assert not F.enabled(128)
    monkeypatch.setenv(F.ENV, "fast")
    with pytest.raises(InputError, match="PDLIB_PREFILL_ATTENTION must be flash-tf32x3 or flash or ops, got 'fast'"):
        F.enabled(128)
    monkeypatch.setenv(F.ENV, "flash-tf32x3")
    assert F.enabled(128) == (K.BACKEND == "cuda") and F.arithmetic() == "tf32x3"
    monkeypatch.setenv(F.ENV, "flash")
    assert F.enabled(128) == (K.BACKEND == "cuda") and F.arithmetic() == "fp32"


@pytest.mark.parametrize("qk", ["ops", "qk_rope_store"])
def test_the_engine_attends_through_it_and_writes_only_the_new_rows(monkeypatch, tiny, qk):
    """With the kernel enabled (a stand-in on the CPU: the emulation), a prompt in two chunks and then a ragged
    step (a decode row beside another request's chunk) attend through it, one call per chunk segment and layer,
    the pruned last layer with the emitting rows alone; the decode row attends by decode_attention instead;
    the caches' prefixes are never handed out (store is not called); the logits equal the ops path's within
    the gate's tolerance. `qk`: a chunk's q/k norms, RoPE and K/V store by MLX's ops or by qk_rope_store (its
    twin here), one call per chunk segment and layer."""
    from pdlib.engine.cache import KVCache
    from pdlib.engine.model import Qwen3, Segment

    q = Qwen3(tiny, compile_steps=False)
    layers = tiny.config.num_hidden_layers
    a_prompt, b_prompt = mx.arange(3, 103, dtype=mx.int32), mx.arange(200, 237, dtype=mx.int32)

    def run():
        a, b = q.new_cache(160), q.new_cache(160)
        out = [
            q.step([Segment(a, a_prompt[:64], start=0, emits=False)]),
            q.step([Segment(a, a_prompt[64:], start=64, emits=True)]),
            q.step([Segment(b, b_prompt[:20], start=0, emits=False)]),
            q.step(
                [
                    Segment(a, mx.array([7], mx.int32), start=100, emits=True),
                    Segment(b, b_prompt[20:], start=20, emits=True),
                ]
            ),
        ]
        return [x for step in out for x in step if x is not None]

    monkeypatch.setenv(F.ENV, "ops")
    plain = run()
    calls, decodes, stores = [], [], []

    def standin(qr, kc, vc, positions, written, **kw):
        calls.append((qr.shape[1], kw["length"], np.array(positions).tolist()))
        assert kc.shape[1] == 160  # the whole cache, as it lies
        o = emulated(qr, kc, vc, positions, written, **kw)  # laid out as the merge leaves it: (rows, heads, Dh)
        return mx.array(np.ascontiguousarray(np.swapaxes(np.array(o), 0, 1))).swapaxes(0, 1)

    def decode_attention(qkv, q_norm, k_norm, inv_freq, pos, *args, **kw):
        decodes.append(np.array(pos).tolist())
        return K.decode_attention_ops(qkv, q_norm, k_norm, inv_freq, pos, *args, **kw) + (args[-1],)

    def qk_rope_store(raw, *args, **kw):
        stores.append((raw.shape[0], kw["start"]))
        return K.qk_rope_store_ops(raw, *args, **kw)

    monkeypatch.setattr(K, "flash_enabled", lambda head_dim: True)
    monkeypatch.setattr(K, "flash_attention", standin)
    monkeypatch.setattr(K, "decode_attention", decode_attention)
    monkeypatch.setattr(K, "qk_rope_enabled", lambda head_dim: qk == "qk_rope_store")
    monkeypatch.setattr(K, "qk_rope_store", qk_rope_store)
    monkeypatch.setattr(KVCache, "store", lambda *a, **k: pytest.fail("the prefix was handed out"))
    writes, write = [], KVCache.write
    monkeypatch.setattr(
        KVCache, "write", lambda self, i, k, v, **kw: writes.append(k.shape[1]) or write(self, i, k, v, **kw)
    )
    got = run()
    assert len(got) == len(plain) == 3
    for g, p in zip(got, plain):
        assert np.allclose(np.array(g), np.array(p), rtol=1e-3, atol=1e-3)
    # chunk 1 prunes its last layer entirely (it emits nothing); chunk 2 attends with its last row there
    assert calls[: layers - 1] == [(64, 64, list(range(64)))] * (layers - 1)
    chunk2 = calls[layers - 1 : 2 * layers - 1]
    assert chunk2[:-1] == [(36, 100, list(range(64, 100)))] * (layers - 1) and chunk2[-1] == (1, 100, [99])
    assert calls[2 * layers - 1 : 3 * layers - 2] == [(20, 20, list(range(20)))] * (layers - 1)  # b's first chunk
    assert len(calls) == 4 * layers - 2  # the ragged step: b's chunk only
    assert calls[-layers:] == [(17, 37, list(range(20, 37)))] * (layers - 1) + [(1, 37, [36])]
    assert decodes == [[100]] * layers  # a's decode row, every layer
    # every chunk segment stores its rows in every layer, the pruned last one included
    want = [(64, 0)] * layers + [(36, 64)] * layers + [(20, 0)] * layers + [(17, 20)] * layers
    assert stores == (want if qk == "qk_rope_store" else [])
    # each segment's rows are written once a layer: the decode row's by write (its ops twin hands them back);
    # the chunks' by qk_rope_store, or else by write
    assert sorted(writes) == sorted([1] * layers + ([] if qk == "qk_rope_store" else [n for n, _ in want]))


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
@pytest.mark.parametrize("rows_per_thread", F.ROW_TILES)
def test_the_cuda_sources_compile_for_the_h200(rows_per_thread):
    """As MLX wraps them (the inputs' shapes passed), for sm_90: no spills; two blocks fit an SM by registers
    and by shared memory (228 KB, 1 KB of it reserved per block; static as ptxas counts it, plus the dynamic
    SHARED_BYTES)."""
    flash = Kernel(
        "pdlib_flash_prefill",
        F.SOURCE,
        [("q", "f32"), ("kc", "f32"), ("vc", "f32"), ("pos", "i32"), ("after", "u32")],
        [("part", "f32"), ("stats", "f32")],
        [dict(SCALE_BITS=float_bits(128**-0.5), RT=rows_per_thread)],
    )
    log = compile_sm90(STANDINS + F.header(rows_per_thread) + wrapped(flash, "cuda", F.SOURCE))
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert 2 * regs * F.threads_for(rows_per_thread) <= 65536, log
    static = int(re.search(r"(\d+) bytes smem", log).group(1))
    assert 2 * (F.SHARED_BYTES + static + 1024) <= 228 * 1024, log
    merge = Kernel("pdlib_flash_merge", F.MERGE, [("part", "f32"), ("stats", "f32")], [("o", "f32")], [{}])
    assert "0 bytes spill stores" in compile_sm90(STANDINS + wrapped(merge, "cuda", F.MERGE))


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
def test_the_tensor_core_source_compiles_for_the_h200():
    """The 3xTF32 kernel (flash-tf32x3, opt-in): no spills, two blocks of 128 threads an SM by registers."""
    flash = Kernel(
        "pdlib_flash_prefill",
        F.SOURCE_TF32X3,
        [("q", "f32"), ("kc", "f32"), ("vc", "f32"), ("pos", "i32"), ("after", "u32")],
        [("part", "f32"), ("stats", "f32")],
        [dict(SCALE_BITS=float_bits(128**-0.5))],
    )
    log = compile_sm90(STANDINS + F.HEADER_TF32X3 + wrapped(flash, "cuda", F.SOURCE_TF32X3))
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    assert "0 bytes spill stores, 0 bytes spill loads" in log and 2 * regs * F.TF32X3_THREADS <= 65536, log

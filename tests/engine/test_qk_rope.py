"""A chunk's q/k norms, RoPE and K/V store in one kernel (pdlib/engine/kernels/qk_rope.py). On the CPU: its
twin gives the model's ops path's q, k and v; its check (kernel_check.check_qk_rope_store) passes the twin and
fails each planted fault; the switch; the CUDA text compiles for the H200 and the Metal text type-checks. The
kernel itself runs in check-kernels on a GPU; the engine's routing is in test_flash_attention.py."""

import re
import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped

from pdlib.engine import kernels as K
from pdlib.engine.kernels import qk_rope as Q
from pdlib.engine.kernels.backend import PRELUDE, float_bits
from pdlib.errors import InputError
from pdlib.tools.kernel_check import check_qk_rope_store, qk_rope_cases

KERNEL = Kernel(
    "pdlib_qk_rope_store",
    Q.SOURCE,
    [
        ("raw", "f32"),
        ("qn", "f32"),
        ("kn", "f32"),
        ("inv_freq", "f32"),
        ("pos", "i32"),
        ("kc", "f32"),
        ("vc", "f32"),
        ("after", "u32"),
    ],
    [("q", "f32"), ("written", "u32")],
    [
        dict(HQ=hq, HKV=hkv, DH=128, CAP=cap, EPS_BITS=float_bits(1e-6))  # T is pos_shape[0]
        for _, _, cap, hq, hkv, _ in qk_rope_cases()
    ],
)


def test_the_twin_is_the_models_ops_path(tiny):
    """q, and the k and v it stores, as Qwen3._qkv computes them for a chunk (RoPE by mx.fast.rope from the first
    position) and stores them (slice_update at start)."""
    from pdlib.engine.model import Qwen3

    model = Qwen3(tiny, compile_steps=False)
    c, L = tiny.config, model.layers[1]
    mx.random.seed(3)
    h, start, cap = mx.random.normal((24, c.hidden_size)), 40, 80
    kc, vc = (
        mx.random.normal((c.num_key_value_heads, cap, c.head_dim)),
        mx.random.normal((c.num_key_value_heads, cap, c.head_dim)),
    )
    wqkv = (L.t["wqkv"], L.d_qkv)
    x = mx.fast.rms_norm(h, L.in_norm, c.rms_norm_eps)  # the layer's normed input
    q, k, v, raw = model._qkv(x, wqkv, L.t["qk_norm"], mx.array(start, mx.int32))
    got = K.qk_rope_store_ops(
        raw,
        L.q_norm,
        L.k_norm,
        model.inv_freq,
        mx.arange(start, start + 24, dtype=mx.int32),
        kc,
        vc,
        K.new_fence(),
        start=start,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        eps=c.rms_norm_eps,
    )
    close = lambda a, b: np.allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-4)  # noqa: E731
    assert close(got[0], q)
    assert close(got[1][:, start : start + 24], k) and close(got[2][:, start : start + 24], v)
    assert close(got[1][:, :start], kc[:, :start]) and close(got[2][:, start + 24 :], vc[:, start + 24 :])


def standin(fault=None):
    """The kernel as the twin, functionally, or with one planted fault."""

    def kernel(raw, qn, kn, inv_freq, positions, kc, vc, written, *, start, poison=False, **kw):
        if fault == "rope at the next position":
            positions = positions + 1
        if fault == "no q norm weight":
            qn = mx.ones_like(qn)
        if fault == "eps dropped":
            kw = {**kw, "eps": 0.0}
        q, k2, v2, _ = K.qk_rope_store_ops(raw, qn, kn, inv_freq, positions, kc, vc, written, start=start, **kw)
        if fault == "k one slot off":  # the next slot, or the one before where the rows end at the capacity
            off = 1 if start + raw.shape[0] < kc.shape[1] else -1
            k2 = K.qk_rope_store_ops(raw, qn, kn, inv_freq, positions, kc, vc, written, start=start + off, **kw)[1]
        if fault == "last row skipped":
            T = raw.shape[0]
            q = mx.concatenate([q[:, :-1], mx.full(q[:, -1:].shape, float("nan"))], axis=1)
            k2 = mx.slice_update(k2, kc[:, start + T - 1 : start + T], mx.array(start + T - 1), axes=(1,))
        if fault == "v left out":
            v2 = vc
        return q, k2, v2, written if fault == "fence left" else written + 1

    return kernel


def rows(monkeypatch, fault=None):
    monkeypatch.setattr(K, "qk_rope_store_kernel", standin(fault))
    return {(r["kernel"], r["case"]): r["passed"] for r in check_qk_rope_store(0)}


def failing(monkeypatch, fault):
    return sorted({kernel for (kernel, _), ok in rows(monkeypatch, fault).items() if not ok})


def test_the_check_passes_the_twin_and_fails_each_planted_fault(monkeypatch):
    assert all(rows(monkeypatch).values()) and len(rows(monkeypatch)) == 4 * len(qk_rope_cases())
    assert failing(monkeypatch, "rope at the next position") == ["qk_rope_store/k cache", "qk_rope_store/q"]
    assert failing(monkeypatch, "no q norm weight") == ["qk_rope_store/q"]
    assert failing(monkeypatch, "k one slot off") == ["qk_rope_store/k cache"]
    assert failing(monkeypatch, "last row skipped") == ["qk_rope_store/k cache", "qk_rope_store/q"]
    assert failing(monkeypatch, "v left out") == ["qk_rope_store/v cache"]
    assert failing(monkeypatch, "fence left") == ["qk_rope_store/fence"]
    dropped = {case for (kernel, case), ok in rows(monkeypatch, "eps dropped").items() if not ok}
    assert dropped == {"37 rows at 100, 6 + 2 heads of 0.0001"}  # the case whose values are near zero


def test_the_switch(monkeypatch):
    monkeypatch.delenv(Q.ENV, raising=False)
    assert Q.enabled(128) == (K.BACKEND != "cpu") and not Q.enabled(64)
    monkeypatch.setenv(Q.ENV, "ops")
    assert not Q.enabled(128)
    monkeypatch.setenv(Q.ENV, "fused")
    with pytest.raises(InputError, match="PDLIB_PREFILL_QK must be kernel or ops, got 'fused'"):
        Q.enabled(128)


def test_a_bad_switch_is_refused_when_the_model_loads(monkeypatch, tiny):
    from pdlib.engine.model import Qwen3

    monkeypatch.setenv(Q.ENV, "fast")
    with pytest.raises(InputError, match="PDLIB_PREFILL_QK must be kernel or ops, got 'fast'"):
        Qwen3(tiny, compile_steps=False)


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
def test_the_cuda_source_compiles_for_the_h200():
    log = compile_sm90(STANDINS + PRELUDE["cuda"] + wrapped(KERNEL, "cuda", Q.SOURCE))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert len(re.findall(r"Used \d+ registers", log)) == len(qk_rope_cases()), log


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_the_metal_text_type_checks_against_standins(tmp_path):
    from test_kernel_sources import METAL_STANDINS

    src = tmp_path / "qk_rope_store.cpp"
    src.write_text(METAL_STANDINS + PRELUDE["metal"] + wrapped(KERNEL, "metal", Q.SOURCE))
    run = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-Wno-unused", str(src)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_one_kernel_serves_every_chunk_length(monkeypatch):
    """The launch's template values do not name the chunk's length: MLX compiles a custom kernel once per set of
    them, and a serving run whose chunk lengths follow the arrivals met a new one in most mixed steps."""
    seen = []

    def record(*, inputs, template, output_shapes, **_):
        seen.append(template)
        return [mx.zeros(s) for s in output_shapes]

    monkeypatch.setattr(Q, "_kernel", record)
    hq, hkv, cap = 4, 2, 64
    cache = mx.zeros((hkv, cap, 128))
    for T in (1, 19, 37):
        raw = mx.zeros((T, hq + 2 * hkv, 128))
        positions = mx.arange(T, dtype=mx.int32)
        norms = mx.ones((128,)), mx.ones((128,))
        Q.qk_rope_store_kernel(
            raw, *norms, mx.ones((64,)), positions, cache, cache, K.new_fence(), heads=hq, kv_heads=hkv, eps=1e-6
        )
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]
    assert "pos_shape[0]" in Q.SOURCE  # where the body reads T instead

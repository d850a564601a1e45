"""The op layer. On a GPU backend every kernel is checked against its MLX-ops twin (fresh random inputs,
outputs poisoned with NaN); on the CPU, where the twins are what runs, the twins are checked against
straightforward NumPy versions of the same maths."""

import inspect
import re

import mlx.core as mx
import numpy as np
import pytest

from pdlib.engine import kernels as K
from pdlib.errors import InputError
from pdlib.tools.kernel_check import check_kernels

gpu = pytest.mark.skipif(K.BACKEND == "cpu", reason="no GPU backend: the kernels run only on CUDA or Metal")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_every_kernel_matches_its_ops_twin(seed):
    rows = check_kernels(seed=seed)
    assert len(rows) > 20
    bad = [r for r in rows if not r["passed"]]
    assert not bad, bad


def test_check_kernels_refuses_on_the_cpu():
    if K.BACKEND != "cpu":
        pytest.skip("GPU backend present")
    with pytest.raises(InputError, match="no GPU backend"):
        check_kernels()


@pytest.mark.parametrize(
    "backend, families",
    [
        (
            "cuda",
            [
                "gemv",
                "gemm_fp32",
                "gemm_bf16",
                "gemm_epilogue",
                "flash_attention",
                "decode_attention",
                "decode_rows",
                "kv_store",
                "kv_install",
                "qk_rope_store",
                "write_chain",
                "persistent_decode",
                "slices",
            ],
        ),
        (
            "metal",
            [
                "gemv",
                "decode_attention",
                "decode_rows",
                "kv_store",
                "kv_install",
                "qk_rope_store",
                "write_chain",
                "persistent_decode",
            ],
        ),
    ],
)
def test_check_kernels_runs_each_family_once_in_order_with_a_bar_on_stderr(monkeypatch, capsys, backend, families):
    import pdlib.tools.kernel_check as KC

    monkeypatch.setattr(K, "BACKEND", backend)
    for name in families + ["gemm_fp32", "gemm_bf16", "gemm_epilogue", "flash_attention", "slices"]:

        def family(seed, name=name):
            return [{"kernel": name, "seed": seed, "passed": name != "kv_store"}]

        family.__name__ = f"check_{name}"
        monkeypatch.setattr(KC, family.__name__, family)
    rows = KC.check_kernels(seed=3, progress=True)
    assert [r["kernel"] for r in rows] == families and {r["seed"] for r in rows} == {3}
    out, err = capsys.readouterr()
    assert not out and f"{len(families)}/{len(families)}" in err and "check-kernels" in err
    # each family's line as it ends, so a run cut short says how far it got
    assert "check-kernels: kv_store: 1 rows, 1 failing, " in err and "check-kernels: gemv: 1 rows, 0 failing, " in err
    assert re.search(r"check-kernels: gemv: 1 rows, 0 failing, \d+\.\d s", err)  # and how long it took
    KC.check_kernels(seed=3)
    assert capsys.readouterr() == ("", "")  # no bar unless asked (the tests, the library)


@pytest.mark.parametrize("op", ["gemv", "decode_attention", "store_kv"])
def test_each_ops_twin_takes_its_kernels_arguments(op):
    """So a caller (the dispatcher, kernel_check) can hand both the same arguments."""

    def params(fn):
        return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]

    assert params(getattr(K, f"{op}_ops")) == params(getattr(K, f"{op}_kernel"))


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("norm,residual,swiglu", [(True, False, False), (False, True, False), (True, False, True)])
def test_gemv_ops_twin(norm, residual, swiglu):
    rng = np.random.default_rng(0)
    k, n = 64, 48
    x = rng.standard_normal(k).astype(np.float32)
    w = rng.standard_normal((2 * n if swiglu else n, k)).astype(np.float32) / 8
    nw = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    res = rng.standard_normal(n).astype(np.float32)
    got = K.gemv_ops(
        mx.array(x),
        mx.array(w).astype(mx.bfloat16),
        norm=mx.array(nw) if norm else None,
        eps=1e-6,
        residual=mx.array(res) if residual else None,
        swiglu=swiglu,
    )
    xin = rms(x, nw, 1e-6) if norm else x
    y = np.array(mx.array(w).astype(mx.bfloat16).astype(mx.float32)) @ xin
    if swiglu:
        g, u = y[:n], y[n:]
        y = g / (1 + np.exp(-g)) * u
    if residual:
        y = y + res
    np.testing.assert_allclose(np.array(got), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos", [0, 5, 37])
def test_decode_attention_ops_twin(pos):
    """Against plain NumPy: RMSNorm + RoPE of the new q/k, softmax attention over positions 0..pos, where
    slot pos is the new k/v and everything beyond it is garbage that must not matter."""
    rng = np.random.default_rng(pos)
    Hq, Hkv, Dh, cap = 4, 2, 16, 40
    qkv = rng.standard_normal((Hq + 2 * Hkv) * Dh).astype(np.float32)
    qn, kn = (1 + 0.1 * rng.standard_normal((2, Dh))).astype(np.float32)
    kc = rng.standard_normal((Hkv, cap, Dh)).astype(np.float32)
    vc = rng.standard_normal((Hkv, cap, Dh)).astype(np.float32)
    kc[:, pos:], vc[:, pos:] = 1e4, -1e4
    inv_freq = K.rope_inv_freq(Dh, base=1e6)
    o, k_new, v_new = K.decode_attention_ops(
        mx.array(qkv),
        mx.array(qn),
        mx.array(kn),
        inv_freq,
        mx.array([pos], mx.int32),
        mx.array(kc),
        mx.array(vc),
        heads=Hq,
        kv_heads=Hkv,
        eps=1e-6,
    )

    def norm_rope(x, w):
        x = rms(x, w, 1e-6)
        ang = pos * np.array(inv_freq)
        x1, x2 = x[:, : Dh // 2], x[:, Dh // 2 :]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    q = norm_rope(qkv[: Hq * Dh].reshape(Hq, Dh), qn)
    k = norm_rope(qkv[Hq * Dh : (Hq + Hkv) * Dh].reshape(Hkv, Dh), kn)
    v = qkv[(Hq + Hkv) * Dh :].reshape(Hkv, Dh)
    keys = np.concatenate([kc[:, :pos], k[:, None]], axis=1)
    vals = np.concatenate([vc[:, :pos], v[:, None]], axis=1)
    want = []
    for hq in range(Hq):
        s = keys[hq // (Hq // Hkv)] @ q[hq] / np.sqrt(Dh)
        p = np.exp(s - s.max())
        want.append(p / p.sum() @ vals[hq // (Hq // Hkv)])
    np.testing.assert_allclose(np.array(o), np.concatenate(want), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(k_new), k, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(v_new), v)


def test_kv_store_ops_writes_only_its_slots_and_returns_the_prefix():
    kc, vc = mx.zeros((2, 10, 4)), mx.ones((2, 10, 4))
    k, v = mx.full((2, 3, 4), 5.0), mx.full((2, 3, 4), 7.0)
    fence = K.new_fence()
    k2, v2, written, keys, values = K.store_kv(k, v, kc, vc, fence, positions=mx.arange(4, 7, dtype=mx.int32), start=4)
    assert written is fence  # the functional update needs no fence: its result is a new array
    want_k, want_v = np.zeros((2, 10, 4)), np.ones((2, 10, 4))
    want_k[:, 4:7], want_v[:, 4:7] = 5.0, 7.0
    np.testing.assert_array_equal(np.array(k2), want_k)
    np.testing.assert_array_equal(np.array(v2), want_v)
    np.testing.assert_array_equal(np.array(keys), want_k[:, :7])  # what attention reads: slots 0 .. 6
    np.testing.assert_array_equal(np.array(values), want_v[:, :7])


def test_rope_frequencies_match_mlx_rope():
    """The table here reproduces MLX's own rope (the reference's) bit for bit at a large position."""
    x = mx.random.normal((1, 2, 3, 128))
    ref = mx.fast.rope(x, 128, traditional=False, base=1e6, scale=1.0, offset=4093)
    got = K.rope_ops(x, positions=mx.arange(4093, 4096, dtype=mx.int32), inv_freq=K.rope_inv_freq(128, base=1e6))
    assert mx.array_equal(got, ref).item()


def test_read_after_passes_values_through_and_refuses_a_zero_counter():
    """Values only (the ordering is a GPU matter, checked by check-kernels in the kernel's own graph): a read
    through a live fence is the cache's values; a zero counter gives NaN, which no check passes."""
    x = mx.arange(6, dtype=mx.float32).reshape(2, 3)
    assert mx.array_equal(K.read_after(x, K.new_fence()), x).item()
    assert mx.isnan(K.read_after(x, mx.zeros_like(K.new_fence()))).all().item()

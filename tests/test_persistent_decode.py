"""The persistent decode kernel where no GPU is: its ops twin is the engine's decode step exactly, the switch that
selects it refuses what it cannot run, a failed step's token is an error, and its CUDA source compiles with
NVRTC for the H200 (sm_90) as MLX would wrap it, within one SM's shared memory and registers. Whether it
computes the right numbers is for `check-kernels` and the gate on the GPU (pdlib/kernel_check.py)."""

import re

from dataclasses import replace

import mlx.core as mx
import pytest

from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped
from pdlib.config import decode_mode, preset
from pdlib.engine import Engine, check_token
from pdlib.engine import kernels as K
from pdlib.engine.kernels import persistent_decode as P
from pdlib.engine.model import Qwen3
from pdlib.errors import InputError
from pdlib.weights import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic:tiny")


def _kw(cfg):
    return dict(heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, eps=cfg.rms_norm_eps)


@pytest.mark.parametrize("prompt", [1, 5, 37])
def test_the_twin_is_the_engines_decode_step(tiny, prompt):
    q = Qwen3(tiny, compile_steps=False)
    cache = q.new_cache(64)
    q.prefill(cache, mx.arange(3, 3 + prompt, dtype=mx.int32), start=0, last=True)
    token = mx.array(11, mx.uint32)
    want = q.decode_step(token, cache.position(), cache.k, cache.v, cache.written)
    got = K.decode_persistent_ops(token, cache.position(), q.stacked_decode_weights(), cache.k_all, cache.v_all,
                                  cache.written, **_kw(q.cfg))
    assert mx.array_equal(got[0], want[0]).item() and got[1].item() == want[1].item()
    assert got[2].item() == prompt + 1
    for a, b in zip(got[3] + got[4], want[3] + want[4], strict=True):
        assert mx.array_equal(a, b).item()


def test_the_stacked_weights_are_the_layers_in_order(tiny):
    q = Qwen3(tiny, compile_steps=False)
    dw = q.stacked_decode_weights()
    assert dw.qkv.shape[0] == len(q.layers) and dw.qkv.dtype == mx.bfloat16
    for i in (0, len(q.layers) - 1):
        assert mx.array_equal(dw.down[i], q.layers[i].d_down).item()
        assert mx.array_equal(dw.k_norm[i], q.layers[i].k_norm).item()


def test_the_layers_decode_matrices_become_views_of_the_stacks(tiny):
    """Where the persistent kernel runs, each layer's decode matrix is a view of its stack (in memory once), and
    the per-operation decode step over those views is unchanged."""
    import numpy as np
    q = Qwen3(tiny, lossless_decode_weights=False, compile_steps=False)  # FP32 copies: numpy can read them
    cache = q.new_cache(32)
    q.prefill(cache, mx.arange(3, 12, dtype=mx.int32), start=0, last=True)
    token = mx.array(11, mx.uint32)
    want = q.decode_step(token, cache.position(), cache.k, cache.v, cache.written)[0]
    q.decode_weights = q.stacked_decode_weights()
    mx.eval(q.decode_weights)
    q.share_decode_weights()
    for name, kind in (("d_qkv", "qkv"), ("d_o", "o"), ("d_gate_up", "gate_up"), ("d_down", "down")):
        stack = getattr(q.decode_weights, kind)
        base = np.asarray(stack).__array_interface__["data"][0]
        offsets = [np.asarray(getattr(L, name)).__array_interface__["data"][0] - base for L in q.layers]
        assert offsets == [i * stack[0].nbytes for i in range(len(q.layers))], name
    got = q.decode_step(token, cache.position(), cache.k, cache.v, cache.written)[0]
    assert mx.array_equal(got, want).item()


def test_a_planted_fault_in_the_stacking_is_seen(tiny):
    """The twin's check has teeth: two layers swapped in the stack change the logits."""
    q = Qwen3(tiny, compile_steps=False)
    cache = q.new_cache(32)
    q.prefill(cache, mx.arange(3, 12, dtype=mx.int32), start=0, last=True)
    dw = q.stacked_decode_weights()
    swapped = P.DecodeWeights(**{**dw.__dict__, "o": dw.o[::-1]})
    args = (mx.array(11, mx.uint32), cache.position())
    good = K.decode_persistent_ops(*args, dw, cache.k_all, cache.v_all, cache.written, **_kw(q.cfg))[0]
    bad = K.decode_persistent_ops(*args, swapped, cache.k_all, cache.v_all, cache.written, **_kw(q.cfg))[0]
    assert not mx.allclose(good, bad, rtol=1e-3, atol=1e-3).item()


def test_the_decode_switch(monkeypatch, tiny):
    monkeypatch.delenv("PDLIB_DECODE", raising=False)
    assert decode_mode() is None and decode_mode("persistent") == "persistent"
    # unset: persistent where it runs (CUDA, head_dim 128), the per-operation kernels elsewhere
    assert Engine(tiny, capacity=16).model.decode_mode == "kernels"
    monkeypatch.setenv("PDLIB_DECODE", "fast")
    with pytest.raises(InputError, match="PDLIB_DECODE='fast'.*kernels, persistent"):
        decode_mode()
    monkeypatch.setenv("PDLIB_DECODE", "persistent")
    if K.BACKEND != "cuda":  # the tiny model's head_dim is not 128 either
        with pytest.raises(InputError, match="needs CUDA, head_dim 128"):
            Engine(tiny, capacity=16)


def test_the_report_records_the_decode_path(monkeypatch):
    from pdlib.report import build_report, environment
    monkeypatch.setenv("PDLIB_DECODE", "kernels")
    assert environment("cpu")["PDLIB_DECODE"] == "kernels"
    kw = dict(params={}, model={}, prompts={}, backend="cpu", validation={}, reference_tokens={}, trials=[])
    assert build_report(**kw, settings={"decode": "persistent"})["environment"]["decode"] == "persistent"
    assert "decode" not in build_report(**kw)["environment"]


def test_a_failed_step_is_an_error_not_a_token():
    assert check_token(151935) == 151935
    with pytest.raises(RuntimeError, match="grid barrier"):
        check_token(P.ERROR_TOKEN)


# -- NVRTC: the CUDA text compiles, as MLX wraps it (kernel_text.py) ------------------------------------------

INPUT_TYPES = ["u32", "i32", "f32"] + ["bf16"] * 5 + ["f32"] * 6 + ["u32", "f32", "f32", "u32"]
OUTPUT_TYPES = ["f32", "u32", "i32", "f32", "u64", "u32"]


def persistent_text(consts: dict) -> str:
    """The kernel for one set of template values, as MLX wraps it (kernel_text.wrapped), after its header."""
    kernel = Kernel("pdlib_decode_persistent", P.BODY, list(zip(P.INPUTS, INPUT_TYPES, strict=True)),
                    list(zip(P.OUTPUTS, OUTPUT_TYPES, strict=True)), [consts])
    return STANDINS + P.HEADER + wrapped(kernel, "cuda", P.BODY)


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
@pytest.mark.parametrize("shape", ["qwen3-0.6b", "check-kernels timeout case", "qwen3-0.6b, stamps on",
                                   "qwen3-0.6b, 2 keys per warp and stage", "qwen3-0.6b, o_proj folded",
                                   "check-kernels timeout case, o_proj folded"])
def test_the_cuda_source_compiles_for_the_h200(shape):
    c = (dict(D=1024, HQ=16, HKV=8, DH=128, FF=3072, NL=28, V=151936, CAP=5248, NB=132, S=16)
         if shape.startswith("qwen3") else dict(D=256, HQ=2, HKV=1, DH=128, FF=512, NL=1, V=1024, CAP=8, NB=2112, S=2112))
    c.update(BLOCK=P.BLOCK, EPS_BITS=P.float_bits(1e-6), SCALE_BITS=P.float_bits(128 ** -0.5), SPIN=P.SPIN_CYCLES,
             STAMPS=int(shape.endswith("stamps on")), KVG=2 if shape.endswith("stage") else P.KV_GROUP,
             NST=P.KV_STAGES, FOLD=int(shape.endswith("folded")))
    log = compile_sm90(persistent_text(c))
    regs, smem = re.search(r"entry function '[^']*pdlib_decode_persistent.*?Used (\d+) registers.*?(\d+) bytes smem",
                           log, re.S).groups()
    # one block of 256 threads must fit on an SM by registers (64K) and static shared memory (48 KB)
    assert int(regs) * P.BLOCK <= 65536 and int(smem) <= P.SHARED_LIMIT, log
    # and `available` must know what it declares: its estimate is the compiler's count or a little over
    cfg = replace(preset("qwen3-0.6b"), hidden_size=c["D"], intermediate_size=c["FF"], num_attention_heads=c["HQ"],
                  num_key_value_heads=c["HKV"])
    assert int(smem) <= P.shared_bytes(cfg, fold=bool(c["FOLD"])) <= int(smem) + 128


def test_the_engine_runs_the_persistent_step(monkeypatch, tiny):
    """The engine's plumbing around the kernel (the stacked weights and caches, the sync buffer per cache, the
    fence and the position passed on from step to step), with a stand-in that keeps the kernel's contract: it
    computes with the ops twin, stores the new K/V slots into the request's cache itself (on a GPU the
    stacked caches it is given are that cache's buffers), returns no rows and advances the fence. On the CPU,
    three decodes equal the per-operation path's."""
    syncs, caches = [], {}

    def kernel_like(token, pos, dw, k_all, v_all, written, sync, **kw):
        assert sync[:2].tolist() == [0, 0]   # PDLIB_TOKEN_READ=item: no mailbox named
        syncs.append(sync)
        cache = caches["persistent"]
        assert mx.array_equal(k_all, mx.stack(cache.k)).item() and k_all.shape == cache.shape
        logits, tok, next_pos, ks, vs, _ = K.decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw)
        for i in range(len(ks)):  # "in place": into the request's cache, as the kernel writes its buffers
            cache.k[i] = mx.slice_update(cache.k[i], ks[i], pos, axes=(1,))
            cache.v[i] = mx.slice_update(cache.v[i], vs[i], pos, axes=(1,))
        return logits, tok, next_pos, [], [], written + 1
    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(P, "decode_persistent", kernel_like)
    monkeypatch.setenv("PDLIB_TOKEN_READ", "item")   # the mailbox's own tests are test_mailbox's
    prompt = list(range(3, 20))
    outs, fences = {}, {}
    for mode in ("persistent", "kernels"):
        e = Engine(tiny, capacity=32, decode=mode)
        e.add_request("A", prompt)
        e.reset("A", logical=True)
        caches[mode] = e.requests["A"].cache
        e.prefill_chunk("A", len(prompt))
        before = caches[mode].written[0].item()
        outs[mode] = [e.decode("A") for _ in range(3)]
        assert caches[mode].length == len(prompt) + 3
        fences[mode] = caches[mode].written[0].item() - before
    for a, b in zip(outs["persistent"], outs["kernels"], strict=True):
        assert mx.array_equal(a.logits, b.logits).item() and a.token.item() == b.token.item()
    assert fences["persistent"] == 3  # each step's fence was passed on
    assert len(syncs) == 3 and all(s is syncs[0] for s in syncs)  # one sync buffer, reused by the request


def test_launch_refuses_a_ring_that_does_not_fit_beside_the_kernels_arrays():
    """The same bound as `available`: the model's own static arrays plus the ring within the SM's shared
    memory. Checked before any kernel is built, so it holds on the CPU too."""
    from types import SimpleNamespace
    dw = SimpleNamespace(embed=SimpleNamespace(shape=(151936, 1024)), down=SimpleNamespace(shape=(28, 1024, 3072)))
    k_all = SimpleNamespace(shape=(28, 8, 4160, 128))
    static = P.static_shared_bytes(D=1024, F=3072, dh=128, heads=16, kv_heads=8, fold=False)
    most = (P.SM_SHARED_LIMIT - static) // P.ring_bytes(128, 1)
    assert P.fits(static, 128, most) and not P.fits(static, 128, most + 1)
    with pytest.raises(ValueError, match=f"kv_group={most + 1}: .* 1 to {most} keys per warp fit"):
        P.launch(None, None, dw, k_all, None, None, None, heads=16, kv_heads=8, eps=1e-6, kv_group=most + 1,
                 fold=False)


def test_the_fold_switch(monkeypatch):
    """o_proj folded into attention is off unless asked for (PDLIB_PERSISTENT_FOLD=1 or fold=True); a bad value
    is refused by name; the fold takes one grid barrier per layer away."""
    monkeypatch.delenv(P.FOLD_ENV, raising=False)
    assert not P.folded() and P.folded(True)
    monkeypatch.setenv(P.FOLD_ENV, "1")
    assert P.folded() and not P.folded(False)
    monkeypatch.setenv(P.FOLD_ENV, "yes")
    with pytest.raises(InputError, match="PDLIB_PERSISTENT_FOLD='yes': expected 0 or 1"):
        P.folded()
    assert P.barriers_per_layer(True) == P.barriers_per_layer(False) - 1 == 4


def test_the_scratch_layout_is_the_kernels():
    """scratch_layout (what persistent_debug reads) names BODY's work arrays in the order BODY lays them out."""
    import re
    names = {"H": "h", "QKV": "qkv", "O": "o", "ACT": "act", "H2": "h_mid", "HP": "head_parts", "PM": "m",
             "PL": "l", "PO": "partial_o", "CV": "block_best", "CI": "block_index"}
    declared = re.findall(r"^\s*(?:float|int)\* (\w+) = (?:scratch|reinterpret_cast<int\*>\()?", P.BODY, re.M)
    order = [names[n] for n in declared if n in names]
    layout = P.scratch_layout(D=8, heads=4, kv_heads=2, dh=4, F=12, splits=3, blocks=5)
    assert order == list(layout) and sorted(v[0] for v in layout.values()) == [v[0] for v in layout.values()]

"""The persistent decode kernel where no GPU is: its ops twin is the engine's decode step exactly, the switch that
selects it refuses what it cannot run, a failed step's token is an error, and its CUDA source compiles with
NVRTC for the H200 (sm_90) as MLX would wrap it, within one SM's shared memory and registers. Whether it
computes the right numbers is for `check-kernels` and the gate on the GPU (pdlib/tools/kernel_check.py)."""

import re
from dataclasses import replace

import mlx.core as mx
import pytest
from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped

from pdlib.config import preset
from pdlib.engine import Engine, check_token
from pdlib.engine import kernels as K
from pdlib.engine.kernels import persistent_decode as P
from pdlib.engine.model import Qwen3
from pdlib.errors import InputError
from pdlib.settings import decode_mode
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
    got = K.decode_persistent_ops(
        token, cache.position(), q.stacked_decode_weights(), cache.k_all, cache.v_all, cache.written, **_kw(q.cfg)
    )
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
    with pytest.raises(InputError, match="PDLIB_DECODE must be kernels or persistent, got 'fast'"):
        decode_mode()
    monkeypatch.setenv("PDLIB_DECODE", "persistent")
    if K.BACKEND != "cuda":  # the tiny model's head_dim is not 128 either
        with pytest.raises(InputError, match="needs CUDA, head_dim 128"):
            Engine(tiny, capacity=16)


def test_the_report_records_the_decode_path(monkeypatch):
    from pdlib.report.io import build_report, environment

    monkeypatch.setenv("PDLIB_DECODE", "kernels")
    monkeypatch.delenv("PDLIB_PREFILL_GEMM", raising=False)
    recorded = environment("cpu")["settings"]  # every engine switch, set or not
    assert recorded["PDLIB_DECODE"] == "kernels" and recorded["PDLIB_PREFILL_GEMM"] == "bf16x3"
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
PAIR_INPUT_TYPES, PAIR_OUTPUT_TYPES = ["u32", "i32", "f32", "f32", "u32"], ["u32"]


def persistent_text(consts: dict) -> str:
    """The kernel for one set of template values, as MLX wraps it (kernel_text.wrapped), after its header: NR 2
    is the pair's kernel, with the second request's buffers."""
    pair = consts["NR"] == 2
    inputs = list(zip(P.INPUTS + P.PAIR_INPUTS * pair, INPUT_TYPES + PAIR_INPUT_TYPES * pair, strict=True))
    outputs = list(zip(P.OUTPUTS + P.PAIR_OUTPUTS * pair, OUTPUT_TYPES + PAIR_OUTPUT_TYPES * pair, strict=True))
    source = P.source(consts["NR"])
    kernel = Kernel("pdlib_decode_persistent" + "_pair" * pair, source, inputs, outputs, [consts])
    return STANDINS + P.HEADER + wrapped(kernel, "cuda", source)


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
@pytest.mark.parametrize(
    "shape",
    [
        "qwen3-0.6b",
        "check-kernels timeout case",
        "qwen3-0.6b, stamps on",
        "qwen3-0.6b, 2 keys per warp and stage",
        "qwen3-0.6b, o_proj folded",
        "check-kernels timeout case, o_proj folded",
        "qwen3-0.6b, a pair",
        "check-kernels timeout case, a pair",
    ],
)
def test_the_cuda_source_compiles_for_the_h200(shape):
    nr = 2 if shape.endswith("a pair") else 1
    c = (
        dict(D=1024, HQ=16, HKV=8, DH=128, FF=3072, NL=28, V=151936, CAP=5248, NB=132, S=16 // nr)
        if shape.startswith("qwen3")
        else dict(D=256, HQ=2, HKV=1, DH=128, FF=512, NL=1, V=1024, CAP=8, NB=2112, S=2112 // nr)
    )
    c.update(
        BLOCK=P.BLOCK,
        EPS_BITS=P.float_bits(1e-6),
        SCALE_BITS=P.float_bits(128**-0.5),
        SPIN=P.SPIN_CYCLES,
        STAMPS=int(shape.endswith("stamps on")),
        KVG=2 if shape.endswith("stage") else P.KV_GROUP,
        NST=P.KV_STAGES,
        FOLD=int(shape.endswith("folded")),
        NR=nr,
    )
    log = compile_sm90(persistent_text(c))
    regs, smem = re.search(
        r"entry function '[^']*pdlib_decode_persistent.*?Used (\d+) registers.*?(\d+) bytes smem", log, re.S
    ).groups()
    # one block of 256 threads must fit on an SM by registers (64K) and static shared memory (48 KB)
    assert int(regs) * P.BLOCK <= 65536 and int(smem) <= P.SHARED_LIMIT, log
    # and `available` must know what it declares: its estimate is the compiler's count or a little over
    cfg = replace(
        preset("qwen3-0.6b"),
        hidden_size=c["D"],
        intermediate_size=c["FF"],
        num_attention_heads=c["HQ"],
        num_key_value_heads=c["HKV"],
    )
    assert int(smem) <= P.shared_bytes(cfg, fold=bool(c["FOLD"]), requests=nr) <= int(smem) + 128


def test_the_engine_runs_the_persistent_step(monkeypatch, tiny):
    """The engine's plumbing around the kernel (the stacked weights and caches, the sync buffer per cache, the
    fence and the position passed on from step to step), with a stand-in that keeps the kernel's contract: it
    computes with the ops twin, stores the new K/V slots into the request's cache itself (on a GPU the
    stacked caches it is given are that cache's buffers), returns no rows and advances the fence. On the CPU,
    three decodes equal the per-operation path's."""
    syncs, caches = [], {}

    def kernel_like(token, pos, dw, k_all, v_all, written, sync, **kw):
        assert sync[:2].tolist() == [0, 0]  # PDLIB_TOKEN_READ=item: no mailbox named
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
    monkeypatch.setenv("PDLIB_TOKEN_READ", "item")  # the mailbox's own tests are test_mailbox's
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
        P.launch(None, None, dw, k_all, None, None, None, heads=16, kv_heads=8, eps=1e-6, kv_group=most + 1, fold=False)


def test_the_fold_switch(monkeypatch):
    """o_proj folded into attention is off unless asked for (PDLIB_PERSISTENT_FOLD=1 or fold=True); a bad value
    is refused by name; the fold takes one grid barrier per layer away."""
    monkeypatch.delenv(P.FOLD_ENV, raising=False)
    assert not P.folded() and P.folded(True)
    monkeypatch.setenv(P.FOLD_ENV, "1")
    assert P.folded() and not P.folded(False)
    monkeypatch.setenv(P.FOLD_ENV, "yes")
    with pytest.raises(InputError, match="PDLIB_PERSISTENT_FOLD must be 0 or 1, got 'yes'"):
        P.folded()
    assert P.barriers_per_layer(True) == P.barriers_per_layer(False) - 1 == 4


def test_the_scratch_layout_is_the_kernels():
    """scratch_layout (what persistent_debug reads) names BODY's work arrays in the order BODY lays them out, and
    scratch_size leaves each request's arrays at a multiple of 4 floats (float4 reads), as BODY's SCR does."""
    import re

    names = {
        "H": "h",
        "QKV": "qkv",
        "O": "o",
        "ACT": "act",
        "H2": "h_mid",
        "HP": "head_parts",
        "PM": "m",
        "PL": "l",
        "PO": "partial_o",
        "CV": "block_best",
        "CI": "block_index",
    }
    declared = re.findall(r"\bOFF_(\w+) = ", P.BODY)
    order = [names[n] for n in declared]
    layout = P.scratch_layout(D=8, heads=4, kv_heads=2, dh=4, F=12, splits=3, blocks=5)
    assert order == list(layout) and sorted(v[0] for v in layout.values()) == [v[0] for v in layout.values()]
    # each offset as BODY computes it (its C expressions, evaluated with these shapes) is the layout's
    dims = dict(D=8, HQ=4, HKV=2, DH=4, FF=12, S=3, NB=5)
    dims.update(NQKV=(dims["HQ"] + 2 * dims["HKV"]) * dims["DH"], NO=dims["HQ"] * dims["DH"])
    for name, expr in re.findall(r"\bOFF_(\w+) = ([^,;]+)", P.BODY):
        dims[f"OFF_{name}"] = eval(expr, {}, dims)  # sums and products of the shapes: C and Python agree
        assert dims[f"OFF_{name}"] == layout[names[name]][0], name
    end = sum(layout["block_index"])
    assert dims["OFF_CI"] + dims["NB"] == end and "SCR = (OFF_CI + NB + 3) / 4 * 4" in P.BODY
    assert P.scratch_size(2, D=8, heads=4, kv_heads=2, dh=4, F=12, splits=3, blocks=5) == 2 * ((end + 3) // 4 * 4)


def test_two_decodes_of_one_step_share_one_launch(monkeypatch, tiny):
    """A step of two decodes (a Batch, as mixed's rounds after B's first token) runs as one pair launch where the
    model pairs decodes, with a stand-in that keeps the pair kernel's contract (the ops twin per request, the new
    slots stored into each request's cache, each fence advanced): the same logits and tokens as the per-operation
    path's decodes one by one, both caches one position on, one sync buffer for the pair, reused, naming no
    mailbox under PDLIB_TOKEN_READ=item."""
    syncs, caches = [], {}

    def pair_like(first, second, dw, sync, **kw):
        """The kernel's contract, with its new rows handed back for the caches to store (the CPU cannot write
        them in place)."""
        syncs.append(sync)
        out = []
        for name, (token, pos, k_all, v_all, written) in zip("AB", (first, second)):
            assert k_all.shape == caches["persistent"][name].shape
            logits, tok, next_pos, ks, vs, _ = K.decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw)
            out.append((logits, tok, next_pos, ks, vs, written + 1))
        return out

    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(P, "decode_persistent_pair", pair_like)
    monkeypatch.setenv("PDLIB_TOKEN_READ", "item")
    monkeypatch.delenv("PDLIB_PAIR_DECODE", raising=False)
    outs = {}
    for mode in ("persistent", "kernels"):
        e = Engine(tiny, capacity=48, decode=mode)
        assert e.settings["pair_decode"] == ("pair" if mode == "persistent" else "each")
        for name, prompt in (("A", list(range(3, 20))), ("B", list(range(40, 47)))):
            e.add_request(name, prompt)
            e.reset(name, logical=True)
            e.prefill_chunk(name, len(prompt))
        caches[mode] = {name: e.requests[name].cache for name in "AB"}
        outs[mode] = [o for _ in range(3) for o in e.batch([("A", None), ("B", None)])]
        assert [caches[mode][n].length for n in "AB"] == [20, 10]
    for a, b in zip(outs["persistent"], outs["kernels"], strict=True):
        assert mx.array_equal(a.logits, b.logits).item() and a.token.item() == b.token.item()
    assert len(syncs) == 3 and all(s is syncs[0] for s in syncs) and syncs[0][:4].tolist() == [0, 0, 0, 0]


def test_the_pair_switch(monkeypatch, tiny):
    """PDLIB_PAIR_DECODE=each decodes a step's two requests one launch each; a bad value is refused by name; a
    pair needs the persistent kernel (elsewhere decode_pair refuses) and two caches."""
    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setenv("PDLIB_TOKEN_READ", "item")
    monkeypatch.setenv("PDLIB_PAIR_DECODE", "each")
    assert not Qwen3(tiny, decode="persistent").pairs
    monkeypatch.setenv("PDLIB_PAIR_DECODE", "both")
    with pytest.raises(InputError, match="PDLIB_PAIR_DECODE must be pair or each, got 'both'"):
        Qwen3(tiny, decode="persistent")
    monkeypatch.delenv("PDLIB_PAIR_DECODE")
    model = Qwen3(tiny, decode="kernels")
    cache = model.new_cache(8)
    with pytest.raises(ValueError, match="need the persistent kernel"):
        model.decode_pair([cache, model.new_cache(8)], [mx.array(1), mx.array(2)])
    model = Qwen3(tiny, decode="persistent")
    with pytest.raises(ValueError, match="need two caches"):
        model.decode_pair([cache, cache], [mx.array(1), mx.array(2)])


def test_a_pairs_sync_buffer_names_both_mailboxes():
    """new_sync(a, b): request q's mailbox address in words SY_BOX + 2 q (low word first), every other word zero;
    more than two is refused."""
    a, b = 0x1234_5678_9ABC_DEF0, 0x0000_7F00_0000_0040
    s = P.new_sync(a, b).tolist()
    assert s[:4] == [a & 0xFFFFFFFF, a >> 32, b & 0xFFFFFFFF, b >> 32] and not any(s[4:])
    assert P.new_sync(a).tolist()[:4] == [a & 0xFFFFFFFF, a >> 32, 0, 0] and not any(P.new_sync().tolist())
    with pytest.raises(ValueError, match="3 mailboxes"):
        P.new_sync(1, 2, 3)


def test_a_pair_fits_where_its_staged_vectors_do():
    """The pair's kernel stages two vectors a phase: Qwen3-0.6B's fit one block's static shared memory beside the
    ring, -1.7B's do not (it keeps one launch per request), and a pair never folds o_proj."""
    small = preset("qwen3-0.6b")
    large = replace(small, hidden_size=2048, intermediate_size=6144)  # Qwen3-1.7B's widths
    fits = lambda cfg, n: P.fits(P.shared_bytes(cfg, requests=n), cfg.head_dim)  # noqa: E731
    assert fits(small, 1) and fits(small, 2) and fits(large, 1) and not fits(large, 2)
    assert P.shared_bytes(small, fold=True, requests=2) == P.shared_bytes(small, fold=False, requests=2)


def test_a_pair_launch_passes_each_requests_buffers_where_the_kernel_reads_them(monkeypatch):
    """decode_persistent_pair -> launch -> the pair's kernel, with a stand-in for the built kernel (none runs on
    the CPU): the inputs in INPUTS + PAIR_INPUTS order, the first request's buffers where the single kernel has
    them and the second's after; the template's NR 2 and half the splits; the outputs sized per request; and
    each request's logits, token, next position and fence read back from its own part of them."""
    D, F, Hq, Hkv, Dh, L, V, cap, nb = 16, 32, 2, 1, 128, 2, 10, 8, 4
    dw = P.DecodeWeights(
        embed=mx.zeros((V, D)),
        qkv=mx.zeros((L, (Hq + 2 * Hkv) * Dh, D)),
        o=mx.zeros((L, D, Hq * Dh)),
        gate_up=mx.zeros((L, 2 * F, D)),
        down=mx.zeros((L, D, F)),
        lm_head=mx.zeros((V, D)),
        in_norm=mx.zeros((L, D)),
        post_norm=mx.zeros((L, D)),
        q_norm=mx.zeros((L, Dh)),
        k_norm=mx.zeros((L, Dh)),
        norm=mx.zeros((D,)),
        inv_freq=mx.zeros((Dh // 2,)),
    )
    reqs = [
        (
            mx.array(3 + q, mx.uint32),
            mx.array([5 * q], mx.int32),
            mx.zeros((L, Hkv, cap, Dh)) + q,
            mx.zeros((L, Hkv, cap, Dh)) - q,
            K.new_fence() + 10 * q,
        )
        for q in range(2)
    ]
    sync, seen = P.new_sync(), {}

    def built(dh, kv_group, requests):
        def run(*, inputs, template, output_shapes, output_dtypes, **kw):
            seen.update(inputs=inputs, template=dict(template), shapes=output_shapes, requests=requests)
            # each output filled so that request q's part tells itself apart: logits q, token 7 + q, pos 20 + q
            logits = mx.concatenate([mx.full((V,), float(q)) for q in range(2)])
            words = lambda base: mx.array([base + q if w == 0 else 0 for q in range(2) for w in range(4)])  # noqa: E731
            return [
                logits,
                words(7).astype(mx.uint32),
                words(20).astype(mx.int32),
                mx.zeros(output_shapes[3]),
                mx.zeros((2,), mx.uint64),
                inputs[17] + 1,
                inputs[22] + 1,
            ]

        return run

    monkeypatch.setattr(P, "kernel", built)
    monkeypatch.setattr(P, "sm_count", lambda: nb)
    out = P.decode_persistent_pair(*reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)
    names = P.INPUTS + P.PAIR_INPUTS
    got = dict(zip(names, seen["inputs"], strict=True))
    for q, prefix in ((0, ""), (1, "1")):
        token, pos, kc, vc, fence = reqs[q]
        for name, want in (("tok", token), ("pos", pos), ("kc", kc), ("vc", vc), ("fin", fence)):
            assert got[name + prefix] is want, (name, q)
    assert got["sync_buf"] is sync and got["wqkv"] is dw.qkv and seen["requests"] == 2
    assert (
        seen["template"]["NR"] == 2
        and seen["template"]["S"] == max(1, nb // (2 * Hkv))
        and not seen["template"]["FOLD"]
    )
    assert seen["shapes"][:3] == [(2 * V,), (8,), (8,)] and seen["shapes"][6] == reqs[1][4].shape
    for q, (logits, tok, next_pos, ks, vs, fence) in enumerate(out):
        assert ks == [] and vs == []  # stored in place by the kernel
        assert logits.shape == (V,) and logits.tolist() == [float(q)] * V
        assert tok.item() == 7 + q and next_pos.tolist() == [20 + q]
        assert fence.tolist() == (reqs[q][4] + 1).tolist()
    with pytest.raises(ValueError, match="fold=True: .* not a pair"):
        P.decode_persistent_pair(*reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6, fold=True)
    monkeypatch.setenv(P.FOLD_ENV, "1")  # the switch folds single launches; a pair runs unfolded
    P.decode_persistent_pair(*reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)
    assert not seen["template"]["FOLD"]
    with pytest.raises(ValueError, match="one shape"):
        P.decode_persistent_pair(
            reqs[0],
            (*reqs[1][:2], mx.zeros((L, Hkv, cap + 1, Dh)), *reqs[1][3:]),
            dw,
            sync,
            heads=Hq,
            kv_heads=Hkv,
            eps=1e-6,
        )


def test_the_pairs_twin_is_each_requests_twin(tiny):
    """decode_persistent_pair_ops, check-kernels' oracle for the pair, is decode_persistent_ops per request."""
    m = Qwen3(tiny, decode="kernels")
    dw, c = m.stacked_decode_weights(), tiny.config
    caches = [m.new_cache(16) for _ in range(2)]
    reqs = [
        (mx.array(3 + q, mx.uint32), mx.array([2 + q], mx.int32), x.k_all, x.v_all, x.written)
        for q, x in enumerate(caches)
    ]
    pair = K.decode_persistent_pair_ops(*reqs, dw, **_kw(c))
    for r, got in zip(reqs, pair, strict=True):
        want = K.decode_persistent_ops(r[0], r[1], dw, *r[2:], **_kw(c))
        assert mx.array_equal(got[0], want[0]).item() and got[1].item() == want[1].item()

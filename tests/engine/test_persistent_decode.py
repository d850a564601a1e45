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


SPILL_LOADS = 192  # bytes of spilled loads the kernel may have at any request count (8 requests had 4,616)


def persistent_text(consts: dict) -> str:
    """The kernel for one set of template values, as MLX wraps it (kernel_text.wrapped), after its header: NR 2
    is the pair's kernel, with the second request's buffers; NR 3 to 8 a group's, with each further one's."""
    extra = [P.other_inputs(q) for q in range(1, consts["NR"])]
    more = len(extra)
    names_in = P.INPUTS + [n for i, _ in extra for n in i]
    names_out = P.OUTPUTS + [n for _, o in extra for n in o]
    inputs = list(zip(names_in, INPUT_TYPES + PAIR_INPUT_TYPES * more, strict=True))
    outputs = list(zip(names_out, OUTPUT_TYPES + PAIR_OUTPUT_TYPES * more, strict=True))
    source = P.source(consts["NR"])
    kernel = Kernel("pdlib_decode_persistent_r" + str(consts["NR"]), source, inputs, outputs, [consts])
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
        "qwen3-0.6b, a group of 4",
        "qwen3-0.6b, a group of 8",
        "check-kernels timeout case, a group of 8",
        "qwen3-0.6b, a group of 6, late loads",
        "qwen3-0.6b, late loads",
        "check-kernels timeout case, o_proj folded, late loads",
    ],
)
def test_the_cuda_source_compiles_for_the_h200(shape):
    late = shape.endswith("late loads")
    shape = shape.removesuffix(", late loads")
    nr = 2 if shape.endswith("a pair") else int(shape[-1]) if "a group of" in shape else 1
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
        SPL=P.STAMPS_PER_LAYER,
        KVG=2 if shape.endswith("stage") else P.KV_GROUP,
        NST=P.KV_STAGES,
        FOLD=int(shape.endswith("folded")),
        NR=nr,
        LATE=int(late),
    )
    log = compile_sm90(persistent_text(c))
    regs, smem = re.search(
        r"entry function '[^']*pdlib_decode_persistent.*?Used (\d+) registers.*?(\d+) bytes smem", log, re.S
    ).groups()
    # one block of 256 threads must fit on an SM by registers (64K) and static shared memory (48 KB)
    assert int(regs) * P.BLOCK <= 65536 and int(smem) <= P.SHARED_LIMIT, log
    # and the weight phases' values stay in registers, a group of 8 too (read again for each row of a pass, the
    # staged slices left 448 bytes of spilled loads at 4 requests and 4,616 at 8)
    (spilled,) = re.search(
        r"entry function '[^']*pdlib_decode_persistent.*?(\d+) bytes spill loads", log, re.S
    ).groups()
    assert int(spilled) <= SPILL_LOADS, log
    if late and c["D"] == 1024:  # weights requested after staging: nothing held across it, no spills
        assert int(regs) < 255 and int(spilled) == 0, log
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


def test_the_load_switch(monkeypatch):
    """Weights are requested before each phase's barrier unless PDLIB_PERSISTENT_LOAD=late; a bad value is
    refused by name; the launch passes the choice as the kernel's LATE."""
    monkeypatch.delenv(P.LOAD_ENV, raising=False)
    assert not P.late_loads()
    monkeypatch.setenv(P.LOAD_ENV, "late")
    assert P.late_loads()
    monkeypatch.setenv(P.LOAD_ENV, "later")
    with pytest.raises(InputError, match="PDLIB_PERSISTENT_LOAD must be early or late, got 'later'"):
        P.late_loads()


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


def conflict_free(at, k: int) -> bool:
    """Whether every quarter-warp of gemv's lanes (lane l holds columns 8c..8c+7, c = l + 32p, and reads the staged
    float4s 2c and 2c + 1) reads eight distinct 16-byte bank groups of 128 bytes, each of its two loads, where
    float4 i of a staged vector lies at at(i)."""
    k8 = k // 8
    for p in range((k8 + 31) // 32):
        for quarter in range(4):
            cs = [c for c in range(32 * p + 8 * quarter, 32 * p + 8 * quarter + 8) if c < k8]
            for half in (0, 1):
                if len({at(2 * c + half) % 8 for c in cs}) != len(cs):
                    return False
    return True


@pytest.mark.parametrize("k", [256, 512, 1024, 2048, 3072, 6144])  # the presets' D, NO and FF; check-kernels' case
def test_a_staged_vector_is_laid_out_for_gemvs_lanes(k):
    """xs_at (HEADER's C expression, evaluated here) keeps each float4 of a K-float vector inside it, is its own
    inverse (stage writes and gemv reads agree), and lets gemv's lanes read without bank conflicts, where the plain
    layout has two ways of them."""
    (expr,) = re.findall(r"int xs_at\(int i\) \{ return ([^;]+); \}", P.HEADER)

    def at(i):
        return eval(expr, {}, {"i": i})  # shifts, ands and xors: C and Python agree on non-negative ints

    pos = [at(i) for i in range(k // 4)]
    assert sorted(pos) == list(range(k // 4)) and all(at(j) == i for i, j in enumerate(pos))
    assert conflict_free(at, k)
    assert not conflict_free(lambda i: i, k)  # the plain layout, float4s 32 bytes apart: two lanes a bank group


def test_two_decodes_of_one_step_share_one_launch(monkeypatch, tiny):
    """A step of two decodes (a Batch, as mixed's rounds after B's first token) runs as one pair launch where the
    model pairs decodes, with a stand-in that keeps the pair kernel's contract (the ops twin per request, the new
    slots stored into each request's cache, each fence advanced): the same logits and tokens as the per-operation
    path's decodes one by one, both caches one position on, one sync buffer for the pair, reused, naming no
    mailbox under PDLIB_TOKEN_READ=item."""
    syncs, caches = [], {}

    def pair_like(reqs, dw, sync, **kw):
        """The kernel's contract, with its new rows handed back for the caches to store (the CPU cannot write
        them in place)."""
        syncs.append(sync)
        out = []
        for name, (token, pos, k_all, v_all, written) in zip("AB", reqs, strict=True):
            assert k_all.shape == caches["persistent"][name].shape
            logits, tok, next_pos, ks, vs, _ = K.decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw)
            out.append((logits, tok, next_pos, ks, vs, written + 1))
        return out

    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(P, "decode_persistent_group", pair_like)
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
    launch of several needs the persistent kernel (elsewhere decode_group refuses) and 2 to `group` caches, each its
    own."""
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
    with pytest.raises(ValueError, match="2 decodes in one launch need the persistent kernel and 2 to 1 caches"):
        model.decode_group([cache, model.new_cache(8)], [mx.array(1), mx.array(2)])
    model = Qwen3(tiny, decode="persistent")
    assert model.group == P.MAX_GROUP  # every count fits (the stand-in `available`)
    with pytest.raises(ValueError, match="2 decodes in one launch need .* 2 to 8 caches"):
        model.decode_group([cache, cache], [mx.array(1), mx.array(2)])  # one cache twice
    many = [model.new_cache(8) for _ in range(9)]
    with pytest.raises(ValueError, match="9 decodes in one launch need .* 2 to 8 caches"):
        model.decode_group(many, [mx.array(1)] * 9)


def test_a_pairs_sync_buffer_names_both_mailboxes():
    """new_sync(a, b): request q's mailbox address in words SY_BOX + 2 q (low word first), every other word zero;
    up to MAX_GROUP of them (a group's), more refused."""
    a, b = 0x1234_5678_9ABC_DEF0, 0x0000_7F00_0000_0040
    s = P.new_sync(a, b).tolist()
    assert s[:4] == [a & 0xFFFFFFFF, a >> 32, b & 0xFFFFFFFF, b >> 32] and not any(s[4:])
    assert P.new_sync(a).tolist()[:4] == [a & 0xFFFFFFFF, a >> 32, 0, 0] and not any(P.new_sync().tolist())
    assert P.new_sync(*range(1, 9)).tolist()[:17] == [w for q in range(1, 9) for w in (q, 0)] + [0]
    with pytest.raises(ValueError, match="9 mailboxes"):
        P.new_sync(*range(1, 10))


def test_a_pair_fits_where_its_staged_vectors_do():
    """The pair's kernel stages two vectors a phase: Qwen3-0.6B's fit one block's static shared memory beside the
    ring, -1.7B's do not (it keeps one launch per request), and a pair never folds o_proj."""
    small = preset("qwen3-0.6b")
    large = replace(small, hidden_size=2048, intermediate_size=6144)  # Qwen3-1.7B's widths
    fits = lambda cfg, n: P.fits(P.shared_bytes(cfg, requests=n), cfg.head_dim)  # noqa: E731
    assert fits(small, 1) and fits(small, 2) and fits(large, 1) and not fits(large, 2)
    assert P.shared_bytes(small, fold=True, requests=2) == P.shared_bytes(small, fold=False, requests=2)


def test_a_group_stages_its_vectors_after_the_ring_with_fewer_stages_where_they_need_the_room():
    """Three or more requests a launch: their staged vectors go to dynamic shared memory after attention's ring,
    which keeps its four stages while both fit an SM (227 KB) and gives up stages down to two; a group that does
    not fit even then is not available. Qwen3-0.6B (12 KB a vector; at 8, 8 KB more of the tiles' parts): up to 7
    with four stages, 8 with three; -1.7B (24 KB): 4 with three, 8 not at all. One request or a pair never loses a
    stage."""
    small = preset("qwen3-0.6b")
    large = replace(small, hidden_size=2048, intermediate_size=6144)
    assert [P.group_stages(small, n) for n in range(1, 9)] == [4, 4, 4, 4, 4, 4, 4, 3]
    assert [P.group_stages(large, n) for n in (1, 2, 3, 4, 6, 8)] == [4, 0, 4, 3, 2, 0]
    for cfg in (small, large):
        for n in range(3, 9):
            stages = P.group_stages(cfg, n)
            staged = P.staged_bytes(
                D=cfg.hidden_size, F=cfg.intermediate_size, dh=128, heads=cfg.num_attention_heads, requests=n
            )
            total = P.shared_bytes(cfg, requests=n) + staged + P.ring_bytes(128, P.KV_GROUP, max(stages, 2))
            assert (total <= P.SM_SHARED_LIMIT) == (stages > 0), (cfg.hidden_size, n)
            if 0 < stages < P.KV_STAGES:  # one more stage would not fit
                assert total + P.ring_bytes(128, P.KV_GROUP, 1) > P.SM_SHARED_LIMIT


def test_tiles_come_from_tiles_from_requests_in_the_source_and_the_staged_room():
    """source() defines PDP_TILES (the weight phases on tensor cores) from TILES_FROM requests a launch, and only
    there do the staged vectors take their padding and the tiles' parts."""
    shape = dict(D=1024, F=3072, dh=128, heads=16)
    for n in range(3, P.MAX_GROUP + 1):
        tiles = n >= P.TILES_FROM
        assert ("#define PDP_TILES" in P.source(n)) == tiles
        plain = 4 * n * 3072
        assert P.staged_bytes(**shape, requests=n) == (plain + 16 * n + 8192 if tiles else plain)
    assert "#define PDP_TILES" not in P.source(2) and "#define PDP_GROUP" not in P.source(2)


def test_the_largest_group_is_where_every_count_up_to_it_fits(monkeypatch):
    """largest_group: 8 for Qwen3-0.6B on CUDA; 1 for -1.7B, whose pair does not fit (its groups of 3 and 4
    would, but groups go out only where pairs do); 1 off CUDA or without packed weights."""
    small = preset("qwen3-0.6b")
    large = replace(small, hidden_size=2048, intermediate_size=6144)
    assert P.largest_group(small, packed=True) == (8 if P.BACKEND == "cuda" else 1)
    monkeypatch.setattr(P, "BACKEND", "cuda")
    assert P.largest_group(small, packed=True) == 8 and P.largest_group(large, packed=True) == 1
    assert P.largest_group(small, packed=False) == 1


@pytest.mark.parametrize("n", [2, 5, 8])
def test_a_group_launch_passes_each_requests_buffers_where_the_kernel_reads_them(monkeypatch, n):
    """decode_persistent_group (a pair: n = 2) -> launch -> the group's kernel, with a stand-in for the built
    kernel (none runs on the CPU): the inputs in INPUTS + other_inputs(1), other_inputs(2), ... order, the first
    request's buffers where the single kernel has them and each other's after; the template's NR n and
    1 / n of the splits; a pair's vectors static and a group's after the ring, with three stages for eight of
    these widths; the outputs sized per request; and each request's logits, token, next position and fence
    read back from its own part of them."""
    monkeypatch.delenv(P.LOAD_ENV, raising=False)
    D, F, Hq, Hkv, Dh, L, V, cap, nb = 1024, 3072, 2, 1, 128, 2, 10, 8, 64  # Qwen3-0.6B's widths
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
        for q in range(n)
    ]
    sync, seen = P.new_sync(), {}
    fin = [
        i
        for i, name in enumerate(P.INPUTS + [x for q in range(1, n) for x in P.other_inputs(q)[0]])
        if name.startswith("fin")
    ]

    def built(dh, kv_group, requests, dynamic):
        def run(*, inputs, template, output_shapes, output_dtypes, **kw):
            seen.update(inputs=inputs, template=dict(template), shapes=output_shapes, requests=requests)
            seen["dynamic"] = dynamic
            # each output filled so that request q's part tells itself apart: logits q, token 7 + q, pos 20 + q
            logits = mx.concatenate([mx.full((V,), float(q)) for q in range(n)])
            words = lambda base: mx.array([base + q if w == 0 else 0 for q in range(n) for w in range(4)])  # noqa: E731
            return [
                logits,
                words(7).astype(mx.uint32),
                words(20).astype(mx.int32),
                mx.zeros(output_shapes[3]),
                mx.zeros((2,), mx.uint64),
                *(inputs[i] + 1 for i in fin),
            ]

        return run

    monkeypatch.setattr(P, "kernel", built)
    monkeypatch.setattr(P, "sm_count", lambda: nb)
    out = P.decode_persistent_group(reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)
    names = P.INPUTS + [x for q in range(1, n) for x in P.other_inputs(q)[0]]
    got = dict(zip(names, seen["inputs"], strict=True))
    for q in range(n):
        token, pos, kc, vc, fence = reqs[q]
        for name, want in (("tok", token), ("pos", pos), ("kc", kc), ("vc", vc), ("fin", fence)):
            assert got[name + (str(q) if q else "")] is want, (name, q)
    assert got["sync_buf"] is sync and got["wqkv"] is dw.qkv and seen["requests"] == n
    t = seen["template"]
    assert t["NR"] == n and t["S"] == max(1, nb // (n * Hkv)) and not t["FOLD"]
    # a group's staged vectors, after the ring; with tiles (8 requests) a float4 of padding each and the tiles'
    # parts (8 warps' 2 x 128 floats)
    xs = max(D, Hq * Dh, F)
    staged = 0 if n < 3 else 4 * n * xs if n < 8 else 4 * n * (xs + 4) + 4 * 8 * 2 * 128
    assert t["NST"] == (3 if n == 8 else P.KV_STAGES)  # eight of 3,072 floats leave room for three stages
    assert seen["dynamic"] == P.ring_bytes(Dh, P.KV_GROUP, t["NST"]) + staged  # a pair's: the ring's alone
    assert seen["shapes"][:3] == [(n * V,), (4 * n,), (4 * n,)] and seen["shapes"][5:] == [r[4].shape for r in reqs]
    for q, (logits, tok, next_pos, ks, vs, fence) in enumerate(out):
        assert ks == [] and vs == []  # stored in place by the kernel
        assert logits.shape == (V,) and logits.tolist() == [float(q)] * V
        assert tok.item() == 7 + q and next_pos.tolist() == [20 + q]
        assert fence.tolist() == (reqs[q][4] + 1).tolist()
    with pytest.raises(ValueError, match="fold=True: .* not several"):
        P.decode_persistent_group(reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6, fold=True)
    monkeypatch.setenv(P.FOLD_ENV, "1")  # the switch folds single launches; a group runs unfolded
    P.decode_persistent_group(reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)
    assert not seen["template"]["FOLD"]
    assert not t["LATE"]  # weights requested before each barrier unless asked otherwise
    monkeypatch.setenv(P.LOAD_ENV, "late")
    P.decode_persistent_group(reqs, dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)
    assert seen["template"]["LATE"]
    odd = (*reqs[-1][:2], mx.zeros((L, Hkv, cap + 1, Dh)), *reqs[-1][3:])
    with pytest.raises(ValueError, match="one shape"):
        P.decode_persistent_group([*reqs[:-1], odd], dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)
    with pytest.raises(ValueError, match="9 requests: a launch decodes 1 to 8"):
        P.decode_persistent_group(reqs + reqs[:1] * (9 - n), dw, sync, heads=Hq, kv_heads=Hkv, eps=1e-6)


def test_the_pairs_twin_is_each_requests_twin(tiny):
    """decode_persistent_group_ops, check-kernels' oracle for a pair (and a group), is decode_persistent_ops per
    request."""
    m = Qwen3(tiny, decode="kernels")
    dw, c = m.stacked_decode_weights(), tiny.config
    caches = [m.new_cache(16) for _ in range(2)]
    reqs = [
        (mx.array(3 + q, mx.uint32), mx.array([2 + q], mx.int32), x.k_all, x.v_all, x.written)
        for q, x in enumerate(caches)
    ]
    pair = K.decode_persistent_group_ops(reqs, dw, **_kw(c))
    for r, got in zip(reqs, pair, strict=True):
        want = K.decode_persistent_ops(r[0], r[1], dw, *r[2:], **_kw(c))
        assert mx.array_equal(got[0], want[0]).item() and got[1].item() == want[1].item()


def test_a_groups_sync_buffer_is_named_by_its_mailboxes_and_the_latest_are_kept(monkeypatch, tiny):
    """A launch of several decodes gets the sync buffer naming its caches' mailboxes (the buffer holds nothing
    else that differs between groups), made once and reused by the same group; a serving run's groups change
    as requests come and go, so only the SYNCS_KEPT latest are kept: an older group's is made again, naming
    the same mailboxes."""
    from pdlib.engine import model as model_module

    seen = []

    def group_like(reqs, dw, sync, **kw):  # the kernel's contract on the CPU (test_two_decodes_...)
        seen.append(sync)
        return [(*K.decode_persistent_ops(t, p, dw, k, v, w, **kw)[:5], w + 1) for t, p, k, v, w in reqs]

    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(P, "decode_persistent_group", group_like)
    monkeypatch.setattr(model_module, "SYNCS_KEPT", 3)
    monkeypatch.setenv("PDLIB_TOKEN_READ", "item")
    m = Qwen3(tiny, decode="persistent")
    caches = [m.new_cache(16) for _ in range(6)]
    monkeypatch.setattr(m, "_box_address", lambda cache: 1000 + caches.index(cache))

    def launch(*qs):
        m.decode_group([caches[q] for q in qs], [mx.array(3 + q, mx.uint32) for q in qs])
        return seen[-1]

    first = launch(0, 1)
    assert launch(0, 1, 2) is not first and launch(0, 1) is first  # the same group: the same buffer
    assert first[:5].tolist() == [1000, 0, 1001, 0, 0]  # its mailboxes, low word first
    for qs in ((2, 3), (3, 4), (4, 5)):  # three newer groups: (0, 1)'s is no longer kept
        launch(*qs)
    again = launch(0, 1)
    assert again is not first and again[:5].tolist() == first[:5].tolist() and len(m._pair_syncs) == 3

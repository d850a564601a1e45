"""A step's decode rows attended at once (engine/rows.py, kernels/decode_rows.py): every row gets bit for bit what
it gets attended alone, in a round of decodes and beside a prompt chunk; which steps take the path; a planted
mix-up of rows fails the serving gate; the pool's slots; the kernel text compiles for the H200 (NVRTC) and
type-checks as Metal. The kernel itself runs only on a GPU: check-kernels compares it with the single-row
kernel (tools/rows_check.py)."""

import shutil
import subprocess
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from kernel_text import NVRTC, STANDINS, Kernel, compile_sm90, wrapped

import pdlib.engine.rows as R
from pdlib.engine import Engine
from pdlib.engine.cache import KVPool
from pdlib.engine.kernels import decode_rows as D
from pdlib.engine.kernels.backend import PRELUDE, float_bits
from pdlib.errors import RunFailure
from pdlib.run.serve import run_serving
from pdlib.run.serve_gate import TokenMismatch
from pdlib.workload import Workload

LENGTHS = (20, 33, 47, 12, 29)


def engine_with_rows(tiny, monkeypatch, *, rows: bool) -> Engine:
    """An engine whose ragged steps take the rows path (`rows`) or attend every decode row alone."""
    monkeypatch.setenv("PDLIB_DECODE_ROUND", "step")
    if not rows:
        monkeypatch.setattr(R.DecodeRows, "of", classmethod(lambda cls, *a: None))
    e = Engine(tiny, capacity=120, slots=len(LENGTHS) + 1)
    for i, n in enumerate(LENGTHS):
        e.add_request(f"r{i}", [(j * 31 + i * 7) % tiny.config.vocab_size for j in range(n)])
        e.prefill_chunk(f"r{i}", n).observe()
    e.add_request("p", [(j * 13 + 5) % tiny.config.vocab_size for j in range(40)])
    return e


def run_steps(e: Engine) -> list:
    """Rounds of five decodes, a step of three decodes beside a prompt chunk, then rounds again."""
    seen = []
    rounds = [[(f"r{i}", None) for i in range(len(LENGTHS))]] * 3
    mixed = [("r0", None), ("p", 24), ("r2", None), ("r4", None)]
    for parts in [*rounds, mixed, *rounds]:
        seen += [(o.observe(), o.logits) for o in e.batch(parts) if o is not None]
    mx.eval([lg for _, lg in seen])
    return seen


def test_rows_at_once_give_each_row_bit_for_bit_what_it_gets_alone(tiny, monkeypatch):
    calls = []
    real = R.DecodeRows.attend
    monkeypatch.setattr(R.DecodeRows, "attend", lambda self, *a, **k: calls.append(len(self.js)) or real(self, *a, **k))
    together = run_steps(e1 := engine_with_rows(tiny, monkeypatch, rows=True))
    assert set(calls) == {5, 3}  # the rounds and the mixed step's three decodes went through the rows path
    monkeypatch.undo()
    apart = run_steps(e2 := engine_with_rows(tiny, monkeypatch, rows=False))
    assert [t for t, _ in together] == [t for t, _ in apart]
    assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(together, apart))
    for i, n in enumerate(LENGTHS):  # every row's slots, written at its own positions
        assert mx.array_equal(e1.kv(f"r{i}", 0, n + 7), e2.kv(f"r{i}", 0, n + 7)).item()


@pytest.mark.parametrize(
    "parts", [[("r0", None), ("r1", None), ("p", 1)], [("p", 1), ("r3", None), ("r4", None)], [("p", 1), ("r0", None)]]
)
def test_a_one_token_chunk_short_of_its_prompts_end_beside_decodes(tiny, monkeypatch, parts):
    """A one-row segment that emits nothing is attended with the rows but pruned from the last layer."""
    seen = []
    for rows in (True, False):
        e = engine_with_rows(tiny, monkeypatch, rows=rows)
        outs = [e.batch(parts) for _ in range(3)]
        seen.append([[None if o is None else (o.observe(), o.logits) for o in out] for out in outs])
        monkeypatch.undo()
    for a, b in zip(*seen):
        assert [x is None for x in a] == [y is None for y in b]
        assert all(mx.array_equal(x[1], y[1]).item() and x[0] == y[0] for x, y in zip(a, b) if x is not None)


def test_the_output_takes_each_run_of_consecutive_rows_as_one_slice():
    rows = {0: 0, 2: 1, 3: 2, 4: 3, 6: 4}  # segments 0, 2, 3, 4, 6 are decode rows 0-4
    assert R.output_pieces(rows, range(7)) == [slice(0, 1), 1, slice(1, 4), 5, slice(4, 5)]
    assert R.output_pieces(rows, [2, 3, 6]) == [slice(1, 3), slice(4, 5)]  # the last layer's emitting ones
    assert R.output_pieces({1: 0, 2: 1}, [0, 1, 2]) == [0, slice(0, 2)]  # a chunk, then every row at once
    assert R.output_pieces({}, [0, 1]) == [0, 1]


def test_a_joined_fence_waits_on_every_row_and_keeps_the_least_count():
    a, b = mx.array([5, 0, 0, 0], mx.uint32), mx.array([0, 0, 0, 0], mx.uint32)
    assert D.joined_fence([a, a]) is a
    assert D.joined_fence([a, b, a]).tolist() == [0, 0, 0, 0]  # a poisoned writer's zero carries on
    assert D.joined_fence([a, b + 7]).tolist() == [5, 0, 0, 0]


def fake_step(pools: list, sizes: list[int], pooled: bool = True):
    caches = [SimpleNamespace(pooled=pooled, pool=q, slot=10 + i) for i, q in enumerate(pools)]
    segments, start = [], 0
    for c, n in zip(caches, sizes):
        segments.append(SimpleNamespace(cache=c, start=100 + start, size=n, emits=True))
        start += n
    offsets = list(np.cumsum([0, *sizes]))
    return segments, [int(o) for o in offsets], mx.arange(sum(sizes))


def test_which_steps_take_the_rows_path(monkeypatch):
    pool, other = object(), object()
    segs, offs, pos = fake_step([pool] * 3, [1, 5, 1])
    monkeypatch.setattr(R, "available", lambda head_dim: False)  # the CPU: the twin
    assert R.DecodeRows.of(segs[:2], offs[:3], pos, 16) is None  # one decode row: attended alone
    rows = R.DecodeRows.of(segs, offs, pos, 16)
    assert rows.js == [0, 2] and not rows.kernel and not rows.whole and rows.rows == [(0, 100), (6, 106)]
    monkeypatch.setattr(R, "available", lambda head_dim: True)  # where the kernel runs
    rows = R.DecodeRows.of(segs, offs, pos, 128)
    assert rows.kernel and rows.meta.tolist() == [[0, 10, 100], [6, 12, 106]]
    for available in (False, True):  # rows whose caches are not in one pool go row by row everywhere
        monkeypatch.setattr(R, "available", lambda head_dim, a=available: a)
        for pools in ([pool, other], [None, None], [pool, None]):
            segs, offs, pos = fake_step(pools, [1, 1])
            assert R.DecodeRows.of(segs, offs, pos, 128) is None, pools
    segs, offs, pos = fake_step([pool] * 4, [1] * 4)
    assert R.DecodeRows.of(segs, offs, pos, 128).whole
    segs[1].emits = False  # a one-token chunk short of its prompt's end: attended with the rows, not emitting
    rows = R.DecodeRows.of(segs, offs, pos, 128)
    assert rows.js == [0, 1, 2, 3] and not rows.whole


def test_a_planted_row_mix_up_fails_the_serving_gate(tiny, monkeypatch):
    """Each row attends with its neighbour's q|k|v at its own position: the gate must stop the run."""
    monkeypatch.setenv("PDLIB_DECODE_ROUND", "step")
    real = D.decode_rows_ops

    def mixed_up(qkv, rows, *a, **k):
        return real(qkv, [(rows[(i + 1) % len(rows)][0], p) for i, (_, p) in enumerate(rows)], *a, **k)

    monkeypatch.setattr(R, "decode_rows_ops", mixed_up)
    ms = 1_000_000
    w = Workload("rows", np.array([0, 0, 0, ms]), np.array([16, 24, 20, 12]), np.array([8, 6, 7, 5]))
    with pytest.raises((TokenMismatch, RunFailure)):
        run_serving(tiny, w, policy="eager", chunk_size=16, replay=4)
    monkeypatch.setattr(R, "decode_rows_ops", real)
    report = run_serving(tiny, w, policy="eager", chunk_size=16, replay=4)  # the same run, unplanted, passes
    assert report["runs"][0]["replay"]["passed"]


def test_a_pool_hands_out_its_lowest_free_slot_and_takes_it_back(tiny):
    pool = KVPool(slots=3, layers=2, kv_heads=2, head_dim=16, capacity=8)
    a, b, c = pool.cache(), pool.cache(), pool.cache()
    assert [a.slot, b.slot, c.slot] == [0, 1, 2] and pool.free == []
    with pytest.raises(RuntimeError, match="every one of the pool's 3 cache slots is taken"):
        pool.cache()
    b.written = mx.array([9, 0, 0, 0], mx.uint32)  # its last write's fence
    pool.give_back(b)
    with pytest.raises(ValueError, match="slot 1 is not one of this pool's taken slots"):
        pool.give_back(b)
    again = pool.cache()
    assert again.slot == 1 and again.written is b.written  # the slot's next writes wait on the last owner's
    e = Engine(tiny, capacity=16, slots=2)
    e.add_request("x", [1, 2, 3])
    e.add_request("x", [4, 5])  # the same name again: its old slot is given back first
    e.add_request("y", [6])
    assert sorted(r.cache.slot for r in e.requests.values()) == [0, 1]
    e.clear_requests()
    assert e.pool.free == [0, 1] and not e.requests


def rows_kernels() -> list[Kernel]:
    inst = dict(
        HQ=16, HKV=8, DH=128, CAP=8192, LAYERS=28, NC=64, CHUNK=128, THREADS=256, GROUP=8, EPS_BITS=float_bits(1e-6)
    )
    inst["SCALE_BITS"] = float_bits(128**-0.5)
    partial = Kernel(
        "decode_rows_partial",
        D.PARTIAL,
        [(n, "i32" if n in ("meta", "layer") else "u32" if n == "after" else "f32") for n in D.INPUTS],
        [("part_m", "f32"), ("part_l", "f32"), ("part_o", "f32"), ("written", "u32")],
        [inst],
        header=D.QK_NORM_ROPE,
    )
    reduce = Kernel(
        "decode_rows_reduce",
        D.REDUCE,
        [("part_m", "f32"), ("part_l", "f32"), ("part_o", "f32"), ("meta", "i32")],
        [("o", "f32")],
        [dict(HQ=16, NC=64, DH=128, CHUNK=128)],
    )
    return [partial, reduce]


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC (the nvidia-cuda-nvrtc wheel, Linux only)")
def test_the_cuda_source_compiles_for_the_h200():
    kernels = rows_kernels()
    text = STANDINS + PRELUDE["cuda"] + kernels[0].header + "".join(wrapped(k, "cuda", k.source) for k in kernels)
    log = compile_sm90(text)
    assert log.count("0 bytes spill stores, 0 bytes spill loads") == 2, log


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_the_metal_text_type_checks_against_standins(tmp_path):
    from test_kernel_sources import METAL_STANDINS

    kernels = rows_kernels()
    src = tmp_path / "decode_rows.cpp"
    src.write_text(
        METAL_STANDINS + PRELUDE["metal"] + kernels[0].header + "".join(wrapped(k, "metal", k.source) for k in kernels)
    )
    run = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-Wno-unused", str(src)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr

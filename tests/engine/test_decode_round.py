"""PDLIB_DECODE_ROUND: a step of three or more decodes as one launch each or as one ragged step. Both give every
row what it would get alone (logits within the gate's tolerance, the same tokens, the same K/V slots), and a
serving run in `step` mode passes the token gate and the full replay."""

import mlx.core as mx
import numpy as np
import pytest

from pdlib.engine import Engine
from pdlib.run.serve import run_serving
from pdlib.tolerance import tolerance_stats
from pdlib.workload import Workload

LENGTHS = (20, 33, 47, 12)


def engine_at(tiny, mode: str, monkeypatch) -> Engine:
    monkeypatch.setenv("PDLIB_DECODE_ROUND", mode)
    e = Engine(tiny, capacity=80)
    for i, n in enumerate(LENGTHS):
        e.add_request(f"r{i}", [(j * 31 + i * 7) % tiny.config.vocab_size for j in range(n)])
        e.reset(f"r{i}", logical=True)
        e.prefill_chunk(f"r{i}", n).token.item()
    return e


def engines_of(tiny, monkeypatch, n: int) -> tuple[Engine, Engine]:
    """A `step` engine and an `each` one, each holding the same n prefilled requests r0 ... r{n-1}."""
    launched, each = engine_at(tiny, "step", monkeypatch), engine_at(tiny, "each", monkeypatch)
    for e in (launched, each):
        for i in range(len(LENGTHS), n):
            e.add_request(f"r{i}", [(j * 17 + i) % tiny.config.vocab_size for j in range(10 + i)])
            e.prefill_chunk(f"r{i}", 10 + i).token.item()
    return launched, each


def record_launches(model, monkeypatch) -> list:
    """The CPU has no launch of several decodes: a stand-in runs one as its decodes and records its caches."""
    launches = []
    monkeypatch.setattr(model, "pairs", True)

    def launch(caches, tokens):
        launches.append(tuple(id(c) for c in caches))
        return [model.decode(c, t) for c, t in zip(caches, tokens)]

    monkeypatch.setattr(model, "decode_group", launch)
    return launches


def test_a_round_as_one_step_gives_each_row_what_it_gets_alone(tiny, monkeypatch):
    each, step = engine_at(tiny, "each", monkeypatch), engine_at(tiny, "step", monkeypatch)
    assert (each.decode_round, step.decode_round) == ("each", "step") and step.settings["decode_round"] == "step"
    parts = [(f"r{i}", None) for i in range(len(LENGTHS))]
    for _ in range(4):
        a, b = each.batch(parts), step.batch(parts)
        assert [o.observe() for o in a] == [o.observe() for o in b]
        for x, y in zip(a, b):
            worst = float(tolerance_stats(y.logits[None], x.logits[None])[1, 0])  # |x - ref| over the allowed
            assert worst <= 1.0
    for i, n in enumerate(LENGTHS):  # every row wrote its own slots, at its own positions
        kv_each, kv_step = each.kv(f"r{i}", n, n + 4), step.kv(f"r{i}", n, n + 4)
        assert float(mx.abs(kv_each - kv_step).max()) < 1e-4


def test_a_serving_run_in_step_mode_passes_the_gate_and_the_replay(tiny, monkeypatch):
    monkeypatch.setenv("PDLIB_DECODE_ROUND", "step")
    ms = 1_000_000
    w = Workload("round", np.array([0, ms, 2 * ms, 3 * ms]), np.array([16, 24, 20, 12]), np.array([8, 6, 7, 5]))
    report = run_serving(tiny, w, policy=["eager", "mixed"], chunk_size=16, replay=4)
    assert report["environment"]["decode_round"] == "step"
    for run in report["runs"]:
        assert all(r["check"]["status"] == "ok" for r in run["requests"]) and run["replay"]["passed"]
        assert any(len(s) >= 3 and all(n is None for _, n in s) for s in run["steps"]["work"])  # rounds of 3+


@pytest.mark.parametrize("bad", ["both", "1"])
def test_a_bad_mode_is_refused(tiny, monkeypatch, bad):
    from pdlib.errors import InputError

    monkeypatch.setenv("PDLIB_DECODE_ROUND", bad)
    with pytest.raises(InputError, match=f"PDLIB_DECODE_ROUND must be each or step or compiled, got '{bad}'"):
        Engine(tiny, capacity=8)


def test_a_round_of_up_to_round_pairs_rows_goes_out_two_by_two(tiny, monkeypatch):
    """PDLIB_ROUND_PAIRS=5: a round of 5 is two pair launches and the odd row alone, in order, each row's output
    its own; a round of 6 is past it and runs as PDLIB_DECODE_ROUND says. The CPU has no pair launch: a stand-in
    runs a pair as its two decodes and records each launch."""
    monkeypatch.setenv("PDLIB_ROUND_PAIRS", "5")
    paired, each = engines_of(tiny, monkeypatch, 6)
    launches = record_launches(paired.model, monkeypatch)
    key = {f"r{i}": id(paired.requests[f"r{i}"].cache) for i in range(6)}
    parts = [(f"r{i}", None) for i in range(5)]
    assert [o.observe() for o in paired.batch(parts)] == [o.observe() for o in each.batch(parts)]
    assert launches == [(key["r0"], key["r1"]), (key["r2"], key["r3"])]
    assert paired.settings["round_pairs"] == 5
    launches.clear()
    six = [(f"r{i}", None) for i in range(6)]
    for a, b in zip(paired.batch(six), each.batch(six)):  # one ragged step: no pair launch
        assert a.observe() == b.observe()
        assert float(tolerance_stats(a.logits[None], b.logits[None])[1, 0]) <= 1.0
    assert launches == []


def test_a_round_goes_out_in_groups_of_up_to_round_group_rows(tiny, monkeypatch):
    """PDLIB_ROUND_GROUP=3 with PDLIB_ROUND_PAIRS=7: a round of 7 is two launches of three and the last row alone,
    in order, each row's output its own; a round of 5, one of three and one of two; ROUND_GROUP past what the
    kernel fits (the model's `group`) is held to it. The CPU has no group launch: a stand-in runs a launch as its
    decodes and records it."""
    monkeypatch.setenv("PDLIB_ROUND_PAIRS", "7")
    monkeypatch.setenv("PDLIB_ROUND_GROUP", "3")
    grouped, each = engines_of(tiny, monkeypatch, 7)
    model = grouped.model
    launches = record_launches(model, monkeypatch)
    monkeypatch.setattr(model, "group", 8)
    key = [id(grouped.requests[f"r{i}"].cache) for i in range(7)]
    seven = [(f"r{i}", None) for i in range(7)]
    assert [o.observe() for o in grouped.batch(seven)] == [o.observe() for o in each.batch(seven)]
    assert launches == [tuple(key[0:3]), tuple(key[3:6])] and grouped.settings["round_group"] == 3
    launches.clear()
    five = [(f"r{i}", None) for i in range(5)]
    assert [o.observe() for o in grouped.batch(five)] == [o.observe() for o in each.batch(five)]
    assert launches == [tuple(key[0:3]), tuple(key[3:5])]
    launches.clear()
    monkeypatch.setattr(model, "group", 2)  # the kernel fits pairs only: ROUND_GROUP 3 runs pairs
    assert [o.observe() for o in grouped.batch(five)] == [o.observe() for o in each.batch(five)]
    assert launches == [tuple(key[0:2]), tuple(key[2:4])] and grouped.settings["round_group"] == 2


def test_a_bad_round_pairs_is_refused(tiny, monkeypatch):
    from pdlib.errors import InputError

    monkeypatch.setenv("PDLIB_ROUND_PAIRS", "0")
    with pytest.raises(InputError, match="PDLIB_ROUND_PAIRS must be a whole number >= 1, got '0'"):
        Engine(tiny, capacity=8)


def test_warm_groups_builds_each_launch_size_a_round_can_take_and_leaves_nothing_held(tiny, monkeypatch):
    """Engine.warm_groups (serve's warm_engine): one launch of each size from 3 up to the least of
    PDLIB_ROUND_GROUP, what the kernel fits, PDLIB_ROUND_PAIRS and the caches at once; its requests then give
    their pool slots back. Nothing where launches of several do not run (no pairs, or ROUND_GROUP 2)."""
    monkeypatch.setenv("PDLIB_ROUND_PAIRS", "8")
    monkeypatch.setenv("PDLIB_ROUND_GROUP", "5")
    e = Engine(tiny, capacity=32, slots=6)
    assert e.warm_groups(6) == []  # the CPU: no persistent kernel, no launches of several
    launches = []
    monkeypatch.setattr(e.model, "pairs", True)
    monkeypatch.setattr(e.model, "group", 8)
    monkeypatch.setattr(
        e.model,
        "decode_group",
        lambda caches, tokens: launches.append(len(caches)) or [e.model.decode(c, t) for c, t in zip(caches, tokens)],
    )
    free = len(e.pool.free)
    assert e.warm_groups(6) == [3, 4, 5] and launches == [3, 4, 5]
    assert e.requests == {} and len(e.pool.free) == free  # every slot back
    assert e.warm_groups(4) == [3, 4]  # four caches at once: no round of five
    e.round_group = 2
    assert e.warm_groups(6) == []

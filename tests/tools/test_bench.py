"""bench-step's pieces on the CPU with `tiny` (the command itself refuses the CPU): every engine reports the
same keys, the table prints them, and transformers' peer decodes the same greedy tokens as pdlib in FP32."""

import pytest

from pdlib.engine import Engine
from pdlib.report.bench import format_table
from pdlib.tools.bench import bench_step

SIZES = dict(contexts=(32, 48), tokens=3, warmup=1, prefill_tokens=40, chunk=16, repeats=1)
ROUNDS = dict(rounds=(1, 3), round_context=24)
KEYS = {"decode_ms_median", "decode_ms_all", "prefill_whole_s", "prefill_chunked_s", "prefill_chunked_synced_s"}
OURS = KEYS | {"decode_pipelined_ms_median"}  # pdlib's and mlx-lm's


def test_bench_step_measures_every_engine_alike_and_prints_them(tiny):
    result = bench_step(tiny, peers=False, log=lambda *a: None, **SIZES, **ROUNDS)
    assert set(result["engines"]) == {"pdlib", "mlx-lm"}
    for name, e in result["engines"].items():
        assert OURS <= set(e), name
        assert set(e["decode_ms_median"]) == set(e["decode_pipelined_ms_median"]) == {"32", "48"}
        assert all(len(v) == 3 for v in e["decode_ms_all"].values())
        assert all(e[k] > 0 for k in KEYS if k.endswith("_s")) and all(e["decode_pipelined_ms_median"].values())
    table = format_table(result).splitlines()
    assert "mlx-lm" in table[0] and len(table) == 1 + 2 + 2 + 3 + 2
    assert table[3].startswith("decode pipelined ms @ 32")
    assert table[-3].startswith("prefill chunked synced s")
    assert table[-1].startswith("round of 3 @ 24") and " each " in table[-1] and " step " in table[-1]
    r = result["rounds"]
    assert r["rows"] == [1, 3] and set(r["ms"]) == {"each", "step", "compiled", "pairs", "groups"}
    assert all(v > 0 for v in r["ms"]["step"].values())
    for mode, ms in r["host_ms"].items():  # the host's part of each round: some of it, never more
        assert all(0 < ms[n] <= r["ms"][mode][n] for n in ms), (mode, ms)
    assert ", host " in table[-1] and " / pipelined " in table[-1]
    for mode, ms in r["pipelined_ms"].items():  # each row count measured pipelined too
        assert set(ms) == {"1", "3"} and all(v > 0 for v in ms.values()), (mode, ms)
    # the floor: the weights once plus every row's K/V, so a row more adds one cache's bytes
    per_row = tiny.config.num_hidden_layers * tiny.config.num_key_value_heads * tiny.config.head_dim * 8 * 24
    assert r["bytes"]["3"] - r["bytes"]["1"] == 2 * per_row


def test_the_transformers_peer_decodes_pdlibs_tokens(tiny):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pdlib.tools.bench_hf import bench_hf

    ids = lambda n: [(i * 7919 + 13) % tiny.config.vocab_size for i in range(n)]  # noqa: E731
    r = bench_hf(tiny, dtype="float32", compile_decode=False, prompt=ids, **SIZES)
    assert KEYS <= set(r) and r["dtype"] == "float32" and not r["compiled"]
    engine = Engine(tiny, capacity=64)  # warmup 1 + 3 timed decodes: 5 greedy tokens
    engine.add_request("X", ids(32))
    engine.reset("X", logical=True)
    want = [engine.prefill_chunk("X", 32).token.item()] + [engine.decode("X").token.item() for _ in range(4)]
    assert r["greedy_tokens"]["32"] == want
    with pytest.raises(ValueError, match="dtype 'float16'"):
        bench_hf(tiny, dtype="float16", **SIZES)


def test_the_table_shows_each_peer_as_a_ratio_to_pdlib(tiny):
    e = {
        "decode_ms_median": {"32": 2.0},
        "prefill_whole_s": 0.1,
        "prefill_chunked_s": 0.2,
        "prefill_chunked_synced_s": 0.4,
    }
    peer = {**e, "decode_ms_median": {"32": 6.0}}
    result = {"engines": {"pdlib": e, "hf-bf16": peer}, "floors": {"32": {"bytes": 2e9, "floor_ms": 0.5}}}
    lines = format_table(result).splitlines()
    assert "hf-bf16" in lines[0]
    assert "3.0x" in lines[1] and " 1000 " in lines[1]  # 6 / 2 ms; 2 GB / 2 ms = 1000 GB/s
    # a measure the peer does not make shows dashes, not a ratio
    result["engines"]["pdlib"] = {**e, "decode_pipelined_ms_median": {"32": 1.0}}
    piped = format_table(result).splitlines()[2]
    assert piped.startswith("decode pipelined ms @ 32") and piped.split()[6:8] == ["-", "-"] and " 2000 " in piped
    # two requests' decodes in one launch: pdlib's alone, per step and per token
    result["engines"]["pdlib"]["pair_step_pipelined_ms_median"] = {"32": 3.0}
    pair = [line for line in format_table(result).splitlines() if line.startswith("pair")]
    assert len(pair) == 1 and pair[0].startswith("pair pipelined ms @ 32") and "(1.5 ms a token)" in pair[0]


def test_a_peer_that_fails_is_recorded_and_the_rest_kept(tiny, monkeypatch):
    from pdlib.tools import bench_hf

    def broken(model, **kw):
        raise RuntimeError("CUDA error: out of memory\nmore")

    monkeypatch.setattr(bench_hf, "bench_hf", broken)
    result = bench_step(tiny, peers=True, log=lambda *a: None, **SIZES, rounds=())
    assert result["engines"]["hf-fp32"] == {"error": "RuntimeError: CUDA error: out of memory"}
    assert "hf-bf16" not in format_table(result) and "pdlib" in format_table(result)


def test_the_partition_curve_compares_as_many_of_as_tokens_as_every_run_has():
    """A's tokens beside B's prefill may outnumber A's run alone: only the tokens both have are compared."""
    from pdlib.tools.partition_curve import same_prefix

    alone = [5, 6, 7, 8]
    assert same_prefix([[5, 6, 7, 8, 9, 10], [5, 6, 7]], alone) == (True, 3)
    assert same_prefix([[5, 6, 7, 8, 9, 10]], alone) == (True, 4)
    assert same_prefix([[5, 6, 0, 8, 9], [5, 6, 7, 8]], alone) == (False, 4)


def test_bench_steps_contexts_may_be_shorter_than_its_prompt(tiny):
    """The engine holds the whole prompt as well as every context's decodes (a prompt needs one more position)."""
    from pdlib.tools.bench import bench_pdlib

    out = bench_pdlib(tiny, contexts=[16], tokens=2, warmup=1, prefill_tokens=64, chunk=16, repeats=1)
    assert out

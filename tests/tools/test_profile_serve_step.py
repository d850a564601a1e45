"""Where a serving step's host time goes (pdlib/tools/profile_serve_step.py): on the CPU, with the tiny model,
every (dispatch, rows) step is timed with its host part and a profile of that part by function; the prompt is
rewound when its chunks run out; the CLI refuses bad sizes in one line."""

import mlx.core as mx
import pytest

from pdlib.tools.profile_serve_step import DISPATCHES, format_serve_steps, profile_serve_steps


def test_every_step_is_timed_with_its_host_part_and_the_functions_inside(tiny, monkeypatch):
    synced, sync = [], mx.synchronize
    monkeypatch.setattr(mx, "synchronize", lambda *a: synced.append(1) or sync(*a))
    result = profile_serve_steps(tiny, chunk=16, rows=(3, 0), context=24, steps=4)  # 2 x 7 chunks of a 40 prompt
    assert len(synced) == len(DISPATCHES) * 2 * (3 + 4 + 4)  # every step waited on, a silent chunk's too
    assert (result["chunk"], result["context"], result["steps"]) == (16, 24, 4)
    for dispatch in DISPATCHES:
        assert list(result[dispatch]) == ["0", "3"]
        for rec in result[dispatch].values():
            assert 0 < rec["host_ms"] <= rec["ms"] and rec["profiled_host_ms"] > 0
            prof = rec["profile"]
            assert 0 < len(prof) <= 25 and [f["own_ms"] for f in prof] == sorted(
                (f["own_ms"] for f in prof), reverse=True
            )
            assert all(f["cum_ms"] >= f["own_ms"] >= 0 and f["calls"] > 0 for f in prof)
    names = " ".join(f["function"] for rec in result["layers"].values() for f in rec["profile"])
    assert "pdlib/engine/__init__.py" in names and "(_layer_by_layer)" in names  # the layer dispatch's own loop
    text = format_serve_steps(result, top=2)
    assert len(text.splitlines()) == len(DISPATCHES) * 2 * 3 and "chunk 16 +  3 decode rows" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--chunk", "0"], "error: --chunk must be an integer >= 1, got 0"),
        (["--chunk", "8", "--rows", "-1"], "error: --rows must be an integer >= 0, got -1"),
        (
            ["--chunk", "8", "--rounds", "8"],
            "error: profile-step takes one of --rounds, --chunk and --groups, got --rounds and --chunk",
        ),
        (
            ["--chunk", "8", "--groups", "8"],
            "error: profile-step takes one of --rounds, --chunk and --groups, got --chunk and --groups",
        ),
        (["--groups", "0"], "error: --groups must be an integer >= 1, got 0"),
        (["--groups", "2", "9"], "error: --groups: a persistent launch decodes 1 to 8 requests, got 9"),
    ],
)
def test_the_cli_refuses_bad_sizes_in_one_line(argv, message, capsys):
    from pdlib.__main__ import main

    assert main(["profile-step", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [message]

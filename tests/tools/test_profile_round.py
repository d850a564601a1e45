"""Where a round of decodes' time goes (pdlib/tools/profile_round.py): on the CPU, with the tiny model, every part
is timed, the bytes are the weights' FP32 sizes (every matmul MLX's here) and each row's K/V, the host's part is
within the round; the CLI refuses a round the step mode does not take."""

import pytest

from pdlib.tools.profile_round import format_rounds, profile_rounds


def test_each_part_of_a_round_is_timed_with_what_it_reads(tiny):
    result = profile_rounds(tiny, [3], context=24, steps=2)
    rows = result["3"]
    c, L = tiny.config, tiny.config.num_hidden_layers
    assert list(rows) == [
        "round of 3, tokens observed",
        "round of 3, host (Engine.batch returns)",
        f"{L} x q|k|v projection, 3 rows",
        f"{L} x o_proj + MLP, 3 rows",
        f"{L} x attention over 3 rows' caches",
        "LM head, 3 rows",
    ]
    assert all(r["ms"] > 0 for r in rows.values())
    assert rows["round of 3, host (Engine.batch returns)"]["ms"] <= rows["round of 3, tokens observed"]["ms"]
    D, Dh = c.hidden_size, c.head_dim
    qkv = D * (c.num_attention_heads + 2 * c.num_key_value_heads) * Dh
    assert rows[f"{L} x q|k|v projection, 3 rows"]["bytes"] == L * qkv * 4
    mlp = c.num_attention_heads * Dh * D + D * 2 * c.intermediate_size + c.intermediate_size * D
    assert rows[f"{L} x o_proj + MLP, 3 rows"]["bytes"] == L * mlp * 4
    assert rows[f"{L} x attention over 3 rows' caches"]["bytes"] == 3 * L * c.num_key_value_heads * Dh * 8 * 24
    assert rows["LM head, 3 rows"]["bytes"] == c.vocab_size * D * 4
    text = format_rounds(result)
    assert len(text.splitlines()) == 6 and " GB/s" in text


def test_the_cli_refuses_a_round_under_three_in_one_line(capsys):
    from pdlib.__main__ import main

    assert main(["profile-step", "--rounds", "8", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --rounds must be an integer >= 3, got 2"]


@pytest.mark.parametrize("argv", [["--rounds"], ["--rounds", "x"]])
def test_argparse_refuses_a_malformed_round(argv, capsys):
    from pdlib.__main__ import main

    assert main(["profile-step", *argv]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error:")

"""partition-curve: refused off CUDA with one error line; its table says when a slice changed a token."""

from pdlib.__main__ import main
from pdlib.tools.partition_curve import format_rows


def test_partition_curve_is_refused_on_the_cpu_before_any_work(capsys, tmp_path):
    out = tmp_path / "curve.json"
    assert main(["partition-curve", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: partition-curve") and not out.exists()
    assert main(["partition-curve", "--sms", "-8"]) == 2
    assert "--sms must be an integer >= 0, got -8" in capsys.readouterr().err


def test_the_table_flags_a_changed_token_and_a_failed_row():
    both = {"a_max_gap_ms": 2.5, "b_ttft_s": 0.14, "a_tokens_match": True, "b_token_match": True}
    rows = [
        {"prompt": 4096, "k": "whole", "a_step_ms": 1.42, "b_prefill_s": 0.1},
        {"prompt": 4096, "k": 48, "a_step_ms": 1.6, "b_prefill_s": 0.13, "a_tokens_match": True, "together": both},
        {"prompt": 4096, "k": 32, "a_step_ms": 2.0, "a_tokens_match": False, "together_1": both},
        {"prompt": 4096, "k": 8, "error": "RuntimeError: a wait at a grid barrier timed out"},
    ]
    lines = format_rows({"rows": rows}).splitlines()
    assert lines[1].split()[-1] == "yes" and lines[2].split()[-1] == "yes"
    assert lines[3].split()[-1] == "NO"
    assert lines[4].endswith("error: RuntimeError: a wait at a grid barrier timed out")
    assert lines[2].split()[2:6] == ["1.6", "0.13", "2.5", "0.14"]

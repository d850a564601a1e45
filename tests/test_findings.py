"""analysis.findings: the prose reading of the medians says what the numbers say, and only that."""

import pytest
from reports import make_report, ms

from pdlib import analysis as an
from pdlib.errors import InputError

EAGER_A = ms(2500, 2520, 2540, 2560)                  # one 2.5 s stall while B prefills
EAGER_B = ms(2400, 2510, 2530, 2550, 2570)            # B's first token at 2.4 s
CHUNKED_A = ms(*range(140, 2661, 140))                # 140 ms gaps throughout
CHUNKED_B = ms(2500, 2550, 2600, 2620, 2640)          # B's first token later, makespan about the same
FIFO_A, FIFO_B = ms(20, 40, 60), ms(2600, 2620, 2640, 2660, 2680)


def read(policies, a, b, trials=2, **kw):
    metrics = an.metrics_frame(make_report(policies=policies, trials=trials, a_emits=a, b_emits=b))
    return an.findings(metrics, an.summary_frame(metrics), **kw), metrics


def test_eager_against_chunked_reads_the_tradeoff():
    text, _ = read(("eager", "chunked", "fifo"), {"eager": EAGER_A, "chunked": CHUNKED_A, "fifo": FIFO_A},
                         {"eager": EAGER_B, "chunked": CHUNKED_B, "fifo": FIFO_B})
    assert "eager's is 18x chunked's (2.50 s vs 140.0 ms)" in text     # 2500 / 140 = 17.9
    assert "falls during B's prefill in 2 of 2 eager trials" in text
    assert "chunked delays B's first token by 1.04x (2.50 s vs 2.40 s under eager)" in text
    assert "within 3.5% of each other (chunked 2.66 s, eager 2.57 s)" in text
    assert "trades one long stall for many short ones" in text and "not a throughput win" in text
    assert "- **fifo:** A's worst gap 20.0 ms, B's first token at 2.60 s (1.08x eager's), makespan 2.68 s." in text
    # chunked's 140 ms steps are each over the 100 ms threshold: many short stalls instead of one long one
    assert "longer than 100 ms (median per trial): eager 1, chunked 19, fifo 0" in text
    assert "(eager 2, chunked 2, fifo 2)" in text


def test_numbers_are_medians_over_trials():
    # Trials 1..3 give eager stalls of 1, 2 and 3 s: the reading quotes the median, 2 s.
    a = lambda policy, t: ms(1000 * t, 1000 * t + 20) if policy == "eager" else ms(100, 200, 300)  # noqa: E731
    text, _ = read(("eager", "chunked"), a, ms(50, 400), trials=3)
    assert "eager's is 20x chunked's (2.00 s vs 100.0 ms)" in text


def test_no_halving_is_said_plainly():
    text, _ = read(("eager", "chunked"), ms(100, 200, 300), ms(50, 400))
    assert "chunked does not halve A's worst gap here (100.0 ms vs 100.0 ms under eager)." in text
    assert "trades" not in text


def test_other_policy_names_and_a_single_policy():
    text, _ = read(("fifo", "eager"), {"fifo": FIFO_A, "eager": EAGER_A}, {"fifo": FIFO_B, "eager": EAGER_B})
    assert "fifo's is 125x eager's" not in text and "eager's is 125x fifo's (2.50 s vs 20.0 ms)" in text
    text, _ = read(("eager",), EAGER_A, EAGER_B, stall_threshold_ms=50)
    assert text.splitlines()[0].startswith("- **eager:** A's worst gap 2.50 s, B's first token at 2.40 s,")
    assert "longer than 50 ms (median per trial): eager 1." in text


def test_empty_summary_is_an_input_error():
    metrics = an.metrics_frame(make_report())
    with pytest.raises(InputError, match="summary is empty"):
        an.findings(metrics, an.summary_frame(metrics).iloc[:0])

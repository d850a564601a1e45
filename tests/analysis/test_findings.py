"""analysis.findings: the prose says what the paired ratios' CIs say, and only that: a CI that spans 1 is
'no measurable difference', a median alone is quoted as too few trials for a CI."""

import pytest
from reports import make_report, ms

from pdlib.analysis import findings
from pdlib.analysis import frames as an

EAGER_A = ms(2500, 2520, 2540, 2560)  # one 2.5 s stall while B prefills
EAGER_B = ms(2400, 2510, 2530, 2550, 2570)  # B's first token at 2.4 s
CHUNKED_A = ms(*range(140, 2521, 140))  # 140 ms gaps throughout
FIFO_A, FIFO_B = ms(20, 40, 60), ms(2600, 2620, 2640, 2660, 2680)


def chunked_b(trial):
    """B's first token later than eager's; its last token (the makespan) on both sides of eager's by trial."""
    end = 2570 + (-60, 40, -20, 80, -40, 30)[trial - 1]
    return ms(2500, 2502, 2504, end - 1, end)


def read(policies, a, b, trials=2, **kw):
    metrics = an.metrics_frame(make_report(policies=policies, trials=trials, a_emits=a, b_emits=b))
    return findings.findings(metrics, an.summary_frame(metrics), **kw), metrics


def pick(spec):
    return lambda policy, trial: spec[policy](trial) if callable(spec[policy]) else spec[policy]


A = {"eager": EAGER_A, "chunked": CHUNKED_A, "fifo": FIFO_A}
B = {"eager": EAGER_B, "chunked": chunked_b, "fifo": FIFO_B}


def test_with_cis_a_span_over_1_is_no_measurable_difference():
    text, metrics = read(("eager", "chunked", "fifo"), pick(A), pick(B), trials=6)
    _, ratios = an.paired_ratios(metrics, numerator="eager", denominator="chunked")
    span = ratios.set_index("metric").loc["makespan_ms"]
    assert span.ci_low < 1 < span.ci_high  # the data: makespans within noise
    assert (
        f"- **Makespan:** no measurable difference (eager/chunked {span.median_ratio:.3g}, 95% CI "
        f"[{span.ci_low:.3g}, {span.ci_high:.3g}];" in text
    )
    # identical trials: A's worst gap ratio has a zero-width CI at 2500/140 = 17.9, quoted as the table has it
    assert (
        "- **A's worst gap:** eager's is 18x chunked's (eager/chunked 17.9, 95% CI [17.9, 17.9]; "
        "medians eager 2.50 s, chunked 140.0 ms)." in text
    )
    assert "It falls during B's prefill in 6 of 6 eager trials." in text
    assert "- **B's first token:** chunked's is 1.04x eager's (eager/chunked 0.96, 95% CI [0.96, 0.96];" in text
    assert "trades one long stall for many short ones" in text
    assert "makespans show no measurable difference: it is not a throughput win" in text
    assert (
        "- **fifo:** A's worst gap 20.0 ms, B's first token at 2.60 s (1.08x eager's), makespan 2.68 s (medians)."
        in text
    )
    assert "longer than 100 ms (median per trial): eager 1, chunked 18, fifo 0" in text


def test_a_measurable_makespan_difference_is_said_with_its_ci():
    slow = lambda trial: ms(2500, 2550, 2600, 2990 + trial, 3000 + trial)  # noqa: E731 - always later
    text, _ = read(("eager", "chunked"), pick(A), pick({"eager": EAGER_B, "chunked": slow}), trials=5)
    assert "chunked's makespan is measurably longer (eager/chunked 0.8" in text
    assert "no measurable difference: it is not a throughput win" not in text


def test_too_few_trials_for_a_ci_says_so_and_claims_no_makespan_verdict():
    text, _ = read(("eager", "chunked"), pick(A), pick(B), trials=2)
    assert "2 paired trials, too few for a CI" in text
    assert "no measurable difference" not in text and "not a throughput win" not in text
    assert "whether the makespan differs is not measured" in text


def test_numbers_are_medians_and_paired_ratios_over_trials():
    # Trials 1..3 give eager stalls of 1, 2 and 3 s against 100 ms: the paired ratios are 10, 20, 30.
    a = lambda policy, t: ms(1000 * t, 1000 * t + 20) if policy == "eager" else ms(100, 200, 300)  # noqa: E731
    text, _ = read(("eager", "chunked"), a, ms(50, 400), trials=3)
    assert (
        "eager's is 20x chunked's (eager/chunked 20, 3 paired trials, too few for a CI; "
        "medians eager 2.00 s, chunked 100.0 ms)" in text
    )


def test_no_halving_is_said_plainly():
    text, _ = read(("eager", "chunked"), ms(100, 200, 300), ms(50, 400))
    assert "chunked does not measurably halve A's worst gap here (100.0 ms vs 100.0 ms under eager)." in text
    assert "trades" not in text


def test_other_policy_names_and_a_single_policy():
    text, _ = read(("fifo", "eager"), {"fifo": FIFO_A, "eager": EAGER_A}, {"fifo": FIFO_B, "eager": EAGER_B})
    assert "eager's is 125x fifo's (fifo/eager 0.008" in text
    text, _ = read(("eager",), EAGER_A, EAGER_B, stall_threshold_ms=50)
    assert text.splitlines()[0].startswith("- **eager:** A's worst gap 2.50 s, B's first token at 2.40 s,")
    assert "longer than 50 ms (median per trial): eager 1." in text


def test_empty_summary_is_a_programming_error():
    metrics = an.metrics_frame(make_report())
    with pytest.raises(ValueError, match="summary is empty") as err:
        findings.findings(metrics, an.summary_frame(metrics).iloc[:0])
    assert type(err.value) is ValueError


def test_every_other_policy_is_read_against_chunked_paired():
    text, metrics = read(("eager", "chunked", "fifo"), pick(A), pick(B), trials=6)
    _, ratios = an.paired_ratios(metrics, numerator="fifo", denominator="chunked")
    gap = ratios.set_index("metric").loc["a_gap_max_ms"]
    assert gap.ci_high < 1  # fifo's 20 ms against chunked's 140 ms, in every trial
    assert (
        f"Against chunked, paired: A's worst gap fifo/chunked {gap.median_ratio:.3g} "
        f"(95% CI [{gap.ci_low:.3g}, {gap.ci_high:.3g}]);"
    ) in text
    assert "makespan no measurable difference (fifo/chunked" in text or "makespan fifo/chunked" in text
    text, _ = read(("eager", "chunked", "fifo"), pick(A), pick(B), trials=2)
    assert "B's first token fifo/chunked" in text and "too few for a CI" in text

"""profile-step --groups: a persistent launch's stamps read back phase by phase (the launch itself needs CUDA)."""

import numpy as np
import pytest

from pdlib.engine.kernels.persistent_decode import STAMPS_PER_LAYER as M
from pdlib.tools.profile_group import LAST, PHASES, SPANS, STAGING, format_groups, medians, phase_us


def stamps(layers: int, cycles: list[int], ns_per_cycle: float = 0.5) -> np.ndarray:
    """A launch's stamps from block 0's clock at its M L + 2 marks and the kernel's start (last), the globaltimer
    running at `ns_per_cycle` from 1,000 ns."""
    assert len(cycles) == M * layers + 3
    cyc = np.array(cycles, dtype=np.int64)
    ns = 1000 + ((cyc - cyc[-1]) * ns_per_cycle).astype(np.int64)
    return np.concatenate([ns, cyc]).astype(np.uint64)


def test_each_phase_is_its_cycles_per_layer_at_the_launchs_clock_rate():
    # two layers: the gap after mark i of layer l lasts (i + 1) * 10 * (l + 1) cycles; the kernel starts 40 before
    marks, t = [], 100
    for layer in range(2):
        for i in range(M):
            marks.append(t)
            t += (i + 1) * 10 * (layer + 1)
    lm = [t, t + 500]  # the last layer's barrier 5 ends where the LM head starts
    s = stamps(2, [*marks, *lm, 60], ns_per_cycle=0.5)
    got = phase_us(s, 2)

    def gaps(a, b):  # marks a to b: gaps a .. b - 1, a mean of 1x and 2x, 0.5 ns a cycle
        return sum((i + 1) * 10 * 1.5 * 0.5 / 1e3 for i in range(a, b))

    for name, a, b in SPANS + STAGING:
        assert got[name] == pytest.approx(gaps(a, b)), name
    assert got["q|k|v"] == pytest.approx(got["q|k|v staging"] + gaps(1, 2))  # a phase holds its staging
    assert got[LAST] == pytest.approx(gaps(M - 1, M))
    assert got["LM head"] == pytest.approx(500 * 0.5 / 1e3)
    assert got["prologue"] == pytest.approx(40 * 0.5 / 1e3)
    assert got["launch"] == pytest.approx((t + 500 - 60) * 0.5 / 1e3, abs=1e-3)


def test_stamps_out_of_order_or_of_another_shape_are_refused():
    marks = list(range(100, 100 + 10 * (M + 2), 10))  # one layer's M marks and the LM head's 2, then the start
    s = stamps(1, [*marks, 50])
    phase_us(s, 1)  # in order, it reads
    bad = s.copy()
    bad[M + 3 + 5], bad[M + 3 + 6] = bad[M + 3 + 6], bad[M + 3 + 5]  # o_proj staged before it starts
    with pytest.raises(ValueError, match="out of order"):
        phase_us(bad, 1)
    with pytest.raises(
        ValueError, match=f"stamps of 2 layers hold {2 * (2 * M + 3)} words, got shape \\({2 * (M + 3)},\\)"
    ):
        phase_us(s, 2)


def test_medians_and_the_table_name_every_phase_and_request_count():
    staging = [name for name, _, _ in STAGING]
    a = {k: 1.0 for k in [*PHASES, LAST, *staging, "LM head", "prologue", "launch"]}
    b = {**a, "launch": 3.0}
    c = {**a, "launch": 2.0}
    m = medians([a, b, c])
    assert m["launch"] == 2.0 and m["down"] == 1.0
    text = format_groups({"groups": {1: a, 8: {**a, "launch": 4.0}}})
    lines = text.splitlines()
    assert lines[0].split()[-4:] == ["1", "req", "8", "req"]
    assert lines[-1].split() == ["launch", "/", "1", "req", "1.00", "4.00"]  # each launch against the first column's
    assert [line.split("  ")[0].strip() for line in lines[1:-1]] == [
        *PHASES,
        LAST,
        *staging,
        "LM head",
        "prologue",
        "launch",
    ]

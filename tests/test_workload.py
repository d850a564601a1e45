"""Workloads: the shipped Azure traces, exact timestamps, windows, rate multiplier, clipping, Poisson arrivals,
the pair, bad input refused, and distinct prompts of exact lengths."""

import gzip
import hashlib
import json

import numpy as np
import pytest

from pdlib.errors import InputError
from pdlib.prompts import byte_tokens, load_corpus, make_prompts, render, token_ids_sha256
from pdlib.traces import HEADER, load_trace, parse_trace, trace_path
from pdlib.workload import Workload, clip_lengths, iter_prompts, workload_prompts

S = 10**9


def _trace(rows, name="hand"):
    """A trace from (timestamp, prompt, output) rows, CRLF like the Azure files."""
    return parse_trace("\r\n".join([HEADER] + [f"{t},{p},{o}" for t, p, o in rows]), name=name)


# Arrivals 0, 0.1, 1.0, 1.5, 2.0, 3.25, 10.0000001 s after the first; lengths chosen to trip each limit.
HAND = _trace(
    [
        ("2023-11-16 18:00:00.0000000", 100, 10),
        ("2023-11-16 18:00:00.1000000", 5000, 0),
        ("2023-11-16 18:00:01.0000000", 300, 2000),
        ("2023-11-16 18:00:01.5000000", 3000, 1500),
        ("2023-11-16 18:00:02.0000000", 8000, 5),
        ("2023-11-16 18:00:03.2500000", 50, 0),
        ("2023-11-16 18:00:10.0000001", 7, 3),
    ]
)


# ---- the shipped traces ----

# SHA-256 of the upstream CSVs, computed from `git -C /work/.mirror/Azure+AzurePublicDataset/repo show
# HEAD:data/AzureLLMInferenceTrace_{code,conv}.csv | sha256sum` at commit b469a113cedca53ddc3bdea71a143dc4b7d8700c.
UPSTREAM_SHA256 = {
    "code": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "conv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
}


@pytest.mark.parametrize("name", ["code", "conv"])
def test_shipped_files_are_the_upstream_csvs_and_carry_their_attribution(name):
    gz = trace_path(name).read_bytes()
    assert gz[4:8] == b"\0\0\0\0"  # gzip mtime 0: the archive is the same on every rebuild
    assert hashlib.sha256(gzip.decompress(gz)).hexdigest() == UPSTREAM_SHA256[name]
    attribution = (trace_path(name).parent / "ATTRIBUTION.md").read_text()
    for needed in ("CC-BY-4.0", "creativecommons.org/licenses/by/4.0", "Splitwise", UPSTREAM_SHA256[name]):
        assert needed in attribution


# Measured on the shipped files (numpy's linear percentiles); the figures are these, rounded.
KNOWN = {
    "code": dict(
        n=8819,
        last_ns=3_435_948_056_000,
        start="2023-11-16 18:17:03.9799600",
        prompt={"p50": 1469.0, "p90": 5187.6, "max": 7437, "total": 18_059_974},
        output={"p50": 13.0, "p90": 55.0, "max": 1899, "total": 245_896},
        min_output=6,
    ),
    "conv": dict(
        n=19366,
        last_ns=3_501_721_937_000,
        start="2023-11-16 18:15:46.6805900",
        prompt={"p50": 1020.0, "p90": 2734.5, "max": 14050, "total": 22_361_870},
        output={"p50": 129.0, "p90": 424.0, "max": 1000, "total": 4_088_665},
        min_output=7,
    ),
}


@pytest.mark.parametrize("name", ["code", "conv"])
def test_shipped_traces_parse_to_their_known_statistics(name):
    k, t = KNOWN[name], load_trace(name)
    assert (t.n, int(t.arrival_ns[-1]), t.start) == (k["n"], k["last_ns"], k["start"])
    assert t.arrival_ns[0] == 0 and (np.diff(t.arrival_ns) > 0).all()
    assert int(t.output_tokens.min()) == k["min_output"]  # no output of 0 to raise
    d = Workload.from_params({"source": f"azure-{name}"}).to_dict()
    assert (d["requests"], d["trace_requests"], d["duration_s"]) == (k["n"], k["n"], k["last_ns"] / S)
    assert d["prompt_tokens"] == k["prompt"] and d["output_tokens"] == k["output"]
    assert d["clipped"] == {"prompt": 0, "output": 0, "output_raised": 0}


# ---- parsing ----


def test_timestamps_parse_exactly_to_the_nanosecond():
    t = _trace(
        [
            ("2023-11-16 23:59:59.9999999", 1, 1),
            ("2023-11-17 00:00:00.0000001", 1, 1),  # across midnight: 200 ns later
            ("2023-11-17 00:00:00.000000301", 1, 1),  # 9 digits
            ("2023-11-17 00:00:01", 1, 1),  # none
            ("2023-11-17 03:25:45.1234567", 1, 1),
        ]
    )
    midnight = 100  # ns after the first request
    hms = (3 * 3600 + 25 * 60 + 45) * S
    assert t.arrival_ns.tolist() == [0, 200, 401, midnight + S, midnight + hms + 123_456_700]
    assert t.arrival_ns.dtype == np.int64 and not t.arrival_ns.flags.writeable


@pytest.mark.parametrize(
    "text, message",
    [
        ("ts,p,o\n2023-11-16 00:00:00,1,1", "expected the header"),
        (f"{HEADER}\n2023-11-16 00:00:00,1", "line 2: '2023-11-16 00:00:00,1' is not"),
        (f"{HEADER}\n2023-11-16 00:00:00,1,-1", "is not"),
        (f"{HEADER}\n2023-02-30 00:00:00,1,1", "line 2: '2023-02-30' is not a calendar date"),
        (f"{HEADER}\n2023-11-16 24:00:00,1,1", "not a time of day"),
        (f"{HEADER}\n2023-11-16 00:00:01,1,1\r\n2023-11-16 00:00:00.9,1,1", "line 3: timestamp goes back"),
        (f"{HEADER}\n2023-11-16 00:00:00,0,1", "line 2: prompt of 0 tokens"),
        (f"{HEADER}\r\n", "holds no request"),
    ],
)
def test_malformed_traces_are_refused_by_line(text, message):
    with pytest.raises(InputError, match=message):
        parse_trace(text)


# ---- window, rate multiplier, clipping ----


def test_first_k_and_time_windows_pick_exact_requests_and_restart_the_clock():
    w = Workload.from_trace(HAND, first=3)
    assert w.arrival_ns.tolist() == [0, S // 10, S] and w.prompt_tokens.tolist() == [100, 5000, 300]
    # [1.0, 3.25): 1.0 is in (closed start), 3.25 is out (open end); arrival 0 is the window's first request
    w = Workload.from_trace(HAND, window_s=[1, 3.25])
    assert w.arrival_ns.tolist() == [0, S // 2, S] and w.prompt_tokens.tolist() == [300, 3000, 8000]
    # 0.1 s is exactly 100,000,000 ns, so a window starting there holds the request at 0.1 s
    assert Workload.from_trace(HAND, window_s=[0.1, 0.2]).prompt_tokens.tolist() == [5000]
    w = Workload.from_trace(HAND, window_s=[0.5, 100], first=2)
    assert w.prompt_tokens.tolist() == [300, 3000] and w.options["first"] == 2
    assert w.options["window_s"] == [0.5, 100.0] and w.options["trace_requests"] == 7
    assert Workload.from_trace(HAND, window_s=[10.0000001, 11]).prompt_tokens.tolist() == [7]
    assert Workload.from_trace(HAND).n == 7


def test_rate_multiplier_divides_arrivals_and_rounds_to_the_nearest_ns():
    assert Workload.from_trace(HAND, rate_multiplier=2.0).arrival_ns.tolist() == [
        0,
        S // 20,
        S // 2,
        3 * S // 4,
        S,
        1_625_000_000,
        5_000_000_050,
    ]
    w = Workload.from_trace(HAND, rate_multiplier=3, window_s=[1, 2.5])
    assert w.arrival_ns.tolist() == [0, 166_666_667, 333_333_333]  # 0.5 s / 3 rounds up, 1 s / 3 down
    w = Workload.from_trace(HAND, rate_multiplier=0.5, first=2)
    assert w.arrival_ns.tolist() == [0, S // 5] and w.duration_s == 0.2


def test_pace_gives_a_window_the_whole_traces_mean_rate_and_keeps_its_gaps_proportions():
    gap = (10 * S + 100) / 6  # HAND's mean gap: 6 gaps over 10.0000001 s
    w = Workload.from_trace(HAND, window_s=[1, 2.5], pace="trace")  # 1.0, 1.5, 2.0 s: a mean gap of 0.5 s
    assert w.arrival_ns.tolist() == [0, 1_666_666_683, 3_333_333_367]  # each gap made the trace's mean, rounded
    assert w.options["pace"] == "trace" and w.options["pace_gap_ms"] == pytest.approx(gap / 1e6)
    fast = Workload.from_trace(HAND, window_s=[1, 2.5], pace="trace", rate_multiplier=2)
    assert fast.arrival_ns.tolist() == [0, 833_333_342, 1_666_666_683]  # then divided by the multiplier
    bursty = Workload.from_trace(HAND, window_s=[0, 1.5], pace="trace")  # 0, 0.1, 1.0: one short gap, one long
    assert bursty.arrival_ns.tolist() == [0, round(0.2 * gap), round(2 * gap)]  # 1 : 9 kept, mean the trace's
    other = Workload.from_trace(HAND, window_s=[1, 2.5], pace="trace", pace_gap_ns=S)  # a larger trace's gap
    assert other.arrival_ns.tolist() == [0, S, 2 * S]
    one = Workload.from_trace(HAND, first=1, pace="trace")  # nothing to pace
    assert one.arrival_ns.tolist() == [0] and one.options["pace_gap_ms"] is None
    plain = Workload.from_trace(HAND, window_s=[1, 2.5])
    assert plain.arrival_ns.tolist() == [0, S // 2, S] and plain.options["pace"] is None
    w = Workload.from_params({"source": "azure-code", "first": 48, "pace": "trace"})
    t = load_trace("code")
    assert w.duration_s == pytest.approx(47 * (t.arrival_ns[-1] - t.arrival_ns[0]) / (t.n - 1) / S, rel=1e-9)


def test_clipping_counts_each_request_once_per_kind():
    w = Workload.from_trace(HAND, max_prompt_tokens=4000, max_output_tokens=1000, max_total_tokens=4500)
    # prompt  100 5000 300 3000 8000 50 7 -> 100 4000 300 3000 4000 50 7 (2 cut by max_prompt)
    # output  10 0 2000 1500 5 0 3 -> 10 1 1000 1000 5 1 3 (2 raised, 2 cut by max_output)
    # total   4000+1 ok; 3000+1000 ok; 4000+5 ok: max_total cuts nothing here
    assert w.prompt_tokens.tolist() == [100, 4000, 300, 3000, 4000, 50, 7]
    assert w.output_tokens.tolist() == [10, 1, 1000, 1000, 5, 1, 3]
    assert w.clipped == {"prompt": 2, "output": 2, "output_raised": 2}
    w = Workload.from_trace(HAND, max_total_tokens=4000)
    # 5000+1: output 1 already, prompt to 3999; 8000+5: output to 1, then prompt to 3999; 300+2000 ok;
    # 3000+1500: output to 1000
    assert w.prompt_tokens.tolist() == [100, 3999, 300, 3000, 3999, 50, 7]
    assert w.output_tokens.tolist() == [10, 1, 2000, 1000, 1, 1, 3]
    assert w.clipped == {"prompt": 2, "output": 2, "output_raised": 2}
    assert w.to_dict()["clipped"] == w.clipped and w.to_dict()["max_total_tokens"] == 4000
    p, o, counts = clip_lengths([10, 10], [0, 5], max_total_tokens=2)
    assert (p.tolist(), o.tolist(), counts) == ([1, 1], [1, 1], {"prompt": 2, "output": 1, "output_raised": 1})


# ---- Poisson ----


def _poisson(**kw):
    return Workload.from_params(
        {"source": "poisson", "rate": 5.0, "n": 1000, "seed": 0, "prompt": 64, "output": 8, **kw}
    )


def test_poisson_is_deterministic_given_the_seed_and_has_the_rate():
    a, b, c = _poisson(), _poisson(), _poisson(seed=1)
    assert np.array_equal(a.arrival_ns, b.arrival_ns) and not np.array_equal(a.arrival_ns, c.arrival_ns)
    w = _poisson(n=40_000)
    gaps = np.diff(w.arrival_s)
    assert w.arrival_ns[0] == 0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 0.2) < 0.2 * 0.02  # the mean's sd is 0.5% at this n
    assert abs(gaps.std() / gaps.mean() - 1) < 0.03  # exponential: sd = mean
    assert abs(w.duration_s - 40_000 / 5.0) < 40_000 / 5.0 * 0.02
    # PCG64's stream for seed 0 with this draw order: a change in either moves every workload
    w = Workload.poisson(rate=5.0, n=4, seed=0, prompt={"dist": "uniform", "lo": 10, "hi": 20}, output=7)
    assert w.arrival_ns.tolist() == [0, 135_986_381, 339_905_801, 343_867_134]
    assert w.prompt_tokens.tolist() == [10, 10, 11, 18] and w.output_tokens.tolist() == [7] * 4


def test_poisson_length_distributions():
    w = _poisson(prompt={"dist": "uniform", "lo": 3, "hi": 6}, output={"dist": "fixed", "value": 9})
    assert set(w.prompt_tokens.tolist()) == {3, 4, 5, 6} and set(w.output_tokens.tolist()) == {9}
    lognormal = {"dist": "lognormal", "median": 1000, "sigma": 0.5}
    free, w = _poisson(n=20_000, prompt=lognormal), _poisson(n=20_000, prompt=lognormal, max_prompt_tokens=2000)
    assert abs(np.median(free.prompt_tokens) - 1000) < 20 and free.prompt_tokens.min() >= 1
    assert np.array_equal(w.prompt_tokens, np.minimum(free.prompt_tokens, 2000))  # same draws, then the limit
    assert w.clipped["prompt"] == int((free.prompt_tokens > 2000).sum()) > 0  # P(> 2000) is ~8%
    assert w.options["prompt"] == {"dist": "lognormal", "median": 1000.0, "sigma": 0.5}
    assert json.loads(json.dumps(w.to_dict())) == w.to_dict()  # a report can hold it as it is
    code = load_trace("code")
    rows = set(zip(code.prompt_tokens.tolist(), code.output_tokens.tolist()))
    both = {"dist": "empirical", "trace": "code"}
    w = _poisson(prompt=both, output=both)
    assert set(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist())) <= rows  # whole rows drawn
    w = _poisson(prompt=both, output={"dist": "empirical", "trace": "conv"})
    assert set(w.prompt_tokens.tolist()) <= set(code.prompt_tokens.tolist())
    assert set(w.output_tokens.tolist()) <= set(load_trace("conv").output_tokens.tolist())
    assert not set(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist())) <= rows


# ---- the pair ----


def test_the_pair_is_a_and_b_at_zero_with_make_prompts_prompts():
    w = Workload.pair(4096, 1024)
    assert w.names == ("A", "B") and w.arrival_ns.tolist() == [0, 0] and w.duration_s == 0
    assert w.prompt_tokens.tolist() == [4096, 4096] and w.output_tokens.tolist() == [1024, 1024]
    d = Workload.from_params({"source": "pair", "prompt_tokens": 4096, "output_tokens": 1024}).to_dict()
    assert d == w.to_dict() and d["source"] == "pair" and d["prompt_rule"] == "runs"
    made = make_prompts(n_tokens=300, vocab_size=256)
    assert workload_prompts(Workload.pair(300, 4), vocab_size=256) == [made["A"], made["B"]]


# ---- bad input ----


@pytest.mark.parametrize(
    "params, message",
    [
        ([1], "workload must be a mapping"),
        ({"source": "azure"}, "workload source 'azure' is not one of: azure-code, azure-conv, poisson, pair"),
        ({"source": "azure-code", "seed": 0}, r"unknown key\(s\) seed for source azure-code; accepted: source, first"),
        ({"source": "azure-code", "rate": 2.0}, "a trace is sped up with rate_multiplier"),
        ({"source": "azure-code", "first": 0}, "first must be an integer >= 1, got 0"),
        ({"source": "azure-code", "first": 8820}, "first=8820 is more than the 8819 requests of trace 'code'"),
        ({"source": "azure-code", "window_s": [5, 5]}, r"window_s=\[5, 5\] is empty: it needs start < end"),
        ({"source": "azure-code", "window_s": [-1, 5]}, "window_s start must be a finite number >= 0, got -1"),
        ({"source": "azure-code", "window_s": 5}, r"window_s must be \[start, end\] in seconds, got 5"),
        ({"source": "azure-conv", "window_s": [4000, 5000]}, "holds no request of trace 'conv'"),
        ({"source": "azure-code", "window_s": [0, 0.05], "first": 2}, r"first=2 is more than the 1 requests of window"),
        ({"source": "azure-code", "rate_multiplier": 0}, "rate_multiplier must be a finite number > 0, got 0"),
        ({"source": "azure-code", "pace": "window"}, "pace must be 'trace' .* got 'window'"),
        ({"source": "azure-code", "max_total_tokens": 1}, "max_total_tokens must be an integer >= 2, got 1"),
        ({"source": "azure-conv", "max_prompt_tokens": 1.5}, "max_prompt_tokens must be an integer >= 1, got 1.5"),
        ({"source": "poisson", "rate": 1.0}, "workload source poisson needs n, seed, prompt, output"),
        ({"source": "pair", "prompt_tokens": 8}, "workload source pair needs output_tokens"),
        ({"source": "pair", "prompt_tokens": 0, "output_tokens": 1}, "prompt_tokens must be an integer >= 1"),
        ({"source": "pair", "prompt_tokens": 10**23, "output_tokens": 4}, "prompt_tokens must be an integer <= 2147"),
        ({"source": "azure-code", "max_total_tokens": 10**23}, "max_total_tokens must be an integer <= 2147483647"),
        ({"source": "azure-code", "first": 3, "rate_multiplier": 1e-300}, "rate_multiplier 1e-300: the arrivals would"),
    ],
)
def test_bad_trace_and_pair_params_are_refused_by_name(params, message):
    with pytest.raises(InputError, match=message):
        Workload.from_params(params)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rate": -1.0}, "rate must be a finite number > 0, got -1.0"),
        ({"rate": float("inf")}, "rate must be a finite number > 0, got inf"),
        ({"n": 0}, "n must be an integer >= 1, got 0"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"rate_multiplier": 2}, r"unknown key\(s\) rate_multiplier for source poisson"),
        ({"prompt": "long"}, "prompt length must be an integer or one of {dist: fixed, value}"),
        ({"prompt": 0}, "prompt value must be an integer >= 1, got 0"),
        ({"output": {"dist": "uniform", "lo": 5, "hi": 4}}, "output hi must be an integer >= 5, got 4"),
        ({"output": {"dist": "uniform", "lo": 5}}, r"output length \{dist: uniform\} takes exactly lo, hi"),
        ({"prompt": {"dist": "lognormal", "median": 0, "sigma": 1}}, "prompt median must be a finite number > 0"),
        ({"prompt": {"dist": "empirical", "trace": "chat"}}, "empirical trace 'chat' is not one of: code, conv"),
        ({"n": 10**11}, "n must be an integer <= 1000000, got 100000000000"),  # refused, not allocated
        ({"prompt": {"dist": "uniform", "lo": 1, "hi": 10**23}}, "prompt hi must be an integer <= 2147483647"),
        ({"rate": 1e-15}, r"poisson rate 1e-15: the arrivals would span \S+ s, past the 1e\+07 s a workload may span"),
    ],
)
def test_bad_poisson_params_are_refused_by_name(change, message):
    with pytest.raises(InputError, match=message):
        _poisson(**change)


def test_a_workload_holds_only_well_formed_requests():
    z, one = np.zeros(1, np.int64), np.ones(1, np.int64)
    with pytest.raises(InputError, match="must start at 0 and not decrease"):
        Workload("x", np.array([0, 2, 1]), np.ones(3, np.int64), np.ones(3, np.int64))
    with pytest.raises(InputError, match="output_tokens must all be >= 1, got 0"):
        Workload("x", z, one, z)
    with pytest.raises(InputError, match="1-D array of integers, got float64"):
        Workload("x", np.zeros(1), one, one)
    with pytest.raises(InputError, match="prompt_tokens: 2"):
        Workload("x", z, np.ones(2, np.int64), one)
    with pytest.raises(InputError, match="'runs' .* one prompt length"):
        Workload("x", np.zeros(2, np.int64), np.array([1, 2]), np.ones(2, np.int64), prompt_rule="runs")
    w = Workload("x", z, one, one)
    assert w.names == ("r0",) and not w.prompt_tokens.flags.writeable


# ---- prompts ----


def _stream() -> bytes:
    return b"".join(bytes(byte_tokens(render(*d))) for d in load_corpus())


def test_prompts_are_distinct_hashed_slices_of_exact_length():
    w = Workload.from_trace(HAND)
    stream = _stream()
    ps = workload_prompts(w, vocab_size=256)
    assert [p.name for p in ps] == list(w.names) == [f"r{i}" for i in range(7)]
    assert [len(p.token_ids) for p in ps] == w.prompt_tokens.tolist()
    assert len({p.token_ids for p in ps}) == 7
    for i, p in enumerate(ps):
        start = int(p.source.rsplit("offset ", 1)[1].split()[0])
        expected = int.from_bytes(hashlib.sha256(f"pdlib.workload.prompt/{i}".encode()).digest()[:8], "little")
        assert start == expected % len(stream)  # no collision among 7 offsets in ~400k
        wrapped = (stream + stream)[start : start + len(p.token_ids)]
        assert bytes(p.token_ids) == wrapped and p.sha256 == token_ids_sha256(p.token_ids)
    # a longer window keeps the shorter one's prompts
    more = workload_prompts(Workload.from_params({"source": "azure-code", "first": 40}), vocab_size=256)
    fewer = workload_prompts(Workload.from_params({"source": "azure-code", "first": 20}), vocab_size=256)
    assert more[:20] == fewer and len({p.sha256 for p in more}) == 40


class _Stub:
    """Each document becomes one id, its length mod 3: a stream of 793 ids with three values."""

    name_or_path = "stub"

    def __init__(self, top=3):
        self.top = top

    def encode(self, text, add_special_tokens=False):
        return [len(text) % self.top]


def test_prompts_probe_past_repeats_and_say_when_none_is_left():
    # nine 2-token prompts over three ids: only probing past repeats finds all nine pairs
    w = Workload("x", np.zeros(9, np.int64), np.full(9, 2), np.ones(9, np.int64))
    ps = workload_prompts(w, vocab_size=3, tokenizer=_Stub())
    assert {p.token_ids for p in ps} == {(a, b) for a in range(3) for b in range(3)}
    assert all(p.tokenizer == "stub" for p in ps)
    w = Workload("x", np.zeros(4, np.int64), np.ones(4, np.int64), np.ones(4, np.int64))
    with pytest.raises(InputError, match=r"request r3: no 1-token slice of the corpus \(793 tokens .* the 3 prompts"):
        workload_prompts(w, vocab_size=3, tokenizer=_Stub())
    w = Workload("x", np.zeros(2, np.int64), np.array([5, 794]), np.ones(2, np.int64))
    with pytest.raises(InputError, match="request r1 has a 794-token prompt; the corpus gives at most 793"):
        next(iter_prompts(w, vocab_size=3, tokenizer=_Stub()))
    with pytest.raises(InputError, match=r"produced id [3-6] outside \[0, vocab_size=3\)"):
        workload_prompts(w, vocab_size=3, tokenizer=_Stub(top=7))
    with pytest.raises(InputError, match="vocab_size=100 is too small for the byte mapping"):
        workload_prompts(w, vocab_size=100)

"""A workload: N requests, each an arrival time, a prompt length and an output length (greedy decoding of
exactly that many tokens), and the prompts that fill those lengths.

    from pdlib.workload import Workload, workload_prompts
    w = Workload.from_params({"source": "azure-code", "first": 200, "rate_multiplier": 2.0, "max_total_tokens": 8192})
    w = Workload.from_params({"source": "poisson", "rate": 4.0, "n": 500, "seed": 0,
                              "prompt": {"dist": "lognormal", "median": 1024, "sigma": 1.0},
                              "output": {"dist": "empirical", "trace": "conv"}})
    w = Workload.pair(4096, 1024)                 # today's fixed two-request arrival
    w.arrival_ns, w.prompt_tokens, w.output_tokens, w.names, w.n, w.duration_s, w.to_dict()
    prompts = workload_prompts(w, vocab_size=151_936, tokenizer=tok)   # one pdlib.prompts.Prompt per request

Arrivals are int64 nanoseconds from the run's start, non-decreasing, the first request at 0: exact for the
traces' 100 ns timestamps, and the unit the run's clock (perf_counter_ns) counts in. Requests are in arrival
order; equal arrivals are admitted in array order.

Sources (`from_params` keys; any other key is refused):
- `azure-code`, `azure-conv` (pdlib/traces.py): `first: K` (the first K requests), `window_s: [a, b]` (the
  requests with a <= timestamp - first timestamp < b, in trace seconds; with `first`, the first K of the
  window), `rate_multiplier: m` (arrivals divided by m: 2.0 replays twice as fast), `pace: trace` (optional:
  the window's arrivals first rescaled so that its mean request rate is the whole trace's, its gaps keeping
  their proportions; without it a window keeps the trace's own times, and two windows of K requests may differ
  several-fold in load: the code trace's first 48 span 36 s, its next 48 155 s), and the limits below.
  Arrival 0 is the window's first request.
- `poisson`: `rate` (requests/s), `n`, `seed`, `prompt` and `output` length distributions, the limits below.
  Request 0 arrives at 0, each next one an exponential gap (mean 1/rate) later. A distribution is an integer
  (a fixed length) or a mapping: `{dist: fixed, value}`, `{dist: uniform, lo, hi}` (integers, both
  inclusive), `{dist: lognormal, median, sigma}` (rounded, at least 1), `{dist: empirical, trace: code|conv}`
  (lengths resampled, with replacement, from the trace; when prompt and output are both empirical from the
  same trace, whole rows are drawn, so their correlation stays). Draws from numpy's PCG64(seed), in this
  order: the n - 1 gaps, then the prompt lengths, then the output lengths (none for a fixed length, none
  for output when drawn jointly with the prompt), so a seed gives the same workload on every machine.
- `pair`: `prompt_tokens`, `output_tokens` (see `Workload.pair`).

Limits (`max_prompt_tokens`, `max_output_tokens`, `max_total_tokens`, each optional), applied in this order:
an output of 0 tokens becomes 1 (a request must emit a token to have a TTFT; counted as `output_raised`); a
prompt over max_prompt_tokens is cut to it; an output over max_output_tokens is cut to it; where prompt +
output exceeds max_total_tokens, the output is cut first (down to 1 token: the prompt is the load whose
effect on other requests is measured), then the prompt. `clipped` counts the requests whose prompt (any
rule) or output was cut. Neither shipped trace has an output of 0 (their minimums are 6 and 7 tokens).

Prompts: `prompt_rule` "runs" is pdlib.prompts.make_prompts itself (all prompts one length; the pair's
prompts, so its published numbers do not move). "hashed" (every other source): the corpus is tokenized as
make_prompts does (each rendered document alone) and concatenated in file order into one cyclic stream of
L tokens; request i's prompt is the n_i tokens from offset SHA-256("pdlib.workload.prompt/{i}") mod L,
wrapping at the end. An offset that another request already starts at, or whose ids equal an earlier
prompt's, moves on by one token until neither holds, so prompts are distinct and request i's depends only
on requests 0..i (a longer window keeps a shorter one's prompts). A prompt longer than L is refused.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from pdlib.errors import INT64_MAX, InputError, check_int
from pdlib.prompts import Prompt, encoder, load_corpus, make_prompts, render
from pdlib.traces import NS_PER_S, TRACES, Trace, load_trace

TRACE_SOURCES = {"azure-code": "code", "azure-conv": "conv"}
SOURCES = (*TRACE_SOURCES, "poisson", "pair")
LIMITS = ("max_prompt_tokens", "max_output_tokens", "max_total_tokens")
KEYS = {
    **{s: ("source", "first", "window_s", "rate_multiplier", "pace", *LIMITS) for s in TRACE_SOURCES},
    "poisson": ("source", "rate", "n", "seed", "prompt", "output", *LIMITS),
    "pair": ("source", "prompt_tokens", "output_tokens"),
}
DISTS = {"fixed": ("value",), "uniform": ("lo", "hi"), "lognormal": ("median", "sigma"), "empirical": ("trace",)}
RULES = ("hashed", "runs")
CLIPPED = ("prompt", "output", "output_raised")
# Every to_dict has these keys (None where the source has no such option), so reports line up.
OPTIONS = (
    "first", "window_s", "rate_multiplier", "pace", "pace_gap_ms", "rate", "seed", "prompt", "output", *LIMITS,
    "trace_requests",
)  # fmt: skip
PACES = ("trace",)
PROMPT_SALT = "pdlib.workload.prompt/"


def _number(name: str, value, *, lo: float, lo_ok: bool) -> float:
    """A finite real number above `lo` (or equal to it when lo_ok), or an InputError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        ok = False
    else:
        ok = value >= lo if lo_ok else value > lo
    if not ok:
        raise InputError(f"{name} must be a finite number {'>=' if lo_ok else '>'} {lo:g}, got {value!r}")
    return float(value)


def at_rate(workload_params: dict, rate: float) -> dict:
    """The params with their rate replaced: a trace's rate_multiplier, or poisson's rate (requests/s)."""
    return {**workload_params, "rate" if workload_params.get("source") == "poisson" else "rate_multiplier": rate}


MAX_REQUESTS = 1_000_000  # a drawn workload's n at most: 50x the longer Azure trace
MAX_SPAN_S = 1e7  # arrivals span at most this (~116 days): a rate that slow is a typo, and ns must fit int64


def arrival_ns_of(ns: np.ndarray, what: str) -> np.ndarray:
    """Arrival times in ns (float, from 0, not decreasing) as int64, or InputError where they span past MAX_SPAN_S."""
    if not ns[-1] <= MAX_SPAN_S * NS_PER_S:  # NaN and inf fail too
        raise InputError(
            f"{what}: the arrivals would span {ns[-1] / NS_PER_S:.3g} s, past the {MAX_SPAN_S:g} s a "
            f"workload may span; raise the rate"
        )
    return np.rint(ns).astype(np.int64)


def _array(name: str, values) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise InputError(f"workload {name} must be a 1-D array of integers, got {a.dtype} of shape {a.shape}")
    a = a.astype(np.int64)  # a copy: the caller's array stays theirs
    a.setflags(write=False)
    return a


def clip_lengths(prompt, output, *, max_prompt_tokens=None, max_output_tokens=None, max_total_tokens=None):
    """(prompt, output, counts) after the limits above; counts has the keys of CLIPPED."""
    for name, value, lo in zip(LIMITS, (max_prompt_tokens, max_output_tokens, max_total_tokens), (1, 1, 2)):
        if value is not None:
            check_int(name, value, lo)
    p, o = np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64)
    raised = o < 1
    o[raised] = 1
    p_cut, o_cut = np.zeros(len(p), bool), np.zeros(len(o), bool)
    if max_prompt_tokens is not None:
        p_cut |= p > max_prompt_tokens
        p[p_cut] = max_prompt_tokens
    if max_output_tokens is not None:
        o_cut |= o > max_output_tokens
        o[o > max_output_tokens] = max_output_tokens
    if max_total_tokens is not None:
        over = p + o > max_total_tokens
        cut = np.maximum(1, max_total_tokens - p)
        o_cut |= over & (cut < o)  # an output of 1 already is not cut
        o[over] = cut[over]
        over = p + o > max_total_tokens  # only where the output is 1 by now
        p[over] = max_total_tokens - 1
        p_cut |= over
    counts = {"prompt": int(p_cut.sum()), "output": int(o_cut.sum()), "output_raised": int(raised.sum())}
    return p, o, counts


def _seconds_to_ns(name: str, value) -> int:
    _number(name, value, lo=0, lo_ok=True)
    # through the decimal text, so 0.1 s is 100,000,000 ns and not the binary float's neighbour
    return int((Decimal(str(value)) * NS_PER_S).to_integral_value())


def trace_window(trace: Trace, window_s=None) -> tuple[int, int]:
    """[lo, hi): the indices of `trace`'s requests inside window_s (the whole trace for None), or InputError."""
    if window_s is None:
        return 0, trace.n
    if not isinstance(window_s, (list, tuple)) or len(window_s) != 2:
        raise InputError(f"window_s must be [start, end] in seconds, got {window_s!r}")
    a, b = (_seconds_to_ns(f"window_s {x}", v) for x, v in zip(("start", "end"), window_s))
    if a >= b:
        raise InputError(f"window_s={list(window_s)} is empty: it needs start < end")
    lo, hi = (int(i) for i in np.searchsorted(trace.arrival_ns, [a, b], side="left"))
    if lo == hi:
        raise InputError(
            f"window_s={list(window_s)} holds no request of trace {trace.name!r} "
            f"(its {trace.n} requests arrive over [0, {trace.duration_s:.3f}] s)"
        )
    return lo, hi


def _summary(a: np.ndarray) -> dict:
    p50, p90 = np.percentile(a, [50, 90])  # numpy's default: linear between order statistics
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "max": int(a.max()), "total": int(a.sum())}


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value to compare with
class Workload:
    source: str  # "azure-code", "azure-conv", "poisson", "pair", or "trace:<name>" (from_trace)
    arrival_ns: np.ndarray  # int64, ns from the run's start; [0] == 0, non-decreasing
    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1: greedy, exactly this many output tokens
    names: tuple[str, ...] = ()  # request names; () means "r0", "r1", ...
    prompt_rule: str = "hashed"  # see the module docstring
    options: dict = field(default_factory=dict)  # what built it (keys of OPTIONS), for to_dict
    clipped: dict = field(default_factory=lambda: dict.fromkeys(CLIPPED, 0))

    def __post_init__(self):
        arrays = {k: _array(k, getattr(self, k)) for k in ("arrival_ns", "prompt_tokens", "output_tokens")}
        n = len(arrays["arrival_ns"])
        if n < 1 or any(len(a) != n for a in arrays.values()):
            sizes = ", ".join(f"{k}: {len(a)}" for k, a in arrays.items())
            raise InputError(f"a workload needs >= 1 request and one value per request in each array ({sizes})")
        a = arrays["arrival_ns"]
        if a[0] != 0 or (np.diff(a) < 0).any():
            raise InputError("workload arrival_ns must start at 0 and not decrease (arrival 0 is the first request)")
        for k in ("prompt_tokens", "output_tokens"):
            if arrays[k].min() < 1:
                raise InputError(f"workload {k} must all be >= 1, got {int(arrays[k].min())}")
        names = tuple(self.names) or tuple(f"r{i}" for i in range(n))
        if len(names) != n or len(set(names)) != n or not all(isinstance(x, str) and x for x in names):
            raise InputError(f"workload names must be {n} distinct non-empty strings, got {len(names)}")
        if self.prompt_rule not in RULES:
            raise InputError(f"prompt_rule {self.prompt_rule!r} is not one of: {', '.join(RULES)}")
        if self.prompt_rule == "runs" and len(set(arrays["prompt_tokens"].tolist())) > 1:
            raise InputError("prompt_rule 'runs' (make_prompts) gives every request one prompt length")
        for k, v in arrays.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "options", {k: self.options.get(k) for k in OPTIONS})
        object.__setattr__(self, "clipped", {k: int(self.clipped.get(k, 0)) for k in CLIPPED})

    @property
    def n(self) -> int:
        return len(self.arrival_ns)

    @property
    def arrival_s(self) -> np.ndarray:
        return self.arrival_ns / NS_PER_S

    @property
    def duration_s(self) -> float:
        """From the first arrival to the last (not counting the last request's service)."""
        return int(self.arrival_ns[-1]) / NS_PER_S

    def to_dict(self) -> dict:
        """A summary for a report: source, options, counts, clipped counts and the lengths' percentiles."""
        return {
            "source": self.source,
            "requests": self.n,
            "duration_s": self.duration_s,
            **self.options,
            "clipped": dict(self.clipped),
            "prompt_rule": self.prompt_rule,
            "prompt_tokens": _summary(self.prompt_tokens),
            "output_tokens": _summary(self.output_tokens),
        }

    @classmethod
    def pair(cls, prompt_tokens: int, output_tokens: int) -> Workload:
        """Today's fixed arrival: requests A and B, each `prompt_tokens` of prompt and `output_tokens` of output,
        both arriving at 0, A first, with make_prompts' prompts. In the fixed experiment A's reset, prefill and
        first output are untimed set-up, and the clock (t0) starts when B arrives with A decoding; so a run that
        replays the pair admits A, runs that set-up untimed, then admits B at its arrival, which is t0."""
        check_int("prompt_tokens", prompt_tokens, 1)
        check_int("output_tokens", output_tokens, 1)
        return cls(
            "pair",
            np.zeros(2, dtype=np.int64),
            np.full(2, prompt_tokens, dtype=np.int64),
            np.full(2, output_tokens, dtype=np.int64),
            names=("A", "B"),
            prompt_rule="runs",
        )

    @classmethod
    def from_trace(
        cls,
        trace: Trace,
        *,
        first: int | None = None,
        window_s=None,
        rate_multiplier: float = 1.0,
        pace: str | None = None,
        pace_gap_ns: float | None = None,
        max_prompt_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_total_tokens: int | None = None,
        source: str | None = None,
    ) -> Workload:
        """A window of `trace` (the module docstring's trace options), paced, rate-multiplied and clipped.
        `pace_gap_ns`: the mean gap `pace: trace` paces to (default: `trace`'s own, for a window cut from a
        larger trace the caller passes the larger one's: trace_gap_ns)."""
        lo, hi = trace_window(trace, window_s)
        if first is not None:
            check_int("first", first, 1)
            if first > hi - lo:
                where = f"window_s={list(window_s)}" if window_s is not None else f"trace {trace.name!r}"
                raise InputError(f"first={first} is more than the {hi - lo} requests of {where}")
            hi = lo + first
        m = _number("rate_multiplier", rate_multiplier, lo=0, lo_ok=False)
        if pace is not None and pace not in PACES:
            raise InputError(
                f"pace must be 'trace' (the window's mean request rate made the whole trace's), got {pace!r}"
            )
        rel = trace.arrival_ns[lo:hi] - trace.arrival_ns[lo]
        paced, gap = rel, None
        if pace == "trace" and rel[-1] > 0:  # one request, or all at one instant: nothing to pace
            gap = trace_gap_ns(trace) if pace_gap_ns is None else pace_gap_ns
            paced = rel * (gap * (rel.size - 1) / rel[-1])
        # ns / m in float64 is exact to well under 1 ns for hours of trace; m == 1 keeps the integers as they are
        with np.errstate(over="ignore"):  # a multiplier too small comes out inf, refused in arrival_ns_of
            arrival = rel if m == 1 and gap is None else arrival_ns_of(paced / m, f"rate_multiplier {m:g}")
        limits = dict(zip(LIMITS, (max_prompt_tokens, max_output_tokens, max_total_tokens)))
        p, o, counts = clip_lengths(trace.prompt_tokens[lo:hi], trace.output_tokens[lo:hi], **limits)
        window = None if window_s is None else [float(x) for x in window_s]
        options = {"first": first, "window_s": window, "rate_multiplier": m, "trace_requests": trace.n, **limits}
        if pace is not None:
            options.update(pace=pace, pace_gap_ms=None if gap is None else gap / 1e6)
        return cls(source or f"trace:{trace.name}", arrival, p, o, options=options, clipped=counts)

    @classmethod
    def poisson(
        cls,
        *,
        rate: float,
        n: int,
        seed: int,
        prompt,
        output,
        max_prompt_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_total_tokens: int | None = None,
    ) -> Workload:
        """Poisson arrivals at `rate` requests/s with drawn lengths (the module docstring's poisson source)."""
        rate = _number("rate", rate, lo=0, lo_ok=False)
        check_int("n", n, 1, MAX_REQUESTS)
        check_int("seed", seed, 0, INT64_MAX)
        ps, os_ = _dist("prompt", prompt), _dist("output", output)
        rng = np.random.Generator(np.random.PCG64(seed))
        with np.errstate(over="ignore"):  # a rate too slow comes out inf, refused below
            gaps = rng.exponential(1.0 / rate, size=n - 1)
            arrival_ns = np.concatenate([[0.0], np.cumsum(gaps)]) * NS_PER_S
        arrival = arrival_ns_of(arrival_ns, f"poisson rate {rate:g}")
        if ps["dist"] == os_["dist"] == "empirical" and ps["trace"] == os_["trace"]:
            t = load_trace(ps["trace"])
            rows = rng.integers(0, t.n, size=n)
            p, o = t.prompt_tokens[rows], t.output_tokens[rows]
        else:
            p, o = _draw(ps, "prompt_tokens", rng, n), _draw(os_, "output_tokens", rng, n)
        limits = dict(zip(LIMITS, (max_prompt_tokens, max_output_tokens, max_total_tokens)))
        p, o, counts = clip_lengths(p, o, **limits)
        options = {"rate": rate, "seed": seed, "prompt": ps, "output": os_, **limits}
        return cls("poisson", arrival, p, o, options=options, clipped=counts)

    @classmethod
    def from_params(cls, params: Mapping) -> Workload:
        """A workload from a params mapping: `source` and that source's keys (module docstring)."""
        if not isinstance(params, Mapping):
            raise InputError(f"workload must be a mapping of option: value, got {type(params).__name__}")
        source = params.get("source")
        if source not in SOURCES:
            raise InputError(f"workload source {source!r} is not one of: {', '.join(SOURCES)}")
        unknown = sorted(str(k) for k in params if k not in KEYS[source])
        if unknown:
            hint = " (a trace is sped up with rate_multiplier)" if "rate" in unknown and source != "poisson" else ""
            raise InputError(
                f"workload: unknown key(s) {', '.join(unknown)} for source {source}; "
                f"accepted: {', '.join(KEYS[source])}{hint}"
            )
        kw = {k: v for k, v in params.items() if k != "source"}
        if source == "pair":
            missing = [k for k in ("prompt_tokens", "output_tokens") if k not in kw]
            if missing:
                raise InputError(f"workload source pair needs {', '.join(missing)}")
            return cls.pair(kw["prompt_tokens"], kw["output_tokens"])
        if source == "poisson":
            missing = [k for k in ("rate", "n", "seed", "prompt", "output") if k not in kw]
            if missing:
                raise InputError(f"workload source poisson needs {', '.join(missing)}")
            return cls.poisson(**kw)
        return cls.from_trace(load_trace(TRACE_SOURCES[source]), source=source, **kw)


def trace_gap_ns(trace: Trace) -> float:
    """A trace's mean gap between consecutive arrivals (ns): what `pace: trace` paces a window to."""
    if trace.n < 2:
        raise InputError(f"trace {trace.name!r} has {trace.n} request(s): no mean gap to pace a window to")
    return float(trace.arrival_ns[-1] - trace.arrival_ns[0]) / (trace.n - 1)


def _dist(name: str, spec) -> dict:
    """A length distribution, normalised to a mapping with `dist` and its parameters, or an InputError."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = {"dist": "fixed", "value": spec}
    accepted = "; ".join(f"{{dist: {d}, {', '.join(ks)}}}" for d, ks in DISTS.items())
    if not isinstance(spec, Mapping) or spec.get("dist") not in DISTS:
        raise InputError(f"{name} length must be an integer or one of {accepted}; got {spec!r}")
    d = spec["dist"]
    if set(spec) != {"dist", *DISTS[d]}:
        raise InputError(f"{name} length {{dist: {d}}} takes exactly {', '.join(DISTS[d])}; got {dict(spec)!r}")
    out = dict(spec)
    if d == "fixed":
        check_int(f"{name} value", spec["value"], 1)
    elif d == "uniform":
        check_int(f"{name} lo", spec["lo"], 1)
        check_int(f"{name} hi", spec["hi"], spec["lo"])
    elif d == "lognormal":
        out["median"] = _number(f"{name} median", spec["median"], lo=0, lo_ok=False)
        out["sigma"] = _number(f"{name} sigma", spec["sigma"], lo=0, lo_ok=True)
    elif spec["trace"] not in TRACES:
        raise InputError(f"{name} length: empirical trace {spec['trace']!r} is not one of: {', '.join(TRACES)}")
    return out


def _draw(spec: dict, column: str, rng: np.random.Generator, n: int) -> np.ndarray:
    d = spec["dist"]
    if d == "fixed":
        return np.full(n, spec["value"], dtype=np.int64)
    if d == "uniform":
        return rng.integers(spec["lo"], spec["hi"], size=n, endpoint=True, dtype=np.int64)
    if d == "lognormal":
        x = rng.lognormal(math.log(spec["median"]), spec["sigma"], size=n)
        return np.clip(np.rint(x), 1, 2.0**53).astype(np.int64)  # the upper bound keeps a huge draw an int64
    t = load_trace(spec["trace"])
    return getattr(t, column)[rng.integers(0, t.n, size=n)]


# ---- prompts ----


def iter_prompts(w: Workload, *, vocab_size: int, tokenizer=None) -> Iterator[Prompt]:
    """The prompt of each request of `w`, in order, by its prompt_rule (module docstring). A generator: a
    whole trace's prompts are tens of millions of ids, so a caller may keep only those it still needs."""
    lengths = w.prompt_tokens.tolist()
    if w.prompt_rule == "runs":
        made = make_prompts(n_tokens=lengths[0], vocab_size=vocab_size, tokenizer=tokenizer, names=w.names)
        yield from (made[name] for name in w.names)
        return
    encode, tok_name = encoder(vocab_size, tokenizer)
    docs = load_corpus()
    pieces = [encode(render(*d)) for d in docs]
    stream = np.fromiter((i for p in pieces for i in p), dtype="<u4")
    doc_starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    size = len(stream)
    if max(lengths) > size:
        i = int(np.argmax(w.prompt_tokens))
        raise InputError(
            f"request {w.names[i]} has a {lengths[i]}-token prompt; the corpus gives at most {size} distinct "
            f"tokens with tokenizer {tok_name!r}: lower max_prompt_tokens to <= {size}"
        )
    starts, seen = set(), set()
    for i, (name, n) in enumerate(zip(w.names, lengths)):
        digest = hashlib.sha256(f"{PROMPT_SALT}{i}".encode()).digest()
        start = int.from_bytes(digest[:8], "little") % size
        for _ in range(size):
            if start not in starts:
                ids = stream[(start + np.arange(n)) % size]
                sha = hashlib.sha256(ids.tobytes()).hexdigest()  # = token_ids_sha256: little-endian uint32
                if sha not in seen:
                    break
            start = (start + 1) % size
        else:
            raise InputError(
                f"request {name}: no {n}-token slice of the corpus ({size} tokens with tokenizer {tok_name!r}) "
                f"differs from the {i} prompts before it"
            )
        starts.add(start)
        seen.add(sha)
        first, last = (int(np.searchsorted(doc_starts, x, side="right")) - 1 for x in (start, (start + n - 1) % size))
        source = f"{docs[first][0]}..{docs[last][0]} (offset {start} of {size})"
        yield Prompt(name, tuple(ids.tolist()), sha, tok_name, source)


def workload_prompts(w: Workload, *, vocab_size: int, tokenizer=None) -> list[Prompt]:
    """All of iter_prompts' prompts, in request order."""
    return list(iter_prompts(w, vocab_size=vocab_size, tokenizer=tokenizer))

"""Request traces (arrival time, prompt tokens, output tokens per request), parsed exactly, and the two shipped
Azure LLM inference traces 2023.

    from pdlib.traces import load_trace, parse_trace
    t = load_trace("code")                  # or "conv"; cached
    t.arrival_ns, t.prompt_tokens, t.output_tokens, t.n, t.duration_s
    t = parse_trace(csv_text, name="mine")  # the same CSV layout

Shipped (pdlib/data/azure_llm_2023/, CC-BY-4.0, see ATTRIBUTION.md there): `code` (8,819 requests over
3,435.9 s) and `conv` (19,366 requests over 3,501.7 s), the upstream CSVs byte for byte inside gzip.

CSV layout: the header `TIMESTAMP,ContextTokens,GeneratedTokens`, then one request a line (CRLF or LF):
`YYYY-MM-DD HH:MM:SS[.f...]` (up to 9 fractional digits; the Azure files have 7), the prompt length (>= 1)
and the output length (>= 0; the workload decides what a 0 becomes). Timestamps must not decrease. They are
read as integers, never through a float or `datetime` (which keeps only microseconds): arrival_ns is exact,
counted from the first request's timestamp, so arrival_ns[0] == 0.
"""

from __future__ import annotations

import datetime
import functools
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdlib.errors import InputError

TRACE_DIR = Path(__file__).parent / "data" / "azure_llm_2023"
TRACES = ("code", "conv")
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
ROW = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?,(\d+),(\d+)")
NS_PER_S = 10**9
NS_PER_DAY = 86_400 * NS_PER_S


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value to compare with
class Trace:
    name: str
    arrival_ns: np.ndarray  # int64, since the first request's timestamp (so [0] == 0), non-decreasing
    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 0
    start: str  # the first request's TIMESTAMP, as written

    @property
    def n(self) -> int:
        return len(self.arrival_ns)

    @property
    def duration_s(self) -> float:
        """From the first request's arrival to the last one's."""
        return int(self.arrival_ns[-1]) / NS_PER_S


def trace_path(name: str) -> Path:
    if name not in TRACES:
        raise InputError(f"unknown trace {name!r}; expected one of: {', '.join(TRACES)}")
    return TRACE_DIR / f"{name}.csv.gz"


@functools.lru_cache(maxsize=len(TRACES))
def load_trace(name: str) -> Trace:
    """A shipped trace (`code` or `conv`), parsed once per process."""
    return parse_trace(gzip.decompress(trace_path(name).read_bytes()).decode("utf-8"), name=name)


def parse_trace(text: str, *, name: str = "trace") -> Trace:
    """A trace from CSV text in the layout above, or an InputError naming the line that does not fit it."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        first = lines[0] if lines else ""
        raise InputError(f"trace {name!r}: the first line is {first[:80]!r}; expected the header {HEADER!r}")
    days: dict[str, int] = {}  # date -> ns of its midnight; a trace spans a day or two
    stamps, prompts, outputs = [], [], []
    for k, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        m = ROW.fullmatch(line.strip())
        if m is None:
            raise InputError(
                f"trace {name!r} line {k}: {line[:80]!r} is not "
                "'YYYY-MM-DD HH:MM:SS[.fraction],<prompt tokens>,<output tokens>'"
            )
        date, hh, mm, ss, frac, prompt, output = m.groups()
        if date not in days:
            try:
                days[date] = datetime.date.fromisoformat(date).toordinal() * NS_PER_DAY
            except ValueError:
                raise InputError(f"trace {name!r} line {k}: {date!r} is not a calendar date") from None
        if int(hh) > 23 or int(mm) > 59 or int(ss) > 59:
            raise InputError(f"trace {name!r} line {k}: time {hh}:{mm}:{ss} is not a time of day")
        ns = (int(hh) * 3600 + int(mm) * 60 + int(ss)) * NS_PER_S + int((frac or "").ljust(9, "0"))
        stamps.append(days[date] + ns)
        prompts.append(int(prompt))
        outputs.append(int(output))
        if prompts[-1] < 1:
            raise InputError(f"trace {name!r} line {k}: prompt of {prompts[-1]} tokens; a prompt needs >= 1")
        if len(stamps) > 1 and stamps[-1] < stamps[-2]:
            raise InputError(f"trace {name!r} line {k}: timestamp goes back in time; arrivals must not decrease")
    if not stamps:
        raise InputError(f"trace {name!r} holds no request (only its header)")
    # Python ints until here: ns since year 1 overflow int64, ns since the first request do not
    arrival = np.array([s - stamps[0] for s in stamps], dtype=np.int64)
    start = lines[1 + next(i for i, x in enumerate(lines[1:]) if x.strip())].split(",", 1)[0].strip()
    arrays = [arrival, np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64)]
    for a in arrays:
        a.setflags(write=False)
    return Trace(name, *arrays, start=start)

"""A rate search's log: one JSON line per measured run, appended as soon as the run ends, so a search killed at
any point resumes from every run it finished (pdlib/run/serve_search.py).

    log = SearchLog(path, identity, note=print)   # locks the file; reads what is there; refuses another search's
    if log.header is None:
        log.start({"slo": ...})                   # a new log: its header, written with its first point
    log.append({"policy": "mixed", "rate": 2.0, "rep": 0, "summary": {...}, "gate": {...}})
    log.records                                   # every point in the log, in order
    log.keep("references", key, {"r0": {...}})    # what a later command reuses (a rep's FP32 references)
    log.recall("references", key)                 # that, or None
    log.close()

Line 1 is the header: {"schema", "identity", "created_utc", ...}. `identity` is what decides a measured point's
numbers (the model, the workload, chunk size, warmups, the SLO settings, the rep rule, the machine and the engine's
switches); a log whose identity differs is refused with one line naming the first field that differs, so points of
another workload or machine never mix in. Each later line is one point, or something kept for later commands
({"kept": kind, "key": key, "value": ...}: a rep's reference sequences under the rep and its prompts, the
slo policy's step-cost fit), which a resumed search reuses rather than measuring again. Every line is written
with one write, then fsync: a process killed mid-write leaves at most a partial last line (no newline), which is
cut off with a note and measured again; any other damaged line is refused. The file is locked (flock) while a
search holds it, so two searches never append to one log. `any_machine` (a report composed from the log, measuring
nothing: `serve --search --from-log`) takes the log's machine and switches as its own.
"""

import datetime
import fcntl
import json
import os
import re
import stat
from pathlib import Path

from pdlib import settings
from pdlib.errors import InputError, is_finite, is_number

LOG_SCHEMA = "pdlib.serve-search-log/1"


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def first_difference(a, b, path: str = "") -> str | None:
    """The first key path where two JSON values differ ("workload.first: 8 != 16"), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    return None if a == b else f"{path or 'value'}: {json.dumps(a)} != {json.dumps(b)}"


# engine switches added after logs recorded the engine's settings
LATER_SWITCHES = ("PDLIB_ROUND_GROUP", "PDLIB_PERSISTENT_LOAD")


def with_later_switches(theirs, ours: dict):
    """A log's identity as if it named the switches of LATER_SWITCHES it predates at their defaults, where ours
    has them so (what it ran with: such a switch at its default changes nothing); anything else as it was, so a
    switch that was recorded later than it existed (PDLIB_KV_CACHE_GIB) is still refused."""
    try:
        mine, old = ours["machine"]["settings"], dict(theirs["machine"]["settings"])
    except (KeyError, TypeError):
        return theirs
    for name, value in mine.items():
        if name not in old and name in LATER_SWITCHES and value == settings.SWITCHES[name].default:
            old[name] = value
    return {**theirs, "machine": {**theirs["machine"], "settings": old}}


def lost_counted(record: dict) -> dict | None:
    """A point whose summary has n_lost: as logged, or, logged before summaries counted lost requests, its gate's
    count (a policy's gate has none: it checks every request's tokens; a run out of memory lost them all); None for
    a peer's point that lost requests then (its summary left them out of the shares: measured again)."""
    if "n_lost" in record["summary"]:
        return record
    gate = record.get("gate", {})
    if "out_of_memory" in gate:  # every request, as run/search_report.memory_point now counts them
        return {**record, "summary": {**record["summary"], "n_lost": record["summary"].get("n_requests")}}
    return None if gate.get("lost", 0) else {**record, "summary": {**record["summary"], "n_lost": 0}}


HEAD = ('{"schema":' + json.dumps(LOG_SCHEMA)).encode()  # how every log begins (_write, start)
HEAD_AS_TEXT = re.compile(rb'\{\s*"schema"\s*:\s*' + re.escape(json.dumps(LOG_SCHEMA).encode()))  # also hand-written


def damaged_point(r) -> str | None:
    """What makes `r` no measured point (a field missing or of the wrong kind), or None."""
    if not isinstance(r, dict):
        return "not a measured point"
    missing = [k for k in ("policy", "rate", "rep", "summary") if k not in r]
    if missing:
        return f"not a measured point: no {', '.join(missing)}"
    for key, ok in (
        ("policy", isinstance(r["policy"], str)),
        ("rate", is_finite(r["rate"]) and r["rate"] > 0),
        ("rep", isinstance(r["rep"], int) and not isinstance(r["rep"], bool) and r["rep"] >= 0),
        ("summary", isinstance(r["summary"], dict) and all(v is None or is_number(v) for v in r["summary"].values())),
        ("gate", isinstance(r.get("gate", {}), dict)),
        ("rule", isinstance(r.get("rule", ""), str)),
    ):
        if not ok:
            return f"{key} {json.dumps(r.get(key))[:60]}"
    return None


def damaged_header(h: dict) -> str | None:
    """Which of the header's fields a search reads is missing or of the wrong kind, or None."""
    slo = h.get("slo") if isinstance(h.get("slo"), dict) else {}
    for key, ok in (
        ("identity", isinstance(h.get("identity"), dict)),
        ("created_utc", isinstance(h.get("created_utc"), str)),
        ("slo", all(is_finite(slo.get(k)) and slo[k] > 0 for k in ("decode_ms", "ttft_ms"))),
        ("slo", isinstance(slo.get("measured"), list)),
        ("calibration", isinstance(h.get("calibration") or {}, dict)),
    ):
        if not ok:
            return f"{key} {json.dumps(h.get(key))[:60]}"
    return None


def _kept_key(kind: str, key) -> tuple[str, str]:
    """A kept value's index: its kind and its key as JSON text, keys sorted (the same whether read or written)."""
    return kind, json.dumps(key, sort_keys=True)


class SearchLog:
    def __init__(self, path, identity: dict, *, note=None, any_machine: bool = False):
        self.path = Path(path)
        self.identity = json.loads(json.dumps(identity))  # as it reads back
        self.any_machine = any_machine  # a report made elsewhere from the log: its machine is the log's
        self.note = note or (lambda line: None)
        self.header, self.records, self.cut = None, [], 0
        self.unwritten = None  # a started log's header until its first line is written
        self._kept: dict = {}  # (kind, json key) -> value
        self.made = [p for p in reversed(self.path.parents) if not p.exists()] + [self.path] * (not self.path.exists())
        self.fd = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise OSError(0, "not a regular file")
        except OSError as e:
            self.close()
            raise InputError(f"cannot open search log {str(self.path)!r}: {e.strerror or e}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise InputError(f"search log {str(self.path)!r} is in use by another search") from None
        try:
            self._read()
        except BaseException:
            self.close()
            raise

    def _read(self):
        with open(self.fd, "rb", closefd=False) as f:
            data = f.read()
        where = f"search log {str(self.path)!r}"
        keep = data.rfind(b"\n") + 1  # what follows the last newline is a line cut by a kill: measured again
        lines = data[:keep].splitlines()
        try:
            header = json.loads(lines[0]) if lines else None
        except ValueError:
            header = None
        if lines:
            is_log = isinstance(header, dict) and header.get("schema") == LOG_SCHEMA
        else:  # empty, or only a header cut by a kill
            is_log = not data or HEAD.startswith(data) or HEAD_AS_TEXT.match(data) is not None
        if not is_log:
            raise InputError(f"{where} is not a search log (line 1 is not a {LOG_SCHEMA} header)")
        if lines:
            self._check(header, lines, where)
        if keep < len(data):  # only now, the file known to be a log of these params: nothing else is cut
            self.cut = len(data) - keep
            os.ftruncate(self.fd, keep)
            self.note(f"search log {self.path}: ignored a partial last line ({self.cut} bytes) left by a killed run")
        self.header = header

    def _check(self, header: dict, lines: list[bytes], where: str) -> None:
        """The header's fields and identity, then every point and kept value, read into records and _kept."""
        if bad := damaged_header(header):
            raise InputError(f"{where}: line 1 is damaged (its {bad})")
        if self.any_machine:
            self.identity["machine"] = header["identity"].get("machine")
        diff = first_difference(with_later_switches(header.get("identity"), self.identity), self.identity)
        if diff:
            raise InputError(
                f"{where} was made with other params or on another machine ({diff}); "
                f"use a new log, or the params it was made with"
            )
        for i, line in enumerate(lines[1:], start=2):
            try:
                r = json.loads(line)
                kept = isinstance(r, dict) and set(r) == {"kept", "key", "value"} and isinstance(r["kept"], str)
                bad = None if kept else damaged_point(r)
            except ValueError:
                bad = "not JSON"
            if bad:
                raise InputError(f"{where}: line {i} is damaged ({bad}); only a last line may be cut")
            if kept:
                self._kept[_kept_key(r["kept"], r["key"])] = r["value"]
            else:
                self.records.append(r)

    def start(self, fields: dict) -> dict:
        """The header of a new log: schema, identity, created_utc and `fields`, written before its first point or
        kept value (a search refused before either leaves no log)."""
        if self.header is not None:
            raise RuntimeError("the log has a header already")
        self.header = {"schema": LOG_SCHEMA, "identity": self.identity, "created_utc": utc_now(), **fields}
        self.unwritten = self.header
        return self.header

    def append(self, record: dict) -> None:
        """One measured point, on disk (fsync) before this returns."""
        if self.header is None:
            raise RuntimeError("a point before the log's header")
        self._write(record)
        self.records.append(json.loads(json.dumps(record)))

    def recall(self, kind: str, key):
        """The value kept under (kind, key), as it reads back, or None."""
        return self._kept.get(_kept_key(kind, key))

    def kept_keys(self, kind: str) -> list:
        """The keys of every value kept under `kind`, in the order first kept."""
        return [json.loads(k) for kd, k in self._kept if kd == kind]

    def keep(self, kind: str, key, value) -> None:
        """A value for later commands, on disk before this returns; recall(kind, key) finds it."""
        if self.header is None:
            raise RuntimeError("a kept value before the log's header")
        self._write({"kept": kind, "key": key, "value": value})
        self._kept[_kept_key(kind, key)] = json.loads(json.dumps(value))

    def _write(self, obj: dict) -> None:
        if self.unwritten is not None:
            header, self.unwritten = self.unwritten, None
            self._write(header)
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        n = os.write(self.fd, line)  # O_APPEND: at the end, in one write
        if n != len(line):
            raise OSError(f"search log {self.path}: wrote {n} of {len(line)} bytes")
        os.fsync(self.fd)

    def close(self) -> None:
        """Release the log; one this command made and never wrote to (refused or stopped before its first point
        or kept value) is removed with the folders made for it."""
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None
        if (self.header is None or self.unwritten is not None) and self.made:
            for p in reversed(self.made):
                try:
                    p.unlink() if p == self.path else p.rmdir()
                except OSError:  # not empty, or gone: left as it is
                    break
            self.made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

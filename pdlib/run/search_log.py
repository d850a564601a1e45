"""A rate search's log: one JSON line per measured run, appended as soon as the run ends, so a search killed at
any point resumes from every run it finished (pdlib/run/serve_search.py).

    log = SearchLog(path, identity, note=print)   # locks the file; reads what is there; refuses another search's
    if log.header is None:
        log.start({"slo": ...})                   # a new log: its header line, written once
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
from pathlib import Path

from pdlib import settings
from pdlib.errors import InputError

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


LATER_SWITCHES = ("PDLIB_ROUND_GROUP",)  # engine switches added after logs recorded the engine's settings


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
        self._kept: dict = {}  # (kind, json key) -> value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError as e:
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
        if data and not data.endswith(b"\n"):  # a line cut by a kill: its run is measured again
            keep = data.rfind(b"\n") + 1
            self.cut = len(data) - keep
            os.ftruncate(self.fd, keep)
            data = data[:keep]
            self.note(f"search log {self.path}: ignored a partial last line ({self.cut} bytes) left by a killed run")
        lines = data.splitlines()
        if not lines:
            return
        where = f"search log {str(self.path)!r}"
        try:
            header = json.loads(lines[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("schema") != LOG_SCHEMA:
            raise InputError(f"{where} is not a search log (line 1 is not a {LOG_SCHEMA} header)")
        if self.any_machine and isinstance(header.get("identity"), dict):
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
                kept = isinstance(r, dict) and set(r) == {"kept", "key", "value"}
                ok = kept or (isinstance(r, dict) and {"policy", "rate", "rep", "summary"} <= set(r))
            except ValueError:
                ok = False
            if not ok:
                raise InputError(f"{where}: line {i} is damaged (not a measured point); only a last line may be cut")
            if kept:
                self._kept[_kept_key(r["kept"], r["key"])] = r["value"]
            else:
                self.records.append(r)
        self.header = header

    def start(self, fields: dict) -> dict:
        """Write the header of a new log: schema, identity, created_utc and `fields`."""
        if self.header is not None:
            raise RuntimeError("the log has a header already")
        self.header = {"schema": LOG_SCHEMA, "identity": self.identity, "created_utc": utc_now(), **fields}
        self._write(self.header)
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
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        n = os.write(self.fd, line)  # O_APPEND: at the end, in one write
        if n != len(line):
            raise OSError(f"search log {self.path}: wrote {n} of {len(line)} bytes")
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

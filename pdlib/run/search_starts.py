"""Where each search begins when another search report says where its value lies (`serve --search --start-from
REPORT`): each run's value there, for the same SLO and criterion, so a search on another machine, or after a
change, brackets from near its answer rather than halving down from the params' start (on an H100 most of the
code trace's 164 points went to that: mlx-lm's 58 to reach "none at 1/32x").

    given = starts_from_report("outputs/serve-azure-code-h100/search.json.gz", settings)
    starts = run_starts(log, "chunked", given, from_log=False)   # {key: a rate per rep}; kept in the log
    start = starts.get(start_key("strict", "capacity"))         # None: the params' start

Each rep starts at its own value there (the highest rate it passed), on this search's grid, within [floor, hi]:
none passed -> floor, all passed -> hi; a rep the report lacks at the report's value. From such a start a search
brackets in steps of 1 + precision first (report.serving, `near`), so a value found again costs two points a rep.
A run the report lacks starts where the params say. What a run started from is kept in its log when its searches
first use it, so a command that resumes the log, or composes a report from it (--from-log), takes the same path
(a search's path decides which points it measures); a different report for a run whose start is kept is refused.
"""

import json

from pdlib.errors import InputError, is_finite
from pdlib.report.io import read_text, sha256_file
from pdlib.report.serving import grid_rate
from pdlib.run.search_report import SCHEMA, SLO_NAMES

KIND = "starts"  # the log's kept values: {"run": name} -> {"from": {path, sha256}, "starts": {key: [rate, ...]}}
_TAKEN = {"found", "budget"}  # statuses whose value is a measured passing rate
_REP = {"all_pass": "hi", "none_pass": "floor"}  # a rep with no passing rate of its own


def start_key(slo: str, criterion: str) -> str:
    return f"{slo}/{criterion}"


def starts_from_report(path, settings: dict) -> dict:
    """{"from": {path, sha256}, "runs": {run: {start_key: [a rate per rep]}}} from a search report; InputError,
    one line, naming the file, where it is not one."""
    where = str(path)
    text = read_text(path, what="search report")
    try:
        report = json.loads(text)
    except ValueError as e:
        raise InputError(f"--start-from {where}: not JSON ({e})") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA or not isinstance(report.get("searches"), list):
        raise InputError(f"--start-from {where}: not a search report (schema {SCHEMA!r} with a searches list)")
    floor = settings["floor"] if settings["floor"] is not None else settings["lo"]
    lo, hi = grid_rate(floor), grid_rate(settings["hi"])
    runs: dict = {}
    for i, s in enumerate(report["searches"]):
        r = s.get("result") if isinstance(s, dict) else None
        ok = isinstance(r, dict) and isinstance(s.get("policy"), str) and s.get("slo") in SLO_NAMES
        value = r.get("value") if ok else None
        if not ok or isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise InputError(f"--start-from {where}: searches[{i}] needs a policy, an slo of {SLO_NAMES} and a value")
        status = r.get("status")
        rate = hi if status == "at_least" else value if status in _TAKEN and value > 0 else lo
        theirs = r.get("reps") if isinstance(r.get("reps"), list) else []
        per = [_rep_start(theirs[i] if i < len(theirs) else None, rate, lo, hi) for i in range(settings["reps"])]
        runs.setdefault(s["policy"], {})[start_key(s["slo"], str(s.get("criterion")))] = per
    return {"from": {"path": where, "sha256": sha256_file(path)}, "runs": runs}


def _rep_start(rep, rate: float, lo: float, hi: float) -> float:
    """One rep's start: its highest passing rate in the report, floor or hi where it had none, else `rate`."""
    if isinstance(rep, dict):
        passed = rep.get("lo")
        if is_finite(passed) and passed > 0:
            rate = passed
        elif rep.get("status") in _REP:
            rate = {"hi": hi, "floor": lo}[_REP[rep["status"]]]
    return grid_rate(min(max(rate, lo), hi))


def run_starts(log, run: str, given: dict | None, *, from_log: bool) -> dict:
    """Run's starts ({start_key: [rate per rep]}; {} where none): the log's kept ones, else `given`'s
    (starts_from_report), kept in the log now unless composing from it; a given report other than the kept one's,
    where its starts for the run differ, is refused in one line."""
    kept = log.recall(KIND, {"run": run})
    mine = None if given is None else given["runs"].get(run)
    if kept is not None:
        if mine is not None and mine != kept["starts"]:
            raise InputError(
                f"--start-from {given['from']['path']}: the log's searches of {run} started from "
                f"{kept['from']['path']} (sha256 {kept['from']['sha256'][:12]}), elsewhere; give that report, or none"
            )
        return dict(kept["starts"])
    if mine is None:
        return {}
    if not from_log:
        log.keep(KIND, {"run": run}, {"from": given["from"], "starts": mine})
    return dict(mine)

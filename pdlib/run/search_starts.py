"""Where each search begins when another search report says where its value lies (`serve --search --start-from
REPORT`): each run's values there, rep by rep, for the same SLO and criterion, so a search on another machine, or
after a change, brackets from near its answer rather than halving down from the params' start
(docs/serving.md, Searches).

    given = starts_from_report("outputs/serve-azure-code-h100/search.json.gz")
    starts = resolve_starts(log, ["chunked", "mlx-lm-fp32@2048"], given, from_log=False, measured=set())
    rates = start_rates(starts["chunked"]["starts"]["strict/capacity"], settings)  # a start per rep

What a report says of one search is kept as it says it, not yet on this search's grid: per rep its highest passing
rate, "floor" where it passed none, "hi" where it passed every rate (this search's hi, not the report's), null where
it has none of these (then the search's value, or "floor"/"hi" as its status says). `start_rates` maps that onto the
params in use, within [floor, hi], one rate per rep (a rep the report lacks at the search's value). From such a
start a search brackets in steps of 1 + precision first (report.serving, `near`). A run the report lacks starts
where the params say.

What a run started from is kept in its log before its first point, so a command that resumes the log, or composes
a report from it (--from-log), takes the same starts without the flag (a search's path decides which points it
measures). Refused, in one line and before any point: starts other than those kept for a run, and starts for a run
the log already holds points of, measured from the params' start.
"""

import json

from pdlib.errors import InputError, is_finite
from pdlib.report.io import read_text, sha256_file
from pdlib.report.serving import grid_rate
from pdlib.run.search_report import SCHEMA, SLO_NAMES
from pdlib.run.serve_params import CRITERIA

KIND = "starts"  # the log's kept values: {"run": name} -> {"from": {path, sha256}, "starts": {key: entry}}
ENDS = ("floor", "hi")  # a start at the search's own floor or hi
_REP_END = {"none_pass": "floor", "all_pass": "hi"}  # a rep's status with no passing rate of its own


def start_key(slo: str, criterion: str) -> str:
    return f"{slo}/{criterion}"


def _raw(x) -> bool:
    return x in ENDS if isinstance(x, str) else is_finite(x) and x > 0


def _search_entry(result: dict) -> dict:
    """One search's starts as its report says them: {"value": raw, "reps": [raw or None, ...]}."""
    status, value = result.get("status"), result["value"]
    raw = "hi" if status == "at_least" else value if status in ("found", "budget") and value > 0 else "floor"
    reps = []
    for r in result.get("reps") if isinstance(result.get("reps"), list) else []:
        status = r.get("status") if isinstance(r, dict) else None
        passed = r.get("lo") if isinstance(r, dict) else None
        end = _REP_END.get(status) if isinstance(status, str) else None  # "hi" for all_pass, whose lo is its hi
        reps.append(end or (passed if _raw(passed) else None))
    return {"value": raw, "reps": reps}


def starts_from_report(path) -> dict:
    """{"from": {path, sha256}, "runs": {run: {start_key: entry}}} from a search report; InputError, one line,
    naming the file, where it is not one."""
    where = str(path)
    text = read_text(path, what="search report")
    try:
        report = json.loads(text)
    except ValueError as e:
        raise InputError(f"--start-from {where}: not JSON ({e})") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA or not isinstance(report.get("searches"), list):
        raise InputError(f"--start-from {where}: not a search report (schema {SCHEMA!r} with a searches list)")
    runs: dict = {}
    for i, s in enumerate(report["searches"]):
        r = s.get("result") if isinstance(s, dict) else None
        ok = isinstance(r, dict) and isinstance(s.get("policy"), str) and s.get("slo") in SLO_NAMES
        ok = ok and s.get("criterion") in CRITERIA and is_finite(r.get("value")) and r["value"] >= 0
        if not ok:
            raise InputError(
                f"--start-from {where}: searches[{i}] needs a policy, an slo of {', '.join(SLO_NAMES)}, a criterion "
                f"of {', '.join(CRITERIA)} and a result with a finite value"
            )
        runs.setdefault(s["policy"], {})[start_key(s["slo"], s["criterion"])] = _search_entry(r)
    return {"from": {"path": where, "sha256": sha256_file(path)}, "runs": runs}


def start_rates(entry: dict, settings: dict) -> list[float]:
    """An entry's start for each of the settings' reps, on the rate grid within [floor, hi]."""
    lo = grid_rate(settings["floor"] if settings["floor"] is not None else settings["lo"])
    hi = grid_rate(settings["hi"])
    reps = entry["reps"]
    picked = [reps[i] if i < len(reps) and reps[i] is not None else entry["value"] for i in range(settings["reps"])]
    return [lo if x == "floor" else hi if x == "hi" else grid_rate(min(max(x, lo), hi)) for x in picked]


def _checked(kept, log, run: str) -> dict:
    """A kept value as start_rates reads it, or InputError naming the log."""
    starts = kept.get("starts") if isinstance(kept, dict) else None
    origin = kept.get("from") if isinstance(kept, dict) else None
    ok = isinstance(origin, dict) and all(isinstance(origin.get(k), str) for k in ("path", "sha256"))
    ok = ok and isinstance(starts, dict) and all(isinstance(k, str) for k in starts)
    for e in starts.values() if ok else ():
        ok = ok and isinstance(e, dict) and _raw(e.get("value")) and isinstance(e.get("reps"), list)
        ok = ok and all(x is None or _raw(x) for x in e["reps"])
    if not ok:
        raise InputError(f"search log {log.path}: the starts kept for {run} are damaged: {json.dumps(kept)[:200]}")
    return kept


def resolve_starts(log, runs: list[str], given: dict | None, *, from_log: bool, measured: set) -> dict:
    """{run: {"from", "starts"}} for each run that starts from a report: the log's kept starts, else `given`'s
    (starts_from_report), kept in the log now (unless composing from it) once every run is known not to be refused
    (module docstring). `measured`: the runs the log holds points of."""
    out, new = {}, {}
    for run in runs:
        kept = log.recall(KIND, {"run": run})
        mine = None if given is None else given["runs"].get(run)
        if kept is not None:
            kept = _checked(kept, log, run)
            if mine is not None and mine != kept["starts"]:
                raise InputError(
                    f"--start-from {given['from']['path']}: the log's searches of {run} started from "
                    f"{kept['from']['path']} (sha256 {kept['from']['sha256'][:12]}) elsewhere; "
                    "give that report or none"
                )
            out[run] = kept
        elif mine is not None:
            if run in measured:
                raise InputError(
                    f"--start-from {given['from']['path']}: the log holds points of {run} searched from the params' "
                    "start; resume it without --start-from, leave it out (--policies, --peers), or begin another log"
                )
            out[run] = new[run] = {"from": given["from"], "starts": mine}
    for run, value in new.items() if not from_log else ():
        log.keep(KIND, {"run": run}, value)
    return out

"""Rate-search results as notebook 05 reads them ({run label: [report.serving.search result, ...]}), checked in
shape and against themselves: a value is a finite rate inside its own CI, a criterion is one report.serving
makes. A report that fails is refused in one line rather than drawn as a wrong page.

    check_searches(searches)   # searches, or InputError naming the run, the result and what is wrong
"""

import re

from pdlib.errors import InputError, is_finite, is_number

CRITERION = re.compile(r"(capacity|goodput)_\w+")  # report.serving's capacity_criterion, goodput_criterion


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x, lo: float = 0.0) -> bool:
    return is_finite(x) and x >= lo


def _point_ok(p) -> bool:
    return (
        isinstance(p, dict)
        and _finite(p.get("rate"))
        and p["rate"] > 0
        and _is_int(p.get("rep"))
        and p["rep"] >= 0
        and isinstance(p.get("metric", {}) or {}, dict)
        and all(v is None or is_number(v) for v in (p.get("metric") or {}).values())  # NaN: a quantity not measured
        and isinstance(p.get("pass"), bool)
    )


def _result_problem(r) -> str | None:
    """Why `r` is not a search result, or None: its shape, then what it must not contradict (a finite value >= 0
    inside its own CI, a criterion report.serving names)."""
    ci = r.get("ci") if isinstance(r, dict) else None
    shaped = (
        isinstance(r, dict)
        and isinstance(r.get("criterion"), str)
        and is_number(r.get("value"))
        and isinstance(ci, list | tuple)
        and len(ci) == 2
        and is_number(ci[0])
        and (ci[1] is None or is_number(ci[1]))
        and (ci[1] is not None or is_number(r.get("hi")))
        and (r.get("ci_level") is None or is_number(r["ci_level"]))
        and isinstance(r.get("points"), list)
        and all(_point_ok(p) for p in r["points"])
    )
    if not shaped:
        return "is not a search result (criterion, value, ci, points {rate, rep, metric, pass})"
    if not CRITERION.fullmatch(r["criterion"]):
        return f"has criterion {r['criterion']!r}; a search's is capacity_<slo> or goodput_<slo>"
    if not (_finite(r["value"]) and _finite(ci[0]) and (ci[1] is None or _finite(ci[1]))):
        return f"has value {r['value']!r} and ci {list(ci)!r}; both must be finite rates >= 0"
    if not (ci[0] <= r["value"] and (ci[1] is None or r["value"] <= ci[1])):
        return f"has value {r['value']:g} outside its own ci {list(ci)!r}"
    if r.get("ci_level") is not None and not 0 <= r["ci_level"] < 1:
        return f"has ci_level {r['ci_level']!r}; a confidence level is in [0, 1) (0: one rep)"
    return None


def check_searches(searches) -> dict:
    """`searches` if shaped {run label: [report.serving.search result, ...]} and no result contradicts itself,
    else InputError, one line."""
    if not isinstance(searches, dict) or not searches:
        raise InputError("searches must be a non-empty mapping {run label: [search results]}")
    for run, results in searches.items():
        if not isinstance(results, list) or not results:
            raise InputError(f"searches[{run!r}] must be a non-empty list of search results")
        for i, r in enumerate(results):
            problem = _result_problem(r)
            if problem:
                raise InputError(f"searches[{run!r}][{i}] {problem}")
    return searches

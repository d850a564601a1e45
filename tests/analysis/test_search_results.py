"""A rate-search result that contradicts itself is refused in one line naming the run, the result and the fault;
every planted fault below renders a wrong page if the check is removed."""

import copy
import json
import math

import pytest
from serve_reports import synthetic_searches

from pdlib.analysis import serving as sv
from pdlib.analysis.search_results import check_searches
from pdlib.errors import InputError
from pdlib.report.serving import slos_from_step

SLO = slos_from_step(2.0, 30.0)["strict"]


@pytest.fixture(scope="module")
def searches():
    return synthetic_searches(SLO)


def _planted(searches, edit):
    bad = copy.deepcopy(searches)
    edit(bad["chunked"][0])
    return bad


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda r: r.update(criterion="nonsense"), r"has criterion 'nonsense'; a search's is capacity_<slo>"),
        (lambda r: r.update(criterion="capacity"), r"has criterion 'capacity'"),
        (lambda r: r.update(value=math.nan), r"has value nan and ci .*both must be finite rates >= 0"),
        (lambda r: r.update(value=-1.0), r"has value -1.0 and ci"),
        (lambda r: r.update(value=math.inf), r"has value inf"),
        (lambda r: r.update(value=10**400), r"has value 10+ and ci"),  # past float range: no OverflowError
        (lambda r: r["ci"].__setitem__(0, math.nan), r"has value \S+ and ci \[nan, .*both must be finite"),
        (lambda r: r.update(value=r["ci"][0] / 2 - 0.01), r"has value \S+ outside its own ci"),
        (lambda r: r.update(ci=[r["value"], r["value"] / 2]), r"has value \S+ outside its own ci"),
        (lambda r: r.update(ci_level=1.5), r"has ci_level 1.5; a confidence level is in \[0, 1\)"),
        (lambda r: r["points"][0].update(rate=math.inf), r"is not a search result"),
        (lambda r: r["points"][0].update(rep=-1), r"is not a search result"),
    ],
)
def test_a_result_that_contradicts_itself_is_refused(searches, edit, said):
    assert check_searches(searches) is searches  # the untouched results pass
    with pytest.raises(InputError, match=r"^searches\['chunked'\]\[0\] " + said) as e:
        check_searches(_planted(searches, edit))
    assert "\n" not in str(e.value)


def test_a_nan_metric_is_a_quantity_not_measured_and_passes(searches):
    bad = _planted(searches, lambda r: r["points"][0]["metric"].update({"tbt_p99_ms": math.nan}))
    assert check_searches(bad) is bad


def test_a_search_listed_as_another_criterion_or_slo_is_refused(searches, tmp_path):
    listed = [
        {"policy": run, "peer": False, "slo": SLO.name, "criterion": r["criterion"].split("_")[0], "result": r}
        for run, results in searches.items()
        for r in results
    ]
    path = tmp_path / "search.json"
    path.write_text(json.dumps({"schema": sv.SEARCH_SCHEMA, "searches": listed}))
    assert list(sv.load_search_report(path)) == list(searches)
    for field, value, said in (
        ("criterion", "goodput", r"listed as goodput at slo strict, its result is capacity_strict"),
        ("slo", "relaxed", r"listed as capacity at slo relaxed, its result is capacity_strict"),
    ):
        bad = [{**listed[0], field: value}, *listed[1:]]
        path.write_text(json.dumps({"schema": sv.SEARCH_SCHEMA, "searches": bad}))
        with pytest.raises(InputError, match=rf"^{path}: searches\[0\] is {said}$"):
            sv.load_search_report(path)

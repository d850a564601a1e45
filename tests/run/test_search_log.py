"""A search's log on its own (pdlib.run.search_log): what it refuses, what it never touches, what it cleans up.

.venv/bin/python -m pytest -q tests/run/test_search_log.py
"""

import json

import pytest

from pdlib.errors import InputError
from pdlib.run.search_log import SearchLog, lost_counted

IDENTITY = {"model": "synthetic:tiny", "workload": {"first": 8}}
POINT = {"policy": "chunked", "rate": 2.0, "rep": 0, "summary": {"tbt_p99_ms": 3.5, "ttft_p90_ms": None}, "gate": {}}


def made_log(path) -> list[str]:
    with SearchLog(path, IDENTITY) as lg:
        lg.start({"slo": {"decode_ms": 1.0, "ttft_ms": 100.0, "measured": []}, "calibration": None})
        lg.append(POINT)
    return path.read_text().splitlines()


def test_a_log_reads_back_what_was_written(tmp_path):
    lines = made_log(tmp_path / "log.jsonl")
    with SearchLog(tmp_path / "log.jsonl", IDENTITY) as lg:
        assert lg.records == [POINT] and lg.header == json.loads(lines[0])


@pytest.mark.parametrize("text", [b'{"schema": "pdlib.serve/1", "runs": []}', b"model: synthetic:tiny\npolicies: [a"])
def test_a_file_that_is_no_log_is_refused_and_left_as_it_was(tmp_path, text):
    path = tmp_path / "report.json"
    path.write_bytes(text)  # no final newline: a log's would be a killed run's partial line, cut off
    with pytest.raises(InputError, match=r"is not a search log \(line 1 is not a pdlib.serve-search-log/1 header\)$"):
        SearchLog(path, IDENTITY)
    assert path.read_bytes() == text


def test_a_logs_partial_last_line_is_still_cut(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = made_log(path)
    path.write_text("\n".join(lines) + "\n" + lines[1][:30])
    said = []
    with SearchLog(path, IDENTITY, note=said.append) as lg:
        assert lg.records == [POINT] and lg.cut == 30
    assert path.read_text() == "\n".join(lines) + "\n" and "ignored a partial last line (30 bytes)" in said[0]


def test_a_log_without_a_point_is_removed_with_the_folders_made_for_it(tmp_path):
    path = tmp_path / "a" / "b" / "log.jsonl"
    with SearchLog(path, IDENTITY) as lg:
        assert path.is_file()
        lg.start({"slo": {"decode_ms": 1.0, "ttft_ms": 100.0, "measured": []}})
        assert path.read_text() == ""  # the header waits for the first point
    assert not (tmp_path / "a").exists()  # refused or stopped before a point: nothing left behind
    with SearchLog(path, IDENTITY) as lg:
        lg.start({"slo": {"decode_ms": 1.0, "ttft_ms": 100.0, "measured": []}})
        lg.keep("references", {"rep": 0}, {"r0": [1, 2]})
    assert [json.loads(x).get("schema") for x in path.read_text().splitlines()] == ["pdlib.serve-search-log/1", None]
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "empty.jsonl").write_text("")
    SearchLog(tmp_path / "kept" / "empty.jsonl", IDENTITY).close()  # it was there before: left
    assert (tmp_path / "kept" / "empty.jsonl").is_file()


@pytest.mark.parametrize("where", ["under-a-file", "dev-null"])
def test_a_log_path_that_cannot_be_a_log_is_refused_in_one_line(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    path = tmp_path / "afile" / "log.jsonl" if where == "under-a-file" else "/dev/null"
    with pytest.raises(InputError, match="^cannot open search log ") as e:
        SearchLog(path, IDENTITY)
    assert "\n" not in str(e.value) and (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rate": "abc"}, 'rate "abc"'),
        ({"rate": None}, "rate null"),
        ({"rate": 0}, "rate 0"),
        ({"rep": "x"}, 'rep "x"'),
        ({"rep": 0.5}, "rep 0.5"),
        ({"rep": True}, "rep true"),
        ({"summary": None}, "summary null"),
        ({"summary": {"tbt_p99_ms": "x"}}, "summary "),
        ({"gate": "x"}, 'gate "x"'),
        ({"policy": 3}, "policy 3"),
        ({"rule": 1}, "rule 1"),
    ],
)
def test_a_point_with_a_field_of_the_wrong_kind_is_refused_by_line(tmp_path, change, message):
    path = tmp_path / "log.jsonl"
    lines = made_log(path)
    path.write_text("\n".join([lines[0], json.dumps({**POINT, **change})]) + "\n")
    with pytest.raises(InputError, match=r"line 2 is damaged \(" + message):
        SearchLog(path, IDENTITY)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"slo": None}, "slo null"),
        ({"slo": "x"}, 'slo "x"'),
        ({"slo": {"decode_ms": 1.0, "measured": []}}, "slo "),
        ({"slo": {"decode_ms": float("nan"), "ttft_ms": 1.0, "measured": []}}, "slo "),
        ({"slo": {"decode_ms": 1.0, "ttft_ms": 1.0}}, "slo "),
        ({"created_utc": None}, "created_utc null"),
        ({"calibration": [1]}, r"calibration \[1\]"),
    ],
)
def test_a_header_missing_what_a_search_reads_is_refused(tmp_path, change, message):
    path = tmp_path / "log.jsonl"
    lines = made_log(path)
    header = {**json.loads(lines[0]), **change}
    path.write_text("\n".join([json.dumps(header, separators=(",", ":")), *lines[1:]]) + "\n")
    with pytest.raises(InputError, match=r"line 1 is damaged \(its " + message):
        SearchLog(path, IDENTITY)
    without = {k: v for k, v in json.loads(lines[0]).items() if k not in change}
    path.write_text("\n".join([json.dumps(without, separators=(",", ":")), *lines[1:]]) + "\n")
    if "calibration" in change:  # optional: a header without one reads as none measured
        SearchLog(path, IDENTITY).close()
        return
    with pytest.raises(InputError, match=r"line 1 is damaged \(its "):
        SearchLog(path, IDENTITY)


def test_another_searchs_log_with_a_partial_line_is_refused_and_not_cut(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = made_log(path)
    text = "\n".join(lines) + "\n" + lines[1][:30]
    path.write_text(text)
    with pytest.raises(InputError, match=r"other params or on another machine \(workload.first: 8 != 6\)"):
        SearchLog(path, {**IDENTITY, "workload": {"first": 6}})
    assert path.read_text() == text  # cut only once the log is known to be this search's


def test_a_point_logged_before_lost_requests_were_counted_takes_its_gates_count():
    assert lost_counted(POINT)["summary"] == {**POINT["summary"], "n_lost": 0}  # a policy's: its gate checks all
    peer = {**POINT, "policy": "mlx-lm-fp32@2048", "gate": {"peer": True, "lost": 0}}
    assert lost_counted(peer)["summary"]["n_lost"] == 0 and "n_lost" not in peer["summary"]
    assert lost_counted({**peer, "gate": {"peer": True, "lost": 2}}) is None  # its shares left them out: redone
    now = {**peer, "summary": {**POINT["summary"], "n_lost": 2}, "gate": {"peer": True, "lost": 2}}
    assert lost_counted(now) is now
    oom = {**POINT, "summary": {"n_requests": 48, "tbt_p99_ms": None}, "gate": {"out_of_memory": "..."}}
    assert lost_counted(oom)["summary"]["n_lost"] == 48

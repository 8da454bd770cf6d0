"""Conformance reports, also of an interrupted run (issue 16, item 11): every format says the run was
interrupted and lists the tests that finished."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from harness.jobs import report

RESULTS = [
    {"id": "conformance/test_a.py::test_passes", "outcome": "passed", "seconds": 1.5, "message": "",
     "properties": {"dra_feature": "DynamicResourceAllocation", "dra_maturity": "ga"}},
    {"id": "conformance/test_a.py::test_fails", "outcome": "failed", "seconds": 2.0, "message": "assert 1 == 2",
     "properties": {"dra_feature": "DRADeviceTaints", "dra_maturity": "ga"}},
]
REASON = "stopped by SIGINT after 2 finished tests"


def _write(tmp_path, interrupted=None):
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    return report.write(tmp_path, report.load_results(tmp_path), interrupted=interrupted)


def test_interrupted_report_says_so_in_every_format(tmp_path):
    summary = _write(tmp_path, REASON)
    assert (summary["passed"], summary["failed"]) == (1, 1)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["interrupted"] is True and data["interruptedReason"] == REASON
    markdown = (tmp_path / "report.md").read_text()
    assert f"**INTERRUPTED**: {REASON}" in markdown
    html = (tmp_path / "report.html").read_text()
    assert "INTERRUPTED" in html and REASON in html
    for text in (markdown, html):
        assert "test_passes" in text and "test_fails" in text
    # pytest wrote no JUnit file (killed): one is written from the results, marked as interrupted
    root = ET.parse(tmp_path / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    assert {p.get("name"): p.get("value") for p in suite.iter("property")} == {"interrupted": REASON}
    names = {case.get("name") for case in suite.iter("testcase")}
    assert names == {"test_passes", "test_fails"}
    assert suite.find("testcase[@name='test_fails']/failure").get("message") == "assert 1 == 2"


def test_interrupted_report_keeps_pytests_junit_and_marks_it(tmp_path):
    (tmp_path / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="1">'
        '<testcase classname="conformance.test_a" name="test_passes" time="1.5"/></testsuite></testsuites>')
    _write(tmp_path, REASON)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("name") == "pytest"  # pytest's own file, not a replacement
    assert suite.find("properties/property[@name='interrupted']").get("value") == REASON


def test_complete_report_is_not_marked(tmp_path):
    _write(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["interrupted"] is False
    assert "INTERRUPTED" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "junit.xml").exists()  # pytest's job when it was not interrupted


def test_cut_short_results_file_reads_as_no_results(tmp_path):
    (tmp_path / "results.json").write_text('[{"id": "x", "outco')
    assert report.load_results(tmp_path) == []


def test_report_dir_checks(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert [p.problem for p in report.dir_problems(afile)] == ["is a file"]
    assert [p.problem for p in report.dir_problems(afile / "sub")] == [f"{afile} is a file, not a directory"]
    assert report.dir_problems(tmp_path / "new" / "deeper") == []
    assert not (tmp_path / "new").exists()  # judged without creating anything

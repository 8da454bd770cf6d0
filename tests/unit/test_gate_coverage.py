"""Every DRA gate of clusters/feature-gates/ has tests marked with it, or is listed here as not yet tested:
adding a gate to the matrix without tests fails, and so does a gate that got tests but is still listed (the
list only shrinks). Read from the test files' `dra_feature("<gate>"` markers, as the issue measured them; and
every such gate has at least two tests, counted from what pytest collects."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from harness.config import featuregates

CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"
MARKER = re.compile(r"""dra_feature\(\s*["']([A-Za-z]+)["']""")
# Gates of 1.37 the suite has no test for yet (the issue "Every DRA feature of Kubernetes 1.37 in the suite").
NOT_YET_TESTED: set[str] = set()
# DRA-related gates whose tests are outside the conformance suite: their matrix entry says where (`testedBy`).
ELSEWHERE = {g for g, info in featuregates.load_matrix("1.37").gates.items() if info.tested_by}


def _marked() -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in CONFORMANCE.rglob("*.py"):
        for gate in MARKER.findall(path.read_text()):
            counts[gate] = counts.get(gate, 0) + 1
    return counts


def test_every_gate_has_tests_or_is_listed_as_not_yet_tested():
    gates = set(featuregates.load_matrix("1.37").gates)
    marked = _marked()
    untested = {g for g in gates - ELSEWHERE if g not in marked}
    assert untested - NOT_YET_TESTED == set(), f"gates without a test: {sorted(untested - NOT_YET_TESTED)}"
    tested_now = NOT_YET_TESTED & set(marked)
    assert not tested_now, f"gates with tests now: remove {sorted(tested_now)} from NOT_YET_TESTED"
    assert NOT_YET_TESTED <= gates and ELSEWHERE <= gates



COUNT_TESTS = """
import collections, json, sys
import pytest

class Count:
    def __init__(self):
        self.tests = collections.Counter()

    def pytest_collection_modifyitems(self, items):
        for item in items:
            for gate in {m.args[0] for m in item.iter_markers("dra_feature")}:
                self.tests[gate] += 1

count = Count()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", sys.argv[1]], plugins=[count])
print("COUNTS=" + json.dumps(count.tests))
sys.exit(int(code))
"""


def test_every_dra_gate_has_at_least_two_tests():
    """The behaviour and its failure path, at least: counted from the collected tests' markers (module-level
    `pytestmark` and marker variables included), not from the text."""
    proc = subprocess.run([sys.executable, "-c", COUNT_TESTS, str(CONFORMANCE)], capture_output=True, text=True,
                          timeout=120, cwd=CONFORMANCE.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = json.loads(proc.stdout.rsplit("COUNTS=", 1)[1])
    gates = set(featuregates.load_matrix("1.37").gates) - ELSEWHERE - NOT_YET_TESTED
    too_few = {g: counts.get(g, 0) for g in gates if counts.get(g, 0) < 2}
    assert not too_few, f"DRA gates with fewer than two tests: {too_few}"


def test_every_gate_has_a_row_with_its_kep_in_the_docs():
    text = (CONFORMANCE.parent / "docs" / "conformance.md").read_text()
    section = text.split("## Gate coverage", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\w+) \| \[KEP-(\d+)\]", section, flags=re.M))
    gates = set(featuregates.load_matrix("1.37").gates)
    assert set(rows) == gates, f"docs/conformance.md 'Gate coverage': missing {sorted(gates - set(rows))}, " \
                               f"not a gate {sorted(set(rows) - gates)}"

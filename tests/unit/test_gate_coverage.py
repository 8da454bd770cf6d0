"""Every DRA gate of clusters/feature-gates/ has tests marked with it, or is listed here as not yet tested:
adding a gate to the matrix without tests fails, and so does a gate that got tests but is still listed (the
list only shrinks). Read from the test files' `dra_feature("<gate>"` markers, as the issue measured them."""

from __future__ import annotations

import re
from pathlib import Path

from harness.config import featuregates

CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"
MARKER = re.compile(r"""dra_feature\(\s*["']([A-Za-z]+)["']""")
# Gates of 1.37 the suite has no test for yet (the issue "Every DRA feature of Kubernetes 1.37 in the suite").
# NodeDeclaredFeatures and SchedulerPreQueueingHints are DRA-related but tested elsewhere (the load tests).
NOT_YET_TESTED = {
    "DRADerivedAttributes", "DRAListTypeAttributes",
}
ELSEWHERE = {"NodeDeclaredFeatures", "SchedulerPreQueueingHints"}


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


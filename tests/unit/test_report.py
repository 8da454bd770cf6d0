"""Building the conformance report from recorded results: credit only for the driver under test,
helper-driver tests apart, not applicable and expected failures shown as such."""

from __future__ import annotations

from harness.jobs import report

VENDOR = "gpu.example.com"
HELPER = "gpu.fd0-abc.example.com"


def _record(test: str, outcome: str, feature: str, drivers: list[str] | None = None, message: str = "",
            fake: list[str] | None = None) -> dict:
    props = {"dra_feature": feature, "dra_maturity": "ga"}
    if fake is not None:
        props[report.FAKE_DRIVERS] = fake
    if drivers is not None:
        props[report.ALLOCATED] = drivers
    return {"id": f"conformance/test_x.py::{test}", "outcome": outcome, "seconds": 1.0, "message": message,
            "properties": props}


RESULTS = [
    _record("test_kubelet", "passed", "DynamicResourceAllocation", [VENDOR]),
    _record("test_slices", "passed", "DynamicResourceAllocation", []),
    _record("test_rule_status", "passed", "DRADeviceTaintRules", [HELPER], fake=[HELPER]),
    _record("test_hand_made_slices", "passed", "DRAPrioritizedList", ["gpu-abc.example.com"]),
    _record("test_api_validation", "passed", "DRAWorkloadResourceClaims", []),
    _record("test_gang", "xfailed", "DRAWorkloadResourceClaims", [HELPER],
            "expected failure: v1.37.2 scheduler bug (failed with: AssertionError: swapped)"),
    _record("test_std_attributes", "not applicable", "DRAPartitionableDevices", [],
            "not applicable: driver(s) gpu.example.com publishes no standard attribute"),
    _record("test_broken", "failed", "DRAExtendedResource", [VENDOR], "boom"),
    _record("test_fake_only", "skipped", "DRAConsumableCapacity", None, "needs the fake driver's powers"),
]


def _rows(data: dict) -> dict[str, str]:
    return {row["feature"]: row["status"] for row in data["matrix"]}


def test_vendor_run_credits_only_features_whose_passing_tests_used_the_vendors_devices():
    data = report.build(RESULTS, run={"drivers": [VENDOR]})
    assert _rows(data) == {"DynamicResourceAllocation": "pass", "DRADeviceTaintRules": "not credited",
                           "DRAWorkloadResourceClaims": "not credited", "DRAPartitionableDevices": "n/a",
                           "DRAExtendedResource": "FAIL", "DRAConsumableCapacity": "skip",
                           "DRAPrioritizedList": "not credited"}
    assert [(t["id"].split("::")[1], t["drivers"]) for t in data["uncredited"]] == [
        ("test_slices", []), ("test_rule_status", [HELPER]), ("test_hand_made_slices", ["gpu-abc.example.com"]),
        ("test_api_validation", [])]
    assert (data["passed"], data["xfailed"], data["not applicable"], data["failed"]) == (5, 1, 1, 1)


def test_fake_driver_run_credits_allocations_from_the_fake_driver_only():
    data = report.build(RESULTS, run={})
    assert _rows(data)["DRADeviceTaintRules"] == "pass"  # its own fake-driver instance's device
    assert _rows(data)["DRAPrioritizedList"] == "not credited"  # hand-made slices: a helper
    assert _rows(data)["DRAWorkloadResourceClaims"] == "not credited"  # nothing allocated by a passing test


def test_only_expected_failures_show_as_xfail():
    data = report.build([r for r in RESULTS if r["outcome"] == "xfailed"], run={})
    assert _rows(data) == {"DRAWorkloadResourceClaims": "xfail"}


def test_markdown_and_html_show_credit_and_outcomes():
    data = report.build(RESULTS, run={"drivers": [VENDOR]})
    text = report.markdown(data)
    assert "| DRADeviceTaintRules | ga | not credited | 1 (0) |" in text
    assert "## Passed without a device of the driver under test" in text
    assert f"| `conformance/test_x.py::test_rule_status` | DRADeviceTaintRules | {HELPER} |" in text
    assert "| xfailed | 1.0 | gpu.fd0-abc.example.com | expected failure: v1.37.2 scheduler bug" in text
    assert "5 passed, 1 failed, 1 skipped, 1 xfailed, 1 not applicable" in text
    page = report.to_html(data)
    assert "not credited" in page and "xfailed" in page and "n/a" in page


pytest_plugins = ["pytester"]


def test_recorder_writes_xfail_and_not_applicable_outcomes(pytester):
    """The plugin's results.json, from a real pytest run: an xfail is "xfailed" with its reason (not a
    skip with a traceback), a skip with the not-applicable property is "not applicable"."""
    import json

    pytester.makepyfile(test_outcomes='''
import pytest

@pytest.mark.xfail(reason="v1.37.2 scheduler bug", strict=True)
def test_expected():
    assert 1 == 2, "swapped"

def test_nothing_to_check(record_property):
    record_property("dra_not_applicable", "publishes no standard attribute")
    pytest.skip("not applicable: publishes no standard attribute")

def test_ok():
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--dra-report-dir={pytester.path / 'r'}")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1)
    records = {r["id"].split("::")[1]: r for r in json.loads((pytester.path / "r" / "results.json").read_text())}
    assert records["test_expected"]["outcome"] == "xfailed"
    assert records["test_expected"]["message"].startswith("expected failure: v1.37.2 scheduler bug (failed with: ")
    assert "swapped" in records["test_expected"]["message"] and "Traceback" not in records["test_expected"]["message"]
    assert records["test_nothing_to_check"]["outcome"] == "not applicable"
    assert records["test_ok"]["outcome"] == "passed"


def test_every_gate_of_the_version_has_a_row_and_gates_without_tests_say_no_test():
    secondary = _record("test_bound", "passed", "DRAExtendedResource", [VENDOR])
    secondary["properties"]["dra_features"] = ["DRAExtendedResource", "DRADeviceBindingConditions"]
    data = report.build(RESULTS + [secondary], run={"drivers": [VENDOR]},
                        cluster={"version": "v1.37.2", "gates": {"DRADerivedAttributes": True,
                                                                 "DRAListTypeAttributes": False}})
    gates = {g["gate"]: g for g in data["gates"]}
    matrix = {name for name in report.featuregates.load_matrix("1.37").gates}
    assert set(gates) == matrix  # every gate of clusters/feature-gates/v1.37.yaml, tested or not
    assert gates["DRADerivedAttributes"]["status"] == "no test" and gates["DRADerivedAttributes"]["on"] is True
    assert gates["DRAExtendedResource"]["status"] == "FAIL" and gates["DRAExtendedResource"]["tests"] == 2
    # a test counts for each gate it is marked with, not only its first
    assert gates["DRADeviceBindingConditions"] == {**gates["DRADeviceBindingConditions"], "tests": 1, "status": "pass"}
    assert gates["DRAWorkloadResourceClaims"]["status"] == "pass"  # one passed, one xfailed
    assert [g["stage"] for g in data["gates"]] == sorted((g["stage"] for g in data["gates"]),
                                                         key=report.STAGE_ORDER.get)
    text = report.markdown(data)
    assert "| DRADerivedAttributes | alpha | yes | 0 | 0 | 0 | no test |" in text
    assert "| DRAListTypeAttributes | alpha | no | 0 | 0 | 0 | no test |" in text
    assert "no test" in report.to_html(data)
    # a gate whose tests are outside the suite says where, not "no test"
    assert gates["SchedulerPreQueueingHints"]["status"] == "tested by the load scenarios (docs/load.md)"


def test_no_gate_rows_without_a_known_version():
    assert report.build(RESULTS)["gates"] == []
    assert report.build(RESULTS, cluster={"version": "v9.99.0"})["gates"] == []

"""The sanity mode's pure parts: the rules table, CDI resolution, the report, and the refusals of its command."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.core.records import TestResult
from harness.jobs import sanity_runner
from harness.sanity import cdi, rules

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "conformance" / "sanity" / "test_kubelet_plugin_contract.py"
CONTRACT = ROOT / "docs" / "contract.md"


def _check_names() -> set[str]:
    tree = ast.parse(CHECKS.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_rule_has_one_check_and_every_check_one_rule():
    assert len({r.id for r in rules.RULES}) == len(rules.RULES), "rule ids repeat"
    assert len({r.check for r in rules.RULES}) == len(rules.RULES), "two rules share a check"
    assert {r.check for r in rules.RULES} == _check_names()


def test_each_failure_of_a_check_names_its_own_rule():
    """A check's fail(...) calls name the rule whose check it is (or a rule a helper enforces on the way)."""
    source = CHECKS.read_text()
    tree = ast.parse(source)
    helpers = {"KP-PREP-ANSWER", "KP-REG-SOCKET", "KP-REG-VERSIONS"}  # KubeletView's own checks
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in rules.BY_CHECK:
            named = {call.args[0].value for call in ast.walk(node) if isinstance(call, ast.Call)
                     and getattr(call.func, "id", "") == "fail" and isinstance(call.args[0], ast.Constant)}
            named |= {call.args[-1].value for call in ast.walk(node) if isinstance(call, ast.Call)
                      and getattr(call.func, "id", "") == "_unprepared_cleanly"}
            assert named <= {rules.BY_CHECK[node.name].id} | helpers, (node.name, named)


def test_rules_have_sources_at_the_release_versions():
    for rule in rules.RULES:
        assert rule.level in ("MUST", "SHOULD") and rule.text.endswith(".") and rule.sources, rule.id
        for source in rule.sources:
            assert re.search(r"@v(0|1)\.37\.2 |^kubernetes/kubernetes#\d+|^CDI specification", source), (rule.id, source)


def test_docs_contract_lists_every_rule_with_its_source():
    text = CONTRACT.read_text()
    assert rules.markdown() in text, "docs/contract.md's rules table is not `python -m harness.sanity.rules`"
    for rule in rules.RULES:
        row = next((line for line in text.splitlines() if line.startswith(f"| {rule.id} |")), None)
        assert row is not None, f"docs/contract.md has no row for {rule.id}"
        assert f"| {rule.level} |" in row and rule.check in row, rule.id


def test_failure_message_starts_with_the_rule():
    assert rules.failure("KP-PREP-REPEAT", "driver d: x") == "KP-PREP-REPEAT (MUST): driver d: x"


@pytest.mark.parametrize("device_id, expected", [
    ("gpu.example.com/gpu=gpu-0", ("gpu.example.com/gpu", "gpu-0")),
    ("k8s.gpu.example.com/claim=1f2e-3d:gpu-0", ("k8s.gpu.example.com/claim", "1f2e-3d:gpu-0")),
    ("vendor.x/class=2a", ("vendor.x/class", "2a")),
    ("gpu-0", None), ("vendor/class", None), ("1vendor/class=x", None), ("vendor/cla.ss=x", None),
    ("vendor/class=-x", None), ("vendor/class=", None),
])
def test_qualified_cdi_names(device_id, expected):
    assert cdi.parse(device_id) == expected


def test_spec_directory_resolves_ids_by_kind_and_name(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "v.x/gpu",
                                                 "devices": [{"name": "g0"}, {"name": "g1"}]}))
    (tmp_path / "b.yaml").write_text("cdiVersion: 0.6.0\nkind: v.x/claim\ndevices:\n- name: u-1\n")
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "nokind.json").write_text(json.dumps({"cdiVersion": "0.5.0", "devices": []}))
    (tmp_path / "notes.txt").write_text("not a spec")
    specs = cdi.read(tmp_path)
    assert specs.resolve("v.x/gpu=g1") == ["a.json"]
    assert specs.resolve("v.x/claim=u-1") == ["b.yaml"]
    assert specs.resolve("v.x/gpu=u-1") == [] and specs.resolve("v.x/other=g0") == [] and specs.resolve("junk") == []
    assert set(specs.broken) == {"broken.json", "nokind.json"} and "notes.txt" not in specs.files
    assert cdi.read(tmp_path / "missing").files == set()


def _vendor(tmp_path: Path, plugin: bool = True) -> Path:
    lines = ["apiVersion: dra-harness.x-k8s.io/v1alpha1", "kind: VendorDriver", "metadata: {name: acme}",
             "spec:", "  drivers: [gpu.acme.example]"]
    if plugin:
        lines += ["  kubeletPlugin:", "    command: '{python}'", "    args: [-m, acme, '--node={nodeName}']"]
    path = tmp_path / "vendor.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_python_placeholder_names_this_interpreter(tmp_path):
    from harness.vendor import file as vendor
    loaded = vendor.load(str(_vendor(tmp_path)))
    assert loaded.kubelet_plugin is not None and loaded.kubelet_plugin.command == sys.executable


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, cwd=ROOT)


def test_sanity_refuses_a_vendor_file_without_a_plugin_before_starting_anything(tmp_path):
    done = _cli("sanity", "--driver-config", str(_vendor(tmp_path, plugin=False)), "--report-dir", str(tmp_path / "r"))
    assert done.returncode == cli.EXIT_BAD_INPUT, done
    assert "spec.kubeletPlugin" in done.stderr + done.stdout and "is missing" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr and not (tmp_path / "r").exists()


def test_conformance_validate_lists_every_problem_of_every_file(tmp_path):
    good = _vendor(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: VendorDriver\nmetadata: {name: b}\n"
                   "spec:\n  drivers: [Not_A_Driver]\n  features: [DRAExtendedResources]\n")
    done = _cli("conformance", "validate", "--driver-config", str(good))
    assert done.returncode == 0 and done.stdout.startswith(f"ok: {good}: drivers gpu.acme.example"), done
    done = _cli("conformance", "validate", "--driver-config", str(good), "--driver-config", str(bad))
    printed = done.stdout + done.stderr
    assert done.returncode == cli.EXIT_BAD_INPUT, done
    assert "spec.drivers[0]" in printed and "spec.features[0]" in printed and "DRAExtendedResources" in printed
    assert "Traceback" not in done.stderr


def test_report_gives_every_rule_an_outcome(tmp_path):
    from harness.vendor import file as vendor
    loaded = vendor.load(str(_vendor(tmp_path)))
    results = [TestResult("t::a", "passed", properties={"contract_rule": "KP-REG-INFO"}),
               TestResult("t::b", "failed", message="KP-RESTART-CDI (MUST): a | b",
                          properties={"contract_rule": "KP-RESTART-CDI"}),
               TestResult("t::c", "not applicable", message="not applicable: x",
                          properties={"contract_rule": "KP-HEALTH-INITIAL"})]
    counts = sanity_runner.write_report(tmp_path / "sanity.md", loaded, results)
    text = (tmp_path / "sanity.md").read_text()
    assert counts["passed"] == 1 and counts["failed"] == 1 and counts["not applicable"] == 1
    assert "| KP-REG-INFO | MUST | passed |" in text and "| KP-RESTART-CDI | MUST | failed | KP-RESTART-CDI (MUST): a \\| b |" in text
    assert text.count("not checked") == len(rules.RULES) - 3


def test_the_suite_on_a_cluster_never_collects_the_sanity_checks(pytester_or_skip=None):
    """conformance/ on a cluster must not pick up conformance/sanity (it starts a cluster of its own)."""
    from conformance import conftest
    assert conftest.SANITY_DIR == ROOT / "conformance" / "sanity" and conftest.SANITY_DIR.is_dir()

    class Config:
        def __init__(self, value):
            self.value = value

        def getoption(self, name):
            assert name == "--dra-sanity-driver-config"
            return self.value

    assert conftest.pytest_ignore_collect(conftest.SANITY_DIR, Config(None)) is True
    assert conftest.pytest_ignore_collect(conftest.SANITY_DIR, Config("v.yaml")) is None
    assert conftest.pytest_ignore_collect(ROOT / "conformance" / "test_topology.py", Config(None)) is None


def test_a_skip_that_says_not_applicable_is_recorded_so(tmp_path):
    """Where a check has no test request at hand (conformance.under_test's pools), its skip's own words
    mark it not applicable; any other skip stays a skip."""
    from types import SimpleNamespace

    from harness.pytest_plugin.plugin import ResultRecorder
    recorder = ResultRecorder(tmp_path / "results.json")
    for nodeid, reason in (("t::na", "not applicable: the driver has no such thing"), ("t::skip", "needs 2 devices")):
        for when in ("setup", "teardown"):
            recorder.pytest_runtest_logreport(SimpleNamespace(  # type: ignore[arg-type]
                nodeid=nodeid, duration=0.1, user_properties=[], when=when, passed=False, failed=False,
                skipped=when == "setup", longrepr=("f", 1, f"Skipped: {reason}") if when == "setup" else None))
    records = {r["id"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert records["t::na"]["outcome"] == "not applicable"
    assert records["t::skip"]["outcome"] == "skipped" and records["t::skip"]["message"] == "needs 2 devices"


def _slice(name: str, generation: int, count: int = 1, devices=("d0",), pool: str = "p") -> dict:
    return {"metadata": {"name": name}, "spec": {"driver": "d.example.com", "nodeName": "n",
                                                 "pool": {"name": pool, "generation": generation,
                                                          "resourceSliceCount": count},
                                                 "devices": [{"name": d} for d in devices]}}


def test_a_change_that_keeps_its_generation_is_named():
    from harness.sanity.slicewatch import Event, same_generation_changes
    fine = [Event(0, "ADDED", _slice("s", 1)), Event(1, "MODIFIED", _slice("s", 2, devices=("d0", "d1"))),
            Event(2, "MODIFIED", _slice("s", 2, devices=("d0", "d1"))),  # a resync without a change
            Event(3, "DELETED", _slice("s", 2)), Event(4, "ADDED", _slice("s", 1, devices=("x",)))]  # a reset
    assert same_generation_changes(fine) == []
    broken = [Event(0, "ADDED", _slice("s", 3)), Event(1, "MODIFIED", _slice("s", 3, devices=("d0", "d9")))]
    assert same_generation_changes(broken) == [
        "slice s of pool d.example.com/p changed its devices and kept generation 3"]


def test_incomplete_spells_of_a_pool_are_timed():
    from harness.sanity.slicewatch import Event, incomplete_spells
    events = [Event(0.0, "ADDED", _slice("a", 1, count=2)),            # 1 of 2: incomplete from 0
              Event(0.5, "ADDED", _slice("b", 1, count=2)),            # complete at 0.5
              Event(10.0, "MODIFIED", _slice("a", 2, count=2)),        # gen 2: 1 of 2 from 10
              Event(22.0, "MODIFIED", _slice("b", 2, count=2)),        # complete at 22: 12 s
              Event(30.0, "MODIFIED", _slice("b", 3, count=1)),        # disagreeing counts? newest gen 3 alone, count 1
              Event(31.0, "DELETED", _slice("a", 2, count=2)), Event(31.5, "DELETED", _slice("b", 3, count=1))]
    spells = incomplete_spells(events, until=40.0)
    assert spells == {("d.example.com", "p"): 12.0}
    still = incomplete_spells([Event(5.0, "ADDED", _slice("a", 1, count=3))], until=20.0)
    assert still == {("d.example.com", "p"): 15.0}


def test_the_kubelet_side_reads_answers_and_call_errors(tmp_path):
    """prepare/unprepare over a real unix socket against a canned DRAPlugin v1: devices and per-claim
    errors come back as records; a call that fails as a whole is its gRPC status."""
    import tempfile
    from concurrent import futures

    import grpc

    from fake_devices.kubeletplugin.generated import dra_v1_pb2 as pb
    from fake_devices.kubeletplugin.generated import dra_v1_pb2_grpc as pb_grpc
    from harness.sanity import kubelet
    from harness.sanity.kubelet import ClaimRef

    class Canned(pb_grpc.DRAPluginServicer):
        def NodePrepareResources(self, request, context):
            if any(c.name == "boom" for c in request.claims):
                context.abort(grpc.StatusCode.UNAVAILABLE, "retrieve claim: gone")
            answer = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                answer.claims[claim.uid].devices.add(request_names=["gpu"], pool_name="p", device_name="d0",
                                                     cdi_device_ids=["v.x/c=1"], share_id="s1")
            return answer

        def NodeUnprepareResources(self, request, context):
            answer = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                answer.claims[claim.uid].error = "" if claim.name == "ok" else "not prepared"
            return answer

    socket = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp")) / "dra.sock"  # short: unix socket paths
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_DRAPluginServicer_to_server(Canned(), server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        answer = kubelet.prepare(str(socket), "v1.DRAPlugin", [ClaimRef("ns", "a", "u1")], timeout=10)
        assert answer.ok("u1") and answer.devices["u1"] == [
            kubelet.PreparedDevice("p", "d0", ("gpu",), ("v.x/c=1",), "s1")]
        failed = kubelet.prepare(str(socket), "v1.DRAPlugin", [ClaimRef("ns", "boom", "u2")], timeout=10)
        assert failed.refused("u2") and failed.call_error == "UNAVAILABLE: retrieve claim: gone"
        assert "the call failed" in failed.describe("u2")
        undone = kubelet.unprepare(str(socket), "v1.DRAPlugin", [ClaimRef("ns", "ok", "u3"), ClaimRef("ns", "x", "u4")],
                                   timeout=10)
        assert undone.ok("u3") and not undone.ok("u4") and undone.describe("u4") == "error 'not prepared'"
    finally:
        server.stop(0)
        socket.unlink(missing_ok=True)
        socket.parent.rmdir()


def test_each_suite_rule_has_its_check_in_the_suite_and_its_row_in_the_docs():
    """Container-side rules are checked by the suite on a real node: the named test exists, fails naming
    its rule, and docs/contract.md has the table."""
    assert rules.markdown(rules.SUITE_RULES) in CONTRACT.read_text()
    for rule in rules.SUITE_RULES:
        assert rule.id not in {r.id for r in rules.RULES}, rule.id
        path, _, function = rule.check.partition("::")
        source = (ROOT / path).read_text()
        tree = ast.parse(source)
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        assert found, f"{rule.id}: {rule.check} does not exist"
        assert f'rules.failure("{rule.id}"' in ast.get_source_segment(source, found[0]), rule.id
        for cited in rule.sources:
            assert re.search(r"@v(0|1)\.37\.2 |#\d+ ", cited), (rule.id, cited)

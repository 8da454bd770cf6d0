"""The reference third-party driver in vendor mode (issue 11, items 4 and 5): dra-example-driver v0.4.0's
kubelet plugin, built from the Go module proxy into the binary cache (`make example-driver`), started
by `conformance run --driver-config clusters/vendors/dra-example-driver.yaml` on the real node of a
local cluster, with the DeviceClass of its manifest; the suite runs against it, and afterwards the
plugin, its slices and the class are gone. On the same cluster, its two other modes
(--gpu-partitions, --gpu-allow-multiple-allocations) run the partition and consumable-capacity tests
on its devices.

Everything runs as a user runs it: `cluster up` and `conformance run` as subprocesses, with their own
state directory (so only this test's cluster is touched), against real Kubernetes 1.37 components.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from cli_runs import cli as _cli  # tests/integration/cli_runs.py

from harness.core import files, paths

# One xdist worker runs every vendor-style run (real-node vendor mode, sanity, shapes) in turn: run side by side
# they load the two cores enough to bring out the vendor-mode "cannot allocate all claims" flake (issue 30).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vendor-runs")]

REPO = Path(__file__).resolve().parents[2]
VENDOR_FILE = REPO / "clusters" / "vendors" / "dra-example-driver.yaml"
DRIVER = "gpu.example.com"
# Feature tests that passed with a gpu.example.com device allocated (issue 11: at least 15; 25 seen by hand).
MIN_TESTS_ALLOCATING_EXAMPLE_DEVICES = 15
UP_TIMEOUT = 900  # a cold real node on a loaded two-core machine
RUN_TIMEOUT = 1500


REBOOT_CHECK = "test_pod_comes_back_with_its_devices_after_a_node_reboot"


def _example_driver_defects(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the failures v0.4.0 is known for, the other failures): its only one in the suite is KP-RESTART-CDI after a
    node reboot (docs/contract.md: it answers a repeated Prepare from its checkpoint without writing the claim's
    CDI spec again; kubernetes/kubernetes#141433, fixed after v0.4.0), which must fail naming the rule."""
    failed = [r for r in results if r["outcome"] in ("failed", "xpassed")]
    known = [r for r in failed if r["outcome"] == "failed" and r["id"].endswith("::" + REBOOT_CHECK)
             and "KP-RESTART-CDI (MUST): driver " in r["message"] and "unresolvable CDI devices" in r["message"]]
    return known, [r for r in failed if r not in known]


def _explain(failed: list[dict], reports: Path, logs: Path) -> str:
    """For the failed tests of a run: their messages, the diagnostics the plugin saved, and what the
    scheduler logged on their namespaces (the vendor run attaches as `existing`: its diagnostics have
    no component log)."""
    parts = [f"{r['id']}: {r['message'][:500]}" for r in failed]
    for saved in sorted((reports / "diagnostics").glob("*.txt")):
        text = saved.read_text(errors="replace")
        parts.append(f"=== {saved.name} ===\n{text[:6000]}")
        if found := re.search(r"^--- namespace (\S+) ---", text, re.M):
            parts.append(f"=== kube-scheduler on namespace {found[1]} ===\n"
                         + files.lines_naming(logs / "kube-scheduler.log", found[1], lines=80))
    if failed:
        parts.append(f"=== kube-scheduler: its view of the {DRIVER} devices (allocated, freed, in flight; --v=6) ===\n"
                     + _device_view(logs / "kube-scheduler.log"))
    return "\n".join(parts)


def _device_view(log: Path, lines: int = 80) -> str:
    """The scheduler's last lines on which devices of DRIVER it counts as allocated or in flight, and why
    (`Observed device allocation`/`deallocation` name the claim; the whole log is read: at --v=6 it is large)."""
    kept: collections.deque[str] = collections.deque(maxlen=lines)
    try:
        with open(log, errors="replace") as handle:
            for line in handle:
                if DRIVER in line and ("Observed" in line or "in flight" in line or "GatherAllocatedState" in line):
                    kept.append(line.rstrip()[:1000])
    except OSError as err:
        return f"cannot read {log}: {err}"
    return "\n".join(kept) or "none"


def _plugin_processes(node_dir: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and cmdline and cmdline[0].endswith("dra-example-kubeletplugin") \
                and any(node_dir in arg for arg in cmdline):
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def real_node_cluster(tmp_path_factory):
    """A local cluster of its own with one real node and one simulated node, shared by this module's
    vendor runs (each leaves it as it found it); (env, name, kubeconfig, log)."""
    from harness.backends.local.realnode import preflight

    if problems := preflight.problems():
        pytest.skip("this machine cannot run a real node: " + "; ".join(problems))
    tmp_path = tmp_path_factory.mktemp("vendor-cluster")
    env = {**os.environ, paths.STATE_ENV: str(tmp_path / "state"), "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    env.pop("KUBECONFIG", None)
    name = f"vex-{uuid.uuid4().hex[:5]}"
    log = tmp_path / "cli.log"
    try:
        # --verbosity 6: the scheduler logs each attempt on a pod left "cannot allocate all claims" and the pools
        # its DRA allocator saw, on the pod's namespace (5), and which claim it counts as holding each device (6)
        up = _cli(["cluster", "up", "--name", name, "--nodes", "1", "--real-nodes", "1", "--verbosity", "6"], env, log,
                  UP_TIMEOUT)
        assert up.returncode == 0, log.read_text()[-4000:]
        yield env, name, tmp_path / "state" / "clusters" / name / "kubeconfig", log
    finally:
        down = _cli(["cluster", "down", "--name", name], env, log, 300)
        assert down.returncode == 0, log.read_text()[-4000:]


@pytest.fixture
def example_driver():
    from harness.binaries import exampledriver

    if exampledriver.locate() is None:
        pytest.skip(f"dra-example-driver v{exampledriver.VERSION} is not built (`make example-driver` builds it "
                    "from the Go module proxy; it needs go)")


FAKE_VENDOR_FILE = REPO / "clusters" / "vendors" / "fake-driver.yaml"
FAKE_PLUGIN_DRIVER = "gpu.vendor.dra-harness.x-k8s.io"
MIN_TESTS_ALLOCATING_FAKE_PLUGIN_DEVICES = 25  # measured: 28 (docs/vendor-guide.md)


def test_the_guides_walkthrough_with_a_driver_that_is_not_the_example(real_node_cluster, tmp_path):
    """The vendor guide's steps as written, for the fake driver's own kubelet plugin described as a vendor
    would (clusters/vendors/fake-driver.yaml: it publishes its node's slices itself): the run creates its
    class, starts the plugin on the real node, the suite passes with its devices, and nothing is left."""
    from harness.k8s.client import Clients

    env, name, kubeconfig, log = real_node_cluster
    run = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "2",
                "--driver-config", str(FAKE_VENDOR_FILE), "--report-dir", str(tmp_path / "reports")], env, log,
               RUN_TIMEOUT)
    results = json.loads((tmp_path / "reports" / "results.json").read_text())
    k8s = Clients(kubeconfig)
    try:
        assert not k8s.resource.list_resource_slice(field_selector=f"spec.driver={FAKE_PLUGIN_DRIVER}").items
        assert not k8s.resource.list_device_class(field_selector="metadata.name=vendor-gpu").items
    finally:
        k8s.close()
    failed = [r for r in results if r["outcome"] in ("failed", "xpassed")]
    assert run.returncode == 0 and not failed, (
        "unexpected failures:\n" + _explain(failed, tmp_path / "reports", kubeconfig.parent / "logs")
        + "\n" + log.read_text()[-3000:])
    allocating = sorted(r["id"] for r in results if r["outcome"] == "passed"
                        and FAKE_PLUGIN_DRIVER in (r["properties"].get("dra_allocated_drivers") or []))
    assert len(allocating) >= MIN_TESTS_ALLOCATING_FAKE_PLUGIN_DEVICES, allocating
    by_name = {r["id"].rsplit("::", 1)[1]: r["outcome"] for r in results}
    for kubelet_check in ("test_kubelet_prepares_and_unprepares_the_drivers_claims",
                          "test_container_receives_the_cdi_edits_of_its_claim", "test_plugin_restart_keeps_prepared_claims",
                          "test_plugin_health_reaches_allocated_resources_status",
                          "test_each_container_is_given_only_the_devices_of_its_request"):
        assert by_name.get(kubelet_check) == "passed", (kubelet_check, by_name.get(kubelet_check))


def _fails_with_defect(real_node_cluster, tmp_path: Path, defect: str, check: str) -> str:
    """Run only `check` in vendor mode against the fake driver's plugin with `--defect=<defect>`; it must be the
    run's one test and fail: its message."""
    env, name, kubeconfig, log = real_node_cluster
    data = yaml.safe_load(FAKE_VENDOR_FILE.read_text())
    data["spec"]["kubeletPlugin"]["args"].append(f"--defect={defect}")
    data["spec"]["manifests"] = [str(FAKE_VENDOR_FILE.parent / m) for m in data["spec"]["manifests"]]
    defective = tmp_path / f"fake-driver-{defect}.yaml"
    defective.write_text(yaml.safe_dump(data))
    run = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "1",
                "--driver-config", str(defective), "--report-dir", str(tmp_path / "reports"), "--", "-k", check],
               env, log, RUN_TIMEOUT)
    results = {r["id"].rsplit("::", 1)[1]: r for r in json.loads((tmp_path / "reports" / "results.json").read_text())}
    assert run.returncode == 1 and set(results) == {check}, log.read_text()[-3000:]
    assert results[check]["outcome"] == "failed", results[check]
    return results[check]["message"]


def test_a_plugin_that_gives_every_container_every_device_fails_the_container_rule(real_node_cluster, tmp_path):
    """CT-CONTAINER-DEVICES can fail: the fake driver's plugin with the all-requests defect (no request names,
    so the kubelet hands each device to every container of the claim) fails it, naming the rule, the
    container, the CDI device it should not have had and whose device that is."""
    message = _fails_with_defect(real_node_cluster, tmp_path, "all-requests",
                                 "test_each_container_is_given_only_the_devices_of_its_request")
    assert "CT-CONTAINER-DEVICES (MUST): driver " in message, message
    assert "container c-first names request 'first'" in message and "of request 'second': its device" in message, message


def test_a_plugin_that_does_not_write_cdi_again_after_a_reboot_fails_kp_restart_cdi(real_node_cluster, tmp_path):
    """KP-RESTART-CDI in the suite can fail: the fake driver's plugin with the stale-cdi defect (a Prepare of a
    checkpointed claim answers without writing its CDI spec again, the kubernetes#141433 class) leaves the pod
    in CreateContainerError after the node reboots, and the failure names the rule, the driver and the claim."""
    message = _fails_with_defect(real_node_cluster, tmp_path, "stale-cdi", REBOOT_CHECK)
    assert "KP-RESTART-CDI (MUST): driver " in message, message
    assert "CreateContainerError" in message and "unresolvable CDI devices" in message, message
    assert "CreateContainerError" in message and "unresolvable CDI devices" in message, message


def test_example_driver_fails_kp_restart_cdi_after_a_node_reboot(real_node_cluster, example_driver, tmp_path):
    """dra-example-driver v0.4.0 through the suite's node reboot, on its own (the full run above leaves it out:
    in one CI run a later test of that run then waited for devices, not yet explained; see docs/contract.md):
    it fails naming KP-RESTART-CDI with the container's `unresolvable CDI devices`, its one known defect
    (it answers a repeated Prepare from its checkpoint without writing the claim's CDI spec again;
    kubernetes/kubernetes#141433, fixed after v0.4.0)."""
    env, name, kubeconfig, log = real_node_cluster
    run = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "1",
                "--driver-config", str(VENDOR_FILE), "--report-dir", str(tmp_path / "reports"), "--", "-k",
                REBOOT_CHECK], env, log, RUN_TIMEOUT)
    results = json.loads((tmp_path / "reports" / "results.json").read_text())
    known, failed = _example_driver_defects(results)
    assert run.returncode == 1 and not failed, _explain(failed, tmp_path / "reports", kubeconfig.parent / "logs")
    assert [r["id"].rsplit("::", 1)[1] for r in known] == [REBOOT_CHECK], (results, log.read_text()[-3000:])


def test_example_driver_in_vendor_mode(real_node_cluster, example_driver, tmp_path):
    from harness.k8s.client import Clients

    env, name, kubeconfig, log = real_node_cluster
    paths_out = subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "node-paths", "--name", name, "--json"],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert paths_out.returncode == 0, paths_out.stderr
    node = json.loads(paths_out.stdout)[0]
    k8s = Clients(kubeconfig)
    try:
        # Refused, naming the field, where the harness cannot start the plugin (this kubeconfig's copy is
        # not a local cluster's), before anything is created.
        elsewhere = tmp_path / "copy.kubeconfig"
        shutil.copy(kubeconfig, elsewhere)
        refused = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(elsewhere),
                        "--driver-config", str(VENDOR_FILE), "--report-dir", str(tmp_path / "refused")], env, log, 300)
        tail = log.read_text()[-3000:]
        assert refused.returncode == 2, tail
        assert "spec.kubeletPlugin: the harness starts a kubelet plugin only on a real node" in tail, tail
        assert not k8s.resource.list_device_class(field_selector=f"metadata.name={DRIVER}").items

        started = time.monotonic()
        run = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "2",
                    "--driver-config", str(VENDOR_FILE), "--report-dir", str(tmp_path / "reports"),
                    "--", "-k", f"not {REBOOT_CHECK}"], env, log, RUN_TIMEOUT)
        wall = time.monotonic() - started
        text = log.read_text()
        results = json.loads((tmp_path / "reports" / "results.json").read_text())
        summary = json.loads((tmp_path / "reports" / "report.json").read_text())

        # Nothing of the vendor setup is left: plugin process (group), its slices, the manifest's class.
        assert _plugin_processes(node["registrationDir"]) == [], "the example driver's plugin still runs"
        assert not k8s.resource.list_resource_slice(field_selector=f"spec.driver={DRIVER}").items
        assert not k8s.resource.list_device_class(field_selector=f"metadata.name={DRIVER}").items
    finally:
        k8s.close()

    # The plugin ran on the real node: its log is in the cluster's logs, with the node's real paths.
    plugin_log = kubeconfig.parent / "logs" / f"vendor-plugin-{node['nodeName']}.log"
    assert f"--cdi-root={node['cdiDir']}" in plugin_log.read_text()

    failed = [r for r in results if r["outcome"] in ("failed", "xpassed")]
    assert run.returncode == 0 and not failed, (
        "harness errors or unexpected failures:\n" + _explain(failed, tmp_path / "reports", kubeconfig.parent / "logs")
        + "\n" + text[-3000:])
    assert summary["failed"] == 0 and not summary["interrupted"]
    incomplete = [r["id"] for r in results if r["properties"].get("dra_allocations_incomplete")]
    assert not incomplete, f"allocation records may be short (the claim watch broke): {incomplete}"

    allocating = sorted(r["id"] for r in results if r["outcome"] == "passed"
                        and DRIVER in (r["properties"].get("dra_allocated_drivers") or []))
    print(f"vendor run: {wall:.0f}s wall, {len(allocating)} passing tests allocated a {DRIVER} device: {allocating}")
    assert len(allocating) >= MIN_TESTS_ALLOCATING_EXAMPLE_DEVICES, allocating
    # The kubelet side of its plugin (issue 11, item 3): a crash and restart keeps the prepared claim, and
    # the kubelet wipes its slices (only those) once it is gone; it serves no DRAResourceHealth.
    by_name = {r["id"].rsplit("::", 1)[1]: r for r in results}
    assert "test_kubelet_plugin_lifecycle.py::test_plugin_restart_keeps_prepared_claims" in " ".join(allocating)
    wiped = by_name["test_kubelet_wipes_the_slices_of_a_plugin_that_is_gone"]
    assert wiped["outcome"] == "passed", wiped
    print(f"the kubelet wiped the slices {wiped['properties'].get('dra_wiped_after_seconds')} s after the plugin died")
    isolation = by_name["test_each_container_is_given_only_the_devices_of_its_request"]
    assert isolation["outcome"] == "passed", isolation
    health = by_name["test_plugin_health_reaches_allocated_resources_status"]
    assert (health["outcome"], health["message"].split(" (")[0]) == (
        "not applicable", f"not applicable: {DRIVER} serves no DRAResourceHealth"), health
    # No vacuous credit: a feature credited to the driver has that many passing tests with its devices,
    # and a check over nothing it publishes is "not applicable", never "pass".
    for row in summary["matrix"]:
        with_devices = [t for t in row["tests"] if t["outcome"] == "passed"
                        and DRIVER in (t["properties"].get("dra_allocated_drivers") or [])]
        assert row["credited"] == len(with_devices), row["feature"]
        assert row["status"] != "pass" or with_devices, f"{row['feature']} is credited without a {DRIVER} device"


MODES = {  # vendor file, the test module run on its devices, the features of the run
    "gpu-partitions": ("dra-example-driver-partitions.yaml", "test_partitions.py", "DRAPartitionableDevices"),
    "gpu-allow-multiple-allocations": ("dra-example-driver-shared.yaml", "test_consumable_capacity.py",
                                       "DRAConsumableCapacity"),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_example_driver_in_its_other_modes(real_node_cluster, example_driver, tmp_path, mode):
    """--gpu-partitions=4 (shared counter sets and partitions: DRAPartitionableDevices) and
    --gpu-allow-multiple-allocations (shareable GPUs with request policies: DRAConsumableCapacity): the
    tests of that feature run on the example driver's devices, and the driver checks pass (partitions
    may share their GPU's uuid)."""
    from harness.k8s.client import Clients

    vendor_file, module, feature = MODES[mode]
    env, name, kubeconfig, log = real_node_cluster
    started = time.monotonic()
    run = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "2",
                "--features", f"{feature},DynamicResourceAllocation", "--driver-config",
                str(REPO / "clusters" / "vendors" / vendor_file), "--report-dir", str(tmp_path / "reports")], env, log,
               RUN_TIMEOUT)
    wall = time.monotonic() - started
    text = log.read_text()
    results = json.loads((tmp_path / "reports" / "results.json").read_text())
    k8s = Clients(kubeconfig)
    try:
        assert not k8s.resource.list_resource_slice(field_selector=f"spec.driver={DRIVER}").items
    finally:
        k8s.close()
    known, failed = _example_driver_defects(results)
    assert run.returncode == (1 if known else 0) and not failed, (
        "harness errors or unexpected failures:\n" + _explain(failed, tmp_path / "reports", kubeconfig.parent / "logs")
        + "\n" + text[-3000:])
    tests = {r["id"].rsplit("::", 1)[1]: r for r in results if module in r["id"]}
    print(f"{mode} run: {wall:.0f}s wall; " + ", ".join(f"{k}: {v['outcome']}" for k, v in tests.items()))
    assert len(tests) == 2, tests
    for test, record in tests.items():
        assert record["outcome"] in ("passed", "xfailed"), (test, record)
        if record["outcome"] == "passed":
            assert DRIVER in (record["properties"].get("dra_allocated_drivers") or []), (test, record)
    identities = [r for r in results if r["id"].endswith("test_published_slices[device identities are unique]")]
    assert [r["outcome"] for r in identities] == ["passed"], identities

"""The conformance suite against deliberately broken drivers: it must fail, naming the defect.

Each case runs the real driver checks (conformance/test_driver_checks.py) in a separate pytest
process against this run's cluster, with the fake driver switched into a broken variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
CHECKS = Path(__file__).resolve().parents[2] / "conformance" / "test_driver_checks.py"


def _run_checks(cluster, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """The driver checks in their own pytest process, against this run's cluster."""
    return subprocess.run([sys.executable, "-m", "pytest", str(CHECKS), "-p", "no:cacheprovider",
                           "--dra-backend=existing", f"--kubeconfig={cluster.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=timeout)


def _vendor_file(tmp_path: Path, drivers: list[str], **spec: str) -> Path:
    """A VendorDriver file naming `drivers`, with further spec fields given as YAML text."""
    config = tmp_path / "vendor.yaml"
    extra = "".join(f"  {key}: {value}\n" for key, value in spec.items())
    config.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: VendorDriver\nmetadata: {name: acme}\n"
                      f"spec:\n  drivers: [{', '.join(drivers)}]\n{extra}")
    return config


@pytest.mark.parametrize("variant, failing_test, defect", [
    ("wrong-numa-type", "standard attributes have standard types",
     "resource.kubernetes.io/numaNode must be of type int, is string"),
    ("incomplete-pool", "pools are complete", "incomplete: resourceSliceCount is"),
    ("bad-counters", "counters add up", "consumes 2 of memory-slice-0 but"),
    ("no-fault-taints", "test_device_fault_is_published_as_a_taint",
     "did not publish a taint for an unhealthy device"),
    ("duplicate-device-names", "device names are unique", "-again)"),
    ("duplicate-uuid", "device identities are unique", "uuid 'GPU-"),
    ("duplicate-pci-bus-id", "device identities are unique", "resource.kubernetes.io/pciBusID '0000:"),
    ("slice-for-missing-node", "test_slices_belong_to_the_clusters_nodes", "-gone', which does not exist"),
    ("tainted-healthy-device", "healthy devices are not tainted",
     "published as healthy (health=Healthy) but tainted example.com/maintenance=true:NoSchedule"),
    ("class-selects-other-drivers", "test_device_classes_select_the_drivers_devices_only",
     "device(s) of other drivers, e.g. gpu."),
])
def test_suite_names_the_defect_of_a_broken_driver(dra_cluster, fake_driver, simulated_node, variant, failing_test,
                                                   defect):
    # The variants break what a driver publishes; the kubelet check would fail too (an incomplete pool
    # cannot be allocated), but after its timeout and under another name: leave it out here.
    if variant == "class-selects-other-drivers":
        fake_driver({simulated_node: "tiny"})  # another driver's GPUs, which an unpinned class also selects
    result = _run_checks(dra_cluster, "-q", "-k", "not kubelet", f"--dra-fake-variant={variant}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    failed = [line for line in output.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and failing_test in failed[0], output[-3000:]
    assert defect in output, output[-3000:]


def test_suite_passes_against_the_correct_driver(dra_cluster):
    result = _run_checks(dra_cluster, "-q", timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_vendor_mode_checks_a_driver_as_it_is(dra_cluster, fake_driver, simulated_node, tmp_path):
    """A driver the suite did not start (here: a fake-driver instance standing in for a vendor's),
    described by a VendorDriver file: its slices are checked, fake-only tests are skipped with the reason."""
    vendor = fake_driver({simulated_node: "dgx-h100"})
    config = _vendor_file(tmp_path, [vendor.drivers.gpu, vendor.drivers.nic, vendor.drivers.storage],
                          deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}", features="[DRADeviceTaints]")
    result = _run_checks(dra_cluster, "-v", "-rs", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    passed = {line.split("::", 1)[1].rsplit(" PASSED", 1)[0] for line in output.splitlines() if " PASSED" in line}
    assert passed == {"test_published_slices[pools are complete]", "test_published_slices[device names are unique]",
                      "test_published_slices[standard attributes have standard types]",
                      "test_published_slices[numaNode agrees with pcieRoot]",
                      "test_published_slices[device identities are unique]",
                      "test_slices_belong_to_the_clusters_nodes",
                      "test_device_classes_select_the_drivers_devices_only"}, output[-3000:]
    # dgx-h100 publishes no counters and no health attribute: those checks are over nothing
    assert "not applicable: driver(s)" in output and "publishes no device that consumes counters" in output
    assert "needs fault injection (a driver that taints a device on demand), which only the fake driver offers" \
        in output


def test_vendor_mode_reports_the_defects_of_a_bad_driver(dra_cluster, fake_driver, simulated_node, tmp_path):
    vendor = fake_driver({simulated_node: "a100-mig"}, variant="bad-counters")
    config = _vendor_file(tmp_path, [vendor.drivers.gpu])
    result = _run_checks(dra_cluster, "-q", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "counters add up" in output and "consumes 2 of memory-slice-0 but" in output


def test_vendor_file_the_cluster_contradicts_is_refused_before_any_test(dra_cluster, fake_driver, simulated_node,
                                                                       tmp_path):
    """A class that does not exist, an extended resource no class maps, a node selector that matches
    nothing: refused in seconds by `dra-harness conformance run`, exit 2, no report written."""
    import time

    vendor = fake_driver({simulated_node: "tiny"})
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses="{gpu: no-such-class}",
                          extendedResources="{gpu: acme.example/gpu}", nodeSelector="acme.example/none=1")
    import resource

    report = tmp_path / "report"
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "harness.cli", "conformance", "run", "--backend", "existing",
                             "--kubeconfig", str(dra_cluster.kubeconfig), "--driver-config", str(config),
                             "--report-dir", str(report)], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    output = result.stdout + result.stderr
    assert result.returncode in (1, 2) and "Traceback" not in output, output  # 2 once cli maps ConfigError so
    assert f"{config}: spec.deviceClasses.gpu: DeviceClass 'no-such-class' does not exist in the cluster" in output
    assert f"{config}: spec.extendedResources.gpu: no DeviceClass maps 'acme.example/gpu'" in output
    assert f"{config}: spec.nodeSelector: 'acme.example/none=1' matches no node" in output
    # The target is 5 s. The refusal's own work (CPU time: imports, three list calls) is held to
    # it; wall-clock time only loosely, since this machine runs several clusters and suites at once.
    assert cpu < 5, f"the refusal used {cpu:.1f}s of CPU"
    assert elapsed < 90, f"took {elapsed:.1f}s"
    assert not report.exists()


def test_vendor_class_pinned_to_another_driver_is_named(dra_cluster, fake_driver, simulated_node, tmp_path):
    """The vendor names a DeviceClass that selects another driver's devices (here: the class of a
    second fake instance): the class check names the class, the vendor file field and a foreign device."""
    vendor = fake_driver({simulated_node: "tiny"})
    other = fake_driver({simulated_node: "tiny"})
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {other.config.instance}-gpu}}")
    result = _run_checks(dra_cluster, "-q", "-k", "classes_select", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert (f"DeviceClass {other.config.instance}-gpu (spec.deviceClasses.gpu) selects 2 device(s) of other drivers, "
            f"e.g. {other.drivers.gpu}/{simulated_node}/gpu-") in output, output[-3000:]
    assert f"selects none of the devices of {vendor.drivers.gpu}" in output


def test_bad_vendor_file_is_a_usage_error(dra_cluster, tmp_path):
    config = tmp_path / "vendor.yaml"
    config.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: VendorDriver\nmetadata: {name: x}\n"
                      "spec: {drivers: ['Not A Driver'], colour: red}\n")
    result = _run_checks(dra_cluster, "-q", f"--dra-driver-config={config}", timeout=120)
    assert result.returncode == 4  # pytest's usage error
    assert "spec.drivers[0]" in result.stderr and "spec.colour: unknown field" in result.stderr
    assert "Traceback" not in result.stderr


def test_vendor_mode_checks_the_node_half_where_a_kubelet_runs(dra_cluster, fake_driver, real_node, tmp_path):
    """Vendor mode on a node run by a real kubelet: the suite's generic kubelet check prepares and
    unprepares a claim of the vendor's driver (here: a fake-driver instance with its kubelet plugins
    on the real node, standing in for a vendor's), judged only from the kubelet's metrics."""
    from harness.backends.local.realnode import images

    vendor = fake_driver({real_node.name: "tiny"})
    real_node.run_for(vendor)
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}",
                          testImage=images.PAUSE_IMAGE)
    result = _run_checks(dra_cluster, "-v", "-rs", "-k", "kubelet", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "test_kubelet_prepares_and_unprepares_the_drivers_claims PASSED" in output, output[-3000:]


def test_vendor_kubelet_check_fails_when_the_container_does_not_keep_running(dra_cluster, fake_driver, real_node,
                                                                             tmp_path):
    """A test image whose container exits at once (the shell image without a command) crash-loops:
    the kubelet check fails with the container's reason instead of passing on a Running phase."""
    from harness.backends.local.realnode import images

    vendor = fake_driver({real_node.name: "tiny"})
    real_node.run_for(vendor)
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}",
                          testImage=images.SHELL_IMAGE)
    result = _run_checks(dra_cluster, "-q", "-k", "kubelet", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "container main" in output and ("exited: Completed (exit code 0)" in output or "restarted" in output), \
        output[-3000:]


def test_vendor_test_image_missing_on_the_node_is_refused(dra_cluster, fake_driver, real_node, tmp_path):
    vendor = fake_driver({real_node.name: "tiny"})
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}",
                          testImage="dra-harness.local/no-such-image:1")
    result = _run_checks(dra_cluster, "-q", f"--dra-driver-config={config}", timeout=120)
    assert result.returncode == 4, (result.stdout + result.stderr)[-3000:]  # pytest's usage error: nothing ran
    assert (f"spec.testImage: 'dra-harness.local/no-such-image:1' is not on node {real_node.name}, where your driver "
            "publishes devices (allowed: an image the node has: ") in result.stderr
    assert "dra-harness.local/pause:1" in result.stderr and "Traceback" not in result.stderr


def test_a_failure_on_the_real_node_is_explained_by_the_diagnostics(dra_cluster, real_node, tmp_path):
    """A test that fails on the real node leaves a diagnostics file with its namespace's pods and
    events and the tails of the node's component logs (kubelet, containerd), also when the suite
    runs with `--dra-backend existing` against a local cluster, as `dra-harness run` does."""
    failing = tmp_path / "test_fails_on_the_real_node.py"
    failing.write_text(f'''
from harness.k8s import wait


def test_pod_that_cannot_start(k8s, dra_namespace):
    k8s.core.create_namespaced_pod(dra_namespace, {{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "nope"}},
        "spec": {{"nodeSelector": {{"kubernetes.io/hostname": "{real_node.name}"}},
                  "tolerations": [{{"operator": "Exists"}}],
                  "containers": [{{"name": "main", "image": "dra-harness.local/no-such-image:1",
                                   "imagePullPolicy": "Never"}}]}}}})
    wait.pod_phase(k8s, dra_namespace, "nope", "Running", timeout=5)
''')
    report = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "pytest", str(failing), "-p", "no:cacheprovider", "-q",
                             "--dra-backend=existing", f"--kubeconfig={dra_cluster.kubeconfig}",
                             f"--dra-report-dir={report}"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
    [diagnostics] = list((report / "diagnostics").glob("*.txt"))
    text = diagnostics.read_text()
    assert "ErrImageNeverPull" in text, text[:3000]  # the pod's own reason, from the kubelet
    assert f"kubelet-{real_node.name}.log ---" in text and f"containerd-{real_node.name}.log ---" in text


def test_report_credits_only_the_vendors_devices(dra_cluster, fake_driver, simulated_node, tmp_path):
    """On a real run in vendor mode: a feature test runs on the vendor's own devices and earns the
    feature its credit (the allocation record names the vendor's driver); a check with nothing to check
    is "not applicable". (A pass without the vendor's devices, listed apart, is tests/unit/test_report.py's.)"""
    import json

    from harness.jobs import report

    vendor = fake_driver({simulated_node: "dgx-h100"})
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}")
    results_dir = tmp_path / "report"
    allocation = CHECKS.parent / "test_basic_allocation.py"
    result = subprocess.run([sys.executable, "-m", "pytest", str(CHECKS), str(allocation), "-p", "no:cacheprovider",
                             "-q", "-k", "published_slices or claim_from_template", "--dra-backend=existing",
                             f"--kubeconfig={dra_cluster.kubeconfig}", f"--dra-driver-config={config}",
                             f"--dra-report-dir={results_dir}"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    records = {r["id"].split("::")[1]: r for r in json.loads((results_dir / "results.json").read_text())}
    on_vendor = records["test_claim_from_template_is_allocated_and_freed"]
    assert on_vendor["outcome"] == "passed"
    assert on_vendor["properties"][report.ALLOCATED] == [vendor.drivers.gpu], on_vendor["properties"]
    assert records["test_published_slices[counters add up]"]["outcome"] == "not applicable"

    data = report.build(list(records.values()), run={"drivers": [vendor.drivers.gpu]})
    [row] = [r for r in data["matrix"] if r["feature"] == "DynamicResourceAllocation"]
    assert (row["status"], row["credited"], row["not applicable"]) == ("pass", 1, 2), row
    assert not any(t["id"].endswith("test_claim_from_template_is_allocated_and_freed") for t in data["uncredited"])
    assert "| DynamicResourceAllocation | ga | pass |" in report.markdown(data)


def test_vendor_extended_resource_is_requested_through_limits(dra_cluster, fake_driver, simulated_node, tmp_path,
                                                             unique_name):
    """`extendedResources` is used: a pod asking for it in resources.limits gets the vendor's device."""
    ext = f"{unique_name('acme')}.example/gpu"
    vendor = fake_driver({simulated_node: "tiny"}, extended_resources={"gpu": ext})
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}",
                          extendedResources=f"{{gpu: {ext}}}", features="[DRAExtendedResource]")
    result = _run_checks(dra_cluster, "-v", "-k", "extended_resources", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "test_vendor_extended_resources_are_served_by_the_vendors_devices PASSED" in output, output[-3000:]


def test_vendor_mode_judges_a_vendors_health_monitor_through_its_commands(dra_cluster, fake_driver, simulated_node,
                                                                          unique_name, tmp_path):
    """spec.healthMonitor end to end: a stand-in vendor (a fake-driver instance that publishes no taint
    of its own) with the reference monitor running as the vendor's monitor, reached only through the
    vendor file's commands (a script that writes the fault) and its rule selector; the monitor tests
    run against it, the two that need the harness's own monitor skip, naming why."""
    import json

    from conformance.health_monitors import ReferenceMonitor
    from fake_devices.healthmonitor import MONITOR_LABEL

    vendor = fake_driver({simulated_node: "tiny"}, variant="no-fault-taints")
    name = unique_name("vendor-hm")
    monitor = ReferenceMonitor(name, dra_cluster.kubeconfig, vendor, tmp_path).start()
    fault = tmp_path / "acme-fault"
    kinds = {"degraded": "degraded", "failed": "unhealthy"}
    fault.write_text(
        f"#!{sys.executable}\n"
        "import sys, kubernetes\n"
        "from fake_devices import faults\n"
        f"kubernetes.config.load_kube_config({str(dra_cluster.kubeconfig)!r})\n"
        "action, node, device = sys.argv[1:4]\n"
        f"kind = {kinds!r}[sys.argv[4]] if action == 'inject' else None\n"
        f"faults.set_fault(kubernetes.client.CoreV1Api(), {vendor.config.namespace!r}, "
        f"{vendor.config.faults_configmap!r}, node, device, kind)\n")
    fault.chmod(0o755)
    config = _vendor_file(tmp_path, [vendor.drivers.gpu], deviceClasses=f"{{gpu: {vendor.config.instance}-gpu}}",
                          features="[DRADeviceTaintRules]",
                          healthMonitor=f"{{ruleSelector: '{MONITOR_LABEL}={name}', "
                                        "inject: [./acme-fault, inject, '{node}', '{device}', '{kind}'], "
                                        "recover: [./acme-fault, recover, '{node}', '{device}']}")
    results_dir = tmp_path / "report"
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", str(CHECKS.parent / "test_health_monitor.py"),
                                 "-p", "no:cacheprovider", "-q", "-rs", "--dra-backend=existing",
                                 f"--kubeconfig={dra_cluster.kubeconfig}", f"--dra-driver-config={config}",
                                 f"--dra-report-dir={results_dir}"], capture_output=True, text=True, timeout=600)
    finally:
        monitor.stop()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    records = {r["id"].split("::")[1]: r for r in json.loads((results_dir / "results.json").read_text())}
    on_vendor = [test for test, r in records.items() if r["outcome"] == "passed"
                 and r["properties"].get("dra_allocated_drivers") == [vendor.drivers.gpu]]
    assert sorted(on_vendor) == ["test_degraded_device_gets_a_no_schedule_rule_and_its_pod_keeps_running",
                                 "test_escalation_to_failed_evicts_a_tolerating_pod_after_its_toleration_seconds",
                                 "test_failed_device_gets_a_no_execute_rule_that_evicts_only_its_pod"], output[-3000:]
    skipped = records["test_monitor_touches_only_its_own_rules_and_removes_them_on_exit"]
    assert skipped["outcome"] == "skipped" and "the harness does not run your monitor" in skipped["message"]


FRACTIONAL = CHECKS.parent / "test_fractional_capacity.py"
FRACTIONAL_ON_DEVICES = ("test_fractional_request_is_rounded_up_to_the_milli_step",
                         "test_claims_share_a_device_in_fractions_up_to_the_whole",
                         "test_request_above_the_range_maximum_fits_no_device")


def _run_vendor_records(cluster, config: Path, report: Path, *tests: Path, k: str = "") -> tuple[str, dict]:
    """The given test files in vendor mode in their own pytest process: (output, {test: its record})."""
    import json

    result = subprocess.run([sys.executable, "-m", "pytest", *map(str, tests), "-p", "no:cacheprovider", "-q", "-rs",
                             *(["-k", k] if k else []), "--dra-backend=existing", f"--kubeconfig={cluster.kubeconfig}",
                             f"--dra-driver-config={config}", f"--dra-report-dir={report}"],
                            capture_output=True, text=True, timeout=600)
    records = {r["id"].split("::")[1]: r for r in json.loads((report / "results.json").read_text())}
    return result.stdout + result.stderr, records


def test_vendor_mode_runs_the_fractional_capacity_tests_on_the_vendors_devices(dra_cluster, fake_driver,
                                                                                simulated_node, tmp_path):
    """A vendor's shareable devices with a fractional validRange (here: a fake-driver instance's NVMe
    drives standing in for a vendor's): the fractional-capacity tests allocate those devices, with
    the sizes worked out from the range its slices publish."""
    vendor = fake_driver({simulated_node: "nvme-storage"})
    config = _vendor_file(tmp_path, [vendor.drivers.storage], deviceClasses=f"{{nvme: {vendor.config.instance}-nvme}}",
                          features="[DRAConsumableCapacity, DRAFractionalCapacityRange]")
    output, records = _run_vendor_records(dra_cluster, config, tmp_path / "report", FRACTIONAL, CHECKS,
                                          k="fractional or claimed_capabilities")
    assert {test: r["outcome"] for test, r in records.items()} == {
        **{test: "passed" for test in FRACTIONAL_ON_DEVICES}, "test_api_validates_fractional_ranges_in_milli_units": "passed",
        "test_claimed_capabilities_are_published": "passed"}, output[-3000:]
    for test in FRACTIONAL_ON_DEVICES:
        properties = records[test]["properties"]
        assert properties["dra_allocated_drivers"] == [vendor.drivers.storage], (test, properties)
        devices = properties["dra_fractional_devices"]
        assert devices and all(d.startswith(f"{vendor.drivers.storage}/{simulated_node}/nvme-") for d in devices), \
            (test, devices)


def test_vendor_mode_fractional_capacity_the_slices_contradict(dra_cluster, fake_driver, simulated_node, tmp_path):
    """A vendor driver whose ranges are all whole numbers (the tiny profile's NVMe drives: 10Gi steps):
    the fractional-capacity tests are not applicable, naming what it lacks; once the vendor file claims
    DRAFractionalCapacityRange they fail, naming the file, the claim and the driver."""
    vendor = fake_driver({simulated_node: "tiny"})
    storage = vendor.drivers.storage
    lacks = f"{storage} publishes requestPolicy.validRange only with whole-number min, max and step"
    unclaimed = _vendor_file(tmp_path, [storage], deviceClasses=f"{{nvme: {vendor.config.instance}-nvme}}")
    output, records = _run_vendor_records(dra_cluster, unclaimed, tmp_path / "unclaimed", FRACTIONAL)
    for test in FRACTIONAL_ON_DEVICES:
        assert records[test]["outcome"] == "not applicable", (test, records[test], output[-3000:])
        assert records[test]["message"].startswith(f"not applicable: {lacks}"), records[test]
    assert records["test_api_validates_fractional_ranges_in_milli_units"]["outcome"] == "passed", output[-3000:]

    claimed = tmp_path / "claimed"
    claimed.mkdir()
    config = _vendor_file(claimed, [storage], deviceClasses=f"{{nvme: {vendor.config.instance}-nvme}}",
                          features="[DRAConsumableCapacity, DRAFractionalCapacityRange]")
    output, records = _run_vendor_records(dra_cluster, config, tmp_path / "claimed-report", FRACTIONAL, CHECKS,
                                          k="fractional or claimed_capabilities")
    for test in FRACTIONAL_ON_DEVICES:
        assert records[test]["outcome"] == "failed", (test, records[test], output[-3000:])
        assert records[test]["message"].startswith(
            f"Failed: {config}: spec.features claims DRAFractionalCapacityRange, but {lacks}"), records[test]
    claim_check = records["test_claimed_capabilities_are_published"]
    assert claim_check["outcome"] == "failed" and (
        f"spec.features claims DRAFractionalCapacityRange, but no slice of {storage} publishes a capacity whose "
        "requestPolicy.validRange has a fractional min, max or step") in claim_check["message"], claim_check

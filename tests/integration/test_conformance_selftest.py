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
])
def test_suite_names_the_defect_of_a_broken_driver(dra_cluster, variant, failing_test, defect):
    # The variants break what a driver publishes; the kubelet check would fail too (an incomplete pool
    # cannot be allocated), but after its timeout and under another name: leave it out here.
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
    assert output.count("PASSED") == 5, output[-3000:]  # the five slice checks, on the vendor's slices
    assert "needs the fake driver's powers" in output


def test_vendor_mode_reports_the_defects_of_a_bad_driver(dra_cluster, fake_driver, simulated_node, tmp_path):
    vendor = fake_driver({simulated_node: "a100-mig"}, variant="bad-counters")
    config = _vendor_file(tmp_path, [vendor.drivers.gpu])
    result = _run_checks(dra_cluster, "-q", f"--dra-driver-config={config}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "counters add up" in output and "consumes 2 of memory-slice-0 but" in output


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


def test_a_failure_on_the_real_node_is_explained_by_the_diagnostics(dra_cluster, real_node, tmp_path):
    """A test that fails on the real node leaves a diagnostics file with its namespace's pods and
    events and the tails of the node's component logs (kubelet, containerd), also when the suite
    runs with `--dra-backend existing` against a local cluster, as `dra-harness run` does."""
    failing = tmp_path / "test_fails_on_the_real_node.py"
    failing.write_text(f'''
from harness import wait


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

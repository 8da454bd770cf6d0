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


@pytest.mark.parametrize("variant, failing_test, defect", [
    ("wrong-numa-type", "standard attributes have standard types",
     "resource.kubernetes.io/numaNode must be of type int, is string"),
    ("incomplete-pool", "pools are complete", "incomplete: resourceSliceCount is"),
    ("bad-counters", "counters add up", "consumes 2 of memory-slice-0 but"),
    ("no-fault-taints", "test_device_fault_is_published_as_a_taint",
     "did not publish a taint for an unhealthy device"),
])
def test_suite_names_the_defect_of_a_broken_driver(dra_cluster, variant, failing_test, defect):
    result = subprocess.run([sys.executable, "-m", "pytest", str(CHECKS), "-p", "no:cacheprovider", "-q",
                             "-p", "no:randomly", "--dra-backend=existing", f"--kubeconfig={dra_cluster.kubeconfig}",
                             f"--dra-fake-variant={variant}"], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    failed = [line for line in output.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and failing_test in failed[0], output[-3000:]
    assert defect in output, output[-3000:]


def test_suite_passes_against_the_correct_driver(dra_cluster):
    result = subprocess.run([sys.executable, "-m", "pytest", str(CHECKS), "-p", "no:cacheprovider", "-q",
                             "--dra-backend=existing", f"--kubeconfig={dra_cluster.kubeconfig}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]

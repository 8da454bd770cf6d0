"""The smallest complete DRA round trip: a published device is allocated by the real scheduler to a
pod's claim, the pod runs, and the device returns to the pool when the pod goes. Runs against the
driver under test (the fake driver, or a vendor's: see conformance/under_test.py)."""

from __future__ import annotations

import pytest

from conformance import checks, objects
from harness.k8s import wait
from harness.k8s.client import Clients


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_claim_from_template_is_allocated_and_freed(k8s: Clients, dra_namespace, devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(1)
    (device,) = pool.devices
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one-gpu"))

    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("first", "one-gpu")))
    running = checks.running(k8s, ns, "first", timeout=90)
    assert running.spec.node_name == pool.node

    claim = checks.pod_claim(k8s, ns, "first")
    claim_name = claim.metadata.name
    results = claim.status.allocation.devices.results
    assert [(r.request, r.driver, r.pool, r.device) for r in results] == [("gpu", pool.driver, device.pool,
                                                                           device.name)]
    assert [ref.uid for ref in claim.status.reserved_for] == [running.metadata.uid]
    assert claim.metadata.owner_references[0].uid == running.metadata.uid

    # The only device is taken: a second pod must wait, and say why.
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("second", "one-gpu")))
    condition = checks.unschedulable(k8s, ns, "second")
    assert "cannot allocate all claims" in condition.message

    # Freeing the device (pod gone -> its claim deleted) lets the waiting pod in.
    k8s.core.delete_namespaced_pod("first", ns)
    wait.until(f"claim {claim_name} to be deleted with its pod",
               lambda: claim_name not in {c.metadata.name for c in k8s.resource.list_namespaced_resource_claim(ns).items},
               90, diagnostics=lambda: wait.describe_namespace(k8s, ns))
    second = checks.running(k8s, ns, "second", timeout=90)
    assert second.spec.node_name == pool.node
    assert checks.allocated_devices(checks.pod_claim(k8s, ns, "second")) == [("gpu", device.pool, device.name)]

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


def _with_claim_entry(body: dict, entry: str) -> dict:
    body["spec"]["resourceClaims"][0]["name"] = entry
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": entry}]
    return body


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_generated_claim_names_keep_both_parts_when_pod_and_entry_names_are_long(k8s: Clients, dra_namespace,
                                                                                devices_under_test):
    """The claim controller names a template's claim `<pod>-<entry>-` plus 5 random characters; where that
    base is longer than 57 characters it cuts both names in proportion to their lengths, so a claim of a
    pod with a long name still shows which entry it is for (k8s.io/kubernetes@v1.37.2
    pkg/controller/resourceclaim/controller.go handleClaim: maxBaseLen 57). The annotation
    `resource.kubernetes.io/pod-claim-name` keeps the entry's full name, and the pod's status maps it."""
    ns = dra_namespace
    pool = devices_under_test(1)
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one-gpu"))
    pod_name = "training-job-with-a-long-descriptive-name-for-the-scheduler-0"  # 61 characters
    entry = "accelerator-claim-of-the-main-container-for-the-model-weights"  # 61 characters
    k8s.core.create_namespaced_pod(ns, pool.pod(_with_claim_entry(
        objects.pod_with_template_claim(pod_name, "one-gpu"), entry)))
    claim = checks.pod_claim(k8s, ns, pod_name, claim=entry, timeout=90)
    name = claim.metadata.name
    base = len(pod_name) + 1 + len(entry) + 1  # "<pod>-<entry>-" before truncation
    expected = pod_name[:len(pod_name) * 57 // base] + "-" + entry[:len(entry) * 57 // base]
    assert len(name) <= 63 and name.startswith(expected) and len(name) == len(expected) + 5, \
        f"claim {name!r} of pod {pod_name}: expected {expected!r} and 5 random characters"
    assert claim.metadata.annotations.get("resource.kubernetes.io/pod-claim-name") == entry, claim.metadata.annotations
    checks.running(k8s, ns, pod_name, timeout=90)

    # A short pair is not cut: <pod>-<entry>-<5 random>.
    k8s.core.create_namespaced_pod(ns, pool.pod(_with_claim_entry(objects.pod_with_template_claim("short", "one-gpu"),
                                                                  "gpu")))
    short = checks.pod_claim(k8s, ns, "short")
    assert short.metadata.name.startswith("short-gpu-") and len(short.metadata.name) == len("short-gpu-") + 5, \
        short.metadata.name

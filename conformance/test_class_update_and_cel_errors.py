"""The scheduler retrying after a DeviceClass update, and CEL runtime errors reported to the user
(upstream test/e2e/dra: "retries scheduling after updating the class", "CEL runtime errors").

A selector that matches no device leaves a pod unschedulable until something changes; updating the
class is such a change. A selector that fails at runtime (a missing attribute read without has()) is
not "no device": the scheduler reports the CEL error itself, with the claim, the selector and the
device, in the pod's FailedScheduling events.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

NO_FIT = "cannot allocate all claims"


def _scheduling_failures(k8s, ns: str, pod: str) -> list[str]:
    return [e.message or "" for e in k8s.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
            if e.reason == "FailedScheduling"]


def test_pending_pod_is_retried_after_its_device_class_is_updated(k8s, dra_namespace, devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(1)
    nothing = 'device.driver == "no-such-driver.example.com"'
    device_class = pool.own_class("retry", selectors=[nothing])
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("gpu", device_class))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("waiting", "gpu")))
    condition = checks.unschedulable(k8s, ns, "waiting")
    assert checks.every_node_says(condition.message, NO_FIT, [pool.node]), condition.message

    # Nothing else changes: the class update alone must bring the pod back into scheduling.
    selectors = k8s.resource.read_device_class(device_class).spec.selectors
    kept = [{"cel": {"expression": s.cel.expression}} for s in selectors if s.cel.expression != nothing]
    k8s.resource.patch_device_class(device_class, {"spec": {"selectors": kept}})
    checks.running(k8s, ns, "waiting", timeout=90)
    assert checks.allocated_devices(checks.pod_claim(k8s, ns, "waiting")) == [
        ("gpu", pool.devices[0].pool, pool.devices[0].name)]


def test_cel_runtime_error_is_reported_in_the_pods_events(k8s, dra_namespace, devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(1)
    (device,) = pool.devices
    missing = pool.attribute("noSuchAttribute")
    # selector #0 picks the test's device, #1 reads an attribute the driver does not publish
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "broken", requests=[pool.request(selectors=[f'{missing} == "x"'])]))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("broken", "broken")))
    message = checks.event_saying(k8s, ns, "broken", "FailedScheduling", "CEL runtime error", timeout=60)
    claim = checks.pod_claim(k8s, ns, "broken")
    assert f"claim {ns}/{claim.metadata.name}: selector #1 on device {device.path}" in message, message
    assert "no such key: noSuchAttribute" in message and "has()" in message, message  # the error and the hint
    checks.unbound(k8s, ns, "broken")
    assert claim.status is None or claim.status.allocation is None

    # Guarded with has(), the same test is a plain "no device matches", not an error.
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "guarded", requests=[pool.request(selectors=[f'has({missing}) && {missing} == "x"'])]))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("guarded", "guarded")))
    condition = checks.unschedulable(k8s, ns, "guarded")
    assert checks.every_node_says(condition.message, NO_FIT, [pool.node]), condition.message
    assert not [m for m in _scheduling_failures(k8s, ns, "guarded") if "CEL" in m]

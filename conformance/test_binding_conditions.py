"""Device binding conditions (KEP-5007, DRADeviceBindingConditions, beta and on in 1.37).

A device published with `bindingConditions` (and `bindingFailureConditions`, which the API requires with
them) holds its pod in the scheduler's PreBind after allocation: the pod binds only once an external
controller has set every binding condition True in the claim's `status.devices` entry for the device. A
failure condition set True makes the scheduler clear the allocation and schedule the pod again.
`bindsToNode` makes the allocation's nodeSelector name the chosen node. Sources: k8s.io/api@v0.37.2
resource/v1 types.go (Device.BindingConditions, BindingFailureConditions, BindsToNode;
DeviceRequestAllocationResult.BindingConditions), k8s.io/kubernetes@v1.37.2
pkg/scheduler/framework/plugins/dynamicresources (PreBind, isClaimReadyForBinding, PostFilter).

The fake driver's attach controller (fake_devices/attacher.py) plays the external controller, as a
profile's `binding.attach` says.
"""

from __future__ import annotations

import time

import pytest

from conformance import checks, objects
from harness.k8s import watching
from harness.pytest_plugin.allocations import CLAIM_MODEL  # the client's name for the v1 ResourceClaim

BINDING = pytest.mark.dra_feature("DRADeviceBindingConditions", maturity="beta")
FAKE_ATTACH = pytest.mark.fake_devices("an attach controller that acts out binding conditions")
CONDITIONS = ["example.com/attached", "example.com/fabric-ready"]
FAILURE = "example.com/attach-failed"


def _profile(tmp_path, attach: str, seconds: int) -> str:
    path = tmp_path / f"attach-{attach}.yaml"
    path.write_text(f"""apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {{name: attach-{attach}}}
spec:
  numaNodes: [{{id: 0, cpus: "0-7", memory: 32Gi, pcieRoots: [pci0000:10]}}]
  gpus:
  - model: T4
    count: 1
    attach: [{{pcieRoot: pci0000:10}}]
    binding: {{conditions: {CONDITIONS}, failureConditions: [{FAILURE}], attach: {attach}, attachSeconds: {seconds}}}
""")
    return str(path)


class ClaimHistory:
    """Every state of the namespace's claims a watch delivers, with its arrival time (monotonic)."""

    def __init__(self, k8s, namespace: str):
        self.k8s, self.namespace = k8s, namespace
        self.states: list[tuple[float, object]] = []
        # a dropped stream resumes from the last version seen (on_error: keep going)
        self._follow = watching.Follow(k8s.resource.list_namespaced_resource_claim, namespace,
                                       on_event=lambda kind, claim: self.states.append((time.monotonic(), claim)),
                                       on_error=lambda err: True, model=CLAIM_MODEL,
                                       name=f"claim-history-{namespace}")

    def __enter__(self) -> "ClaimHistory":
        self._follow.start(self.k8s.resource.list_namespaced_resource_claim(self.namespace).metadata.resource_version)
        return self

    def __exit__(self, *exc) -> None:
        self._follow.stop()

    def first(self, predicate) -> tuple[float, object] | None:
        return next(((t, c) for t, c in list(self.states) if predicate(c)), None)


def _results(claim) -> list:
    allocation = claim.status.allocation if claim.status else None
    return list(allocation.devices.results or []) if allocation and allocation.devices else []


def _condition(claim, condition: str) -> bool:
    return any(c.type == condition and c.status == "True"
               for d in (claim.status.devices or [] if claim.status else []) for c in (d.conditions or []))


def _start(k8s, ns, fake_driver, node: str, profile: str):
    driver = fake_driver({node: profile})
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("attached-gpu", f"{driver.config.instance}-gpu"))
    return driver


@BINDING
@FAKE_ATTACH
def test_pod_binds_only_after_its_binding_conditions_are_true(k8s, dra_namespace, fake_driver, simulated_node,
                                                              tmp_path):
    ns, node = dra_namespace, simulated_node
    driver = _start(k8s, ns, fake_driver, node, _profile(tmp_path, "succeeds", 3))
    published = checks.published_device(k8s, driver.drivers.gpu, node, "gpu-0")
    assert list(published.binding_conditions or []) == CONDITIONS and published.binds_to_node is True

    with ClaimHistory(k8s, ns) as claims, checks.PodHistory(k8s, ns) as pods:
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("waits", "attached-gpu"))
        checks.running(k8s, ns, "waits", timeout=90)
        allocated = claims.first(lambda c: bool(_results(c)))
        ready = claims.first(lambda c: all(_condition(c, name) for name in CONDITIONS))
        bound = pods.first("waits", lambda kind, p: bool(p.spec.node_name))
    assert allocated and ready and bound, (allocated, ready, bound)
    # allocated first, bound only after the controller set every condition (3 s later)
    assert bound[0] + 1.0 >= ready[0] >= allocated[0] + 2.0, \
        f"allocated at {allocated[0]:.1f}, conditions True at {ready[0]:.1f}, pod bound at {bound[0]:.1f}"
    claim = checks.pod_claim(k8s, ns, "waits")
    (result,) = _results(claim)
    # the allocation carries the device's conditions, and bindsToNode pins it to the chosen node
    assert list(result.binding_conditions or []) == CONDITIONS and list(result.binding_failure_conditions) == [FAILURE]
    terms = claim.status.allocation.node_selector.node_selector_terms
    assert [f.values for t in terms for f in (t.match_fields or [])] == [[node]], terms
    checks.event_saying(k8s, ns, "waits", "BindingConditionsPending")


@BINDING
@FAKE_ATTACH
def test_binding_failure_clears_the_allocation_and_schedules_the_pod_again(k8s, dra_namespace, fake_driver,
                                                                           simulated_node, tmp_path):
    ns, node = dra_namespace, simulated_node
    _start(k8s, ns, fake_driver, node, _profile(tmp_path, "fails-once", 1))
    with ClaimHistory(k8s, ns) as claims:
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("retried", "attached-gpu"))
        checks.running(k8s, ns, "retried", timeout=120)
        failed = claims.first(lambda c: _condition(c, FAILURE))
    assert failed, "the attach controller's failure condition was never seen on the claim"
    claim = checks.pod_claim(k8s, ns, "retried")
    # the pod runs on a new allocation: the failed one was cleared (its status with it)
    assert claim.status.allocation.allocation_timestamp != failed[1].status.allocation.allocation_timestamp
    assert not _condition(claim, FAILURE) and all(_condition(claim, name) for name in CONDITIONS), claim.status.devices
    checks.event_saying(k8s, ns, "retried", "FailedScheduling", "device binding failed")


@BINDING
@FAKE_ATTACH
def test_a_device_that_never_attaches_keeps_its_pod_unbound(k8s, dra_namespace, fake_driver, simulated_node,
                                                            tmp_path):
    ns, node = dra_namespace, simulated_node
    _start(k8s, ns, fake_driver, node, _profile(tmp_path, "never", 0))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("stuck", "attached-gpu"))
    checks.event_saying(k8s, ns, "stuck", "BindingConditionsPending", timeout=60)  # the scheduler waits for them
    claim = checks.pod_claim(k8s, ns, "stuck")
    assert _results(claim) and [r.uid for r in claim.status.reserved_for or []] == \
        [k8s.core.read_namespaced_pod("stuck", ns).metadata.uid], claim.status
    # PreBind looks at the conditions every 5 s (dynamicresources.go PreBind): through two of its looks
    # nothing was written, so the pod must stay unbound and its allocation kept
    deadline = time.monotonic() + 11
    while time.monotonic() < deadline:
        pod = k8s.core.read_namespaced_pod("stuck", ns)
        assert pod.spec.node_name is None, f"pod stuck was bound to {pod.spec.node_name} with no condition set"
        time.sleep(0.5)
    claim = k8s.resource.read_namespaced_resource_claim(claim.metadata.name, ns)
    assert _results(claim) and not (claim.status.devices or []), claim.status


@pytest.mark.dra_feature("DRADeviceBindingConditions", maturity="beta", api_only=True)
def test_api_server_requires_failure_conditions_with_binding_conditions(k8s, unique_name, simulated_node):
    driver = unique_name("bc") + ".example.com"
    device = {**objects.gpu_device("gpu-0"), "bindingConditions": ["example.com/attached"]}
    body = objects.resource_slice(unique_name("bc"), driver, simulated_node, [device])
    message = checks.rejected(k8s.resource.create_resource_slice, body)
    assert "bindingFailureConditions are required to use bindingConditions" in message, message
    overlapping = {**device, "bindingFailureConditions": ["example.com/attached"]}
    message = checks.rejected(k8s.resource.create_resource_slice,
                              objects.resource_slice(unique_name("bc"), driver, simulated_node, [overlapping]))
    assert "must not overlap with bindingConditions" in message, message

"""Extended resources backed by DRA (KEP-5004, GA in 1.37): a pod asks for `<name>: N` in its
resource limits, with no ResourceClaim in its spec, and the scheduler allocates N devices of the
DeviceClass that advertises that name, through a ResourceClaim it creates for the pod.

Every test uses an extended resource name of its own, so parallel tests never share a mapping.
"""

from __future__ import annotations

from collections import Counter

import pytest

from conformance import checks, objects
from harness.k8s.client import Clients

pytestmark = pytest.mark.dra_feature("DRAExtendedResource", maturity="ga")

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


def _resource_name(unique_name) -> str:
    return unique_name("x") + ".example.com/gpu"


def _allocated(claim) -> list[tuple[str, str, str, str]]:
    return sorted((r.request, r.driver, r.pool, r.device) for r in claim.status.allocation.devices.results)


def _requests(claim) -> list[tuple[str, str, str, int]]:
    return [(r.name, r.exactly.device_class_name, r.exactly.allocation_mode, r.exactly.count)
            for r in claim.spec.devices.requests]


def _claim_names(k8s: Clients, ns: str) -> list[str]:
    return sorted(c.metadata.name for c in k8s.resource.list_namespaced_resource_claim(ns).items)


def test_limit_gets_a_generated_claim_that_goes_with_the_pod(k8s, dra_namespace, devices_under_test, unique_name):
    ns = dra_namespace
    ext = _resource_name(unique_name)
    pool = devices_under_test(2)
    gpu_class = pool.own_class("ext", extended_resource_name=ext)
    assert k8s.resource.read_device_class(gpu_class).spec.extended_resource_name == ext

    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("trainer", {ext: "2"})))
    assert checks.running(k8s, ns, "trainer", timeout=90).spec.node_name == pool.node
    pod, claim = checks.extended_resource_claim(k8s, ns, "trainer")

    # The pod learns which request serves which container and resource ...
    assert checks.request_mappings(pod) == [("main", ext, "container-0-request-0")]
    assert pod.status.extended_resource_claim_status.resource_claim_name == claim.metadata.name
    # ... while its spec stays as written: no claim entry added, none listed in resourceClaimStatuses.
    assert pod.spec.resource_claims is None and pod.status.resource_claim_statuses is None

    # The scheduler's claim: named after the pod, marked, owned (controller) by the pod.
    assert claim.metadata.generate_name == "trainer-extended-resources-"
    assert claim.metadata.name.startswith("trainer-extended-resources-")
    assert claim.metadata.annotations == {checks.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    assert claim.metadata.finalizers == ["resource.kubernetes.io/delete-protection"]  # allocated: protected
    (owner,) = claim.metadata.owner_references
    assert (owner.api_version, owner.kind, owner.name, owner.uid, owner.controller) == (
        "v1", "Pod", "trainer", pod.metadata.uid, True)
    assert _requests(claim) == [("container-0-request-0", gpu_class, "ExactCount", 2)]
    # Two distinct devices, reserved for the pod.
    assert _allocated(claim) == sorted(("container-0-request-0", d.driver, d.pool, d.name) for d in pool.devices)
    assert [ref.uid for ref in claim.status.reserved_for] == [pod.metadata.uid]

    # The claim ends with the pod.
    k8s.core.delete_namespaced_pod("trainer", ns)
    checks.claim_deleted(k8s, ns, claim.metadata.name, timeout=90)
    assert _claim_names(k8s, ns) == []


def test_no_overcommit_one_pod_waits_until_a_device_is_freed(k8s, dra_namespace, devices_under_test, unique_name):
    ns = dra_namespace
    ext = _resource_name(unique_name)
    pool = devices_under_test(2)
    pool.own_class("ext", extended_resource_name=ext)
    for name in ("a", "b", "c"):  # three pods, two devices
        k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources(name, {ext: "1"})))

    pods = checks.pods_settled(k8s, ns, running=2, unschedulable=1, timeout=90)
    (waiting,) = [name for name, p in pods.items() if checks.scheduling_state(p) == "Unschedulable"]
    running = sorted(set(pods) - {waiting})
    (condition,) = [c for c in pods[waiting].status.conditions if c.type == "PodScheduled"]
    # The class exists, so DRA (not NodeResourcesFit) decides.
    assert checks.every_node_says(condition.message, "cannot allocate all claims", [pool.node]), condition.message
    assert pods[waiting].status.extended_resource_claim_status is None

    device_of = {}
    claim_of = {}
    for name in running:
        pod, claim = checks.extended_resource_claim(k8s, ns, name)
        assert checks.request_mappings(pod) == [("main", ext, "container-0-request-0")]
        ((_, drv, device_pool, device),) = _allocated(claim)
        assert (drv, device_pool) == (pool.driver, pool.pool)
        device_of[name], claim_of[name] = device, claim.metadata.name
    assert sorted(device_of.values()) == sorted(pool.names)
    # Only scheduled pods get a claim: nothing was created for the waiting one.
    assert _claim_names(k8s, ns) == sorted(claim_of.values())

    # Deleting a pod deletes its claim; the freed device goes to the waiting pod.
    freed = running[0]
    k8s.core.delete_namespaced_pod(freed, ns)
    checks.claim_deleted(k8s, ns, claim_of[freed], timeout=90)
    checks.running(k8s, ns, waiting, timeout=90)
    pod, claim = checks.extended_resource_claim(k8s, ns, waiting)
    assert [r.device for r in claim.status.allocation.devices.results] == [device_of[freed]]
    assert claim.metadata.owner_references[0].uid == pod.metadata.uid


def test_implicit_name_of_a_class_without_extended_resource_name(k8s, dra_namespace, devices_under_test,
                                                                unique_name):
    ns = dra_namespace
    pool = devices_under_test(2)
    gpu_class = pool.own_class("implicit")  # no extendedResourceName: only the implicit one
    assert k8s.resource.read_device_class(gpu_class).spec.extended_resource_name is None
    implicit = IMPLICIT_PREFIX + gpu_class
    no_such_class = IMPLICIT_PREFIX + unique_name("no-such-class")

    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("implicit", {implicit: "2"})))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("unknown", {no_such_class: "1"})))

    checks.running(k8s, ns, "implicit", timeout=90)
    pod, claim = checks.extended_resource_claim(k8s, ns, "implicit")
    assert checks.request_mappings(pod) == [("main", implicit, "container-0-request-0")]
    assert _requests(claim) == [("container-0-request-0", gpu_class, "ExactCount", 2)]
    assert sorted(d for *_, d in _allocated(claim)) == sorted(pool.names)

    condition = checks.unschedulable(k8s, ns, "unknown")
    assert checks.every_node_says(condition.message, f"Insufficient {no_such_class}", [pool.node]), \
        condition.message
    assert _claim_names(k8s, ns) == [claim.metadata.name]


def test_containers_and_init_containers_get_their_own_requests(k8s, dra_namespace, devices_under_test, unique_name):
    """Sidecars and regular containers each get a request of their own; a regular init container runs
    before them, so it reuses their devices and asks only for what they do not cover."""
    ns = dra_namespace
    ext = _resource_name(unique_name)
    pool = devices_under_test(6)
    device_class = pool.own_class("multi", extended_resource_name=ext)
    body = objects.pod("multi",
                       [objects.container("main", limits={ext: "1"}), objects.container("helper", limits={ext: "2"})],
                       init_containers=[objects.container("prepare", limits={ext: "5"}),
                                        objects.container("sidecar", limits={ext: "1"}, restart_policy="Always")])
    # a regular init container must end for the pod to start (on a kubelet node it really runs)
    body["spec"]["initContainers"][0].update(image=pool.shell_image(), imagePullPolicy="IfNotPresent",
                                             command=["true"])
    k8s.core.create_namespaced_pod(ns, pool.pod(body))
    checks.running(k8s, ns, "multi", timeout=90)
    pod, claim = checks.extended_resource_claim(k8s, ns, "multi")

    # Container index counts init containers first: prepare 0, sidecar 1, main 2, helper 3.
    assert _requests(claim) == [("container-0-request-0", device_class, "ExactCount", 1),
                                ("container-1-request-0", device_class, "ExactCount", 1),
                                ("container-2-request-0", device_class, "ExactCount", 1),
                                ("container-3-request-0", device_class, "ExactCount", 2)]
    assert checks.request_mappings(pod) == [
        ("sidecar", ext, "container-1-request-0"),
        ("main", ext, "container-2-request-0"),
        ("helper", ext, "container-3-request-0"),
        # prepare needs 5: the 4 devices of the long-lived containers, plus 1 of its own
        ("prepare", ext, "container-1-request-0"),
        ("prepare", ext, "container-2-request-0"),
        ("prepare", ext, "container-3-request-0"),
        ("prepare", ext, "container-0-request-0"),
    ]
    results = claim.status.allocation.devices.results
    assert Counter(r.request for r in results) == {"container-0-request-0": 1, "container-1-request-0": 1,
                                                   "container-2-request-0": 1, "container-3-request-0": 2}
    assert len({r.device for r in results}) == 5  # all distinct

    # Five of six devices are taken: two more do not fit, one does.
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("two-more", {ext: "2"})))
    checks.unschedulable(k8s, ns, "two-more")
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("one-more", {ext: "1"})))
    checks.running(k8s, ns, "one-more", timeout=90)
    _, last = checks.extended_resource_claim(k8s, ns, "one-more")
    ((_, _, _, device),) = _allocated(last)
    assert device not in {r.device for r in results}


def test_zero_request_makes_no_claim(k8s, dra_namespace, devices_under_test, unique_name):
    ns = dra_namespace
    ext = _resource_name(unique_name)
    pool = devices_under_test(1)
    pool.own_class("ext", extended_resource_name=ext)
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("zero", {ext: "0"})))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("one", {ext: "1"})))
    checks.running(k8s, ns, "zero", timeout=90)
    checks.running(k8s, ns, "one", timeout=90)
    _, claim = checks.extended_resource_claim(k8s, ns, "one")  # the mapping is live ...
    # ... yet the zero request got nothing: no claim, no status.
    assert _claim_names(k8s, ns) == [claim.metadata.name]
    assert k8s.core.read_namespaced_pod("zero", ns).status.extended_resource_claim_status is None


def test_pod_waits_for_the_class_of_its_extended_resource(k8s, dra_namespace, devices_under_test, unique_name):
    ns = dra_namespace
    ext = _resource_name(unique_name)
    pool = devices_under_test(1)  # devices published, but no class advertises `ext`
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_extended_resources("early", {ext: "1"})))
    condition = checks.unschedulable(k8s, ns, "early")
    assert checks.every_node_says(condition.message, f"Insufficient {ext}", [pool.node]), condition.message
    assert _claim_names(k8s, ns) == []

    late_class = pool.own_class("late-gpu", extended_resource_name=ext)
    assert checks.running(k8s, ns, "early", timeout=90).spec.node_name == pool.node
    pod, claim = checks.extended_resource_claim(k8s, ns, "early")
    assert checks.request_mappings(pod) == [("main", ext, "container-0-request-0")]
    assert _requests(claim) == [("container-0-request-0", late_class, "ExactCount", 1)]
    ((_, drv, device_pool, device),) = _allocated(claim)
    assert (drv, device_pool, device) == (pool.driver, pool.pool, pool.names[0])

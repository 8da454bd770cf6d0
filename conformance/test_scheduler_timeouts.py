"""The DynamicResources plugin's timeouts: `filterTimeout` (DRASchedulerFilterTimeout, beta and on in 1.37)
and `bindingTimeout` (DRADeviceBindingConditions).

- filterTimeout bounds the allocator in Filter. When it passes, Filter returns an Error (not
  Unschedulable: "timeouts are potentially transient"), so the pod's cycle ends with reason
  SchedulerError and the message `node <node>: timed out trying to allocate devices`, and the pod goes
  to backoff (k8s.io/kubernetes@v1.37.2 pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go
  Filter; schedule_one.go handleSchedulingFailure).
- bindingTimeout bounds PreBind's wait for a device's binding conditions. When it passes, PreBind fails
  with `device binding timeout`, the next cycle's Filter sees the claim timed out and PostFilter clears
  its allocation ("deallocation of ResourceClaim completed"), and the pod is scheduled again
  (dynamicresources.go PreBind, isClaimTimeout, PostFilter).

Both are plugin arguments of a scheduler profile. These tests use the profile with short timeouts the
local backend runs beside default-scheduler (harness/core/schedulerprofiles.py); their pods name it in
`spec.schedulerName`, so no other test sees the short timeouts. A cluster without that profile skips them.
"""

from __future__ import annotations

import time

import pytest

from conformance import checks, objects
from conformance.test_binding_conditions import ClaimHistory, _profile, _results
from harness.core import schedulerprofiles
from harness.k8s import wait

FILTER_TIMEOUT = pytest.mark.dra_feature("DRASchedulerFilterTimeout", maturity="beta")
BINDING = pytest.mark.dra_feature("DRADeviceBindingConditions", maturity="beta")
PROFILE = schedulerprofiles.SHORT_DRA_TIMEOUTS
# The allocator tries every subset of the node's devices before it gives up on a count one larger than
# their number: 2^24 steps, seconds of CPU, where a request it can meet takes microseconds.
DEVICES = 24
TIMED_OUT = "timed out trying to allocate devices"
DEFAULT_FILTER_TIMEOUT_SECONDS = 10  # DynamicResourcesFilterTimeoutDefault, kube-scheduler@v0.37.2 config/v1


def _short_profile(dra_cluster, setting: str) -> schedulerprofiles.SchedulerProfile:
    profile = dra_cluster.scheduler_profile(PROFILE)
    if profile is None:
        pytest.skip(f"the cluster runs no scheduler profile {PROFILE!r} with known short DRA timeouts "
                    "(the local backend starts one beside default-scheduler)")
    if getattr(profile, setting) is None:
        pytest.skip(f"scheduler profile {PROFILE!r} sets no {setting}: its feature gates are off in this cluster")
    return profile


def _many_gpus_profile(tmp_path) -> str:
    path = tmp_path / "many-gpus.yaml"
    path.write_text(f"""apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {{name: many-gpus}}
spec:
  numaNodes: [{{id: 0, cpus: "0-31", memory: 256Gi, pcieRoots: [pci0000:10]}}]
  gpus:
  - {{model: T4, count: {DEVICES}, attach: [{{pcieRoot: pci0000:10}}]}}
""")
    return str(path)


def _pod(name: str, template: str, node: str) -> dict:
    body = objects.pod_with_template_claim(name, template, node_selector={"kubernetes.io/hostname": node})
    body["spec"]["schedulerName"] = PROFILE
    return body


def _scheduler_error(k8s, namespace: str, pod: str, text: str, timeout: float):
    """The pod's PodScheduled=False condition with reason SchedulerError whose message has `text`."""
    def condition():
        for c in k8s.core.read_namespaced_pod(pod, namespace).status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "SchedulerError" and text in (c.message or ""):
                return c
        return None

    return wait.until(f"pod {pod} to fail scheduling with {text!r}", condition, timeout,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))


@FILTER_TIMEOUT
def test_a_claim_the_allocator_can_meet_is_allocated_within_the_filter_timeout(k8s, dra_cluster, dra_namespace,
                                                                              fake_driver, simulated_node, tmp_path):
    _short_profile(dra_cluster, "filter_timeout_seconds")
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: _many_gpus_profile(tmp_path)})
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("all-gpus", f"{driver.config.instance}-gpu", count=DEVICES))
    k8s.core.create_namespaced_pod(ns, _pod("fits", "all-gpus", node))
    checks.running(k8s, ns, "fits", timeout=90)
    claim = checks.pod_claim(k8s, ns, "fits")
    devices = {device for _, _, device in checks.allocated_devices(claim)}
    assert devices == {f"gpu-{i}" for i in range(DEVICES)}, devices
    pod = k8s.core.read_namespaced_pod("fits", ns)
    assert (pod.spec.scheduler_name, pod.spec.node_name) == (PROFILE, node)


@FILTER_TIMEOUT
def test_an_expensive_claim_ends_the_cycle_with_the_timeout_error_and_stays_unallocated(
        k8s, dra_cluster, dra_namespace, fake_driver, simulated_node, tmp_path):
    profile = _short_profile(dra_cluster, "filter_timeout_seconds")
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: _many_gpus_profile(tmp_path)})
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("one-too-many", f"{driver.config.instance}-gpu", count=DEVICES + 1))
    k8s.core.create_namespaced_pod(ns, _pod("expensive", "one-too-many", node))
    condition = _scheduler_error(k8s, ns, "expensive", TIMED_OUT, timeout=60)
    assert f"node {node}: {TIMED_OUT}" in condition.message, condition.message
    # The profile's timeout ended the search, not the default one (10 s; the search takes longer than that:
    # measured, default-scheduler reports the same error after it). Timestamps are whole seconds.
    created = k8s.core.read_namespaced_pod("expensive", ns).metadata.creation_timestamp
    took = (condition.last_transition_time - created).total_seconds()
    assert took < DEFAULT_FILTER_TIMEOUT_SECONDS - 1, \
        f"the allocator gave up {took:.0f} s after the pod was created; profile {PROFILE} says {profile.filter_timeout_seconds} s"
    checks.event_saying(k8s, ns, "expensive", "FailedScheduling", TIMED_OUT)
    claim = checks.pod_claim(k8s, ns, "expensive")
    assert not _results(claim), f"claim {claim.metadata.name} was allocated: {claim.status.allocation}"
    assert k8s.core.read_namespaced_pod("expensive", ns).spec.node_name is None


@BINDING
@pytest.mark.fake_devices("an attach controller that acts out binding conditions")
def test_binding_timeout_clears_the_allocation_and_schedules_the_pod_again(k8s, dra_cluster, dra_namespace,
                                                                           fake_driver, simulated_node, tmp_path):
    profile = _short_profile(dra_cluster, "binding_timeout_seconds")
    timeout = profile.binding_timeout_seconds
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: _profile(tmp_path, "never", 0)})  # binding conditions nobody sets
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("attached-gpu", f"{driver.config.instance}-gpu"))
    started = time.monotonic()
    with ClaimHistory(k8s, ns) as claims:
        k8s.core.create_namespaced_pod(ns, _pod("times-out", "attached-gpu", node))
        # Two timeouts: allocated, released, allocated again (each wait is bindingTimeout plus up to 5 s
        # of PreBind's polling and the backoff between the cycles).
        condition = _scheduler_error(k8s, ns, "times-out", "device binding timeout", timeout=3 * timeout + 60)

        def allocations() -> list:
            stamps = []
            for _, c in list(claims.states):
                stamp = c.status.allocation.allocation_timestamp if _results(c) else None
                if stamp is not None and stamp not in stamps:
                    stamps.append(stamp)
            return stamps

        def released_then_allocated_again():
            first = claims.first(lambda c: bool(_results(c)))
            if first is None:
                return None
            released = [t for t, c in list(claims.states) if t > first[0] and not _results(c)]
            return released and len(allocations()) >= 2

        wait.until("the scheduler to clear the timed-out allocation and allocate the claim again",
                   released_then_allocated_again, 2 * timeout + 60,
                   diagnostics=lambda: wait.describe_namespace(k8s, ns))
        first = claims.first(lambda c: bool(_results(c)))
    assert first is not None
    # The first allocation lasted at least bindingTimeout before PreBind gave up on it.
    failed_at = condition.last_transition_time
    first_stamp = first[1].status.allocation.allocation_timestamp
    assert (failed_at - first_stamp).total_seconds() >= timeout - 1, (first_stamp, failed_at)
    assert time.monotonic() - started >= timeout
    # PreBind gave up, then PostFilter of the next cycle released the claim
    checks.event_saying(k8s, ns, "times-out", "FailedScheduling", "device binding timeout")
    checks.event_saying(k8s, ns, "times-out", "FailedScheduling", "deallocation of ResourceClaim completed")
    # Never attached, never bound; the allocation in place now is a new one.
    assert k8s.core.read_namespaced_pod("times-out", ns).spec.node_name is None

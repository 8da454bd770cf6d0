"""Device taints and tolerations (KEP-5055, GA in 1.37): taints published by a driver in its
ResourceSlices, and DeviceTaintRules (resource.k8s.io/v1) set by an admin.

Effects: NoSchedule keeps a device from new allocations unless the request tolerates the taint;
NoExecute also evicts pods using the device (the device taint eviction controller in
kube-controller-manager), after a toleration's tolerationSeconds if it has one; None only shows.
The fake driver turns injected faults into taints: warning -> None, degraded -> NoSchedule,
unhealthy -> NoExecute.
"""

from __future__ import annotations

import time

import pytest

from conformance import checks, objects
from fake_devices import faults
from fake_devices.faultkinds import KINDS as FAULT_KINDS
from fake_devices.render import FAULT_TAINT_KEY
from harness.k8s import wait

DEVICE_TAINTS = pytest.mark.dra_feature("DRADeviceTaints", maturity="ga")
DEVICE_TAINT_RULES = pytest.mark.dra_feature("DRADeviceTaintRules", maturity="ga")

MAINTENANCE = "dra-harness.x-k8s.io/maintenance"  # the key of faults.taint_rule()
EVICTION = ("DeletionByDeviceTaintManager", "Device Taint manager: deleting due to NoExecute taint")
NOT_UPDATED_AGAIN = ("if the effect was NoExecute. This information will not be updated again. "
                     "Recreate the DeviceTaintRule to trigger an update.")
TOLERATION_SECONDS = 5


def _fault(k8s, ns, driver, node: str, device: str, kind: str | None, driver_name: str | None = None):
    """Inject (or clear, kind None) a fault and wait until the driver publishes its taint."""
    faults.set_fault(k8s.core, ns, driver.config.faults_configmap, node, device, kind)
    effect = FAULT_KINDS[kind].taint_effect if kind is not None else None
    assert kind is None or effect is not None, f"fault {kind!r} publishes no taint"
    expected = [] if kind is None or effect is None else [(FAULT_TAINT_KEY, kind, effect)]
    return checks.published_taints(k8s, driver_name or driver.drivers.gpu, node, device, expected)


def _device(k8s, ns, pod: str) -> tuple[str, str]:
    """(pool, device) of the single device allocated to `pod`'s claim `gpu`."""
    ((_, pool, device),) = checks.allocated_devices(checks.pod_claim(k8s, ns, pod))
    return pool, device


def _own_devices(cluster_objects, unique_name, nodes: list[str], count: int, tag: str = "dt") -> tuple[str, str]:
    """A driver of this test's own with `count` devices in a pool per node, and a class for them."""
    driver = unique_name(tag) + ".example.com"
    device_class = unique_name(tag)
    cluster_objects.device_class(objects.device_class(device_class, driver))
    for node in nodes:
        cluster_objects.resource_slice(objects.resource_slice(unique_name(f"{tag}-{node}"), driver, node,
                                                              [objects.gpu_device(f"gpu-{i}") for i in range(count)]))
    return driver, device_class


def _on_node(node: str) -> dict:
    return {"kubernetes.io/hostname": node}


# --- taints published by the driver -------------------------------------------------------------

@DEVICE_TAINTS
@pytest.mark.fake_devices("fault injection (a driver that taints a device on demand)")
def test_fault_kinds_publish_taints_with_their_effects(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    warning = _fault(k8s, ns, driver, node, "gpu-0", "warning")
    _fault(k8s, ns, driver, node, "gpu-1", "degraded")
    _fault(k8s, ns, driver, node, "nic-0", "unhealthy", driver_name=driver.drivers.nic)
    assert warning[0].time_added is not None  # set by the API server, the driver sends none
    assert checks.device_taints(k8s, driver.drivers.nic, node, "nic-1") == []  # only the faulty device

    for device, driver_name in (("gpu-0", driver.drivers.gpu), ("gpu-1", driver.drivers.gpu),
                                ("nic-0", driver.drivers.nic)):
        _fault(k8s, ns, driver, node, device, None, driver_name=driver_name)  # recovered: taint gone


@DEVICE_TAINTS
@pytest.mark.fake_devices("fault injection (a driver that taints a device on demand)")
def test_warning_taint_changes_nothing(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("any-gpu", f"{driver.config.instance}-gpu"))
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("any-nic", f"{driver.config.instance}-nic"))
    for pod, template in (("on-gpu", "any-gpu"), ("on-nic", "any-nic")):
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(pod, template))
        checks.running(k8s, ns, pod)
    _, used = _device(k8s, ns, "on-gpu")
    _, nic = _device(k8s, ns, "on-nic")

    with checks.PodHistory(k8s, ns) as history:
        for device in ("gpu-0", "gpu-1"):
            _fault(k8s, ns, driver, node, device, "warning")
        # Still allocatable: the other (warned) GPU goes to a new pod.
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("newcomer", "any-gpu"))
        checks.running(k8s, ns, "newcomer")
        assert _device(k8s, ns, "newcomer") == (node, {"gpu-0": "gpu-1", "gpu-1": "gpu-0"}[used])
        # Control: a NoExecute fault injected afterwards is acted upon; the warned pods are not.
        _fault(k8s, ns, driver, node, nic, "unhealthy", driver_name=driver.drivers.nic)
        condition = history.evicted_by_taint_manager("on-nic")
        assert (condition.reason, condition.message) == EVICTION
        checks.untouched(k8s, history, ns, "on-gpu")
        checks.untouched(k8s, history, ns, "newcomer")


@DEVICE_TAINTS
@pytest.mark.fake_devices("fault injection (a driver that taints a device on demand)")
def test_no_schedule_taint_blocks_new_allocations_and_evicts_nothing(k8s, dra_namespace, fake_driver,
                                                                   simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})  # gpu-0, gpu-1
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("any-gpu", f"{driver.config.instance}-gpu"))

    with checks.PodHistory(k8s, ns) as history:
        _fault(k8s, ns, driver, node, "gpu-0", "degraded")
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("first", "any-gpu"))
        checks.running(k8s, ns, "first")
        assert _device(k8s, ns, "first") == (node, "gpu-1")  # gpu-0 is free, but tainted

        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("second", "any-gpu"))
        condition = checks.unschedulable(k8s, ns, "second")
        assert "cannot allocate all claims" in condition.message
        assert checks.pod_claim(k8s, ns, "second").status.allocation is None

        # The device recovers: the waiting pod gets it.
        _fault(k8s, ns, driver, node, "gpu-0", None)
        checks.running(k8s, ns, "second")
        assert _device(k8s, ns, "second") == (node, "gpu-0")

        # NoSchedule never evicts: degrade gpu-0 under "second". As a control that the eviction
        # controller has caught up, gpu-1 fails (NoExecute) under "first" afterwards.
        _fault(k8s, ns, driver, node, "gpu-0", "degraded")
        _fault(k8s, ns, driver, node, "gpu-1", "unhealthy")
        condition = history.evicted_by_taint_manager("first")
        assert (condition.reason, condition.message) == EVICTION
        checks.untouched(k8s, history, ns, "second")


@DEVICE_TAINTS
@pytest.mark.fake_devices("fault injection (a driver that taints a device on demand)")
def test_toleration_in_the_request_admits_a_tainted_device(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    for device in ("gpu-0", "gpu-1"):
        _fault(k8s, ns, driver, node, device, "degraded")
    gpu = objects.request(f"{driver.config.instance}-gpu")
    tolerations = {
        "plain": None,
        "wrong-value": objects.device_toleration(FAULT_TAINT_KEY, value="warning", effect="NoSchedule"),
        "wrong-effect": objects.device_toleration(FAULT_TAINT_KEY, value="degraded", effect="NoExecute"),
        "wrong-key": objects.device_toleration(MAINTENANCE, operator="Exists"),
        "exact": objects.device_toleration(FAULT_TAINT_KEY, value="degraded", effect="NoSchedule"),
        "any-effect": objects.device_toleration(FAULT_TAINT_KEY, operator="Exists"),
    }
    for name, toleration in tolerations.items():
        request = objects.tolerating(gpu, toleration) if toleration else gpu
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(name, requests=[request]))
    refused = ("plain", "wrong-value", "wrong-effect", "wrong-key")
    for name in refused:
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(name, name))
        checks.unschedulable(k8s, ns, name)

    devices = set()
    for name in ("exact", "any-effect"):
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(name, name))
        checks.running(k8s, ns, name)
        (result,) = checks.pod_claim(k8s, ns, name).status.allocation.devices.results
        devices.add(result.device)
        # The allocation records the tolerations it was made with.
        expected = tolerations[name]
        assert [(t.key, t.operator, t.value, t.effect, t.toleration_seconds) for t in result.tolerations] == [
            (expected["key"], expected["operator"], expected.get("value"), expected.get("effect"), None)]
    assert devices == {"gpu-0", "gpu-1"}
    for name in refused:  # still waiting, although the tolerating pods were served
        assert checks.scheduling_state(k8s.core.read_namespaced_pod(name, ns)) == "Unschedulable"


@DEVICE_TAINTS
@pytest.mark.fake_devices("fault injection (a driver that taints a device on demand)")
def test_failed_device_evicts_its_pod_and_the_replacement_lands_on_a_healthy_one(k8s, dra_namespace, fake_driver,
                                                                               simulated_nodes):
    ns = dra_namespace
    nodes = simulated_nodes[:2]
    # 4 GPUs: on 2 nodes (tiny's 2 each), or on the one node a cluster may have (gpu-4)
    driver = fake_driver({node: "tiny" if len(nodes) == 2 else "gpu-4" for node in nodes})
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("any-gpu", f"{driver.config.instance}-gpu"))
    for pod in ("worker", "bystander"):
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(pod, "any-gpu"))
        checks.running(k8s, ns, pod)
    failed, busy = _device(k8s, ns, "worker"), _device(k8s, ns, "bystander")
    worker_claim = checks.pod_claim(k8s, ns, "worker").metadata.name

    with checks.PodHistory(k8s, ns) as history:
        _fault(k8s, ns, driver, *failed, "unhealthy")
        condition = history.evicted_by_taint_manager("worker")
        assert (condition.reason, condition.message) == EVICTION
        history.gone("worker")
        checks.claim_deleted(k8s, ns, worker_claim)
        wait.until("the eviction event of pod worker", lambda: [
            e for e in k8s.core.list_namespaced_event(ns, field_selector="involvedObject.name=worker").items
            if (e.reason, e.message) == ("DeviceTaintManagerEviction", "Marking for deletion")], 30)

        # Same template again: it must land on a healthy device.
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("worker-2", "any-gpu"))
        checks.running(k8s, ns, "worker-2")
        replacement = _device(k8s, ns, "worker-2")
        assert replacement not in (failed, busy)
        assert checks.device_taints(k8s, driver.drivers.gpu, *replacement) == []
        checks.untouched(k8s, history, ns, "bystander")


# --- DeviceTaintRules ---------------------------------------------------------------------------

@DEVICE_TAINTS
@DEVICE_TAINT_RULES
def test_rule_no_execute_evicts_only_pods_on_the_selected_device(k8s, dra_namespace, cluster_objects, unique_name,
                                                                devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(2)
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one"))
    for pod in ("a", "b"):
        k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(pod, "one")))
        checks.running(k8s, ns, pod, timeout=90)
    (device_pool, device_a), (_, device_b) = _device(k8s, ns, "a"), _device(k8s, ns, "b")

    with checks.PodHistory(k8s, ns) as history:
        rule = cluster_objects.device_taint_rule(
            faults.taint_rule(unique_name("rule"), "NoExecute", driver=pool.driver, pool=device_pool, device=device_a))
        # The controller reports before it evicts ...
        first = checks.rule_condition(k8s, rule.metadata.name, "PodsPendingEviction")
        assert (first.status, first.message, first.observed_generation) == (
            "True", "1 pod needs to be evicted in 1 namespace.", 1)
        # ... then evicts the pod on the selected device, and only that one.
        condition = history.evicted_by_taint_manager("a")
        assert (condition.reason, condition.message) == EVICTION
        history.gone("a", timeout=60)
        checks.untouched(k8s, history, ns, "b")

    # NoExecute also keeps the device from new allocations; deleting the rule gives it back (to a pod that
    # asks once the eviction controller has seen the deletion: checks.taint_eviction_caught_up says why).
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("waiting", "one")))
    checks.unschedulable(k8s, ns, "waiting")
    k8s.core.delete_namespaced_pod("waiting", ns)
    checks.pod_gone(k8s, ns, "waiting")
    k8s.resource.delete_device_taint_rule(rule.metadata.name)
    checks.taint_eviction_caught_up(k8s, ns)
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("a-again", "one")))
    checks.running(k8s, ns, "a-again", timeout=90)
    assert _device(k8s, ns, "a-again") == (device_pool, device_a)
    assert device_b != device_a


def _run_one_pod_per_request(k8s, ns: str, pool, requests: dict[str, dict]) -> None:
    """For each name: a claim template of that one request and a pod using it on the pool's node, running."""
    for name, request in requests.items():
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(name, requests=[request]))
        k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(name, name)))
    for name in requests:
        checks.running(k8s, ns, name, timeout=90)


@DEVICE_TAINTS
@DEVICE_TAINT_RULES
def test_rule_no_execute_waits_for_toleration_seconds(k8s, dra_namespace, cluster_objects, unique_name,
                                                      devices_under_test):
    ns = dra_namespace
    seconds = TOLERATION_SECONDS
    pool = devices_under_test(3)
    gpu = pool.request()
    templates = {
        "intolerant": gpu,
        "patient": objects.tolerating(gpu, objects.device_toleration(MAINTENANCE, operator="Exists",
                                                                     effect="NoExecute", seconds=seconds)),
        "forever": objects.tolerating(gpu, objects.device_toleration(MAINTENANCE, operator="Exists",
                                                                     effect="NoExecute")),
    }
    _run_one_pod_per_request(k8s, ns, pool, templates)

    with checks.PodHistory(k8s, ns) as history:
        requested = time.monotonic()
        rule = cluster_objects.device_taint_rule(faults.taint_rule(unique_name("rule"), "NoExecute",
                                                                   driver=pool.driver, pool=pool.pool))
        added = rule.spec.taint.time_added  # defaulted by the API server, in whole seconds
        assert added is not None
        first = checks.rule_condition(k8s, rule.metadata.name, "PodsPendingEviction")
        assert (first.status, first.message) == ("True", "2 pods need to be evicted in 1 namespace.")

        intolerant_at, _ = history.eviction("intolerant", timeout=15)
        patient_at, _ = history.eviction("patient", timeout=seconds + 15)
        patient = history.evicted_by_taint_manager("patient")
        assert (patient.reason, patient.message) == EVICTION
        # Not before tolerationSeconds: counted by the controller from the taint's timeAdded, which
        # the API server truncates to whole seconds (so up to 1 s before our request) ...
        assert patient_at - requested >= seconds - 1.05, f"evicted after {patient_at - requested:.2f}s"
        assert (patient.last_transition_time - added).total_seconds() >= seconds
        # ... but promptly after, and the intolerant pod at once.
        assert patient_at - requested <= seconds + 10, f"evicted after {patient_at - requested:.2f}s"
        assert intolerant_at - requested < seconds - 1.05, f"evicted after {intolerant_at - requested:.2f}s"

        done = checks.rule_condition(k8s, rule.metadata.name, "Completed", timeout=60)
        assert (done.status, done.message) == ("False", "2 pods evicted since starting the controller.")
        checks.untouched(k8s, history, ns, "forever")



class TolerationIgnored(Exception):
    """The eviction controller evicted, or counted for eviction, a pod whose claim tolerates the taint."""


@DEVICE_TAINTS
@DEVICE_TAINT_RULES
@pytest.mark.xfail(strict=True, raises=TolerationIgnored, reason=(
    "kube-controller-manager v1.37.2 bug: the device taint eviction controller counts a toleration against a "
    "NoExecute taint only when its effect is NoExecute (pkg/controller/devicetainteviction/device_taint_eviction.go "
    "claimEvictionTime: `toleration.Effect == NoExecute && ToleratesTaint(...)`), while the API says an empty effect "
    "matches every effect (resource.k8s.io/v1 DeviceToleration.effect) and the scheduler admits the device with it"))
def test_a_toleration_without_an_effect_keeps_its_pod_on_a_no_execute_device(k8s, dra_namespace, cluster_objects,
                                                                            unique_name, devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(2)
    gpu = pool.request()
    templates = {"intolerant": gpu,
                 "any-effect": objects.tolerating(gpu, objects.device_toleration(MAINTENANCE, operator="Exists"))}
    _run_one_pod_per_request(k8s, ns, pool, templates)

    with checks.PodHistory(k8s, ns) as history:
        rule = cluster_objects.device_taint_rule(faults.taint_rule(unique_name("rule"), "NoExecute",
                                                                   driver=pool.driver, pool=pool.pool))
        condition = history.evicted_by_taint_manager("intolerant")
        assert (condition.reason, condition.message) == EVICTION
        # Completed only once no pod the rule affects is left to evict: its count is then final.
        done = checks.rule_condition(k8s, rule.metadata.name, "Completed", timeout=60)
        evicted = history.first("any-effect", checks.is_evicted)
        if done.message != "1 pod evicted since starting the controller." or evicted is not None:
            raise TolerationIgnored(
                f"DeviceTaintRule {rule.metadata.name} (NoExecute): {done.message!r}; pod any-effect, whose claim "
                f"tolerates {MAINTENANCE} with operator Exists and no effect, "
                + (f"was evicted: {evicted[1].status.conditions}" if evicted else "was counted for eviction"))
        checks.untouched(k8s, history, ns, "any-effect")

def _published_in_pool(k8s, driver: str, pool: str) -> int:
    """How many devices the newest generation of a pool publishes."""
    slices = [s for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items
              if s.spec.pool.name == pool]
    newest = max(s.spec.pool.generation for s in slices)
    return sum(len(s.spec.devices or []) for s in slices if s.spec.pool.generation == newest)


def _selected(published: int, allocated: int, pods: int) -> str:
    """The eviction controller's NoEffect message for these counts."""
    def plural(n: int, word: str) -> str:
        return f"{n} {word}" + ("" if n == 1 else "s")
    where = "1 namespace" if pods == 1 else f"{pods} different namespaces"
    return (f"{plural(published, 'published device')} selected. {plural(allocated, 'allocated device')} selected. "
            f"{plural(pods, 'pod')} would be evicted in {where} ")


@DEVICE_TAINTS
@DEVICE_TAINT_RULES
def test_rule_with_effect_none_is_visible_and_changes_nothing(k8s, dra_namespace, cluster_objects, unique_name,
                                                              devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(2)
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one"))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("running", "one")))
    checks.running(k8s, ns, "running", timeout=90)
    _, taken = _device(k8s, ns, "running")

    with checks.PodHistory(k8s, ns) as history:
        rule = cluster_objects.device_taint_rule(faults.taint_rule(unique_name("rule"), "None", driver=pool.driver,
                                                                   pool=pool.pool))
        taint = k8s.resource.read_device_taint_rule(rule.metadata.name).spec.taint
        assert (taint.key, taint.value, taint.effect) == (MAINTENANCE, "true", "None")
        assert taint.time_added is not None
        # The controller has seen the rule, the devices and the pod, and says what NoExecute would do.
        condition = checks.rule_condition(k8s, rule.metadata.name, "NoEffect")
        published = _published_in_pool(k8s, pool.driver, pool.pool)
        assert (condition.status, condition.message) == ("False", _selected(published, 1, 1) + NOT_UPDATED_AGAIN)

        # New allocations still happen on the tainted devices, and nothing is evicted.
        k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("newcomer", "one")))
        checks.running(k8s, ns, "newcomer", timeout=90)
        (other,) = set(pool.names) - {taken}
        assert _device(k8s, ns, "newcomer") == (pool.pool, other)
        checks.untouched(k8s, history, ns, "running")


@DEVICE_TAINTS
@DEVICE_TAINT_RULES
def test_rule_selects_a_device_of_the_driver_under_test(k8s, dra_namespace, cluster_objects, unique_name,
                                                        devices_under_test):
    """NoSchedule on one device (driver, pool, device) keeps exactly that device from new allocations;
    rules with effect None count what each selector matches; deleting the rule lets the waiting pod in."""
    ns = dra_namespace
    pool = devices_under_test(2)
    tainted, spare = pool.devices
    maintenance = cluster_objects.device_taint_rule(
        faults.taint_rule(unique_name("rule"), "NoSchedule", driver=pool.driver, pool=tainted.pool, device=tainted.name))
    condition = checks.rule_condition(k8s, maintenance.metadata.name, "OtherEffect")
    assert (condition.status, condition.message) == ("False", "Eviction only happens for the NoExecute effect.")

    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("both", count=2))
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("spare", devices=(spare,)))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("both", "both")))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("spare", "spare")))
    checks.unschedulable(k8s, ns, "both")  # one of its two devices is tainted ...
    checks.running(k8s, ns, "spare", timeout=90)  # ... not the other one
    assert checks.allocated_devices(checks.pod_claim(k8s, ns, "spare")) == [("gpu", spare.pool, spare.name)]

    published = _published_in_pool(k8s, pool.driver, pool.pool)
    matched = (
        ({"driver": pool.driver, "pool": pool.pool}, _selected(published, 1, 1)),
        ({"driver": pool.driver, "pool": pool.pool, "device": tainted.name}, _selected(1, 0, 0)),
        ({"driver": pool.driver, "pool": pool.pool, "device": spare.name}, _selected(1, 1, 1)),
        ({"driver": pool.driver, "pool": unique_name("no-such-pool")}, _selected(0, 0, 0)),
    )
    for i, (selector, message) in enumerate(matched):
        rule = cluster_objects.device_taint_rule(faults.taint_rule(unique_name(f"look-{i}"), "None", **selector))
        condition = checks.rule_condition(k8s, rule.metadata.name, "NoEffect")
        assert condition.message == message + NOT_UPDATED_AGAIN, selector
    # NoExecute selecting no device: nothing to do, and the condition says so.
    idle = cluster_objects.device_taint_rule(
        faults.taint_rule(unique_name("idle"), "NoExecute", driver=pool.driver, pool=unique_name("no-such-pool")))
    condition = checks.rule_condition(k8s, idle.metadata.name, "NotStarted")
    assert (condition.status, condition.message) == ("False", "")

    # Removing the taint (and the pod on the spare device) lets the waiting pod in.
    k8s.core.delete_namespaced_pod("spare", ns)
    k8s.resource.delete_device_taint_rule(maintenance.metadata.name)
    checks.running(k8s, ns, "both", timeout=90)
    assert sorted(checks.allocated_devices(checks.pod_claim(k8s, ns, "both"))) == sorted(
        ("gpu", d.pool, d.name) for d in pool.devices)


@DEVICE_TAINTS
@DEVICE_TAINT_RULES
def test_rule_tells_pools_and_drivers_apart(k8s, dra_namespace, cluster_objects, unique_name,
                                                        simulated_nodes):
    ns = dra_namespace
    if len(simulated_nodes) < 2:  # selecting by pool needs a same-named device in a second pool (node)
        pytest.skip(f"needs two simulated nodes to tell pools apart; the cluster has {len(simulated_nodes)}")
    n0, n1 = simulated_nodes[:2]
    first, first_class = _own_devices(cluster_objects, unique_name, [n0, n1], 2, tag="sel-a")
    other, other_class = _own_devices(cluster_objects, unique_name, [n0], 2, tag="sel-b")
    maintenance = cluster_objects.device_taint_rule(
        faults.taint_rule(unique_name("rule"), "NoSchedule", driver=first, pool=n0, device="gpu-0"))
    condition = checks.rule_condition(k8s, maintenance.metadata.name, "OtherEffect")
    assert (condition.status, condition.message) == ("False", "Eviction only happens for the NoExecute effect.")

    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("two", first_class, count=2))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("two-other", other_class,
                                                                                      count=2))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("first-n0", "two", _on_node(n0)))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("first-n1", "two", _on_node(n1)))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("other-n0", "two-other", _on_node(n0)))
    checks.unschedulable(k8s, ns, "first-n0")  # gpu-0 of pool n0 of the first driver is tainted ...
    for pod, pool in (("first-n1", n1), ("other-n0", n0)):  # ... not the same name in another pool or driver
        checks.running(k8s, ns, pod)
        assert sorted(checks.allocated_devices(checks.pod_claim(k8s, ns, pod))) == [
            ("gpu", pool, "gpu-0"), ("gpu", pool, "gpu-1")]

    # What each selector matches, as counted by the eviction controller for rules with effect None.
    matched = (
        ({"driver": first}, "4 published devices selected. 2 allocated devices selected. "
                            "1 pod would be evicted in 1 namespace "),
        ({"driver": first, "pool": n0}, "2 published devices selected. 0 allocated devices selected. "
                                        "0 pods would be evicted in 0 different namespaces "),
        ({"driver": first, "pool": n0, "device": "gpu-1"}, "1 published device selected. 0 allocated devices "
                                                           "selected. 0 pods would be evicted in 0 different namespaces "),
        ({"driver": other, "device": "gpu-0"}, "1 published device selected. 1 allocated device selected. "
                                               "1 pod would be evicted in 1 namespace "),
        ({"driver": other, "pool": n1}, "0 published devices selected. 0 allocated devices selected. "
                                        "0 pods would be evicted in 0 different namespaces "),
    )
    for i, (selector, message) in enumerate(matched):
        rule = cluster_objects.device_taint_rule(faults.taint_rule(unique_name(f"look-{i}"), "None", **selector))
        condition = checks.rule_condition(k8s, rule.metadata.name, "NoEffect")
        assert condition.message == message + NOT_UPDATED_AGAIN, selector
    # NoExecute selecting no device: nothing to do, and the condition says so.
    idle = cluster_objects.device_taint_rule(
        faults.taint_rule(unique_name("idle"), "NoExecute", driver=other, pool=n1))
    condition = checks.rule_condition(k8s, idle.metadata.name, "NotStarted")
    assert (condition.status, condition.message) == ("False", "")

    # Removing the taint lets the waiting pod in.
    k8s.resource.delete_device_taint_rule(maintenance.metadata.name)
    checks.running(k8s, ns, "first-n0")
    assert sorted(checks.allocated_devices(checks.pod_claim(k8s, ns, "first-n0"))) == [
        ("gpu", n0, "gpu-0"), ("gpu", n0, "gpu-1")]

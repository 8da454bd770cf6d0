"""Health monitors that isolate devices with DeviceTaintRules (KEP-5055, resource.k8s.io/v1, GA in 1.37).

The 1.37 release asks SREs to "incorporate DeviceTaintRule definitions into automated node health
monitors to isolate degraded accelerator units safely". These tests judge such a monitor black-box
(conformance/health_monitors.py): make a device degraded or failed through the monitor's source,
then expect, within DEADLINE seconds, exactly one rule of the monitor, selecting exactly that device
(no other device touched), with effect NoSchedule (degraded: running pods stay, no new allocations)
or NoExecute (failed: its pods are evicted, a tolerating pod after its tolerationSeconds); after
recovery the rule goes and the device is allocatable again.

The monitor under test is the reference one (fake_devices/healthmonitor.py, its own process) fed by
the fake driver's faults; the driver runs with the `no-fault-taints` variant, so no taint comes from
the slices and every effect seen is the monitor's doing. On the real node, the same monitor fed only
by the kubelet plugin's DRAResourceHealth stream is judged the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from conformance import checks, objects
from conformance.conftest import OWN_FAKE_DRIVER
from conformance.health_monitors import (
    DEGRADED,
    FAILED,
    CommandMonitor,
    ReferenceMonitor,
    Target,
    describe_rules,
    rules_of,
    selected,
)
from conformance.under_test import DevicePool
from fake_devices import faults
from fake_devices.controller import FakeDriver
from fake_devices.healthmonitor import MONITOR_LABEL
from harness.k8s import wait
from harness.pytest_plugin.plugin import vendor_driver

pytestmark = [pytest.mark.dra_feature("DRADeviceTaintRules", maturity="ga")]

DEADLINE = 30  # seconds from a fault (or a recovery) to the monitor's rule (or its removal)
TOLERATION_SECONDS = 5
EVICTION = ("DeletionByDeviceTaintManager", "Device Taint manager: deleting due to NoExecute taint")


@dataclass
class HealthSetup:
    """The monitor under test and two free devices of the driver it watches (`pool`)."""

    monitor: ReferenceMonitor | CommandMonitor
    pool: DevicePool

    @property
    def fake(self) -> FakeDriver | None:
        return self.pool.fake

    @property
    def node(self) -> str:
        return self.pool.node

    def target(self, device: str) -> Target:
        return Target(self.pool.node, self.pool.driver, self.pool.pool, device)

    def other(self, device: str) -> str:
        first, second = self.pool.names[:2]
        return second if device == first else first

    def template(self, name: str, request: dict | None = None) -> dict:
        """A claim template of one device among the two (or of `request`, one of `self.pool.request`)."""
        return objects.claim_template(name, requests=[request or self.pool.request()])

    def pod(self, name: str, template: str) -> dict:
        return self.pool.pod(objects.pod_with_template_claim(name, template))


def _stop_and_check_clean(k8s, monitor: ReferenceMonitor) -> None:
    code = monitor.stop()
    leftover = rules_of(k8s, monitor)
    for rule in leftover:  # never leak, even when the monitor failed to clean up
        wait.ignore_not_found(k8s.resource.delete_device_taint_rule, rule.metadata.name)
    assert code == 0 and not leftover, (f"health monitor exit code {code}, rules left behind: "
                                        f"{describe_rules(leftover)}\n{monitor.tail()}")


def _recovered_clean(k8s, setup: HealthSetup) -> None:
    """A vendor's monitor (not ours to stop or to clean up after): both devices made healthy again, and
    its rules gone within DEADLINE, or a failure naming the rules it left."""
    monitor = setup.monitor
    for device in setup.pool.names:
        monitor.recover(setup.target(device))
    try:
        released(k8s, monitor)
    except wait.WaitTimeout:
        pytest.fail(f"health monitor {monitor.name} (driver {setup.pool.driver}, node {setup.node}) kept its rules "
                    f"{DEADLINE} s after both devices recovered: {describe_rules(rules_of(k8s, monitor))}\n"
                    f"{monitor.tail()}", pytrace=False)


@pytest.fixture
def health(request, k8s, dra_cluster, devices_under_test, tmp_path, unique_name):
    """Two free devices of the driver under test and the monitor under test: the reference monitor over
    the fake driver (faults not published as taints) on a simulated node, or the vendor's monitor of its
    driver, reached through the vendor file's spec.healthMonitor commands."""
    vendor = vendor_driver(request.config)
    if vendor is not None and vendor.health_monitor is None and vendor.run_fake_driver_tests:
        # the fake driver's file (kind): its own kit's monitor, the reference one, over an instance of this
        # test's own on a simulated node, as without a vendor file
        request.node.stash[OWN_FAKE_DRIVER] = True
        vendor = None
    if vendor is not None:
        if vendor.health_monitor is None:
            pytest.skip(f"the vendor file {vendor.source} names no spec.healthMonitor (the label selector of the "
                        "DeviceTaintRules your monitor owns and the commands that make a device unhealthy and "
                        "healthy again): the harness cannot reach your monitor")
        setup = HealthSetup(CommandMonitor(vendor.health_monitor), devices_under_test(2))
        if rules_of(k8s, setup.monitor):  # each test counts the monitor's rules: it must start with none
            pytest.skip(f"health monitor {setup.monitor.name} already isolates devices "
                        f"({describe_rules(rules_of(k8s, setup.monitor))}); these tests need it to own no rule "
                        "when they start")
        try:
            yield setup
        finally:
            _recovered_clean(k8s, setup)
        return
    pool = devices_under_test(2, variant="no-fault-taints")  # tiny: gpu-0, gpu-1
    monitor = ReferenceMonitor(unique_name("hm"), dra_cluster.kubeconfig, pool.fake, tmp_path).start()
    try:
        yield HealthSetup(monitor, pool)
    finally:
        _stop_and_check_clean(k8s, monitor)


def isolated(k8s, monitor, target: Target, effect: str, timeout: float = DEADLINE):
    """Wait until the monitor owns exactly one rule, selecting exactly `target`, with `effect`; fail
    at once if it taints anything else."""
    def check():
        rules = rules_of(k8s, monitor)
        strays = [r for r in rules if selected(r) != target.selector]
        assert not strays, f"the monitor tainted other devices too: {describe_rules(strays)}"
        return rules[0] if len(rules) == 1 and rules[0].spec.taint.effect == effect else None

    return wait.until(f"a DeviceTaintRule of monitor {monitor.name} isolating {'/'.join(target.selector)} with "
                      f"effect {effect}", check, timeout,
                      diagnostics=lambda: f"rules now: {describe_rules(rules_of(k8s, monitor))}\n{monitor.tail()}")


def released(k8s, monitor, timeout: float = DEADLINE) -> None:
    wait.until(f"monitor {monitor.name} to delete its rules after recovery", lambda: not rules_of(k8s, monitor),
               timeout, diagnostics=lambda: f"rules now: {describe_rules(rules_of(k8s, monitor))}\n{monitor.tail()}")


def _device(k8s, ns: str, pod: str) -> str:
    ((_, _, device),) = checks.allocated_devices(checks.pod_claim(k8s, ns, pod))
    return device


def _no_slice_taints(k8s, setup: HealthSetup) -> None:
    """Control (the fake driver, no-fault-taints): the driver publishes no taint, so whatever isolates a
    device is the monitor's rule. A vendor's driver may taint its devices too: not checked."""
    if setup.fake is not None:
        for device in setup.pool.names:
            assert checks.device_taints(k8s, setup.pool.driver, setup.pool.pool, device) == []


def test_failed_device_gets_a_no_execute_rule_that_evicts_only_its_pod(k8s, dra_namespace, health):
    ns = dra_namespace
    k8s.resource.create_namespaced_resource_claim_template(ns, health.template("any-gpu"))
    for pod in ("victim", "bystander"):
        k8s.core.create_namespaced_pod(ns, health.pod(pod, "any-gpu"))
        checks.running(k8s, ns, pod)
    target = health.target(_device(k8s, ns, "victim"))

    with checks.PodHistory(k8s, ns) as history:
        health.monitor.inject(target, FAILED)
        rule = isolated(k8s, health.monitor, target, "NoExecute")
        assert rule.spec.taint.key and rule.spec.taint.time_added is not None
        condition = history.evicted_by_taint_manager("victim", timeout=DEADLINE)
        assert (condition.reason, condition.message) == EVICTION
        history.gone("victim")
        checks.untouched(k8s, history, ns, "bystander")
    _no_slice_taints(k8s, health)

    # While the rule stands the device takes no new pod; recovery deletes the rule and gives it back.
    # The pod that waited leaves before recovery and a new one asks once the eviction controller has seen
    # the rule go: a pod let in the moment the rule is deleted can be evicted by the controller's stale
    # cache (upstream race, checks.taint_eviction_caught_up), which would say nothing about the monitor.
    k8s.core.create_namespaced_pod(ns, health.pod("waiting", "any-gpu"))
    checks.unschedulable(k8s, ns, "waiting")
    k8s.core.delete_namespaced_pod("waiting", ns)
    checks.pod_gone(k8s, ns, "waiting")
    health.monitor.recover(target)
    released(k8s, health.monitor)
    checks.taint_eviction_caught_up(k8s, ns)
    k8s.core.create_namespaced_pod(ns, health.pod("after", "any-gpu"))
    checks.running(k8s, ns, "after")
    assert _device(k8s, ns, "after") == target.device


def test_degraded_device_gets_a_no_schedule_rule_and_its_pod_keeps_running(k8s, dra_namespace, health):
    ns = dra_namespace
    k8s.resource.create_namespaced_resource_claim_template(ns, health.template("any-gpu"))
    k8s.core.create_namespaced_pod(ns, health.pod("resident", "any-gpu"))
    checks.running(k8s, ns, "resident")
    target = health.target(_device(k8s, ns, "resident"))
    other = health.other(target.device)

    with checks.PodHistory(k8s, ns) as history:
        health.monitor.inject(target, DEGRADED)
        rule = isolated(k8s, health.monitor, target, "NoSchedule")
        # The eviction controller has seen the rule and leaves NoSchedule alone.
        condition = checks.rule_condition(k8s, rule.metadata.name, "OtherEffect")
        assert condition.message == "Eviction only happens for the NoExecute effect."
        # No new allocation on the degraded device: the next pod gets the other one, a third waits.
        k8s.core.create_namespaced_pod(ns, health.pod("newcomer", "any-gpu"))
        checks.running(k8s, ns, "newcomer")
        assert _device(k8s, ns, "newcomer") == other
        k8s.core.create_namespaced_pod(ns, health.pod("third", "any-gpu"))
        assert "cannot allocate all claims" in checks.unschedulable(k8s, ns, "third").message
        checks.untouched(k8s, history, ns, "resident")
    _no_slice_taints(k8s, health)

    # The resident leaves: its device is free but still degraded, so the third pod keeps waiting ...
    k8s.core.delete_namespaced_pod("resident", ns)
    checks.pod_gone(k8s, ns, "resident")
    checks.scheduler_caught_up(k8s, ns)
    assert checks.pod_claim(k8s, ns, "third").status.allocation is None
    # ... until the device recovers.
    health.monitor.recover(target)
    released(k8s, health.monitor)
    checks.running(k8s, ns, "third")
    assert _device(k8s, ns, "third") == target.device


def test_escalation_to_failed_evicts_a_tolerating_pod_after_its_toleration_seconds(k8s, dra_namespace, health):
    ns = dra_namespace
    seconds = TOLERATION_SECONDS
    # Tolerates any NoExecute taint for a while: whatever key the monitor uses.
    patient = objects.tolerating(health.pool.request(),
                                 {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds})
    k8s.resource.create_namespaced_resource_claim_template(ns, health.template("patient", patient))
    k8s.core.create_namespaced_pod(ns, health.pod("patient", "patient"))
    checks.running(k8s, ns, "patient")
    target = health.target(_device(k8s, ns, "patient"))

    with checks.PodHistory(k8s, ns) as history:
        health.monitor.inject(target, DEGRADED)
        isolated(k8s, health.monitor, target, "NoSchedule")
        injected = time.monotonic()
        health.monitor.inject(target, FAILED)
        failed = isolated(k8s, health.monitor, target, "NoExecute")  # still one rule for the device
        added = failed.spec.taint.time_added
        evicted_at, _ = history.eviction("patient", timeout=DEADLINE + seconds + 10)
        condition = history.evicted_by_taint_manager("patient")
        assert (condition.reason, condition.message) == EVICTION
        # Not before tolerationSeconds after the NoExecute taint was added (server clock, whole seconds) ...
        assert (condition.last_transition_time - added).total_seconds() >= seconds, (added, condition)
        # ... and promptly after it.
        assert evicted_at - injected <= DEADLINE + seconds + 10, f"evicted {evicted_at - injected:.1f}s after the fault"
    health.monitor.recover(target)
    released(k8s, health.monitor)


def test_monitor_touches_only_its_own_rules_and_removes_them_on_exit(k8s, dra_namespace, health, cluster_objects,
                                                                     unique_name):
    if health.fake is None:
        pytest.skip("needs a monitor the harness runs (to stop it and see it remove its rules) and the reference "
                    "monitor's label for a peer's rules; the harness does not run your monitor")
    first, second = health.pool.names[:2]
    monitor, target = health.monitor, health.target(first)
    # Rules the monitor does not own: an admin's, and one labelled for another monitor of the same kind.
    foreign = [
        cluster_objects.device_taint_rule(faults.taint_rule(unique_name("admin"), "None", driver=health.pool.driver,
                                                            pool=health.pool.pool, device=second)),
        cluster_objects.device_taint_rule({**faults.taint_rule(unique_name("peer"), "None",
                                                               driver=health.pool.driver, pool=health.pool.pool,
                                                               device=first),
                                           "metadata": {"name": unique_name("peer"),
                                                        "labels": {MONITOR_LABEL: unique_name("other-hm")}}}),
    ]
    def as_set(rule):  # what the owner wrote (the eviction controller updates the status: not compared)
        return (rule.metadata.generation, rule.metadata.labels, rule.metadata.deletion_timestamp,
                describe_rules([rule]))

    versions = {r.metadata.name: as_set(r) for r in foreign}

    monitor.inject(target, FAILED)
    isolated(k8s, monitor, target, "NoExecute")
    monitor.inject(health.target(second), DEGRADED)  # a change: the monitor reconciles again
    wait.until(f"the monitor to isolate {second} too", lambda: len(rules_of(k8s, monitor)) == 2, DEADLINE,
               diagnostics=lambda: f"rules now: {describe_rules(rules_of(k8s, monitor))}\n{monitor.tail()}")
    assert sorted(selected(r) for r in rules_of(k8s, monitor)) == [target.selector, health.target(second).selector]

    assert monitor.stop() == 0, monitor.tail()
    assert rules_of(k8s, monitor) == [], "rules left behind by a cleanly stopped monitor"
    for name, version in versions.items():  # never changed, never deleted
        assert as_set(k8s.resource.read_device_taint_rule(name)) == version, name


# --- the kubelet plugin's DRAResourceHealth stream as the source -----------------------------------

@pytest.mark.needs_kubelet
@pytest.mark.fake_devices
@pytest.mark.dra_feature("ResourceHealthStatus", maturity="beta")
def test_plugin_health_stream_drives_the_rule(request, k8s, dra_cluster, dra_namespace, real_node, fake_driver,
                                              unique_name, tmp_path):
    ns = dra_namespace
    fake = fake_driver({real_node.name: "tiny"}, variant="no-fault-taints")
    gpu = fake.drivers.gpu
    socket = real_node.plugin_socket(gpu)
    if socket is None:  # the monitor runs here and dials the plugin's socket
        pytest.skip(f"the plugin's DRA socket on node {real_node.name} cannot be reached from this machine (kind: it "
                    "is inside the node's container)")
    real_node.run_for(fake)
    # Only the stream: the monitor does not read the fault ConfigMap, the plugin turns it into health.
    monitor = ReferenceMonitor(unique_name("hm"), dra_cluster.kubeconfig, fake, tmp_path,
                               health_sockets={gpu: socket}, use_faults=False).start()
    try:
        target = Target(real_node.name, gpu, real_node.name, "gpu-1")
        assert rules_of(k8s, monitor) == []
        faults.set_fault(k8s.core, ns, fake.config.faults_configmap, real_node.name, "gpu-1", "degraded")
        failed_seen = faults.set_fault(k8s.core, ns, fake.config.faults_configmap, real_node.name, "gpu-0", "unhealthy")
        assert failed_seen == {"gpu-0": "unhealthy", "gpu-1": "degraded"}
        # The stream says UNHEALTHY only for gpu-0 (degraded devices still work: HEALTHY there).
        isolated(k8s, monitor, Target(real_node.name, gpu, real_node.name, "gpu-0"), "NoExecute")
        faults.set_fault(k8s.core, ns, fake.config.faults_configmap, real_node.name, "gpu-0", None)
        faults.set_fault(k8s.core, ns, fake.config.faults_configmap, real_node.name, target.device, None)
        released(k8s, monitor)
    finally:
        _stop_and_check_clean(k8s, monitor)

"""The node half of DRA across disruptions on a real node (upstream test/e2e/dra "kubelet" areas):
the kubelet restarted while claims are prepared, and a kubelet plugin upgraded with two instances
registered at once.

Kubelet restart: the kubelet keeps its own checkpoint of prepared claims and the plugin keeps
its own; after a restart the pod keeps running (same container, no restart), the claim stays
prepared (CDI spec in place, the new kubelet counts it), and deleting the pod still reaches the
plugin's NodeUnprepareResources.

Plugin upgrade: the kubelet's rolling-update support. A second instance registers under its own
socket names while the first still serves; the v1.37.2 kubelet keeps both registrations of the
driver and sends new calls to the newest connected one (k8s.io/kubernetes@v1.37.2
pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, DRAPluginManager.get: "Heuristic: pick the most
recent one ... Prefer plugins which are connected"; `add` refuses a second registration of the
same endpoint, hence distinct socket names). When the old instance deregisters, the new one is
the only one left. A bounded stream of pods is prepared throughout; none may fail.
"""

from __future__ import annotations

import threading
import time

import pytest

from conformance import checks, objects
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = [pytest.mark.needs_kubelet, pytest.mark.fake_devices,
              pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

FAILED_PREPARE = "FailedPrepareDynamicResources"  # the kubelet's event reason (pkg/kubelet/events)
NEW = "v2"  # rolling-update id of the upgraded instance
STREAM_LIMIT = 20  # the stream of pods prepared during the upgrade never exceeds this


@pytest.fixture
def node_driver(k8s: Clients, real_node, fake_driver, dra_namespace):
    """The fake driver publishing `tiny` (two GPUs) on the real node, its kubelet plugins running there."""
    fake = fake_driver({real_node.name: "tiny"})
    real_node.run_for(fake)
    k8s.resource.create_namespaced_resource_claim_template(
        dra_namespace, objects.claim_template("one-gpu", f"{fake.config.instance}-gpu"))
    return fake


def _start_prepared(k8s: Clients, namespace: str, node: str, pod: str):
    """A shell pod with a claim from `one-gpu`; its claim once the container printed its environment
    (so the claim was prepared and injected)."""
    k8s.core.create_namespaced_pod(namespace, objects.shell_pod(pod, node, "one-gpu"))
    checks.printed_env(k8s, namespace, pod, timeout=90)
    return checks.pod_claim(k8s, namespace, pod)


def _delete_and_wait(k8s: Clients, namespace: str, pod: str, timeout: float = 90) -> None:
    k8s.core.delete_namespaced_pod(pod, namespace)
    wait.until(f"pod {pod} to be gone (the kubelet confirms only after unprepare)",
               lambda: pod not in {p.metadata.name for p in k8s.core.list_namespaced_pod(namespace).items},
               timeout, diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def _failed_prepares(k8s: Clients, namespace: str) -> list[str]:
    return [f"{e.involved_object.name}: {e.message}" for e in k8s.core.list_namespaced_event(namespace).items
            if e.reason == FAILED_PREPARE]


class LogFrom:
    """A plugin's log from now on (it goes on across restarts)."""

    def __init__(self, real_node, driver: str, rolling_update_id: str | None = None):
        self.read = lambda: real_node.log_text(driver, rolling_update_id)
        self.where = f"the log of {driver}{' (' + rolling_update_id + ')' if rolling_update_id else ''} on " \
                     f"{real_node.name}"
        self.offset = len(self.read())

    def text(self) -> str:
        return self.read()[self.offset:]

    def wait_for(self, what: str, needle: str, timeout: float = 60) -> None:
        wait.until(f"{what} (`{needle}` in {self.where})", lambda: needle in self.text(), timeout,
                   diagnostics=lambda: "log since then:\n" + self.text()[-3000:])


def _claim_line(claim, verb: str) -> str:
    return f"{verb} claim {claim.metadata.namespace}/{claim.metadata.name} ({claim.metadata.uid})"


@pytest.mark.disrupts_node
def test_kubelet_restart_keeps_prepared_claims_and_unprepare_still_works(k8s: Clients, dra_namespace, real_node,
                                                                        node_driver):
    ns, driver = dra_namespace, node_driver.drivers.gpu
    claim = _start_prepared(k8s, ns, real_node.name, "steady")
    before = k8s.core.read_namespaced_pod("steady", ns).status.container_statuses[0]
    specs = real_node.cdi_specs(driver)
    assert len(specs) == 1 and claim.metadata.uid in specs[0].name
    plugin_log = LogFrom(real_node, driver)

    kubelet_state = real_node.kubelet_root / "dra_manager_state"  # the kubelet's DRA checkpoint, on the node
    assert checks.kubelet_dra_metrics(k8s, real_node.name, driver)["in_use"] == 1
    assert claim.metadata.uid in real_node.read(kubelet_state)

    real_node.restart_kubelet()  # returns once the new kubelet's healthz answers; never leaves the node without one

    # The new kubelet read the claim back from its checkpoint. (It does not count it in
    # dra_resource_claims_in_use: v1.37.2 restores claims with prepared=false, claiminfo.go
    # newClaimInfoFromState, and does not prepare a running pod's claims again; so that metric is
    # not a test of this.)
    assert claim.metadata.uid in real_node.read(kubelet_state)
    # The container was neither restarted nor replaced, and the CDI spec is still there.
    now = k8s.core.read_namespaced_pod("steady", ns)
    status = now.status.container_statuses[0]
    assert now.status.phase == "Running" and status.restart_count == 0 and status.state.running
    assert status.container_id == before.container_id
    checks.still_running(k8s, ns, "steady")
    assert real_node.cdi_specs(driver) == specs
    still = k8s.resource.read_namespaced_resource_claim(claim.metadata.name, ns)
    assert [r.uid for r in still.status.reserved_for] == [now.metadata.uid]

    # Unprepare still works: the pod's deletion reaches the plugin, which removes the CDI spec.
    _delete_and_wait(k8s, ns, "steady")
    plugin_log.wait_for("the plugin to unprepare the claim", _claim_line(claim, "unprepared"), 30)
    assert "was not prepared here" not in plugin_log.text()
    assert real_node.cdi_specs(driver) == []
    assert claim.metadata.uid not in real_node.read(kubelet_state)
    assert checks.kubelet_dra_metrics(k8s, real_node.name, driver)["in_use"] == 0
    assert _failed_prepares(k8s, ns) == []


class PodStream:
    """Pods prepared one after another (create, wait until the container printed its environment,
    delete, wait until gone) in a thread, at most `limit`; each pod's claim and whether it ran."""

    def __init__(self, k8s: Clients, namespace: str, node: str, limit: int):
        self.k8s, self.namespace, self.node, self.limit = k8s, namespace, node, limit
        self.done: list[tuple[str, object, float]] = []  # (pod, claim, monotonic time it was created)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pod-stream", daemon=True)

    def __enter__(self) -> "PodStream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    def _run(self) -> None:
        try:
            for i in range(self.limit):
                if self._stop.is_set():
                    return
                pod, created = f"stream-{i}", time.monotonic()
                claim = _start_prepared(self.k8s, self.namespace, self.node, pod)
                _delete_and_wait(self.k8s, self.namespace, pod)
                with self._progress:
                    self.done.append((pod, claim, created))
                    self._progress.notify_all()
        except BaseException as err:  # reported by wait_count / the test
            with self._progress:
                self.error = err
                self._progress.notify_all()

    def wait_count(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._progress:
            while len(self.done) < count:
                if self.error is not None:
                    raise AssertionError(f"a pod of the stream failed: {self.error}") from self.error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise wait.WaitTimeout(f"timed out after {timeout:.0f}s waiting for {count} stream pods to be "
                                           f"prepared and unprepared (done: {[p for p, _, _ in self.done]})\n"
                                           + wait.describe_namespace(self.k8s, self.namespace))
                self._progress.wait(remaining)


def test_plugin_upgrade_with_two_instances_switches_without_failing_a_prepare(k8s: Clients, dra_namespace,
                                                                              real_node, node_driver):
    ns, driver = dra_namespace, node_driver.drivers.gpu
    old_log = LogFrom(real_node, driver)
    new_log = LogFrom(real_node, driver, NEW)
    held = _start_prepared(k8s, ns, real_node.name, "held")  # one GPU, prepared by the old instance
    assert _claim_line(held, "prepared") in old_log.text()
    registry = real_node.plugins_registry

    with PodStream(k8s, ns, real_node.name, STREAM_LIMIT) as stream:  # the other GPU, over and over
        stream.wait_count(1, 120)
        real_node.run_instance(driver, NEW)
        new_log.wait_for("the kubelet to register the new instance", f"registered with the kubelet as {driver}")
        # The kubelet prefers the newest *connected* instance: its health stream shows the connection is up.
        new_log.wait_for("the kubelet to connect to the new instance", "health stream opened")
        assert set(real_node.names(registry, f"{driver}*-reg.sock")) == {f"{driver}-reg.sock",
                                                                         f"{driver}-{NEW}-reg.sock"}
        both_registered = time.monotonic()
        # The kubelet switches: the next prepare goes to the new instance (the newest connected).
        stream.wait_count(len(stream.done) + 2, 180)
        switched = [(pod, claim) for pod, claim, created in stream.done if created > both_registered]
        assert switched, "no stream pod was created after the new instance registered"
        for pod, claim in switched:
            assert _claim_line(claim, "prepared") in new_log.text(), f"{pod} was not prepared by the new instance"
            assert _claim_line(claim, "prepared") not in old_log.text(), f"{pod} was prepared by the old instance"
        # The old instance goes away (SIGTERM: it removes its sockets, the kubelet deregisters it).
        real_node.stop(driver)
        assert set(real_node.names(registry, f"{driver}*-reg.sock")) == {f"{driver}-{NEW}-reg.sock"}
        stream.wait_count(len(stream.done) + 2, 300)  # and the stream goes on, on the new instance alone
    assert stream.error is None, stream.error
    assert _failed_prepares(k8s, ns) == [], "a prepare failed during the upgrade"

    # The claim the old instance prepared is unprepared by the new one (the shared checkpoint).
    _delete_and_wait(k8s, ns, "held")
    new_log.wait_for("the new instance to unprepare the old instance's claim", _claim_line(held, "unprepared"), 30)
    assert "was not prepared here" not in new_log.text()
    assert real_node.cdi_specs(driver) == []
    real_node.stop_instance(driver, NEW)
    assert real_node.names(registry, f"{driver}*-reg.sock") == []
    assert real_node.names(real_node.plugins_dir / driver, "*.sock") == []

"""The fake driver against the real 1.37 apiserver and scheduler: what it publishes is accepted,
allocated with the right geometry, reacts to faults, and survives restarts without a gap."""

from __future__ import annotations

import pytest

from fake_devices import faults, profile, render
from fake_devices.controller import FakeDriver, INSTANCE_LABEL
from fake_devices.plan import content
from harness import wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.integration


def _published(k8s: Clients, driver: FakeDriver) -> dict[str, dict]:
    items = k8s.resource.list_resource_slice(label_selector=f"{INSTANCE_LABEL}={driver.config.instance}").items
    return {i.metadata.name: k8s.api_client.sanitize_for_serialization(i) for i in items}


@pytest.mark.parametrize("profile_name", profile.builtin_names())
def test_every_builtin_profile_is_accepted_and_published_as_rendered(k8s, fake_driver, simulated_node, profile_name):
    driver = fake_driver({simulated_node: profile_name})
    published = _published(k8s, driver)
    expected = render.render_node(profile.load(profile_name), simulated_node, driver.drivers,
                                  node_uid=k8s.core.read_node(simulated_node).metadata.uid,
                                  instance=driver.config.instance)
    expected_by_name = {s["metadata"]["name"]: s for slices in expected.values() for s in slices}
    assert set(published) == set(expected_by_name)
    for name, slice_obj in published.items():
        assert content(slice_obj) == content(expected_by_name[name]), name
        assert slice_obj["spec"]["pool"]["generation"] == 1


def _device_taints(k8s: Clients, driver: FakeDriver, device: str):
    for slice_obj in _published(k8s, driver).values():
        for dev in slice_obj["spec"].get("devices") or []:
            if dev["name"] == device:
                return [(t["key"], t.get("value"), t["effect"]) for t in dev.get("taints") or []]
    return None  # not published


def test_faults_become_taints_and_recovery_clears_them(k8s, fake_driver, simulated_node, dra_namespace):
    driver = fake_driver({simulated_node: "tiny"})
    cm = driver.config.faults_configmap
    for kind, effect in (("warning", "None"), ("degraded", "NoSchedule"), ("unhealthy", "NoExecute")):
        faults.set_fault(k8s.core, dra_namespace, cm, simulated_node, "gpu-1", kind)
        wait.until(f"gpu-1 tainted {effect}", lambda: _device_taints(k8s, driver, "gpu-1") ==
                   [(render.FAULT_TAINT_KEY, kind, effect)], 10)
        assert _device_taints(k8s, driver, "gpu-0") == []  # only the faulty device
    faults.set_fault(k8s.core, dra_namespace, cm, simulated_node, "gpu-1", "lost")
    wait.until("gpu-1 gone from its slice", lambda: _device_taints(k8s, driver, "gpu-1") is None, 10)
    faults.set_fault(k8s.core, dra_namespace, cm, simulated_node, "gpu-1", None)
    wait.until("gpu-1 back and healthy", lambda: _device_taints(k8s, driver, "gpu-1") == [], 10)
    generations = {s["spec"]["pool"]["generation"] for s in _published(k8s, driver).values()
                   if s["spec"]["driver"] == driver.drivers.gpu}
    assert generations == {6}  # generation 1, then one per change: 3 taints, lost, recovered


def test_restarted_driver_rewrites_nothing(k8s, fake_driver, simulated_node):
    first = fake_driver({simulated_node: "a100-mig"})
    before = {n: s["metadata"]["resourceVersion"] for n, s in _published(k8s, first).items()}
    first.stop()  # as if the process died: its slices stay
    second = FakeDriver(first.config, k8s.api_client).start()
    try:
        assert second.wait_idle(60) and not second.errors
        after = {n: s["metadata"]["resourceVersion"] for n, s in _published(k8s, second).items()}
    finally:
        second.stop()
    assert after == before  # same slices, not one write: no moment without devices


def test_profile_change_bumps_the_pool_generation(k8s, fake_driver, simulated_node):
    first = fake_driver({simulated_node: "tiny"})
    first.stop()
    config = first.config.__class__(**{**first.config.__dict__, "nodes": {simulated_node: "dgx-h100"},
                                       "profiles": {"dgx-h100": profile.load("dgx-h100")}})
    second = FakeDriver(config, k8s.api_client).start()
    try:
        assert second.wait_idle(60) and not second.errors
        gpu = [s for s in _published(k8s, second).values() if s["spec"]["driver"] == second.drivers.gpu]
        assert [s["spec"]["pool"]["generation"] for s in gpu] == [2]
        assert len(gpu[0]["spec"]["devices"]) == 8
    finally:
        second.stop(delete_slices=True)


def test_deleted_node_loses_its_slices(k8s, fake_driver, unique_name):
    from harness.backends.local import nodes
    from harness.progress import Reporter

    name = unique_name("gone")
    nodes.create(k8s.core, [nodes.NodeSpec(name, labels={"dra-harness.x-k8s.io/ephemeral": "true"})],
                 Reporter(quiet=True))
    try:
        driver = fake_driver({name: "tiny"})
        assert len(_published(k8s, driver)) == 3
    finally:
        k8s.core.delete_node(name)
    wait.until(f"slices of deleted node {name} to go", lambda: not _published(k8s, driver), 30)

"""FakeDriver.assign(): a fake driver started with explicit nodes is rolled out to one more node, or
withdrawn from one, at run time (the DRA half of the migration rehearsal), against the real apiserver."""

from __future__ import annotations

import pytest

from fake_devices.controller import INSTANCE_LABEL
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.integration


def _pools(k8s: Clients, instance: str, driver: str) -> dict[str, int]:
    """node -> devices of `driver` published there by `instance`."""
    pools: dict[str, int] = {}
    for item in k8s.resource.list_resource_slice(label_selector=f"{INSTANCE_LABEL}={instance}").items:
        if item.spec.driver == driver:
            pools[item.spec.node_name] = pools.get(item.spec.node_name, 0) + len(item.spec.devices or [])
    return pools


def test_assign_adds_and_withdraws_nodes_at_run_time(k8s, fake_driver, simulated_nodes):
    if len(simulated_nodes) < 2:
        pytest.skip("needs two simulated nodes")
    first, second = simulated_nodes[:2]
    driver = fake_driver({first: "tiny"})
    instance, gpu = driver.config.instance, driver.drivers.gpu
    assert _pools(k8s, instance, gpu) == {first: 2}

    driver.assign(second, "tiny")  # rolled out to one more node
    wait.until(f"{gpu} on {second}", lambda: _pools(k8s, instance, gpu) == {first: 2, second: 2}, 30)
    driver.assign(first, None)  # withdrawn from the first: its slices go, the second's stay
    wait.until(f"{gpu} gone from {first}", lambda: _pools(k8s, instance, gpu) == {second: 2}, 30)
    # A node event (here: a label change) does not bring a withdrawn node back.
    k8s.core.patch_node(first, {"metadata": {"labels": {"dra-harness.x-k8s.io/touched": instance}}})
    try:
        assert driver.wait_idle(30)
        assert _pools(k8s, instance, gpu) == {second: 2}
    finally:
        k8s.core.patch_node(first, {"metadata": {"labels": {"dra-harness.x-k8s.io/touched": None}}})

    with pytest.raises(ValueError, match="profile 'dgx-h100' is not loaded"):
        driver.assign(second, "dgx-h100")


def test_assign_needs_explicit_nodes(k8s, simulated_node):
    from fake_devices import config as driver_config
    from fake_devices.controller import FakeDriver

    labelled = FakeDriver(driver_config.build("assign-label", "assign-label.example.com", ["tiny"]), k8s.api_client)
    with pytest.raises(ValueError, match="selects nodes by label"):
        labelled.assign(simulated_node, "tiny")

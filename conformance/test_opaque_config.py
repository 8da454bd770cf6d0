"""Opaque configuration parameters reaching the driver on the node (upstream test/e2e/dra: "supports
claim and class parameters"), on a node run by a real kubelet.

A DeviceClass and a ResourceClaim each carry `config[].opaque {driver, parameters}`. The scheduler
copies both into the allocation (`status.allocation.devices.config`, with `source` FromClass or
FromClaim); the driver applies its own, the class's first, so the claim's settings win. The fake
driver's kubelet plugin hands them to the container through CDI: every config as
`..._CONFIG_<i>` (+ `_SOURCE`), and the settings in force as `..._CONFIG`.
"""

from __future__ import annotations

import json

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.needs_kubelet,
              pytest.mark.fake_devices("a kubelet plugin that shows the opaque config it was given in the container"),
              pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

OTHER_DRIVER = "other.example.com"  # a config for another driver: kept in the claim, never given to ours


def _opaque(driver: str, parameters: dict, requests: list[str] | None = None) -> dict:
    config: dict = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        config["requests"] = requests
    return config


def test_class_and_claim_configs_reach_the_container(k8s, dra_namespace, real_node, fake_driver, cluster_objects,
                                                     unique_name):
    ns = dra_namespace
    fake = fake_driver({real_node.name: "tiny"})
    real_node.run_for(fake)
    gpu = fake.drivers.gpu
    class_params = {"mode": "shared", "setBy": "class", "fromClass": "1"}
    claim_params = {"mode": "exclusive", "setBy": "claim", "fromClaim": "2"}

    device_class = unique_name("cfg")
    body = objects.device_class(device_class, gpu)
    body["spec"]["config"] = [_opaque(gpu, class_params), _opaque(OTHER_DRIVER, {"ignored": True})]
    cluster_objects.device_class(body)
    template = objects.claim_template("configured", device_class)
    template["spec"]["spec"]["devices"]["config"] = [_opaque(gpu, claim_params, requests=["gpu"])]
    k8s.resource.create_namespaced_resource_claim_template(ns, template)
    k8s.core.create_namespaced_pod(ns, objects.shell_pod("configured", real_node.name, "configured"))

    env = checks.printed_env(k8s, ns, "configured", timeout=90)
    claim = checks.pod_claim(k8s, ns, "configured")
    # The scheduler passed on every config, the class's first, with their sources.
    allocated = [(c.source, c.opaque.driver, c.opaque.parameters) for c in claim.status.allocation.devices.config]
    assert allocated == [("FromClass", gpu, class_params), ("FromClass", OTHER_DRIVER, {"ignored": True}),
                         ("FromClaim", gpu, claim_params)], allocated

    (prefix,) = {key[:-len("_CLAIM_UID")] for key in env if key.endswith("_CLAIM_UID")}
    configs = {key[len(prefix) + 1:]: value for key, value in env.items() if key.startswith(f"{prefix}_CONFIG")}
    assert (json.loads(configs.pop("CONFIG_0")), configs.pop("CONFIG_0_SOURCE")) == (class_params, "FromClass")
    assert (json.loads(configs.pop("CONFIG_1")), configs.pop("CONFIG_1_SOURCE")) == (claim_params, "FromClaim")
    # The settings in force: the claim's override the class's, keys only one of them sets are kept.
    assert json.loads(configs.pop("CONFIG")) == {"mode": "exclusive", "setBy": "claim", "fromClass": "1",
                                                 "fromClaim": "2"}
    assert configs == {}, f"configs not meant for driver {gpu}: {configs}"

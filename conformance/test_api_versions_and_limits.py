"""The resource.k8s.io API itself: the older versions v1beta1 and v1beta2 serve the same objects as v1
(upstream test/e2e/dra: API variants), and ResourceSlices and claims at the API's size limits
(upstream: "max-size slices"; limits from k8s.io/api resource/v1 types.go at v0.37.2).

In 1.37 only v1 is served by default; v1beta1 (removal planned in 1.38) and v1beta2 need
--runtime-config (the all-dra preset turns them on). Tests of a version the cluster does not serve are
skipped with that reason. v1beta2 has v1's shape; v1beta1 is older: a device's attributes and capacity
sit under `basic`, and a request's fields are not wrapped in `exactly`.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects
from harness.k8s import api, wait

pytestmark = pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")

# Limits of resource.k8s.io/v1 (ResourceSliceMaxDevices, ResourceSliceMaxDevicesWithAdvancedFeatures,
# ResourceSliceMaxAttributesAndCapacitiesPerDevice, DeviceRequestsMaxSize).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_REQUESTS = 32

OLDER_VERSIONS = [
    pytest.param("v1beta1", api.ResourceV1beta1Api,
                 marks=pytest.mark.requires_api("resource.k8s.io/v1beta1"), id="v1beta1"),
    pytest.param("v1beta2", api.ResourceV1beta2Api,
                 marks=pytest.mark.requires_api("resource.k8s.io/v1beta2"), id="v1beta2"),
]


def _plain(k8s, obj) -> dict:
    return k8s.api_client.sanitize_for_serialization(obj)


def _device_fields(version: str, device: dict) -> dict:
    """A device's attributes and capacity wherever the version keeps them."""
    return device["basic"] if version == "v1beta1" else device


def _request_fields(version: str, request: dict) -> dict:
    """A request's class, selectors, count and mode wherever the version keeps them."""
    return request if version == "v1beta1" else request["exactly"]


def _as_version(version: str, body: dict) -> dict:
    """A v1 ResourceClaim or ResourceSlice manifest written in `version`'s shape."""
    body = {**body, "apiVersion": f"resource.k8s.io/{version}"}
    if version != "v1beta1":
        return body
    spec = dict(body["spec"])
    if body["kind"] == "ResourceSlice":
        spec["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                           for d in spec["devices"]]
    else:
        spec["devices"] = {**spec["devices"], "requests": [{"name": r["name"], **r["exactly"]}
                                                           for r in spec["devices"]["requests"]]}
    return {**body, "spec": spec}


@pytest.mark.parametrize("version, api_class", OLDER_VERSIONS)
def test_older_versions_serve_the_same_objects(request, k8s, dra_namespace, cluster_objects, unique_name,
                                               simulated_node, version, api_class):
    ns, node = dra_namespace, simulated_node
    older = api_class(k8s.api_client)
    driver = unique_name("apiver") + ".example.com"
    device_class = unique_name("apiver")
    cluster_objects.device_class(objects.device_class(device_class, driver))
    gpu = objects.gpu_device("gpu-0", model="round-trip", memory="40Gi")

    # Written as v1, read as the older version.
    cluster_objects.resource_slice(objects.resource_slice(unique_name("v1-slice"), driver, node, [gpu]))
    read = _plain(k8s, older.read_resource_slice(unique_name("v1-slice")))
    (device,) = read["spec"]["devices"]
    assert (device["name"], read["spec"]["driver"], read["spec"]["nodeName"]) == ("gpu-0", driver, node)
    assert _device_fields(version, device)["attributes"] == {"model": {"string": "round-trip"}}
    assert _device_fields(version, device)["capacity"] == {"memory": {"value": "40Gi"}}
    selector = {"cel": {"expression": f'device.attributes["{driver}"].model == "round-trip"'}}
    gpu_request = objects.request(device_class, count=1, selectors=[selector["cel"]["expression"]])
    k8s.resource.create_namespaced_resource_claim(ns, objects.resource_claim("from-v1", [gpu_request]))
    (read_request,) = _plain(k8s, older.read_namespaced_resource_claim("from-v1", ns))["spec"]["devices"]["requests"]
    fields = _request_fields(version, read_request)
    assert (read_request["name"], fields["deviceClassName"], fields["count"], fields["allocationMode"]) == \
        ("gpu", device_class, 1, "ExactCount")
    assert fields["selectors"] == [selector]
    read_class = _plain(k8s, older.read_device_class(device_class))
    assert read_class["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{driver}"'}}]

    # Written in the older version, read as v1.
    body = _as_version(version, objects.resource_slice(unique_name("old-slice"), driver, node,
                                                       [objects.gpu_device("gpu-1", model="written-old")]))
    body["spec"]["pool"]["name"] = f"{node}-old"
    created = older.create_resource_slice(body)
    request.addfinalizer(lambda: wait.ignore_not_found(k8s.resource.delete_resource_slice, created.metadata.name))
    (device,) = k8s.resource.read_resource_slice(created.metadata.name).spec.devices
    assert (device.name, device.attributes["model"].string, device.capacity["memory"].value) == \
        ("gpu-1", "written-old", "80Gi")
    older.create_namespaced_resource_claim(ns, _as_version(version, objects.resource_claim("from-old", [gpu_request])))
    (v1_request,) = k8s.resource.read_namespaced_resource_claim("from-old", ns).spec.devices.requests
    assert (v1_request.name, v1_request.exactly.device_class_name, v1_request.exactly.count) == \
        ("gpu", device_class, 1)
    assert v1_request.exactly.selectors[0].cel.expression == selector["cel"]["expression"]


@pytest.mark.parametrize("version, api_class", OLDER_VERSIONS)
def test_older_versions_show_the_same_allocation(k8s, dra_namespace, devices_under_test, version, api_class):
    """A claim the scheduler allocated (v1) reads the same through the older version, and a label written
    through the older version is there in v1, the allocation untouched."""
    ns = dra_namespace
    older = api_class(k8s.api_client)
    pool = devices_under_test(2)
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("gpu", count=2))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("user", "gpu")))
    checks.running(k8s, ns, "user", timeout=90)
    claim = checks.pod_claim(k8s, ns, "user")
    expected = sorted(checks.allocated_devices(claim))
    assert expected == sorted(("gpu", d.pool, d.name) for d in pool.devices)

    read = _plain(k8s, older.read_namespaced_resource_claim(claim.metadata.name, ns))
    results = read["status"]["allocation"]["devices"]["results"]
    assert sorted((r["request"], r["pool"], r["device"]) for r in results) == expected
    assert {r["driver"] for r in results} == {pool.driver}
    assert [(r["name"], r["uid"]) for r in read["status"]["reservedFor"]] == [("user", checks.running(
        k8s, ns, "user").metadata.uid)]

    older.patch_namespaced_resource_claim(claim.metadata.name, ns, {"metadata": {"labels": {"written-as": version}}})
    again = k8s.resource.read_namespaced_resource_claim(claim.metadata.name, ns)
    assert again.metadata.labels == {"written-as": version}
    assert sorted(checks.allocated_devices(again)) == expected


# --- size limits (dry run: validated in full, nothing stored) -----------------------------------

def _devices(count: int, **extra) -> list[dict]:
    return [{**objects.gpu_device(f"gpu-{i}"), **extra} for i in range(count)]


def _slice(unique_name, node: str, devices: list[dict]) -> dict:
    return objects.resource_slice(unique_name("limits"), unique_name("limits") + ".example.com", node, devices)


def test_slice_holds_at_most_128_devices(k8s, unique_name, simulated_node):
    create = k8s.resource.create_resource_slice
    create(_slice(unique_name, simulated_node, _devices(MAX_DEVICES)), dry_run="All")
    message = checks.rejected(create, _slice(unique_name, simulated_node, _devices(MAX_DEVICES + 1)),
                              dry_run="All")
    assert f"spec.devices: Too many: {MAX_DEVICES + 1}: must have at most {MAX_DEVICES} items" in message, message


@pytest.mark.dra_feature("DRADeviceTaints", maturity="ga")
def test_slice_with_device_taints_holds_at_most_64_devices(k8s, unique_name, simulated_node):
    taint = {"taints": [{"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}]}
    create = k8s.resource.create_resource_slice
    create(_slice(unique_name, simulated_node, _devices(MAX_DEVICES_WITH_TAINTS, **taint)), dry_run="All")
    message = checks.rejected(create, _slice(unique_name, simulated_node,
                                             _devices(MAX_DEVICES_WITH_TAINTS + 1, **taint)), dry_run="All")
    assert f"spec.devices: Too many: {MAX_DEVICES_WITH_TAINTS + 1}: must have at most {MAX_DEVICES_WITH_TAINTS} " \
           "items" in message, message


def _device_with(attributes: int, capacities: int) -> dict:
    return {"name": "wide", "attributes": {f"attr{i}": {"int": i} for i in range(attributes)},
            "capacity": {f"cap{i}": {"value": "1"} for i in range(capacities)}}


def test_device_has_at_most_32_attributes_and_capacities(k8s, unique_name, simulated_node):
    create = k8s.resource.create_resource_slice
    create(_slice(unique_name, simulated_node, [_device_with(24, 8)]), dry_run="All")
    message = checks.rejected(create, _slice(unique_name, simulated_node, [_device_with(24, 9)]),
                              dry_run="All")
    assert (f"spec.devices[0]: Invalid value: {MAX_ATTRIBUTES_AND_CAPACITIES + 1}: the total number of attributes "
            f"and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}") in message, message


def test_claim_has_at_most_32_requests(k8s, dra_namespace):
    def claim(count: int) -> dict:
        return objects.resource_claim("many", [objects.request("any-class", name=f"r{i}") for i in range(count)])

    create = k8s.resource.create_namespaced_resource_claim
    create(dra_namespace, claim(MAX_REQUESTS), dry_run="All")
    message = checks.rejected(create, dra_namespace, claim(MAX_REQUESTS + 1), dry_run="All")
    assert f"spec.devices.requests: Too many: {MAX_REQUESTS + 1}: must have at most {MAX_REQUESTS} items" in message, \
        message

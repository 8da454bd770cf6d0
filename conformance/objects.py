"""Manifests the conformance tests build, as plain dicts (one place, so tests read as behaviour)."""

from __future__ import annotations

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def device_class(name: str, driver: str, extended_resource_name: str | None = None) -> dict:
    spec: dict = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def resource_slice(name: str, driver: str, node: str, devices: list[dict], generation: int = 1,
                   slice_count: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count}}}


def gpu_device(name: str, model: str = "test-gpu", memory: str = "80Gi") -> dict:
    return {"name": name, "attributes": {"model": {"string": model}}, "capacity": {"memory": {"value": memory}}}


def request(device_class_name: str, *, name: str = "gpu", count: int = 1, selectors: list[str] = (),
            capacity: dict[str, str] | None = None) -> dict:
    """One `exactly` device request: class, count, CEL selectors and capacity requests."""
    exactly: dict = {"deviceClassName": device_class_name, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": expression}} for expression in selectors]
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    return {"name": name, "exactly": exactly}


def claim_template(name: str, device_class_name: str | None = None, count: int = 1, *,
                   requests: list[dict] | None = None, constraints: list[dict] | None = None) -> dict:
    devices: dict = {"requests": requests or [request(device_class_name, count=count)]}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": devices}}}


def pod_with_template_claim(name: str, template: str, node_selector: dict | None = None) -> dict:
    spec: dict = {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

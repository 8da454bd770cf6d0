"""Fault injection through the Kubernetes API, so it works on every backend.

A fake-driver instance watches the ConfigMap `<instance>-faults` in its namespace; each key is a
node name, each value lists `device=kind` pairs. The driver reacts as a real one would: `warning`,
`degraded` and `unhealthy` publish a device taint with effect None, NoSchedule and NoExecute
(key `dra-harness.x-k8s.io/fault`, the kind as value); `lost` removes the device from its slice;
clearing the entry (recovery) removes the taint or brings the device back.
"""

from __future__ import annotations

from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from fake_devices.errors import InvalidInput, Problem
from fake_devices.render import FAULT_KINDS


def parse_faults(text: str) -> dict[str, str]:
    result = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        device, _, kind = item.partition("=")
        if kind in FAULT_KINDS:
            result[device] = kind
    return result


def format_faults(faults: dict[str, str]) -> str:
    return ",".join(f"{device}={kind}" for device, kind in sorted(faults.items()))


def set_fault(core: kubernetes.client.CoreV1Api, namespace: str, configmap: str, node: str, device: str,
              kind: str | None) -> dict[str, str]:
    """Inject (`kind`) or clear (None) a device's fault; returns the node's faults afterwards."""
    if kind is not None and kind not in FAULT_KINDS:
        raise InvalidInput([Problem("--kind", kind, "unknown fault kind", ", ".join(FAULT_KINDS))])
    for _ in range(10):  # optimistic concurrency: retry when another writer got there first
        try:
            cm = core.read_namespaced_config_map(configmap, namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            cm = None
        data = dict((cm.data or {}) if cm else {})
        faults = parse_faults(data.get(node, ""))
        if kind is None:
            faults.pop(device, None)
        else:
            faults[device] = kind
        if faults:
            data[node] = format_faults(faults)
        else:
            data.pop(node, None)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": configmap, "namespace": namespace}, "data": data}
        try:
            if cm is None:
                _ensure_namespace(core, namespace)
                core.create_namespaced_config_map(namespace, body)
            else:
                body["metadata"]["resourceVersion"] = cm.metadata.resource_version
                core.replace_namespaced_config_map(configmap, namespace, body)
            return faults
        except ApiException as err:
            if err.status != 409:
                raise
    raise RuntimeError(f"could not update ConfigMap {namespace}/{configmap}: too many concurrent writers")


def _ensure_namespace(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except ApiException as err:
        if err.status != 409:
            raise


def taint_rule(name: str, effect: str, *, driver: str | None = None, pool: str | None = None,
               device: str | None = None, key: str = "dra-harness.x-k8s.io/maintenance", value: str = "true") -> dict:
    """A DeviceTaintRule (resource.k8s.io/v1): the admin's way to taint devices of any driver."""
    selector = {k: v for k, v in (("driver", driver), ("pool", pool), ("device", device)) if v}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": selector, "taint": {"key": key, "value": value, "effect": effect}}}

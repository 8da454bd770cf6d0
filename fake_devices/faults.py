"""Fault injection through the Kubernetes API, so it works on every backend.

A fake-driver instance watches the ConfigMap `<instance>-faults` in its namespace; each key is a
node name, each value lists `device=kind` pairs. The driver reacts as a real one would: `warning`,
`degraded` and `unhealthy` publish a device taint with effect None, NoSchedule and NoExecute
(key `dra-harness.x-k8s.io/fault`, the kind as value); `lost` removes the device from its slice;
clearing the entry (recovery) removes the taint or brings the device back.
"""

from __future__ import annotations

import logging
from typing import Any

from fake_devices import faultkinds, kube
from fake_devices.errors import InvalidInput

log = logging.getLogger("fake_devices.faults")
FAULT_KINDS = faultkinds.NAMES
_warned: set[str] = set()  # each refused entry is logged once per process, not on every watch event


def parse_faults(text: str, where: str = "faults") -> dict[str, str]:
    """One node's entry of the fault ConfigMap -> {device: kind}. An entry the codec refuses (an unknown
    kind, a typo in a hand edit) is left out and logged with where it is, once."""
    faults, problems = faultkinds.decode(text, where)
    for problem in problems:
        if str(problem) not in _warned and len(_warned) < 1000:
            _warned.add(str(problem))
            log.warning("ignoring a fault entry: %s", problem)
    return faults


def format_faults(faults: dict[str, str]) -> str:
    return faultkinds.encode(faults)


def set_fault(core: kube.CoreV1Api, namespace: str, configmap: str, node: str, device: str,
              kind: str | None) -> dict[str, str]:
    """Inject (`kind`) or clear (None) a device's fault; returns the node's faults afterwards."""
    if kind is not None and (problem := faultkinds.problem("--kind", kind)) is not None:
        raise InvalidInput([problem])
    for _ in range(10):  # optimistic concurrency: retry when another writer got there first
        cm = kube.ignore_missing(core.read_namespaced_config_map, configmap, namespace)
        data = dict((cm.data or {}) if cm else {})
        faults = parse_faults(data.get(node, ""), f"ConfigMap {namespace}/{configmap} key {node}")
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
        except kube.Conflict:  # created or changed by another writer meanwhile: read again
            continue
    raise RuntimeError(f"could not update ConfigMap {namespace}/{configmap}: too many concurrent writers")


def _ensure_namespace(core: kube.CoreV1Api, namespace: str) -> None:
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except kube.Conflict:  # it exists
        pass


def taint_rule(name: str, effect: str, *, driver: str | None = None, pool: str | None = None,
               device: str | None = None, key: str = "dra-harness.x-k8s.io/maintenance", value: str = "true") -> dict:
    """A DeviceTaintRule (resource.k8s.io/v1): the admin's way to taint devices of any driver."""
    selector = {k: v for k, v in (("driver", driver), ("pool", pool), ("device", device)) if v}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": selector, "taint": {"key": key, "value": value, "effect": effect}}}

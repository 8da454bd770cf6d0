"""The device plugin's effect on a simulated (KWOK) node: no kubelet runs there, so the extended
resource is advertised the way the kubelet would report it, in the node's status capacity and
allocatable. `withdraw()` reports 0, as the kubelet does for a while after its plugin is gone (and
the 1.37 scheduler then lets a DRA DeviceClass serve the resource there); `remove()` drops the
entries, undoing everything.

KWOK's node heartbeat re-renders status from the node's own capacity and allocatable
(harness/backends/kwok/stages.py), so the patched values stay.
"""

from __future__ import annotations

from fake_devices import kube


def _patch(core: kube.CoreV1Api, node: str, resource: str, value: str | None) -> None:
    body = {"status": {"capacity": {resource: value}, "allocatable": {resource: value}}}
    core.patch_node_status(node, body)  # a JSON merge patch: null removes the key


def advertise(core: kube.CoreV1Api, node: str, resource: str, count: int) -> None:
    _patch(core, node, resource, str(count))


def withdraw(core: kube.CoreV1Api, node: str, resource: str) -> None:
    _patch(core, node, resource, "0")


def remove(core: kube.CoreV1Api, node: str, resource: str) -> None:
    kube.ignore_missing(_patch, core, node, resource, None)  # a node that is gone: nothing left to undo


def allocatable(node, resource: str) -> int | None:
    """The node's allocatable count of `resource` (None: not reported at all)."""
    value = ((node.status.allocatable or {}) if node.status else {}).get(resource)
    return None if value is None else int(value)

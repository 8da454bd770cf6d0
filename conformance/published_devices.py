"""The devices the drivers publish, found among the ResourceSlices: the newest generation of each pool,
the devices claims hold or blocking taints and DeviceTaintRules rule out, the nodes that reach a pool,
and the free devices of each driver on each node."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.k8s import errors
from harness.k8s.client import Clients

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str
    published: dict = field(hash=False, compare=False)  # the device as its slice shows it

    @property
    def path(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


# --- finding the devices ----------------------------------------------------------------------

def _newest_slices(slices: list[dict]) -> list[dict]:
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, 0), s["spec"]["pool"]["generation"])
    return [s for s in slices if s["spec"]["pool"]["generation"] == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]]


def in_use(k8s: Clients) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of every device allocated to a claim of the cluster (admin access aside)."""
    used = set()
    for claim in k8s.resource.list_resource_claim_for_all_namespaces().items:
        allocation = claim.status.allocation if claim.status else None
        for r in (allocation.devices.results or []) if allocation and allocation.devices else []:
            if not r.admin_access:
                used.add((r.driver, r.pool, r.device))
    return used


def blocking_rule_selectors(k8s: Clients) -> list[tuple[str | None, str | None, str | None]]:
    """(driver, pool, device) selectors of the cluster's DeviceTaintRules with a blocking effect (None:
    any), whoever made them: another test's rule not deleted yet, or a health monitor of the cluster."""
    try:
        rules = k8s.resource.list_device_taint_rule().items
    except errors.NotFound:  # the cluster does not serve DeviceTaintRules
        return []
    selectors = []
    for rule in rules:
        chosen = rule.spec.device_selector  # the API: an empty selector matches every device, none matches none
        if chosen is not None and rule.spec.taint and rule.spec.taint.effect in BLOCKING_EFFECTS:
            selectors.append((chosen.driver, chosen.pool, chosen.device))
    return selectors


def _ruled_out(key: tuple[str, str, str], selectors) -> bool:
    return any(all(want is None or want == have for want, have in zip(selector, key)) for selector in selectors)


def free_devices(k8s: Clients, drivers, selected: set[tuple[str, str, str]] | None = None, *,
                 shareable: bool = False) -> dict[tuple[str, str], list[Device]]:
    """{(driver, node): free devices}: published on that node, selected (if given), not held by a claim,
    without a blocking taint (in its slice or from a DeviceTaintRule), consuming no shared counters (so
    each one stands alone), and allowing one allocation only (or, `shareable`, several: consumable capacity)."""
    slices = _newest_slices([k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items
                             if s.spec.driver in drivers])
    used = in_use(k8s)
    ruled = blocking_rule_selectors(k8s)
    labels = None  # node -> labels, read once if some pool is network-attached
    found: dict[tuple[str, str], list[Device]] = {}
    for s in slices:
        reachable = [s["spec"]["nodeName"]] if s["spec"].get("nodeName") else None
        if reachable is None:
            if labels is None:
                labels = {n.metadata.name: dict(n.metadata.labels or {}) for n in k8s.core.list_node().items
                          if not n.spec.unschedulable}
            reachable = reachable_nodes(s["spec"], labels)
        for device in s["spec"].get("devices") or []:
            key = (s["spec"]["driver"], s["spec"]["pool"]["name"], device["name"])
            if selected is not None and key not in selected or key in used or device.get("consumesCounters"):
                continue
            if bool(device.get("allowMultipleAllocations")) != shareable:
                continue
            if any(t.get("effect") in BLOCKING_EFFECTS for t in device.get("taints") or []) or _ruled_out(key, ruled):
                continue
            for node in reachable:
                found.setdefault((key[0], node), []).append(Device(key[0], key[1], key[2], node, device))
    for devices in found.values():
        devices.sort(key=lambda d: (len(d.name), d.name))
    return found


def reachable_nodes(spec: dict, labels: dict[str, dict[str, str]]) -> list[str]:
    """The nodes from which a network-attached pool's devices can be used: every node (allNodes), or those
    its node selector matches (matchExpressions on labels, matchFields on metadata.name; the terms ORed)."""
    if spec.get("allNodes"):
        return sorted(labels)
    terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return sorted(node for node, have in labels.items() if any(_term_matches(t, node, have) for t in terms))


def _term_matches(term: dict, node: str, labels: dict[str, str]) -> bool:
    def holds(requirement: dict, value: str | None) -> bool:
        op, values = str(requirement.get("operator")), requirement.get("values") or []
        return {"In": value in values, "NotIn": value not in values, "Exists": value is not None,
                "DoesNotExist": value is None}.get(op, False)

    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing (core/v1 NodeSelectorTerm)
    return all(holds(r, labels.get(r["key"])) for r in expressions) and \
        all(r.get("key") == "metadata.name" and holds(r, node) for r in fields)


def all_devices(k8s: Clients, driver: str) -> list[dict]:
    items = [k8s.api_client.sanitize_for_serialization(s)
             for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items]
    return [d for s in _newest_slices(items) for d in s["spec"].get("devices") or []]


def held_on(k8s: Clients, driver: str, node: str) -> int:
    """How many claims of the cluster hold devices of `driver` in pools published for `node`."""
    pools = {s.spec.pool.name for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items
             if s.spec.node_name == node}
    return sum(1 for claim in k8s.resource.list_resource_claim_for_all_namespaces().items
               if claim.status and claim.status.allocation and any(
                   r.driver == driver and r.pool in pools for r in claim.status.allocation.devices.results or []))

"""The kinds of unblocking event of the requeue-correctness scenario: for each, what holds a waiting pod
back on its own node, and the one API call that lets it go (docs/requeue-correctness.md says which scheduler
registration and queueing hint each reaches in v1.37.2).

Event i acts on node i alone (its "slot"): the devices are the run's own, one pool per slot of a driver the
run publishes itself (`rq.<domain>`, a ResourceSlice per slot, no kubelet plugin: the nodes are simulated),
and the waiting pod `rq-<i>` is pinned to its slot's node. So an event can free exactly one pod, every other
waiting pod stays blocked, and a pod still waiting after the event's bound was not requeued by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.k8s import errors
from load.cluster_ops import PAUSE_IMAGE, claim_template
from load.scenarios import LOAD_LABEL

HOSTNAME = "kubernetes.io/hostname"
SLOT_LABEL = "dra-harness.x-k8s.io/rq-slot"  # node-labelled: the label a network-attached pool selects
HOLD_TAINT = "dra-harness.x-k8s.io/rq-hold"  # toleration-added: the node taint the pod does not tolerate yet
DEVICE_TAINT = {"key": "dra-harness.x-k8s.io/rq-hold", "value": "held", "effect": "NoSchedule"}
TEMPLATE = "rq-one"  # one device of the run's class
NEVER_TEMPLATE = "rq-never"  # decoys: a class that never exists, so they stay blocked through every event


@dataclass(frozen=True)
class Context:
    """What the kinds need of the run: clients, names and marks."""

    core: Any
    resource: Any
    namespace: str
    label: str  # LOAD_LABEL's value on everything the run creates
    instance: str
    domain: str
    node_taint: str = ""  # a guest run's own node taint, tolerated by its pods
    tolerations: tuple = ()
    scheduling: Any = None  # scheduling.k8s.io/v1beta1 (PodGroups), for group-claim-released

    @property
    def driver(self) -> str:
        return f"rq.{self.domain}"

    @property
    def device_class(self) -> str:
        return f"{self.instance}-rq"

    def labels(self) -> dict:
        return {LOAD_LABEL: self.label}

    def selector(self, node: str) -> str:
        """CEL selecting the run's device of slot `node`."""
        return f'device.driver == "{self.driver}" && device.attributes["{self.driver}"].slot == "{node}"'


# --- objects --------------------------------------------------------------------------------------

def device(node: str, name: str = "dev-0", tainted: bool = False) -> dict:
    body: dict = {"name": name, "attributes": {"slot": {"string": node}}}
    if tainted:
        body["taints"] = [dict(DEVICE_TAINT)]
    return body


def slice_name(ctx: Context, node: str) -> str:
    return f"{ctx.instance}-rq-{node}"


def resource_slice(ctx: Context, node: str, devices: list[dict], *, selected_by_label: bool = False) -> dict:
    """The slot's pool: on the node itself, or (network-attached) on the nodes labelled with the slot."""
    spec: dict = {"driver": ctx.driver, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": devices}
    if selected_by_label:
        spec["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": SLOT_LABEL, "operator": "In", "values": [node]}]}]}
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": slice_name(ctx, node), "labels": ctx.labels()}, "spec": spec}


def device_class(ctx: Context, name: str, expression: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name, "labels": ctx.labels()},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def pod(ctx: Context, name: str, node: str | None, *, template_name: str | None = None,
        claim: str | None = None) -> dict:
    """A pause pod pinned to `node` with one claim entry: from a template, or a claim by name."""
    entry: dict = {"name": "dev"}
    if claim:
        entry["resourceClaimName"] = claim
    else:
        entry["resourceClaimTemplateName"] = template_name or TEMPLATE
    spec: dict = {"containers": [{"name": "main", "image": PAUSE_IMAGE,
                                  "resources": {"claims": [{"name": "dev"}]}}],
                  "resourceClaims": [entry], "terminationGracePeriodSeconds": 0,
                  "tolerations": [dict(t) for t in ctx.tolerations]}
    if node:
        spec["nodeSelector"] = {HOSTNAME: node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": ctx.labels()}, "spec": spec}


def taint_rule(ctx: Context, node: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": f"{ctx.instance}-rq-{node}", "labels": ctx.labels()},
            "spec": {"deviceSelector": {"driver": ctx.driver, "pool": node}, "taint": dict(DEVICE_TAINT)}}


def filler(i: int) -> str:
    return f"rq-fill-{i}"


def target(i: int) -> str:
    return f"rq-{i}"


# --- the kinds ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """`arrange(ctx, i, node)` makes what holds slot i back and returns the pods that must be running first
    (their devices taken); `waiting(ctx, i, node)` is the pod that waits; `fire(ctx, i, node)` is the event,
    returning what it did."""

    name: str
    description: str
    arrange: Callable[[Context, int, str], list[dict]]
    fire: Callable[[Context, int, str], str]
    waiting: Callable[[Context, int, str], dict] = lambda ctx, i, node: pod(ctx, target(i), node)
    needs_pod_groups: bool = False  # scheduling.k8s.io/v1beta1 PodGroups, served only with their gates on


def _one_device_held(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    return [pod(ctx, filler(i), node)]


def _delete_filler(ctx: Context, i: int, node: str) -> str:
    ctx.core.delete_namespaced_pod(filler(i), ctx.namespace, grace_period_seconds=0)
    return f"delete running pod {filler(i)}, whose claim holds the device"


def _standalone_claim_held(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"rq-hold-{i}", "labels": ctx.labels()},
             "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": ctx.device_class}}]}}}
    ctx.resource.create_namespaced_resource_claim(ctx.namespace, claim)
    return [pod(ctx, filler(i), node, claim=f"rq-hold-{i}")]


def _delete_claim_user(ctx: Context, i: int, node: str) -> str:
    ctx.core.delete_namespaced_pod(filler(i), ctx.namespace, grace_period_seconds=0)
    return f"delete pod {filler(i)}, the only user of claim rq-hold-{i}: the controller deallocates the claim"


def _group(i: int) -> str:
    return f"rq-group-{i}"


def _group_claim_held(ctx: Context, i: int, node: str) -> list[dict]:
    """A PodGroup whose one member runs with the group's shared claim (generated from the template for the
    group, reserved for the group, not for the pod) on the node's one device."""
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    ctx.scheduling.create_namespaced_pod_group(ctx.namespace, {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": _group(i), "labels": ctx.labels()},
        "spec": {"schedulingPolicy": {"basic": {}},
                 "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": TEMPLATE}]}})
    member = pod(ctx, filler(i), node)  # its entry equals the group's: it uses the group's claim
    member["spec"]["schedulingGroup"] = {"podGroupName": _group(i)}
    return [member]


def _release_group(ctx: Context, i: int, node: str) -> str:
    ctx.core.delete_namespaced_pod(filler(i), ctx.namespace, grace_period_seconds=0)
    ctx.scheduling.delete_namespaced_pod_group(_group(i), ctx.namespace)
    return (f"delete pod {filler(i)} and its PodGroup {_group(i)}: the group's shared claim goes with the group "
            "(its owner), and the device with it")


def _nothing(ctx: Context, i: int, node: str) -> list[dict]:
    return []


def _add_slice(ctx: Context, i: int, node: str) -> str:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    return f"create ResourceSlice {slice_name(ctx, node)} with node {node}'s device"


def _add_device(ctx: Context, i: int, node: str) -> str:
    body = resource_slice(ctx, node, [device(node), device(node, "dev-1")])
    current = ctx.resource.read_resource_slice(slice_name(ctx, node))
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    ctx.resource.replace_resource_slice(slice_name(ctx, node), body)
    return f"update ResourceSlice {slice_name(ctx, node)}: a second device"


def _tainted_device(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node, tainted=True)]))
    return []


def _untaint_device(ctx: Context, i: int, node: str) -> str:
    body = resource_slice(ctx, node, [device(node)])
    current = ctx.resource.read_resource_slice(slice_name(ctx, node))
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    ctx.resource.replace_resource_slice(slice_name(ctx, node), body)
    return f"update ResourceSlice {slice_name(ctx, node)}: its device's NoSchedule taint removed"


def _ruled_device(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    ctx.resource.create_device_taint_rule(taint_rule(ctx, node))
    return []


def _delete_rule(ctx: Context, i: int, node: str) -> str:
    ctx.resource.delete_device_taint_rule(f"{ctx.instance}-rq-{node}")
    return f"delete DeviceTaintRule {ctx.instance}-rq-{node}"


def _narrow_rule(ctx: Context, i: int, node: str) -> str:
    name = f"{ctx.instance}-rq-{node}"
    ctx.resource.patch_device_taint_rule(name, {"spec": {"deviceSelector": {"device": "no-such-device"}}})
    return f"update DeviceTaintRule {name}: it selects device no-such-device instead of node {node}'s pool"


def _class_name(ctx: Context, i: int) -> str:
    return f"{ctx.instance}-rq-class-{i}"


def _device_for_own_class(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    ctx.resource.create_namespaced_resource_claim_template(ctx.namespace, claim_template(f"rq-class-{i}", _class_name(ctx, i)))
    return []


def _waiting_for_own_class(ctx: Context, i: int, node: str) -> dict:
    return pod(ctx, target(i), node, template_name=f"rq-class-{i}")


def _create_class(ctx: Context, i: int, node: str) -> str:
    ctx.resource.create_device_class(device_class(ctx, _class_name(ctx, i), ctx.selector(node)))
    return f"create DeviceClass {_class_name(ctx, i)}"


def _class_selecting_nothing(ctx: Context, i: int, node: str) -> list[dict]:
    _device_for_own_class(ctx, i, node)
    ctx.resource.create_device_class(device_class(ctx, _class_name(ctx, i), ctx.selector("no-such-slot")))
    return []


def _widen_class(ctx: Context, i: int, node: str) -> str:
    name = _class_name(ctx, i)
    current = ctx.resource.read_device_class(name)
    body = device_class(ctx, name, ctx.selector(node))
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    ctx.resource.replace_device_class(name, body)
    return f"update DeviceClass {name}: its selector now matches node {node}'s device"


def _pool_for_labelled_nodes(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)], selected_by_label=True))
    return []


def _label_node(ctx: Context, i: int, node: str) -> str:
    ctx.core.patch_node(node, {"metadata": {"labels": {SLOT_LABEL: node}}})
    return f"label node {node} {SLOT_LABEL}={node}, which its network-attached pool selects"


def _tainted_node(ctx: Context, i: int, node: str) -> list[dict]:
    ctx.resource.create_resource_slice(resource_slice(ctx, node, [device(node)]))
    ctx.core.patch_node(node, {"spec": {"taints": _node_taints(ctx, node) + [
        {"key": HOLD_TAINT, "value": node, "effect": "NoSchedule"}]}})
    return []


def _node_taints(ctx: Context, node: str) -> list[dict]:
    found = ctx.core.read_node(node).spec.taints or []
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in found if t.key != HOLD_TAINT]


def _tolerate(ctx: Context, i: int, node: str) -> str:
    current = ctx.core.read_namespaced_pod(target(i), ctx.namespace)
    tolerations = [ctx.core.api_client.sanitize_for_serialization(t) for t in current.spec.tolerations or []]
    tolerations.append({"key": HOLD_TAINT, "operator": "Equal", "value": node, "effect": "NoSchedule"})
    ctx.core.patch_namespaced_pod(target(i), ctx.namespace, {"spec": {"tolerations": tolerations}})
    return f"update pod {target(i)}: tolerate node {node}'s taint {HOLD_TAINT}"


KINDS: tuple[Kind, ...] = (
    Kind("pod-deleted", "the device's claim belongs to a running pod; the event deletes that pod (its claim from "
         "a template is deleted with it)", _one_device_held, _delete_filler),
    Kind("claim-deallocated", "the device is allocated to a standalone ResourceClaim of a running pod; the event "
         "deletes the pod, and the resourceclaim controller deallocates the claim (which stays)",
         _standalone_claim_held, _delete_claim_user),
    Kind("slice-added", "the node has no device; the event creates its ResourceSlice", _nothing, _add_slice),
    Kind("slice-updated", "the node's one device is taken; the event updates its ResourceSlice with a second "
         "device", _one_device_held, _add_device),
    Kind("slice-taint-removed", "the node's device has a NoSchedule taint in its ResourceSlice; the event updates "
         "the slice without it", _tainted_device, _untaint_device),
    Kind("rule-deleted", "a DeviceTaintRule taints the node's pool NoSchedule; the event deletes the rule",
         _ruled_device, _delete_rule),
    Kind("rule-changed", "a DeviceTaintRule taints the node's pool NoSchedule; the event changes its selector so "
         "it no longer selects the device", _ruled_device, _narrow_rule),
    Kind("class-created", "the pod's claim asks for a DeviceClass that does not exist; the event creates it",
         _device_for_own_class, _create_class, _waiting_for_own_class),
    Kind("class-updated", "the pod's DeviceClass selects no device; the event updates its selector to select "
         "the node's device", _class_selecting_nothing, _widen_class, _waiting_for_own_class),
    Kind("node-labelled", "the node's pool is network-attached and selects nodes by a label the node lacks; the "
         "event labels the node", _pool_for_labelled_nodes, _label_node),
    Kind("toleration-added", "the node has a NoSchedule taint the pod does not tolerate (its device is free); the "
         "event updates the pod with a toleration", _tainted_node, _tolerate),
    Kind("group-claim-released", "the device is allocated to a PodGroup's shared claim (made from a template for "
         "the group) and its member runs; the event deletes the member and the group, and the claim goes with "
         "the group", _group_claim_held, _release_group, needs_pod_groups=True),
)
BY_NAME = {k.name: k for k in KINDS}
NO_POD_GROUPS = ("the cluster does not serve scheduling.k8s.io/v1beta1 PodGroups (feature gates GenericWorkload and "
                 "DRAWorkloadResourceClaims, off by default in 1.37; on in the all-dra preset)")


def served(ctx: Context) -> tuple[tuple[Kind, ...], dict[str, str]]:
    """The kinds this cluster can fire, and why each of the others cannot (kind -> reason)."""
    left_out: dict[str, str] = {}
    if any(k.needs_pod_groups for k in KINDS):
        try:
            ctx.scheduling.list_namespaced_pod_group(ctx.namespace, limit=1)
        except errors.NotFound:
            left_out.update({k.name: NO_POD_GROUPS for k in KINDS if k.needs_pod_groups})
    return tuple(k for k in KINDS if k.name not in left_out), left_out


def assignment(events: int, nodes: list[str], kinds: tuple[Kind, ...] = KINDS) -> list[tuple[int, Kind, str]]:
    """(event number, kind, slot node) of every event: the kinds in turn, one node each."""
    return [(i, kinds[i % len(kinds)], nodes[i]) for i in range(events)]


def _percentile_ms(seconds: list[float], p: float) -> float | None:
    """Nearest-rank percentile, in milliseconds."""
    if not seconds:
        return None
    ordered = sorted(seconds)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100)
    return round(ordered[int(rank) - 1] * 1000, 2)


def rows(records: list[list], bound_seconds: float) -> list[dict]:
    """load-report.json's requeueCorrectness: per kind (in KINDS order) the events fired, how many pods were
    bound within the bound (requeued) and how many were not (missed, with the pods), and p50/p99 from the
    event to the binding."""
    result = []
    for kind in KINDS:
        mine = [r for r in records if r[0] == kind.name]
        if not mine:
            continue
        bound = [r[1] for r in mine if r[1] is not None]
        missed = sorted(r[2] for r in mine if r[1] is None)
        result.append({"kind": kind.name, "events": len(mine), "requeued": len(bound), "missed": len(missed),
                       "missedPods": missed, "p50_ms": _percentile_ms(bound, 50), "p99_ms": _percentile_ms(bound, 99),
                       "boundMs": round(bound_seconds * 1000)})
    return result

"""Manifests the conformance tests build, as plain dicts (one place, so tests read as behaviour)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.k8s.nodes import REAL_NODE_TAINT_KEY, SHELL_IMAGE, UNTIL_DELETED

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


def request(device_class_name: str, *, name: str = "gpu", count: int = 1, selectors: Sequence[str] = (),
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
    if not requests:
        if device_class_name is None:
            raise ValueError("claim_template needs a device_class_name or requests")
        requests = [request(device_class_name, count=count)]
    devices: dict = {"requests": requests}
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


# --- pods with extended resources, several containers, device tolerations ---------------------

def container(name: str, *, limits: dict[str, str] | None = None, claims: Sequence[str] = (),
              restart_policy: str | None = None) -> dict:
    """A pause container; `limits` (requests default to them), pod claim names it uses, and
    `restart_policy="Always"` to make an init container a sidecar."""
    result: dict = {"name": name, "image": PAUSE_IMAGE}
    resources: dict = {}
    if limits:
        resources["limits"] = dict(limits)
    if claims:
        resources["claims"] = [{"name": claim} for claim in claims]
    if resources:
        result["resources"] = resources
    if restart_policy:
        result["restartPolicy"] = restart_policy
    return result


def pod(name: str, containers: list[dict], *, init_containers: list[dict] | None = None,
        resource_claims: list[dict] | None = None, node_selector: dict | None = None) -> dict:
    spec: dict = {"containers": containers, "terminationGracePeriodSeconds": 0}
    if init_containers:
        spec["initContainers"] = init_containers
    if resource_claims:
        spec["resourceClaims"] = resource_claims
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pod_with_extended_resources(name: str, limits: dict[str, str], node_selector: dict | None = None) -> dict:
    """One container asking for extended resources (no ResourceClaim in the pod spec)."""
    return pod(name, [container("main", limits=limits)], node_selector=node_selector)


def device_toleration(key: str, *, operator: str = "Equal", value: str | None = None, effect: str | None = None,
                      seconds: int | None = None) -> dict:
    """A DeviceToleration (effect None/empty matches every effect; seconds only for NoExecute)."""
    result: dict = {"key": key, "operator": operator}
    if value is not None:
        result["value"] = value
    if effect is not None:
        result["effect"] = effect
    if seconds is not None:
        result["tolerationSeconds"] = seconds
    return result


def tolerating(device_request: dict, *tolerations: dict) -> dict:
    """A copy of an `exactly` request (see request()) that also tolerates the given device taints."""
    exactly = {**device_request["exactly"],
               "tolerations": [*device_request["exactly"].get("tolerations", []), *(dict(t) for t in tolerations)]}
    return {**device_request, "exactly": exactly}


# --- pod groups (workload claims), constraints, prioritized lists, admin access ----------------

NUMA_NODE = "resource.kubernetes.io/numaNode"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def standard_attribute(name: str) -> str:
    """CEL for a standard attribute (`numaNode` -> device.attributes["resource.kubernetes.io"].numaNode)."""
    return f'device.attributes["resource.kubernetes.io"].{name}'


def claim_ref(name: str, *, claim: str | None = None, template: str | None = None) -> dict:
    """A claim entry as Pods and PodGroups both list it: {name, resourceClaimName | resourceClaimTemplateName}."""
    entry: dict = {"name": name}
    if claim is not None:
        entry["resourceClaimName"] = claim
    if template is not None:
        entry["resourceClaimTemplateName"] = template
    return entry


def pod_with_claims(name: str, claims: list[dict], *, pod_group: str | None = None,
                    node_selector: dict | None = None) -> dict:
    """A pause pod whose one container uses every claim entry (see claim_ref()); `pod_group` makes it a
    member of that PodGroup (spec.schedulingGroup.podGroupName)."""
    body = pod(name, [container("main", claims=[c["name"] for c in claims])],
               resource_claims=[dict(c) for c in claims] or None, node_selector=node_selector)
    if pod_group:
        body["spec"]["schedulingGroup"] = {"podGroupName": pod_group}
    return body


def scheduling_policy(min_count: int | None) -> dict:
    """`gang` with minCount, or `basic` when min_count is None."""
    return {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}}


def pod_group(name: str, claims: Sequence[dict] = (), *, min_count: int | None = None,
              workload: tuple[str, str] | None = None) -> dict:
    """A scheduling.k8s.io/v1beta1 PodGroup; `workload` = (Workload name, podGroupTemplate name)."""
    spec: dict = {"schedulingPolicy": scheduling_policy(min_count)}
    if claims:
        spec["resourceClaims"] = [dict(c) for c in claims]
    if workload:
        spec["workloadRef"] = {"workloadName": workload[0], "templateName": workload[1]}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name}, "spec": spec}


def workload(name: str, template: str, claims: Sequence[dict] = (), *, min_count: int | None = None) -> dict:
    """A scheduling.k8s.io/v1beta1 Workload with one podGroupTemplate."""
    group: dict = {"name": template, "schedulingPolicy": scheduling_policy(min_count)}
    if claims:
        group["resourceClaims"] = [dict(c) for c in claims]
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"podGroupTemplates": [group]}}


def resource_claim(name: str, requests: list[dict], constraints: list[dict] | None = None) -> dict:
    devices: dict = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def match_attribute(attribute: str, *requests: str) -> dict:
    """A constraint: the devices of `requests` (all requests if none) share `attribute`."""
    return {"requests": list(requests), "matchAttribute": attribute} if requests else {"matchAttribute": attribute}


def distinct_attribute(attribute: str, *requests: str) -> dict:
    """A constraint: the devices of `requests` (all requests if none) all differ in `attribute`."""
    return ({"requests": list(requests), "distinctAttribute": attribute} if requests
            else {"distinctAttribute": attribute})


def first_available(name: str, *subrequests: dict) -> dict:
    """A request served by the first of `subrequests` (each built with request(); its name becomes the
    subrequest name) that can be allocated."""
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subrequests]}


def admin_request(device_class_name: str, *, name: str = "gpu", selectors: Sequence[str] = ()) -> dict:
    """An `exactly` request with adminAccess: true (monitoring/maintenance access to in-use devices)."""
    result = request(device_class_name, name=name, selectors=selectors)
    result["exactly"]["adminAccess"] = True
    return result


# --- pods on a node run by a real kubelet ----------------------------------------------------------

ENV_DONE = "--- env done ---"
IDLE = ["sh", "-c", UNTIL_DELETED]  # waits until the pod is deleted, then ends at once (harness.k8s.nodes)
# A container that prints its DRA_* environment (what CDI injected), marks the end, then waits.
PRINT_DRA_ENV = ["sh", "-c", f"env | grep '^DRA_' | sort; echo '{ENV_DONE}'; {UNTIL_DELETED}"]


def pod_on_node(name: str, node: str, image: str, *, command: list[str] | None = None,
                claim_template: str | None = None, pull_policy: str = "Never", restart_policy: str | None = None) -> dict:
    """A one-container pod pinned to `node` (tolerating the real-node taint), optionally using one
    claim entry `gpu` from `claim_template`."""
    container: dict = {"name": "main", "image": image, "imagePullPolicy": pull_policy}
    if command:
        container["command"] = list(command)
    spec: dict = {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                  "tolerations": [{"key": REAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                  "containers": [container]}
    if claim_template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def shell_pod(name: str, node: str, claim_template: str) -> dict:
    """A pod on the real node whose container prints its DRA_* environment, then waits."""
    return pod_on_node(name, node, SHELL_IMAGE, command=PRINT_DRA_ENV,
                               claim_template=claim_template)


def node_profile(directory, name: str, devices: str) -> str:
    """Write a fake-driver NodeProfile `name` to `directory` and return its path: one NUMA node with CPUs
    0-15, 64Gi and the PCIe root pci0000:10, and `devices`, the YAML of the spec's device groups (`gpus:`,
    `nics:`, ... indented by two spaces, attached to pci0000:10)."""
    path = directory / f"{name}.yaml"
    path.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: NodeProfile\n"
                    f"metadata: {{name: {name}}}\nspec:\n"
                    '  numaNodes: [{id: 0, cpus: "0-15", memory: 64Gi, pcieRoots: [pci0000:10]}]\n' + devices)
    return str(path)

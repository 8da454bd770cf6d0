"""A vendor file checked against the cluster under test, before any test: every DeviceClass it names
exists (or is in spec.manifests, which must not exist yet and must pass the API server's dry run), every
extended resource is mapped by the class of its device type, the node selector matches a node, the
plugin's DaemonSet exists, and the test image is on each kubelet node where the drivers publish devices.
Every problem is reported with file, field, value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path

from fake_devices.errors import InvalidInput, Problem
from harness.backends.kwok.nodes import KWOK_NODE_ANNOTATION
from harness.k8s import api, errors
from harness.k8s.client import Clients
from harness.vendor.file import MANIFEST_API_VERSION, VendorDriver


def check(vendor: VendorDriver, kubeconfig: str | Path) -> None:
    """`check_against_cluster` on the cluster this kubeconfig reaches (a client of its own, closed after)."""
    clients = Clients(Path(kubeconfig))
    try:
        check_against_cluster(vendor, clients)
    finally:
        clients.close()


def _image_names(node) -> set[str]:
    names = set()
    for image in (node.status.images if node.status else None) or []:
        for name in image.names or []:
            names.add(name)
            if name.startswith("docker.io/library/"):  # `pause:3.10` is how people write docker.io/library/pause
                names.add(name.removeprefix("docker.io/library/"))
            if name.startswith("docker.io/"):
                names.add(name.removeprefix("docker.io/"))
    return names


def check_against_cluster(vendor: VendorDriver, k8s) -> None:
    """Refuse, with every problem located in the file, a vendor file the cluster contradicts: a
    DeviceClass it names does not exist (nor is in spec.manifests), an extended resource no class maps,
    a node selector that matches no node, a test image missing on a kubelet node where the drivers
    publish devices. Before the run has created spec.manifests, each must not exist yet (the run never
    touches an object it did not create) and must pass the API server's dry run: the check comes before the
    set-up (harness.vendor.setup), once per run."""
    problems: list[Problem] = []
    source = vendor.source or "vendor file"
    classes = {c.metadata.name: c for c in k8s.resource.list_device_class().items}
    for i, manifest in enumerate(vendor.manifests):
        where = f"spec.manifests[{i}]"
        if manifest.name in classes:
            problems.append(Problem(source, where, f"{manifest.kind} {manifest.name!r} already exists in the "
                                    "cluster; the run creates the objects of spec.manifests and deletes them "
                                    "after, and never touches one it did not create",
                                    f"delete {manifest.kind} {manifest.name} first, or drop {manifest.path} "
                                    "from spec.manifests"))
            continue
        try:
            checked = k8s.resource.create_device_class(manifest.body, dry_run="All")
        except errors.ApiError as err:
            problems.append(Problem(source, where, f"{manifest.path}: the API server refuses it: "
                                    f"{errors.message(err)[:500]}", f"a valid {MANIFEST_API_VERSION} {manifest.kind}"))
            continue
        classes[manifest.name] = checked
    for kind, name in sorted(vendor.device_classes.items()):
        if name not in classes:
            problems.append(Problem(source, f"spec.deviceClasses.{kind}", f"DeviceClass {name!r} does not exist in "
                                    "the cluster", ", ".join(sorted(classes)[:20]) or "no DeviceClass exists"))
    mapped = {c.spec.extended_resource_name: n for n, c in classes.items() if c.spec.extended_resource_name}
    for kind, resource in sorted(vendor.extended_resources.items()):
        if resource not in mapped:
            problems.append(Problem(source, f"spec.extendedResources.{kind}", f"no DeviceClass maps {resource!r} "
                                    "(spec.extendedResourceName)", ", ".join(sorted(mapped)[:20]) or
                                    "no DeviceClass of the cluster has an extendedResourceName"))
        elif vendor.device_classes.get(kind) != mapped[resource]:
            problems.append(Problem(source, f"spec.extendedResources.{kind}", f"{resource!r} is mapped by DeviceClass "
                                    f"{mapped[resource]!r}, not by spec.deviceClasses.{kind} "
                                    f"({vendor.device_classes.get(kind)!r})", "the class of the same device type"))
    nodes = {n.metadata.name: n for n in k8s.core.list_node().items}
    if vendor.node_selector:
        try:
            selected = k8s.core.list_node(label_selector=vendor.node_selector).items
        except errors.ApiError as err:
            problems.append(Problem(source, "spec.nodeSelector", f"{vendor.node_selector!r} is refused by the API "
                                    f"server: {err.reason}", "a Kubernetes label selector"))
        else:
            if not selected:
                problems.append(Problem(source, "spec.nodeSelector", f"{vendor.node_selector!r} matches no node",
                                        "a selector of the nodes where your driver publishes devices"))
    kubelet_nodes = set()
    for driver in vendor.drivers:
        for item in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items:
            node = nodes.get(item.spec.node_name or "")
            if node is not None and (node.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) != "fake":
                kubelet_nodes.add(item.spec.node_name)
    if vendor.plugin_daemon_set is not None:
        namespace, name = vendor.plugin_daemon_set
        try:
            found = errors.ignore_missing(api.AppsV1Api(k8s.api_client).read_namespaced_daemon_set, name, namespace)
        except errors.ApiError as err:
            found, why = None, f"cannot be read: {err.status} {err.reason}"
        else:
            why = "does not exist in the cluster"
        if found is None:
            problems.append(Problem(source, "spec.pluginDaemonSet", f"DaemonSet {namespace}/{name} {why}",
                                    "the DaemonSet that runs your kubelet plugin"))
    field = "spec.testImage" + (" (default)" if vendor.default_image else "")
    for node in sorted(kubelet_nodes):
        names = _image_names(nodes[node])
        if vendor.test_image not in names:
            sample = ", ".join(sorted(n for n in names if "@sha256:" not in n)[:8]) or "none"
            problems.append(Problem(source, field, f"{vendor.test_image!r} is not on node {node}, where your "
                                    "driver publishes devices", f"an image the node has: {sample}"))
    if problems:
        raise InvalidInput(problems)


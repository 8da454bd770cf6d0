"""The fake driver's Kubernetes manifests (deploy/kustomize), as the kind and existing backends use them.

Both backends deploy one of the shipped overlays through a small generated kustomization of their
own (in the cluster's state directory) that adds only what differs per cluster:
- the driver image reference (`images:`),
- the label `dra-harness.x-k8s.io/deployed-by=<cluster name>` on every object, so `cluster down`
  removes exactly what `cluster up` created,
- DeviceClass `extendedResourceName`s from the cluster definition (`spec.driver.extendedResources`),
- dropping the Namespace object when the namespace existed before (then it is not ours to delete).

Then: wait until the controller and the plugin pods are ready, and until every labelled node's
ResourceSlices are published (the same slices fake_devices.render computes for its profile).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from urllib3.exceptions import HTTPError

import harness
from fake_devices import profile as profiles
from fake_devices import render
from fake_devices.config import DEVICE_TYPES, PROFILE_LABEL
from harness.backends.commands import command
from harness.core.errors import ConfigError, HarnessError, Problem
from harness.k8s import api, errors
from harness.k8s.nodes import is_ready, why_not_ready
from harness.k8s.wait import describe_namespace, until

NAMESPACE = "dra-harness-system"
INSTANCE = "fake"
DOMAIN = "fake.dra-harness.x-k8s.io"
INSTANCE_LABEL = render.INSTANCE_LABEL
DEPLOYED_BY_LABEL = "dra-harness.x-k8s.io/deployed-by"
CONTROLLER = "fake-devices-controller"
PLUGIN = "fake-devices-kubelet-plugin"
OVERLAYS = ("mixed", "dgx-h100")
# The image name the base kustomization sets (deploy/kustomize/base/kustomization.yaml `images:`);
# the tag is the package version, so an image built from this checkout is never confused with another.
IMAGE_NAME = "localhost/dra-harness/fake-driver"

# What `down` deletes, by label, in this order: workloads first (foreground, so the controller has
# stopped before its slices go), then cluster-scoped objects, then the namespaced rest.
WORKLOAD_KINDS = "deployments.apps,daemonsets.apps"
CLUSTER_KINDS = ("validatingadmissionpolicybindings.admissionregistration.k8s.io,"
                 "validatingadmissionpolicies.admissionregistration.k8s.io,"
                 "clusterrolebindings.rbac.authorization.k8s.io,clusterroles.rbac.authorization.k8s.io,"
                 "deviceclasses.resource.k8s.io")
NAMESPACED_KINDS = "rolebindings.rbac.authorization.k8s.io,roles.rbac.authorization.k8s.io,configmaps,serviceaccounts"


class _QuotedDumper(yaml.SafeDumper):
    """Every string double-quoted (multi-line ones as literal blocks). kind and kustomize read YAML
    with Go parsers whose type rules differ from PyYAML's: `1e5` is a number and `y` a boolean to
    them, while PyYAML writes both unquoted because it reads them as strings. A cluster named `1e5`
    or a node label `y` must stay a string."""


_QuotedDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else '"'))
_PLAIN_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9._/-]*$")
_AMBIGUOUS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def _mapping(dumper, data: dict):
    """Keys that read as strings to every YAML parser stay plain, so the files stay readable."""
    pairs = []
    for key, value in data.items():
        plain = isinstance(key, str) and _PLAIN_KEY.match(key) and key.lower() not in _AMBIGUOUS
        pairs.append((dumper.represent_scalar("tag:yaml.org,2002:str", key) if plain else dumper.represent_data(key),
                      dumper.represent_data(value)))
    return yaml.MappingNode("tag:yaml.org,2002:map", pairs, flow_style=False)


_QuotedDumper.add_representer(dict, _mapping)


def dump_yaml(data) -> str:
    """YAML for the Go tools (kind, kustomize): see _QuotedDumper."""
    return yaml.dump(data, Dumper=_QuotedDumper, sort_keys=False, width=120)


def default_image() -> str:
    return f"{IMAGE_NAME}:{harness.__version__}"


def repo_root() -> Path:
    return Path(harness.__file__).resolve().parent.parent


def deploy_dir() -> Path:
    """deploy/ of the source checkout this harness runs from."""
    directory = repo_root() / "deploy"
    if not (directory / "kustomize" / "base" / "kustomization.yaml").is_file():
        raise HarnessError(f"the driver manifests are not here: {directory / 'kustomize'} is missing",
                           hint="the kind and existing backends deploy deploy/kustomize from a source checkout of "
                                "dra-harness: run them from a clone (pip install -e .)")
    return directory


def overlay_dir(overlay: str) -> Path:
    return deploy_dir() / "kustomize" / "overlays" / overlay


def overlay_for(definition) -> str:
    """dgx-h100 when every node with devices is a DGX H100, else mixed (which serves every profile)."""
    used = set(definition.profiles) if definition is not None else set()
    return "dgx-h100" if used == {"dgx-h100"} else "mixed"


def served_profiles(overlay: str) -> set[str]:
    """The profiles an overlay's FakeDriverConfig lists (nodes with other profiles get no devices)."""
    data = yaml.safe_load((overlay_dir(overlay) / "driver.yaml").read_text())
    return set(data["spec"]["profiles"])


def check_definition(definition) -> None:
    """What the shipped manifests cannot do for a cluster definition, reported with file and field."""
    if definition is None:
        return
    problems = []
    if definition.driver.instance != INSTANCE:
        problems.append(Problem(definition.source, "spec.driver.instance", f"{definition.driver.instance!r}: the "
                                "manifests in deploy/kustomize deploy the instance 'fake'", INSTANCE))
    if definition.driver.domain != DOMAIN:
        problems.append(Problem(definition.source, "spec.driver.domain", f"{definition.driver.domain!r}: the "
                                "manifests in deploy/kustomize publish under the domain " + DOMAIN, DOMAIN))
    builtin = set(profiles.builtin_names())
    for index, pool in enumerate(definition.pools):
        if pool.profile is not None and (pool.profile.name not in builtin
                                         or Path(pool.profile.source).resolve().parent != profiles.BUILTIN_DIR):
            problems.append(Problem(definition.source, f"spec.nodePools[{index}].profile",
                                    f"{pool.profile.source}: the driver image only has the built-in profiles",
                                    ", ".join(sorted(builtin))))
    if problems:
        raise ConfigError(problems)


def split_image(reference: str) -> dict:
    """A kustomize `images:` entry for an image reference (name[:tag] or name@digest)."""
    name, at, digest = reference.partition("@")
    if at:
        return {"newName": name, "digest": digest}
    head, colon, tag = name.rpartition(":")
    if colon and "/" not in tag:
        return {"newName": head, "newTag": tag}
    return {"newName": name}


# [registry[:port]/]path[:tag][@sha256:digest], as Docker and containerd accept them
IMAGE_REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
                             r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$")


def check_image(reference: str, flag: str = "--driver-image",
                example: str = "[registry/]name[:tag][@sha256:<64 hex digits>], lowercase name") -> str:
    if not IMAGE_REFERENCE.match(reference or ""):
        raise ConfigError([Problem(flag, reference or "''", "not an image reference", example)])
    return reference


@dataclass(frozen=True)
class Deployment:
    """What to deploy: which overlay, with which image, labelled for which cluster."""

    overlay: str = "mixed"
    image: str = field(default_factory=default_image)
    deployed_by: str = "dra-harness"
    extended_resources: dict[str, str] | None = None  # None: keep the overlay's
    include_namespace: bool = True  # False: the namespace existed before; leave it out (and in place)

    @classmethod
    def for_definition(cls, definition, *, image: str | None, deployed_by: str,
                       include_namespace: bool = True) -> "Deployment":
        return cls(overlay=overlay_for(definition), image=image or default_image(), deployed_by=deployed_by,
                   extended_resources=(dict(definition.driver.extended_resources) if definition is not None
                                       else None),
                   include_namespace=include_namespace)


def kustomization(deployment: Deployment, directory: Path) -> dict:
    """The per-cluster kustomization (pure). `directory` is where it will be written: kustomize
    refuses absolute resource paths, so the overlay is referenced relative to it."""
    overlay = os.path.relpath(overlay_dir(deployment.overlay), directory)
    data: dict = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [overlay],
        "labels": [{"pairs": {DEPLOYED_BY_LABEL: deployment.deployed_by}, "includeSelectors": False}],
        "images": [{"name": IMAGE_NAME, **split_image(deployment.image)}],
    }
    patches = []
    if deployment.extended_resources is not None:
        for device_type in DEVICE_TYPES:
            # A merge patch: null removes the overlay's value, a string sets it.
            patches.append({"target": {"kind": "DeviceClass", "name": f"{INSTANCE}-{device_type}"},
                            "patch": dump_yaml({
                                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                "metadata": {"name": f"{INSTANCE}-{device_type}"},
                                "spec": {"extendedResourceName": deployment.extended_resources.get(device_type)}})})
    if not deployment.include_namespace:
        patches.append({"patch": dump_yaml({"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": NAMESPACE}, "$patch": "delete"})})
    if patches:
        data["patches"] = patches
    return data


def write_kustomization(deployment: Deployment, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "kustomization.yaml"
    path.write_text("# Generated by dra-harness for one cluster; see harness/backends/manifests.py.\n"
                    + dump_yaml(kustomization(deployment, directory)))
    return path


def delete_steps(kubectl: str, kubeconfig: Path, deployed_by: str, namespace_owned: bool) -> list:
    """`kubectl delete` of everything labelled deployed-by=<cluster>, in a safe order (as Steps)."""
    base = [kubectl, f"--kubeconfig={kubeconfig}", "delete"]
    selector = f"--selector={DEPLOYED_BY_LABEL}={deployed_by}"
    slices = f"--selector={INSTANCE_LABEL}={INSTANCE},app.kubernetes.io/managed-by={render.MANAGED_BY}"
    steps = [
        command("stopping the fake driver (controller and kubelet plugins)", *base, WORKLOAD_KINDS,
                f"--namespace={NAMESPACE}", selector, "--cascade=foreground", "--ignore-not-found", "--wait",
                "--timeout=180s", timeout=240),
        command("deleting the ResourceSlices the fake driver published", *base, "resourceslices.resource.k8s.io",
                slices, "--ignore-not-found", "--wait", "--timeout=120s", timeout=180),
        command("deleting cluster-scoped objects (RBAC, admission policy, DeviceClasses)", *base, CLUSTER_KINDS,
                selector, "--ignore-not-found", "--wait", "--timeout=120s", timeout=180),
        command(f"deleting the objects in namespace {NAMESPACE}", *base, NAMESPACED_KINDS, f"--namespace={NAMESPACE}",
                selector, "--ignore-not-found", "--wait", "--timeout=120s", timeout=180),
    ]
    if namespace_owned:
        steps.append(command(f"deleting namespace {NAMESPACE}", *base, "namespaces", selector, "--ignore-not-found",
                             "--wait", "--timeout=300s", timeout=360))
    return steps


# --- waiting for the deployment ---------------------------------------------------------------


def _unreachable_is_not_yet(check):
    """A poll of a cluster whose apiserver may restart while we wait (kind's static pods on a loaded
    machine are restarted by their liveness probes): a dropped connection means "not yet", and the
    wait's deadline still bounds it."""
    def polled():
        try:
            return check()
        except (HTTPError, OSError):
            return False

    return polled


def _described(clients) -> str:
    try:
        return describe_namespace(clients, NAMESPACE)
    except Exception as err:  # diagnostics of a failed wait never replace its error
        return f"(namespace {NAMESPACE} could not be described: {err})"


def wait_rollout(clients, timeout: float) -> None:
    """The controller Deployment is available and every plugin pod the DaemonSet wants is ready."""
    apps = _apps(clients)

    def ready() -> bool:
        deployment = apps.read_namespaced_deployment(CONTROLLER, NAMESPACE)
        daemonset = apps.read_namespaced_daemon_set(PLUGIN, NAMESPACE)
        dep, ds = deployment.status, daemonset.status
        controller_ok = bool(dep and (dep.available_replicas or 0) >= 1
                             and (dep.observed_generation or 0) >= deployment.metadata.generation)
        plugin_ok = bool(ds and (ds.observed_generation or 0) >= daemonset.metadata.generation
                         and (ds.number_ready or 0) == (ds.desired_number_scheduled or 0)
                         and (ds.updated_number_scheduled or 0) == (ds.desired_number_scheduled or 0))
        return controller_ok and plugin_ok

    until(f"the fake driver's controller and kubelet plugins in {NAMESPACE} to be ready", _unreachable_is_not_yet(ready),
          timeout, interval=1.0, diagnostics=lambda: _described(clients))


def expected_pools(nodes, served: set[str], domain: str = DOMAIN) -> dict[tuple[str, str], str]:
    """(node, driver) -> profile, for every node whose profile label the deployed overlay serves and
    every driver its profile publishes for."""
    drivers = render.Drivers(domain)
    expected = {}
    for node in nodes:
        profile_name = (node.metadata.labels or {}).get(PROFILE_LABEL)
        if profile_name not in served:
            continue
        for driver, (devices, counters) in render.devices_by_driver(profiles.load(profile_name), node.metadata.name,
                                                                    drivers).items():
            if devices or counters:
                expected[(node.metadata.name, driver)] = profile_name
    return expected


def complete_pools(slices) -> set[tuple[str, str]]:
    """(node, driver) pools whose newest generation has all its resourceSliceCount slices."""
    by_pool: dict[tuple[str, str], dict[int, list]] = {}
    for item in slices:
        spec = item.spec
        if not spec.node_name:
            continue
        key = (spec.node_name, spec.driver)
        by_pool.setdefault(key, {}).setdefault(spec.pool.generation, []).append(spec.pool.resource_slice_count)
    done = set()
    for key, generations in by_pool.items():
        newest = max(generations)
        counts = generations[newest]
        if counts and len(counts) == counts[0]:
            done.add(key)
    return done


def wait_published(clients, served: set[str], timeout: float) -> int:
    """Every node labelled with a served profile has all its ResourceSlices published. Returns the
    number of pools (node x driver) found complete."""
    state: dict = {}

    def published() -> bool:
        nodes = clients.core.list_node(label_selector=PROFILE_LABEL).items
        state["expected"] = expected_pools(nodes, served)
        slices = clients.resource.list_resource_slice(label_selector=f"{INSTANCE_LABEL}={INSTANCE}").items
        state["missing"] = sorted(set(state["expected"]) - complete_pools(slices))
        return not state["missing"]

    def diagnostics() -> str:
        missing = state.get("missing", [])
        lines = [f"{len(missing)} of {len(state.get('expected', {}))} pools not (fully) published, e.g.:"]
        lines += [f"  node {node}, driver {driver}" for node, driver in missing[:10]]
        return "\n".join(lines) + "\n" + _described(clients)

    until("every labelled node's ResourceSlices to be published", _unreachable_is_not_yet(published), timeout,
          interval=1.0, diagnostics=diagnostics)
    return len(state["expected"])


def wait_nodes_ready(clients, names: set[str], timeout: float,
                     explain: Callable[[list[str]], str] | None = None) -> None:
    """Wait until every node of `names` is Ready; at the deadline name each one that is not and why
    (its Ready condition), plus what `explain` adds for those nodes (e.g. their kubelets' logs)."""
    state: dict = {"nodes": {}}

    def ready() -> bool:
        state["nodes"] = {n.metadata.name: n for n in clients.core.list_node().items}
        state["waiting"] = sorted(n for n in names if n not in state["nodes"] or not is_ready(state["nodes"][n]))
        return not state["waiting"]

    def diagnostics() -> str:
        waiting = state.get("waiting", sorted(names))
        text = "not Ready:\n" + "\n".join(f"  {n}: {why_not_ready(state['nodes'].get(n))}" for n in waiting)
        return text + ("\n" + explain(waiting) if explain else "")

    until(f"{len(names)} nodes to be Ready", _unreachable_is_not_yet(ready), timeout, interval=1.0,
          diagnostics=diagnostics)


def _apps(clients):
    return api.AppsV1Api(clients.api_client)


def namespace_state(clients) -> str:
    """'absent', 'ours' (created by some dra-harness up) or 'foreign' (someone else's)."""
    namespace = errors.ignore_missing(clients.core.read_namespace, NAMESPACE)
    if namespace is None:
        return "absent"
    return "ours" if DEPLOYED_BY_LABEL in (namespace.metadata.labels or {}) else "foreign"


def leftovers(clients, deployed_by: str) -> list[str]:
    """Objects still labelled deployed-by=<cluster> (after `down`), as 'Kind name' strings."""
    selector = f"{DEPLOYED_BY_LABEL}={deployed_by}"
    client = clients.api_client
    found = []
    listings = [
        ("Namespace", lambda: clients.core.list_namespace(label_selector=selector)),
        ("ServiceAccount", lambda: clients.core.list_service_account_for_all_namespaces(label_selector=selector)),
        ("ConfigMap", lambda: clients.core.list_config_map_for_all_namespaces(label_selector=selector)),
        ("Deployment", lambda: api.AppsV1Api(client).list_deployment_for_all_namespaces(
            label_selector=selector)),
        ("DaemonSet", lambda: api.AppsV1Api(client).list_daemon_set_for_all_namespaces(
            label_selector=selector)),
        ("ClusterRole", lambda: clients.rbac.list_cluster_role(label_selector=selector)),
        ("ClusterRoleBinding", lambda: clients.rbac.list_cluster_role_binding(label_selector=selector)),
        ("Role", lambda: clients.rbac.list_role_for_all_namespaces(label_selector=selector)),
        ("RoleBinding", lambda: clients.rbac.list_role_binding_for_all_namespaces(label_selector=selector)),
        ("DeviceClass", lambda: clients.resource.list_device_class(label_selector=selector)),
        ("ValidatingAdmissionPolicy", lambda: api.AdmissionregistrationV1Api(client)
         .list_validating_admission_policy(label_selector=selector)),
        ("ValidatingAdmissionPolicyBinding", lambda: api.AdmissionregistrationV1Api(client)
         .list_validating_admission_policy_binding(label_selector=selector)),
    ]
    for kind, listing in listings:
        try:
            items = listing().items
        except errors.ApiError as err:
            found.append(f"{kind}: cannot list ({err.status} {err.reason})")
            continue
        found += [f"{kind} {item.metadata.name}" for item in items
                  if not (kind == "Namespace" and item.status and item.status.phase == "Terminating")]
    return found

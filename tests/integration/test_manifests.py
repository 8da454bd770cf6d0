"""The fake driver's manifests (deploy/kustomize) as a cluster sees them.

- each overlay renders with `kubectl kustomize` to what the docs promise (hostPath sockets, NODE_NAME,
  non-root controller, profiles per node label, DeviceClasses identical to the controller's own);
- a real 1.37 API server accepts every object (`kubectl apply --dry-run=server`), and the dry run
  leaves nothing behind;
- the RBAC is least privilege, checked both ways with `kubectl auth can-i --as=<service account>`;
- the admission policy scopes the kubelet plugin's ResourceSlice writes to the node its pod-bound
  token names, using a real token of a pod on a (simulated) node.

Cluster-scoped objects get unique names (kustomize nameSuffix) and namespaced ones a unique namespace,
so runs in parallel and a real deployment on the same cluster never collide; whatever a test creates
for real it deletes again, also when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import kubernetes
import pytest
import yaml

import harness
from fake_devices import config as driver_config
from fake_devices.config import PROFILE_LABEL
from fake_devices.controller import INSTANCE_LABEL, FakeDriver
from harness import binaries
from harness.backends import manifests
from harness.config import cluster
from harness.k8s import wait

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "deploy" / "kustomize" / "overlays"
HOST_PATHS = {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi",
              "/var/lib/dra-harness/fake-devices"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}
PLUGIN_USER = "system:serviceaccount:dra-harness-system:fake-devices-kubelet-plugin"


@pytest.fixture(scope="module")
def kubectl() -> str:
    return str(binaries.locate().path("kubectl"))


def _run(argv: list[str], *, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)


def _kustomize(kubectl: str, directory: Path) -> list[dict]:
    result = _run([kubectl, "kustomize", str(directory)])
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def _suffix() -> str:
    return uuid.uuid4().hex[:6]  # may look like a number (e.g. 1e5432): the YAML written must quote it


def _dump(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


# --- rendering --------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", manifests.OVERLAYS)
def test_overlay_renders_the_driver_as_documented(overlay, kubectl, tmp_path):
    docs = _kustomize(kubectl, OVERLAYS / overlay)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRole",
                            "ClusterRoleBinding", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
                            "ConfigMap", "Deployment", "DaemonSet", "ValidatingAdmissionPolicy",
                            "ValidatingAdmissionPolicyBinding"] + ["DeviceClass"] * 6)
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "dra-harness", doc["metadata"]["name"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], f"{doc['kind']} {doc['metadata']['name']} is cluster-scoped"
        else:
            assert doc["metadata"]["namespace"] == "dra-harness-system", doc["metadata"]["name"]

    # The controller's FakeDriverConfig loads, and its profiles are exactly the nodes the plugin serves.
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and "driver.yaml" in d.get("data", {}))
    (tmp_path / "driver.yaml").write_text(configmap["data"]["driver.yaml"])
    loaded = driver_config.load(tmp_path / "driver.yaml")
    assert (loaded.instance, loaded.domain, loaded.namespace) == ("fake", manifests.DOMAIN, "dra-harness-system")
    assert loaded.device_classes is False  # the manifests own the DeviceClasses
    assert set(loaded.profiles) == manifests.served_profiles(overlay)
    settings = next(d for d in docs if d["kind"] == "ConfigMap" and "domain" in d.get("data", {}))
    assert settings["data"] == {"instance": loaded.instance, "domain": loaded.domain}

    image = f"{manifests.IMAGE_NAME}:{harness.__version__}"
    controller = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert controller["securityContext"]["runAsNonRoot"] is True and controller["securityContext"]["runAsUser"] != 0
    (container,) = controller["containers"]
    assert container["image"] == image
    assert container["command"] == ["python", "-m", "fake_devices", "--config", "/etc/fake-devices/driver.yaml"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert controller["volumes"][0]["configMap"]["name"] == configmap["metadata"]["name"]
    assert controller["serviceAccountName"] == "fake-devices-controller"

    plugin = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert plugin["serviceAccountName"] == "fake-devices-kubelet-plugin"
    assert {v["hostPath"]["path"] for v in plugin["volumes"]} == HOST_PATHS
    (term,) = plugin["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression == {"key": PROFILE_LABEL, "operator": "In",
                          "values": sorted(manifests.served_profiles(overlay))}
    assert plugin["securityContext"]["runAsUser"] == 0
    drivers = []
    for c in plugin["containers"]:
        assert c["image"] == image and c["command"] == ["python", "-m", "fake_devices.kubeletplugin"]
        env = {e["name"]: e.get("valueFrom") for e in c["env"]}
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["DRIVER_DOMAIN"]["configMapKeyRef"]["name"] == settings["metadata"]["name"]
        assert "--node=$(NODE_NAME)" in c["args"] and "--instance=$(INSTANCE)" in c["args"]
        assert {m["mountPath"] for m in c["volumeMounts"]} == HOST_PATHS
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}}
        drivers += [a.split("=", 1)[1] for a in c["args"] if a.startswith("--driver=")]
    assert sorted(drivers) == ["gpu.$(DRIVER_DOMAIN)", "nic.$(DRIVER_DOMAIN)", "storage.$(DRIVER_DOMAIN)"]


def test_the_mixed_overlay_and_the_base_serve_every_built_in_profile(kubectl):
    from fake_devices import profile

    assert manifests.served_profiles("mixed") == set(profile.builtin_names())
    base = yaml.safe_load((REPO / "deploy" / "kustomize" / "base" / "driver.yaml").read_text())
    assert set(base["spec"]["profiles"]) == set(profile.builtin_names())


def test_device_classes_are_the_ones_the_controller_would_create(kubectl):
    """deviceClasses: false hands the classes to the manifests; they must not differ from the
    controller's own (names, selectors, label, extended resource), or kubectl and a driver started
    with deviceClasses: true would fight over them."""
    docs = _kustomize(kubectl, OVERLAYS / "mixed")
    rendered = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}
    definition = cluster.load("mixed")
    config = driver_config.DriverConfig(instance="fake", domain=manifests.DOMAIN, profiles=definition.profiles,
                                        extended_resources=dict(definition.driver.extended_resources))
    created = []

    class Recorder:
        def create_device_class(self, body):
            created.append(body)

    driver = FakeDriver(config, kubernetes.client.ApiClient())
    driver.resource = Recorder()
    driver.ensure_device_classes()
    assert {c["metadata"]["name"] for c in created} == set(rendered)  # mixed.yaml has every device type
    for body in created:
        mine = rendered[body["metadata"]["name"]]
        assert mine["spec"] == body["spec"], body["metadata"]["name"]
        assert mine["metadata"]["labels"][INSTANCE_LABEL] == body["metadata"]["labels"][INSTANCE_LABEL]


def test_the_image_tag_of_the_manifests_is_the_package_version():
    base = yaml.safe_load((REPO / "deploy" / "kustomize" / "base" / "kustomization.yaml").read_text())
    (image,) = base["images"]
    assert f"{image['newName']}:{image['newTag']}" == manifests.default_image()


def test_the_backends_kustomization_labels_everything_and_follows_the_definition(kubectl, tmp_path):
    definition = tmp_path / "c.yaml"
    definition.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\n"
                          "spec:\n  driver: {extendedResources: {nvme: example.com/nvme}}\n"
                          "  nodePools:\n  - {name: a, count: 1, profile: tiny}\n")
    deployment = manifests.Deployment.for_definition(
        cluster.load(str(definition)), image="registry.example:5000/team/fake-driver@sha256:" + "a" * 64,
        deployed_by="1e5", include_namespace=False)
    manifests.write_kustomization(deployment, tmp_path / "deploy")
    docs = _kustomize(kubectl, tmp_path / "deploy")
    assert "Namespace" not in {d["kind"] for d in docs}  # it existed before: not ours
    # "1e5" is a number to kustomize's YAML parser unless the generated file quotes it
    assert all(d["metadata"]["labels"][manifests.DEPLOYED_BY_LABEL] == "1e5" for d in docs)
    images = {c["image"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example:5000/team/fake-driver@sha256:" + "a" * 64}
    classes = {d["metadata"]["name"]: d["spec"].get("extendedResourceName") for d in docs if d["kind"] == "DeviceClass"}
    # The definition's extended resources replace the overlay's (mixed maps gpu -> example.com/gpu).
    assert classes == {"fake-gpu": None, "fake-mig": None, "fake-nvme": "example.com/nvme", "fake-pmem": None,
                       "fake-cxl-memory": None, "fake-nic": None}


# --- a unique copy of the manifests, for the API server ----------------------------------------------


def _unique_copy(kubectl: str, tmp_path: Path, overlay: str, suffix: str, namespace: str) -> list[dict]:
    """The overlay with `-<suffix>` on every name, every namespaced object (and the RBAC subjects) in
    `namespace`, and the admission policy matching the renamed plugin ServiceAccount."""
    directory = tmp_path / f"unique-{overlay}"
    directory.mkdir()
    plugin_user = f"system:serviceaccount:{namespace}:fake-devices-kubelet-plugin-{suffix}"
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAYS / overlay, directory)],
        "nameSuffix": f"-{suffix}",
        "transformers": [manifests.dump_yaml({
            "apiVersion": "builtin", "kind": "NamespaceTransformer",
            "metadata": {"name": "unique-namespace", "namespace": namespace},
            "setRoleBindingSubjects": "allServiceAccounts", "unsetOnly": False,
            "fieldSpecs": [{"path": "metadata/namespace", "create": True}]})],
        "patches": [{"target": {"kind": "ValidatingAdmissionPolicy"}, "patch": manifests.dump_yaml([
            {"op": "replace", "path": "/spec/matchConditions/0/expression",
             "value": f'request.userInfo.username == "{plugin_user}"'}])}],
    }
    (directory / "kustomization.yaml").write_text(manifests.dump_yaml(kustomization))
    docs = _kustomize(kubectl, directory)
    for doc in docs:  # the namespace transformer does not know these kinds are cluster-scoped
        if doc["kind"] in CLUSTER_SCOPED:
            doc["metadata"].pop("namespace", None)
    condition = _one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"]
    assert PLUGIN_USER not in condition and plugin_user in condition
    return docs


def _object_exists(kubectl: str, kubeconfig: Path, doc: dict) -> bool:
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    resource = doc["kind"].lower() + ("." + group if group else "")
    argv = [kubectl, f"--kubeconfig={kubeconfig}", "get", resource, doc["metadata"]["name"], "--ignore-not-found",
            "-o", "name"]
    if doc["kind"] not in CLUSTER_SCOPED:
        argv.append(f"--namespace={doc['metadata']['namespace']}")
    result = _run(argv)
    assert result.returncode == 0, result.stderr
    return bool(result.stdout.strip())


@pytest.fixture
def unique_namespace(k8s, kubectl, dra_cluster):
    """A namespace for one test's copy of the manifests, with the labels the Namespace object has."""
    suffix = _suffix()
    name = f"dra-harness-test-{suffix}"
    created = []

    def create(doc: dict) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": dict(doc["metadata"].get("labels", {}))}}
        k8s.core.create_namespace(body)
        created.append(name)

    yield suffix, name, create
    for namespace in created:
        wait.ignore_not_found(k8s.core.delete_namespace, namespace)


@pytest.mark.parametrize("overlay", manifests.OVERLAYS)
def test_server_side_dry_run_accepts_every_object_and_leaves_nothing(overlay, kubectl, dra_cluster, tmp_path,
                                                                      unique_namespace):
    suffix, namespace, create_namespace = unique_namespace
    docs = _unique_copy(kubectl, tmp_path, overlay, suffix, namespace)
    create_namespace(_one(docs, "Namespace"))  # namespaced objects need it, also in a dry run
    result = _run([kubectl, f"--kubeconfig={dra_cluster.kubeconfig}", "apply", "--dry-run=server", "-f", "-"],
                  stdin=_dump(docs))
    assert result.returncode == 0, f"the API server rejected the {overlay} manifests:\n{result.stderr}"
    lines = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(lines) == len(docs), result.stdout
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert not _object_exists(kubectl, dra_cluster.kubeconfig, doc), f"dry run created {doc['kind']}"


def test_the_dry_run_really_validates(kubectl, dra_cluster, tmp_path, unique_namespace):
    """The check above can fail: a manifest the API server refuses is reported."""
    suffix, namespace, create_namespace = unique_namespace
    docs = _unique_copy(kubectl, tmp_path, "mixed", suffix, namespace)
    create_namespace(_one(docs, "Namespace"))
    broken = _one(docs, "DaemonSet")
    broken["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["type"] = "NoSuchType"
    result = _run([kubectl, f"--kubeconfig={dra_cluster.kubeconfig}", "apply", "--dry-run=server", "-f", "-"],
                  stdin=_dump([broken]))
    assert result.returncode != 0
    assert "hostPath.type" in result.stderr and "NoSuchType" in result.stderr


# --- RBAC, for real ------------------------------------------------------------------------------------

RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@pytest.fixture(scope="module")
def installed_rbac(k8s, kubectl, dra_cluster, tmp_path_factory):
    """The ServiceAccounts, RBAC and admission policy of a unique copy of the mixed overlay, created
    for real; deleted (and checked gone) at the end of the module."""
    suffix = _suffix()
    namespace = f"dra-harness-test-{suffix}"
    docs = _unique_copy(kubectl, tmp_path_factory.mktemp("rbac"), "mixed", suffix, namespace)
    objects = [d for d in docs if d["kind"] in RBAC_KINDS]
    kubeconfig = f"--kubeconfig={dra_cluster.kubeconfig}"
    k8s.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace, "labels": _one(docs, "Namespace")["metadata"]["labels"]}})
    try:
        result = _run([kubectl, kubeconfig, "apply", "-f", "-"], stdin=_dump(objects))
        assert result.returncode == 0, result.stderr
        yield {"namespace": namespace, "suffix": suffix, "docs": docs,
               "controller": f"system:serviceaccount:{namespace}:fake-devices-controller-{suffix}",
               "plugin": f"system:serviceaccount:{namespace}:fake-devices-kubelet-plugin-{suffix}",
               "plugin_sa": f"fake-devices-kubelet-plugin-{suffix}"}
    finally:
        cluster_scoped = [d for d in objects if d["kind"] in CLUSTER_SCOPED]
        _run([kubectl, kubeconfig, "delete", "--ignore-not-found", "-f", "-"], stdin=_dump(cluster_scoped))
        wait.ignore_not_found(k8s.core.delete_namespace, namespace)
        left = [f"{d['kind']} {d['metadata']['name']}" for d in cluster_scoped
                if _object_exists(kubectl, dra_cluster.kubeconfig, d)]
        assert not left, f"not cleaned up: {left}"


# (who, verb, resource, namespace: "own" | "other" | None, allowed)
CAN_I = [
    ("controller", "list", "nodes", None, True),
    ("controller", "watch", "nodes", None, True),
    ("controller", "update", "nodes", None, False),
    ("controller", "delete", "nodes", None, False),
    ("controller", "create", "resourceslices", None, True),
    ("controller", "update", "resourceslices", None, True),
    ("controller", "delete", "resourceslices", None, True),
    ("controller", "watch", "resourceslices", None, True),
    ("controller", "get", "configmaps/fake-faults", "own", True),
    ("controller", "watch", "configmaps/fake-faults", "own", True),
    ("controller", "get", "configmaps/other-config", "own", False),
    ("controller", "list", "configmaps", "own", False),  # only with metadata.name=fake-faults
    ("controller", "update", "configmaps/fake-faults", "own", False),
    ("controller", "get", "configmaps/fake-faults", "other", False),
    ("controller", "create", "deviceclasses", None, False),  # the manifests own the classes
    ("controller", "get", "resourceclaims", "other", False),
    ("controller", "list", "secrets", "own", False),
    ("controller", "create", "pods", "own", False),
    ("plugin", "get", "resourceclaims", "other", True),  # claims live in users' namespaces
    ("plugin", "list", "resourceclaims", "other", False),
    ("plugin", "update", "resourceclaims", "other", False),
    ("plugin", "get", "resourceslices", None, True),
    ("plugin", "list", "resourceslices", None, True),
    ("plugin", "watch", "resourceslices", None, True),
    ("plugin", "create", "resourceslices", None, False),  # the controller publishes, never the plugin
    ("plugin", "update", "resourceslices", None, False),
    ("plugin", "patch", "resourceslices", None, False),
    ("plugin", "delete", "resourceslices", None, False),
    ("plugin", "get", "nodes", None, True),  # its own node's profile label
    ("plugin", "list", "nodes", None, False),
    ("plugin", "patch", "nodes", None, False),
    ("plugin", "get", "configmaps/fake-faults", "own", True),
    ("plugin", "watch", "configmaps/fake-faults", "own", True),
    ("plugin", "update", "configmaps/fake-faults", "own", False),
    ("plugin", "get", "configmaps/other-config", "own", False),
    ("plugin", "get", "secrets", "own", False),
    ("plugin", "create", "deviceclasses", None, False),
]


@pytest.mark.parametrize("who, verb, resource, where, allowed", CAN_I,
                         ids=[f"{w}-{v}-{r.replace('/', '.')}-{n or 'cluster'}" for w, v, r, n, _ in CAN_I])
def test_rbac_is_least_privilege(who, verb, resource, where, allowed, installed_rbac, kubectl, dra_cluster):
    argv = [kubectl, f"--kubeconfig={dra_cluster.kubeconfig}", "auth", "can-i", verb, resource,
            f"--as={installed_rbac[who]}"]
    if where == "own":
        argv.append(f"--namespace={installed_rbac['namespace']}")
    elif where == "other":
        argv.append("--namespace=default")
    result = _run(argv)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"{argv}: {result.stdout} {result.stderr}"
    assert (answer == "yes") == allowed, f"{who} may{'' if answer == 'yes' else ' not'} {verb} {resource} ({where})"


def test_plugin_status_updates_need_the_node_scoped_verb_it_is_not_given(installed_rbac, kubectl, dra_cluster):
    """Kubernetes 1.37's node-scoped verbs exist only for resourceclaims/driver (status.devices):
    the plugin writes no claim status, so it holds neither associated-node: nor arbitrary-node:."""
    for verb in ("associated-node:update", "arbitrary-node:update", "update"):
        result = _run([kubectl, f"--kubeconfig={dra_cluster.kubeconfig}", "auth", "can-i", verb, "resourceclaims",
                       "--subresource=driver", f"--as={installed_rbac['plugin']}", "--namespace=default"])
        assert result.stdout.strip() == "no", (verb, result.stdout, result.stderr)


# --- node scoping of ResourceSlice writes (the admission policy), with real tokens ----------------------


def _token_kubeconfig(admin_kubeconfig: Path, token: str, path: Path) -> Path:
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "token",
        "clusters": [{"name": "c", "cluster": cluster_entry["cluster"]}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "token", "context": {"cluster": "c", "user": "token"}}]}))
    path.chmod(0o600)
    return path


def _slice(name: str, node: str | None) -> str:
    spec = {"driver": f"gpu.{manifests.DOMAIN}", "pool": {"name": node or "all", "generation": 1,
                                                           "resourceSliceCount": 1}, "devices": []}
    spec.update({"nodeName": node} if node else {"allNodes": True})
    return yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                           "metadata": {"name": name}, "spec": spec})


def test_plugin_may_write_only_its_own_nodes_slices(installed_rbac, k8s, kubectl, dra_cluster, simulated_node,
                                                     tmp_path):
    namespace, suffix = installed_rbac["namespace"], installed_rbac["suffix"]
    admin = f"--kubeconfig={dra_cluster.kubeconfig}"
    # Grant slice writes for this test only, so that the request reaches admission at all.
    grant = f"dra-harness-test-slice-writer-{suffix}"
    grant_docs = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": grant},
         "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": grant},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": grant},
         "subjects": [{"kind": "ServiceAccount", "name": installed_rbac["plugin_sa"], "namespace": namespace}]}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin-token", "namespace": namespace},
           "spec": {"nodeName": simulated_node, "serviceAccountName": installed_rbac["plugin_sa"],
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
    try:
        assert _run([kubectl, admin, "apply", "-f", "-"], stdin=_dump(grant_docs + [pod])).returncode == 0
        token = _run([kubectl, admin, "create", "token", installed_rbac["plugin_sa"], f"--namespace={namespace}",
                      "--bound-object-kind=Pod", "--bound-object-name=plugin-token", "--duration=10m"])
        assert token.returncode == 0, token.stderr
        as_plugin = f"--kubeconfig={_token_kubeconfig(dra_cluster.kubeconfig, token.stdout.strip(), tmp_path / 'k')}"

        whoami = _run([kubectl, as_plugin, "auth", "whoami", "-o", "json"])
        assert whoami.returncode == 0, whoami.stderr
        user = json.loads(whoami.stdout)["status"]["userInfo"]
        assert user["username"] == installed_rbac["plugin"]
        assert user["extra"]["authentication.kubernetes.io/node-name"] == [simulated_node]

        def create(node: str | None, kubeconfig: str = as_plugin) -> subprocess.CompletedProcess:
            return _run([kubectl, kubeconfig, "create", "--dry-run=server", "-f", "-"],
                        stdin=_slice(f"scope-{suffix}", node))

        # The policy starts to apply once the API server has loaded it: wait for the first denial.
        denied = wait.until("the admission policy to deny another node's slice",
                            lambda: (lambda r: r if r.returncode != 0 and "ValidatingAdmissionPolicy" in r.stderr
                                     else None)(create("some-other-node")), timeout=60, interval=0.5)
        assert "may only write ResourceSlices of that node, not of node some-other-node" in denied.stderr
        own = create(simulated_node)
        assert own.returncode == 0, own.stderr
        everywhere = create(None)
        assert everywhere.returncode != 0 and "not slices without a node" in everywhere.stderr

        # A token that is not bound to a pod carries no node: refused, whatever the slice.
        unbound = _run([kubectl, admin, "create", "token", installed_rbac["plugin_sa"], f"--namespace={namespace}",
                        "--duration=10m"])
        as_unbound = f"--kubeconfig={_token_kubeconfig(dra_cluster.kubeconfig, unbound.stdout.strip(), tmp_path / 'u')}"
        refused = create(simulated_node, as_unbound)
        assert refused.returncode != 0 and "must use the token of a pod running on a node" in refused.stderr
    finally:
        _run([kubectl, admin, "delete", "--ignore-not-found", "--wait=false", "-f", "-"], stdin=_dump(grant_docs + [pod]))

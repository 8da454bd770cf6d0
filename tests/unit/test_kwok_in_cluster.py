"""KWOK's controller as deployed into a kind cluster (harness.backends.kwok.in_cluster): what it may do,
where it runs, which nodes it manages, and the offline image it runs from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.backends.kwok import in_cluster, nodes, stages
from harness.core.errors import ConfigError

LABELS = {"dra-harness.x-k8s.io/deployed-by": "ci"}
LABELS_SELECTOR = "dra-harness.x-k8s.io/deployed-by=ci"


def _by_kind(image: str = in_cluster.UPSTREAM_IMAGE) -> dict[str, dict]:
    return {o["kind"]: o for o in in_cluster.objects(image, LABELS)}


def test_every_object_carries_the_labels_of_the_cluster_that_deployed_it():
    objects = in_cluster.objects(in_cluster.UPSTREAM_IMAGE, LABELS)
    assert [o["kind"] for o in objects] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                            "ConfigMap", "Deployment"]
    assert all(o["metadata"]["labels"] == LABELS for o in objects)
    assert all(o["metadata"].get("namespace") in (None, in_cluster.NAMESPACE) for o in objects)
    # the rendered file holds the same objects
    assert list(yaml.safe_load_all(in_cluster.manifests_yaml(in_cluster.UPSTREAM_IMAGE, LABELS))) == objects


def test_the_controller_manages_only_annotated_nodes_with_the_local_backends_stages():
    objects = _by_kind()
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--manage-all-nodes=false" in container["args"]
    assert f"--manage-nodes-with-annotation-selector={nodes.KWOK_NODE_ANNOTATION}=fake" in container["args"]
    # the nodes the harness creates are those
    assert nodes.NodeSpec("n").manifest()["metadata"]["annotations"] == {nodes.KWOK_NODE_ANNOTATION: "fake"}
    assert objects["ConfigMap"]["data"]["kwok.yaml"] == stages.config_yaml()
    assert {"mountPath": "/etc/kwok", "name": "config", "readOnly": True} in container["volumeMounts"]
    assert "--config=/etc/kwok/kwok.yaml" in container["args"]


def test_the_controller_runs_on_the_control_plane_never_on_a_node_it_simulates():
    pod = _by_kind()["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {in_cluster.CONTROL_PLANE: ""}
    assert {"key": in_cluster.CONTROL_PLANE, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_deployment_selects_its_own_pods():
    deployment = _by_kind("dra-harness.local/kwok:v0.8.0-abc")["Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "dra-harness.local/kwok:v0.8.0-abc"


def test_its_rights_are_what_simulating_nodes_and_pods_takes_and_no_more():
    objects = _by_kind()
    granted = {(group, resource, verb) for rule in objects["ClusterRole"]["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    for needed in [("", "nodes", "watch"), ("", "nodes/status", "patch"), ("", "pods/status", "patch"),
                   ("", "pods", "delete"), ("coordination.k8s.io", "leases", "update"), ("", "events", "create")]:
        assert needed in granted
    for never in [("", "nodes", "delete"), ("", "nodes", "create"), ("", "secrets", "get"), ("", "pods", "create"),
                  ("coordination.k8s.io", "leases", "delete")]:
        assert never not in granted
    assert not any("*" in entry for entry in granted)
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": objects["ServiceAccount"]["metadata"]["name"],
                                    "namespace": in_cluster.NAMESPACE}]


def test_fake_pod_addresses_stay_outside_kinds_pod_and_service_ranges():
    import ipaddress

    fake = ipaddress.ip_network(in_cluster.POD_CIDR, strict=False)
    for kinds in ("10.244.0.0/16", "10.96.0.0/12"):
        assert not fake.overlaps(ipaddress.ip_network(kinds))


def test_the_offline_image_is_named_after_the_binary_and_mirrors_kwoks_own(tmp_path):
    binary = tmp_path / "kwok"
    binary.write_bytes(b"\x7fELF one build")
    first = in_cluster.local_image(binary)
    assert first.startswith(f"{in_cluster.LOCAL_REPOSITORY}:v") and first != in_cluster.UPSTREAM_IMAGE
    binary.write_bytes(b"\x7fELF another build")
    assert in_cluster.local_image(binary) != first  # a rebuilt binary is a new image, never a stale one
    context = tmp_path / "context"
    in_cluster.write_build_context(context, binary)
    assert (context / "kwok").read_bytes() == binary.read_bytes()
    dockerfile = (context / "Dockerfile").read_text()
    assert "FROM scratch" in dockerfile  # nothing to pull
    assert 'ENTRYPOINT ["/usr/local/bin/kwok"]' in dockerfile  # as in registry.k8s.io/kwok/kwok


def test_on_your_cluster_the_controller_may_run_on_any_real_node():
    pod = {o["kind"]: o for o in in_cluster.objects(in_cluster.UPSTREAM_IMAGE, LABELS, on_control_plane=False)
           }["Deployment"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod  # a managed control plane runs no pods
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}]
    assert nodes.NodeSpec("n").manifest()["metadata"]["labels"]["type"] == "kwok"  # what the affinity keeps out


def test_the_nodes_carry_the_label_down_deletes_them_by():
    specs = in_cluster.node_specs(3, "ci-kwok", LABELS)
    assert [s.name for s in specs] == ["ci-kwok-0", "ci-kwok-1", "ci-kwok-2"]
    for spec in specs:
        labels = spec.manifest()["metadata"]["labels"]
        assert labels.items() >= {**LABELS, nodes.MANAGED_LABEL: "true"}.items()
        assert labels["topology.kubernetes.io/zone"] in nodes.ZONES


def test_down_deletes_only_what_this_cluster_made_nodes_first():
    steps = [str(s) for s in in_cluster.delete_steps("kubectl", Path("/k"), "ci")]
    assert len(steps) == 3 and steps[0].startswith("kubectl --kubeconfig=/k delete --ignore-not-found --wait nodes")
    assert f"--selector={LABELS_SELECTOR},{nodes.MANAGED_LABEL}=true" in steps[0]
    assert all(f"--selector={LABELS_SELECTOR}" in s for s in steps)
    assert "--field-selector=metadata.name=dra-harness:kwok-controller" in steps[2]  # not the driver's roles
    assert f"--field-selector=metadata.name={in_cluster.NAMESPACE}" in steps[1]  # not the driver's namespace


@pytest.mark.parametrize("count, image, located", [
    (-1, None, "--simulated-nodes: -1: out of range"),
    (in_cluster.MAX_NODES + 1, None, f"--simulated-nodes: {in_cluster.MAX_NODES + 1}: out of range"),
    (0, in_cluster.UPSTREAM_IMAGE, "--kwok-image: registry.k8s.io/kwok/kwok:v0.8.0: has no effect"),
    (2, "Bad Image", "--kwok-image: Bad Image: not an image reference"),
])
def test_bad_requests_are_located(count, image, located):
    with pytest.raises(ConfigError) as err:
        in_cluster.check_request(count, image)
    assert located in str(err.value)

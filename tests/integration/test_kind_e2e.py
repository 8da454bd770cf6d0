"""The whole kind path, end to end: `cluster up --backend kind` builds the driver image, creates a kind
cluster with real kubelets, loads the image, deploys the manifests and waits for the slices; then a
pod gets a fake GPU through a real kubelet, the kubelet plugin and CDI; a fault turns into a taint;
`cluster down` leaves nothing.

Opt-in (DRA_HARNESS_KIND_E2E=1): a Docker engine (>= 28) or a machine where the harness can start
its own (root on Debian, docs/kind-and-existing.md), and kind >= v0.33.0 on PATH or in the cache
(`dra-harness binaries install --kind`). Without a registry the node image and the driver's base are
built offline. Runs in .github/workflows/kind-e2e.yaml.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import kind_leaks
import pytest
from cli_runs import run_to_end

from fake_devices import render
from harness.backends import manifests
from harness.backends.kind import backend as kind
from harness.backends.kwok import nodes as kwok_nodes
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.k8s.nodes import is_ready

pytestmark = [pytest.mark.integration, pytest.mark.kind_e2e]


WHY_NOT = kind_leaks.why_not("builds the images and starts a kind cluster, minutes")
DEFINITION = """\
apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: Cluster
metadata: {name: e2e}
spec:
  nodePools:
  - {name: tiny, count: 1, profile: tiny}
  - {name: cpu, count: 1}
"""


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # The default state directory: the harness's own dockerd (if it starts one) is the machine's one,
    # which the leak check looks at; the cluster's name is this test's own.
    env = dict(os.environ)
    return run_to_end([sys.executable, "-m", "harness.cli", *args], timeout, capture=True, env=env)


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_kind_cluster_runs_the_fake_driver_end_to_end(tmp_path):
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    before = kind_leaks.Before(name)
    (tmp_path / "e2e.yaml").write_text(DEFINITION)
    up = _cli("cluster", "up", "--backend", "kind", "--config", str(tmp_path / "e2e.yaml"), "--name", name,
              timeout=2400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        kubeconfig = kind.state_dir(name) / "kubeconfig"
        assert f"export KUBECONFIG={kubeconfig}" in up.stdout
        clients = Clients(kubeconfig)
        try:
            _check_cluster(clients, name)
            _check_a_pod_gets_a_fake_gpu(clients, name)
            _check_a_fault_becomes_a_taint(clients, kubeconfig, f"{name}-worker")
        finally:
            clients.close()
        status = _cli("cluster", "status", "--backend", "kind", "--name", name)
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        down = _cli("cluster", "down", "--backend", "kind", "--name", name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not kind.state_dir(name).exists()
    assert before.leaks() == [], down.stdout + down.stderr


def _check_cluster(clients: Clients, name: str) -> None:
    assert clients.version.get_code().git_version.startswith("v1.37.")
    listed = clients.core.list_node().items
    simulated = {n.metadata.name: n for n in listed
                 if (n.metadata.annotations or {}).get(kwok_nodes.KWOK_NODE_ANNOTATION) == "fake"}
    nodes = {n.metadata.name: n.metadata.labels for n in listed if n.metadata.name not in simulated}
    assert set(nodes) == {f"{name}-control-plane", f"{name}-worker", f"{name}-worker2"}
    # beside kind's nodes, the default 3 simulated ones, kept Ready by KWOK's controller inside the cluster
    assert sorted(simulated) == [f"{kind.SIMULATED_NODE_PREFIX}-{i}" for i in range(kind.SIMULATED_NODES)]
    assert all(is_ready(n) and n.metadata.labels[manifests.DEPLOYED_BY_LABEL] == name for n in simulated.values())
    assert nodes[f"{name}-worker"]["dra-harness.x-k8s.io/profile"] == "tiny"
    assert "dra-harness.x-k8s.io/profile" not in nodes[f"{name}-worker2"]
    slices = clients.resource.list_resource_slice(field_selector=f"spec.nodeName={name}-worker").items
    assert {s.spec.driver for s in slices} == set(render.Drivers(manifests.DOMAIN).all())
    # The plugin pod runs only where there are devices, and is ready (both sockets served).
    pods = clients.core.list_namespaced_pod(manifests.NAMESPACE,
                                            label_selector="app.kubernetes.io/component=kubelet-plugin").items
    assert [p.spec.node_name for p in pods] == [f"{name}-worker"]
    assert all(c.ready for p in pods for c in p.status.container_statuses)


def _check_a_pod_gets_a_fake_gpu(clients: Clients, name: str) -> None:
    """Scheduler allocates, the kubelet calls the plugin's NodePrepareResources, containerd applies the
    CDI spec: the container sees the allocated device in its environment."""
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    clients.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        wait.service_account_ready(clients, namespace, timeout=60)
        clients.resource.create_namespaced_resource_claim_template(namespace, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "fake-gpu"}}]}}}})
        clients.core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "uses-a-gpu"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                     "containers": [{"name": "c", "image": manifests.default_image(), "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env | grep '^DRA_' | sort; sleep 3600"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})
        # The container stays up: once a pod is done, the claim made from its template is deleted.
        pod = wait.pod_phase(clients, namespace, "uses-a-gpu", "Running", timeout=300)
        assert pod.spec.node_name == f"{name}-worker"
        log = wait.until("the container to print its DRA_ environment",
                         lambda: clients.core.read_namespaced_pod_log("uses-a-gpu", namespace).strip(), timeout=60,
                         interval=1.0)
        claim = clients.resource.list_namespaced_resource_claim(namespace).items[0]
        (result,) = claim.status.allocation.devices.results
        env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
        assert f"gpu.{manifests.DOMAIN}" in {v for k, v in env.items() if k.endswith("_DRIVER")}, log
        assert result.device in {v for k, v in env.items() if k.endswith("_DEVICE")}, log
    finally:
        wait.ignore_not_found(clients.core.delete_namespace, namespace)


def _check_a_fault_becomes_a_taint(clients: Clients, kubeconfig: Path, node: str) -> None:
    """The controller in its pod watches the fault ConfigMap (its RBAC allows exactly that)."""
    inject = _cli("fault", "inject", "--kubeconfig", str(kubeconfig), "--node", node, "--device", "gpu-1",
                  "--kind", "degraded")
    assert inject.returncode == 0, inject.stderr

    def tainted():
        for item in clients.resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
            data = clients.api_client.sanitize_for_serialization(item)
            for device in data["spec"].get("devices", []):
                if device["name"] == "gpu-1" and any(t["key"] == render.FAULT_TAINT_KEY for t in device.get("taints", [])):
                    return device["taints"]
        return None

    taints = wait.until("the fault to show up as a device taint", tainted, timeout=120, interval=1.0)
    assert taints[0]["effect"] == "NoSchedule"

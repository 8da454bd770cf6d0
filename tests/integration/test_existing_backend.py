"""`cluster up --backend existing` against the local 1.37 cluster, through the command line.

The manifests are applied for real (their pods run on KWOK nodes, so they are scheduled and marked
ready but execute nothing); what is checked is the backend's part: every object labelled, a second
install refused, `up` waiting for every labelled node's slices, and `down` removing exactly what `up`
created (a namespace that existed before stays, with what was in it), with --no-deploy touching
nothing. The manifests use fixed names (dra-harness-system, ClusterRoles), so everything runs in one
test, in phases.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from conformance import objects
from fake_devices import config as driver_config
from fake_devices.controller import INSTANCE_LABEL, FakeDriver
from harness.backends import manifests
from harness.k8s import wait
from harness.pytest_plugin import plugin

pytestmark = pytest.mark.integration


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRA_HARNESS_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900)


def _namespace_exists(k8s) -> bool:
    try:
        k8s.core.read_namespace(manifests.NAMESPACE)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def _fake_slices(k8s) -> list[str]:
    return [s.metadata.name for s in k8s.resource.list_resource_slice(
        label_selector=f"{manifests.INSTANCE_LABEL}={manifests.INSTANCE}").items]


def test_existing_backend_deploys_labels_waits_and_removes_only_its_own(k8s, dra_cluster, tmp_path):
    if _namespace_exists(k8s):
        pytest.skip(f"namespace {manifests.NAMESPACE} is in use on this cluster (a fake driver is deployed there)")
    state = tmp_path / "state"
    suffix = uuid.uuid4().hex[:6]
    name, other = f"ex-{suffix}", f"ex2-{suffix}"
    kubeconfig = str(dra_cluster.kubeconfig)
    definition = tmp_path / "c.yaml"
    definition.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\n"
                          "spec:\n  nodePools:\n  - {name: a, count: 1, profile: tiny}\n")
    # A labelled Node object that KWOK does not manage: never Ready, so no other test (which look for
    # Ready KWOK nodes) picks it up while it exists; the slice wait only looks at labels.
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"ex-node-{suffix}", "labels": {"dra-harness.x-k8s.io/profile": "tiny"}}}
    driver = None
    try:
        # --- phase 1: a cluster without the namespace -------------------------------------------------
        up = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", kubeconfig, "--name", name,
                  "--config", str(definition))
        assert up.returncode == 0, up.stderr
        assert f"cluster {name!r} is up" in up.stdout and f"export KUBECONFIG={kubeconfig}" in up.stdout
        rendered = (state / "existing" / name / "manifests.yaml").read_text()
        assert "kind: Namespace" in rendered
        namespace = k8s.core.read_namespace(manifests.NAMESPACE)
        assert namespace.metadata.labels[manifests.DEPLOYED_BY_LABEL] == name
        classes = {c.metadata.name: c for c in k8s.resource.list_device_class(
            label_selector=f"{manifests.DEPLOYED_BY_LABEL}={name}").items}
        assert set(classes) == {"fake-gpu", "fake-mig", "fake-nvme", "fake-pmem", "fake-cxl-memory", "fake-nic"}
        assert classes["fake-gpu"].spec.extended_resource_name is None  # the definition maps none

        status = _cli(state, "cluster", "status", "--backend", "existing", "--name", name, "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["health"] == "running" and report["details"]["namespaceOwned"] is True
        assert [c["alive"] for c in report["components"]] == [True, True]

        second = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", kubeconfig, "--name", other)
        assert second.returncode == 1
        assert f"the fake driver is already installed on this cluster (by `cluster up --name {name}`)" in second.stderr

        # `up` waits for the slices of every labelled node the overlay serves: without a driver the
        # wait runs into its deadline and says which pools are missing; with one it returns.
        k8s.core.create_node(node)
        with pytest.raises(wait.WaitTimeout) as err:
            manifests.wait_published(k8s, {"tiny"}, timeout=3)
        assert f"node {node['metadata']['name']}, driver gpu.{manifests.DOMAIN}" in str(err.value)
        config = driver_config.build(manifests.INSTANCE, manifests.DOMAIN, ["tiny"],
                                     nodes={node["metadata"]["name"]: "tiny"}, device_classes=False)
        driver = FakeDriver(config, k8s.api_client).start()
        assert manifests.wait_published(k8s, {"tiny"}, timeout=60) == 3  # gpu, storage, nic pools
        driver.stop()  # its slices stay: `down` must remove them
        driver = None
        assert _fake_slices(k8s)

        down = _cli(state, "cluster", "down", "--backend", "existing", "--name", name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"cluster {name!r} is down" in down.stdout
        assert manifests.leftovers(k8s, name) == []
        assert not _namespace_exists(k8s)
        assert _fake_slices(k8s) == []
        assert not (state / "existing" / name).exists()
        k8s.core.delete_node(node["metadata"]["name"])  # a labelled node without a driver would stall phase 2's up

        # --- phase 2: the namespace was there before: it stays, with what is in it ---------------------
        k8s.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": manifests.NAMESPACE}})
        k8s.core.create_namespaced_config_map(manifests.NAMESPACE, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "user-data"}, "data": {"a": "b"}})
        up = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", kubeconfig, "--name", name)
        assert up.returncode == 0, up.stderr
        assert "kind: Namespace" not in (state / "existing" / name / "manifests.yaml").read_text()
        assert manifests.DEPLOYED_BY_LABEL not in (k8s.core.read_namespace(manifests.NAMESPACE).metadata.labels or {})
        gpu = k8s.resource.read_device_class("fake-gpu")
        assert gpu.spec.extended_resource_name == "example.com/gpu"  # no definition: the mixed overlay as is
        down = _cli(state, "cluster", "down", "--backend", "existing", "--name", name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert manifests.leftovers(k8s, name) == []
        assert k8s.core.read_namespaced_config_map("user-data", manifests.NAMESPACE).data == {"a": "b"}
        k8s.core.delete_namespace(manifests.NAMESPACE)
        wait.until("the namespace to go", lambda: not _namespace_exists(k8s), timeout=120)

        # --- phase 3: --no-deploy records the cluster and touches nothing ------------------------------
        up = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", kubeconfig, "--name", name,
                  "--no-deploy")
        assert up.returncode == 0, up.stderr
        assert not _namespace_exists(k8s)
        listed = _cli(state, "cluster", "list", "--backend", "existing", "--json")
        assert [row["name"] for row in json.loads(listed.stdout)] == [name]
        assert json.loads(listed.stdout)[0]["health"] == "running"
        kubeconfig_out = _cli(state, "cluster", "kubeconfig", "--backend", "existing", "--name", name)
        assert kubeconfig_out.stdout.strip() == kubeconfig
        started = time.monotonic()
        down = _cli(state, "cluster", "down", "--backend", "existing", "--name", name)
        assert down.returncode == 0 and not (state / "existing" / name).exists()
        assert time.monotonic() - started < 60  # nothing to delete: no kubectl runs
    finally:
        if driver is not None:
            driver.stop()
        for leftover in (name, other):
            if (state / "existing" / leftover).exists():
                _cli(state, "cluster", "down", "--backend", "existing", "--name", leftover)
        wait.ignore_not_found(k8s.core.delete_node, node["metadata"]["name"])
        for item in k8s.resource.list_resource_slice(
                label_selector=f"{manifests.INSTANCE_LABEL}={manifests.INSTANCE}").items:
            wait.ignore_not_found(k8s.resource.delete_resource_slice, item.metadata.name)
        if _namespace_exists(k8s) and not manifests.leftovers(k8s, name):
            wait.ignore_not_found(k8s.core.delete_namespace, manifests.NAMESPACE)


def test_existing_backend_bad_input_is_located(tmp_path):
    state = tmp_path / "state"
    missing = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert f"--kubeconfig: {tmp_path / 'nope'}: no such file" in missing.stderr
    garbage = tmp_path / "garbage"
    garbage.write_text("not: [a kubeconfig")
    bad = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", str(garbage))
    assert bad.returncode == 2 and f"--kubeconfig {garbage}: (file): not YAML" in bad.stderr
    image = _cli(state, "cluster", "up", "--backend", "existing", "--kubeconfig", str(garbage), "--no-deploy",
                 "--driver-image", "x:1")
    assert image.returncode == 2 and "--driver-image" in image.stderr
    unknown = _cli(state, "cluster", "down", "--backend", "existing", "--name", "never-made")
    # nothing to take down is not an error: `down` is safe to repeat
    assert unknown.returncode == 0 and "no existing-cluster entry named 'never-made'" in unknown.stdout + unknown.stderr


def _made_by_run(k8s, run_id: str) -> dict[str, set[str]]:
    """What a run of the suite (its run id) made that is still in the cluster: every object the plugin
    names or labels with the run id (namespaces, nodes, classes, slices of its fake-driver instances)."""
    mark = run_id[:5]  # unique_name() puts the id's first 5 characters into every name it makes

    def ours(obj) -> bool:
        labels = obj.metadata.labels or {}
        return f"-{mark}-" in obj.metadata.name or labels.get(plugin.RUN_ID_LABEL) == run_id \
            or f"-{mark}-" in labels.get(INSTANCE_LABEL, "")

    return {"namespaces": {n.metadata.name for n in k8s.core.list_namespace().items if ours(n)},
            "nodes": {n.metadata.name for n in k8s.core.list_node().items if ours(n)},
            "classes": {c.metadata.name for c in k8s.resource.list_device_class().items if ours(c)},
            "slices": {s.metadata.name for s in k8s.resource.list_resource_slice().items if ours(s)}}


def test_run_on_a_given_cluster_tests_it_and_leaves_it_as_it_was(k8s, dra_cluster, tmp_path, unique_name,
                                                                 simulated_node):
    """`dra-harness run --backend existing --kubeconfig K`: the suite runs against K through the
    cluster record (no cluster is started or stopped), removes everything its tests made, and touches
    nothing it did not make. Other tests share this cluster meanwhile, so the check is by the run's own
    id, and by bystanders of this test's that must still be there afterwards."""
    bystander = unique_name("bystander")
    k8s.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": bystander}})
    k8s.resource.create_device_class(objects.device_class(bystander, f"{bystander}.example.com"))
    k8s.resource.create_resource_slice(objects.resource_slice(bystander, f"{bystander}.example.com", simulated_node,
                                                              [objects.gpu_device("gpu-0")]))
    try:
        reports = tmp_path / "reports"
        result = _cli(tmp_path / "state", "run", "--backend", "existing", "--kubeconfig",
                      str(dra_cluster.kubeconfig), "--report-dir", str(reports), "-n", "0", "--", "-k",
                      "test_claim_has_at_most_32_requests")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 passed, 0 failed" in result.stdout, result.stdout
        record = json.loads((reports / "cluster.json").read_text())
        assert record["backend"] == "existing" and record["kubeconfig"] == str(dra_cluster.kubeconfig)
        assert record["server"] == dra_cluster.server
        assert not (tmp_path / "state" / "clusters").exists()  # nothing was started
        found = re.search(r"dra-harness: .* run-id=([0-9a-f]{8})", result.stdout)
        assert found, f"the suite's report header (its run id) is not in the output:\n{result.stdout[-3000:]}"
        run_id = found.group(1)
        left: dict[str, set[str]] = {}

        def nothing_left() -> bool:  # the test's namespace is deleted at teardown; it may still be terminating
            nonlocal left
            left = {kind: names for kind, names in _made_by_run(k8s, run_id).items() if names}
            return not left

        wait.until(f"the objects of run {run_id} to be gone", nothing_left, 120,
                   diagnostics=lambda: f"left by run {run_id}: {left}")
        assert k8s.core.read_namespace(bystander).status.phase == "Active"
        assert k8s.resource.read_device_class(bystander).metadata.name == bystander
        assert k8s.resource.read_resource_slice(bystander).spec.devices[0].name == "gpu-0"
    finally:
        wait.ignore_not_found(k8s.resource.delete_resource_slice, bystander)
        wait.ignore_not_found(k8s.resource.delete_device_class, bystander)
        wait.ignore_not_found(k8s.core.delete_namespace, bystander)

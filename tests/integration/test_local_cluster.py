"""The local backend against the real 1.37 binaries: what a started cluster serves, and that
stopping, crashing and interrupting it leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conformance import objects
from harness import binaries
from harness.backends.local import process, state
from harness.backends.local.backend import LocalBackend, UpOptions
from harness.backends.local.ports import listening
from harness.k8s import wait
from harness.k8s.client import Clients, https_get
from harness.k8s.nodes import KWOK_NOT_STARTED_LABEL

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local_cluster(dra_cluster):
    if dra_cluster.backend != "local" and not state.cluster_dir(dra_cluster.name).exists():
        pytest.skip("checks the local backend itself; the cluster under test is not a local one")
    return dra_cluster


def _feature_metrics(k8s: Clients) -> dict[str, int]:
    values = {}
    for line in k8s.get_raw("/metrics").splitlines():
        if line.startswith("kubernetes_feature_enabled{"):
            name = line.split('name="', 1)[1].split('"', 1)[0]
            values[name] = int(float(line.rsplit(" ", 1)[1]))
    return values


def _served_group_versions(k8s: Clients) -> set[str]:
    groups = json.loads(k8s.get_raw("/apis"))["groups"]
    return {v["groupVersion"] for g in groups for v in g["versions"]}


def test_cluster_serves_1_37_with_the_dra_gates(local_cluster, k8s: Clients):
    assert k8s.version.get_code().git_version == "v1.37.2"
    kubectl = binaries.locate().path("kubectl")
    out = subprocess.run([str(kubectl), "version", f"--kubeconfig={local_cluster.kubeconfig}"],
                         capture_output=True, text=True, timeout=30).stdout
    assert "Server Version: v1.37.2" in out

    gates = _feature_metrics(k8s)
    for gate in ("DRAWorkloadResourceClaims", "GenericWorkload", "SchedulerPreQueueingHints"):
        assert gates.get(gate) == 1, f"{gate} is not enabled: {gates.get(gate)}"
    served = _served_group_versions(k8s)
    assert {"resource.k8s.io/v1", "resource.k8s.io/v1beta2", "scheduling.k8s.io/v1beta1"} <= served


def test_kwok_starts_bound_pods_but_not_those_labelled_not_started(local_cluster, k8s: Clients, dra_namespace,
                                                                   simulated_node):
    """The load tests' burst pods stay bound and Pending (no status write per pod), as scheduler_perf's."""
    held = objects.pod("held", [objects.container("main")])
    held["metadata"]["labels"] = {KWOK_NOT_STARTED_LABEL: "true"}
    started = objects.pod("started", [objects.container("main")])
    for body in (held, started):  # the held one first: KWOK sees it before the one whose start is awaited
        body["spec"]["nodeName"] = simulated_node
        k8s.core.create_namespaced_pod(dra_namespace, body)
    wait.pod_phase(k8s, dra_namespace, "started", "Running", timeout=60)
    pod = k8s.core.read_namespaced_pod("held", dra_namespace)
    assert (pod.spec.node_name, pod.status.phase, pod.status.start_time) == (simulated_node, "Pending", None)


def test_component_metrics_open_with_the_kubeconfig_credentials(local_cluster, k8s: Clients):
    for component, url in local_cluster.metrics.items():
        body = k8s.get_raw("", server=url)
        assert "# TYPE" in body, component
        # ...and stay closed to anyone without them.
        status, _ = https_get(url, _anonymous_tls())
        assert status in (401, 403), f"{component} /metrics answered {status} without credentials"
    scheduler = k8s.get_raw("", server=local_cluster.metrics["kube-scheduler"])
    assert "scheduler_pending_pods" in scheduler


def _anonymous_tls():
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def test_second_cluster_runs_beside_and_goes_without_trace(local_cluster, dra_run_id):
    backend = LocalBackend()
    name = f"it-{dra_run_id[:6]}-{os.getpid()}"
    info = backend.up(UpOptions(name=name, nodes=2, preset="ga-only"))
    directory = state.cluster_dir(name)
    try:
        mine = set(state.load(name).ports.values())
        theirs = set(state.load(local_cluster.name).ports.values()) if state.cluster_dir(local_cluster.name).exists() \
            else set()
        assert mine and not (mine & theirs)
        assert backend.status(name).health == "running"

        clients = Clients(info.kubeconfig)
        try:
            assert _feature_metrics(clients).get("DRAWorkloadResourceClaims") == 0  # stock 1.37 default
            assert "scheduling.k8s.io/v1beta1" not in _served_group_versions(clients)
            assert len([n for n in clients.core.list_node().items]) == 2
        finally:
            clients.close()

        # A component that dies is restarted by the cluster's supervisor, and status counts it.
        scheduler = process.recorded(directory)["kube-scheduler"]
        assert process.alive(process.recorded(directory)["supervisor"])
        os.kill(scheduler.pid, signal.SIGKILL)

        def restarted():
            status = backend.status(name)
            entry = {c.name: c for c in status.components}["kube-scheduler"]
            return status.health == "running" and entry.alive and entry.pid != scheduler.pid and entry.restarts == 1
        wait.until("the supervisor to restart the killed scheduler", restarted, 60,
                   diagnostics=lambda: process.tail(directory / "logs" / "supervisor.log"))
        # One it may not restart (the supervisor gone too) makes the cluster "broken"; `down` still
        # cleans everything.
        process.stop_named(directory, ["supervisor"])
        os.kill(process.recorded(directory)["kube-scheduler"].pid, signal.SIGKILL)
        wait.until("status to report the dead scheduler",
                   lambda: backend.status(name).health == "broken", 10)
        pids = [r.pid for r in process.recorded(directory).values()]
    finally:
        leftovers = backend.down(name)
    assert leftovers == []
    assert not directory.exists()
    assert process.processes_of(directory) == []
    assert listening(sorted(mine)) == []
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_interrupted_up_leaves_nothing(local_cluster, dra_run_id, sig):
    name = f"int-{dra_run_id[:6]}-{sig.name.lower()[3:]}"
    directory = state.cluster_dir(name)
    proc = _cli("cluster", "up", "--name", name, "--nodes", "1")
    try:
        # Interrupt in the middle: once the apiserver has been started.
        wait.until("the apiserver to be started", lambda: (directory / "pids" / "kube-apiserver.json").exists()
                   or proc.poll() is not None, 60)
        assert proc.poll() is None, "cluster up finished before it could be interrupted"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err  # 130 for Ctrl-C, 143 for SIGTERM
    assert "interrupted" in err
    assert not directory.exists()
    assert process.processes_of(directory) == []


def test_component_that_fails_to_start_is_named_with_its_log(local_cluster, tmp_path, dra_run_id):
    real = binaries.locate()
    broken = tmp_path / "bin"
    broken.mkdir()
    for binary in binaries.ALL_BINARIES:
        (broken / binary).symlink_to(real.path(binary))
    (broken / "kube-scheduler").unlink()
    (broken / "kube-scheduler").write_text("#!/bin/sh\necho 'simulated scheduler failure' >&2\nexit 3\n")
    (broken / "kube-scheduler").chmod(0o755)
    name = f"fail-{dra_run_id[:6]}"
    proc = _cli("cluster", "up", "--name", name, "--nodes", "1", "--binaries-dir", str(broken))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "kube-scheduler: exited during start with code 3" in err
    assert "simulated scheduler failure" in err
    assert "kube-scheduler.log" in err
    assert "Traceback" not in err + out
    assert not state.cluster_dir(name).exists()
    assert process.processes_of(state.cluster_dir(name)) == []


def test_port_taken_by_another_program_names_the_component(local_cluster, dra_run_id, monkeypatch):
    import socket

    from harness.backends.local import ports
    from harness.core.errors import ComponentError

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_allocate = ports.allocate

    def allocate_with_a_taken_apiserver_port(names, reserved=frozenset(), rng=None, holder=None):
        chosen = real_allocate(names, reserved, rng, holder)
        chosen["kube-apiserver"] = taken
        return chosen

    monkeypatch.setattr(ports, "allocate", allocate_with_a_taken_apiserver_port)
    name = f"port-{dra_run_id[:6]}"
    try:
        with pytest.raises(ComponentError) as failure:
            LocalBackend().up(UpOptions(name=name, nodes=1))
    finally:
        squatter.close()
    assert failure.value.component == "kube-apiserver"
    assert "address already in use" in str(failure.value)
    assert str(failure.value.log_file).endswith("kube-apiserver.log")
    assert not state.cluster_dir(name).exists()
    assert process.processes_of(state.cluster_dir(name)) == []


def test_cluster_definition_brings_pools_and_a_publishing_driver(local_cluster, dra_run_id, tmp_path):
    from harness.config import cluster as cluster_config

    definition_file = tmp_path / "small.yaml"
    definition_file.write_text("""
apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: Cluster
metadata: {name: small}
spec:
  preset: ga-only
  featureGates: {DRAConsumableCapacity: true}
  driver: {instance: small, domain: small.example.com, extendedResources: {gpu: example.com/gpu}}
  nodePools:
  - {name: gpu, count: 2, profile: tiny, labels: {tier: test}}
  - {name: cpu, count: 1}
""")
    definition = cluster_config.load(str(definition_file))
    backend = LocalBackend()
    name = f"def-{dra_run_id[:6]}"
    info = backend.up(UpOptions(name=name, definition=definition))
    directory = state.cluster_dir(name)
    try:
        clients = Clients(info.kubeconfig)
        try:
            labelled = {n.metadata.name: n.metadata.labels for n in clients.core.list_node().items}
            assert sorted(labelled) == ["cpu-0", "gpu-0", "gpu-1"]
            assert labelled["gpu-0"]["tier"] == "test"
            assert labelled["gpu-1"]["dra-harness.x-k8s.io/profile"] == "tiny"
            assert "dra-harness.x-k8s.io/profile" not in labelled["cpu-0"]
            slices = clients.resource.list_resource_slice().items
            assert sorted((s.spec.node_name, s.spec.driver) for s in slices) == sorted(
                (node, f"{kind}.small.example.com") for node in ("gpu-0", "gpu-1") for kind in ("gpu", "nic", "storage"))
            classes = {c.metadata.name: c for c in clients.resource.list_device_class().items}
            assert set(classes) == {"small-gpu", "small-nvme", "small-nic"}
            assert classes["small-gpu"].spec.extended_resource_name == "example.com/gpu"
            gates = _feature_metrics(clients)
            assert gates["DRAConsumableCapacity"] == 1 and gates.get("DRAWorkloadResourceClaims") == 0
        finally:
            clients.close()
        assert "fake-devices" in {c.name for c in backend.status(name).components if c.alive}
    finally:
        assert backend.down(name) == []
    assert process.processes_of(directory) == []

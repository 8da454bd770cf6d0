"""A real node (kubelet v1.37.2 + containerd) in a local cluster of its own: it runs a container,
and stopping it, crashing it or interrupting its start leaves nothing on the machine: no process,
mount, bridge, cgroup, directory, iptables rule, and every kernel setting back as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from conformance import objects
from harness.backends.local import process, state
from harness.backends.local.backend import LocalBackend, UpOptions
from harness.backends.local.realnode import cgroups, host, images, kubelet, network, preflight, teardown
from harness.binaries.noderuntime import CONTAINERD_VERSION
from harness.core.nodelayout import node_id, node_root, records
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def real_node_machine(dra_cluster):
    if dra_cluster.backend != "local" and not state.cluster_dir(dra_cluster.name).exists():
        pytest.skip("checks the local backend itself; the cluster under test is not a local one")
    problems = preflight.problems()
    if problems:
        pytest.skip("this machine cannot run a real node: " + "; ".join(problems))


def _settings() -> dict:
    """The machine-wide settings a kubelet may change (iptables without packet counters)."""
    snap = host.snapshot()
    rules = {binary: {table: sorted(line.split(" [")[0] for line in lines) for table, lines in tables.items()}
             for binary, tables in snap["iptables"].items()}
    return {"sysctls": snap["sysctls"], "iptables": rules}


def _other_real_node_users(name: str) -> list[str]:
    return [o for o in host.owners() if o != os.path.abspath(state.cluster_dir(name))]


def _assert_machine_clean(name: str, record, before: dict) -> None:
    assert teardown.leftovers_of(record) == []
    assert process.processes_of(state.cluster_dir(name)) == []
    assert not state.cluster_dir(name).exists()
    if not _other_real_node_users(name):  # else the other cluster's kubelet still owns the settings
        assert _settings() == before


def _shell_pod(name: str, node: str, script: str) -> dict:
    return objects.pod_on_node(name, node, images.SHELL_IMAGE, command=["sh", "-c", script], restart_policy="Never")


def test_real_node_runs_a_container_and_goes_without_trace(real_node_machine, dra_run_id):
    before = _settings()
    name = f"rn-{dra_run_id[:6]}-{os.getpid()}"
    backend = LocalBackend()
    info = backend.up(UpOptions(name=name, nodes=1, real_nodes=1))
    record = records(state.load(name).data)[0]
    try:
        clients = Clients(info.kubeconfig)
        try:
            node = clients.core.read_node(record.name)
            assert node.status.node_info.kubelet_version == "v1.37.2"
            assert node.status.node_info.container_runtime_version.startswith(f"containerd://{CONTAINERD_VERSION}")
            assert [(a.type, a.address) for a in node.status.addresses if a.type == "InternalIP"] == \
                [("InternalIP", record.address)]
            assert any(t.key == kubelet.TAINT_KEY and t.effect == "NoSchedule" for t in node.spec.taints)
            assert node.metadata.labels[kubelet.KUBELET_LABEL] == "real"

            # A container runs, in the node's own cgroup parent, and its output comes back through
            # the API server from this kubelet.
            clients.core.create_namespaced_pod("default", _shell_pod(
                "hello", record.name, "echo hello from $(hostname); cat /proc/self/cgroup"))
            wait.pod_phase(clients, "default", "hello", "Succeeded", timeout=90)
            logs = clients.core.read_namespaced_pod_log("hello", "default")
            assert "hello from hello" in logs
            if cgroups.layout() != "v2":  # v1 shows full cgroup paths inside the container
                assert f"/dra-harness-{record.id}/kubepods" in logs, logs
        finally:
            clients.close()
    finally:
        leftovers = backend.down(name)
    assert leftovers == []
    _assert_machine_clean(name, record, before)


def test_crashed_real_node_is_found_and_cleaned_by_the_next_up(real_node_machine, dra_run_id):
    before = _settings()
    name = f"rc-{dra_run_id[:6]}-{os.getpid()}"
    backend = LocalBackend()
    info = backend.up(UpOptions(name=name, nodes=0, real_nodes=1))
    record = records(state.load(name).data)[0]
    clients = Clients(info.kubeconfig)
    try:
        clients.core.create_namespaced_pod("default", _shell_pod("sleeper", record.name, "exec sleep 3600"))
        wait.pod_phase(clients, "default", "sleeper", "Running", timeout=90)
    finally:
        clients.close()
    assert cgroups.pids(record.id), "the running pod's processes should be in the node's cgroups"
    # Everything we started dies at once (a crash of the machine's session); the pod's processes and
    # containerd's shims are not ours to be killed that way, so they stay behind.
    for running in process.recorded(state.cluster_dir(name)).values():
        os.kill(running.pid, signal.SIGKILL)
    wait.until("the recorded processes to die", lambda: not process.processes_of(state.cluster_dir(name)), 30)
    assert teardown.processes_mentioning(record.directory), "the shims should have outlived the crash"

    backend.up(UpOptions(name=name, nodes=0, real_nodes=1))  # finds the stale state and cleans it first
    try:
        assert backend.status(name).health == "running"
    finally:
        leftovers = backend.down(name)
    assert leftovers == []
    _assert_machine_clean(name, record, before)


def test_interrupted_real_node_start_leaves_nothing(real_node_machine, dra_run_id):
    before = _settings()
    name = f"ri-{dra_run_id[:6]}-{os.getpid()}"
    directory = state.cluster_dir(name)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "cluster", "up", "--name", name, "--nodes", "0",
                             "--real-nodes", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait.until("containerd of the real node to be started",
                   lambda: (directory / "pids" / "containerd-real-node-0.json").exists() or proc.poll() is not None,
                   120)
        assert proc.poll() is None, "cluster up finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    ident = node_id(directory, "real-node-0")
    assert not (node_root() / ident).exists()
    assert not network.bridge_exists(network.bridge_name(ident))
    assert cgroups.existing(ident) == []
    assert not directory.exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if any(str(node_root() / ident) in a
                                                                   for a in p.info["cmdline"] or [])]
    if not _other_real_node_users(name):
        assert _settings() == before

"""`load run --backend existing --kubeconfig K` on a cluster the load run did not start: a local
cluster started through the command line (with its own fake driver, devices and nodes) stands in for
the user's. The run measures with its own nodes, driver and namespace, and afterwards -- also after
Ctrl-C -- nothing of it is left and what was there before is as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.k8s import wait
from harness.k8s.client import Clients
from load.scenarios import LOAD_LABEL

pytestmark = pytest.mark.integration

DEFINITION = """apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: Cluster
metadata: {name: given}
spec:
  driver: {instance: given, domain: given.example.com, extendedResources: {gpu: example.com/gpu}}
  nodePools:
  - {name: own, count: 2, profile: tiny}
"""


def _cli(state: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRA_HARNESS_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def given(tmp_path_factory):
    """A running local cluster, started through the CLI: (state dir, kubeconfig, clients)."""
    root = tmp_path_factory.mktemp("given")
    state, name = root / "state", f"given-{uuid.uuid4().hex[:6]}"
    (root / "given.yaml").write_text(DEFINITION)
    up = _cli(state, "cluster", "up", "--name", name, "--config", str(root / "given.yaml"))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        kubeconfig = next(line.split("=", 1)[1] for line in up.stdout.splitlines()
                          if line.startswith("export KUBECONFIG="))
        clients = Clients(Path(kubeconfig))
        try:
            yield state, kubeconfig, clients
        finally:
            clients.close()
    finally:
        down = _cli(state, "cluster", "down", "--name", name)
        assert down.returncode == 0, down.stdout + down.stderr


def _snapshot(k8s) -> dict:
    """What a load run could add, change or leave: namespaces, nodes with their labels and taints,
    DeviceClasses and ResourceSlices with their generation, DeviceTaintRules, pods."""
    return {
        "namespaces": {n.metadata.name for n in k8s.core.list_namespace().items},
        "nodes": {n.metadata.name: (sorted((n.metadata.labels or {}).items()),
                                    sorted((t.key, t.value, t.effect) for t in (n.spec.taints or [])))
                  for n in k8s.core.list_node().items},
        "classes": {(c.metadata.name, c.metadata.generation) for c in k8s.resource.list_device_class().items},
        "slices": {(s.metadata.name, s.metadata.generation) for s in k8s.resource.list_resource_slice().items},
        "taint rules": {r.metadata.name for r in k8s.resource.list_device_taint_rule().items},
        "pods": {(p.metadata.namespace, p.metadata.name) for p in k8s.core.list_pod_for_all_namespaces().items},
    }


def _assert_as_before(k8s, before: dict) -> None:
    after = _snapshot(k8s)
    assert after["slices"] and after["classes"]  # the cluster's own devices were there all along
    diff = {key: {"new": sorted(map(str, set(after[key]) - set(before[key]))),
                  "gone or changed": sorted(map(str, set(before[key]) - set(after[key])))}
            for key in before if after[key] != before[key]}
    if key_nodes := diff.get("nodes"):  # name-level sets say little for a dict: show the changed nodes
        key_nodes["changed"] = [f"{n}: {before['nodes'][n]} -> {after['nodes'][n]}" for n in before["nodes"]
                                if n in after["nodes"] and after["nodes"][n] != before["nodes"][n]]
    assert not diff, diff


@pytest.mark.parametrize("scenario, extra", [
    ("slice-added", ["--nodes", "3", "--pending", "3", "--events", "3", "--devices-per-node", "1"]),
    ("class-created", ["--nodes", "2", "--pending", "4", "--events", "3", "--devices-per-node", "2"]),
    # every kind once, on the run's own tainted nodes: its slices, classes, rules, labels and taints go with it
    ("requeue-correctness", ["--nodes", "11", "--pending", "12", "--events", "11", "--devices-per-node", "1"]),
    ("extended-throughput", ["--nodes", "2", "--pending", "6", "--events", "1", "--devices-per-node", "3",
                             "--users", "2"]),
])
def test_load_run_on_a_given_cluster_measures_and_leaves_it_as_it_was(given, tmp_path, scenario, extra):
    state, kubeconfig, k8s = given
    before = _snapshot(k8s)
    reports = tmp_path / "load"
    result = _cli(state, "load", "run", "--backend", "existing", "--kubeconfig", kubeconfig, "--scenario", scenario,
                  *extra, "--time-limit", "120", "--report-dir", str(reports))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((reports / "load-report.json").read_text())
    assert (summary["backend"], summary["hints"]) == ("existing", None)
    if scenario == "extended-throughput":
        burst = summary["throughput"]
        assert burst["complete"] and (burst["pods"], burst["bound"], burst["unbound"]) == (3, 3, 0), burst
    else:
        events = int(extra[extra.index("--events") + 1])
        assert (summary["latency_ms"]["n"], summary["failures"]) == (events, 0), summary["failure_reasons"]
        assert 0 < summary["latency_ms"]["p50"] <= summary["latency_ms"]["max"] < 60_000
    assert "the cluster's own hints" in (reports / "load-report.html").read_text()
    _assert_as_before(k8s, before)
    assert not list((state / "existing").iterdir())  # the attachment's record is gone too


def test_ctrl_c_during_a_load_run_on_a_given_cluster_removes_what_it_made(given, tmp_path):
    state, kubeconfig, k8s = given
    before = _snapshot(k8s)
    env = {**os.environ, "DRA_HARNESS_STATE_DIR": str(state)}
    log = open(tmp_path / "cli.log", "w")
    # long enough that it is still running when interrupted: 200 events at 1/s
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "load", "run", "--backend", "existing",
                             "--kubeconfig", kubeconfig, "--scenario", "steady-state", "--nodes", "2",
                             "--pending", "1", "--devices-per-node", "2", "--events", "200", "--rate", "1",
                             "--time-limit", "300", "--report-dir", str(tmp_path / "load")],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        def arrivals_bound() -> bool:  # locust runs and its pods are on the run's own nodes
            return any(p.spec.node_name and p.metadata.name.startswith("arrival-") for p in
                       k8s.core.list_pod_for_all_namespaces(label_selector=LOAD_LABEL).items)

        wait.until("the load run's first arrival to be bound", arrivals_bound, 180,
                   diagnostics=lambda: (tmp_path / "cli.log").read_text()[-3000:])
        assert k8s.core.list_node(label_selector=LOAD_LABEL).items  # its own nodes exist meanwhile
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    output = (tmp_path / "cli.log").read_text()
    assert code == 130, output
    assert "Traceback" not in output, output
    _assert_as_before(k8s, before)  # no waiting here: the run itself waited until its objects were gone
    assert not list((state / "existing").iterdir())

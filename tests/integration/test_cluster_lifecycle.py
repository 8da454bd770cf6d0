"""Cluster lifecycle with real 1.37 clusters, driven through the command line as a user would: one
cluster's `down` never touches another (also when one name is a prefix of the other, also with real
nodes and separate state directories), `down` is safe to interrupt and to repeat, a SIGTERM during
node creation is honoured at once, and no port is reported listening after its process is gone.

Every cluster here is started by the test itself (no session cluster is needed) and stopped in a
`finally`, so a failure leaves nothing behind either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest
import yaml
from kubernetes.client.rest import ApiException

from conformance import objects
from harness.backends.local import process
from harness.backends.local.realnode import cgroups, host, images, network, preflight, teardown
from harness.core import paths
from harness.core.nodelayout import RealNodeRecord, records
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.integration

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
UP_TIMEOUT = 600  # a cold, loaded 2-core machine; `up` itself bounds each component's start to 90 s


@pytest.fixture(scope="module", autouse=True)
def local_backend_only(request):
    if request.config.getoption("--dra-backend") != "local":
        pytest.skip("checks the local backend itself")


class Cli:
    """`dra-harness` subprocesses with one state directory; remembers the clusters it started and
    stops whatever is still up at the end."""

    def __init__(self, state_dir: Path | None = None):
        self.env = {**os.environ, "NO_COLOR": "1"}
        self.env.pop("KUBECONFIG", None)
        if state_dir is not None:
            self.env[paths.STATE_ENV] = str(state_dir)
        self.state_dir = state_dir or paths.state_root()
        self.started: list[str] = []

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def run(self, *args: str, timeout: float = UP_TIMEOUT) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def up(self, name: str, *args: str) -> None:
        self.started.append(name)
        result = self.run("cluster", "up", "--name", name, *args)
        assert result.returncode == 0, f"cluster up --name {name} failed:\n{result.stderr}"

    def down(self, name: str) -> subprocess.CompletedProcess:
        return self.run("cluster", "down", "--name", name, timeout=180)

    def directory(self, name: str) -> Path:
        return self.state_dir / "clusters" / name

    def data(self, name: str) -> dict:
        return yaml.safe_load((self.directory(name) / "state.yaml").read_text())

    def cleanup(self) -> None:
        for name in self.started:
            if self.directory(name).exists():
                self.down(name)


@pytest.fixture
def cli():
    made = []

    def make(state_dir: Path | None = None) -> Cli:
        made.append(Cli(state_dir))
        return made[-1]

    yield make
    for one in made:
        one.cleanup()


def _components_alive(directory: Path) -> dict[str, bool]:
    recorded = process.recorded(directory)
    return {name: name in recorded and process.alive(recorded[name]) for name in CONTROL_PLANE}


def _api_answers(kubeconfig: Path) -> bool:
    clients = Clients(kubeconfig)
    try:
        clients.core.list_namespace(limit=1)
        return True
    finally:
        clients.close()


def _assert_running(cli: Cli, name: str) -> None:
    assert _components_alive(cli.directory(name)) == dict.fromkeys(CONTROL_PLANE, True), name
    assert _api_answers(cli.directory(name) / "kubeconfig"), name


# --- item 1: never touch another cluster ---------------------------------------------------------


def test_down_of_a_name_prefix_leaves_the_longer_cluster_running(cli, dra_run_id):
    cli = cli()
    short, long = f"rel-{dra_run_id[:6]}", f"rel-{dra_run_id[:6]}x"
    cli.up(long, "--nodes", "1")
    cli.up(short, "--nodes", "1")

    result = cli.down(short)
    assert result.returncode == 0, result.stderr
    assert not cli.directory(short).exists()
    _assert_running(cli, long)

    # A stale `short` (every process killed) is cleaned up by the next `up`, not refused because
    # of `long`'s processes.
    cli.up(short, "--nodes", "0")
    for running in process.recorded(cli.directory(short)).values():
        os.kill(running.pid, signal.SIGKILL)
    wait.until(f"the processes of {short} to die", lambda: not process.processes_of(cli.directory(short)), 30)
    cli.up(short, "--nodes", "0")
    _assert_running(cli, short)
    _assert_running(cli, long)

    assert cli.down(short).returncode == 0
    _assert_running(cli, long)
    assert cli.down(long).returncode == 0
    assert process.processes_of(cli.directory(long)) == []


# --- item 12: no port "still listening" after a SIGKILLed apiserver --------------------------------


@pytest.mark.slow
def test_down_after_the_apiserver_was_killed_reports_no_listening_port(cli, dra_run_id):
    """Issue 16 measured about 1 in 6 downs failing with "port N still listening"; three rounds here,
    the deterministic reproduction is in tests/unit/test_process_identity.py."""
    cli = cli()
    for round_ in range(3):
        name = f"kill-{dra_run_id[:6]}-{round_}"
        cli.up(name, "--nodes", "1")
        ports = cli.data(name)["ports"]
        os.kill(process.recorded(cli.directory(name))["kube-apiserver"].pid, signal.SIGKILL)
        result = cli.down(name)
        assert result.returncode == 0, f"round {round_}: {result.stdout}{result.stderr}"
        assert "still listening" not in result.stdout + result.stderr
        assert not cli.directory(name).exists()
        from harness.backends.local.ports import listening

        assert listening(list(ports.values())) == []


# --- item 5: SIGTERM while nodes are being created ---------------------------------------------------


def _up_interrupted_while_creating_nodes(cli: Cli, name: str, sig: signal.Signals) -> tuple[subprocess.Popen, str, float]:
    """Start `cluster up --nodes 5000`, send `sig` once nodes are being created; (process, stderr,
    seconds from the signal to its exit)."""
    directory = cli.directory(name)
    proc = cli.popen("cluster", "up", "--name", name, "--nodes", "5000")
    cli.started.append(name)

    def creating_nodes() -> bool:
        if proc.poll() is not None:
            return True
        if not (directory / "pids" / "kwok.json").exists():
            return False
        clients = Clients(directory / "kubeconfig")
        try:
            return bool(clients.core.list_node(limit=1).items)
        except (ApiException, OSError):
            return False
        finally:
            clients.close()

    try:
        wait.until("cluster up to create nodes", creating_nodes, UP_TIMEOUT, interval=0.1)
        assert proc.poll() is None, f"cluster up ended before it could be interrupted:\n{proc.stderr.read()}"
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
        return proc, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_while_nodes_are_created_stops_promptly_and_leaves_nothing(cli, dra_run_id):
    cli = cli()
    name = f"term-{dra_run_id[:6]}"
    proc, err, took = _up_interrupted_while_creating_nodes(cli, name, signal.SIGTERM)
    assert proc.returncode == 143, err  # 128 + SIGTERM
    # Clean-up stops five components (SIGTERM, SIGKILL after 5 s each group at worst): well under a
    # minute. Before the fix it first created all 5000 nodes.
    assert took < 60, f"cluster up took {took:.0f}s to stop after SIGTERM"
    assert "interrupted" in err
    assert not cli.directory(name).exists()
    assert process.processes_of(cli.directory(name)) == []


def test_a_sigkilled_up_is_cleaned_by_the_next_up(cli, dra_run_id):
    """SIGKILL cannot be handled: the components stay. The next `up` of the name sees that the `up`
    which was starting them is gone and removes them instead of refusing."""
    cli = cli()
    name = f"kill9-{dra_run_id[:6]}"
    proc, err, _ = _up_interrupted_while_creating_nodes(cli, name, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    left = process.processes_of(cli.directory(name))
    assert left, "the components of the killed up should still run"
    status = cli.run("cluster", "status", "--name", name, "--json")
    assert '"health": "broken"' in status.stdout, status.stdout

    cli.up(name, "--nodes", "1")
    assert not [p for p in left if p.is_running() and p.status() != "zombie"]
    _assert_running(cli, name)
    assert cli.down(name).returncode == 0


# --- down: safe to interrupt, safe to repeat ---------------------------------------------------------

# A process of the cluster that ignores SIGTERM: `down` spends its grace period on it, which gives
# the test a moment in which the clean-up is surely half done.
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                  "time.sleep(600)"]


def test_interrupted_down_is_finished_by_the_next_and_a_third_is_a_no_op(cli, dra_run_id):
    cli = cli()
    name = f"redo-{dra_run_id[:6]}"
    cli.up(name, "--nodes", "1")
    directory = cli.directory(name)
    stubborn = process.start("stubborn", STUBBORN, directory)
    etcd = process.recorded(directory)["etcd"]

    first = cli.popen("cluster", "down", "--name", name)
    try:
        wait.until("down to stop the control plane and reach the stubborn process",
                   lambda: not process.alive(etcd) or first.poll() is not None, 60, interval=0.05)
        assert first.poll() is None, "down finished before it could be interrupted"
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 130, err
    assert f"cluster {name!r} is only partly stopped" in err
    assert directory.exists() and process.alive(stubborn)

    second = cli.down(name)
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"cluster {name!r} is down\n"
    assert not directory.exists()
    assert not process.alive(stubborn)
    assert process.processes_of(directory) == []

    third = cli.down(name)
    assert third.returncode == 0, third.stderr
    assert third.stdout.startswith(f"nothing to do: cluster {name!r} is already down")
    assert "error" not in third.stderr


# --- Done when: three clusters with a real node each, side by side ----------------------------------

REAL_NODE_DEFINITION = """\
apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: Cluster
metadata: {name: side-by-side}
spec:
  driver: {instance: fake, domain: fake.dra-harness.x-k8s.io}
  nodePools:
  - {name: real, count: 1, kubelet: real, profile: tiny}
  - {name: sim, count: 1}
"""


def _settings() -> dict:
    """The machine-wide settings a real node may change (iptables without packet counters)."""
    snap = host.snapshot()
    rules = {binary: {table: sorted(line.split(" [")[0] for line in lines) for table, lines in tables.items()}
             for binary, tables in snap["iptables"].items()}
    return {"sysctls": snap["sysctls"], "iptables": rules}


def _run_claim_pod(kubeconfig: Path, node: str, pod: str) -> dict[str, str]:
    """A pod with a claim on the real node; the DRA_* variables CDI injected into its container."""
    clients = Clients(kubeconfig)
    try:
        wait.service_account_ready(clients, "default")
        try:
            clients.resource.create_namespaced_resource_claim_template(
                "default", objects.claim_template("one-gpu", "fake-gpu"))
        except ApiException as err:
            if err.status != 409:
                raise
        clients.core.create_namespaced_pod("default", objects.pod_on_node(
            pod, node, images.SHELL_IMAGE, command=objects.PRINT_DRA_ENV, claim_template="one-gpu"))

        def printed():
            try:
                text = clients.core.read_namespaced_pod_log(pod, "default") or ""
            except ApiException as err:
                if err.status == 400:  # not started yet
                    return None
                raise
            return text if objects.ENV_DONE in text else None

        text = wait.until(f"pod {pod} on {node} to print its devices", printed, 120,
                          diagnostics=lambda: wait.describe_namespace(clients, "default"))
        # Its GPU goes back once the kubelet has unprepared it (the node has two; no need to wait).
        clients.core.delete_namespaced_pod(pod, "default")
        return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("DRA_"))
    finally:
        clients.close()


def _node_ready(kubeconfig: Path, node: str) -> bool:
    clients = Clients(kubeconfig)
    try:
        conditions = clients.core.read_node(node).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)
    finally:
        clients.close()


def _assert_works(cli: Cli, name: str, node: RealNodeRecord, pod: str) -> None:
    _assert_running(cli, name)
    kubeconfig = cli.directory(name) / "kubeconfig"
    assert _node_ready(kubeconfig, node.name), f"{name}: {node.name} is not Ready"
    env = _run_claim_pod(kubeconfig, node.name, pod)
    assert any(key.endswith("_DEVICE") for key in env), f"{name}: no device injected into {pod}: {env}"
    assert teardown.leftovers_of(node), f"{name}: its real node's things should all be there"


@pytest.mark.slow
def test_three_real_node_clusters_run_side_by_side_and_go_without_touching_each_other(cli, dra_run_id, tmp_path):
    problems = preflight.problems(3)
    if problems:
        pytest.skip("this machine cannot run three real nodes: " + "; ".join(problems))
    before = _settings()
    definition = tmp_path / "side-by-side.yaml"
    definition.write_text(REAL_NODE_DEFINITION)
    # Each cluster in its own state directory (three CI jobs, say): the machine settings are still
    # recorded once and restored only by the last one (issue 16 item 15).
    clusters = [(cli(tmp_path / f"state-{i}"), f"side-{dra_run_id[:6]}-{i}") for i in range(3)]
    for one, name in clusters:
        one.up(name, "--config", str(definition))
    nodes = {name: records(one.data(name))[0] for one, name in clusters}
    assert len({n.id for n in nodes.values()}) == 3 and len({n.bridge for n in nodes.values()}) == 3
    mine = [str(one.directory(name)) for one, name in clusters]
    assert set(mine) <= set(host.owners())  # one machine record, whatever the state directory
    for one, name in clusters:
        _assert_works(one, name, nodes[name], "claim-0")

    for i, (one, name) in enumerate(clusters):
        result = one.down(name)
        assert result.returncode == 0, f"down {name}: {result.stdout}{result.stderr}"
        assert teardown.leftovers_of(nodes[name]) == [], name
        assert process.processes_of(one.directory(name)) == []
        assert str(one.directory(name)) not in host.owners()
        for other, other_name in clusters[i + 1:]:
            _assert_works(other, other_name, nodes[other_name], f"claim-after-{i}")
        if i < 2:  # the kubelets left still own the machine settings: not restored under them
            assert set(mine[i + 1:]) <= set(host.owners())
            if not _foreign_kubelets(mine):  # an older version's run restores by its own record
                assert host.read_sysctls()["kernel.panic"] == "10"  # what the kubelet sets

    for node in nodes.values():
        assert teardown.leftovers_of(node) == []
        assert not network.bridge_exists(node.bridge)
        assert cgroups.existing(node.id) == []
    others = host.owners() + [f"pid {p.pid}" for p in _kubelets()]
    if others:  # another run's real node (the session cluster's, an older version's) holds them
        warnings.warn(f"machine settings not compared with the baseline: other real nodes run ({', '.join(others)})")
        return
    assert _settings() == before


def _kubelets() -> list[psutil.Process]:
    """Kubelets running on this machine (after our clusters are gone: other runs' real nodes)."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "kubelet"]


def _foreign_kubelets(mine: list[str]) -> list[psutil.Process]:
    """Kubelets of clusters other than `mine` (they work in their cluster's directory)."""
    foreign = []
    for kubelet in _kubelets():
        try:
            if kubelet.cwd() not in mine:
                foreign.append(kubelet)
        except psutil.Error:
            continue
    return foreign

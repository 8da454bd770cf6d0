"""The kubelet plugin (node half of the fake driver) as a kubelet sees it.

The calls come from tests/wirecompat, a Go program built on the kubelet's own generated gRPC
clients (k8s.io/kubelet v0.37.2) that also resolves the returned CDI IDs with the CDI library of
container runtimes. Claims are allocated by the real 1.37 scheduler on a simulated node from slices
the control-plane half publishes; the plugin reads them from the real API server.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conformance import checks, objects
from fake_devices import faults, profile, render
from fake_devices.kubeletplugin import KubeletPlugin, PluginConfig
from harness.binaries import wirecompat
from harness.core.progress import Reporter
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.integration

VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def wirecompat_client(request: pytest.FixtureRequest) -> Path:
    """The Go client, built once per source version (cached; a cold build takes minutes)."""
    if shutil.which("go") is None:
        pytest.skip("needs Go to build the wire-compatibility client (tests/wirecompat)")
    if wirecompat.cached_binary().exists():
        return wirecompat.cached_binary()
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():  # show the progress
        return wirecompat.build(Reporter())


@pytest.fixture
def plugin_dirs():
    # Short, under /tmp: unix socket paths are limited to 107 bytes, pytest's tmp_path is too long.
    base = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _config(driver, which: str, node: str, dirs: Path, **options) -> PluginConfig:
    return PluginConfig(driver=getattr(driver.drivers, which), node=node, plugins_dir=dirs / "plugins",
                        registry_dir=dirs / "registry", cdi_dir=dirs / "cdi", state_dir=dirs / "state",
                        instance=driver.config.instance, namespace=driver.config.namespace, **options)


@pytest.fixture
def kubelet_plugin(k8s: Clients, plugin_dirs: Path):
    """Start in-process plugins: `kubelet_plugin(fake, "gpu", node)`; stopped (sockets removed) at teardown."""
    started: list[KubeletPlugin] = []

    def start(driver, which: str, node: str, **options) -> KubeletPlugin:
        plugin = KubeletPlugin(_config(driver, which, node, plugin_dirs, **options), k8s.api_client).start()
        started.append(plugin)
        return plugin

    yield start
    for plugin in reversed(started):
        plugin.stop()
        assert not plugin.config.dra_socket.exists() and not plugin.config.registration_socket.exists()


# --- helpers ----------------------------------------------------------------------------------

def _run(binary: Path, plan: dict, expect_ok: bool = True) -> dict:
    code, summary, stderr = wirecompat.run(binary, plan)
    if expect_ok:
        assert code == 0 and summary.get("ok"), (
            "the kubelet's clients found mismatches:\n  " + "\n  ".join(summary.get("mismatches", []))
            + f"\nstderr: {stderr[-2000:]}")
    return summary


def _raw_claim(k8s: Clients, namespace: str, name: str) -> dict:
    response = k8s.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
    return json.loads(response.data)


def _allocated_claim(k8s: Clients, namespace: str, pod: str, template: str, node: str) -> dict:
    """Create a pod with a claim from `template` pinned to `node`; return its claim once the
    scheduler allocated it."""
    k8s.core.create_namespaced_pod(namespace, objects.pod_with_template_claim(
        pod, template, node_selector={"kubernetes.io/hostname": node}))
    name = checks.pod_claim(k8s, namespace, pod).metadata.name

    def allocated():
        claim = _raw_claim(k8s, namespace, name)
        return claim if (claim.get("status") or {}).get("allocation") else None

    return wait.until(f"claim {namespace}/{name} to be allocated", allocated, 60,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def _ref(claim: dict, **extra) -> dict:
    meta = claim["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"], **extra}


def _results(claim: dict, driver: str) -> list[dict]:
    return [r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == driver]


def _cdi_name(claim: dict, result: dict) -> str:
    name = f"{claim['metadata']['uid']}-{result['device']}"
    return name + (f"-{result['shareID']}" if result.get("shareID") else "")


def _expected_devices(claim: dict, driver: str) -> list[dict]:
    """What the kubelet must get back, from the allocation alone (docs/kubelet-plugin.md)."""
    cls = driver.split(".", 1)[0]
    devices = []
    for result in _results(claim, driver):
        device = {"requestNames": [result["request"].split("/", 1)[0]], "poolName": result["pool"],
                  "deviceName": result["device"], "cdiDeviceIds": [f"{driver}/{cls}={_cdi_name(claim, result)}"]}
        if result.get("shareID"):
            device["shareId"] = result["shareID"]
        devices.append(device)
    return devices


def _env_prefix(claim: dict, result: dict) -> str:
    """DRA_<DEVICE>_<first 8 of claim UID>[_<first 8 of share ID>], upper snake case."""
    parts = [result["device"], claim["metadata"]["uid"][:8]] + ([result["shareID"][:8]] if result.get("shareID") else [])
    return "DRA_" + "_".join(p.upper().replace("-", "_").replace(".", "_") for p in parts)


def _rendered(profile_name: str, node: str, driver, which: str) -> dict[str, dict]:
    devices, _ = render.devices_by_driver(profile.load(profile_name), node, driver.drivers)[getattr(driver.drivers, which)]
    return {d["name"]: d for d in devices}


def _spec_file(plugin: KubeletPlugin, claim: dict) -> Path:
    driver = plugin.config.driver
    return plugin.config.cdi_dir / f"{driver}-{driver.split('.', 1)[0]}_{claim['metadata']['uid']}.json"


def _env_dict(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines)


# --- tests ------------------------------------------------------------------------------------

def test_kubelet_clients_register_prepare_and_unprepare(k8s, dra_namespace, fake_driver, simulated_node,
                                                        kubelet_plugin, wirecompat_client):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    gpu = kubelet_plugin(driver, "gpu", node, profile="tiny")
    storage = kubelet_plugin(driver, "storage", node, profile="tiny")  # one plugin per driver name
    instance = driver.config.instance
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("gpu-and-disk", requests=[
        objects.request(f"{instance}-gpu", name="gpu"),
        objects.request(f"{instance}-nvme", name="disk", capacity={"size": "100Gi"})]))
    claim = _allocated_claim(k8s, ns, "worker", "gpu-and-disk", node)
    (gpu_result,), (disk_result,) = _results(claim, gpu.config.driver), _results(claim, storage.config.driver)
    assert disk_result.get("shareID"), "a share of a consumable-capacity drive carries a share ID"

    # Registration, then v1 Prepare (twice: idempotent) with the CDI IDs resolved as a runtime would.
    summaries = {}
    for plugin in (gpu, storage):
        config = plugin.config
        summaries[config.driver] = _run(wirecompat_client, {
            "registrationSocket": str(config.registration_socket),
            "expectInfo": {"name": config.driver, "endpoint": str(config.dra_socket), "versions": VERSIONS},
            "cdiDir": str(config.cdi_dir),
            "steps": [{"op": "prepare", "api": "v1", "idempotent": True, "checkCDI": True,
                       "claims": [_ref(claim, expectDevices=_expected_devices(claim, config.driver))]},
                      {"op": "health", "api": "v1", "health": {"count": 2}},
                      {"op": "health", "api": "v1alpha1", "health": {"count": 2}}]})
        assert plugin.registration.status == (True, "")

    # The CDI spec files: one per claim and driver, exactly describing the allocated device.
    gpus = _rendered("tiny", node, driver, "gpu")
    spec = json.loads(_spec_file(gpu, claim).read_text())
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == f"{gpu.config.driver}/gpu"
    (cdi_device,) = spec["devices"]
    assert cdi_device["name"] == _cdi_name(claim, gpu_result)
    env = _env_dict(cdi_device["containerEdits"]["env"])
    p = _env_prefix(claim, gpu_result)
    want = gpus[gpu_result["device"]]["attributes"]
    assert env[f"{p}_DEVICE"] == gpu_result["device"] and env[f"{p}_POOL"] == node
    assert env[f"{p}_REQUEST"] == "gpu" and env[f"{p}_CLAIM"] == f"{ns}/{claim['metadata']['name']}"
    assert env[f"{p}_CLAIM_UID"] == claim["metadata"]["uid"] and env[f"{p}_DRIVER"] == gpu.config.driver
    assert env[f"{p}_ATTR_MODEL"] == want["model"]["string"]
    assert env[f"{p}_ATTR_UUID"] == want["uuid"]["string"]
    assert env[f"{p}_ATTR_NUMA_NODE"] == str(want["resource.kubernetes.io/numaNode"]["int"])
    assert env[f"{p}_ATTR_PCIE_ROOT"] == want["resource.kubernetes.io/pcieRoot"]["string"]
    assert env[f"{p}_CAPACITY_MEMORY"] == gpus[gpu_result["device"]]["capacity"]["memory"]["value"]
    assert f"{p}_SHARE_ID" not in env
    # ... and the runtime's view (CDI library, after injection into an OCI spec) is the same.
    gpu_step = summaries[gpu.config.driver]["steps"][0]["claims"][claim["metadata"]["uid"]]
    assert _env_dict(gpu_step["cdiEnv"][gpu_step["devices"][0]["cdiDeviceIds"][0]]) == env

    disk_env = _env_dict(json.loads(_spec_file(storage, claim).read_text())["devices"][0]["containerEdits"]["env"])
    d = _env_prefix(claim, disk_result)
    assert disk_env[f"{d}_SHARE_ID"] == disk_result["shareID"]
    assert disk_env[f"{d}_CONSUMED_SIZE"] == disk_result["consumedCapacity"]["size"] == "100Gi"
    assert disk_env[f"{d}_REQUEST"] == "disk" and disk_env[f"{d}_ATTR_TYPE"] == "nvme"

    # The checkpoint knows the prepared claim.
    assert claim["metadata"]["uid"] in gpu.checkpoint.claims()

    # Unprepare (twice), then the same round trip over v1beta1 (no share IDs on that wire).
    for plugin in (gpu, storage):
        config = plugin.config
        refs = [_ref(claim, expectDevices=_expected_devices(claim, config.driver))]
        _run(wirecompat_client, {"draSocket": str(config.dra_socket), "cdiDir": str(config.cdi_dir), "steps": [
            {"op": "prepare", "api": "v1", "claims": refs},
            {"op": "unprepare", "api": "v1", "idempotent": True, "checkCDI": True, "claims": refs},
            {"op": "prepare", "api": "v1beta1", "idempotent": True, "checkCDI": True, "claims": refs},
            {"op": "unprepare", "api": "v1beta1", "idempotent": True, "checkCDI": True, "claims": refs}]})
        assert not _spec_file(plugin, claim).exists()
        assert plugin.checkpoint.claims() == {}
    assert sorted(p.name for p in gpu.config.cdi_dir.iterdir()) == []

    # The client really checks: a wrong expectation is reported and fails the run.
    summary = _run(wirecompat_client, {"registrationSocket": str(gpu.config.registration_socket),
                                       "expectInfo": {"name": "other.example.com", "endpoint": str(gpu.config.dra_socket),
                                                      "versions": VERSIONS[:2]}}, expect_ok=False)
    assert not summary["ok"]
    assert any("name" in m for m in summary["mismatches"]) and any("versions" in m for m in summary["mismatches"])

    # Stopping removes both sockets.
    gpu.stop()
    assert not gpu.config.dra_socket.exists() and not gpu.config.registration_socket.exists()


def test_mig_partition_is_described_with_its_placement(k8s, dra_namespace, fake_driver, simulated_node,
                                                      kubelet_plugin, wirecompat_client):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "a100-mig"})
    plugin = kubelet_plugin(driver, "gpu", node)
    attr = f'device.attributes["{driver.drivers.gpu}"]'
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("mig", requests=[
        objects.request(f"{driver.config.instance}-mig", name="slice", selectors=[f'{attr}.profile == "3g.40gb"'])]))
    claim = _allocated_claim(k8s, ns, "mig", "mig", node)
    (result,) = _results(claim, plugin.config.driver)
    summary = _run(wirecompat_client, {"draSocket": str(plugin.config.dra_socket), "cdiDir": str(plugin.config.cdi_dir),
                                       "steps": [{"op": "prepare", "api": "v1", "checkCDI": True, "claims": [
                                           _ref(claim, expectDevices=_expected_devices(claim, plugin.config.driver))]}]})
    got = summary["steps"][0]["claims"][claim["metadata"]["uid"]]
    env = _env_dict(got["cdiEnv"][got["devices"][0]["cdiDeviceIds"][0]])  # as injected by the CDI library
    want = _rendered("a100-mig", node, driver, "gpu")[result["device"]]["attributes"]
    p = _env_prefix(claim, result)
    assert env[f"{p}_ATTR_TYPE"] == "mig" and env[f"{p}_ATTR_PROFILE"] == "3g.40gb"
    assert env[f"{p}_ATTR_PLACEMENT_START"] == str(want["placementStart"]["int"])
    assert env[f"{p}_ATTR_PLACEMENT_SIZE"] == str(want["placementSize"]["int"])
    assert env[f"{p}_ATTR_PARENT_UUID"] == want["parentUUID"]["string"]
    assert env[f"{p}_ATTR_UUID"] == want["uuid"]["string"]
    assert env[f"{p}_CAPACITY_MEMORY"] == "40Gi"


def test_failures_are_per_claim_and_leave_nothing_behind(k8s, dra_namespace, fake_driver, simulated_node,
                                                         kubelet_plugin, wirecompat_client):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    plugin = kubelet_plugin(driver, "gpu", node)
    instance = driver.config.instance
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("gpu", f"{instance}-gpu"))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "disk", requests=[objects.request(f"{instance}-nvme", name="disk")]))
    good = _allocated_claim(k8s, ns, "good", "gpu", node)
    disk_only = _allocated_claim(k8s, ns, "disk-only", "disk", node)  # storage driver, not ours

    def standalone(name: str) -> dict:
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [objects.request(f"{instance}-gpu")]}}}
        k8s.resource.create_namespaced_resource_claim(ns, body)
        return _raw_claim(k8s, ns, name)

    unallocated = standalone("unallocated")  # no pod uses it: the scheduler never allocates it
    deleted = standalone("deleted")
    k8s.resource.delete_namespaced_resource_claim("deleted", ns)
    recreated_old = standalone("recreated")
    k8s.resource.delete_namespaced_resource_claim("recreated", ns)
    wait.until("claim recreated to be gone", lambda: "recreated" not in
               {c.metadata.name for c in k8s.resource.list_namespaced_resource_claim(ns).items}, 30)
    recreated_new = standalone("recreated")
    assert recreated_new["metadata"]["uid"] != recreated_old["metadata"]["uid"]

    gpu_driver = plugin.config.driver
    cases = [
        _ref(good, expectDevices=_expected_devices(good, gpu_driver)),
        _ref(unallocated, expectError="is not allocated"),
        _ref(disk_only, expectError=f"has no devices of driver {gpu_driver} (allocated: {driver.drivers.storage})"),
        _ref(deleted, expectError="not found: it was deleted"),
        _ref(recreated_old, expectError="was deleted and recreated"),
        {"namespace": ns, "name": "../../etc", "uid": "../x", "expectError": "invalid claim reference"},
    ]
    for api in ("v1", "v1beta1"):
        summary = _run(wirecompat_client, {"draSocket": str(plugin.config.dra_socket), "cdiDir": str(plugin.config.cdi_dir),
                                           "steps": [{"op": "prepare", "api": api, "idempotent": True, "claims": cases}]})
        errors = {uid: c["error"] for uid, c in summary["steps"][0]["claims"].items()}
        assert errors[recreated_old["metadata"]["uid"]].startswith(f"ResourceClaim {ns}/recreated has UID "
                                                                   f"{recreated_new['metadata']['uid']}")
        # Only the good claim has a CDI spec and a checkpoint entry.
        assert sorted(p.name for p in plugin.config.cdi_dir.iterdir()) == [_spec_file(plugin, good).name]
        assert set(plugin.checkpoint.claims()) == {good["metadata"]["uid"]}
        _run(wirecompat_client, {"draSocket": str(plugin.config.dra_socket), "steps": [
            {"op": "unprepare", "api": api, "claims": [_ref(c) for c in (good, unallocated, deleted)]}]})
        assert list(plugin.config.cdi_dir.iterdir()) == []


def test_claim_allocated_for_another_node_is_refused(k8s, dra_namespace, fake_driver, simulated_nodes,
                                                     kubelet_plugin, wirecompat_client):
    if len(simulated_nodes) < 2:
        pytest.skip("needs two simulated nodes")
    ns, here, there = dra_namespace, simulated_nodes[0], simulated_nodes[1]
    driver = fake_driver({here: "tiny", there: "tiny"})
    plugin = kubelet_plugin(driver, "gpu", here)
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "gpu", f"{driver.config.instance}-gpu"))
    elsewhere = _allocated_claim(k8s, ns, "elsewhere", "gpu", there)
    (result,) = _results(elsewhere, plugin.config.driver)
    assert result["pool"] == there
    _run(wirecompat_client, {"draSocket": str(plugin.config.dra_socket), "steps": [
        {"op": "prepare", "api": "v1", "claims": [
            _ref(elsewhere, expectError=f"is allocated for another node: its node selector [metadata.name In "
                                        f"['{there}']] does not select node {here}")]}]})
    assert list(plugin.config.cdi_dir.iterdir()) == []


def test_health_follows_injected_faults(k8s, dra_namespace, fake_driver, simulated_node, kubelet_plugin,
                                        wirecompat_client):
    node = simulated_node
    driver = fake_driver({node: "tiny"})
    plugin = kubelet_plugin(driver, "gpu", node, profile="tiny")
    cm = driver.config.faults_configmap

    def health_is(expected: dict[str, str], message: dict[str, str]):
        # health and message: a degraded device stays HEALTHY, only its message says the plugin saw the fault
        _, entries = plugin.health.snapshot()
        return {e.device: e.health for e in entries} == expected and \
            all(text in e.message for e in entries for device, text in message.items() if e.device == device)

    def check(expected: dict[str, str], message: dict[str, str]):
        wait.until(f"plugin health {expected} with messages {message}", lambda: health_is(expected, message), 15)
        for api in ("v1", "v1alpha1"):
            _run(wirecompat_client, {"draSocket": str(plugin.config.dra_socket), "steps": [
                {"op": "health", "api": api, "health": {"count": len(expected), "devices": [
                    {"poolName": node, "deviceName": name, "health": health, "message": message.get(name, "")}
                    for name, health in expected.items()]}}]})

    check({"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}, {"gpu-0": "no fault injected"})
    faults.set_fault(k8s.core, dra_namespace, cm, node, "gpu-1", "unhealthy")
    faults.set_fault(k8s.core, dra_namespace, cm, node, "gpu-0", "degraded")
    check({"gpu-0": "HEALTHY", "gpu-1": "UNHEALTHY"}, {"gpu-0": "degraded", "gpu-1": "unhealthy"})
    faults.set_fault(k8s.core, dra_namespace, cm, node, "gpu-0", "lost")  # disappears from the slice, still reported
    check({"gpu-0": "UNHEALTHY", "gpu-1": "UNHEALTHY"}, {"gpu-0": "lost"})
    faults.set_fault(k8s.core, dra_namespace, cm, node, "gpu-0", None)
    faults.set_fault(k8s.core, dra_namespace, cm, node, "gpu-1", None)
    check({"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}, {})


# --- a real process, killed between Prepare and Unprepare -------------------------------------

class PluginProcess:
    def __init__(self, config: PluginConfig, kubeconfig: Path, log: Path):
        self.config, self.log = config, log
        cmd = [sys.executable, "-m", "fake_devices.kubeletplugin", "--driver", config.driver, "--node", config.node,
               "--kubeconfig", str(kubeconfig), "--plugins-dir", str(config.plugins_dir),
               "--registry-dir", str(config.registry_dir), "--cdi-dir", str(config.cdi_dir),
               "--state-dir", str(config.state_dir), "--instance", config.instance, "--namespace", config.namespace]
        with open(log, "a") as handle:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=handle, text=True)
        self._wait_ready(60)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                line = self.proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if not line:  # exited
                    break
        self.proc.kill()
        self.proc.wait()
        raise AssertionError(f"plugin process did not become ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def test_prepared_claims_survive_a_killed_plugin(k8s, dra_namespace, fake_driver, simulated_node, plugin_dirs,
                                                 wirecompat_client):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    config = _config(driver, "gpu", node, plugin_dirs)
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "gpu", f"{driver.config.instance}-gpu"))
    claim = _allocated_claim(k8s, ns, "pod", "gpu", node)
    ref = _ref(claim, expectDevices=_expected_devices(claim, config.driver))
    spec_file = config.cdi_dir / f"{config.driver}-gpu_{claim['metadata']['uid']}.json"
    log = plugin_dirs / "plugin.log"
    processes: list[PluginProcess] = []
    try:
        processes.append(PluginProcess(config, k8s.kubeconfig, log))
        first = _run(wirecompat_client, {"draSocket": str(config.dra_socket), "steps": [
            {"op": "prepare", "api": "v1", "claims": [ref]}]})
        content = spec_file.read_bytes()
        processes[-1].kill()  # no clean-up at all: stale sockets stay behind
        assert config.dra_socket.exists()
        spec_file.unlink()  # and the CDI spec is lost too (tmpfs wiped, say)

        processes.append(PluginProcess(config, k8s.kubeconfig, log))  # replaces the stale sockets
        assert spec_file.read_bytes() == content  # restored from the checkpoint at start-up
        again = _run(wirecompat_client, {"draSocket": str(config.dra_socket), "cdiDir": str(config.cdi_dir), "steps": [
            {"op": "prepare", "api": "v1", "checkCDI": True, "claims": [ref]},
            {"op": "unprepare", "api": "v1", "checkCDI": True, "claims": [_ref(claim)]}]})
        uid = claim["metadata"]["uid"]
        assert again["steps"][0]["claims"][uid]["devices"] == first["steps"][0]["claims"][uid]["devices"]
        assert not spec_file.exists()
        checkpoint = json.loads((config.state_dir / f"{config.driver}.checkpoint.json").read_text())
        assert checkpoint["claims"] == {}

        # Killed after Prepare, restarted, and Unprepare is the first call: still cleaned up.
        _run(wirecompat_client, {"draSocket": str(config.dra_socket), "steps": [
            {"op": "prepare", "api": "v1beta1", "claims": [ref]}]})
        processes[-1].kill()
        processes.append(PluginProcess(config, k8s.kubeconfig, log))
        _run(wirecompat_client, {"draSocket": str(config.dra_socket), "steps": [
            {"op": "unprepare", "api": "v1beta1", "claims": [_ref(claim)]}]})
        assert not spec_file.exists()

        assert processes[-1].terminate() == 0  # SIGTERM: clean stop, sockets removed
        assert not config.dra_socket.exists() and not config.registration_socket.exists()
    finally:
        for process in processes:
            if process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()

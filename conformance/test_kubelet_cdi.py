"""The node half of any DRA driver, seen from inside the container: the kubelet prepares a claim
through the driver's plugin, the plugin writes a CDI spec for it, and the runtime applies that spec's
edits (environment, device nodes, mounts) to the container. Unprepare removes the spec again.

Runs against the driver under test where its devices are on a node run by a real kubelet: a vendor's
plugin on the node (vendor mode), or the fake driver's plugins the harness starts on the local
backend's real node. The CDI spec files are read from the node's CDI directory, which the harness
knows for the local backend's real nodes only.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import grpc
import pytest
import yaml

from conformance import cdi_specs, checks, objects, under_test
from fake_devices.kubeletplugin.generated import pluginregistration_v1_pb2 as registration
from fake_devices.kubeletplugin.generated import pluginregistration_v1_pb2_grpc as registration_grpc
from harness.k8s import wait
from harness.pytest_plugin.plugin import vendor_driver

pytestmark = [pytest.mark.needs_kubelet, pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

MOUNTS, DEVICES = "--- mounts ---", "--- devices ---"
# prints the whole environment, the mount table and every path under /dev, then waits
SHOW_CONTAINER = ["sh", "-c", f"env; echo '{MOUNTS}'; cat /proc/mounts; echo '{DEVICES}'; find /dev; "
                              f"echo '{objects.ENV_DONE}'; {objects.UNTIL_DELETED}"]


@pytest.fixture
def kubelet_pool(request, devices_under_test):
    """One device of the driver under test on a node run by a real kubelet, or skip naming why."""
    if vendor_driver(request.config) is None:
        real_node = request.getfixturevalue("real_node")
        make = partial(under_test.DevicePool, request.getfixturevalue("k8s"),
                       request.getfixturevalue("cluster_objects"), request.getfixturevalue("unique_name"))
        return under_test.fake_pool(request.getfixturevalue("k8s"), request.getfixturevalue("fake_driver"), "", 1,
                                    make, real_node=real_node)
    pool = devices_under_test(1)
    if not pool.kubelet:
        pytest.skip(f"the free devices of {pool.driver} are on {pool.node}, a node no real kubelet runs: nothing "
                    "prepares them there")
    return pool


def _edits(spec_files) -> tuple[dict[str, set[str]], set[str], set[str]]:
    """({env name: values}, device node paths, mount container paths) of every edit in the spec files."""
    env: dict[str, set[str]] = {}
    nodes, mounts = set(), set()
    for path in spec_files:
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices") or []]
        for edit in edits:
            for line in edit.get("env") or []:
                name, _, value = line.partition("=")
                env.setdefault(name, set()).add(value)
            nodes |= {n["path"] for n in edit.get("deviceNodes") or []}
            mounts |= {m["containerPath"] for m in edit.get("mounts") or []}
    return env, nodes, mounts


def test_container_receives_the_cdi_edits_of_its_claim(k8s, dra_namespace, dra_cluster, kubelet_pool):
    ns, pool = dra_namespace, kubelet_pool
    cdi_dir = cdi_specs.known_cdi_dir(dra_cluster, pool.node)
    if cdi_dir is None:
        pytest.skip(f"the CDI directory of node {pool.node} is not known to the harness (it knows the local "
                    "backend's real nodes only): the container's edits cannot be compared with the spec")
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one"))
    body = pool.pod(objects.pod_with_template_claim("shows", "one"))
    body["spec"]["containers"][0].update(image=pool.shell_image(), imagePullPolicy="IfNotPresent",
                                         command=SHOW_CONTAINER)
    k8s.core.create_namespaced_pod(ns, body)
    checks.containers_running(k8s, ns, "shows", timeout=120)
    claim = checks.pod_claim(k8s, ns, "shows")
    (result,) = claim.status.allocation.devices.results
    assert (result.driver, result.pool, result.device) == (pool.driver, pool.pool, pool.names[0])

    written = cdi_specs.cdi_specs_of(cdi_dir, claim.metadata.uid)
    if not written:
        pytest.skip(f"driver {pool.driver} wrote no CDI spec naming claim {claim.metadata.uid} in {cdi_dir}: it "
                    "injects its devices another way, so there is no CDI edit to compare")
    env, device_nodes, mounts = _edits(written)
    assert env or device_nodes or mounts, f"the CDI spec(s) of the claim edit nothing: {[p.name for p in written]}"

    text = k8s.core.read_namespaced_pod_log("shows", ns, container="main")
    wait.until("pod shows to print what it sees", lambda: objects.ENV_DONE in text or None, 1)
    env_part, _, rest = text.partition(MOUNTS)
    mount_part, _, dev_part = rest.partition(DEVICES)
    seen_env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    seen_mounts = {fields[1] for fields in (line.split() for line in mount_part.splitlines()) if len(fields) > 1}
    seen_devices = set(dev_part.split())
    where = f"claim {ns}/{claim.metadata.name} (uid {claim.metadata.uid}) of {pool.driver}, spec(s) " \
            f"{', '.join(p.name for p in written)}"
    missing_env = {k: sorted(v) for k, v in env.items() if seen_env.get(k) not in v}
    assert not missing_env, f"{where}: the container lacks the CDI environment {missing_env} (it has " \
                            f"{ {k: seen_env.get(k) for k in missing_env} })"
    assert device_nodes <= seen_devices, f"{where}: device nodes missing in the container: " \
                                         f"{sorted(device_nodes - seen_devices)}"
    assert mounts <= seen_mounts, f"{where}: mounts missing in the container: {sorted(mounts - seen_mounts)}"

    # Unprepare (the pod goes) removes every CDI spec of the claim.
    k8s.core.delete_namespaced_pod("shows", ns)
    wait.until("pod shows to be gone (after NodeUnprepareResources)",
               lambda: not k8s.core.list_namespaced_pod(ns).items, 120,
               diagnostics=lambda: wait.describe_namespace(k8s, ns))
    # The kubelet may unprepare after the pod object is gone (its pod clean-up): give it a deadline.
    try:
        wait.until(f"the CDI spec(s) of {where} to be removed by NodeUnprepareResources",
                   lambda: not cdi_specs.cdi_specs_of(cdi_dir, claim.metadata.uid), 60)
    except wait.WaitTimeout:
        left = cdi_specs.cdi_specs_of(cdi_dir, claim.metadata.uid)
        pytest.fail(f"{where}: NodeUnprepareResources left CDI spec(s) behind 60 s after the pod went: "
                    f"{', '.join(map(str, left))}", pytrace=False)


def _registration_dir(request, node: str) -> Path | None:
    """The kubelet's plugin registration directory on `node`, where the harness knows it: the local
    backend's real node (the fake driver's plugins there, or the vendor's plugin it started)."""
    vendor = vendor_driver(request.config)
    if vendor is None:
        return request.getfixturevalue("real_node").node.dirs.plugins_registry
    if vendor.kubelet_plugin is None:
        return None  # the vendor starts its plugin itself: the harness does not know where it registers
    return next((p.registration_dir for p in request.getfixturevalue("vendor_plugins") if p.node == node), None)


def advertised_services(registration_dir: Path, driver: str) -> tuple[Path, list[str]] | None:
    """(registration socket, supported_versions) of `driver`'s plugin, as the kubelet's plugin watcher
    reads them (Registration.GetInfo on the newest `<driver>...reg.sock`); None when it has no socket."""
    sockets = sorted((p for p in registration_dir.glob("*reg.sock") if p.name.startswith(driver)),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for socket in sockets:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            request = registration.InfoRequest()  # type: ignore[attr-defined]  # generated, no stubs
            info = registration_grpc.RegistrationStub(channel).GetInfo(request, timeout=10)
        if info.name == driver:
            return socket, list(info.supported_versions)
    return None


@pytest.mark.dra_feature("ResourceHealthStatus", maturity="beta", discovered=True)
def test_plugin_health_reaches_allocated_resources_status(request, k8s, dra_namespace, kubelet_pool, record_property):
    """Where the driver's plugin serves DRAResourceHealth (its registration advertises it), the kubelet
    reports the health of the claim's device in the container's allocatedResourcesStatus: Healthy for
    a free device without a taint. A plugin that serves no health: not applicable (a failure if the
    vendor file claims ResourceHealthStatus)."""
    ns, pool = dra_namespace, kubelet_pool
    registration_dir = _registration_dir(request, pool.node)
    if registration_dir is None:
        pytest.skip(f"the kubelet's plugin registration directory on node {pool.node} is not known to the harness "
                    "(it knows the local backend's real node, where it starts the plugin from spec.kubeletPlugin): "
                    f"it cannot ask the plugin of {pool.driver} whether it serves DRAResourceHealth")
    found = advertised_services(registration_dir, pool.driver)
    assert found is not None, f"driver {pool.driver}: no registration socket of its plugin in {registration_dir} on " \
                              f"node {pool.node}, yet its devices there are prepared by the kubelet"
    socket, versions = found
    if not any(v.endswith(".DRAResourceHealth") for v in versions):
        vendor = vendor_driver(request.config)
        claimed = vendor is not None and "ResourceHealthStatus" in vendor.features
        assert not claimed, (f"{vendor.source if vendor else ''}: spec.features claims ResourceHealthStatus, but the "
                             f"plugin of {pool.driver} on node {pool.node} serves no DRAResourceHealth (its "
                             f"registration {socket} advertises {versions})")
        record_property("dra_not_applicable", f"{pool.driver} serves no DRAResourceHealth")
        pytest.skip(f"not applicable: {pool.driver} serves no DRAResourceHealth (its registration on node {pool.node} "
                    f"advertises {', '.join(versions)})")

    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one"))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("health", "one")))
    checks.containers_running(k8s, ns, "health", timeout=120)
    claim = checks.pod_claim(k8s, ns, "health")
    (result,) = claim.status.allocation.devices.results
    where = (f"driver {pool.driver} (serves {', '.join(v for v in versions if 'Health' in v)}), node {pool.node}, "
             f"claim {ns}/{claim.metadata.name}, device {result.driver}/{result.pool}/{result.device}")

    def reported() -> dict[str, str]:
        statuses = k8s.core.read_namespaced_pod("health", ns).status.container_statuses or []
        return {r.resource_id: r.health for entry in (statuses[0].allocated_resources_status or [] if statuses else [])
                if entry.name == "claim:gpu" or entry.name.startswith("claim:gpu/") for r in entry.resources or []}

    try:
        wait.until(f"the kubelet to report the device of {where} Healthy in allocatedResourcesStatus",
                   lambda: set(reported().values()) == {"Healthy"}, 60)
    except wait.WaitTimeout:
        pytest.fail(f"{where}: allocatedResourcesStatus of pod health reports {reported() or 'nothing'} 60 s after "
                    "it started, not Healthy (the plugin's DRAResourceHealth stream did not report the device, or "
                    "reported it unhealthy)", pytrace=False)

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

import pytest
import yaml

from conformance import checks, objects, under_test
from harness.k8s import wait

pytestmark = [pytest.mark.needs_kubelet, pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

MOUNTS, DEVICES = "--- mounts ---", "--- devices ---"
# prints the whole environment, the mount table and every path under /dev, then waits
SHOW_CONTAINER = ["sh", "-c", f"env; echo '{MOUNTS}'; cat /proc/mounts; echo '{DEVICES}'; find /dev; "
                              f"echo '{objects.ENV_DONE}'; exec sleep 3600"]


@pytest.fixture
def kubelet_pool(request, devices_under_test):
    """One device of the driver under test on a node run by a real kubelet, or skip naming why."""
    from harness.pytest_plugin.plugin import vendor_driver

    if vendor_driver(request.config) is None:
        from functools import partial

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
    cdi_dir = under_test.known_cdi_dir(dra_cluster, pool.node)
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

    written = under_test.cdi_specs_of(cdi_dir, claim.metadata.uid)
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
                   lambda: not under_test.cdi_specs_of(cdi_dir, claim.metadata.uid), 60)
    except wait.WaitTimeout:
        left = under_test.cdi_specs_of(cdi_dir, claim.metadata.uid)
        pytest.fail(f"{where}: NodeUnprepareResources left CDI spec(s) behind 60 s after the pod went: "
                    f"{', '.join(map(str, left))}", pytrace=False)

"""Driver checks: what a driver publishes is well-formed and consistent (issue item 8).

In the default mode the driver under test is the fake driver publishing `dgx-h100` and `a100-mig`; in
vendor mode (`--dra-driver-config`) it is the vendor's driver, as it is. Each failure names the
pool/device and the defect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance import cdi_specs, checks, class_selectors, container_view, driver_checks, objects
from fake_devices import faults, render
from harness.config import capabilities
from harness.k8s import wait
from harness.k8s.nodes import SHELL_IMAGE
from harness.pytest_plugin.plugin import node_runtime_query, vendor_driver
from harness.sanity import rules


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
@pytest.mark.parametrize("check", sorted(driver_checks.ALL_CHECKS))
def test_published_slices(driver_under_test, check, record_property):
    slices = driver_under_test.slices()
    assert slices, f"driver(s) {', '.join(driver_under_test.drivers)} publish no ResourceSlices"
    applies, missing = driver_checks.APPLIES.get(check, (lambda _: True, ""))
    if not applies(slices):  # a check over nothing is no pass
        record_property("dra_not_applicable", missing)
        pytest.skip(f"not applicable: driver(s) {', '.join(driver_under_test.drivers)} {missing}")
    defects = driver_checks.ALL_CHECKS[check](slices)
    assert not defects, f"{check}: " + "; ".join(defects[:10])


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_slices_belong_to_the_clusters_nodes(request, driver_under_test, k8s):
    """No slice for a node that does not exist; in vendor mode, every node the vendor file's
    nodeSelector names has a pool with devices of every driver."""
    slices = driver_under_test.slices()
    defects = driver_checks.nodes_exist(slices, {n.metadata.name for n in k8s.core.list_node().items})
    vendor = vendor_driver(request.config)
    if vendor is not None and vendor.node_selector:
        expected = sorted(n.metadata.name for n in k8s.core.list_node(label_selector=vendor.node_selector).items)
        defects += driver_checks.pools_on_nodes(slices, vendor.drivers, expected)
    assert not defects, "slices and nodes: " + "; ".join(defects[:10])


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_device_classes_select_the_drivers_devices_only(driver_under_test, k8s, record_property):
    """Each DeviceClass of the driver under test selects some of its devices and no device of
    another driver, and fails on none (its CEL selectors evaluated over every published device)."""
    if not driver_under_test.classes:
        record_property("dra_not_applicable", "names no DeviceClass")
        pytest.skip("not applicable: the driver under test names no DeviceClass (spec.deviceClasses)")
    everything = [k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items]
    defects, unevaluated = [], []
    for where, name in sorted(driver_under_test.classes.items()):
        device_class = k8s.api_client.sanitize_for_serialization(k8s.resource.read_device_class(name))
        selection = class_selectors.evaluate(device_class, everything)
        if selection.not_evaluated:
            unevaluated.append(f"{name}: {selection.not_evaluated}")
        defects += class_selectors.defects(selection, driver_under_test.drivers, where)
    assert not defects, "device classes: " + "; ".join(defects)
    if unevaluated and len(unevaluated) == len(driver_under_test.classes):
        record_property("dra_not_applicable", "selectors not evaluable here")
        pytest.skip("not applicable: no class selector could be evaluated here: " + "; ".join(unevaluated))


PUBLISHED_CAPABILITIES = capabilities.PUBLISHED


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_claimed_capabilities_are_published(request, driver_under_test, record_property):
    """A feature the vendor file claims (spec.features) that needs something in the slices: the slices
    show it. A claim the slices contradict is a failure, not a skip."""
    vendor = vendor_driver(request.config)
    claimed = sorted(set(vendor.features) & set(PUBLISHED_CAPABILITIES)) if vendor is not None else []
    if not claimed:
        record_property("dra_not_applicable", "claims no feature that shows in the slices")
        pytest.skip("not applicable: the driver under test claims no feature that shows in its slices ("
                    + ", ".join(sorted(PUBLISHED_CAPABILITIES)) + ")")
    slices = driver_under_test.slices()
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    contradicted = [f"spec.features claims {feature}, but no slice of {', '.join(driver_under_test.drivers)} "
                    f"publishes {PUBLISHED_CAPABILITIES[feature][0]}"
                    for feature in claimed if not PUBLISHED_CAPABILITIES[feature][1](slices, devices)]
    assert not contradicted, f"{vendor.source}: " + "; ".join(contradicted)


@pytest.mark.fake_devices("fault injection (a driver that taints a device on demand)")
@pytest.mark.dra_feature("DRADeviceTaints", maturity="ga")
def test_device_fault_is_published_as_a_taint(driver_under_test, k8s, dra_namespace):
    fake = driver_under_test.fake
    if fake is None:
        pytest.skip("needs fault injection, which only the fake driver offers (vendor mode tests your driver as is)")
    node = driver_under_test.nodes[0]
    faults.set_fault(k8s.core, dra_namespace, fake.config.faults_configmap, node, "gpu-0", "unhealthy")

    def tainted():
        for s in driver_under_test.slices():
            if s["spec"]["pool"]["name"] == node and s["spec"]["driver"] == fake.drivers.gpu:
                for device in s["spec"].get("devices") or []:
                    if device["name"] == "gpu-0" and any(t["key"] == render.FAULT_TAINT_KEY and
                                                         t["effect"] == "NoExecute" for t in device.get("taints") or []):
                        return True
        return False

    try:
        wait.until("the unhealthy device gpu-0 to be published with a NoExecute taint", tainted, 30)
    except wait.WaitTimeout:
        pytest.fail(f"driver did not publish a taint for an unhealthy device: {node}/gpu-0 has no NoExecute taint "
                    "30 s after the fault", pytrace=False)


# --- where a kubelet runs: the driver's node half ------------------------------------------------

@dataclass
class KubeletTarget:
    driver: str
    device_class: str
    node: str
    devices: int  # how many of the driver's devices on the node the class selects


@dataclass
class KubeletTargets:
    targets: list[KubeletTarget]
    image: str
    command: list[str] | None
    pull_policy: str
    cdi_dirs: dict[str, Path]  # node -> its CDI spec directory, where known (the local backend's real node)
    runtimes: dict[str, tuple[str, ...]]  # node -> argv that queries its container runtime, where reachable


def _known_cdi_dirs(dra_cluster, nodes) -> dict[str, Path]:
    """The CDI directories of those `nodes` the cluster's backend can read (the local backend's real node, kind's
    nodes; none of your own cluster's)."""
    found = {node: cdi_specs.known_cdi_dir(dra_cluster, node) for node in nodes}
    return {node: cdi_dir for node, cdi_dir in found.items() if cdi_dir is not None}


def _known_runtimes(dra_cluster, nodes) -> dict[str, tuple[str, ...]]:
    found = {node: node_runtime_query(dra_cluster, node) for node in nodes}
    return {node: query for node, query in found.items() if query}


def _cdi_specs_of(cdi_dir: Path | None, claim_uid: str) -> list[Path]:
    """The CDI spec files that mention the claim (drivers name them after its UID)."""
    return cdi_specs.cdi_specs_of(cdi_dir, claim_uid) if cdi_dir is not None else []


def _pair_classes_with_drivers(k8s, vendor, kubelet_nodes: list[str]) -> tuple[list[KubeletTarget], list[str]]:
    """One (driver, class, node) per vendor driver with devices on a kubelet node, the class being one
    whose selectors select that driver's devices there (evaluated over the published slices, not
    guessed from names); and notes on drivers no class selects."""
    everything = [k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items]
    selections = []
    for name in sorted(set(vendor.device_classes.values())):
        found = k8s.api_client.sanitize_for_serialization(k8s.resource.read_device_class(name))
        selections.append(class_selectors.evaluate(found, everything))
    targets, notes = [], []
    for node in kubelet_nodes:
        pools = {(s["spec"]["driver"], s["spec"]["pool"]["name"]) for s in everything
                 if s["spec"].get("nodeName") == node and s["spec"]["driver"] in vendor.drivers}
        for driver in sorted({d for d, _ in pools}):
            here = [sel for sel in selections
                    if any(d == driver and (d, p) in pools for d, p, _ in sel.selected)]
            # a class that selects only this driver's devices cannot be allocated from another one
            here.sort(key=lambda sel: (sel.drivers() != {driver}, sel.name))
            if here:
                count = sum(1 for d, p, _ in here[0].selected if d == driver and (d, p) in pools)
                targets.append(KubeletTarget(driver, here[0].name, node, count))
            else:
                notes.append(f"no DeviceClass of the vendor file selects the devices of {driver} on {node}")
    return targets, notes


@pytest.fixture
def kubelet_targets(request, k8s, cluster_facts, dra_namespace) -> KubeletTargets:
    """What pods the kubelet must prepare: per vendor driver with devices on a kubelet node, a class
    that selects them there; or the fake driver with its kubelet plugins on the local backend's real
    node."""
    vendor = vendor_driver(request.config)
    if vendor is not None:
        request.getfixturevalue("vendor_turn")  # the vendor's devices: one test at a time
        if not vendor.device_classes:
            pytest.skip("the vendor file names no deviceClasses to request a device from")
        targets, notes = _pair_classes_with_drivers(k8s, vendor, cluster_facts.kubelet_nodes)
        if not targets:
            pytest.skip(f"driver(s) {', '.join(vendor.drivers)} publish no devices a vendor class selects on a node "
                        f"run by a kubelet (kubelet nodes: {', '.join(cluster_facts.kubelet_nodes) or 'none'})"
                        + (f"; {'; '.join(notes)}" if notes else ""))
        # the default image exists only on the local real node, which never pulls
        cluster = request.getfixturevalue("dra_cluster")
        return KubeletTargets(targets, vendor.test_image, None, "Never" if vendor.default_image else "IfNotPresent",
                              _known_cdi_dirs(cluster, cluster_facts.kubelet_nodes),
                              _known_runtimes(cluster, cluster_facts.kubelet_nodes))
    real_node = request.getfixturevalue("real_node")
    fake = request.getfixturevalue("fake_driver")({real_node.name: "tiny"})
    real_node.run_for(fake)
    cluster = request.getfixturevalue("dra_cluster")
    return KubeletTargets([KubeletTarget(fake.drivers.gpu, f"{fake.config.instance}-gpu", real_node.name,
                                         2)],  # tiny: two GPUs
                          SHELL_IMAGE, objects.IDLE, "Never",
                          # the CDI directory as a directory of this machine: not a kind worker's
                          _known_cdi_dirs(cluster, [real_node.name]), _known_runtimes(cluster, [real_node.name]))


@pytest.mark.needs_kubelet
@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_kubelet_prepares_and_unprepares_the_drivers_claims(k8s, dra_namespace, kubelet_targets):
    """Per driver and kubelet node: a pod with a claim on the driver's devices starts there
    (NodePrepareResources succeeded), its container keeps running, and the kubelet counts the prepared
    claim; deleting the pod unprepares it (count back, no failed gRPC call to the driver). Judged from
    the kubelet's own metrics, so it holds for any driver."""
    ns = dra_namespace
    for i, target in enumerate(kubelet_targets.targets):
        driver, node, pod = target.driver, target.node, f"prepared-{i}"
        where = f"driver {driver} on node {node} (class {target.device_class})"
        before = checks.kubelet_dra_metrics(k8s, node, driver)
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(pod, target.device_class))
        k8s.core.create_namespaced_pod(ns, objects.pod_on_node(pod, node, kubelet_targets.image,
                                                              command=kubelet_targets.command, claim_template=pod,
                                                              pull_policy=kubelet_targets.pull_policy))
        checks.containers_running(k8s, ns, pod, timeout=120)
        claim = checks.pod_claim(k8s, ns, pod)
        allocated = {r.driver for r in claim.status.allocation.devices.results}
        assert allocated == {driver}, f"{where}: the claim was allocated devices of {sorted(allocated)}"
        during = checks.kubelet_dra_metrics(k8s, node, driver)
        assert during["in_use"] == before["in_use"] + 1, f"{where}: kubelet claims in use {before} -> {during}"
        assert during.get("NodePrepareResources/OK", 0) > before.get("NodePrepareResources/OK", 0), \
            f"{where}: the kubelet made no successful NodePrepareResources call to the driver: {before} -> {during}"
        checks.still_running(k8s, ns, pod)
        cdi_dir = kubelet_targets.cdi_dirs.get(node)
        written = _cdi_specs_of(cdi_dir, claim.metadata.uid)  # a driver may inject without CDI: then none

        k8s.core.delete_namespaced_pod(pod, ns)
        wait.until(f"pod {pod} to be gone (after NodeUnprepareResources)",
                   lambda: pod not in {p.metadata.name for p in k8s.core.list_namespaced_pod(ns).items}, 120,
                   diagnostics=lambda: wait.describe_namespace(k8s, ns))
        try:  # the kubelet may unprepare after the pod object is gone (its pod clean-up): a deadline
            wait.until(f"{where}: the kubelet to count the claim unprepared",
                       lambda: checks.kubelet_dra_metrics(k8s, node, driver)["in_use"] == before["in_use"], 60)
        except wait.WaitTimeout:
            pass  # named below, with the numbers
        after = checks.kubelet_dra_metrics(k8s, node, driver)
        assert after["in_use"] == before["in_use"], f"{where}: kubelet claims in use {before} -> {after}"
        assert after.get("NodeUnprepareResources/OK", 0) > during.get("NodeUnprepareResources/OK", 0), \
            f"{where}: the kubelet made no successful NodeUnprepareResources call to the driver: {during} -> {after}"
        # failed calls to this driver (the kubelet's per-operation error counts mix every driver on the node)
        for method in ("NodePrepareResources", "NodeUnprepareResources"):
            failed, failed_before = checks.grpc_failures(after, method), checks.grpc_failures(before, method)
            assert failed == failed_before, (f"{where}: the kubelet's {method} calls to the driver failed during "
                                             f"the test: by status code {failed_before} -> {failed}")
        # the kubelet may unprepare after the pod object is gone (its pod clean-up): give it a deadline
        if cdi_dir is not None:
            try:
                wait.until(f"{where}: the CDI spec(s) of claim {claim.metadata.name} to be removed",
                           lambda: not _cdi_specs_of(cdi_dir, claim.metadata.uid), 60)
            except wait.WaitTimeout:
                pass  # named below
        left = _cdi_specs_of(cdi_dir, claim.metadata.uid)
        assert not left, (f"{where}: NodeUnprepareResources left CDI spec(s) of claim {claim.metadata.name} "
                          f"(uid {claim.metadata.uid}) behind: {', '.join(map(str, left))} (written at prepare: "
                          f"{', '.join(p.name for p in written) or 'none'})")


def _not_applicable(request, why: str):
    request.node.user_properties.append(("dra_not_applicable", why))
    pytest.skip(f"not applicable: {why}")


@pytest.mark.needs_kubelet
@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_each_container_is_given_only_the_devices_of_its_request(request, k8s, dra_namespace, kubelet_targets):
    """CT-CONTAINER-DEVICES (docs/contract.md): a pod of a claim with two requests, one container naming
    each (`resources.claims[].request`), one naming the whole claim and one with no claim. The containers'
    OCI specs, read from the node's container runtime after CDI injection, must hold the CDI edits of their
    own request's device and none of the other's. Image-independent, so it holds for any driver."""
    ns, checked, skipped = dra_namespace, 0, []
    for i, target in enumerate(kubelet_targets.targets):
        where = f"driver {target.driver} on node {target.node} (class {target.device_class})"
        runtime, cdi_dir = kubelet_targets.runtimes.get(target.node), kubelet_targets.cdi_dirs.get(target.node)
        if not runtime or cdi_dir is None:
            skipped.append(f"{where}: the node's container runtime and CDI directory are out of this machine's reach")
            continue
        if target.devices < 2:
            skipped.append(f"{where}: needs two devices the class selects on one node, the node has {target.devices}")
            continue
        pod = f"split-{i}"
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(pod, requests=[
            objects.request(target.device_class, name="first"), objects.request(target.device_class, name="second")]))
        body = objects.pod_on_node(pod, target.node, kubelet_targets.image, command=kubelet_targets.command,
                                   claim_template=pod, pull_policy=kubelet_targets.pull_policy)
        template = body["spec"]["containers"][0]
        body["spec"]["containers"] = [
            {**template, "name": "c-first", "resources": {"claims": [{"name": "gpu", "request": "first"}]}},
            {**template, "name": "c-second", "resources": {"claims": [{"name": "gpu", "request": "second"}]}},
            {**template, "name": "c-whole", "resources": {"claims": [{"name": "gpu"}]}},
            {key: value for key, value in {**template, "name": "c-none"}.items() if key != "resources"}]
        k8s.core.create_namespaced_pod(ns, body)
        checks.containers_running(k8s, ns, pod, timeout=120)
        claim = checks.pod_claim(k8s, ns, pod)
        results = {r.request: (r.pool, r.device) for r in claim.status.allocation.devices.results}
        assert set(results) == {"first", "second"}, f"{where}: claim {claim.metadata.name} allocated {results}"
        if results["first"] == results["second"]:  # one shareable device for both requests
            skipped.append(f"{where}: both requests got device {'/'.join(results['first'])} (shared), nothing to "
                           "keep apart")
            continue
        statuses = k8s.core.read_namespaced_pod(pod, ns).status.container_statuses or []
        given = {s.name: container_view.container_items(runtime, s.container_id) for s in statuses}
        cdi_devices = container_view.claim_cdi_devices(cdi_dir, claim.metadata.uid)
        if not cdi_devices:
            skipped.append(f"{where}: the driver wrote no CDI spec for claim {claim.metadata.name} in {cdi_dir}")
            continue
        problems, why_not = container_view.isolation_problems(where, claim.metadata.name, results, given,
                                                              given["c-none"], cdi_devices)
        if why_not:
            skipped.append(why_not)
            continue
        whole = [c.qualified for c in cdi_devices if any(container_view.named_after(c, d) for _, d in results.values())
                 and not container_view.given(c, given["c-whole"], given["c-none"])]
        if whole:
            problems.append(f"container c-whole names the whole claim but lacks CDI device(s) {', '.join(whole)}")
        if problems:  # the message starts with the rule (no "AssertionError:" before it)
            pytest.fail(rules.failure("CT-CONTAINER-DEVICES", f"{where}, claim {ns}/{claim.metadata.name}: "
                                      + "; ".join(problems)), pytrace=False)
        checked += 1
        k8s.core.delete_namespaced_pod(pod, ns)
    if not checked:
        _not_applicable(request, "; ".join(skipped) or "no driver with devices on a kubelet node")


@pytest.mark.dra_feature("DRAExtendedResource", maturity="ga")
def test_vendor_extended_resources_are_served_by_the_vendors_devices(request, k8s, dra_namespace):
    """Each extended resource of the vendor file, asked for as `resources.limits` (no claim in the pod
    spec), gets a generated claim allocated from the vendor's driver."""
    vendor = vendor_driver(request.config)
    if vendor is None:
        pytest.skip("vendor mode only: the fake driver's extended resources are tested in test_extended_resources.py")
    if not vendor.extended_resources:
        pytest.skip("the vendor file maps no extended resource (spec.extendedResources)")
    request.getfixturevalue("vendor_turn")  # the vendor's devices: one test at a time
    ns = dra_namespace
    for i, (kind, resource) in enumerate(sorted(vendor.extended_resources.items())):
        name = f"ext-{i}"
        body = objects.pod_with_extended_resources(name, {resource: "1"})
        body["spec"]["containers"][0].update(image=vendor.test_image,
                                             imagePullPolicy="Never" if vendor.default_image else "IfNotPresent")
        body["spec"]["tolerations"] = [{"key": objects.REAL_NODE_TAINT_KEY, "operator": "Exists",
                                        "effect": "NoSchedule"}]
        k8s.core.create_namespaced_pod(ns, body)
        _, claim = checks.extended_resource_claim(k8s, ns, name, timeout=60)
        allocated = checks.allocated_claim(k8s, ns, claim.metadata.name)
        drivers = {r.driver for r in allocated.status.allocation.devices.results}
        assert drivers and drivers <= set(vendor.drivers), (
            f"spec.extendedResources.{kind} ({resource}): the generated claim was allocated devices of "
            f"{sorted(drivers)}, not of {', '.join(vendor.drivers)}")
        k8s.core.delete_namespaced_pod(name, ns)

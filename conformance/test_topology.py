"""Topology alignment with claim constraints: `matchAttribute` (GA with DRA) makes the devices of the
listed requests share an attribute, `distinctAttribute` (DRAConsumableCapacity, beta) makes them all
differ. Checked against what the drivers publish: the standard attributes
`resource.kubernetes.io/numaNode` (int), `resource.kubernetes.io/pcieRoot` and
`resource.kubernetes.io/pciBusID` (strings), which the fake driver sets on GPUs (gpu.<d>), NVMe drives
(storage.<d>) and NICs (nic.<d>) alike, so a fully qualified attribute aligns devices of different
drivers.

Profiles: `tiny` has one GPU, one shareable NVMe drive and one NIC on each of its 2 NUMA nodes;
`dgx-h100` has 4 PCIe roots on 2 NUMA nodes, each root with 2 GPUs, 2 NICs and 1 NVMe drive.
A claim that cannot be aligned leaves its pod unschedulable; kube-scheduler reports
"cannot allocate all claims" for the node (PodScheduled=False, reason Unschedulable).
"""

from __future__ import annotations

from collections import Counter

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.fake_devices("profiles with NUMA and PCIe topology over three drivers (GPU, NIC, "
                                       "NVMe)")]
GA = pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
CONSUMABLE = pytest.mark.dra_feature("DRAConsumableCapacity", maturity="beta")

NUMA = objects.standard_attribute("numaNode")


def _claim_pod(k8s, ns: str, name: str, requests: list[dict], *constraints: dict) -> None:
    """A template `name` with these requests and constraints, and a pod `name` using it."""
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        name, requests=requests, constraints=list(constraints) or None))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(name, name))


def _allocated(k8s, ns: str, pod: str):
    checks.running(k8s, ns, pod)
    return checks.pod_claim(k8s, ns, pod)


def _refused(k8s, ns: str, pod: str) -> None:
    """The scheduler found no allocation: the pod is unschedulable for its claims, which stay unallocated."""
    condition = checks.unschedulable(k8s, ns, pod)
    assert "cannot allocate all claims" in condition.message, condition.message
    assert checks.pod_claim(k8s, ns, pod).status.allocation is None


def _devices(claim) -> list[str]:
    return sorted(device for _, _, device in checks.allocated_devices(claim))


@GA
def test_match_numa_node_across_requests_of_one_driver(k8s, dra_namespace, fake_driver, simulated_node):
    """Three GPUs for training and one for inference pinned to NUMA node 1: the constraint pulls the
    training GPUs to NUMA node 1 too (first fit alone would take NUMA node 0's)."""
    ns = dra_namespace
    gpu = f"{fake_driver({simulated_node: 'dgx-h100'}).config.instance}-gpu"
    _claim_pod(k8s, ns, "aligned", [objects.request(gpu, name="train", count=3),
                                    objects.request(gpu, name="infer", selectors=[f"{NUMA} == 1"])],
               objects.match_attribute(objects.NUMA_NODE, "train", "infer"))
    claim = _allocated(k8s, ns, "aligned")
    assert Counter(request for request, _, _ in checks.allocated_devices(claim)) == {"train": 3, "infer": 1}
    assert _devices(claim) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert set(checks.allocated_attribute(k8s, claim, objects.NUMA_NODE).values()) == {1}


@GA
def test_two_gpus_of_tiny_cannot_share_a_numa_node(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    gpu = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-gpu"
    _claim_pod(k8s, ns, "aligned", [objects.request(gpu, name="a"), objects.request(gpu, name="b")],
               objects.match_attribute(objects.NUMA_NODE, "a", "b"))
    _refused(k8s, ns, "aligned")

    # Control: without the constraint the same two GPUs are there to take.
    _claim_pod(k8s, ns, "unaligned", [objects.request(gpu, name="a"), objects.request(gpu, name="b")])
    claim = _allocated(k8s, ns, "unaligned")
    assert _devices(claim) == ["gpu-0", "gpu-1"]
    assert sorted(checks.allocated_attribute(k8s, claim, objects.NUMA_NODE).values()) == [0, 1]
    checks.unschedulable(k8s, ns, "aligned")


@GA
def test_match_numa_node_across_three_drivers(k8s, dra_namespace, fake_driver, simulated_node):
    """GPU (gpu.<d>) pinned to NUMA node 1, a NIC (nic.<d>) and an NVMe share (storage.<d>): all three on
    NUMA node 1."""
    ns = dra_namespace
    driver = fake_driver({simulated_node: "tiny"})
    instance = driver.config.instance
    _claim_pod(k8s, ns, "aligned", [objects.request(f"{instance}-gpu", name="gpu", selectors=[f"{NUMA} == 1"]),
                                    objects.request(f"{instance}-nic", name="nic"),
                                    objects.request(f"{instance}-nvme", name="nvme", capacity={"size": "10Gi"})],
               objects.match_attribute(objects.NUMA_NODE, "gpu", "nic", "nvme"))
    claim = _allocated(k8s, ns, "aligned")
    results = claim.status.allocation.devices.results
    assert sorted((r.request, r.driver, r.device) for r in results) == [
        ("gpu", driver.drivers.gpu, "gpu-1"), ("nic", driver.drivers.nic, "nic-1"),
        ("nvme", driver.drivers.storage, "nvme-1")]
    numa = checks.allocated_attribute(k8s, claim, objects.NUMA_NODE)
    assert len(numa) == 3 and set(numa.values()) == {1}


@GA
def test_mismatched_selectors_across_drivers_cannot_be_aligned(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    instance = fake_driver({simulated_node: "tiny"}).config.instance
    requests = [objects.request(f"{instance}-gpu", name="gpu", selectors=[f"{NUMA} == 0"]),
                objects.request(f"{instance}-nic", name="nic", selectors=[f"{NUMA} == 1"])]
    _claim_pod(k8s, ns, "aligned", requests, objects.match_attribute(objects.NUMA_NODE, "gpu", "nic"))
    _refused(k8s, ns, "aligned")

    _claim_pod(k8s, ns, "unaligned", requests)  # control: each selector alone is satisfiable
    claim = _allocated(k8s, ns, "unaligned")
    assert _devices(claim) == ["gpu-0", "nic-1"]
    checks.unschedulable(k8s, ns, "aligned")


@GA
def test_match_pcie_root_on_a_dgx(k8s, dra_namespace, fake_driver, simulated_node):
    """Two GPUs, two NICs and an NVMe drive behind one PCIe root; three GPUs never fit behind one."""
    ns = dra_namespace
    instance = fake_driver({simulated_node: "dgx-h100"}).config.instance
    _claim_pod(k8s, ns, "rail", [objects.request(f"{instance}-gpu", name="gpu", count=2),
                                 objects.request(f"{instance}-nic", name="nic", count=2),
                                 objects.request(f"{instance}-nvme", name="nvme")],
               objects.match_attribute(objects.PCIE_ROOT))  # no requests listed: applies to all
    claim = _allocated(k8s, ns, "rail")
    roots = checks.allocated_attribute(k8s, claim, objects.PCIE_ROOT)
    assert len(roots) == 5 and len(set(roots.values())) == 1
    [root] = set(roots.values())
    numa = set(checks.allocated_attribute(k8s, claim, objects.NUMA_NODE).values())
    assert len(numa) == 1  # a root belongs to one NUMA node
    assert Counter(request for request, _, _ in checks.allocated_devices(claim)) == {"gpu": 2, "nic": 2, "nvme": 1}

    _claim_pod(k8s, ns, "three", [objects.request(f"{instance}-gpu", count=3)],
               objects.match_attribute(objects.PCIE_ROOT))
    _refused(k8s, ns, "three")
    # Control: six GPUs are still free (none behind the root taken above, whose two GPUs are in use).
    _claim_pod(k8s, ns, "three-anywhere", [objects.request(f"{instance}-gpu", count=3)])
    anywhere = _allocated(k8s, ns, "three-anywhere")
    assert root not in checks.allocated_attribute(k8s, anywhere, objects.PCIE_ROOT).values()
    checks.unschedulable(k8s, ns, "three")


@CONSUMABLE
def test_distinct_attribute_puts_shares_on_different_drives(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    nvme = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-nvme"
    share = {"size": "10Gi"}

    def shares(*names: str, selectors=()) -> list[dict]:
        return [objects.request(nvme, name=n, capacity=share, selectors=selectors) for n in names]

    # Without a constraint one drive can serve both shares of a claim (both requests pinned to it) ...
    pinned = [f"{NUMA} == 0"]
    _claim_pod(k8s, ns, "same-drive", shares("a", "b", selectors=pinned))
    same = _allocated(k8s, ns, "same-drive")
    a, b = same.status.allocation.devices.results
    assert (a.device, b.device) == ("nvme-0", "nvme-0") and a.share_id != b.share_id
    # ... with distinctAttribute the two shares land on two drives,
    _claim_pod(k8s, ns, "distinct", shares("a", "b"), objects.distinct_attribute(objects.PCI_BUS_ID, "a", "b"))
    distinct = _allocated(k8s, ns, "distinct")
    assert _devices(distinct) == ["nvme-0", "nvme-1"]
    bus_ids = checks.allocated_attribute(k8s, distinct, objects.PCI_BUS_ID)
    assert len(set(bus_ids.values())) == 2
    # ... and neither three distinct drives (tiny has two) nor two distinct ones on NUMA node 0 exist.
    _claim_pod(k8s, ns, "three-drives", shares("a", "b", "c"), objects.distinct_attribute(objects.PCI_BUS_ID))
    _refused(k8s, ns, "three-drives")
    _claim_pod(k8s, ns, "pinned-distinct", shares("a", "b", selectors=pinned),
               objects.distinct_attribute(objects.PCI_BUS_ID, "a", "b"))
    _refused(k8s, ns, "pinned-distinct")


@CONSUMABLE
def test_distinct_pcie_roots_for_gpus(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    gpu = f"{fake_driver({simulated_node: 'dgx-h100'}).config.instance}-gpu"
    _claim_pod(k8s, ns, "spread", [objects.request(gpu, count=4)], objects.distinct_attribute(objects.PCIE_ROOT))
    claim = _allocated(k8s, ns, "spread")
    roots = checks.allocated_attribute(k8s, claim, objects.PCIE_ROOT)
    assert sorted(roots.values()) == ["pci0000:16", "pci0000:38", "pci0000:8a", "pci0000:ba"]

    _claim_pod(k8s, ns, "five", [objects.request(gpu, count=5)], objects.distinct_attribute(objects.PCIE_ROOT))
    _refused(k8s, ns, "five")  # four roots, four free GPUs left, but never five distinct roots

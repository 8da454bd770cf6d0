"""Device compatibility groups (DRADeviceCompatibilityGroups, alpha in 1.37, off by default).

A device that consumes counters from a shared counter set may name up to two opaque groups in that
consumption (`consumesCounters[].compatibilityGroups`). Devices drawing from the same counter set may be
allocated at the same time only if the intersection of the groups of ALL of them is non-empty; a device
naming no group pairs only with siblings that name none either; devices of different counter sets are
never compared. Already allocated devices count as members of their set, so an incompatible peer blocks a
later claim until it is freed. The API allows at most 2 unique DNS-label groups.

Sources: k8s.io/api@v0.37.2 resource/v1/types.go (DeviceCounterConsumption.CompatibilityGroups,
DeviceCompatibilityGroupsMaxSize = 2), k8s.io/dynamic-resource-allocation@v0.37.2
structured/internal/experimental/compatibility_groups.go (compatibilityGroupIntersection.admits),
k8s.io/kubernetes@v1.37.2 pkg/apis/resource/v1/zz_generated.validations.go (maxItems=2, unique=set,
k8s-short-name: declarative validation), pkg/registry/resource/resourceslice/strategy.go
(dropDisabledDRADeviceCompatibilityGroupsFields), test/integration/dra/compatibility_groups.go.

Every test publishes a pool of its own on a simulated node (a made-up driver, no kubelet plugin): one
ResourceSlice with the counter sets and one with the devices (a slice holds devices or sharedCounters,
never both; resourceSliceCount 2). Every counter set has `mem: 8` and every device consumes 4 of it, so
two devices of a set always fit by counters: whatever is refused is refused by the groups.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DRADeviceCompatibilityGroups", maturity="alpha")]

NO_FIT = "cannot allocate all claims"  # the scheduler's DRA plugin, per node, when no devices fit together
HOSTNAME = "kubernetes.io/hostname"


def _counter_slice(name: str, driver: str, node: str, sets: list[str]) -> dict:
    body = objects.resource_slice(name, driver, node, [], slice_count=2)
    del body["spec"]["devices"]
    body["spec"]["sharedCounters"] = [{"name": s, "counters": {"mem": {"value": "8"}}} for s in sets]
    return body


def _device(name: str, counter_set: str, groups: list[str] | None) -> dict:
    consumption: dict = {"counterSet": counter_set, "counters": {"mem": {"value": "4"}}}
    if groups is not None:
        consumption["compatibilityGroups"] = groups
    # the device's name as an attribute, for CEL selectors (CEL sees attributes, not names)
    return {"name": name, "attributes": {"id": {"string": name}}, "consumesCounters": [consumption]}


class Pool:
    """A test's own driver, DeviceClass and two-slice pool on one simulated node."""

    def __init__(self, k8s, cluster_objects, unique_name, node: str, sets: list[str],
                 devices: dict[str, tuple[str, list[str] | None]]):
        self.k8s, self.node = k8s, node
        self.driver = unique_name("cg") + ".example.com"
        self.device_class = cluster_objects.device_class(objects.device_class(unique_name("cg"), self.driver)).metadata.name
        base = unique_name("cg")
        cluster_objects.resource_slice(_counter_slice(f"{base}-counters", self.driver, node, sets))
        created = cluster_objects.resource_slice(objects.resource_slice(
            f"{base}-devices", self.driver, node, [_device(n, s, g) for n, (s, g) in devices.items()], slice_count=2))
        grouped = {n for n, (_, g) in devices.items() if g}
        kept = {d.name for d in created.spec.devices
                if any(c.compatibility_groups for c in d.consumes_counters or [])}
        if grouped and not kept:
            pytest.skip("feature gate DRADeviceCompatibilityGroups is off in the cluster under test "
                        f"(ResourceSlice {created.metadata.name}: the API server dropped compatibilityGroups)")
        assert kept == grouped, f"ResourceSlice {created.metadata.name}: groups kept on {kept}, expected {grouped}"

    def where(self, *devices: str) -> str:
        return f"driver {self.driver}, node {self.node}, devices {', '.join(devices)}"

    def template(self, ns: str, name: str, devices: list[str]) -> None:
        """A claim template asking for all of `devices` (by name) in one request."""
        names = ", ".join(f'"{d}"' for d in devices)
        self.k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(name, requests=[
            objects.request(self.device_class, count=len(devices),
                            selectors=[f'device.attributes["{self.driver}"].id in [{names}]'])]))

    def pod(self, ns: str, name: str, template: str) -> None:
        self.k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(
            name, template, node_selector={HOSTNAME: self.node}))


@pytest.fixture
def pool(k8s, cluster_objects, unique_name, simulated_node):
    def make(sets: list[str], devices: dict[str, tuple[str, list[str] | None]]) -> Pool:
        return Pool(k8s, cluster_objects, unique_name, simulated_node, sets, devices)

    return make


def _allocated(k8s, ns: str, pod: str) -> list[str]:
    checks.running(k8s, ns, pod, timeout=120)
    return sorted(device for _, _, device in checks.allocated_devices(checks.pod_claim(k8s, ns, pod)))


def _refused(k8s, ns: str, pod: str, pool: Pool, *devices: str) -> None:
    condition = checks.unschedulable(k8s, ns, pod)
    assert checks.every_node_says(condition.message, NO_FIT, [pool.node]), (
        f"pod {pod} ({pool.where(*devices)}): {condition.message}")
    claim = checks.pod_claim(k8s, ns, pod)
    assert claim.status is None or claim.status.allocation is None, (
        f"claim {claim.metadata.name} of pod {pod} was allocated: {claim.status.allocation}")


def test_devices_sharing_a_group_are_co_allocated(k8s, dra_namespace, pool):
    ns = dra_namespace
    p = pool(["gpu-0", "gpu-1"], {
        "mig-0": ("gpu-0", ["mig"]), "mig-1": ("gpu-0", ["mig"]),
        # [mig, vgpu] and [vgpu] intersect in vgpu
        "both": ("gpu-1", ["mig", "vgpu"]), "vgpu": ("gpu-1", ["vgpu"]),
    })
    p.template(ns, "same-group", ["mig-0", "mig-1"])
    p.template(ns, "overlapping", ["both", "vgpu"])
    p.pod(ns, "same-group", "same-group")
    p.pod(ns, "overlapping", "overlapping")
    assert _allocated(k8s, ns, "same-group") == ["mig-0", "mig-1"], p.where("mig-0", "mig-1")
    assert _allocated(k8s, ns, "overlapping") == ["both", "vgpu"], p.where("both", "vgpu")


def test_devices_without_a_common_group_are_never_co_allocated(k8s, dra_namespace, pool):
    ns = dra_namespace
    p = pool(["gpu-0", "gpu-1"], {
        "mig": ("gpu-0", ["mig"]), "vgpu": ("gpu-0", ["vgpu"]),
        # no group pairs only with no group
        "plain": ("gpu-1", None), "grouped": ("gpu-1", ["mig"]),
    })
    p.template(ns, "disjoint", ["mig", "vgpu"])
    p.template(ns, "none-and-some", ["plain", "grouped"])
    p.pod(ns, "disjoint", "disjoint")
    p.pod(ns, "none-and-some", "none-and-some")
    # Both sets have counters for both devices (4 + 4 of 8): the groups alone refuse them.
    _refused(k8s, ns, "disjoint", p, "mig", "vgpu")
    _refused(k8s, ns, "none-and-some", p, "plain", "grouped")
    # Each device on its own is allocatable (what refused the pair was the pairing, not the device).
    p.template(ns, "one", ["vgpu"])
    p.pod(ns, "one", "one")
    assert _allocated(k8s, ns, "one") == ["vgpu"], p.where("vgpu")


def test_an_allocated_incompatible_peer_blocks_its_counter_set_until_freed(k8s, dra_namespace, pool):
    ns = dra_namespace
    p = pool(["gpu-0", "gpu-1"], {
        "a-mig": ("gpu-0", ["mig"]), "a-vgpu": ("gpu-0", ["vgpu"]), "b-vgpu": ("gpu-1", ["vgpu"]),
    })
    for device in ("a-mig", "a-vgpu", "b-vgpu"):
        p.template(ns, device, [device])
    p.pod(ns, "holder", "a-mig")
    assert _allocated(k8s, ns, "holder") == ["a-mig"], p.where("a-mig")

    # a-vgpu shares gpu-0 with the allocated a-mig and no group with it: refused, though counters remain.
    p.pod(ns, "blocked", "a-vgpu")
    _refused(k8s, ns, "blocked", p, "a-vgpu")
    # b-vgpu draws from gpu-1: never compared with a-mig, allocated meanwhile.
    p.pod(ns, "other-set", "b-vgpu")
    assert _allocated(k8s, ns, "other-set") == ["b-vgpu"], p.where("b-vgpu")

    # Freeing a-mig leaves gpu-0 without members: the waiting pod gets a-vgpu.
    k8s.core.delete_namespaced_pod("holder", ns)
    assert _allocated(k8s, ns, "blocked") == ["a-vgpu"], p.where("a-vgpu")


def test_api_validates_compatibility_groups(k8s, unique_name, simulated_node):
    """Dry-run creates: the API server validates fully and stores nothing."""
    driver = unique_name("cg") + ".example.com"

    def body(groups: list[str]) -> dict:
        return objects.resource_slice(unique_name("cg"), driver, simulated_node,
                                      [_device("dev-0", "gpu-0", groups)], slice_count=2)

    create = k8s.resource.create_resource_slice
    accepted = create(body(["mig", "vgpu"]), dry_run="All")
    groups = accepted.spec.devices[0].consumes_counters[0].compatibility_groups
    if not groups:
        pytest.skip("feature gate DRADeviceCompatibilityGroups is off in the cluster under test "
                    "(the API server dropped compatibilityGroups)")
    assert groups == ["mig", "vgpu"], f"ResourceSlice of driver {driver}: {groups}"

    field = "spec.devices[0].consumesCounters[0].compatibilityGroups"
    message = checks.rejected(create, body(["mig", "vgpu", "pt"]), dry_run="All")
    assert f"{field}: Too many: 3: must have at most 2 items" in message, message
    message = checks.rejected(create, body(["mig", "mig"]), dry_run="All")
    assert f'{field}[1]: Duplicate value: "mig"' in message, message
    message = checks.rejected(create, body(["MIG_1"]), dry_run="All")
    assert f'{field}[0]: Invalid value: "MIG_1": a lowercase RFC 1123 label must consist of' in message, message


# --- the same rule on the fake driver's MIG GPU (a profile's mig.compatibilityGroups) ---------------

HOMOGENEOUS_MIG = """  gpus:
  - model: A100-SXM4-80GB
    count: 1
    attach: [{pcieRoot: pci0000:10}]
    # one MIG size per GPU at a time: 1g.10gb instances pair with each other, never with a 3g.40gb one
    mig: {mode: dynamic, compatibilityGroups: {1g.10gb: [small], 3g.40gb: [large]}}
"""


@pytest.mark.fake_devices("a MIG profile with compatibility groups")
def test_the_fake_drivers_mig_sizes_in_different_groups_never_share_a_gpu(k8s, dra_namespace, fake_driver,
                                                                          simulated_node, tmp_path):
    """1g.10gb at memory slice 0 and 3g.40gb at slices 4-7 fit the A100's counters together; the groups alone
    keep them apart, while two 1g.10gb instances share the GPU."""
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: objects.node_profile(tmp_path, "homogeneous-mig", HOMOGENEOUS_MIG)})
    gpu = driver.drivers.gpu
    published = checks.published_device(k8s, gpu, node, "gpu-0-mig-1g-10gb-0")
    assert [list(c.compatibility_groups or []) for c in published.consumes_counters] == [["small"]], published
    device_class = f"{driver.config.instance}-mig"
    for size in ("1g.10gb", "3g.40gb"):
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
            size.replace(".", "-"), requests=[objects.request(
                device_class, selectors=[f'device.attributes["{gpu}"].profile == "{size}"'])]))

    def pod(name: str, template: str) -> None:
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(name, template,
                                                                           node_selector={HOSTNAME: node}))

    def allocated(name: str) -> str:
        checks.running(k8s, ns, name, timeout=120)
        (device,) = [d for _, _, d in checks.allocated_devices(checks.pod_claim(k8s, ns, name))]
        return device

    pod("small-a", "1g-10gb")
    first = allocated("small-a")
    assert first.startswith("gpu-0-mig-1g-10gb-"), f"pod small-a (driver {gpu}, node {node}): {first}"
    pod("large", "3g-40gb")
    condition = checks.unschedulable(k8s, ns, "large")
    assert checks.every_node_says(condition.message, NO_FIT, [node]), (
        f"pod large (driver {gpu}, node {node}, {first} allocated): {condition.message}")
    pod("small-b", "1g-10gb")
    second = allocated("small-b")
    assert second.startswith("gpu-0-mig-1g-10gb-") and second != first, (
        f"pod small-b (driver {gpu}, node {node}): {second} beside {first}")

    # With both 1g.10gb instances gone, the GPU has no member left: the 3g.40gb pod gets its instance.
    for name in ("small-a", "small-b"):
        k8s.core.delete_namespaced_pod(name, ns)
    assert allocated("large").startswith("gpu-0-mig-3g-40gb-"), f"pod large (driver {gpu}, node {node})"

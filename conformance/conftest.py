"""Fixtures and requirement checks shared by the conformance tests.

The cluster fixtures (`k8s`, `dra_namespace`, `fake_driver`, ...) come from the dra-harness pytest
plugin. Requirements are declared with markers and checked against what the cluster under test
reports (harness.k8s.discovery), so a test whose gate or API is off is skipped with that reason:

    @pytest.mark.dra_feature("DRAWorkloadResourceClaims", maturity="beta")
    @pytest.mark.dra_feature("ResourceHealthStatus", maturity="beta", discovered=True)  # runs unclaimed too
    @pytest.mark.dra_feature("DRADeviceBindingConditions", maturity="beta", api_only=True)  # the API server's rule
    @pytest.mark.requires_api("scheduling.k8s.io/v1beta1")
    @pytest.mark.needs_kubelet
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from conformance import capacity, checks, device_turns, objects, under_test
from conformance.published_devices import all_devices
from fake_devices.controller import INSTANCE_LABEL
from harness.k8s.client import Clients
from harness.k8s.discovery import ClusterFacts, discover
from harness.k8s.nodes import is_ready
from harness.pytest_plugin.plugin import shared_dir, vendor_driver

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SANITY_DIR = Path(__file__).parent / "sanity"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """conformance/sanity checks one kubelet plugin on a throwaway cluster of its own (`dra-harness sanity`):
    collected only when a vendor file names that plugin, never as part of the suite on a cluster."""
    if collection_path == SANITY_DIR and not config.getoption("--dra-sanity-driver-config"):
        return True
    return None
EPHEMERAL_LABEL = "dra-harness.x-k8s.io/ephemeral"  # nodes a test creates and deletes again: never "the" node


OWN_FAKE_DRIVER = pytest.StashKey[bool]()  # set by a fixture: this test checks a fake-driver instance of its own


def vendor_under_test(request: pytest.FixtureRequest):
    """The vendor's driver this test checks, or None when it checks the fake driver: without a vendor
    file, and under one with runFakeDriverTests for a test of the fake driver's own powers (marked
    fake_devices, or one a fixture gave the fake driver: see health monitors)."""
    vendor = vendor_driver(request.config)
    if vendor is not None and vendor.run_fake_driver_tests and (
            request.node.get_closest_marker("fake_devices") or request.node.stash.get(OWN_FAKE_DRIVER, False)):
        return None
    return vendor


@pytest.fixture(scope="session")
def cluster_facts(k8s: Clients) -> ClusterFacts:
    return discover(k8s)


@pytest.fixture(autouse=True)
def _requirements(request: pytest.FixtureRequest) -> None:
    markers = {m.name: m for m in request.node.iter_markers()}

    vendor = vendor_driver(request.config)
    if vendor is not None:
        if "fake_devices" in markers and not vendor.run_fake_driver_tests:
            need = markers["fake_devices"].args[0] if markers["fake_devices"].args else "profiles"
            pytest.skip(f"needs {need}, which only the fake driver offers; vendor mode tests your driver as it is "
                        "(spec.runFakeDriverTests: true runs these too)")
        for marker in request.node.iter_markers("dra_feature"):
            gate = marker.args[0]
            # discovered=True: the test finds out itself whether the driver has the capability (and says
            # "not applicable" when it has not), so it runs whether or not the vendor file claims it.
            # A test of the fake driver's own powers (run by runFakeDriverTests) checks a fake-driver
            # instance of its own: what the vendor's driver claims says nothing about that one.
            # api_only=True: the test checks the API server's own rules with objects of its own (no device of any
            # driver), so what the vendor's driver claims says nothing about it either; the gate must still be on.
            if gate not in vendor.features and gate != "DynamicResourceAllocation" \
                    and not marker.kwargs.get("discovered") and not marker.kwargs.get("api_only") \
                    and "fake_devices" not in markers:
                pytest.skip(f"driver {vendor.name} does not claim feature {gate}")
    if not ({"dra_feature", "requires_api", "needs_kubelet"} & set(markers)):
        return
    facts: ClusterFacts = request.getfixturevalue("cluster_facts")
    for marker in request.node.iter_markers("dra_feature"):
        gate = marker.args[0]
        if facts.gate(gate) is False:
            pytest.skip(f"feature gate {gate} is off in the cluster under test")
    for marker in request.node.iter_markers("requires_api"):
        for group_version in marker.args:
            if group_version not in facts.apis:
                pytest.skip(f"API {group_version} is not served by the cluster under test")
    if "needs_kubelet" in markers and not facts.kubelet_nodes:
        why = request.getfixturevalue("dra_cluster").real_nodes_reason
        pytest.skip("needs a node run by a real kubelet (this cluster has only simulated nodes"
                    + (f"; {why})" if why else ")"))


@pytest.fixture(scope="session")
def simulated_nodes(k8s: Clients) -> list[str]:
    """Ready KWOK nodes: pods bound there run without a kubelet or a node-side driver."""
    found = sorted(n.metadata.name for n in k8s.core.list_node().items
                   if (n.metadata.annotations or {}).get(KWOK_ANNOTATION) == "fake" and is_ready(n)
                   and (n.metadata.labels or {}).get(EPHEMERAL_LABEL) != "true")
    if not found:
        pytest.skip("needs a simulated (KWOK) node; the cluster under test has none")
    return found


@pytest.fixture(scope="session")
def simulated_node(simulated_nodes: list[str]) -> str:
    return simulated_nodes[0]


class DriverUnderTest:
    """The driver(s) the suite checks: the fake driver (default) or a vendor's (vendor mode)."""

    def __init__(self, k8s: Clients, drivers: tuple[str, ...], nodes: list[str], fake=None,
                 classes: dict[str, str] | None = None):
        self.k8s, self.drivers, self.nodes, self.fake = k8s, drivers, nodes, fake
        self.classes = classes or {}  # where it is named (a vendor file field) -> DeviceClass

    def slices(self) -> list[dict]:
        found = []
        for driver in self.drivers:
            for item in self.k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items:
                found.append(self.k8s.api_client.sanitize_for_serialization(item))
        return found


@pytest.fixture
def driver_under_test(request: pytest.FixtureRequest, k8s: Clients) -> DriverUnderTest:

    vendor = vendor_under_test(request)
    if vendor is not None:
        # in turn with the tests using the vendor's devices: one of them may take the driver away for a while
        # (test_kubelet_plugin_lifecycle.py stops its plugin until the kubelet wipes its slices)
        request.getfixturevalue("vendor_turn")
        return DriverUnderTest(k8s, vendor.drivers, [],
                               classes={f"spec.deviceClasses.{kind}": name for kind, name in vendor.device_classes.items()})
    nodes = request.getfixturevalue("simulated_nodes")
    fake_driver = request.getfixturevalue("fake_driver")
    profiles = {nodes[0]: "dgx-h100", nodes[-1 if len(nodes) > 1 else 0]: "a100-mig"} if len(nodes) > 1 \
        else {nodes[0]: "a100-mig"}
    fake = fake_driver(profiles)

    classes = {f"DeviceClass {c.metadata.name} of fake driver {fake.config.instance}": c.metadata.name for c in
               k8s.resource.list_device_class(label_selector=f"{INSTANCE_LABEL}={fake.config.instance}").items}
    return DriverUnderTest(k8s, fake.drivers.all(), sorted(profiles), fake, classes=classes)


@pytest.fixture
def vendor_turn(request: pytest.FixtureRequest, k8s: Clients, dra_namespace: str, cluster_objects):
    """Vendor mode: this test's turn at the vendor's devices (the tests of a run that use them take
    turns, across xdist workers), given back at teardown: its pods, PodGroups and claims deleted and
    waited for (the waiting pods first: conformance.device_turns), the kubelet's count of prepared claims
    back, and its cluster-scoped objects (a DeviceTaintRule on a device, a DeviceClass) deleted, a rule's
    deletion seen by the eviction controller, all before the next test's turn starts. A no-op with the
    fake driver."""

    vendor = vendor_driver(request.config)
    if vendor is None:
        yield
        return
    with device_turns.taking_turns(shared_dir(request.config)):
        yield
        device_turns.give_back(k8s, dra_namespace, vendor.drivers,
                               request.getfixturevalue("cluster_facts").kubelet_nodes)
        # cluster_objects' own teardown comes after this one (it was set up first): a rule left
        # tainting a device the next turn picks would make that test's pods unschedulable
        rules = cluster_objects.holds("DeviceTaintRule")
        cluster_objects.delete_all()
        if rules:  # a deleted NoExecute rule can still evict the next turn's pods (checks.taint_eviction_caught_up)
            checks.taint_eviction_caught_up(k8s, dra_namespace)


@pytest.fixture
def devices_under_test(request: pytest.FixtureRequest, k8s: Clients, dra_namespace: str, cluster_objects,
                       unique_name):
    """`devices_under_test(count=1)` -> a conformance.under_test.DevicePool: `count` free devices of the
    driver under test on one node (a fresh fake-driver instance, or the vendor's driver as it is), its
    DeviceClass and how to place pods there. In vendor mode the tests using the vendor's devices take
    turns (`vendor_turn`)."""

    make = partial(under_test.DevicePool, k8s, cluster_objects, unique_name)

    def pool(count: int = 1, **fake_options) -> under_test.DevicePool:
        """`fake_options` (e.g. variant=...) go to the fake driver; a vendor's driver is as it is."""
        vendor = vendor_under_test(request)  # when asked: a fixture may have given the test the fake driver
        if vendor is None:
            return under_test.fake_pool(k8s, request.getfixturevalue("fake_driver"),
                                        request.getfixturevalue("simulated_node"), count, make, **fake_options)
        request.getfixturevalue("vendor_turn")  # waits for this test's turn (once)
        return under_test.vendor_pool(k8s, vendor, request.getfixturevalue("cluster_facts"), count, make)

    return pool


def _pool_of_driver_under_test(request: pytest.FixtureRequest, k8s: Clients, cluster_objects, unique_name,
                               profile: str, build, amount, fake_only: dict | None = None) -> under_test.DevicePool:
    """`build(...)` (an under_test.*_pool) over a fresh fake-driver instance with `profile` on a simulated
    node, or over the vendor's driver in vendor mode (its tests take turns: `vendor_turn`)."""
    vendor = vendor_driver(request.config)
    make = partial(under_test.DevicePool, k8s, cluster_objects, unique_name)
    if vendor is None:
        fake = request.getfixturevalue("fake_driver")({request.getfixturevalue("simulated_node"): profile})
        classes = [c.metadata.name for c in k8s.resource.list_device_class(
            label_selector=f"{INSTANCE_LABEL}={fake.config.instance}").items]
        return build(k8s, fake.drivers.all(), classes, (), amount, make, image=objects.PAUSE_IMAGE,
                     pull_policy="IfNotPresent", vendor=False, fake=fake, **(fake_only or {}))
    request.getfixturevalue("vendor_turn")  # waits for this test's turn (once)
    return build(k8s, vendor.drivers, list(vendor.device_classes.values()),
                 request.getfixturevalue("cluster_facts").kubelet_nodes, amount, make, image=vendor.test_image,
                 pull_policy="Never" if vendor.default_image else "IfNotPresent", vendor=True)


@pytest.fixture
def partitions_under_test(request: pytest.FixtureRequest, k8s: Clients, dra_namespace: str, cluster_objects,
                          unique_name):
    """`partitions_under_test(sets=1)` -> a conformance.under_test.DevicePool whose `counter_sets` are
    `sets` free shared counter sets of one driver on one node, and whose devices are the devices that
    consume from them (partitionable devices): a fresh fake-driver instance with the a100-mig profile
    (MIG placements), or the vendor's driver where its slices show such devices. In vendor mode the tests
    using the vendor's devices take turns (`vendor_turn`)."""
    def pool(sets: int = 1) -> under_test.DevicePool:
        return _pool_of_driver_under_test(request, k8s, cluster_objects, unique_name, "a100-mig",
                                          under_test.partition_pool, sets)

    return pool


@pytest.fixture
def shareable_under_test(request: pytest.FixtureRequest, k8s: Clients, dra_namespace: str, cluster_objects,
                         unique_name):
    """`shareable_under_test(count=1)` -> a conformance.under_test.DevicePool of `count` free devices
    that allow multiple allocations and publish capacities with a request policy (consumable capacity):
    a fresh fake-driver instance's NVMe drives (profile tiny), or the vendor's driver where its slices
    show such devices. In vendor mode the tests using the vendor's devices take turns (`vendor_turn`)."""
    def pool(count: int = 1) -> under_test.DevicePool:
        return _pool_of_driver_under_test(request, k8s, cluster_objects, unique_name, "tiny",
                                          under_test.shareable_pool, count)

    return pool


@pytest.fixture
def fractional_under_test(request: pytest.FixtureRequest, k8s: Clients, dra_namespace: str, cluster_objects,
                          unique_name):
    """`fractional_under_test(count=1)` -> a conformance.under_test.DevicePool of `count` free devices
    (None: every such device of the node) that allow multiple allocations and publish a capacity whose
    requestPolicy.validRange has a fractional min, max or step (DRAFractionalCapacityRange): a fresh
    fake-driver instance's NVMe drives (profile nvme-storage, `ioShare`), or the vendor's driver where its
    slices show such devices. A vendor driver that publishes none: not applicable, or a failure when the
    vendor file claims DRAFractionalCapacityRange. In vendor mode the tests using the vendor's devices
    take turns (`vendor_turn`)."""
    vendor = vendor_driver(request.config)

    def pool(count: int | None = 1) -> under_test.DevicePool:
        if vendor is not None:
            # the turn first: another test may have the vendor's plugin (and so its slices) gone meanwhile
            request.getfixturevalue("vendor_turn")
            published = [d for driver in vendor.drivers for d in all_devices(k8s, driver)]
            missing = capacity.fractional_missing(vendor.drivers, published)
            if missing is not None:
                # a capability the vendor file claims and the slices contradict is a failure, not a skip
                if "DRAFractionalCapacityRange" in vendor.features:
                    pytest.fail(f"{vendor.source}: spec.features claims DRAFractionalCapacityRange, but {missing}",
                                pytrace=False)
                request.node.user_properties.append(("dra_not_applicable", missing))
                pytest.skip(f"not applicable: {missing}")
        return _pool_of_driver_under_test(request, k8s, cluster_objects, unique_name, "nvme-storage",
                                          under_test.fractional_pool, count, fake_only={"required": True})

    return pool

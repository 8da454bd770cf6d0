"""The devices of the driver under test, as a feature test asks for them.

A feature test that can apply to any DRA driver asks for `devices_under_test(count)` and gets `count`
free devices of one driver on one node, a DeviceClass of that driver which selects them, and the means
to place pods where those devices are. The fake driver is one implementation (a fresh instance per
test, on a simulated node), a vendor's driver another (its devices as the cluster has them, on a node
run by a real kubelet or not):

    pool = devices_under_test(2)
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("gpu", count=2))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("user", "gpu")))

Requests name the driver's own DeviceClass plus a selector that pins the chosen devices (by an
attribute whose value no other device of the driver shares, e.g. `uuid`), so a test counts exactly
the devices it was given, whatever else the driver publishes. Where nothing a selector sees tells the
devices apart (bare names), DeviceTaintRules, which select by name, taint every other device of the
driver for the test's turn instead, and requests for some of the test's devices tolerate just those. Where a test needs a class of its own (an
extendedResourceName, a narrower selector) it makes one over the same devices (`own_class`), labelled
and deleted at teardown.

In vendor mode the vendor's devices are shared by every test of the run, so tests that use them take
turns (a file lock of the run) and each gives its devices back before the next starts (its pods and
claims deleted, waited for). Devices that some claim of the cluster holds, or that carry a
NoSchedule/NoExecute taint, are not offered.

This module holds the pool a test gets (`DevicePool`) and the pools' makers; their parts are modules of
their own: the free devices found among the slices (`published_devices`), pinning a test's devices by
their attributes (`device_pinning`), partitionable devices' counter sets (`shared_counters`), the turns at
a vendor's devices (`device_turns`), and the amounts of shareable devices' capacity (`capacity`).
"""

from __future__ import annotations

import json

import pytest

from conformance import class_selectors, objects
from conformance.device_pinning import (
    _identity_name,
    attribute_literal,
    fingerprint,
    fingerprint_keys,
    fingerprints_unique,
    identity_attribute,
)
from conformance.published_devices import Device, _newest_slices, all_devices, free_devices
from conformance.shared_counters import CounterSet, counter_sets
from fake_devices import faults
from harness.config.capabilities import consumable, fractional
from harness.k8s import nodes as node_facts
from harness.k8s.client import Clients

LABEL = "dra-harness.x-k8s.io/test-class"  # on every DeviceClass a test makes over the driver's devices
# The taint of DeviceTaintRules that keep a test to its own devices where no attribute tells them apart.
PIN_TAINT_KEY = "dra-harness.x-k8s.io/not-this-test"
FAKE_PROFILES = ((2, "tiny"), (4, "gpu-4"), (8, "dgx-h100"))  # GPUs per node of the fake driver's profiles


class DevicePool:
    """`count` free devices of one driver on one node, and how to ask for them."""

    def __init__(self, k8s: Clients, cluster_objects, unique_name, *, driver: str, device_class: str, node: str,
                 devices: list[Device], identity: tuple[str, str] | None, identity_name: str, kubelet: bool,
                 image: str, pull_policy: str, vendor: bool, fake=None, counter_sets: tuple[CounterSet, ...] = (),
                 attribute_keys: frozenset[str] = frozenset(), pin_by_taints: bool = False):
        self.k8s, self._objects, self._unique_name = k8s, cluster_objects, unique_name
        self.driver, self.device_class, self.node = driver, device_class, node
        self.devices, self.kubelet, self.image, self.pull_policy = devices, kubelet, image, pull_policy
        self.vendor, self.fake = vendor, fake
        self.counter_sets = counter_sets  # partitionable devices: the sets the pool's devices consume from
        # identity None: no single attribute tells the driver's devices apart (partitions sharing their
        # device's uuid); a device is then pinned by all its attributes (`fingerprint`)
        self._identity, self._identity_name, self._keys = identity, identity_name, attribute_keys
        # pin_by_taints: the driver's other devices are tainted for the test (`taint_all_but_mine`), so a
        # request of the driver's class can only get these; a request of some of them tolerates just those
        self.pin_by_taints = pin_by_taints
        self._mine_tainted = False
        self._class_devices: dict[str, tuple] = {}  # own_class name -> its devices (pinned by taints)

    # --- asking for devices -----------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    @property
    def pool(self) -> str:
        return self.devices[0].pool

    @property
    def binding_conditions(self) -> bool:
        """Whether an allocation of these devices waits in the scheduler's PreBind for binding conditions."""
        return any(d.published.get("bindingConditions") for d in self.devices)

    def attribute(self, name: str) -> str:
        """CEL of an attribute in the driver's domain (`model` -> device.attributes["<driver>"].model)."""
        return f'device.attributes["{self.driver}"].{name}'

    def only(self, *devices: Device | str) -> str:
        """CEL true for exactly these devices (default: all the pool's) among all of the driver's."""
        chosen = [d if isinstance(d, Device) else self.device(d) for d in devices] or self.devices
        if self.pin_by_taints:
            if {d.name for d in chosen} != set(self.names):  # a selector cannot name a subset: tolerations can
                self._not_applicable(f"the test selects {len(chosen)} particular device(s) of its {len(self.devices)} "
                                     f"outside a request, but driver {self.driver} publishes nothing a selector can "
                                     "tell them apart by (no attribute differs)")
            return f"device.driver == {json.dumps(self.driver)}"  # the taints keep the test to its own devices
        if self._identity is None:
            return " || ".join(f"({fingerprint(self.driver, d.published, self._keys)})" for d in chosen)
        values = ", ".join(attribute_literal(d.published, self._identity_name) for d in chosen)
        cel = self._identity[0]
        return f"has({cel}) && {cel} in [{values}]"

    def taint_all_but_mine(self) -> None:
        """A NoSchedule DeviceTaintRule of this test for every other pool of the driver and every other device
        of this pool: no request of the test can be given a device that is not its own. The rules are
        deleted with the test's other cluster objects, before its turn at the devices ends."""
        mine = {(d.pool, d.name) for d in self.devices}
        made = 0
        pools: dict[str, set[str]] = {}
        for s in _newest_slices([self.k8s.api_client.sanitize_for_serialization(s) for s in
                                 self.k8s.resource.list_resource_slice(field_selector=f"spec.driver={self.driver}").items]):
            pools.setdefault(s["spec"]["pool"]["name"], set()).update(d["name"] for d in s["spec"].get("devices") or [])
        for pool, names in sorted(pools.items()):
            selectors: list[tuple[str, str | None]] = [(pool, None)] if not any(p == pool for p, _ in mine) else \
                [(pool, name) for name in sorted(names) if (pool, name) not in mine]
            for pool_name, device in selectors:
                made += 1
                self._objects.device_taint_rule(faults.taint_rule(
                    self._unique_name(f"not-mine-{made}"), "NoSchedule", driver=self.driver, pool=pool_name,
                    device=device, key=PIN_TAINT_KEY, value="another-test-owns-this-turn"))

    def _taint_each_of_mine(self) -> None:
        """Each of the pool's devices tainted with its own pin value (once): from now on a request gets only
        the devices it tolerates, which `request` makes exactly those it asks for."""
        if self._mine_tainted:
            return
        self._mine_tainted = True
        for index, device in enumerate(self.devices):
            self._objects.device_taint_rule(faults.taint_rule(
                self._unique_name(f"pin-{index}"), "NoSchedule", driver=self.driver, pool=device.pool,
                device=device.name, key=PIN_TAINT_KEY, value=device.name))

    @staticmethod
    def _not_applicable(why: str):
        pytest.skip(f"not applicable: {why}")  # the results record it so (a skip that says "not applicable:")

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(f"{name} is not one of the devices given to this test: {self.names}")

    def request(self, name: str = "gpu", *, count: int = 1, devices: tuple = (), selectors=(),
                capacity: dict | None = None, device_class: str | None = None) -> dict:
        """An `exactly` request of the driver's class, limited to the pool's devices (or `devices`)."""
        devices = devices or self._class_devices.get(device_class or "", ())
        if not self.pin_by_taints:
            return objects.request(device_class or self.device_class, name=name, count=count, capacity=capacity,
                                   selectors=[self.only(*devices), *selectors])
        # Pinned by taints: a request tolerates the pin taints of its own devices only; the pool's devices get
        # those taints (one value per device) the first time a test asks for some of them, not all.
        chosen = [d if isinstance(d, Device) else self.device(d) for d in devices] or self.devices
        if {d.name for d in chosen} != set(self.names):
            self._taint_each_of_mine()
        body = objects.request(device_class or self.device_class, name=name, count=count, capacity=capacity,
                               selectors=[self.only(), *selectors])
        return objects.tolerating(body, *(objects.device_toleration(PIN_TAINT_KEY, operator="Equal", value=d.name,
                                                                    effect="NoSchedule") for d in chosen))

    def template(self, name: str, *, count: int = 1, devices: tuple = (), selectors=(), entry: str = "gpu") -> dict:
        return objects.claim_template(name, requests=[self.request(entry, count=count, devices=devices,
                                                                   selectors=selectors)])

    def own_class(self, prefix: str, *, devices: tuple = (), extended_resource_name: str | None = None,
                  selectors=()) -> str:
        """A DeviceClass of this test over the pool's devices (or `devices`): the driver, the devices,
        optional further selectors and extendedResourceName. Deleted at teardown."""
        name = self._unique_name(prefix)
        body = objects.device_class(name, self.driver, extended_resource_name=extended_resource_name)
        body["metadata"]["labels"] = {LABEL: "true"}
        if self.pin_by_taints and devices:  # a class cannot tolerate: the requests of `request(device_class=)` do
            self._class_devices[name] = tuple(devices)
            devices = ()
        body["spec"]["selectors"] += [{"cel": {"expression": e}} for e in (self.only(*devices), *selectors)]
        self._objects.device_class(body)
        return name

    # --- pods where the devices are ---------------------------------------------------------

    def pod(self, body: dict, *, pin: bool = True) -> dict:
        """A pod manifest made runnable where the devices are: the node's image (and pull policy) in
        every container, the real node's taint tolerated, and (pin) bound to the devices' node."""
        spec = body["spec"]
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            if container.get("image") in (None, objects.PAUSE_IMAGE):
                container["image"] = self.image
                container["imagePullPolicy"] = self.pull_policy
        spec["tolerations"] = [*spec.get("tolerations", []),
                               {"key": objects.REAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
        if pin:
            spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = self.node
        return body

    def shell_image(self) -> str:
        """An image with a shell on the devices' node (where a command must really run), or skip."""
        if not self.kubelet:
            return node_facts.SHELL_IMAGE  # a simulated node runs nothing: any name does
        node = self.k8s.core.read_node(self.node)
        names = {n for image in (node.status.images or []) for n in (image.names or [])}
        if node_facts.SHELL_IMAGE not in names:
            pytest.skip(f"needs a shell image on node {self.node} (to run a command there); it has "
                        f"{', '.join(sorted(n for n in names if '@' not in n)[:5]) or 'none'}")
        return node_facts.SHELL_IMAGE

    def published(self, name: str) -> dict:
        return self.device(name).published


def vendor_pool(k8s: Clients, vendor, cluster_facts, count: int, make) -> DevicePool:
    """`count` free devices of one vendor driver on one node, selected by one of the vendor's classes;
    prefers a node run by a kubelet (pods there really run). Skips naming what is missing."""

    everything = [k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items]
    best: tuple | None = None
    seen = []
    for device_class in sorted(set(vendor.device_classes.values())):
        found = k8s.api_client.sanitize_for_serialization(k8s.resource.read_device_class(device_class))
        selection = class_selectors.evaluate(found, everything)
        if selection.not_evaluated:
            selected = {(d, p, n) for s in everything for d, p, n in
                        [(s["spec"]["driver"], s["spec"]["pool"]["name"], dev["name"]) for dev in s["spec"].get("devices") or []]
                        if d in vendor.drivers}
        else:
            selected = set(selection.selected)
        for (driver, node), devices in free_devices(k8s, vendor.drivers, selected).items():
            kubelet = node in cluster_facts.kubelet_nodes
            seen.append(f"{len(devices)} of {driver} on {node} (class {device_class})")
            rank = (len(devices) >= count, kubelet, len(devices))
            if best is None or rank > best[0]:
                best = (rank, driver, device_class, node, devices, kubelet)
    if best is None or not best[0][0]:
        pytest.skip(f"needs {count} free device(s) of one driver on one node that a class of the vendor file selects "
                    f"(each standing alone: no shared counters, no blocking taint, not allocated); found: "
                    f"{', '.join(seen) or 'none'}")
    _, driver, device_class, node, devices, kubelet = best
    published = all_devices(k8s, driver)
    identity = identity_attribute(driver, published)
    options = dict(driver=driver, device_class=device_class, node=node, devices=devices[:count], kubelet=kubelet,
                   image=vendor.test_image, pull_policy="Never" if vendor.default_image else "IfNotPresent",
                   vendor=True)
    if identity is not None:
        return make(**options, identity=identity, identity_name=_identity_name(driver, devices, identity[0]))
    if fingerprints_unique(published):  # each device told apart by all its attributes together
        return make(**options, identity=None, identity_name="", attribute_keys=fingerprint_keys(published))
    # Nothing a selector sees tells the devices apart (bare names, identical attributes): every other device
    # of the driver is tainted for this test's turn (DeviceTaintRules select by name), so the scheduler can
    # only give the test its own devices, whichever of them it picks.
    if cluster_facts.gate("DRADeviceTaintRules") is False:
        pytest.skip(f"driver {driver} publishes no attribute that tells its devices apart, and the cluster's "
                    "DRADeviceTaintRules gate is off: the suite cannot keep a test to its own devices")
    pool = make(**options, identity=None, identity_name="", pin_by_taints=True)
    pool.taint_all_but_mine()
    return pool


def fake_pool(k8s: Clients, fake_driver, simulated_node: str, count: int, make, real_node=None,
              **options) -> DevicePool:
    """A fresh fake-driver instance whose profile has at least `count` GPUs on a simulated node, or on
    the local backend's real node (`real_node`: its kubelet plugins started there)."""
    profile = next((p for n, p in FAKE_PROFILES if n >= count), None)
    if profile is None:
        pytest.skip(f"no fake-driver profile has {count} GPUs on one node")
    if real_node is not None:
        simulated_node = real_node.name
    fake = fake_driver({simulated_node: profile}, **options)
    if real_node is not None:
        real_node.run_for(fake)
    driver = fake.drivers.gpu
    devices = free_devices(k8s, (driver,)).get((driver, simulated_node), [])
    assert len(devices) >= count, f"fake driver {driver} published {len(devices)} GPUs on {simulated_node}"
    identity = identity_attribute(driver, all_devices(k8s, driver))
    assert identity, f"fake driver {driver}: no attribute tells its devices apart"
    return make(driver=driver, device_class=f"{fake.config.instance}-gpu", node=simulated_node,
                devices=devices[:count], identity=identity, identity_name=_identity_name(driver, devices, identity[0]),
                kubelet=real_node is not None, image=node_facts.PAUSE_IMAGE if real_node else objects.PAUSE_IMAGE,
                pull_policy="Never" if real_node else "IfNotPresent", vendor=False, fake=fake)


# --- partitionable devices: devices that consume shared counters -----------------------------------

def partition_pool(k8s: Clients, drivers, classes, kubelet_nodes, sets: int, make, **pool_options) -> DevicePool:
    """`sets` free counter sets of one driver on one node, with their devices, selected by one of
    `classes` (DeviceClass names); prefers a node run by a kubelet. Skips naming what is missing."""

    everything = [k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items]
    best: tuple | None = None
    seen = []
    for device_class in sorted(set(classes)):
        body = k8s.api_client.sanitize_for_serialization(k8s.resource.read_device_class(device_class))
        selection = class_selectors.evaluate(body, everything)
        selected = None if selection.not_evaluated else set(selection.selected)
        for (driver, node), found in counter_sets(k8s, drivers, selected).items():
            seen.append(f"{len(found)} on {node} (driver {driver}, class {device_class})")
            rank = (len(found) >= sets, node in kubelet_nodes, len(found))
            if best is None or rank > best[0]:
                best = (rank, driver, device_class, node, found)
    if best is None or not best[0][0]:
        pytest.skip(f"needs {sets} free shared counter set(s) of one driver on one node, each with two or more "
                    f"devices consuming from it alone (partitionable devices) that a class selects; found: "
                    f"{', '.join(seen) or 'none'} (drivers {', '.join(drivers)}, classes {', '.join(classes)})")
    _, driver, device_class, node, found = best
    chosen = tuple(found[:sets])
    published = all_devices(k8s, driver)
    identity = identity_attribute(driver, published)
    devices = [d for counter_set in chosen for d in counter_set.devices]
    if identity is None and not fingerprints_unique(published):
        pytest.skip(f"driver {driver} publishes two devices with the same attributes: a test cannot ask for "
                    "particular devices")
    return make(driver=driver, device_class=device_class, node=node, devices=devices, identity=identity,
                identity_name=_identity_name(driver, devices, identity[0]) if identity else "",
                kubelet=node in kubelet_nodes, counter_sets=chosen, attribute_keys=fingerprint_keys(published),
                **pool_options)


# --- shareable devices: consumable capacity -----------------------------------------------------

def shareable_pool(k8s: Clients, drivers, classes, kubelet_nodes, count: int | None, make, *, has=consumable,
                   needs: str = "publish a capacity with a requestPolicy (consumable capacity)", required: bool = False,
                   **pool_options) -> DevicePool:
    """`count` free devices (None: every such device of that node) of one driver on one node that allow
    multiple allocations and publish what `has` finds (default: a capacity with a request policy),
    selected by one of `classes`; prefers a node run by a kubelet. Skips naming what is missing (fails,
    when `required`: the fake driver's profile must show it)."""

    everything = [k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items]
    best: tuple | None = None
    seen = []
    wanted = 1 if count is None else count
    for device_class in sorted(set(classes)):
        body = k8s.api_client.sanitize_for_serialization(k8s.resource.read_device_class(device_class))
        selection = class_selectors.evaluate(body, everything)
        selected = None if selection.not_evaluated else set(selection.selected)
        for (driver, node), devices in free_devices(k8s, drivers, selected, shareable=True).items():
            devices = [d for d in devices if has(d.published)]
            seen.append(f"{len(devices)} on {node} (driver {driver}, class {device_class})")
            rank = (len(devices) >= wanted, node in kubelet_nodes, len(devices))
            if devices and (best is None or rank > best[0]):
                best = (rank, driver, device_class, node, devices)
    if best is None or not best[0][0]:
        why = (f"needs {wanted} free device(s) of one driver on one node that allow multiple allocations and "
               f"{needs}, selected by a class; found: "
               f"{', '.join(seen) or 'none'} (drivers {', '.join(drivers)}, classes {', '.join(classes)})")
        if required:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    _, driver, device_class, node, devices = best
    published = all_devices(k8s, driver)
    identity = identity_attribute(driver, published)
    if identity is None and not fingerprints_unique(published):
        pytest.skip(f"driver {driver} publishes two devices with the same attributes: a test cannot ask for "
                    "particular devices")
    chosen = devices if count is None else devices[:count]
    return make(driver=driver, device_class=device_class, node=node, devices=chosen, identity=identity,
                identity_name=_identity_name(driver, chosen, identity[0]) if identity else "",
                kubelet=node in kubelet_nodes, attribute_keys=fingerprint_keys(published), **pool_options)


# --- fractional capacity: validRange in milli-units (DRAFractionalCapacityRange) -------------------

def fractional_pool(k8s: Clients, drivers, classes, kubelet_nodes, count: int | None, make, **options) -> DevicePool:
    """Free shareable devices of one driver on one node with a capacity whose validRange is
    fractional (`fractional`); see shareable_pool."""
    return shareable_pool(k8s, drivers, classes, kubelet_nodes, count, make, has=fractional,
                          needs="publish a capacity whose requestPolicy.validRange has a fractional min, max or step",
                          **options)

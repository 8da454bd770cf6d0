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
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest

from conformance import checks, class_selectors, objects
from fake_devices import faults
from harness.config.capabilities import consumable, fractional, quantity
from harness.core.locking import file_lock
from harness.k8s import api, errors, wait
from harness.k8s import nodes as node_facts
from harness.k8s.client import Clients

LABEL = "dra-harness.x-k8s.io/test-class"  # on every DeviceClass a test makes over the driver's devices
# attributes that name one device, looked for first; any other string/int attribute with distinct values also does
IDENTITY_ATTRIBUTES = ("uuid", "resource.kubernetes.io/pciBusID", "serial", "index")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# The taint of DeviceTaintRules that keep a test to its own devices where no attribute tells them apart.
PIN_TAINT_KEY = "dra-harness.x-k8s.io/not-this-test"
FAKE_PROFILES = ((2, "tiny"), (4, "gpu-4"), (8, "dgx-h100"))  # GPUs per node of the fake driver's profiles


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str
    published: dict = field(hash=False, compare=False)  # the device as its slice shows it

    @property
    def path(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


def _value(attribute: dict):
    for kind in ("string", "int", "bool", "version"):
        if attribute.get(kind) is not None:
            return kind, attribute[kind]
    return None, None


def identity_attribute(driver: str, devices: list[dict]) -> tuple[str, str] | None:
    """(CEL of an attribute, its kind) whose value differs on each of `devices` (all of the driver's
    published devices), or None when no attribute tells them apart."""
    candidates: dict[str, list] = {}
    for device in devices:
        for name, attribute in (device.get("attributes") or {}).items():
            kind, value = _value(attribute)
            if kind in ("string", "int"):
                candidates.setdefault(name, []).append((kind, value))
    usable = [name for name, values in candidates.items()
              if len(values) == len(devices) and len({v for _, v in values}) == len(values)
              and len({k for k, _ in values}) == 1]
    if not usable:
        return None
    usable.sort(key=lambda n: (IDENTITY_ATTRIBUTES.index(n) if n in IDENTITY_ATTRIBUTES else len(IDENTITY_ATTRIBUTES), n))
    name = usable[0]
    domain, _, local = name.rpartition("/")
    return f'device.attributes["{domain or driver}"].{local}', candidates[name][0][0]


def attribute_literal(device: dict, name: str):
    kind, value = _value((device.get("attributes") or {}).get(name) or {})
    return json.dumps(value) if kind == "string" else str(value)


def _cel_attribute(driver: str, key: str) -> str:
    domain, _, local = key.rpartition("/")
    return f'device.attributes["{domain or driver}"].{local}'


def _pinnable(attribute: dict) -> bool:
    kind, _ = _value(attribute)
    return kind in ("string", "int", "bool")


def fingerprint(driver: str, device: dict, keys: frozenset[str]) -> str:
    """CEL true for the devices of `driver` whose string, int and bool attributes are exactly those of
    `device` (`keys`: every such attribute name the driver publishes; the others must be absent)."""
    attributes = device.get("attributes") or {}
    terms = []
    for key in sorted(keys):
        attribute = attributes.get(key)
        cel = _cel_attribute(driver, key)
        if attribute is None or not _pinnable(attribute):
            terms.append(f"!has({cel})")
            continue
        kind, value = _value(attribute)
        literal = json.dumps(value) if kind in ("string", "bool") else str(value)  # JSON true/false is CEL's
        terms.append(f"has({cel}) && {cel} == {literal}")
    return " && ".join(terms) or "true"


def fingerprint_keys(devices: list[dict]) -> frozenset[str]:
    return frozenset(k for d in devices for k, a in (d.get("attributes") or {}).items() if _pinnable(a))


def _fingerprint_value(device: dict, keys: frozenset[str]) -> tuple:
    attributes = device.get("attributes") or {}
    return tuple((k, _value(attributes[k])) if k in attributes else (k, None) for k in sorted(keys))


def fingerprints_unique(devices: list[dict]) -> bool:
    keys = fingerprint_keys(devices)
    values = [_fingerprint_value(d, keys) for d in devices]
    return len(set(values)) == len(values)


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


# --- finding the devices ----------------------------------------------------------------------

def _newest_slices(slices: list[dict]) -> list[dict]:
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, 0), s["spec"]["pool"]["generation"])
    return [s for s in slices if s["spec"]["pool"]["generation"] == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]]


def in_use(k8s: Clients) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of every device allocated to a claim of the cluster (admin access aside)."""
    used = set()
    for claim in k8s.resource.list_resource_claim_for_all_namespaces().items:
        allocation = claim.status.allocation if claim.status else None
        for r in (allocation.devices.results or []) if allocation and allocation.devices else []:
            if not r.admin_access:
                used.add((r.driver, r.pool, r.device))
    return used


def blocking_rule_selectors(k8s: Clients) -> list[tuple[str | None, str | None, str | None]]:
    """(driver, pool, device) selectors of the cluster's DeviceTaintRules with a blocking effect (None:
    any), whoever made them: another test's rule not deleted yet, or a health monitor of the cluster."""
    try:
        rules = k8s.resource.list_device_taint_rule().items
    except errors.NotFound:  # the cluster does not serve DeviceTaintRules
        return []
    selectors = []
    for rule in rules:
        chosen = rule.spec.device_selector  # the API: an empty selector matches every device, none matches none
        if chosen is not None and rule.spec.taint and rule.spec.taint.effect in BLOCKING_EFFECTS:
            selectors.append((chosen.driver, chosen.pool, chosen.device))
    return selectors


def _ruled_out(key: tuple[str, str, str], selectors) -> bool:
    return any(all(want is None or want == have for want, have in zip(selector, key)) for selector in selectors)


def free_devices(k8s: Clients, drivers, selected: set[tuple[str, str, str]] | None = None, *,
                 shareable: bool = False) -> dict[tuple[str, str], list[Device]]:
    """{(driver, node): free devices}: published on that node, selected (if given), not held by a claim,
    without a blocking taint (in its slice or from a DeviceTaintRule), consuming no shared counters (so
    each one stands alone), and allowing one allocation only (or, `shareable`, several: consumable capacity)."""
    slices = _newest_slices([k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items
                             if s.spec.driver in drivers])
    used = in_use(k8s)
    ruled = blocking_rule_selectors(k8s)
    labels = None  # node -> labels, read once if some pool is network-attached
    found: dict[tuple[str, str], list[Device]] = {}
    for s in slices:
        reachable = [s["spec"]["nodeName"]] if s["spec"].get("nodeName") else None
        if reachable is None:
            if labels is None:
                labels = {n.metadata.name: dict(n.metadata.labels or {}) for n in k8s.core.list_node().items
                          if not n.spec.unschedulable}
            reachable = reachable_nodes(s["spec"], labels)
        for device in s["spec"].get("devices") or []:
            key = (s["spec"]["driver"], s["spec"]["pool"]["name"], device["name"])
            if selected is not None and key not in selected or key in used or device.get("consumesCounters"):
                continue
            if bool(device.get("allowMultipleAllocations")) != shareable:
                continue
            if any(t.get("effect") in BLOCKING_EFFECTS for t in device.get("taints") or []) or _ruled_out(key, ruled):
                continue
            for node in reachable:
                found.setdefault((key[0], node), []).append(Device(key[0], key[1], key[2], node, device))
    for devices in found.values():
        devices.sort(key=lambda d: (len(d.name), d.name))
    return found


def reachable_nodes(spec: dict, labels: dict[str, dict[str, str]]) -> list[str]:
    """The nodes from which a network-attached pool's devices can be used: every node (allNodes), or those
    its node selector matches (matchExpressions on labels, matchFields on metadata.name; the terms ORed)."""
    if spec.get("allNodes"):
        return sorted(labels)
    terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return sorted(node for node, have in labels.items() if any(_term_matches(t, node, have) for t in terms))


def _term_matches(term: dict, node: str, labels: dict[str, str]) -> bool:
    def holds(requirement: dict, value: str | None) -> bool:
        op, values = str(requirement.get("operator")), requirement.get("values") or []
        return {"In": value in values, "NotIn": value not in values, "Exists": value is not None,
                "DoesNotExist": value is None}.get(op, False)

    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing (core/v1 NodeSelectorTerm)
    return all(holds(r, labels.get(r["key"])) for r in expressions) and \
        all(r.get("key") == "metadata.name" and holds(r, node) for r in fields)


def all_devices(k8s: Clients, driver: str) -> list[dict]:
    items = [k8s.api_client.sanitize_for_serialization(s)
             for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items]
    return [d for s in _newest_slices(items) for d in s["spec"].get("devices") or []]


def held_on(k8s: Clients, driver: str, node: str) -> int:
    """How many claims of the cluster hold devices of `driver` in pools published for `node`."""
    pools = {s.spec.pool.name for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items
             if s.spec.node_name == node}
    return sum(1 for claim in k8s.resource.list_resource_claim_for_all_namespaces().items
               if claim.status and claim.status.allocation and any(
                   r.driver == driver and r.pool in pools for r in claim.status.allocation.devices.results or []))


def give_back(k8s: Clients, namespace: str, drivers=(), kubelet_nodes=(), timeout: float = 120) -> None:
    """Delete the namespace's pods and claims and wait until they are gone: the devices are free again;
    on kubelet nodes also until the kubelet holds no more claims of `drivers` prepared than the cluster
    has allocated there (it may unprepare after the claim is gone)."""

    binding = _pods_in_prebind(k8s, namespace)
    for pod in k8s.core.list_namespaced_pod(namespace).items:
        wait.ignore_not_found(k8s.core.delete_namespaced_pod, pod.metadata.name, namespace)
    wait.until(f"the pods of {namespace} to be gone", lambda: not k8s.core.list_namespaced_pod(namespace).items,
               timeout, diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    try:  # a PodGroup holds its claims reserved: it goes too
        groups = k8s.scheduling.list_namespaced_pod_group(namespace).items
    except errors.NotFound:  # the cluster does not serve PodGroups
        groups = []
    for group in groups:
        wait.ignore_not_found(k8s.scheduling.delete_namespaced_pod_group, group.metadata.name, namespace)
    for claim in k8s.resource.list_namespaced_resource_claim(namespace).items:
        wait.ignore_not_found(k8s.resource.delete_namespaced_resource_claim, claim.metadata.name, namespace)
    wait.until(f"the claims of {namespace} to be gone",
               lambda: not k8s.resource.list_namespaced_resource_claim(namespace).items, timeout,
               diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    if binding:
        # kube-scheduler v1.37.2 releases the in-flight allocation of a pod it was binding only at its next
        # PreBind look (every 5 s while binding conditions are pending), and a release for a claim that is
        # gone by then requeues no waiting pod (assumecache Restore finds no object and emits no event;
        # docs/conformance.md "Found upstream"): the next turn's pods would wait for the 5-minute
        # unschedulable flush. Outwait that look, once.
        wait.until(f"kube-scheduler to give up binding {', '.join(binding)}", _after(PREBIND_LOOK_SECONDS + 1),
                   PREBIND_LOOK_SECONDS + 10)
    for node in kubelet_nodes:
        for driver in drivers:
            wait.until(f"the kubelet on {node} to unprepare the claims of {driver} that are gone",
                       lambda: checks.kubelet_dra_metrics(k8s, node, driver)["in_use"] <= held_on(k8s, driver, node),
                       timeout, diagnostics=lambda: f"kubelet: {checks.kubelet_dra_metrics(k8s, node, driver)}")


PREBIND_LOOK_SECONDS = 5  # k8s.io/kubernetes@v1.37.2 dynamicresources.go PreBind: PollUntilContextTimeout(5 s)


def _after(seconds: float):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def _pods_in_prebind(k8s: Clients, namespace: str) -> list[str]:
    """The namespace's pods the scheduler is binding: not bound to a node, yet a claim of theirs is already
    reserved for them (the scheduler reserves in PreBind, then may wait there for binding conditions)."""
    claims = k8s.resource.list_namespaced_resource_claim(namespace).items
    reserved = {ref.uid for c in claims for ref in ((c.status.reserved_for or []) if c.status else [])}
    return [p.metadata.name for p in k8s.core.list_namespaced_pod(namespace).items
            if not p.spec.node_name and p.metadata.uid in reserved]


@contextlib.contextmanager
def taking_turns(lock_dir: Path) -> Iterator[None]:

    with file_lock(lock_dir / "vendor-devices.lock"):
        yield


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


def _identity_name(driver: str, devices: list[Device], cel: str) -> str:
    """The attribute key (as the slice spells it) behind an identity CEL expression."""
    domain, local = cel.split('"')[1], cel.rsplit(".", 1)[1]
    for key in devices[0].published.get("attributes") or {}:
        d, _, loc = key.rpartition("/")
        if loc == local and (d or driver) == domain:
            return key
    raise AssertionError(f"{cel} names no attribute of {devices[0].path}")


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

@dataclass(frozen=True)
class CounterSet:
    """One shared counter set of a pool and the devices of the pool that consume from it (and from no
    other set): the partitions of one physical device, as the slices describe them."""

    driver: str
    pool: str
    node: str
    name: str
    counters: dict = field(hash=False, compare=False)  # counter -> Decimal
    devices: tuple[Device, ...] = ()

    @property
    def path(self) -> str:
        return f"counter set {self.name} of pool {self.driver}/{self.pool}"

    def consumes(self, device: Device) -> dict[str, Decimal]:
        (use,) = [u for u in device.published.get("consumesCounters") or [] if u.get("counterSet") == self.name]
        return {c: quantity(v["value"]) for c, v in (use.get("counters") or {}).items()}

    def fits(self, device: Device, taken) -> bool:
        """Whether `device` can be allocated beside `taken` (devices of this set) by the counters."""
        left = dict(self.counters)
        for other in taken:
            for counter, value in self.consumes(other).items():
                left[counter] = left.get(counter, Decimal(0)) - value
        return all(value <= left.get(counter, Decimal(0)) for counter, value in self.consumes(device).items())

    def share(self, device: Device) -> Decimal:
        """How much of the set the device takes (the sum of its fractions of each counter)."""
        return sum((value / self.counters[c] for c, value in self.consumes(device).items() if self.counters.get(c)),
                   Decimal(0))

    def blocker(self) -> Device | None:
        """The largest device that, allocated, leaves room for no other device of the set (a whole GPU)."""
        found = [d for d in self.devices if self.fits(d, []) and not any(self.fits(e, [d]) for e in self.devices
                                                                       if e != d)]
        return max(found, key=lambda d: (self.share(d), d.name), default=None)

    def fill(self) -> tuple[list[Device], list[Device]]:
        """Smallest first, each device taken while it fits: (the devices that fit together, the others).
        None of the others fits beside the first: each did not fit when fewer were taken."""
        taken: list[Device] = []
        rest: list[Device] = []
        for device in sorted(self.devices, key=lambda d: (self.share(d), len(d.name), d.name)):
            (taken if self.fits(device, taken) else rest).append(device)
        return taken, rest

    def describe(self, devices=None) -> str:
        chosen = self.devices if devices is None else devices
        def published(device: Device) -> str:  # the quantities as the slice writes them
            (use,) = [u for u in device.published.get("consumesCounters") or [] if u.get("counterSet") == self.name]
            return ", ".join(f"{c} {v['value']}" for c, v in sorted((use.get("counters") or {}).items()))

        return ", ".join(f"{d.name} ({published(d)})" for d in chosen)


def counter_sets(k8s: Clients, drivers, selected: set[tuple[str, str, str]] | None = None
                 ) -> dict[tuple[str, str], list[CounterSet]]:
    """{(driver, node): free counter sets}: node-local sets with at least two devices (selected, if
    given) consuming from them alone, none of the set's devices allocated or carrying a blocking taint."""
    slices = _newest_slices([k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items
                             if s.spec.driver in drivers])
    used = in_use(k8s)
    shared: dict[tuple[str, str], dict[str, dict[str, Decimal]]] = {}
    members: dict[tuple[str, str, str], list[Device]] = {}
    for s in slices:
        driver, pool = s["spec"]["driver"], s["spec"]["pool"]["name"]
        for counter_set in s["spec"].get("sharedCounters") or []:
            shared.setdefault((driver, pool), {})[counter_set["name"]] = {
                c: quantity(v["value"]) for c, v in (counter_set.get("counters") or {}).items()}
        node = s["spec"].get("nodeName")
        for device in s["spec"].get("devices") or [] if node else []:
            uses = device.get("consumesCounters") or []
            if len(uses) == 1:
                members.setdefault((driver, pool, uses[0]["counterSet"]), []).append(
                    Device(driver, pool, device["name"], node, device))
    found: dict[tuple[str, str], list[CounterSet]] = {}
    for (driver, pool, name), devices in sorted(members.items()):
        counters = shared.get((driver, pool), {}).get(name)
        if counters is None or any((d.driver, d.pool, d.name) in used for d in devices):
            continue
        if any(t.get("effect") in BLOCKING_EFFECTS for d in devices for t in d.published.get("taints") or []):
            continue
        if selected is not None:
            devices = [d for d in devices if (d.driver, d.pool, d.name) in selected]
        if len(devices) >= 2:
            devices.sort(key=lambda d: (len(d.name), d.name))
            found.setdefault((driver, devices[0].node), []).append(
                CounterSet(driver, pool, devices[0].node, name, counters, tuple(devices)))
    return found


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


def crash_daemon_set_pod(k8s: Clients, namespace: str, name: str, node: str, timeout: float = 120.0) -> None:
    """The vendor's plugin on `node`, run by DaemonSet namespace/name (spec.pluginDaemonSet), crashed: its
    pod there deleted at once (grace period 0: no clean shutdown, only what it checkpointed survives), then
    waited for until the DaemonSet's new pod on the node is ready."""
    owner = api.AppsV1Api(k8s.api_client).read_namespaced_daemon_set(name, namespace).metadata.uid

    def pods() -> list:
        """The DaemonSet's own pods on the node (by owner, not by label: nothing else of the namespace)."""
        return [p for p in k8s.core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
                if any(ref.uid == owner for ref in p.metadata.owner_references or [])]

    before = pods()
    assert before, f"DaemonSet {namespace}/{name} (spec.pluginDaemonSet) runs no pod on node {node}"
    for pod in before:
        wait.ignore_not_found(k8s.core.delete_namespaced_pod, pod.metadata.name, namespace, grace_period_seconds=0)
    gone = {pod.metadata.uid for pod in before}

    def replaced() -> bool:
        return any(p.metadata.uid not in gone and p.metadata.deletion_timestamp is None
                   and p.status.container_statuses and all(c.ready for c in p.status.container_statuses)
                   for p in pods())

    wait.until(f"a new pod of DaemonSet {namespace}/{name} on node {node} to be ready after its pod was deleted",
               replaced, timeout, interval=0.5, diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def known_cdi_dir(dra_cluster, node: str) -> Path | None:
    """The CDI spec directory of `node` where the cluster record names it (real nodes dra-harness runs)."""
    return {real.name: real.cdi_dir for real in dra_cluster.real_nodes}.get(node)


def cdi_specs_of(cdi_dir: Path, claim_uid: str) -> list[Path]:
    """The CDI spec files that mention the claim (drivers name them, or their devices, after its UID)."""
    if not cdi_dir.is_dir():
        return []
    return sorted(p for p in cdi_dir.iterdir() if p.is_file() and claim_uid in p.read_text(errors="replace"))
